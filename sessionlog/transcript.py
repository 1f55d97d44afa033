"""Pending-call tracking and transcript repair: pure functions over events, no I/O.

One :class:`PendingCalls` tracker, fed records in order, knows what is open: the turn,
the step, and for the open step the assistant's calls in order, which have a durable
``tool/call`` and which have a result. Crash repair (:func:`crash_plan`) and live step
recovery (:func:`recovery_results`) both build their synthetic results from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .events import (
    ASSISTANT_MESSAGE,
    LOG_TRUNCATED,
    STEP_END,
    STEP_START,
    TOOL_CALL,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_RESULT,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Record,
    requested_calls,
)

_TRACKED = frozenset(
    {TURN_START, TURN_END, STEP_START, STEP_END, ASSISTANT_MESSAGE, TOOL_CALL, TOOL_RESULT}
)


@dataclass(slots=True)
class PendingCall:
    """A call the open step's assistant message asked for."""

    call_id: str
    name: str
    call_seq: int | None = None  # seq of its durable tool/call, if any
    answered: bool = False


@dataclass(slots=True)
class PendingCalls:
    """Incremental tracker of what a session leaves open. Feed it every record in order."""

    open_turn: str | None = None
    open_step: int | None = None
    step_turn: str | None = None
    calls: list[PendingCall] = field(default_factory=list)
    last_seq: int = 0
    last_ts: float = 0.0
    _by_id: dict[str, PendingCall] = field(default_factory=dict)

    def feed(self, record: Mapping[str, Any]) -> None:
        """Account for one committed record (a :class:`~sessionlog.events.Record` or a dict).

        Only the members the transcript needs are decoded (a Record decodes a member on
        lookup): a tool result's output is never materialized."""
        if type(record) is Record:
            type_, seq, ts = record.type, record.seq, record.ts  # type: ignore[attr-defined]
        else:
            type_, seq, ts = record["type"], record["seq"], record["ts"]
        self.last_seq = seq
        self.last_ts = ts
        if type_ == TOOL_RESULT:
            if not self._by_id:
                return  # no open call to answer: leave the record undecoded
            call_id = record.get("call_id")
            call = self._by_id.get(call_id) if isinstance(call_id, str) else None
            if call is not None:
                call.answered = True
        elif type_ == TOOL_CALL:
            if not self._by_id:
                return
            call_id = record.get("call_id")
            call = self._by_id.get(call_id) if isinstance(call_id, str) else None
            if call is not None and call.call_seq is None:
                call.call_seq = seq
        elif type_ not in _TRACKED:
            return
        elif type_ in (TURN_START, TURN_END):
            self.open_turn = record.get("turn") if type_ == TURN_START else None
            self.open_step = None
            self._reset_calls()
        elif type_ == ASSISTANT_MESSAGE:
            turn = record.get("turn")
            self.step_turn = turn if turn is not None else self.open_turn
            step = record.get("step")
            if self.open_step is None and isinstance(step, int):
                self.open_step = step
            self._reset_calls()
            for req in requested_calls(record.get("tool_calls")):
                if req.id not in self._by_id:
                    call = PendingCall(req.id, req.name)
                    self.calls.append(call)
                    self._by_id[req.id] = call
        elif type_ == STEP_START:
            self.open_step = record.get("step")
            turn = record.get("turn")
            self.step_turn = turn if turn is not None else self.open_turn
            self._reset_calls()
        elif type_ == STEP_END:
            self.open_step = None
            self._reset_calls()

    def feed_all(self, records: Iterable[Mapping[str, Any]]) -> PendingCalls:
        for record in records:
            self.feed(record)
        return self

    def _reset_calls(self) -> None:
        # Calls of a closed step are history: repair leaves them as they are.
        if self.calls:
            self.calls = []
            self._by_id = {}

    def unanswered(self) -> list[PendingCall]:
        """The open step's calls without a result, in the assistant's order."""
        return [c for c in self.calls if not c.answered]

    @property
    def is_open(self) -> bool:
        return self.open_turn is not None or self.open_step is not None or any(
            not c.answered for c in self.calls
        )


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


def synthetic_result(call: PendingCall, *, turn: Any, step: Any, ts: float) -> dict[str, Any]:
    """The synthetic ``tool/result`` for an unanswered call (no ``seq``: the store assigns it)."""
    result: dict[str, Any] = {
        "type": TOOL_RESULT,
        "ts": ts,
        "turn": turn,
        "step": step,
        "call_id": call.call_id,
        "name": call.name,
    }
    if call.call_seq is not None:
        result["output"] = unknown_outcome_text(call.name, call.call_id, call.call_seq)
        result["is_error"] = True
        result["code"] = TOOL_OUTCOME_UNKNOWN
        result["call_seq"] = call.call_seq
    else:
        result["output"] = not_started_text(call.name, call.call_id)
        result["is_error"] = True
        result["code"] = TOOL_NOT_STARTED
    result["synthetic"] = True
    return result


def recovery_results(tracker: PendingCalls, *, ts: float | None = None) -> list[dict[str, Any]]:
    """Synthetic results for the open step's unanswered calls, in the assistant's order."""
    when = tracker.last_ts if ts is None else ts
    turn = tracker.step_turn if tracker.step_turn is not None else tracker.open_turn
    return [
        synthetic_result(c, turn=turn, step=tracker.open_step, ts=when) for c in tracker.unanswered()
    ]


def closers(tracker: PendingCalls, status: str, *, ts: float | None = None) -> list[dict[str, Any]]:
    """``step/end`` and ``turn/end`` with ``status`` for whatever the tracker has open."""
    when = tracker.last_ts if ts is None else ts
    out: list[dict[str, Any]] = []
    if tracker.open_step is not None:
        turn = tracker.step_turn if tracker.step_turn is not None else tracker.open_turn
        out.append(
            {"type": STEP_END, "ts": when, "turn": turn, "step": tracker.open_step,
             "status": status, "synthetic": True}
        )
    if tracker.open_turn is not None:
        out.append({"type": TURN_END, "ts": when, "turn": tracker.open_turn, "status": status,
                    "synthetic": True})
    return out


def crash_plan(tracker: PendingCalls) -> list[dict[str, Any]]:
    """What crash repair appends to close the open tail: a synthetic result for every
    unanswered call (in call order), then ``step/end`` and ``turn/end`` with status
    ``interrupted``. Reuses the ``ts`` of the last real record. Empty when nothing is open."""
    return recovery_results(tracker) + closers(tracker, "interrupted")


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
# the one tracker above: a result answers a call of the open step when the tracker knows
# the call; the first result wins; whatever a step leaves unanswered when the tracker
# resets it gets a view-time result with the same code crash repair would write.

_RESETS = frozenset({TURN_START, TURN_END, STEP_START, STEP_END, ASSISTANT_MESSAGE})


@dataclass(slots=True)
class PairedCall:
    """One call an ``assistant/message`` asked for, and the result a view pairs with it.

    ``result`` is the first logged ``tool/result`` for the call (``result_seq`` its seq),
    or, when the log has none, a view-time synthetic result (``result_seq`` None) built
    by :func:`synthetic_result` — the log itself is never rewritten."""

    call_id: str
    name: str
    arguments: Any
    result: Mapping[str, Any] | None = None
    result_seq: int | None = None

    @property
    def view_time(self) -> bool:
        """True when the result is not in the log (the view made it up, with its code)."""
        return self.result is not None and self.result_seq is None


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
class Pairing:
    """A session's conversation in log order, every requested call paired with exactly one
    result. ``issues`` names what the pairing left out or made up (orphan and duplicate
    results, duplicate call ids, view-time results), one sentence each."""

    entries: list[UserEntry | Exchange]
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


def _envelope(record: Mapping[str, Any]) -> tuple[str, int, float]:
    if isinstance(record, Record):
        return record.type, record.seq, record.ts
    return record["type"], record["seq"], record["ts"]


def pair_calls(records: Iterable[Mapping[str, Any]]) -> Pairing:
    """Pair every call of every ``assistant/message`` in ``records`` with one result.

    Pure and total: any sequence of records (committed :class:`Record` objects or dicts
    with ``seq``, ``ts`` and ``type``) gives a pairing. A result matches the open step's
    call with its id (the tracker's rule); a result logged after its step closed matches
    the latest call with that id and replaces that call's view-time result. The first
    result of a call is used; later ones are duplicates, results for no requested call are
    orphans: both are left out and reported. A call repeated within one message is kept
    once. Calls left without a result get a view-time :func:`synthetic_result`
    (``TOOL_OUTCOME_UNKNOWN`` when a ``tool/call`` for it exists in its step, else
    ``TOOL_NOT_STARTED``)."""
    tracker = PendingCalls()
    entries: list[UserEntry | Exchange] = []
    issues: list[str] = []
    orphans: list[int] = []
    duplicates: list[int] = []
    open_ex: Exchange | None = None
    open_by_id: dict[str, PairedCall] = {}
    latest_by_id: dict[str, PairedCall] = {}

    def settle(closing: bool) -> None:
        # Give the open step's unanswered calls their view-time results.
        assert open_ex is not None
        for call in tracker.unanswered():
            paired = open_by_id[call.call_id]
            paired.result = synthetic_result(
                call, turn=open_ex.turn, step=open_ex.step, ts=tracker.last_ts
            )
            where = "its step was closed without it" if closing else "the log ends with its step open"
            issues.append(
                f"call {call.call_id!r} (assistant message seq {open_ex.seq}) has no result: "
                f"{where}; the view shows a {paired.result['code']} result (the log is not rewritten)"
            )
        open_ex.open = not closing

    for record in records:
        type_, seq, _ = _envelope(record)
        if open_ex is not None and type_ in _RESETS:
            settle(closing=True)
            open_ex, open_by_id = None, {}
        if type_ == TOOL_RESULT:
            call_id = record.get("call_id")
            pending = tracker._by_id.get(call_id) if isinstance(call_id, str) else None
            if pending is not None:
                if pending.answered:
                    duplicates.append(seq)
                    first = open_by_id[call_id].result_seq
                    issues.append(f"duplicate result seq {seq} for call {call_id!r} (first at seq {first}) left out")
                else:
                    paired = open_by_id[call_id]
                    paired.result, paired.result_seq = record, seq
            else:
                paired = latest_by_id.get(call_id) if isinstance(call_id, str) else None
                if paired is None:
                    orphans.append(seq)
                    issues.append(f"orphan result seq {seq} (call_id {call_id!r}): no assistant message "
                                  "before it asked for that call; left out")
                elif paired.view_time:
                    issues.append(f"late result seq {seq} for call {call_id!r}, logged after its step closed, "
                                  "used instead of the view-time result")
                    paired.result, paired.result_seq = record, seq
                else:
                    duplicates.append(seq)
                    issues.append(f"duplicate result seq {seq} for call {call_id!r} "
                                  f"(first at seq {paired.result_seq}) left out")
        tracker.feed(record)
        if type_ == USER_MESSAGE:
            entries.append(UserEntry(seq, record.get("turn"), record.get("content")))
        elif type_ == ASSISTANT_MESSAGE:
            calls: list[PairedCall] = []
            for req in requested_calls(record.get("tool_calls")):
                if req.id in open_by_id:
                    issues.append(f"assistant message seq {seq} asks for call id {req.id!r} twice; "
                                  "the repeat is left out")
                    continue
                paired = PairedCall(req.id, req.name, req.arguments)
                open_by_id[req.id] = paired
                latest_by_id[req.id] = paired
                calls.append(paired)
            turn = record.get("turn")
            turn = turn if turn is not None else tracker.open_turn
            open_ex = Exchange(seq, turn, record.get("step"), record.get("content"), calls)
            entries.append(open_ex)
    if open_ex is not None:
        settle(closing=False)
    return Pairing(entries, issues, orphans, duplicates)
