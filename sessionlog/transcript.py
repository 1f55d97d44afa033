"""Pending-call tracking and transcript repair: pure functions over events, no I/O.

One :class:`PendingCalls` tracker, fed records in order, knows everything a session
leaves open: every call without a result wherever it is (and which have a durable
``tool/call``, which await a human's approval), every turn and step not closed. Scan
(status, unanswered calls), crash repair (:func:`crash_plan`), live step recovery
(:func:`recovery_results`, :func:`closers`) and the call/result pairing behind the
provider views and delivery (:func:`pair_calls`) all read it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from .contract import InvalidEvent
from .events import (
    ASSISTANT_MESSAGE,
    LOG_TRUNCATED,
    STEP_END,
    STEP_START,
    SYSTEM_MESSAGE,
    TOOL_APPROVAL,
    TOOL_AWAITING_APPROVAL,
    TOOL_CALL,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Record,
    RecordRun,
    requested_calls,
)

_APPROVAL_STATES = frozenset({"requested", "approved", "rejected"})


def _key(value: Any) -> Any:
    """A hashable stand-in for a turn or step value (JSON lists and objects are not)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    return repr(value)


_UNSET: Any = object()


class PendingCall(msgspec.Struct, eq=False):
    """A call an ``assistant/message`` asked for (``assistant_seq``: that message's seq),
    in its ``turn`` and ``step``.

    Compared and hashed by identity. A C-level struct: a scan builds one per call asked
    for, and a dataclass's ``__init__`` costs twice as much."""

    call_id: str
    name: str
    turn: Any = None
    step: Any = None
    assistant_seq: int = 0
    call_seq: int | None = None  # seq of its durable tool/call, if any
    answered: bool = False
    approval: str | None = None  # state of its latest tool/approval, if any
    approval_seq: int | None = None
    turn_raw: Any = None  # the message's turn member as written, when read from a log

    @property
    def awaiting_approval(self) -> bool:
        """True while its latest ``tool/approval`` is ``requested``: a human is deciding."""
        return self.approval == "requested"

    @property
    def step_key(self) -> tuple[Any, Any]:
        return (_key(self.turn), _key(self.step))


class PendingCalls:
    """Incremental tracker of what a session leaves open. Feed it every record in order.

    It knows every call any ``assistant/message`` asked for that has no result yet,
    wherever it is (an earlier step, an earlier turn, a message before another one in the
    same step), every turn opened and not ended, and every step opened (``step/start``,
    or an ``assistant/message`` of a step not open) and ended neither by its ``step/end``
    nor by its turn's ``turn/end``.

    A ``tool/call``, ``tool/result`` or ``tool/approval`` names its call by ``call_id``:
    it applies to the call without a result that has that id; when the record carries a
    ``turn``, only a call of that turn. Among several such calls, the one whose assistant
    message's seq the record names (``assistant_seq``, written on synthetic results when
    the id alone is ambiguous), else one of the record's step, else the latest.

    ``open_turn``, ``open_step`` and ``step_turn`` seed an open turn and step (a live
    step scope that did not see them committed)."""

    __slots__ = ("last_seq", "last_ts", "_turns", "_steps", "_calls", "_by_id", "_answered_in", "_last_turn_raw",
                 "_last_turn")

    def __init__(self, open_turn: str | None = None, open_step: int | None = None,
                 step_turn: str | None = None) -> None:
        self.last_seq = 0
        self.last_ts = 0.0
        self._turns: dict[Any, Any] = {}  # key -> turn value, in opening order
        self._steps: dict[tuple[Any, Any], tuple[Any, Any]] = {}  # key -> (turn, step), in opening order
        self._calls: dict[PendingCall, None] = {}  # unanswered, in log order (by identity)
        self._by_id: dict[str, list[PendingCall]] = {}  # call id -> its unanswered calls, in log order
        # open turn (key) -> ids under which its own call was answered while another turn's
        # call was still owed a result: a later record naming that turn under such an id
        # repeats its answer, it does not answer the other turn's call.
        self._answered_in: dict[Any, set[str]] = {}
        self._last_turn_raw: Any = None  # the latest turn member text decoded to a string ...
        self._last_turn: Any = None  # ... and that string
        if open_turn is not None:
            self._turns[_key(open_turn)] = open_turn
        if open_step is not None:
            turn = step_turn if step_turn is not None else open_turn
            self._steps[(_key(turn), _key(open_step))] = (turn, open_step)

    # -- what is open ------------------------------------------------------------------

    @property
    def open_turn(self) -> Any:
        """The latest turn still open (None when none is)."""
        return next(reversed(self._turns.values())) if self._turns else None

    @property
    def open_step(self) -> Any:
        """The step number of the latest step still open (None when none is)."""
        return next(reversed(self._steps.values()))[1] if self._steps else None

    @property
    def step_turn(self) -> Any:
        """The turn of the latest step still open."""
        return next(reversed(self._steps.values()))[0] if self._steps else None

    def open_turns(self) -> list[Any]:
        """Every turn still open, in the order they were opened."""
        return list(self._turns.values())

    def open_steps(self) -> list[tuple[Any, Any]]:
        """Every step still open as ``(turn, step)``, in the order they were opened."""
        return list(self._steps.values())

    def unanswered(self) -> list[PendingCall]:
        """Every call without a result, in log order (message by message, in each
        message's call order)."""
        return list(self._calls)

    def pending(self, call_id: str) -> PendingCall | None:
        """The latest call with id ``call_id`` that has no result yet (None when none)."""
        calls = self._by_id.get(call_id)
        return calls[-1] if calls else None

    def awaiting(self) -> list[PendingCall]:
        """The calls without a result whose latest ``tool/approval`` is ``requested``."""
        return [c for c in self._calls if c.approval == "requested"]

    def held(self) -> tuple[set[tuple[Any, Any]], set[Any]]:
        """The steps and turns held open by calls awaiting approval (keys)."""
        steps = {c.step_key for c in self._calls if c.approval == "requested"}
        return steps, {turn for turn, _ in steps}

    @property
    def is_open(self) -> bool:
        """True when a turn, a step or a call is left open."""
        return bool(self._turns or self._steps or self._calls)

    @property
    def suspended(self) -> bool:
        """True when what is open is only calls awaiting approval and the steps and
        turns that hold them: a human is deciding, nothing crashed."""
        if not self._calls:
            return False
        if any(c.approval != "requested" for c in self._calls):
            return False
        steps, turns = self.held()
        return all(k in steps for k in self._steps) and all(k in turns for k in self._turns)

    # -- feeding ------------------------------------------------------------------------

    def feed(self, record: Mapping[str, Any]) -> PendingCall | None:
        """Account for one committed record (a :class:`~sessionlog.events.Record` or a dict).

        Returns the call a ``tool/result`` answered (None for anything else, and for a
        result that answers no call still owed one). Only the members the transcript
        needs are decoded: a tool result's output is never materialized, a record of a
        type the tracker ignores is not looked into, and a record read by the scanner
        (its members split, undecoded) is followed on its members' JSON text where that
        decides as much as their values would."""
        if type(record) is not Record or record._members is None:  # type: ignore[attr-defined]
            return self._feed_mapping(record)
        self.last_ts = record.ts  # type: ignore[attr-defined]
        return self._feed_scanned(record.type, record.seq, record._members)  # type: ignore[attr-defined]

    def feed_run(self, run: RecordRun) -> None:
        """Account for a run of scanned records (a scanner's :class:`RecordRun`), in
        order: what :meth:`feed` does with each of them, without a Record object per
        record.

        The rules of :meth:`_feed_scanned`, with its common cases written out in one loop
        (a method call per record was a fifth of a scan): the memos live in locals (the
        latest turn text decoded to a string, and likewise the latest step text decoded
        to an int and the latest call id text), and a record of a type the loop does not
        spell out goes through :meth:`_feed_scanned` itself."""
        if not run.seqs:
            return
        turns, steps, by_id = self._turns, self._steps, self._by_id
        turn_memo, turn_value = self._last_turn_raw, self._last_turn
        step_memo: Any = None
        step_value: Any = None
        id_memo: Any = None
        id_value: Any = None
        decode, decode_str, named, key_of = _decode, _decode_str, _named_decoder.decode, _key
        seq = self.last_seq
        try:
            for type_, seq, members in zip(run.types, run.seqs, run.members):
                if type_ == TOOL_RESULT or type_ == TOOL_CALL:
                    if not by_id:
                        continue  # no call is owed a result: leave the record undecoded
                    raw = members.get("call_id")
                    if raw is None:
                        continue
                    if raw == id_memo:
                        calls = by_id.get(id_value)
                    else:
                        try:
                            call_id = decode_str(raw)
                        except msgspec.ValidationError:  # not a string: names no call
                            continue
                        id_memo, id_value = raw, call_id
                        calls = by_id.get(call_id)
                    if not calls:
                        continue
                    if len(calls) == 1:
                        call = calls[0]
                        if call.turn is not None:
                            raw = members.get("turn")
                            if raw is not None and (call.turn_raw is None or raw != call.turn_raw):
                                if not self._answers(call, decode(raw)):
                                    continue
                    else:
                        call = self._match(_scanned(type_, seq, members))
                        if call is None:
                            continue
                    self._settle(call, type_ == TOOL_RESULT, seq)
                elif type_ == STEP_START or type_ == STEP_END or type_ == ASSISTANT_MESSAGE:
                    turn_raw = raw = members.get("turn")
                    if raw is not None and raw == turn_memo:
                        turn = turn_key = turn_value  # a string: its own key
                    else:
                        turn = decode(raw) if raw is not None else None
                        if type(turn) is str:
                            turn_memo, turn_value = raw, turn
                        elif turn is None:
                            turn = next(reversed(turns.values())) if turns else None
                        turn_key = turn if type(turn) is str else key_of(turn)
                    raw = members.get("step")
                    if raw is None:
                        step = step_key = None
                    elif raw == step_memo:
                        step = step_key = step_value  # an int: its own key
                    else:
                        step = decode(raw)
                        if type(step) is int:
                            step_memo, step_value = raw, step
                            step_key = step
                        else:
                            step_key = key_of(step)
                    key = (turn_key, step_key)
                    if type_ == STEP_START:
                        steps[key] = (turn, step)
                    elif type_ == STEP_END:
                        steps.pop(key, None)
                    else:
                        raw = members.get("tool_calls")
                        if raw is None or raw == _NO_CALLS or raw == _NULL:
                            requests = []
                        else:
                            try:
                                requests = named(raw)
                            except msgspec.ValidationError:
                                requests = _requests(raw)
                        self.last_seq = seq
                        self._asked(turn, step, key, turn_raw, requests)
                elif type_ == TURN_START:
                    raw = members.get("turn")
                    turn = None if raw is None else decode(raw)
                    if type(turn) is str:
                        turn_memo, turn_value = raw, turn
                        key = turn
                    else:
                        key = key_of(turn)
                    turns.pop(key, None)  # a turn started again is the latest
                    turns[key] = turn
                elif type_ == TURN_END:
                    raw = members.get("turn")
                    if raw is not None and raw == turn_memo:
                        key = turn_value
                    else:  # once per turn: the method's own memo serves
                        turn = self._turn_text(raw)
                        key = turn if type(turn) is str else key_of(turn)
                    self._end_turn(key)  # once per turn: its steps and memos go with it
                elif type_ == TOOL_APPROVAL:
                    self._last_turn_raw, self._last_turn = turn_memo, turn_value
                    self._feed_scanned(type_, seq, members)
                    turn_memo, turn_value = self._last_turn_raw, self._last_turn
        finally:
            self.last_seq = seq
            self._last_turn_raw, self._last_turn = turn_memo, turn_value
        self.last_ts = run.tss[-1]

    def _feed_scanned(self, type_: str, seq: int, members: dict[str, Any]) -> PendingCall | None:
        """:meth:`feed` for a scanned record, given as its type, seq and members (name ->
        JSON text): the rules of the mapping path below, on the members' JSON text
        (decoded only where the text does not decide), in one frame."""
        self.last_seq = seq
        if type_ == TOOL_RESULT or type_ == TOOL_CALL:
            by_id = self._by_id
            if not by_id:
                return None  # no call is owed a result: leave the record undecoded
            raw = members.get("call_id")
            if raw is None:
                return None
            try:
                calls = by_id.get(_decode_str(raw))
            except msgspec.ValidationError:  # not a string: names no call
                return None
            if not calls:
                return None
            if len(calls) == 1:  # the common case: one call owed a result under this id
                call = calls[0]
                if call.turn is not None:
                    raw = members.get("turn")
                    if raw is not None and (call.turn_raw is None or raw != call.turn_raw):
                        if not self._answers(call, _decode(raw)):  # not the turn as its message wrote it
                            return None
            else:
                call = self._match(_scanned(type_, seq, members))
                if call is None:
                    return None
            return self._settle(call, type_ == TOOL_RESULT, seq)
        if type_ == STEP_START or type_ == STEP_END or type_ == ASSISTANT_MESSAGE:
            turn_raw = raw = members.get("turn")
            if raw is not None and raw == self._last_turn_raw:
                turn = turn_key = self._last_turn  # a string: its own key
            else:
                turn = self._turn_text(raw)
                turn_key = turn if type(turn) is str else _key(turn)
            raw = members.get("step")
            step = None if raw is None else _decode(raw)
            key = (turn_key, step if type(step) is int else _key(step))
            if type_ == ASSISTANT_MESSAGE:
                raw = members.get("tool_calls")
                if raw is None or raw == _NO_CALLS or raw == _NULL:
                    requests: list[Any] = []
                else:
                    requests = _requests(raw)
                self._asked(turn, step, key, turn_raw, requests)
                return None
            if type_ == STEP_START:
                self._steps[key] = (turn, step)
            else:
                self._steps.pop(key, None)
            return None
        if type_ == TURN_START:
            raw = members.get("turn")
            turn = None if raw is None else _decode(raw)
            key = turn if type(turn) is str else _key(turn)
            self._turns.pop(key, None)  # a turn started again is the latest
            self._turns[key] = turn
        elif type_ == TURN_END:
            raw = members.get("turn")
            turn = self._last_turn if raw is not None and raw == self._last_turn_raw else self._turn_text(raw)
            self._end_turn(turn if type(turn) is str else _key(turn))
        elif type_ == TOOL_APPROVAL and self._by_id:
            raw = members.get("state")
            state = None if raw is None else _decode(raw)
            if _approval_state(state):
                call = self._match(_scanned(type_, seq, members))
                if call is not None:
                    call.approval, call.approval_seq = state, seq
        return None

    def _feed_mapping(self, record: Mapping[str, Any]) -> PendingCall | None:
        """:meth:`feed` for a dict event or a Record without its members split."""
        if type(record) is Record:
            type_, seq, ts = record.type, record.seq, record.ts  # type: ignore[attr-defined]
        else:
            type_, seq, ts = record["type"], record["seq"], record["ts"]
        self.last_seq = seq
        self.last_ts = ts
        on_record = _ON_RECORD.get(type_)
        return None if on_record is None else on_record(self, record)

    def feed_all(self, records: Iterable[Mapping[str, Any]]) -> PendingCalls:
        for record in records:
            self.feed(record)
        return self

    # The rules, on any mapping (a dict event, a Record without its members split).

    def _turn_of(self, record: Mapping[str, Any]) -> Any:
        turn = record.get("turn")
        return turn if turn is not None else self.open_turn

    def _tool_call(self, record: Mapping[str, Any]) -> None:
        if self._by_id:  # else no call is owed one: leave the record undecoded
            call = self._match(record)
            if call is not None:
                self._settle(call, False, self.last_seq)

    def _tool_result(self, record: Mapping[str, Any]) -> PendingCall | None:
        if not self._by_id:
            return None
        call = self._match(record)
        return None if call is None else self._settle(call, True, self.last_seq)

    def _settle(self, call: PendingCall, result: bool, seq: int) -> PendingCall | None:
        """A ``tool/call`` (``result`` False) or ``tool/result`` matched ``call``."""
        if not result:
            if call.call_seq is None:
                call.call_seq = seq
            return None
        call.answered = True
        del self._calls[call]
        same = self._by_id[call.call_id]
        if len(same) == 1:
            del self._by_id[call.call_id]
        else:
            same.remove(call)
            turn = _key(call.turn)
            if turn in self._turns and any(_key(other.turn) != turn for other in same):
                self._answered_in.setdefault(turn, set()).add(call.call_id)
        return call

    def _assistant_message(self, record: Mapping[str, Any]) -> None:
        turn_raw = record.raw_member("turn") if type(record) is Record else None  # type: ignore[attr-defined]
        turn = self._turn_of(record)
        step = record.get("step")
        self._asked(turn, step, (_key(turn), _key(step)), turn_raw, requested_calls(record.get("tool_calls")))

    def _asked(self, turn: Any, step: Any, key: tuple[Any, Any], turn_raw: Any, requests: list[Any]) -> None:
        """An ``assistant/message`` of ``turn`` and ``step`` (``key``: their keys) asked
        for ``requests`` (entries with a string ``id`` and a ``name``, in order)."""
        if type(step) is int and key not in self._steps:
            self._steps[key] = (turn, step)
        if not requests:
            return
        asked: set[str] = set()
        seq = self.last_seq
        calls, by_id = self._calls, self._by_id
        for req in requests:
            call_id = req.id
            if call_id in asked:
                continue  # repeated within one message: one call
            asked.add(call_id)
            call = PendingCall(call_id, req.name, turn, step, seq, None, False, None, None, turn_raw)
            calls[call] = None
            same = by_id.get(call_id)
            if same is None:
                by_id[call_id] = [call]
            else:
                same.append(call)

    def _step_start(self, record: Mapping[str, Any]) -> None:
        turn = self._turn_of(record)
        step = record.get("step")
        self._steps[(_key(turn), _key(step))] = (turn, step)

    def _step_end(self, record: Mapping[str, Any]) -> None:
        self._steps.pop((_key(self._turn_of(record)), _key(record.get("step"))), None)

    def _turn_start(self, record: Mapping[str, Any]) -> None:
        turn = record.get("turn")
        key = _key(turn)
        self._turns.pop(key, None)  # a turn started again is the latest
        self._turns[key] = turn

    def _turn_end(self, record: Mapping[str, Any]) -> None:
        self._end_turn(_key(self._turn_of(record)))

    def _end_turn(self, key: Any) -> None:
        self._turns.pop(key, None)
        if self._answered_in:
            self._answered_in.pop(key, None)
        # A turn's end ends every step of it.
        if self._steps:
            for step_key in [k for k in self._steps if k[0] == key]:
                del self._steps[step_key]

    def _approval(self, record: Mapping[str, Any]) -> None:
        state = record.get("state")
        if self._by_id and _approval_state(state):
            call = self._match(record)
            if call is not None:
                call.approval, call.approval_seq = state, self.last_seq

    def _answers(self, call: PendingCall, turn: Any) -> bool:
        """A record naming ``turn`` answers ``call``, the one call owed a result under its
        id: it names no turn, the call's turn, or a turn open now (see :meth:`_match`)
        unless that turn's own call under this id was answered while ``call`` was owed one
        too (the record repeats that answer). A record naming no turn cannot be told from
        a late answer to ``call``: it answers it (dropping a real result would have repair
        call a call that ran "not started")."""
        if turn is None or turn == call.turn:
            return True
        key = _key(turn)
        return key == _key(call.turn) or (key in self._turns and call.call_id not in self._answered_in.get(key, ()))

    def _match(self, record: Mapping[str, Any], call_id: Any = _UNSET) -> PendingCall | None:
        """The call owed a result that ``record`` (a tool/call, tool/result or approval)
        names by its ``call_id``, or None. When one call is owed a result under the id, the
        record answers it if it names no turn, the call's turn, or a turn open now (a run
        resumed in a new turn answering a call of an earlier one); one naming another,
        closed turn is that turn's late duplicate, not an answer. When several calls are
        owed one (an id reused by a later turn), the record's turn, then the
        ``assistant_seq`` it names, then its step choose among them."""
        if call_id is _UNSET:
            call_id = record.get("call_id")
        calls = self._by_id.get(call_id) if type(call_id) is str else None
        if not calls:
            return None
        if len(calls) == 1:  # the common case: one call owed a result under this id
            call = calls[0]
            if call.turn is None:
                return call
            if call.turn_raw is not None and type(record) is Record:
                raw = record.raw_member("turn")  # type: ignore[attr-defined]
                if raw is None or raw == call.turn_raw:  # the same turn, as written: no decoding
                    return call
            return call if self._answers(call, record.get("turn")) else None
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

    # The same rules on a scanned record's members (``members``: name -> JSON text). A
    # member is decoded only where its text does not decide: the turn a record names is
    # compared as written with the latest turn text seen (one decoding per turn, not per
    # record), a call id is decoded once, the requested calls' ids and names are decoded
    # in one typed call that skips their arguments.

    def _turn_text(self, raw: Any) -> Any:
        """The turn a record's ``turn`` member (JSON text, or None when absent) names:
        the latest turn open when it names none."""
        if raw is not None:
            if raw == self._last_turn_raw:
                return self._last_turn
            turn = _decode(raw)
            if type(turn) is str:  # immutable: the same value serves every record of the turn
                self._last_turn_raw = raw
                self._last_turn = turn
            if turn is not None:
                return turn
        return next(reversed(self._turns.values())) if self._turns else None


def _scanned(type_: str, seq: int, members: dict[str, Any]) -> Record:
    """A scanned record as the mapping rules read it: its members (its line is not read:
    every lookup goes to the members)."""
    return Record(b"", seq, 0.0, type_, members)


def _approval_state(state: Any) -> bool:
    """True for a ``tool/approval`` state the tracker follows (anything unhashable is not one)."""
    try:
        return state in _APPROVAL_STATES
    except TypeError:
        return False


class _Requested(msgspec.Struct, gc=False):
    """An entry of ``assistant/message.tool_calls`` as the tracker reads it (its
    ``arguments`` are skipped, never built)."""

    id: Any = None
    name: Any = None


class _Named(msgspec.Struct, gc=False):
    """An entry of ``tool_calls`` as runtimes write them: a string ``id`` and ``name``."""

    id: str
    name: str


_requests_decoder = msgspec.json.Decoder(list[_Requested])
_named_decoder = msgspec.json.Decoder(list[_Named])


def _requests(raw: msgspec.Raw) -> list[Any]:
    """The calls a ``tool_calls`` member (JSON text) asks for, as :func:`requested_calls`
    reads them: entries with a string ``id``, a ``name`` ("" when not a string)."""
    try:
        return _named_decoder.decode(raw)  # every entry as requested_calls keeps it
    except msgspec.ValidationError:
        pass
    try:
        requests = _requests_decoder.decode(raw)
    except msgspec.ValidationError:  # not a list of objects: the general rule
        return requested_calls(_decode(raw))
    out = []
    for r in requests:
        if type(r.id) is str:
            if type(r.name) is not str:
                r.name = ""
            out.append(r)
    return out


_decode = msgspec.json.Decoder().decode
_decode_str = msgspec.json.Decoder(str).decode
_NO_CALLS = msgspec.Raw(b"[]")
_NULL = msgspec.Raw(b"null")

# What each record type does to the tracker; a type not named here does nothing.
_ON_RECORD = {
    TOOL_CALL: PendingCalls._tool_call,
    TOOL_RESULT: PendingCalls._tool_result,
    ASSISTANT_MESSAGE: PendingCalls._assistant_message,
    STEP_START: PendingCalls._step_start,
    STEP_END: PendingCalls._step_end,
    TURN_START: PendingCalls._turn_start,
    TURN_END: PendingCalls._turn_end,
    TOOL_APPROVAL: PendingCalls._approval,
}


def approval_event(
    call_id: str, state: str, *, turn: Any, step: Any, by: str | None = None, reason: str | None = None
) -> dict[str, Any]:
    """The ``tool/approval`` event recording a human's part in a call: ``state``
    ``requested`` (the runtime paused the call for a human), ``approved`` or ``rejected``
    (a rejected call still needs its ``tool/result``, which the runtime writes); ``by``
    and ``reason`` are optional. Raises ValueError for another state."""
    if state not in _APPROVAL_STATES:
        raise ValueError(f"approval state {state!r}; known: requested, approved, rejected")
    event: dict[str, Any] = {"type": TOOL_APPROVAL, "turn": turn, "step": step, "call_id": call_id, "state": state}
    if by is not None:
        event["by"] = by
    if reason is not None:
        event["reason"] = reason
    return event


def unknown_outcome_text(name: str, call_id: str, call_seq: int) -> str:
    return (
        f"{TOOL_OUTCOME_UNKNOWN}: the call to tool {name!r} (id {call_id}) was durably recorded "
        f"as started (record seq {call_seq}), but no result was recorded before the step was "
        "interrupted. The tool may or may not have run, and any side effects may have happened. "
        "Do not blindly retry an operation with side effects: check the current state first; "
        "retry only read-only or idempotent work."
    )


def not_started_text(name: str, call_id: str) -> str:
    return (
        f"{TOOL_NOT_STARTED}: the call to tool {name!r} (id {call_id}) was requested but never "
        "started (no start record exists, and one is always written before a tool runs), so it "
        "had no effect. It is safe to call it again if it is still needed."
    )


def approval_expired_text(name: str, call_id: str) -> str:
    return (
        f"{TOOL_NOT_STARTED}: the call to tool {name!r} (id {call_id}) needed a human's approval; "
        "approval was requested and never given, so the tool never ran and had no effect. "
        "Ask again if it is still needed."
    )


def rejected_text(name: str, call_id: str) -> str:
    return (
        f"{TOOL_NOT_STARTED}: the call to tool {name!r} (id {call_id}) was rejected by a human "
        "and never ran, so it had no effect. Do not call it again without asking."
    )


def awaiting_approval_text(name: str, call_id: str) -> str:
    return (
        f"{TOOL_AWAITING_APPROVAL}: the call to tool {name!r} (id {call_id}) is waiting for a "
        "human's approval; it has not run."
    )


def synthetic_result(
    call: PendingCall, *, turn: Any = None, step: Any = None, ts: float, ambiguous: bool = False
) -> dict[str, Any]:
    """The synthetic ``tool/result`` for an unanswered call (no ``seq``: the store assigns
    it), in the call's own turn and step (``turn``/``step`` when the call has none).

    ``TOOL_OUTCOME_UNKNOWN`` with ``call_seq`` when a durable ``tool/call`` exists, else
    ``TOOL_NOT_STARTED`` (its text says so when the call's approval was requested and
    never given, or rejected). ``ambiguous``: another call without a result has the same
    id, so the result names its assistant message (``assistant_seq``)."""
    result: dict[str, Any] = {
        "type": TOOL_RESULT,
        "ts": ts,
        "turn": call.turn if call.turn is not None else turn,
        "step": call.step if call.step is not None else step,
        "call_id": call.call_id,
        "name": call.name,
    }
    if call.call_seq is not None:
        result["output"] = unknown_outcome_text(call.name, call.call_id, call.call_seq)
        result["is_error"] = True
        result["code"] = TOOL_OUTCOME_UNKNOWN
        result["call_seq"] = call.call_seq
    else:
        if call.approval == "requested":
            result["output"] = approval_expired_text(call.name, call.call_id)
        elif call.approval == "rejected":
            result["output"] = rejected_text(call.name, call.call_id)
        else:
            result["output"] = not_started_text(call.name, call.call_id)
        result["is_error"] = True
        result["code"] = TOOL_NOT_STARTED
    if ambiguous:
        result["assistant_seq"] = call.assistant_seq
    result["synthetic"] = True
    return result


def awaiting_result(call: PendingCall, *, ts: float) -> dict[str, Any]:
    """The view-only result of a call awaiting approval (code ``TOOL_AWAITING_APPROVAL``).
    Never written: views pair it with the call while a human decides."""
    return {
        "type": TOOL_RESULT, "ts": ts, "turn": call.turn, "step": call.step, "call_id": call.call_id,
        "name": call.name, "output": awaiting_approval_text(call.name, call.call_id), "is_error": True,
        "code": TOOL_AWAITING_APPROVAL, "synthetic": True,
    }


def recovery_results(
    tracker: PendingCalls, *, ts: float | None = None, expire_approvals: bool = False
) -> list[dict[str, Any]]:
    """Synthetic results for every call without one, in log order. A call awaiting
    approval is left alone unless ``expire_approvals``."""
    when = tracker.last_ts if ts is None else ts
    turn = tracker.step_turn if tracker.step_turn is not None else tracker.open_turn
    calls = tracker.unanswered()
    ids = Counter(c.call_id for c in calls)
    return [
        synthetic_result(c, turn=turn, step=tracker.open_step, ts=when, ambiguous=ids[c.call_id] > 1)
        for c in calls
        if expire_approvals or c.approval != "requested"
    ]


def closers(
    tracker: PendingCalls, status: str, *, ts: float | None = None, expire_approvals: bool = False
) -> list[dict[str, Any]]:
    """``step/end`` for every open step (latest first), then ``turn/end`` for every open
    turn (latest first), with ``status``. A step or turn holding a call that awaits
    approval stays open unless ``expire_approvals``."""
    when = tracker.last_ts if ts is None else ts
    held_steps, held_turns = (set(), set()) if expire_approvals else tracker.held()
    out: list[dict[str, Any]] = []
    for turn, step in reversed(tracker.open_steps()):
        if (_key(turn), _key(step)) not in held_steps:
            out.append({"type": STEP_END, "ts": when, "turn": turn, "step": step, "status": status,
                        "synthetic": True})
    for turn in reversed(tracker.open_turns()):
        if _key(turn) not in held_turns:
            out.append({"type": TURN_END, "ts": when, "turn": turn, "status": status, "synthetic": True})
    return out


def crash_plan(tracker: PendingCalls, *, expire_approvals: bool = False) -> list[dict[str, Any]]:
    """What crash repair appends to close everything the log leaves open: a synthetic
    result for every call without one (in log order, wherever the call is: the answers
    go at the end, the views place them with their calls), then ``step/end`` and
    ``turn/end`` with status ``interrupted`` for every step and turn left open. Reuses the
    ``ts`` of the last real record. Empty when nothing is open.

    A call awaiting approval, and the step and turn that hold it, are left alone (the
    session is suspended, not crashed) unless ``expire_approvals``: then it is answered
    ``TOOL_NOT_STARTED`` (approval requested and never given) and closed like the rest."""
    return recovery_results(tracker, expire_approvals=expire_approvals) + closers(
        tracker, "interrupted", expire_approvals=expire_approvals
    )


def truncation_marker(
    *,
    offset: int,
    dropped_bytes: int,
    reason: str,
    quarantine: str | None,
    ts: float,
    dropped_seqs: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The ``log/truncated`` record repair writes where it cut a tail. Opaque: it names
    the quarantine file, never the dropped content."""
    marker: dict[str, Any] = {
        "type": LOG_TRUNCATED,
        "ts": ts,
        "offset": offset,
        "dropped_bytes": dropped_bytes,
        "reason": reason,
        "quarantine": quarantine,
    }
    if dropped_seqs is not None:
        marker["dropped_seqs"] = [dropped_seqs[0], dropped_seqs[1]]
    marker["synthetic"] = True
    return marker


# --- pairing: every requested call with the one result a view shows --------------------
# Projection (provider views) and delivery tracking both pair calls with results through
# the one tracker above: a result answers the call the tracker says it answers, the first
# result wins, and whatever is still unanswered at the end of the records gets a view-time
# result with the code crash repair would write (or, awaiting approval, a view-only one).


@dataclass(slots=True)
class PairedCall:
    """One call an ``assistant/message`` asked for, and the result a view pairs with it.

    ``result`` is the logged ``tool/result`` that answered it (``result_seq`` its seq),
    or, when the log has none, a view-time synthetic result (``result_seq`` None) built
    by :func:`synthetic_result` or :func:`awaiting_result` — the log itself is never
    rewritten."""

    call_id: str
    name: str
    arguments: Any
    result: Mapping[str, Any] | None = None
    result_seq: int | None = None

    @property
    def view_time(self) -> bool:
        """True when the result is not in the log (the view made it up, with its code)."""
        return self.result is not None and self.result_seq is None

    @property
    def awaiting_approval(self) -> bool:
        """True when the view-time result says the call awaits a human's approval."""
        return self.view_time and self.result is not None and self.result.get("code") == TOOL_AWAITING_APPROVAL


@dataclass(slots=True)
class Exchange:
    """One ``assistant/message`` and its calls, in the assistant's order."""

    seq: int
    turn: Any
    step: Any
    content: Any
    calls: list[PairedCall]
    open: bool = True
    """True while its step is still open at the end of the records (repair would close it)."""


@dataclass(slots=True)
class UserEntry:
    """One ``user/message``."""

    seq: int
    turn: Any
    content: Any


@dataclass(slots=True)
class SystemEntry:
    """One ``system/message``: the instructions in force from here on."""

    seq: int
    turn: Any
    content: Any


@dataclass(slots=True)
class Pairing:
    """A session's conversation in log order, every requested call paired with exactly one
    result. ``issues`` names what the pairing left out or made up (orphan and duplicate
    results, duplicate call ids, view-time results), one sentence each."""

    entries: list[UserEntry | SystemEntry | Exchange]
    issues: list[str]
    orphan_seqs: list[int]
    duplicate_seqs: list[int]

    @property
    def exchanges(self) -> list[Exchange]:
        return [e for e in self.entries if isinstance(e, Exchange)]

    @property
    def latest(self) -> Exchange | None:
        """The latest ``assistant/message``, if any."""
        for entry in reversed(self.entries):
            if isinstance(entry, Exchange):
                return entry
        return None


def _envelope(record: Mapping[str, Any], index: int) -> tuple[str, int, float]:
    """A record's type, seq and ts. Raises InvalidEvent for anything without them."""
    if isinstance(record, Record):
        return record.type, record.seq, record.ts
    try:
        return record["type"], record["seq"], record["ts"]
    except (KeyError, TypeError, IndexError) as exc:
        raise InvalidEvent(f"record {index} is not a session record (a mapping with 'type', 'seq' and "
                           f"'ts'): {str(record)[:80]}") from exc


def pair_calls(records: Iterable[Mapping[str, Any]]) -> Pairing:
    """Pair every call of every ``assistant/message`` in ``records`` with one result.

    Pure and total: any sequence of records (committed :class:`Record` objects or dicts
    with ``seq``, ``ts`` and ``type``) gives a pairing; anything else raises InvalidEvent. A result answers the call the
    :class:`PendingCalls` tracker says it answers (wherever that call is: a result written
    at the end of the log by repair pairs with a call of an earlier turn). A result for a
    call already answered is a duplicate, one for no requested call an orphan: both are
    left out and reported. A call repeated within one message is kept once. Calls left
    without a result get a view-time :func:`synthetic_result` (``TOOL_OUTCOME_UNKNOWN``
    when a ``tool/call`` for it exists, else ``TOOL_NOT_STARTED``), or, while a human
    decides on them, :func:`awaiting_result`."""
    tracker = PendingCalls()
    entries: list[UserEntry | SystemEntry | Exchange] = []
    issues: list[str] = []
    orphans: list[int] = []
    duplicates: list[int] = []
    paired: dict[tuple[int, str], PairedCall] = {}  # (assistant seq, call id) -> its pairing
    latest_by_id: dict[str, PairedCall] = {}
    exchanges: dict[int, Exchange] = {}

    if not isinstance(records, Iterable) or isinstance(records, (str, bytes, Mapping)):
        raise InvalidEvent(f"pair_calls takes a sequence of records, not {type(records).__name__}")
    for index, record in enumerate(records):
        type_, seq, _ = _envelope(record, index)
        if type_ == TOOL_RESULT:
            call = tracker.feed(record)
            call_id = record.get("call_id")
            if call is not None:
                pair = paired[(call.assistant_seq, call.call_id)]
                pair.result, pair.result_seq = record, seq
                if call.step is not None and call.step_key not in tracker._steps:
                    issues.append(f"late result seq {seq} for call {call.call_id!r}, logged after its step "
                                  "closed, paired with its call")
                continue
            earlier = latest_by_id.get(call_id) if isinstance(call_id, str) else None
            if earlier is None:
                orphans.append(seq)
                issues.append(f"orphan result seq {seq} (call_id {call_id!r}): no assistant message "
                              "before it asked for that call; left out")
            else:
                duplicates.append(seq)
                issues.append(f"duplicate result seq {seq} for call {call_id!r} "
                              f"(first at seq {earlier.result_seq}) left out")
            continue
        tracker.feed(record)
        if type_ == USER_MESSAGE:
            entries.append(UserEntry(seq, record.get("turn"), record.get("content")))
        elif type_ == SYSTEM_MESSAGE:
            entries.append(SystemEntry(seq, record.get("turn"), record.get("content")))
        elif type_ == ASSISTANT_MESSAGE:
            calls: list[PairedCall] = []
            for req in requested_calls(record.get("tool_calls")):
                if (seq, req.id) in paired:
                    issues.append(f"assistant message seq {seq} asks for call id {req.id!r} twice; "
                                  "the repeat is left out")
                    continue
                pair = PairedCall(req.id, req.name, req.arguments)
                paired[(seq, req.id)] = pair
                latest_by_id[req.id] = pair
                calls.append(pair)
            turn = record.get("turn")
            turn = turn if turn is not None else tracker.open_turn
            exchange = Exchange(seq, turn, record.get("step"), record.get("content"), calls)
            exchanges[seq] = exchange
            entries.append(exchange)
    # What is still unanswered gets its view-time result.
    ambiguous = Counter(c.call_id for c in tracker.unanswered())
    for call in tracker.unanswered():
        pair = paired[(call.assistant_seq, call.call_id)]
        step_open = call.step_key in tracker._steps
        if call.approval == "requested":
            pair.result = awaiting_result(call, ts=tracker.last_ts)
            issues.append(f"call {call.call_id!r} (assistant message seq {call.assistant_seq}) awaits "
                          f"approval; the view shows a {TOOL_AWAITING_APPROVAL} result (never written)")
            continue
        pair.result = synthetic_result(call, ts=tracker.last_ts, ambiguous=ambiguous[call.call_id] > 1)
        where = "the log ends with its step open" if step_open else "its step was closed without it"
        issues.append(
            f"call {call.call_id!r} (assistant message seq {call.assistant_seq}) has no result: "
            f"{where}; the view shows a {pair.result['code']} result (the log is not rewritten)"
        )
    for exchange in exchanges.values():
        exchange.open = (_key(exchange.turn), _key(exchange.step)) in tracker._steps
    return Pairing(entries, issues, orphans, duplicates)
