"""Delivery tracking: results that exist reach the model exactly once.

The mixed case behind openai-agents-python PR #4947, as records: one model response asks
for a call that needs approval and a call to a tool that does not exist; the runtime
answers the unknown call locally (an error result), pauses for the approval, and later
resumes — with the full history in each request, or continuing a server-side
conversation (``conversation`` and ``previous_response_id`` styles), and with two staged
approvals. The "server" below keeps what each request carried, refuses input that leaves
a call without output (as the Responses API does), and answers from a script.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_transcript import assistant, call, numbered, result

import sessionlog
from sessionlog.delivery import (
    LLM_REQUEST,
    delivery_items,
    delivery_state,
    pending_deliveries,
    request_event,
    response_event,
)
from sessionlog.projection import check_pairing, project
from sessionlog.recovery import TOOL_NOT_FOUND

MODES = ("history", "conversation", "previous_response")


class ScriptedServer:
    """A Responses-style model endpoint: records every input, holds the conversation when
    the runtime continues one, rejects unpaired input, answers from ``script``."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.inputs: list[list[dict[str, Any]]] = []
        self.held: list[dict[str, Any]] = []

    def respond(self, items: list[dict[str, Any]], *, continues: bool) -> dict[str, Any]:
        self.inputs.append(items)
        context = (self.held if continues else []) + items
        violation = check_pairing(context, "responses")
        if violation is not None:
            raise AssertionError(f"400 from the server: {violation.message}")
        reply = self.script.pop(0)
        output = [{"type": "function_call", "call_id": c["id"], "name": c["name"], "arguments": "{}"}
                  for c in reply.get("tool_calls", [])]
        if reply.get("content"):
            output.insert(0, {"type": "message", "role": "assistant", "content": reply["content"]})
        self.held = context + output
        return reply


class Runtime:
    """A minimal agent runtime over a sessionlog store: records each model request and
    response, answers unknown tools locally, pauses for approvals."""

    NEEDS_APPROVAL = {"deploy", "delete_db"}
    TOOLS = {"deploy", "delete_db", "search"}

    def __init__(self, store: sessionlog.EventStore, sid: str, server: ScriptedServer, mode: str) -> None:
        self.store, self.sid, self.server, self.mode = store, sid, server, mode
        self.requests = 0

    def records(self) -> list[Any]:
        return list(self.store.read(self.sid))

    def request(self, handle: Any, turn: str, step: int) -> dict[str, Any]:
        records = self.records()
        state = delivery_state(records)
        assert state.ready, f"a request with calls still awaiting results: {state.awaiting}"
        if self.mode == "history" or state.assistant_seq is None:
            items = project(records, "responses").items
            continues = False
        else:
            items = delivery_items(state.pending, "responses")
            continues = True
        self.requests += 1
        rid = f"r{self.requests}"
        handle.append([request_event(rid, [p.call_id for p in state.pending], turn=turn, step=step)])
        reply = self.server.respond(items, continues=continues)
        handle.append([response_event(rid, response_id=f"resp_{rid}", turn=turn, step=step),
                       {"type": "assistant/message", "turn": turn, "step": step,
                        "content": reply.get("content"), "tool_calls": reply.get("tool_calls", [])}])
        return reply

    def run_tools(self, handle: Any, turn: str, step: int, approved: set[str]) -> bool:
        """Answer what can be answered; True when nothing awaits an approval."""
        state = delivery_state(self.records())
        latest = next(r for r in reversed(self.records()) if r.type == "assistant/message")
        waiting = False
        for c in latest["tool_calls"]:
            if c["id"] not in state.awaiting:
                continue
            if c["name"] not in self.TOOLS:
                handle.append([result(turn, step, c["id"], f"{TOOL_NOT_FOUND}: no tool {c['name']!r}", True,
                                      code=TOOL_NOT_FOUND)])
            elif c["name"] in self.NEEDS_APPROVAL and c["id"] not in approved:
                waiting = True
            else:
                handle.append([call(turn, step, c["id"], c["name"]),
                               result(turn, step, c["id"], f"{c['name']} done")])
        return not waiting

    def start(self, text: str) -> bool:
        with self.store.session(self.sid) as h:
            h.append([{"type": "turn/start", "turn": "t1"}, {"type": "user/message", "turn": "t1", "content": text},
                      {"type": "step/start", "turn": "t1", "step": 1}])
            self.request(h, "t1", 1)
            return self.run_tools(h, "t1", 1, set())

    def resume(self, approved: set[str]) -> str | None:
        """Resume from the log alone; returns the final text once the turn completes."""
        with self.store.session(self.sid) as h:
            if not self.run_tools(h, "t1", 1, approved):
                return None  # still paused: no model request
            h.append([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                      {"type": "step/start", "turn": "t1", "step": 2}])
            reply = self.request(h, "t1", 2)
            h.append([{"type": "step/end", "turn": "t1", "step": 2, "status": "completed"},
                      {"type": "turn/end", "turn": "t1", "status": "completed"}])
            return reply["content"]


def _delivered_once(records: list[Any], call_ids: list[str]) -> None:
    """Each result was carried by exactly one request that got a response."""
    answered = {r["request"] for r in records if r.type == "llm/response" and r.get("error") is None}
    carried = [cid for r in records if r.type == LLM_REQUEST and r["request"] in answered for cid in r["results"]]
    assert sorted(carried) == sorted(call_ids)


@pytest.mark.parametrize("mode", MODES)
def test_unknown_tool_error_is_delivered_once_after_approval(tmp_path: Path, mode: str) -> None:
    server = ScriptedServer([
        {"tool_calls": [{"id": "call-approve", "name": "deploy", "arguments": {}},
                        {"id": "call-missing", "name": "no_such_tool", "arguments": {}}]},
        {"content": "done"},
    ])
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1")
        rt = Runtime(store, "s1", server, mode)
        assert rt.start("deploy it") is False  # paused for the approval
        paused = rt.records()
        pending = pending_deliveries(paused)
        assert [p.call_id for p in pending] == ["call-missing"]  # the local error, exactly once
        assert pending[0].is_error and pending[0].code == TOOL_NOT_FOUND
        assert delivery_state(paused).awaiting == ["call-approve"]

    # resume in a new store object: everything comes from the log
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        rt = Runtime(store, "s1", server, mode)
        assert rt.resume({"call-approve"}) == "done"
        records = rt.records()
    resumed_input = server.inputs[-1]
    outputs = [i["call_id"] for i in resumed_input if i["type"] == "function_call_output"]
    assert outputs == ["call-approve", "call-missing"]  # both, once, in call order
    _delivered_once(records, ["call-approve", "call-missing"])
    assert pending_deliveries(records) == []


@pytest.mark.parametrize("mode", MODES)
def test_two_staged_approvals_deliver_each_result_once(tmp_path: Path, mode: str) -> None:
    server = ScriptedServer([
        {"tool_calls": [{"id": "a1", "name": "deploy", "arguments": {}},
                        {"id": "a2", "name": "delete_db", "arguments": {}},
                        {"id": "missing", "name": "no_such_tool", "arguments": {}}]},
        {"content": "done"},
    ])
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1")
        rt = Runtime(store, "s1", server, mode)
        assert rt.start("go") is False
        assert rt.resume({"a1"}) is None  # a2 still awaits approval: paused again
        assert len(server.inputs) == 1  # no model request in between
        mid = rt.records()
        assert [p.call_id for p in pending_deliveries(mid)] == ["a1", "missing"]
        assert delivery_state(mid).awaiting == ["a2"]
        assert rt.resume({"a1", "a2"}) == "done"
        records = rt.records()
    assert len(server.inputs) == 2
    outputs = [i["call_id"] for inp in server.inputs for i in inp if i["type"] == "function_call_output"]
    assert outputs == ["a1", "a2", "missing"]
    _delivered_once(records, ["a1", "a2", "missing"])
    assert pending_deliveries(records) == []


# --- the rules, on plain records -------------------------------------------------------


def _paused() -> list[dict[str, Any]]:
    return [
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        request_event("r1", [], turn="t1", step=1),
        response_event("r1", turn="t1", step=1),
        assistant("t1", 1, [("a", "deploy"), ("m", "ghost")]),
        result("t1", 1, "m", "no such tool", True, code=TOOL_NOT_FOUND),
        result("t1", 1, "m", "no such tool (again)", True, code=TOOL_NOT_FOUND),
        call("t1", 1, "a", "deploy"),
        result("t1", 1, "a", "deployed"),
    ]


def test_pending_in_call_order_each_once() -> None:
    pending = pending_deliveries(numbered(_paused()))
    assert [(p.call_id, p.output) for p in pending] == [("a", "deployed"), ("m", "TOOL_NOT_FOUND: no such tool")]


def test_at_least_once_a_lost_response_keeps_results_pending() -> None:
    events = _paused() + [request_event("r2", ["a", "m"], turn="t1", step=2)]
    state = delivery_state(numbered(events))
    assert [p.call_id for p in state.pending] == ["a", "m"] and state.in_doubt == ["a", "m"]
    failed = events + [response_event("r2", error="HTTP 500")]
    assert [p.call_id for p in pending_deliveries(numbered(failed))] == ["a", "m"]
    resent = failed + [request_event("r3", ["a", "m"]), response_event("r3", response_id="resp_3")]
    state = delivery_state(numbered(resent))
    assert state.pending == [] and state.delivered == ["a", "m"]


def test_partial_delivery_and_server_holds() -> None:
    events = _paused() + [request_event("r2", ["m"]), response_event("r2")]
    assert [p.call_id for p in pending_deliveries(numbered(events))] == ["a"]
    assert pending_deliveries(numbered(events), server_holds={"a"}) == []


def test_a_request_before_the_latest_message_delivers_nothing_of_it() -> None:
    events = [request_event("r0", ["a"]), response_event("r0")] + _paused()
    assert [p.call_id for p in pending_deliveries(numbered(events))] == ["a", "m"]


def test_failed_step_synthetic_results_are_owed_too() -> None:
    events = [
        {"type": "turn/start", "turn": "t1"},
        assistant("t1", 1, [("a", "deploy"), ("b", "search")]),
        call("t1", 1, "a", "deploy"),
        {"type": "step/end", "turn": "t1", "step": 1, "status": "error"},
        {"type": "turn/end", "turn": "t1", "status": "error"},
    ]
    pending = pending_deliveries(numbered(events))  # the view-time results of the closed step
    assert [(p.call_id, p.code, p.seq) for p in pending] == [
        ("a", "TOOL_OUTCOME_UNKNOWN", None), ("b", "TOOL_NOT_STARTED", None)]
    for fmt in ("openai", "anthropic", "responses"):
        assert len(delivery_items(pending, fmt)) == 2


def test_no_assistant_message_nothing_owed() -> None:
    state = delivery_state(numbered([{"type": "turn/start", "turn": "t1"}]))
    assert state.pending == [] and state.ready and state.assistant_seq is None
