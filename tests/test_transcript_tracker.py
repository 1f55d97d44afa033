"""The pending-call tracker's fast path (records read by the scanner, followed on their
members' JSON text) against a straightforward reference: the tracker as it was before the
fast path, kept here verbatim but for two fixes (an unhashable ``tool/approval`` state
raised TypeError; it is now a state the tracker does not follow. A result naming a turn
open now answers the one call owed a result under its id, asked in an earlier turn: a run
resumed in a new turn; it was left an orphan, and repair answered the call again. Unless
that turn had its own call under the id answered since it opened, while another turn's was
owed one: then it repeats that answer).

Random record sequences over the core vocabulary (turns and steps nested, re-opened and
left open, tool calls, results and approvals with odd, missing, non-string and duplicate
ids, malformed ``tool_calls``, ``log/truncated`` and unknown types) are fed, as plain
dict events, as records read from their bytes (compact, and written by other hands: blanks,
escaped strings, repeated keys inside members) and as records without their members split,
to both trackers; after every record the call returned and the whole tracker state must
agree, and at the end so must everything repair and the views read from it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog.events import (
    ASSISTANT_MESSAGE,
    STEP_END,
    STEP_START,
    TOOL_APPROVAL,
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    Record,
    RecordRun,
    decode_region,
    encode_record,
    requested_calls,
)
from sessionlog.scan import LineScan, scan_bytes
from sessionlog.transcript import (
    PendingCall,
    PendingCalls,
    closers,
    crash_plan,
    pair_calls,
    recovery_results,
)

SLOW = bool(os.environ.get("SESSIONLOG_SLOW"))

# --- the reference ---------------------------------------------------------------------

_TRACKED = frozenset(
    {TURN_START, TURN_END, STEP_START, STEP_END, ASSISTANT_MESSAGE, TOOL_CALL, TOOL_RESULT, TOOL_APPROVAL}
)
_APPROVAL_STATES = frozenset({"requested", "approved", "rejected"})


def _key(value: Any) -> Any:
    if value is None or type(value) in (str, int, float, bool):
        return value
    return repr(value)


def _followed(state: Any) -> bool:
    try:
        return state in _APPROVAL_STATES
    except TypeError:  # the one fix: an unhashable state is not one the tracker follows
        return False


class ReferenceCalls:
    """The tracker before the fast path (sessionlog 2026-12-01, main e235309)."""

    def __init__(self) -> None:
        self.last_seq = 0
        self.last_ts = 0.0
        self._turns: dict[Any, Any] = {}
        self._steps: dict[tuple[Any, Any], tuple[Any, Any]] = {}
        self._calls: dict[PendingCall, None] = {}
        self._by_id: dict[str, list[PendingCall]] = {}
        self._opened: dict[Any, int] = {}  # open turn key -> the seq that opened it
        # every call answered while another turn's call under its id was owed a result, and the result's seq
        self._answered: list[tuple[PendingCall, int]] = []

    @property
    def open_turn(self) -> Any:
        return next(reversed(self._turns.values())) if self._turns else None

    @property
    def open_step(self) -> Any:
        return next(reversed(self._steps.values()))[1] if self._steps else None

    @property
    def step_turn(self) -> Any:
        return next(reversed(self._steps.values()))[0] if self._steps else None

    def open_turns(self) -> list[Any]:
        return list(self._turns.values())

    def open_steps(self) -> list[tuple[Any, Any]]:
        return list(self._steps.values())

    def unanswered(self) -> list[PendingCall]:
        return list(self._calls)

    def awaiting(self) -> list[PendingCall]:
        return [c for c in self._calls if c.approval == "requested"]

    def held(self) -> tuple[set[tuple[Any, Any]], set[Any]]:
        steps = {c.step_key for c in self._calls if c.approval == "requested"}
        return steps, {turn for turn, _ in steps}

    @property
    def is_open(self) -> bool:
        return bool(self._turns or self._steps or self._calls)

    @property
    def suspended(self) -> bool:
        if not self._calls:
            return False
        if any(c.approval != "requested" for c in self._calls):
            return False
        steps, turns = self.held()
        return all(k in steps for k in self._steps) and all(k in turns for k in self._turns)

    def feed(self, record: Mapping[str, Any]) -> PendingCall | None:
        if type(record) is Record:
            type_, seq, ts = record.type, record.seq, record.ts
        else:
            type_, seq, ts = record["type"], record["seq"], record["ts"]
        self.last_seq = seq
        self.last_ts = ts
        if type_ == TOOL_RESULT or type_ == TOOL_CALL:
            if not self._by_id:
                return None
            call = self._match(record)
            if call is None:
                return None
            if type_ == TOOL_CALL:
                if call.call_seq is None:
                    call.call_seq = seq
                return None
            call.answered = True
            if any(_key(c.turn) != _key(call.turn) for c in self._by_id[call.call_id] if c is not call):
                self._answered.append((call, seq))
            del self._calls[call]
            same = self._by_id[call.call_id]
            if len(same) == 1:
                del self._by_id[call.call_id]
            else:
                same.remove(call)
            return call
        if type_ not in _TRACKED:
            return None
        if type_ == ASSISTANT_MESSAGE:
            turn_raw = record.raw_member("turn") if type(record) is Record else None
            turn = self._turn_of(record)
            step = record.get("step")
            key = (_key(turn), _key(step))
            if key not in self._steps and type(step) is int:
                self._steps[key] = (turn, step)
            asked: set[str] = set()
            for req in requested_calls(record.get("tool_calls")):
                if req.id in asked:
                    continue
                asked.add(req.id)
                call = PendingCall(req.id, req.name, turn, step, seq, turn_raw=turn_raw)
                self._calls[call] = None
                self._by_id.setdefault(req.id, []).append(call)
        elif type_ == STEP_START:
            turn = self._turn_of(record)
            step = record.get("step")
            self._steps[(_key(turn), _key(step))] = (turn, step)
        elif type_ == STEP_END:
            self._steps.pop((_key(self._turn_of(record)), _key(record.get("step"))), None)
        elif type_ == TURN_START:
            turn = record.get("turn")
            if _key(turn) not in self._turns:
                self._opened[_key(turn)] = seq
            self._turns.pop(_key(turn), None)
            self._turns[_key(turn)] = turn
        elif type_ == TURN_END:
            key = _key(self._turn_of(record))
            self._turns.pop(key, None)
            self._opened.pop(key, None)
            for step_key in [k for k in self._steps if k[0] == key]:
                del self._steps[step_key]
        elif type_ == TOOL_APPROVAL:
            state = record.get("state")
            if self._by_id and _followed(state):
                call = self._match(record)
                if call is not None:
                    call.approval, call.approval_seq = state, seq
        return None

    def feed_all(self, records: Iterable[Mapping[str, Any]]) -> ReferenceCalls:
        for record in records:
            self.feed(record)
        return self

    def _turn_of(self, record: Mapping[str, Any]) -> Any:
        turn = record.get("turn")
        return turn if turn is not None else self.open_turn

    def _match(self, record: Mapping[str, Any]) -> PendingCall | None:
        call_id = record.get("call_id")
        calls = self._by_id.get(call_id) if type(call_id) is str else None
        if not calls:
            return None
        if len(calls) == 1:
            call = calls[0]
            if call.turn is None:
                return call
            if call.turn_raw is not None and type(record) is Record:
                raw = record.raw_member("turn")
                if raw is None or raw == call.turn_raw:
                    return call
            turn = record.get("turn")
            if turn is None or turn == call.turn or _key(turn) == _key(call.turn):
                return call
            # A turn open now answers an earlier turn's call, unless since it opened it had
            # its own call under this id answered while another turn's was owed one (this
            # record repeats that answer).
            key = _key(turn)
            if key in self._turns and not any(
                c.call_id == call.call_id and _key(c.turn) == key and at > self._opened[key]
                for c, at in self._answered
            ):
                return call
            return None
        turn = record.get("turn")
        if turn is not None:
            key = _key(turn)
            calls = [c for c in calls if c.turn is None or _key(c.turn) == key]
            if len(calls) <= 1:
                return calls[0] if calls else None
        named = record.get("assistant_seq")
        for call in calls:
            if call.assistant_seq == named:
                return call
        step = _key(record.get("step"))
        in_step = [c for c in calls if _key(c.step) == step]
        return (in_step or calls)[-1]


# --- what is compared --------------------------------------------------------------------


def _raw(raw: Any) -> bytes | None:
    return None if raw is None else bytes(raw)


def _call(call: PendingCall | None) -> str:
    if call is None:
        return "None"
    return repr((call.call_id, call.name, call.turn, call.step, call.assistant_seq, call.call_seq, call.answered,
                 call.approval, call.approval_seq, _raw(call.turn_raw), call.awaiting_approval, call.step_key))


def state(tracker: Any) -> str:
    """Everything a reader of the tracker can see, as text (1, 1.0 and True differ)."""
    steps, turns = tracker.held()
    return repr((
        tracker.last_seq, tracker.last_ts, tracker.open_turn, tracker.open_step, tracker.step_turn,
        tracker.open_turns(), tracker.open_steps(), list(tracker._turns), list(tracker._steps),
        [_call(c) for c in tracker.unanswered()], [_call(c) for c in tracker.awaiting()],
        {k: [_call(c) for c in v] for k, v in tracker._by_id.items()},
        sorted(map(repr, steps)), sorted(map(repr, turns)), tracker.is_open, tracker.suspended,
    ))


def plans(tracker: Any) -> str:
    """What repair and live recovery would write from the tracker."""
    return repr((
        crash_plan(tracker), crash_plan(tracker, expire_approvals=True),
        recovery_results(tracker, ts=5.0), recovery_results(tracker, ts=5.0, expire_approvals=True),
        closers(tracker, "error", ts=5.0), closers(tracker, "aborted", expire_approvals=True),
    ))


def agree(records: list[Any]) -> None:
    """Feed ``records`` to the tracker and the reference; they agree after every one."""
    tracker, reference = PendingCalls(), ReferenceCalls()
    for i, record in enumerate(records):
        outcomes = []
        for t in (tracker, reference):
            try:
                outcomes.append(("returned", _call(t.feed(record))))
            except Exception as exc:  # noqa: BLE001 - the same failure is the same behaviour
                outcomes.append(("raised", type(exc).__name__))
        assert outcomes[0] == outcomes[1], (i, record, outcomes)
        assert state(tracker) == state(reference), (i, record)
    assert plans(tracker) == plans(reference)


# --- random sessions ---------------------------------------------------------------------

TURNS = st.sampled_from(["t1", "t2", "t3", "", 1, 1.0, True, 2, None, [1], {"t": 1}, "t\u00e9", "1"])
STEPS = st.sampled_from([1, 2, 3, 1.0, True, 0, -1, "1", None, [1], {"s": 1}, 2**70])
IDS = st.sampled_from(["a", "b", "c", "", "a\u00e9", 1, None, ["a"], {"id": "a"}, True])
NAMES = st.sampled_from(["search", "deploy", "", 1, None, ["x"]])
STATES = st.sampled_from(["requested", "approved", "rejected", "denied", "", None, 1, ["requested"],
                          {"s": "requested"}])
MISSING = object()  # a member left out


def _member(draw: st.DrawFn, values: st.SearchStrategy[Any], missing: int = 4) -> Any:
    """A member's value, or MISSING one time in ``missing``."""
    return MISSING if draw(st.integers(0, missing - 1)) == 0 else draw(values)


@st.composite
def tool_calls(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from([None, {}, "a", 0, [], False, {"id": "a", "name": "x"}]))
    entries: list[Any] = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 9)) == 0:
            entries.append(draw(st.sampled_from([1, "a", None, ["a"], []])))  # not an object
            continue
        entry: dict[str, Any] = {}
        for name, values in (("id", IDS), ("name", NAMES)):
            value = _member(draw, values, 6)
            if value is not MISSING:
                entry[name] = value
        if draw(st.booleans()):
            entry["arguments"] = draw(st.sampled_from([{}, {"id": "z", "name": 1}, [1, [2, {"a": None}]], "x"]))
        entries.append(entry)
    return entries


@st.composite
def events(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A sequence of events: mostly a session's shape (turns holding steps holding a message
    and its calls' records), with anything else mixed in anywhere."""
    out: list[dict[str, Any]] = []
    asked: list[Any] = []  # call ids asked so far: results mostly name one
    turn: Any = "t1"
    step: Any = 1
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from([
            TURN_START, TURN_END, STEP_START, STEP_END, ASSISTANT_MESSAGE, TOOL_CALL, TOOL_RESULT, TOOL_RESULT,
            TOOL_APPROVAL, "user/message", "system/message", "log/truncated", "session/start", "x/custom",
        ]))
        event: dict[str, Any] = {"type": kind}
        if draw(st.integers(0, 3)) == 0:  # now and then another turn or step than the current one
            turn = draw(TURNS)
        if draw(st.integers(0, 3)) == 0:
            step = draw(STEPS)
        if kind != "session/start" and draw(st.integers(0, 5)):
            event["turn"] = turn
        elif draw(st.booleans()):
            event["turn"] = None
        if kind in (STEP_START, STEP_END, ASSISTANT_MESSAGE, TOOL_CALL, TOOL_RESULT, TOOL_APPROVAL) and draw(
                st.integers(0, 5)):
            event["step"] = step
        if kind == ASSISTANT_MESSAGE:
            event["content"] = draw(st.sampled_from([None, "", "text", {"a": [1]}]))
            calls = draw(tool_calls())
            if calls is not MISSING:
                event["tool_calls"] = calls
            if isinstance(calls, list):
                asked.extend(c.get("id") for c in calls if isinstance(c, dict))
        elif kind in (TOOL_CALL, TOOL_RESULT, TOOL_APPROVAL):
            if asked and draw(st.integers(0, 3)):
                event["call_id"] = draw(st.sampled_from(asked))
            else:
                call_id = _member(draw, IDS)
                if call_id is not MISSING:
                    event["call_id"] = call_id
            if kind == TOOL_RESULT:
                event["output"] = draw(st.sampled_from(["ok", "", {"x": [1, 2]}, None]))
                if draw(st.integers(0, 3)) == 0:
                    event["assistant_seq"] = draw(st.integers(0, 45))
            if kind == TOOL_APPROVAL:
                approval = _member(draw, STATES, 8)
                if approval is not MISSING:
                    event["state"] = approval
        elif kind in (STEP_END, TURN_END):
            event["status"] = draw(st.sampled_from(["completed", "error", None]))
        elif kind == "log/truncated":
            event.update(offset=10, dropped_bytes=3, reason="torn", quarantine=draw(st.sampled_from(["q", None, 1])))
        out.append(event)
    return out


def _text(value: Any, escaped: bool) -> str:
    """``value`` as JSON, with every string written another way (each character escaped)
    when ``escaped``."""
    if isinstance(value, str) and escaped:
        return '"' + "".join(f"\\u{ord(c):04x}" for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_text(v, escaped) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_text(k, escaped)}: {_text(v, escaped)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def hand_written(event: Mapping[str, Any], seq: int, ts: float, draw: st.DrawFn) -> bytes:
    """A record line as another tool could have written it: blanks after separators, some
    members' strings escaped, now and then a key repeated inside a tool call entry."""
    parts = [f'"seq": {seq}', f'"ts": {ts!r}', f'"type": {json.dumps(event["type"])}']
    for name, value in event.items():
        if name == "type":
            continue
        if name == "tool_calls" and isinstance(value, list) and value and isinstance(value[0], dict) and draw(
                st.booleans()):
            first = value[0]
            decoy = '{"id": "decoy", "name": 7, ' + _text(first, False)[1:] if first else '{"id": "decoy"}'
            text = "[" + ", ".join([decoy] + [_text(v, False) for v in value[1:]]) + "]"
        else:
            text = _text(value, draw(st.booleans()))
        parts.append(f"{json.dumps(name)}: {text}")
    return ("{" + ", ".join(parts) + "}").encode()


@st.composite
def records(draw: st.DrawFn) -> list[Any]:
    """The events as committed records, each one as a dict, a scanned Record, a Record
    decoded whole, or a Record without its members split."""
    out: list[Any] = []
    for seq, event in enumerate(draw(events()), 1):
        ts = 1_700_000_000.0 + seq / 4
        form = draw(st.sampled_from(["dict", "scanned", "scanned", "scanned", "hand", "hand", "whole", "unsplit"]))
        if form == "dict":
            out.append({"seq": seq, "ts": ts, **event})
            continue
        line = hand_written(event, seq, ts, draw) if form == "hand" else encode_record(event, seq, ts)
        record = Record.from_line(line)
        if form == "whole":
            dict(record)  # decoded whole: lookups read the decoded fields
        elif form == "unsplit":
            record = Record(record.raw, record.seq, record.ts, record.type)
        out.append(record)
    return out


@settings(max_examples=4000 if SLOW else 400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
def test_tracker_agrees_with_the_reference_on_any_records(records: list[Any]) -> None:
    agree(records)


@settings(max_examples=1000 if SLOW else 100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events())
def test_tracker_agrees_with_the_reference_on_a_scanned_log(events: list[dict[str, Any]]) -> None:
    """The records as the scanner reads them (region fast path and line by line), and the
    same events as dicts."""
    lines = [encode_record(e, seq, 1_700_000_000.0 + seq) for seq, e in enumerate(events, 1)]
    data = b"".join(line + b"\n" for line in lines)
    scanned, _, damage = scan_bytes(data)
    assert damage is None and len(scanned) == len(events)
    assert all(r.raw_member("type") is not None for r in scanned)  # members split: the fast path
    agree(scanned)
    agree(decode_region(data, 1))
    agree([{"seq": seq, "ts": 1_700_000_000.0 + seq, **e} for seq, e in enumerate(events, 1)])
    agree([{"seq": seq, "ts": 1_700_000_000.0 + seq, **e} for seq, e in enumerate(events, 1)])
    assert state(PendingCalls().feed_all(scanned)) == state(ReferenceCalls().feed_all(scanned))


@settings(max_examples=2000 if SLOW else 200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.lists(st.integers(1, 12), max_size=40))
def test_a_run_fed_at_once_is_its_records_fed_one_by_one(records: list[Any], sizes: list[int]) -> None:
    """``feed_run`` (how a scan feeds a region of records) agrees with the reference fed
    record by record, after every run, whatever the runs' lengths."""
    split = [r for r in records if type(r) is Record and r.raw_member("type") is not None]
    tracker, reference = PendingCalls(), ReferenceCalls()
    i = 0
    for size in [*sizes, len(split)]:
        run = split[i:i + size]
        i += len(run)
        tracker.feed_run(RecordRun.of(run))
        reference.feed_all(run)
        assert state(tracker) == state(reference), i
    assert plans(tracker) == plans(reference)


@settings(max_examples=1000 if SLOW else 100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events())
def test_a_scans_runs_fed_at_once_agree_with_the_reference(events: list[dict[str, Any]]) -> None:
    """The runs a scanner hands out (the region fast path's, without Record objects)."""
    lines = [encode_record(e, seq, 1_700_000_000.0 + seq) for seq, e in enumerate(events, 1)]
    data = b"".join(line + b"\n" for line in lines)
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        pos += n
        return data[pos - n:pos]

    tracker = PendingCalls()
    scanner = LineScan(read, session_id=None, where="<bytes>")
    for run in scanner.runs():
        tracker.feed_run(run)
    assert scanner.damage is None and scanner.count == len(events)
    reference = ReferenceCalls().feed_all([Record.from_line(line) for line in lines])
    assert state(tracker) == state(reference)
    assert plans(tracker) == plans(reference)


# --- cases worth naming --------------------------------------------------------------------


def _scanned(*events: dict[str, Any]) -> list[Record]:
    return [Record.from_line(encode_record(e, seq, 1.0 + seq)) for seq, e in enumerate(events, 1)]


def test_a_turn_written_another_way_still_matches_its_call() -> None:
    """The same turn as other text (escaped) decides on its value: the call is answered."""
    message = Record.from_line(b'{"seq":1,"ts":1.0,"type":"assistant/message","turn":"t1","step":1,'
                               b'"tool_calls":[{"id":"a","name":"x"}]}')
    result = Record.from_line(b'{"seq":2,"ts":2.0,"type":"tool/result","turn":"\\u0074\\u0031","step":1,'
                              b'"call_id":"\\u0061","output":"ok"}')
    other = Record.from_line(b'{"seq":2,"ts":2.0,"type":"tool/result","turn":"t2","step":1,"call_id":"a"}')
    tracker = PendingCalls()
    tracker.feed(message)
    assert tracker.feed(other) is None and [c.call_id for c in tracker.unanswered()] == ["a"]
    answered = tracker.feed(result)
    assert answered is not None and answered.call_id == "a" and tracker.unanswered() == []
    agree([message, other, result])


def test_tool_calls_that_are_not_a_list_of_objects_ask_for_what_the_general_rule_finds() -> None:
    tracker = PendingCalls().feed_all(_scanned(
        {"type": "assistant/message", "turn": "t", "step": 1, "tool_calls": [1, {"id": "a", "name": 2}, {"id": 3}]},
        {"type": "assistant/message", "turn": "t", "step": 2, "tool_calls": {"id": "b", "name": "x"}},
        {"type": "assistant/message", "turn": "t", "step": 3, "tool_calls": [{"name": "y", "id": "c", "id2": 1}]},
    ))
    assert [(c.call_id, c.name, c.step) for c in tracker.unanswered()] == [("a", "", 1), ("c", "y", 3)]


def test_a_repeated_key_in_a_tool_call_entry_keeps_its_last_value() -> None:
    line = b'{"seq":1,"ts":1.0,"type":"assistant/message","turn":"t","tool_calls":[{"id":"a","name":"x","id":"b"}]}'
    tracker = PendingCalls()
    tracker.feed(Record.from_line(line))
    assert [c.call_id for c in tracker.unanswered()] == ["b"]
    agree([Record.from_line(line)])


@pytest.mark.parametrize("state_value", [["requested"], {"a": 1}])
def test_an_unhashable_approval_state_is_not_followed(state_value: Any) -> None:
    """It used to raise TypeError (a scan of such a log failed); it is ignored like any other
    state the tracker does not know."""
    events = ({"type": "assistant/message", "turn": "t", "step": 1, "tool_calls": [{"id": "a", "name": "x"}]},
              {"type": "tool/approval", "turn": "t", "step": 1, "call_id": "a", "state": state_value})
    for records in (_scanned(*events), [{"seq": i, "ts": 1.0, **e} for i, e in enumerate(events, 1)]):
        tracker = PendingCalls().feed_all(records)
        assert [c.approval for c in tracker.unanswered()] == [None]


def test_pairing_reads_the_same_tracker_from_scanned_records_and_dicts() -> None:
    events = [
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
         "tool_calls": [{"id": "a", "name": "x", "arguments": {"q": 1}}, {"id": "b", "name": "y"}]},
        {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "a", "name": "x"},
        {"type": "tool/result", "turn": "t1", "step": 1, "call_id": "a", "output": "ok"},
    ]
    scanned = _scanned(*events)
    dicts = [{"seq": i, "ts": 1.0 + i, **e} for i, e in enumerate(events, 1)]
    for a, b in ((pair_calls(scanned), pair_calls(dicts)),):
        assert [(c.call_id, c.result_seq, (c.result or {}).get("code")) for e in a.exchanges for c in e.calls] == [
            (c.call_id, c.result_seq, (c.result or {}).get("code")) for e in b.exchanges for c in e.calls]
        assert a.issues == b.issues


def test_raw_members_compare_as_text() -> None:
    """The fast path relies on msgspec.Raw comparing its JSON text (equal text, equal value)."""
    assert msgspec.Raw(b'"t1"') == msgspec.Raw(b'"t1"') and msgspec.Raw(b'"t1"') != msgspec.Raw(b'"t2"')
