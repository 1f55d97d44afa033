"""Tests of the pending-call tracker and of pair_calls, the one call/result pairing behind
projection and delivery.

This module also holds the session builders the projection, delivery and recovery tests
import: record lists written the way a runtime writes them, and a hypothesis strategy for
damaged sessions (crash at any event, parallel calls, results out of order, orphan and
duplicate results, unknown tools, failed and cancelled steps, late results)."""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sessionlog
from sessionlog.projection import project
from sessionlog.events import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, header_event
from sessionlog.transcript import (
    PendingCalls,
    closers,
    crash_plan,
    pair_calls,
    recovery_results,
)


def numbered(events: Sequence[Mapping[str, Any]], *, session: str = "s1", t0: float = 1_700_000_000.0
             ) -> list[dict[str, Any]]:
    """``events`` as committed records: a header first, then seq 2, 3, ... and a ts each."""
    out = [{"seq": 1, "ts": t0, **header_event(session)}]
    for i, event in enumerate(events):
        out.append({"seq": i + 2, "ts": event.get("ts", t0 + i + 1), **{k: v for k, v in event.items() if k != "ts"}})
    return out


def assistant(turn: str, step: int, calls: Sequence[tuple[str, str]], content: Any = None,
              arguments: Any = None) -> dict[str, Any]:
    return {"type": "assistant/message", "turn": turn, "step": step, "content": content,
            "tool_calls": [{"id": cid, "name": name, "arguments": arguments if arguments is not None else {"n": i}}
                           for i, (cid, name) in enumerate(calls)]}


def call(turn: str, step: int, cid: str, name: str) -> dict[str, Any]:
    return {"type": "tool/call", "turn": turn, "step": step, "call_id": cid, "name": name}


def result(turn: str, step: int, cid: str, output: str = "ok", is_error: bool = False, **extra: Any
           ) -> dict[str, Any]:
    return {"type": "tool/result", "turn": turn, "step": step, "call_id": cid, "output": output,
            "is_error": is_error, **extra}


TOOLS = ("read_file", "deploy", "search")
SLOW = bool(os.environ.get("SESSIONLOG_SLOW"))


@st.composite
def damaged_sessions(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A session as a runtime (and its failures) could have left it, cut at any event."""
    ids = itertools.count()
    events: list[dict[str, Any]] = []
    for t in range(draw(st.integers(1, 3))):
        turn = f"t{t}"
        events.append({"type": "turn/start", "turn": turn})
        if draw(st.booleans()) or t == 0:
            events.append({"type": "user/message", "turn": turn, "content": f"question {t}"})
        for step in range(1, draw(st.integers(1, 3)) + 1):
            events.append({"type": "step/start", "turn": turn, "step": step})
            calls = [(f"c{next(ids)}", draw(st.sampled_from(TOOLS + ("no_such_tool",))))
                     for _ in range(draw(st.integers(0, 4)))]
            message = assistant(turn, step, calls, content=draw(st.sampled_from([None, "", "thinking"])))
            if calls and draw(st.integers(0, 9)) == 0:  # the same id twice in one message
                message["tool_calls"].append(dict(message["tool_calls"][0]))
            events.append(message)
            starts, results, late = [], [], []
            for cid, name in calls:
                fate = draw(st.sampled_from(["ok", "error", "started", "not-started", "local-error", "late"]))
                if name == "no_such_tool":
                    fate = draw(st.sampled_from(["local-error", "not-started"]))
                if fate in ("ok", "error", "started", "late"):
                    starts.append(call(turn, step, cid, name))
                if fate in ("ok", "error"):
                    results.append(result(turn, step, cid, f"out {cid}", fate == "error"))
                elif fate == "local-error":
                    results.append(result(turn, step, cid, f"no tool named {name}", True, code="TOOL_NOT_FOUND"))
                elif fate == "late":
                    late.append(result(turn, step, cid, f"late {cid}"))
            results = draw(st.permutations(results))
            if results and draw(st.integers(0, 4)) == 0:
                results.append(dict(draw(st.sampled_from(results)), output="duplicate"))
            if draw(st.integers(0, 4)) == 0:
                results.insert(draw(st.integers(0, len(results))), result(turn, step, f"orphan{next(ids)}"))
            events.extend(starts)
            events.extend(results)
            end = draw(st.sampled_from(["completed", "recovered-error", "recovered-aborted", "bare-error", "open"]))
            if end.startswith("recovered"):
                # what live step recovery writes: the same tracker, the same codes
                tracker = PendingCalls().feed_all(numbered(events))
                status = end.split("-")[1]
                events.extend(recovery_results(tracker) + closers(tracker, status))
                break
            if end == "open":
                break
            events.append({"type": "step/end", "turn": turn, "step": step,
                           "status": "completed" if end == "completed" else "error"})
            events.extend(late)
        else:
            if draw(st.booleans()):
                events.append({"type": "turn/end", "turn": turn, "status": "completed"})
    cut = draw(st.integers(0, len(events)))
    return numbered(events[:cut])


def requested_ids(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every call id the assistant messages asked for (a repeat within a message once)."""
    out: list[str] = []
    for r in records:
        if r["type"] == "assistant/message":
            seen: list[str] = []
            for c in r.get("tool_calls") or []:
                if c["id"] not in seen:
                    seen.append(c["id"])
            out.extend(seen)
    return out


def calls_and_results(items: Sequence[Mapping[str, Any]], fmt: str) -> tuple[list[list[str]], list[list[str]]]:
    """Per tool round of a view: the call ids in order, and the result ids in order."""
    calls: list[list[str]] = []
    results: list[list[str]] = []
    for item in items:
        if fmt == "openai":
            if item.get("tool_calls"):
                calls.append([c["id"] for c in item["tool_calls"]])
                results.append([])
            elif item.get("role") == "tool":
                results[-1].append(item["tool_call_id"])
        elif fmt == "responses":
            if item.get("type") == "function_call":
                if not results or results[-1]:
                    calls.append([])
                    results.append([])
                calls[-1].append(item["call_id"])
            elif item.get("type") == "function_call_output":
                results[-1].append(item["call_id"])
        else:
            blocks = item["content"]
            if item["role"] == "assistant":
                uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
                if uses:
                    calls.append(uses)
                    results.append([])
            else:
                found = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
                if found:
                    results[-1].extend(found)
    return calls, results


def assert_paired(items: Sequence[Mapping[str, Any]], fmt: str, records: Sequence[Mapping[str, Any]]) -> None:
    """Every requested call appears exactly once, with exactly one result, in call order."""
    calls, results = calls_and_results(items, fmt)
    assert calls == results, (fmt, calls, results)
    flat = [c for group in calls for c in group]
    assert Counter(flat) == Counter(requested_ids(records)), (fmt, flat)


# --- tests -----------------------------------------------------------------------------


def _codes(pairing) -> dict[str, tuple[int | None, str | None]]:
    return {c.call_id: (c.result_seq, c.result.get("code") if c.result else None)
            for ex in pairing.exchanges for c in ex.calls}


def test_results_pair_in_call_order_whatever_order_they_were_logged() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "read_file"), ("b", "search")]),
        call("t1", 1, "a", "read_file"), call("t1", 1, "b", "search"),
        result("t1", 1, "b", "B"), result("t1", 1, "a", "A"),
        {"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
    ])
    pairing = pair_calls(records)
    (ex,) = pairing.exchanges
    assert [(c.call_id, c.result["output"], c.result_seq) for c in ex.calls] == [("a", "A", 8), ("b", "B", 7)]
    assert pairing.issues == [] and not ex.open


def test_closed_step_missing_results_get_view_time_results_with_repair_codes() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "deploy"), ("b", "search"), ("c", "read_file")]),
        call("t1", 1, "a", "deploy"),
        result("t1", 1, "c", "C"),
        {"type": "step/end", "turn": "t1", "step": 1, "status": "error"},
        {"type": "turn/end", "turn": "t1", "status": "error"},
    ])
    pairing = pair_calls(records)
    assert _codes(pairing) == {"a": (None, TOOL_OUTCOME_UNKNOWN), "b": (None, TOOL_NOT_STARTED), "c": (6, None)}
    a = pairing.exchanges[0].calls[0].result
    assert a["call_seq"] == 5 and a["synthetic"] is True and TOOL_OUTCOME_UNKNOWN in a["output"]
    assert len(pairing.issues) == 2 and all("view shows" in i for i in pairing.issues)


def test_open_tail_view_time_results_are_what_crash_repair_appends() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "deploy"), ("b", "search")]),
        call("t1", 1, "a", "deploy"),
    ])
    pairing = pair_calls(records)
    plan = crash_plan(PendingCalls().feed_all(records))
    view_time = [c.result for c in pairing.exchanges[0].calls]
    assert view_time == [e for e in plan if e["type"] == "tool/result"]
    assert pairing.exchanges[0].open


def test_orphan_duplicate_and_late_results() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        result("t1", 1, "x", "orphan before any call"),
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "read_file"), ("b", "search")]),
        call("t1", 1, "a", "read_file"),
        result("t1", 1, "a", "first"),
        result("t1", 1, "a", "second"),
        {"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
        result("t1", 1, "b", "late"),
        result("t1", 1, "b", "late again"),
    ])
    pairing = pair_calls(records)
    a, b = pairing.exchanges[0].calls
    assert a.result["output"] == "first" and b.result["output"] == "late" and b.result_seq == 10
    assert pairing.orphan_seqs == [3] and pairing.duplicate_seqs == [8, 11]
    assert any("late result seq 10" in i for i in pairing.issues)


def test_repeated_call_id_in_one_message_is_kept_once() -> None:
    message = assistant("t1", 1, [("a", "read_file")])
    message["tool_calls"].append(dict(message["tool_calls"][0]))
    pairing = pair_calls(numbered([{"type": "turn/start", "turn": "t1"}, message]))
    assert [c.call_id for c in pairing.exchanges[0].calls] == ["a"]
    assert any("twice" in i for i in pairing.issues)


def test_pairing_reads_committed_records_too() -> None:
    from sessionlog.events import Record, encode_record

    dicts = numbered([{"type": "turn/start", "turn": "t1"}, assistant("t1", 1, [("a", "read_file")]),
                      result("t1", 1, "a", "A")])
    records = [Record.from_line(encode_record({k: v for k, v in d.items() if k != "seq"}, d["seq"])) for d in dicts]
    assert _codes(pair_calls(records)) == _codes(pair_calls(dicts)) == {"a": (4, None)}


@settings(max_examples=300, deadline=None)
@given(damaged_sessions())
def test_every_requested_call_gets_exactly_one_result(records: list[dict[str, Any]]) -> None:
    pairing = pair_calls(records)
    paired = [c.call_id for ex in pairing.exchanges for c in ex.calls]
    assert Counter(paired) == Counter(requested_ids(records))
    assert all(c.result is not None for ex in pairing.exchanges for c in ex.calls)
    used = {c.result_seq for ex in pairing.exchanges for c in ex.calls if c.result_seq is not None}
    result_seqs = {r["seq"] for r in records if r["type"] == "tool/result"}
    # every logged result is used, or reported as an orphan or a duplicate, never both
    assert used | set(pairing.orphan_seqs) | set(pairing.duplicate_seqs) == result_seqs
    assert len(used) + len(pairing.orphan_seqs) + len(pairing.duplicate_seqs) == len(result_seqs)


@settings(max_examples=200, deadline=None)
@given(damaged_sessions())
def test_after_crash_repair_nothing_is_view_time_in_the_open_tail(records: list[dict[str, Any]]) -> None:
    plan = crash_plan(PendingCalls().feed_all(records))
    repaired = records + [{**e, "seq": len(records) + 1 + i} for i, e in enumerate(plan)]
    pairing = pair_calls(repaired)
    latest = pairing.latest
    if latest is not None:
        assert not latest.open
    assert not PendingCalls().feed_all(repaired).is_open


# --- every requested call is answered and every step and turn closed, wherever it is ----


def _repaired(records: list[dict[str, Any]], **options: Any) -> list[dict[str, Any]]:
    plan = crash_plan(PendingCalls().feed_all(records), **options)
    return records + [{**e, "seq": len(records) + 1 + i} for i, e in enumerate(plan)]


def closure_problems(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a log leaves open, by an oracle independent of the tracker: every turn opened
    and not ended, every step opened (step/start or an assistant message) and ended
    neither by its step/end nor by its turn's end."""
    turns: list[Any] = []
    steps: list[tuple[Any, Any]] = []
    for r in records:
        t, turn = r["type"], r.get("turn")
        if t == "turn/start":
            turns.append(turn)
        elif t == "turn/end":
            turns = [x for x in turns if x != turn]
            steps = [s for s in steps if s[0] != turn]
        elif t in ("step/start", "assistant/message"):
            if (turn, r.get("step")) not in steps and (t == "step/start" or isinstance(r.get("step"), int)):
                steps.append((turn, r.get("step")))
        elif t == "step/end":
            steps = [s for s in steps if s != (turn, r.get("step"))]
    return [f"turn {x!r} open" for x in turns] + [f"step {s!r} open" for s in steps]


def answer_counts(records: Sequence[Mapping[str, Any]]) -> tuple[Counter[str], Counter[str]]:
    """Call instances requested per id (a repeat within one message once) and results per id."""
    requested: Counter[str] = Counter(requested_ids(records))
    results: Counter[str] = Counter(r["call_id"] for r in records if r["type"] == "tool/result")
    return requested, results


def test_a_new_step_over_a_step_with_a_started_call_leaves_nothing_unanswered() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "deploy")]),
        call("t1", 1, "a", "deploy"),
        {"type": "step/start", "turn": "t1", "step": 2},
        assistant("t1", 2, [("b", "search")]),
        result("t1", 2, "b", "B"),
    ])
    tracker = PendingCalls().feed_all(records)
    assert [c.call_id for c in tracker.unanswered()] == ["a"] and tracker.is_open
    plan = crash_plan(tracker)
    assert [(e["type"], e.get("call_id"), e.get("code"), e.get("step")) for e in plan] == [
        ("tool/result", "a", TOOL_OUTCOME_UNKNOWN, 1),
        ("step/end", None, None, 2),
        ("step/end", None, None, 1),
        ("turn/end", None, None, None),
    ]
    assert plan[0]["call_seq"] == 5 and plan[0]["turn"] == "t1"
    repaired = _repaired(records)
    assert closure_problems(repaired) == [] and not PendingCalls().feed_all(repaired).is_open


def test_a_new_turn_over_an_open_turn_closes_both_and_answers_the_first_turns_calls() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "deploy"), ("b", "search")]),
        call("t1", 1, "a", "deploy"),
        {"type": "turn/start", "turn": "t2"},
        {"type": "user/message", "turn": "t2", "content": "hello?"},
    ])
    plan = crash_plan(PendingCalls().feed_all(records))
    assert [(e["type"], e.get("call_id"), e.get("code"), e.get("turn")) for e in plan] == [
        ("tool/result", "a", TOOL_OUTCOME_UNKNOWN, "t1"),
        ("tool/result", "b", TOOL_NOT_STARTED, "t1"),
        ("step/end", None, None, "t1"),
        ("turn/end", None, None, "t2"),
        ("turn/end", None, None, "t1"),
    ]
    assert closure_problems(_repaired(records)) == []


def test_two_assistant_messages_in_one_step_keep_both_messages_calls() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "deploy")]),
        call("t1", 1, "a", "deploy"),
        assistant("t1", 1, [("b", "search")]),
        {"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
        {"type": "turn/end", "turn": "t1", "status": "completed"},
    ])
    tracker = PendingCalls().feed_all(records)
    assert [c.call_id for c in tracker.unanswered()] == ["a", "b"]
    assert tracker.is_open  # closed step and turn, but two calls nobody answered
    plan = crash_plan(tracker)
    assert [(e["type"], e["call_id"], e["code"]) for e in plan] == [
        ("tool/result", "a", TOOL_OUTCOME_UNKNOWN), ("tool/result", "b", TOOL_NOT_STARTED)]
    repaired = _repaired(records)
    assert not PendingCalls().feed_all(repaired).is_open
    pairing = pair_calls(repaired)
    assert [(c.call_id, c.result_seq) for ex in pairing.exchanges for c in ex.calls] == [("a", 9), ("b", 10)]


def test_results_written_at_the_end_pair_with_their_calls_in_the_views() -> None:
    from sessionlog.projection import FORMATS, check_pairing, project

    records = _repaired(numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "deploy")]),
        call("t1", 1, "a", "deploy"),
        {"type": "turn/start", "turn": "t2"},
        {"type": "step/start", "turn": "t2", "step": 1},
        assistant("t2", 1, [("b", "search")], content="next"),
        result("t2", 1, "b", "B"),
    ]))
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None
        assert_paired(view.items, fmt, records)
        assert not any("view shows" in i for i in view.issues)
    chat = project(records, "openai").items
    assert [m["role"] for m in chat] == ["assistant", "tool", "assistant", "tool"]
    assert TOOL_OUTCOME_UNKNOWN in chat[1]["content"] and chat[3]["content"] == "B"


def test_a_reused_call_id_is_answered_for_the_call_that_lacks_a_result() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        assistant("t1", 1, [("c1", "search")]),
        result("t1", 1, "c1", "first"),
        {"type": "turn/end", "turn": "t1", "status": "completed"},
        {"type": "turn/start", "turn": "t2"},
        assistant("t2", 1, [("c1", "deploy")]),
        call("t2", 1, "c1", "deploy"),
    ])
    plan = crash_plan(PendingCalls().feed_all(records))
    assert [(e["type"], e.get("call_id"), e.get("turn"), e.get("code")) for e in plan] == [
        ("tool/result", "c1", "t2", TOOL_OUTCOME_UNKNOWN), ("step/end", None, "t2", None),
        ("turn/end", None, "t2", None)]
    pairing = pair_calls(_repaired(records))
    assert [c.result["output"][:5] for ex in pairing.exchanges for c in ex.calls] == ["first", TOOL_OUTCOME_UNKNOWN[:5]]


def test_a_late_result_of_an_earlier_turn_does_not_answer_a_later_call_with_the_same_id() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        assistant("t1", 1, [("c1", "search")]),
        result("t1", 1, "c1", "first"),
        {"type": "turn/end", "turn": "t1", "status": "completed"},
        {"type": "turn/start", "turn": "t2"},
        assistant("t2", 1, [("c1", "deploy")]),
        result("t1", 1, "c1", "a duplicate of t1's result"),
    ])
    assert [c.turn for c in PendingCalls().feed_all(records).unanswered()] == ["t2"]


@pytest.mark.parametrize("close_first", [False, True])
def test_a_result_written_in_a_later_open_turn_answers_the_call_of_an_earlier_one(close_first: bool) -> None:
    """A run resumed in a new turn (after a human's approval, say) records the result of a
    call its first turn asked with the new turn's name: the call has its result; repair
    writes none for it, and the view pairs the real one."""
    events = [
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("c1", "deploy")]),
        call("t1", 1, "c1", "deploy"),
    ]
    if close_first:
        events += [{"type": "step/end", "turn": "t1", "step": 1, "status": "interrupted"},
                   {"type": "turn/end", "turn": "t1", "status": "interrupted"}]
    events += [{"type": "turn/start", "turn": "t2"}, result("t2", 1, "c1", "deployed")]
    records = numbered(events)
    tracker = PendingCalls().feed_all(records)
    assert tracker.unanswered() == []
    assert "tool/result" not in [e["type"] for e in crash_plan(tracker)]
    pairing = pair_calls(records)
    assert [c.result["output"] for ex in pairing.exchanges for c in ex.calls] == ["deployed"]
    assert pairing.orphan_seqs == [] and pairing.duplicate_seqs == []


def test_a_repeated_result_of_an_open_turn_does_not_answer_an_earlier_turns_call_under_its_id() -> None:
    """The open turn asked for its own call under an id an earlier turn's unanswered call
    has (an id reused); its result written twice (re-appended after an append of unknown
    outcome): the second copy repeats that turn's answer, it is not the earlier call's."""
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        assistant("t1", 1, [("c1", "deploy")]),
        {"type": "tool/approval", "turn": "t1", "step": 1, "call_id": "c1", "state": "requested"},
        {"type": "step/end", "turn": "t1", "step": 1, "status": "interrupted"},
        {"type": "turn/end", "turn": "t1", "status": "interrupted"},
        {"type": "turn/start", "turn": "t2"},
        assistant("t2", 1, [("c1", "deploy")]),
        call("t2", 1, "c1", "deploy"),
        result("t2", 1, "c1", "deployed by t2"),
        result("t2", 1, "c1", "deployed by t2"),
    ])
    assert [c.turn for c in PendingCalls().feed_all(records).unanswered()] == ["t1"]
    pairing = pair_calls(records)
    assert [c.result_seq for ex in pairing.exchanges for c in ex.calls] == [None, 10]  # t1's: view-time
    assert pairing.duplicate_seqs == [11]


def test_records_naming_no_turn_answer_an_earlier_turns_call_after_the_open_turn_reused_its_id() -> None:
    """Ids numbered per response ("call_0" in every turn), tool records written without a
    turn: turn A's call awaits approval, turn B's own call_0 runs and is answered, then A's
    is approved and runs. Its records answer A's call: a real result is never dropped
    (repair would then call a deploy that ran "not started")."""
    records = numbered([
        {"type": "turn/start", "turn": "A"},
        assistant("A", 1, [("call_0", "deploy")]),
        {"type": "tool/approval", "step": 1, "call_id": "call_0", "state": "requested"},
        {"type": "turn/start", "turn": "B"},
        assistant("B", 1, [("call_0", "search")]),
        {"type": "tool/call", "step": 1, "call_id": "call_0", "name": "search"},
        {"type": "tool/result", "step": 1, "call_id": "call_0", "output": "found"},
        {"type": "tool/approval", "step": 1, "call_id": "call_0", "state": "approved"},
        {"type": "tool/call", "step": 1, "call_id": "call_0", "name": "deploy"},
        {"type": "tool/result", "step": 1, "call_id": "call_0", "output": "deployed"},
    ])
    tracker = PendingCalls().feed_all(records)
    assert tracker.unanswered() == []
    pairing = pair_calls(records)
    assert [c.result_seq for ex in pairing.exchanges for c in ex.calls] == [11, 8]
    assert pairing.duplicate_seqs == [] and pairing.orphan_seqs == []


def test_a_null_turn_is_read_alike_from_a_log_and_from_its_events(tmp_path) -> None:
    """Records with ``"turn": null`` (of the latest turn open) around an id reused by the
    next turn: the events and the same records read back from the log agree on what is
    answered and what is a duplicate."""
    events = [
        {"type": "turn/start", "turn": "A"},
        {"type": "assistant/message", "turn": None, "step": 1, "tool_calls": [{"id": "a", "name": "x"}]},
        {"type": "turn/start", "turn": "B"},
        assistant("B", 1, [("a", "x")]),
        result("B", 1, "a", "B's answer"),
        {"type": "tool/result", "turn": None, "step": 1, "call_id": "a", "output": "B's answer again"},
    ]
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s1")
    store.append("s1", events)
    read = list(store.read("s1"))
    given = numbered(events)
    assert [c.turn for c in PendingCalls().feed_all(read).unanswered()] == [
        c.turn for c in PendingCalls().feed_all(given).unanswered()]
    assert pair_calls(read).duplicate_seqs == pair_calls(given).duplicate_seqs


def test_an_id_answered_twice_in_one_turn_does_not_stop_that_turn_answering_another_turns_call() -> None:
    records = numbered([
        {"type": "turn/start", "turn": "A"},
        {"type": "turn/start", "turn": "B"},
        assistant("B", 1, [("a", "x")]),
        assistant("B", 2, [("a", "x")]),
        result("B", 2, "a", "B2"),  # only B's own other call is owed under the id
        result("B", 1, "a", "B1"),
        assistant("A", 1, [("a", "y")]),
        result("B", 3, "a", "A's, resumed in B"),
    ])
    assert PendingCalls().feed_all(records).unanswered() == []


def test_the_tracker_keeps_what_is_open_not_the_history_of_an_open_turn() -> None:
    """A long open turn whose calls are all answered: what the tracker holds stays small
    (it is what a scan of a large log keeps in memory)."""
    import tracemalloc

    def records(n: int) -> Iterator[dict[str, Any]]:
        yield {"type": "turn/start", "turn": "t1", "seq": 2, "ts": 1.0}
        for i in range(n):
            seq = 3 + 3 * i
            yield {**assistant("t1", i, [(f"call-{i}", "f")]), "seq": seq, "ts": 1.0}
            yield {**result("t1", i, f"call-{i}", "ok"), "seq": seq + 1, "ts": 1.0}
            yield {"type": "step/end", "turn": "t1", "step": i, "status": "completed", "seq": seq + 2, "ts": 1.0}

    tracemalloc.start()
    try:
        tracker = PendingCalls()
        base = tracemalloc.get_traced_memory()[0]
        tracker.feed_all(records(20_000))
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert tracker.unanswered() == [] and tracker.open_turn == "t1"
    assert held < 200_000  # 20,000 answered calls remembered would be megabytes


def test_ambiguous_synthetic_results_name_their_assistant_message() -> None:
    # the same id asked twice in one step and never answered: each synthetic result says
    # which message it answers, so the pairing cannot swap them
    records = numbered([
        {"type": "turn/start", "turn": "t1"},
        assistant("t1", 1, [("c1", "deploy")]),
        call("t1", 1, "c1", "deploy"),
        assistant("t1", 1, [("c1", "search")]),
    ])
    plan = crash_plan(PendingCalls().feed_all(records))
    assert [(e.get("assistant_seq"), e.get("code")) for e in plan if e["type"] == "tool/result"] == [
        (3, TOOL_OUTCOME_UNKNOWN), (5, TOOL_NOT_STARTED)]
    pairing = pair_calls(_repaired(records))
    assert [c.result["code"] for ex in pairing.exchanges for c in ex.calls] == [TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED]


# Random logs: any interleaving of turns, steps, assistant messages, calls and results.

@st.composite
def interleaved_logs(draw: st.DrawFn, approvals: bool = False) -> list[dict[str, Any]]:
    """Events in any order a runtime, a crash or a bug could leave: turns and steps opened
    over open ones, several assistant messages in one step, call ids reused (also ""),
    results for any call still owed one, ended at any point, and with ``approvals`` any
    ``tool/approval`` for a call still owed a result. A result is only written for a call
    instance that has none (the oracle counts results per id)."""
    events: list[dict[str, Any]] = []
    turns: list[str] = []
    owed: list[tuple[str, str, int]] = []  # (turn, call id, step) without a result
    n_turns = 0
    step = 0
    for _ in range(draw(st.integers(0, 40))):
        action = draw(st.sampled_from(["turn", "step", "assistant", "call", "result", "result",
                                       "end-step", "end-turn", "user"] + (["approval"] if approvals else [])))
        turn = turns[-1] if turns else None
        if action == "turn" or turn is None:
            n_turns += 1
            turns.append(f"t{n_turns}")
            events.append({"type": "turn/start", "turn": turns[-1]})
            step = 0
        elif action == "step":
            step += 1
            events.append({"type": "step/start", "turn": turn, "step": step})
        elif action == "assistant":
            ids = draw(st.lists(st.sampled_from(["c1", "c2", "c3", "", "x"]), max_size=3))
            message = assistant(turn, max(step, 1), [(i, "deploy") for i in ids])
            events.append(message)
            owed.extend((turn, i, max(step, 1)) for i in dict.fromkeys(ids))
        elif action == "call" and owed:
            t, cid, s = draw(st.sampled_from(owed))
            events.append(call(t, s, cid, "deploy"))
        elif action == "result" and owed:
            t, cid, s = owed.pop(draw(st.integers(0, len(owed) - 1)))
            events.append(result(t, s, cid, f"out {cid}"))
        elif action == "end-step" and step:
            events.append({"type": "step/end", "turn": turn, "step": draw(st.integers(1, step)),
                           "status": "completed"})
        elif action == "end-turn":
            events.append({"type": "turn/end", "turn": draw(st.sampled_from(turns)), "status": "completed"})
            turns.remove(events[-1]["turn"])
        elif action == "user":
            events.append({"type": "user/message", "turn": turn, "content": "more"})
        elif action == "approval" and owed:
            t, cid, s = draw(st.sampled_from(owed))
            events.append({"type": "tool/approval", "turn": t, "step": s, "call_id": cid,
                           "state": draw(st.sampled_from(["requested", "requested", "approved", "rejected"]))})
    return events


@settings(max_examples=3000 if SLOW else 300, deadline=None)
@given(interleaved_logs())
def test_after_crash_repair_every_call_is_answered_once_and_everything_is_closed(events) -> None:
    from sessionlog.projection import FORMATS, check_pairing, project

    repaired = _repaired(numbered(events))
    requested, results = answer_counts(repaired)
    assert requested == results, (requested, results)
    assert closure_problems(repaired) == []
    assert not PendingCalls().feed_all(repaired).is_open
    assert crash_plan(PendingCalls().feed_all(repaired)) == []  # a second repair: nothing
    pairing = pair_calls(repaired)
    assert not any(c.view_time for ex in pairing.exchanges for c in ex.calls)
    assert pairing.orphan_seqs == [] and pairing.duplicate_seqs == []
    for fmt in FORMATS:
        view = project(repaired, fmt)
        assert check_pairing(view.items, fmt) is None, (fmt, check_pairing(view.items, fmt))


@settings(max_examples=2000 if SLOW else 150, deadline=None)
@given(interleaved_logs(approvals=True))
def test_through_a_store_repair_leaves_a_clean_or_suspended_session(events) -> None:
    import sessionlog
    from sessionlog.projection import FORMATS, check_pairing, project

    store = sessionlog.open_store("memory:")
    store.create("s1", events)
    first = store.scan("s1")
    store.repair("s1")
    scan = store.scan("s1")
    if scan.status == "suspended":
        # all that is left is calls awaiting a human, and what holds them
        assert scan.unanswered_calls == scan.awaiting_approval != []
        assert store.repair("s1").status == "clean"  # nothing more to do
        for fmt in FORMATS:
            assert check_pairing(project(list(store.read("s1")), fmt).items, fmt) is None
    else:
        assert scan.status == "clean", (first.status, scan)
    store.repair("s1", expire_approvals=True)
    assert store.scan("s1").status == "clean"
    records = list(store.read("s1"))
    requested, results = answer_counts(records)
    assert requested == results
    assert closure_problems(records) == []
    for fmt in FORMATS:
        assert check_pairing(project(records, fmt).items, fmt) is None


def test_a_record_without_its_envelope_is_invalid_event_not_a_key_error():
    """pair_calls (and every view over it) takes records with ``type``, ``seq`` and ``ts``;
    anything else is refused with a SessionLogError naming what is missing."""
    import pytest

    import sessionlog

    for records in (None, 5):  # not a sequence of records at all
        with pytest.raises(sessionlog.InvalidEvent):
            pair_calls(records)
        with pytest.raises(sessionlog.InvalidEvent):
            sessionlog.project(records, "openai")
    for bad in ([{"type": "user/message"}], [{"seq": 1, "type": "x"}], [5], [{"seq": 1, "ts": 1.0}]):
        with pytest.raises(sessionlog.InvalidEvent, match="record 0"):
            pair_calls(bad)
        for fmt in ("openai", "responses", "anthropic"):
            with pytest.raises(sessionlog.InvalidEvent):
                sessionlog.project(bad, fmt)
        with pytest.raises(sessionlog.InvalidEvent):
            sessionlog.pending_deliveries(bad)


def test_a_result_of_a_call_asked_outside_any_step_is_not_late() -> None:
    # Records without steps (another tool's conversation, a runtime that does not use
    # steps): a result after its call is simply its result.
    records = numbered([
        {"type": "user/message", "content": "hi"},
        {"type": "assistant/message", "content": None, "tool_calls": [{"id": "a", "name": "f", "arguments": {}}]},
        {"type": "tool/result", "call_id": "a", "output": "ok"},
    ])
    pairing = pair_calls(records)
    assert pairing.exchanges[0].calls[0].result["output"] == "ok"
    assert pairing.issues == []
    assert project(records, "anthropic").issues == []
