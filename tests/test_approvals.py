"""Human approvals: a call paused for a human is suspended, not crashed.

``tool/approval`` records (``requested`` / ``approved`` / ``rejected``) through the one
tracker: scan says ``suspended`` (exit 0), plain repair leaves the awaiting call and its
step and turn alone, ``repair --expire-approvals`` answers it ``TOOL_NOT_STARTED`` and
closes them, live step recovery never answers it, views pair it with a view-only
``TOOL_AWAITING_APPROVAL`` result, and delivery after resume carries every result once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres import postgres_schema_url
from test_delivery import MODES, Runtime, ScriptedServer, _delivered_once
from test_transcript import assistant, call, numbered, result

import sessionlog
from sessionlog import Status, TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN
from sessionlog.cli import main
from sessionlog.delivery import delivery_state, pending_deliveries
from sessionlog.events import TOOL_AWAITING_APPROVAL
from sessionlog.projection import FORMATS, check_pairing, project
from sessionlog.recovery import StepScope
from sessionlog.transcript import PendingCalls, approval_event, crash_plan, pair_calls


def approval(turn: str, step: int, cid: str, state: str, **extra: Any) -> dict[str, Any]:
    return approval_event(cid, state, turn=turn, step=step, **extra)


PAUSED = [
    {"type": "turn/start", "turn": "t1"},
    {"type": "user/message", "turn": "t1", "content": "deploy and check"},
    {"type": "step/start", "turn": "t1", "step": 1},
    assistant("t1", 1, [("a", "deploy"), ("m", "ghost"), ("s", "search")]),
    result("t1", 1, "m", "no tool named ghost", True, code="TOOL_NOT_FOUND"),
    approval("t1", 1, "a", "requested", reason="deploys to production"),
]


def test_the_approval_record() -> None:
    assert approval_event("a", "approved", turn="t1", step=1, by="ops@example.com") == {
        "type": "tool/approval", "turn": "t1", "step": 1, "call_id": "a", "state": "approved",
        "by": "ops@example.com"}
    with pytest.raises(ValueError):
        approval_event("a", "maybe", turn="t1", step=1)


def test_tracker_knows_what_awaits_a_human() -> None:
    tracker = PendingCalls().feed_all(numbered(PAUSED + [call("t1", 1, "s", "search"),
                                                          result("t1", 1, "s", "found")]))
    assert [c.call_id for c in tracker.awaiting()] == ["a"] and tracker.suspended
    assert crash_plan(tracker) == []  # nothing to do: a human is deciding
    for state, awaiting in (("approved", []), ("rejected", []), ("requested", ["a"])):
        again = PendingCalls().feed_all(numbered(PAUSED + [approval("t1", 1, "a", state)]))
        assert [c.call_id for c in again.awaiting()] == awaiting
    # an approval for a call already answered, or for no call, changes nothing
    done = PendingCalls().feed_all(numbered(PAUSED[:4] + [result("t1", 1, "a", "x"), approval("t1", 1, "a", "requested"),
                                                         approval("t1", 1, "zz", "requested")]))
    assert done.awaiting() == [] and not done.suspended


def test_plain_repair_answers_the_other_calls_and_leaves_the_awaiting_one_open() -> None:
    records = numbered(PAUSED + [call("t1", 1, "s", "search")])
    tracker = PendingCalls().feed_all(records)
    assert not tracker.suspended  # s was started and never answered: that is a crash
    plan = crash_plan(tracker)
    assert [(e["type"], e.get("call_id"), e.get("code")) for e in plan] == [
        ("tool/result", "s", TOOL_OUTCOME_UNKNOWN)]  # no closers: the step is held open
    repaired = records + [{**e, "seq": len(records) + 1 + i} for i, e in enumerate(plan)]
    assert PendingCalls().feed_all(repaired).suspended
    assert crash_plan(PendingCalls().feed_all(repaired)) == []

    expired = crash_plan(PendingCalls().feed_all(repaired), expire_approvals=True)
    assert [(e["type"], e.get("call_id"), e.get("code"), e.get("status")) for e in expired] == [
        ("tool/result", "a", TOOL_NOT_STARTED, None), ("step/end", None, None, "interrupted"),
        ("turn/end", None, None, "interrupted")]
    assert "approval was requested and never given" in expired[0]["output"]


def test_a_rejected_call_left_without_its_result_says_it_was_rejected() -> None:
    tracker = PendingCalls().feed_all(numbered(PAUSED + [approval("t1", 1, "a", "rejected", by="ops")]))
    (a,) = [e for e in crash_plan(tracker) if e.get("call_id") == "a"]
    assert a["code"] == TOOL_NOT_STARTED and "rejected by a human" in a["output"]


def test_other_open_steps_and_turns_are_closed_around_a_held_step() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t0"},  # never closed
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},  # never closed
        {"type": "step/start", "turn": "t1", "step": 2},
        assistant("t1", 2, [("a", "deploy")]),
        approval("t1", 2, "a", "requested"),
    ])
    plan = crash_plan(PendingCalls().feed_all(records))
    assert [(e["type"], e.get("turn"), e.get("step")) for e in plan] == [
        ("step/end", "t1", 1), ("turn/end", "t0", None)]


def test_views_pair_an_awaiting_call_with_a_view_only_result() -> None:
    records = numbered(PAUSED)
    pairing = pair_calls(records)
    a, m, s = pairing.exchanges[0].calls
    assert a.result["code"] == TOOL_AWAITING_APPROVAL and a.view_time and a.awaiting_approval
    assert m.result_seq == 6 and s.result["code"] == TOOL_NOT_STARTED
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None
        assert any(TOOL_AWAITING_APPROVAL in i for i in view.issues)
    tool_a = project(records, "openai").items[2]
    assert tool_a["tool_call_id"] == "a" and tool_a["content"].startswith(TOOL_AWAITING_APPROVAL)
    assert all(e.get("code") != TOOL_AWAITING_APPROVAL for e in crash_plan(PendingCalls().feed_all(records),
                                                                           expire_approvals=True))


def test_live_step_recovery_never_answers_an_awaiting_call() -> None:
    store = sessionlog.open_store("memory:")
    store.create("s1", PAUSED[:3])
    with store.session("s1") as handle:
        with pytest.raises(RuntimeError):
            with StepScope(handle, turn="t1", step=1) as scope:
                scope.append([PAUSED[3], PAUSED[4], PAUSED[5], call("t1", 1, "s", "search")])
                raise RuntimeError("scheduler died")
    appended = [(e["type"], e.get("call_id"), e.get("code")) for e in scope.recovered]
    assert appended == [("tool/result", "s", TOOL_OUTCOME_UNKNOWN)]
    assert store.scan("s1").status == Status.SUSPENDED


# --- through the stores and the command line ---------------------------------------------


@pytest.fixture(params=["memory", "jsonl", "zstd", "sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgresql":
        yield from postgres_schema_url()
    else:
        yield {"memory": "memory:", "jsonl": f"jsonl:{tmp_path}", "zstd": f"zstd:{tmp_path}",
               "sqlite": f"sqlite:///{tmp_path / 'db.sqlite'}"}[request.param]


def test_suspended_on_every_backend(store_url: str) -> None:
    url = store_url
    with sessionlog.open_store(url) as store:
        store.create("s1", PAUSED + [call("t1", 1, "s", "search")])
        scan = store.scan("s1")
        assert scan.status == Status.REPAIRABLE and scan.awaiting_approval == ["a"], url
        rep = store.repair("s1")
        assert [(r["type"], r["call_id"]) for r in rep.appended] == [("tool/result", "s")], url
        scan = store.scan("s1")
        assert scan.status == Status.SUSPENDED and scan.unanswered_calls == ["a"], url
        assert scan.open_turn == "t1" and scan.open_step == 1
        assert store.repair("s1").status == "clean"  # a second repair: nothing
        dry = store.repair("s1", dry_run=True, expire_approvals=True)
        assert [r["type"] for r in dry.appended] == ["tool/result", "step/end", "turn/end"], url
        rep = store.repair("s1", expire_approvals=True)
        assert [r.raw for r in rep.appended] == [r.raw for r in dry.appended]
        assert rep.appended[0]["code"] == TOOL_NOT_STARTED
        assert store.scan("s1").status == Status.CLEAN, url


def test_a_damaged_tail_is_repairable_first_then_suspended(tmp_path: Path) -> None:
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1", PAUSED)
    with open(tmp_path / "s1.jsonl", "ab") as f:
        f.write(b'{"seq":8,"ts":1.0,"type":"tool/res')
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        assert store.scan("s1").status == Status.REPAIRABLE
        rep = store.repair("s1")
        assert [r["type"] for r in rep.appended] == ["log/truncated", "tool/result"]  # s: not started
        assert store.scan("s1").status == Status.SUSPENDED


def test_cli_scan_exits_0_for_suspended_and_repair_expires_on_request(tmp_path: Path, capsys) -> None:
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1", PAUSED + [result("t1", 1, "s", "found")])
    log = str(tmp_path / "s1.jsonl")
    before = Path(log).read_bytes()
    assert main(["scan", log, "--json"]) == 0
    assert '"suspended"' in capsys.readouterr().out
    assert main(["repair", log]) == 0 and Path(log).read_bytes() == before
    assert main(["repair", log, "--expire-approvals"]) == 0
    assert main(["scan", log]) == 0
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        assert store.scan("s1").status == Status.CLEAN
        assert [r.type for r in store.read("s1")][-3:] == ["tool/result", "step/end", "turn/end"]


# --- delivery across a pause (openai-agents #4947, with approval records) ---------------


class ApprovingRuntime(Runtime):
    """The test runtime of test_delivery, recording each pause as ``tool/approval``."""

    def run_tools(self, handle: Any, turn: str, step: int, approved: set[str]) -> bool:
        awaiting = {c.call_id for c in PendingCalls().feed_all(self.records()).awaiting()}
        for cid in sorted(awaiting & approved):
            handle.append([approval(turn, step, cid, "approved", by="ops")])
        ready = super().run_tools(handle, turn, step, approved)
        state = delivery_state(self.records())
        latest = next(r for r in reversed(self.records()) if r.type == "assistant/message")
        for c in latest["tool_calls"]:
            if c["id"] in state.awaiting and c["id"] not in awaiting and c["name"] in self.NEEDS_APPROVAL:
                handle.append([approval(turn, step, c["id"], "requested")])
        return ready


@pytest.mark.parametrize("mode", MODES)
def test_resume_after_approval_delivers_every_result_once(tmp_path: Path, mode: str) -> None:
    server = ScriptedServer([
        {"tool_calls": [{"id": "a1", "name": "deploy", "arguments": {}},
                        {"id": "a2", "name": "delete_db", "arguments": {}},
                        {"id": "missing", "name": "no_such_tool", "arguments": {}}]},
        {"content": "done"},
    ])
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1")
        rt = ApprovingRuntime(store, "s1", server, mode)
        assert rt.start("go") is False
        paused = rt.records()
        scan = store.scan("s1")
        assert scan.status == Status.SUSPENDED and scan.awaiting_approval == ["a1", "a2"]
        assert store.repair("s1").status == "clean"  # a repair while paused changes nothing
        assert [p.call_id for p in pending_deliveries(paused)] == ["missing"]
        assert rt.resume({"a1"}) is None  # a2 still awaits: paused again, no request
        assert store.scan("s1").status == Status.SUSPENDED and store.scan("s1").awaiting_approval == ["a2"]
        assert [p.call_id for p in pending_deliveries(rt.records())] == ["a1", "missing"]
        assert len(server.inputs) == 1
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:  # resume from the log alone
        rt = ApprovingRuntime(store, "s1", server, mode)
        assert rt.resume({"a1", "a2"}) == "done"
        records = rt.records()
        assert store.scan("s1").status == Status.CLEAN
    outputs = [i["call_id"] for i in server.inputs[-1] if i["type"] == "function_call_output"]
    assert outputs == ["a1", "a2", "missing"]  # every result produced before the pause, once
    _delivered_once(records, ["a1", "a2", "missing"])
    assert pending_deliveries(records) == []
