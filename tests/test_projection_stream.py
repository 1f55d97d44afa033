"""The streamed view (two passes, ids and positions in memory) against the in-memory
projection: the same items, issues and system text for every format, on the fixtures,
on damaged and crashed sessions, and on adversarial record soups (repairs at the end of
the log, unanswered calls, approvals, reused and renamed ids, system messages). And the
streaming pairing checker against the list-based checker it replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pairing_oracle import oracle_check_pairing
from sessions import crashed_sessions
from test_transcript import SLOW, damaged_sessions, numbered

import sessionlog
from sessionlog.contract import read_prefix
from sessionlog.contract import InvalidEvent
from sessionlog.projection import (
    FORMATS,
    PairingCheck,
    SessionChanged,
    StreamedView,
    UnknownFormat,
    Violation,
    check_pairing,
    project,
    stream_view,
)
from sessionlog.transcript import PendingCalls, crash_plan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURE_FILES = sorted(FIXTURES.glob("*.jsonl"))
EXAMPLES = 1000 if SLOW else 150


def streamed(records: list[Any], fmt: str) -> dict[str, Any]:
    reads = []

    def read() -> Any:
        reads.append(1)
        return iter(records)

    with stream_view(read, fmt) as view:
        issues = list(view.issues())
        document = view.to_json()
        key = "input" if fmt == "responses" else "messages"
        document[key] = list(document[key])
        assert len(reads) == 2  # two passes, no more
        return {"issues": issues, "document": document, "system": view.system}


def in_memory(records: list[Any], fmt: str) -> dict[str, Any]:
    view = project(records, fmt)
    return {"issues": view.issues, "document": view.to_json(), "system": view.system}


def assert_same(records: list[Any]) -> None:
    for fmt in FORMATS:
        a, b = streamed(records, fmt), in_memory(records, fmt)
        assert a == b, fmt
        # byte for byte, as show writes it
        assert json.dumps(a["document"], ensure_ascii=False, indent=2) == json.dumps(
            b["document"], ensure_ascii=False, indent=2)


def _view(store: sessionlog.EventStore, sid: str) -> list[Any]:
    plan = store.repair(sid, force=True, dry_run=True)
    return list(read_prefix(store, sid)) + (list(plan.appended) if plan.status == "repaired" else [])


@pytest.mark.parametrize("fixture", FIXTURE_FILES, ids=[f.stem for f in FIXTURE_FILES])
def test_fixtures_stream_as_they_project(tmp_path: Path, fixture: Path) -> None:
    shutil.copy(fixture, tmp_path / fixture.name)
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        sid = fixture.stem
        assert_same(list(read_prefix(store, sid)))
        assert_same(_view(store, sid))


@settings(max_examples=EXAMPLES, deadline=None)
@given(damaged_sessions())
def test_damaged_sessions_stream_as_they_project(records: list[dict[str, Any]]) -> None:
    assert_same(records)


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(crashed_sessions())
def test_crashed_and_repaired_sessions_stream_as_they_project(events: list[dict[str, Any]]) -> None:
    records = numbered(events)
    assert_same(records)
    # repair's results at the end of the log, far from their calls
    plan = crash_plan(PendingCalls().feed_all(records))
    assert_same(numbered(events + plan))


# --- adversarial soups: any event in any order -------------------------------------------

IDS = ["a", "b", "c", "", "call_5_0", "call_6_0", "call_7_1_2", "x" * 41, "bad id!", "call_9_0_1"]
TURNS = st.sampled_from(["t1", "t2", None])
CONTENT = st.one_of(st.none(), st.sampled_from(["", "hi", "ok"]), st.just([{"type": "text", "text": "b"}]),
                    st.just({"k": 1}))


@st.composite
def soup_event(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["turn/start", "turn/end", "step/start", "step/end", "user/message",
                                 "system/message", "assistant/message", "assistant/message", "tool/call",
                                 "tool/result", "tool/result", "tool/approval", "llm/request"]))
    turn, step = draw(TURNS), draw(st.sampled_from([1, 2, None]))
    event: dict[str, Any] = {"type": kind}
    if turn is not None:
        event["turn"] = turn
    if step is not None:
        event["step"] = step
    if kind in ("user/message", "system/message"):
        event["content"] = draw(CONTENT)
    elif kind == "assistant/message":
        event["content"] = draw(CONTENT)
        event["tool_calls"] = [
            {"id": draw(st.sampled_from(IDS)), "name": draw(st.sampled_from(["f", "g"])),
             "arguments": draw(st.one_of(st.just({"n": 1}), st.just('{"s": 2}'), st.just("not json"), st.none()))}
            for _ in range(draw(st.integers(0, 3)))
        ]
    elif kind in ("tool/call", "tool/result", "tool/approval"):
        event["call_id"] = draw(st.sampled_from(IDS))
        if kind == "tool/result":
            event["output"] = draw(st.one_of(st.sampled_from(["out", "TOOL_X: out", ""]), st.just({"o": [1]}),
                                             st.none()))
            event["is_error"] = draw(st.booleans())
            if draw(st.booleans()):
                event["code"] = draw(st.sampled_from(["TOOL_X", "TOOL_Y"]))
            if draw(st.integers(0, 5)) == 0:
                event["assistant_seq"] = draw(st.integers(2, 30))
        elif kind == "tool/approval":
            event["state"] = draw(st.sampled_from(["requested", "approved", "rejected", "other"]))
    return event


@st.composite
def exchange_block(draw: st.DrawFn) -> list[dict[str, Any]]:
    """An assistant message and what became of each of its calls (answered, answered
    twice, started, awaiting or refused approval, nothing), in any order."""
    turn = draw(TURNS)
    where = {} if turn is None else {"turn": turn, "step": 1}
    ids = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=3))
    events = [{"type": "assistant/message", **where, "content": draw(CONTENT),
               "tool_calls": [{"id": i, "name": "f", "arguments": {"i": i}} for i in ids]}]
    after = []
    for i in ids:
        fate = draw(st.sampled_from(["result", "result", "twice", "started", "awaiting", "rejected", "none"]))
        if fate in ("awaiting", "rejected"):
            after.append({"type": "tool/approval", **where, "call_id": i, "state": "requested"})
        if fate == "rejected":
            after.append({"type": "tool/approval", **where, "call_id": i, "state": "rejected"})
        if fate == "started":
            after.append({"type": "tool/call", **where, "call_id": i, "name": "f"})
        if fate in ("result", "twice", "rejected"):
            after.append({"type": "tool/result", **where, "call_id": i, "output": f"out {i}", "is_error": False})
        if fate == "twice":
            after.append({"type": "tool/result", **where, "call_id": i, "output": "again", "is_error": True})
    return events + draw(st.permutations(after))


@st.composite
def soups(draw: st.DrawFn) -> list[dict[str, Any]]:
    blocks = draw(st.lists(st.one_of(soup_event().map(lambda e: [e]), exchange_block()), max_size=12))
    events = [e for block in blocks for e in block]
    if draw(st.booleans()):  # what crash repair would append
        events = events + crash_plan(PendingCalls().feed_all(numbered(events)),
                                     expire_approvals=draw(st.booleans()))
    return numbered(events)


@settings(max_examples=EXAMPLES * 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(soups())
def test_adversarial_soups_stream_as_they_project(records: list[dict[str, Any]]) -> None:
    assert_same(records)


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(soups(), st.randoms(use_true_random=False))
def test_records_that_are_not_a_log_are_projected_in_memory(records: list[dict[str, Any]], rnd: Any) -> None:
    """Seqs out of order (not what a store reads) still give the in-memory view."""
    seqs = [r["seq"] for r in records]
    rnd.shuffle(seqs)
    assert_same([dict(r, seq=s) for r, s in zip(records, seqs, strict=True)])


def test_a_result_far_from_its_call_is_placed_with_it() -> None:
    records = numbered([
        {"type": "assistant/message", "content": None,
         "tool_calls": [{"id": "a", "name": "f", "arguments": {}}, {"id": "b", "name": "f", "arguments": {}}]},
        {"type": "tool/result", "call_id": "b", "output": "B", "is_error": False},
        {"type": "user/message", "content": "meanwhile"},
        {"type": "assistant/message", "content": "hm", "tool_calls": [{"id": "a", "name": "g", "arguments": {}}]},
        {"type": "tool/result", "call_id": "a", "output": "A2 (latest a)", "is_error": False},
        {"type": "tool/result", "call_id": "a", "output": "A1, written by repair at the end", "is_error": True},
    ])
    assert_same(records)
    with stream_view(lambda: iter(records), "openai") as view:
        items = list(view.items())
    assert [i.get("content") for i in items if i["role"] == "tool"][:2] == ["A1, written by repair at the end", "B"]


def test_errors_are_the_in_memory_errors() -> None:
    with pytest.raises(UnknownFormat):
        stream_view(lambda: iter([]), "gemini")
    for bad in (None, 5, "records", {"type": "x"}):
        with pytest.raises(InvalidEvent) as a:
            stream_view(lambda bad=bad: bad, "openai")
        with pytest.raises(InvalidEvent) as b:
            project(bad, "openai")
        assert str(a.value) == str(b.value)
    records = numbered([{"type": "user/message", "content": "x"}]) + [{"type": "user/message"}]
    with pytest.raises(InvalidEvent) as a:
        stream_view(lambda: iter(records), "openai")
    with pytest.raises(InvalidEvent) as b:
        project(records, "openai")
    assert str(a.value) == str(b.value)


def test_records_that_change_between_the_passes_are_refused() -> None:
    records = numbered([
        {"type": "user/message", "content": "x"},
        {"type": "assistant/message", "content": None, "tool_calls": [{"id": "a", "name": "f", "arguments": {}}]},
        {"type": "tool/result", "call_id": "a", "output": "A", "is_error": False},
    ])
    for second in (records[:-1], records + numbered([{"type": "user/message", "content": "more"}])[1:],
                   records[:-1] + [dict(records[-1], seq=9)]):
        passes = iter([records, second])
        with stream_view(lambda passes=passes: iter(next(passes)), "openai") as view, \
                pytest.raises(SessionChanged):
            list(view.items())


def test_items_are_read_once() -> None:
    with stream_view(lambda: iter(numbered([{"type": "user/message", "content": "x"}])), "openai") as view:
        assert isinstance(view, StreamedView)
        assert len(list(view.items())) == 1
        with pytest.raises(RuntimeError):
            list(view.items())


# --- the streaming checker against the list checker it replaced ---------------------------

CHECK_IDS = st.sampled_from(["a", "b", "c", "", "x" * 41, "bad id!", None, 7])


@st.composite
def openai_item(draw: st.DrawFn) -> Any:
    role = draw(st.sampled_from(["user", "assistant", "assistant", "tool", "tool", "system"]))
    item: dict[str, Any] = {"role": role, "content": draw(st.sampled_from([None, "x", [], 3]))}
    if role == "assistant" and draw(st.booleans()):
        item["tool_calls"] = [
            draw(st.one_of(st.just("junk"), st.fixed_dictionaries({
                "id": CHECK_IDS, "function": st.one_of(st.just(None), st.fixed_dictionaries(
                    {"arguments": st.sampled_from(["{}", {}, None])}))})))
            for _ in range(draw(st.integers(0, 3)))
        ]
    if role == "tool":
        item["tool_call_id"] = draw(CHECK_IDS)
    return item


@st.composite
def responses_item(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["message", "function_call", "function_call", "function_call_output",
                                 "function_call_output", "reasoning"]))
    item: dict[str, Any] = {"type": kind}
    if kind != "message":
        item["call_id"] = draw(CHECK_IDS)
        item["arguments"] = draw(st.sampled_from(["{}", {}]))
    return item


@st.composite
def anthropic_item(draw: st.DrawFn) -> Any:
    blocks = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["text", "tool_use", "tool_result"]))
        block: dict[str, Any] = {"type": kind}
        if kind == "tool_use":
            block["id"] = draw(CHECK_IDS)
        elif kind == "tool_result":
            block["tool_use_id"] = draw(CHECK_IDS)
        blocks.append(draw(st.sampled_from([block, block, block, "junk"])))
    return {"role": draw(st.sampled_from(["user", "assistant"])),
            "content": draw(st.sampled_from([blocks, blocks, blocks, "text"]))}


def _outcome(check: Any, *args: Any, **kw: Any) -> Any:
    """The verdict; a violation's call id that is not a string is None (the oracle names
    the value, the checker names no call: tests/test_pairing_hostile.py)."""
    violation = check(*args, **kw)
    if violation is not None and not isinstance(violation.call_id, (str, type(None))):
        violation = Violation(None, violation.index, violation.message)
    return violation


ITEMS = {"openai": openai_item(), "responses": responses_item(), "anthropic": anthropic_item()}


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=EXAMPLES * 3, deadline=None)
@given(data=st.data())
def test_streaming_checker_finds_what_the_list_checker_finds(fmt: str, data: Any) -> None:
    items = data.draw(st.lists(st.one_of(ITEMS[fmt], st.sampled_from([None, 3, "x"])).filter(
        lambda i: not isinstance(i, (int, str)) or data.draw(st.integers(0, 9)) == 0), max_size=10))
    server = data.draw(st.sampled_from([(), ("a",), ("a", "b")]))
    assert _outcome(check_pairing, iter(items), fmt, server_calls=server) == _outcome(
        oracle_check_pairing, items, fmt, server_calls=server)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=EXAMPLES, deadline=None)
@given(damaged_sessions(), st.data())
def test_streaming_checker_on_views_and_their_mutations(fmt: str, records: list[dict[str, Any]], data: Any) -> None:
    items = project(records, fmt).items
    assert check_pairing(items, fmt) is None
    if items:  # drop, repeat or move an item: both checkers name the same first violation
        i, j = data.draw(st.integers(0, len(items) - 1)), data.draw(st.integers(0, len(items)))
        how = data.draw(st.sampled_from(["drop", "repeat", "move"]))
        mutated = list(items)
        if how == "drop":
            del mutated[i]
        elif how == "repeat":
            mutated.insert(j, items[i])
        else:
            mutated.insert(j, mutated.pop(i))
        assert check_pairing(mutated, fmt) == oracle_check_pairing(mutated, fmt)


def test_pairing_check_fed_one_item_at_a_time() -> None:
    check = PairingCheck("openai")
    items = [{"role": "assistant", "content": None,
              "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    assert list(check.watch(items)) == items
    violation = check.result()
    assert violation is not None and (violation.call_id, violation.index) == ("a", 1)
    assert check.result() is violation
    with pytest.raises(RuntimeError):
        check.feed({})
    with pytest.raises(UnknownFormat):
        PairingCheck("gemini")
