"""Tests of the pending-call tracker and of pair_calls, the one call/result pairing behind
projection and delivery.

This module also holds the session builders the projection, delivery and recovery tests
import: record lists written the way a runtime writes them, and a hypothesis strategy for
damaged sessions (crash at any event, parallel calls, results out of order, orphan and
duplicate results, unknown tools, failed and cancelled steps, late results)."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

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
