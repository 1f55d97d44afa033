"""Live step recovery: a failed step leaves a transcript every provider accepts.

A runtime runs each step inside a :class:`StepScope` and appends the step's events
through it. When the step fails after its ``assistant/message`` was committed, the
scope appends — before anything else, in as few batches as the batch limit allows —

1. a synthetic ``tool/result`` for every call of that message without one, in the
   assistant's call order: ``TOOL_OUTCOME_UNKNOWN`` when a durable ``tool/call`` exists,
   else ``TOOL_NOT_STARTED`` (the same results crash repair writes, from the same
   tracker: :func:`sessionlog.transcript.recovery_results`); a committed result is never
   replaced;
2. ``step/end`` and ``turn/end`` with status ``error`` — ``aborted`` when the failure is
   a cancellation (``asyncio.CancelledError``, ``KeyboardInterrupt``, ``SystemExit``);

and then re-raises the original exception. It never runs a tool and never records
success. If recording fails, the original exception still propagates, with a note
(``add_note``) naming the recording failure, which is also its ``__context__`` when that
was empty; the log is then left for crash repair (``store.repair``), which closes the
same calls with the same codes and status ``interrupted``.

The scope knows what is open from the events appended through it (a step-local
:class:`~sessionlog.transcript.PendingCalls`, fed committed events only; it does not
copy or re-read the session). Its recovery append names the last seq it knows
(``expect_seq``); if something else appended meanwhile, it reads those records from the
handle (``handle.records(after_seq)``, when the handle has it) and plans again, so a
result committed behind its back is never answered twice.

Sync and asyncio: ``with StepScope(...)`` / ``scope.append(events)``, or
``async with StepScope(...)`` / ``await scope.append_async(events)``. In async use, an
``append`` that is a coroutine function is awaited; a plain (blocking, fsyncing) append
runs in a worker thread through :func:`asyncio.to_thread`. Async appends are serialized
and run to completion even when the awaiting task is cancelled, so the scope's view of
the log is never behind what was committed. :func:`dispatch_tools` runs an assistant
message's calls in parallel under the scope with the quiescence rule (docs/runtime.md):
after a failure it starts no new call and waits for the started ones before recovery
runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .contract import AppendFailed, InvalidEvent, SequenceConflict, SessionLogError, events_list, plan_batches
from .delivery import LLM_REQUEST, LLM_RESPONSE
from .events import (
    TOOL_CALL,
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    TOOL_RESULT,
    TURN_END,
    Record,
    ToolCallRequest,
    requested_calls,
)
from .transcript import (
    PendingCalls,
    approval_event,
    closers,
    recovery_results,
    rejected_text,
    synthetic_result,
    unknown_outcome_text,
)

_T = TypeVar("_T")


class Appender(Protocol):
    """What a step scope needs from a session handle (``store.session(id)``, or any
    object with this ``append``; it may be a coroutine function in async use)."""

    def append(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> Any: ...


def failure_status(exc: BaseException) -> str:
    """The end status a step failing with ``exc`` is recorded with: ``aborted`` for a
    cancellation or interrupt, ``error`` for anything else."""
    if isinstance(exc, (asyncio.CancelledError, concurrent.futures.CancelledError, KeyboardInterrupt, SystemExit)):
        return "aborted"
    return "error"


def _attach(original: BaseException, failure: BaseException) -> None:
    original.add_note(
        f"sessionlog: live step recovery could not record the missing tool results and "
        f"step/turn closers ({type(failure).__name__}: {failure}); the session needs crash "
        "repair (store.repair) before it is used again"
    )
    if failure.__context__ is original:
        failure.__context__ = None
    if original.__context__ is None and failure is not original:
        original.__context__ = failure


_CATCH_UPS = 8
"""Tries of a conditional append whose session another writer keeps moving."""


class StepScope:
    """Scope of one step (or several steps of one turn): on failure, pair every call the
    committed ``assistant/message`` asked for, close the step and the turn, re-raise.

    ``turn`` is the open turn (its ``turn/start`` committed before the scope, or appended
    through it); ``step``, when given, says that step's ``step/start`` is already
    committed. ``tracker`` replaces both: a tracker the runtime has fed with the session
    so far. ``close_turn=False`` ends only the step on failure (a runtime that retries
    within the turn). ``recovered`` holds the events recovery appended.

    On normal exit nothing is written: ending the step is the runtime's own event."""

    def __init__(
        self,
        handle: Appender,
        *,
        turn: str | None = None,
        step: int | None = None,
        tracker: PendingCalls | None = None,
        close_turn: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.handle = handle
        if tracker is None:
            tracker = PendingCalls(open_turn=turn, open_step=step, step_turn=turn if step is not None else None)
        self.tracker = tracker
        self.close_turn = close_turn
        self.clock = clock
        self.recovered: list[dict[str, Any]] = []
        self.last_seq: int | None = None
        try:
            last = getattr(handle, "last_seq", None)
        except Exception:  # a closed handle may refuse; the scope then learns it from appends
            last = None
        if isinstance(last, int):
            self.last_seq = last
        self._thread_lock = threading.Lock()
        self._running: set[str] = set()  # call ids a tool-call scope of this scope has taken, not yet answered
        self._async_lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    # -- appending through the scope --------------------------------------------------

    def _committed(self, batch: list[Mapping[str, Any]], last: int) -> None:
        """Feed a committed batch (last seq ``last``) to the tracker."""
        first = last - len(batch) + 1
        now = self.clock()
        for i, event in enumerate(batch):
            ts = event.get("ts")
            self.tracker.feed({**event, "seq": first + i, "ts": ts if isinstance(ts, (int, float)) else now})
        self.last_seq = last

    def _append_now(self, batch: list[Mapping[str, Any]], expect_seq: int | None) -> int:
        with self._thread_lock:
            last = self.handle.append(batch, expect_seq=expect_seq)
            if inspect.isawaitable(last):
                raise TypeError("this handle's append is async: use append_async / async with")
            self._committed(batch, last)
            return last

    def append(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> int:
        """Append ``events`` through the handle (one batch); returns the last seq. The
        scope accounts for them once the handle acknowledged them. Raises what the
        handle's ``append`` raises."""
        return self._append_now(events_list(events), expect_seq)

    async def _append_task(self, batch: list[Mapping[str, Any]], expect_seq: int | None,
                           still: Callable[[], bool] | None = None) -> int | None:
        loop = asyncio.get_running_loop()
        if self._async_lock is None or self._lock_loop is not loop:
            # One lock per event loop: a sync runtime may run each dispatch in asyncio.run().
            self._async_lock, self._lock_loop = asyncio.Lock(), loop
        async with self._async_lock:
            if still is None:
                return await self._append_once(batch, expect_seq)
            # Written only if ``still()`` holds on the log as it is then: the tail this scope
            # knows is the one the batch must follow, and when another writer of the session
            # (another scope of the same writer, the runtime itself) wrote since, the scope
            # reads what it wrote and judges again.
            for _ in range(_CATCH_UPS):
                if not still():
                    return None  # what the batch is for was done meanwhile: nothing written
                expect = self.last_seq if getattr(self.handle, "records", None) is not None else None
                try:
                    return await self._append_once(batch, expect)
                except SequenceConflict:
                    if expect is None or not await asyncio.to_thread(self._catch_up):
                        raise
            raise SequenceConflict("the session kept moving while the scope tried to append",
                                   expected=self.last_seq or 0, found=-1)

    async def _append_once(self, batch: list[Mapping[str, Any]], expect_seq: int | None) -> int:
        if inspect.iscoroutinefunction(self.handle.append):
            last = await self.handle.append(batch, expect_seq=expect_seq)
            with self._thread_lock:
                self._committed(batch, last)
            return last
        return await asyncio.to_thread(self._append_now, batch, expect_seq)

    async def append_async(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> int:
        """Async :meth:`append`. Runs to completion even if the caller is cancelled
        meanwhile (the cancellation is re-raised after), so the scope never misses a
        committed event."""
        last = await _to_completion(self._append_task(events_list(events), expect_seq))
        assert last is not None
        return last

    def _may_start(self, call_id: str) -> bool:
        """The call is owed an answer, has no durable ``tool/call`` and awaits no human."""
        found = self.tracker.pending(call_id)
        return found is not None and found.call_seq is None and found.approval != "requested"

    async def _start(self, call_id: str, events: list[Mapping[str, Any]]) -> int | None:
        """Append ``events`` (``call_id``'s intent or approval request) only if the call
        may still start when their turn to be written comes (see :meth:`_answer`)."""
        return await _to_completion(self._append_task(events, None, lambda: self._may_start(call_id)))

    async def _answer(self, call_id: str, events: list[Mapping[str, Any]]) -> int | None:
        """Append ``events`` (``call_id``'s answer) only if the call is still owed one
        when their turn to be written comes, all appends of this scope being written one
        at a time: a result appended for a call that step recovery (or another task)
        answered while this one waited would be its second. Returns the last seq, or
        None when nothing was written."""
        return await _to_completion(self._append_task(events, None, lambda: self.tracker.pending(call_id) is not None))

    # -- recovery ---------------------------------------------------------------------

    def plan(self, status: str) -> list[dict[str, Any]]:
        """What recovery would append now for a failure with end ``status``."""
        now = self.clock()
        plan = recovery_results(self.tracker, ts=now) + closers(self.tracker, status, ts=now)
        if not self.close_turn:
            plan = [e for e in plan if e["type"] != TURN_END]
        return plan

    def batches(self, plan: list[dict[str, Any]]) -> list[list[Mapping[str, Any]]]:
        """``plan`` in appends that each fit the handle's batch limit, in order: after a
        crash between two, crash repair finishes what the later ones would have written."""
        limits = getattr(getattr(self.handle, "store", None), "limits", None)
        batch_limit = getattr(limits, "batch_limit", 1 << 20)
        record_limit = getattr(limits, "record_limit", 1 << 20)
        first = self.last_seq + 1 if self.last_seq is not None else 1 << 62  # unknown: the longest seqs
        return plan_batches(plan, first, batch_limit=batch_limit, record_limit=record_limit)

    def _catch_up(self) -> bool:
        records = getattr(self.handle, "records", None)
        if records is None or self.last_seq is None:
            return False
        for record in records(after_seq=self.last_seq):
            self.tracker.feed(record)
            self.last_seq = record.seq if isinstance(record, Record) else record["seq"]
        return True

    def recover(self, exc: BaseException) -> None:
        """Record the failure ``exc`` (sync). Never raises: a recording failure is
        attached to ``exc`` instead."""
        try:
            for _ in range(3):
                plan = self.plan(failure_status(exc))
                if not plan:
                    return
                try:
                    for batch in self.batches(plan):
                        self._append_now(batch, self.last_seq)
                        self.recovered.extend(batch)
                except SequenceConflict:
                    if not self._catch_up():
                        raise
                    continue
                return
            raise SequenceConflict("the session kept moving while recovery tried to append",
                                   expected=self.last_seq or 0, found=-1)
        except BaseException as failure:  # noqa: BLE001 - attached to the original, never masks it
            _attach(exc, failure)

    async def recover_async(self, exc: BaseException) -> None:
        """Async :meth:`recover`. Completes even if the task is cancelled meanwhile; such a
        cancellation is noted on ``exc``, which is what propagates."""

        async def run() -> None:
            for _ in range(3):
                plan = self.plan(failure_status(exc))
                if not plan:
                    return
                try:
                    for batch in self.batches(plan):
                        await self._append_task(batch, self.last_seq)
                        self.recovered.extend(batch)
                except SequenceConflict:
                    if not await asyncio.to_thread(self._catch_up):
                        raise
                    continue
                return
            raise SequenceConflict("the session kept moving while recovery tried to append",
                                   expected=self.last_seq or 0, found=-1)

        task = asyncio.ensure_future(run())
        cancelled = await _settle(task)
        failure = None if task.cancelled() else task.exception()
        if task.cancelled():
            failure = asyncio.CancelledError("recovery task cancelled")
        if failure is not None and failure is not exc:
            _attach(exc, failure)
        if cancelled is not None and cancelled is not exc:
            # The original failure is what propagates (context managers never mask it).
            exc.add_note("sessionlog: the task was cancelled again while live step recovery "
                         "was recording; recovery completed and the original failure propagates")

    # -- checkpoints ------------------------------------------------------------------

    def position(self, what: str) -> tuple[Any, int]:
        """The open step's ``(turn, step)``; raises :class:`OutsideStep` when the scope
        knows no open step (``what`` names what was asked for)."""
        tracker = self.tracker
        turn = tracker.step_turn if tracker.step_turn is not None else tracker.open_turn
        if turn is None or tracker.open_step is None:
            raise OutsideStep(
                f"{what} outside a step: the scope knows no open step (turn {turn!r}, step "
                f"{tracker.open_step!r}); append step/start through the scope or pass turn= and step="
            )
        return turn, tracker.open_step

    def result_event(self, call: ToolCallRequest, outcome: ToolOutcome) -> dict[str, Any]:
        """The ``tool/result`` record of ``call`` in the open step."""
        turn, step = self.position("a tool result")
        event: dict[str, Any] = {"type": TOOL_RESULT, "turn": turn, "step": step, "call_id": call.id,
                                 "name": call.name, "output": outcome.output, "is_error": outcome.is_error}
        if outcome.code is not None:
            event["code"] = outcome.code
        return event

    def check_pending(self, call: ToolCallRequest) -> None:
        """Raise :class:`CallNotPending` unless ``call`` may run now: one the assistant
        asked for, with no result, not awaiting approval, and not started: no tool-call
        scope of this scope has taken it, and no ``tool/call`` of it is durable (a body
        that may have run, before a crash, a cancellation or a failure, is never run
        again: repair or step recovery answers it ``TOOL_OUTCOME_UNKNOWN``). A body run
        twice would repeat its side effect and give the call two results."""
        found = self.tracker.pending(call.id)
        if found is None:
            raise CallNotPending(
                f"call {call.id!r} ({call.name}) is not owed a result: it already has one, or no "
                "assistant/message the scope knows of asked for it (append the assistant's message "
                "through the scope, or give the scope a tracker fed with the session); not run"
            )
        if call.id in self._running:
            raise CallNotPending(f"call {call.id!r} ({call.name}) is being run in this step already; not run again")
        if found.call_seq is not None:
            raise CallNotPending(
                f"call {call.id!r} ({call.name}) has started: its tool/call is durable (seq {found.call_seq}) "
                "and it has no result, so its body may have run; it is never run again (the step's recovery "
                "or a repair of the session answers it TOOL_OUTCOME_UNKNOWN); not run"
            )
        if found.approval == "requested":
            raise CallNotPending(
                f"call {call.id!r} ({call.name}) awaits a human's approval (tool/approval 'requested' "
                f"at seq {found.approval_seq}): approve it first; not run"
            )

    async def answer_unknown(self, call_id: str) -> int | None:
        """Answer the started call ``call_id`` (its ``tool/call`` durable, no result yet)
        ``TOOL_OUTCOME_UNKNOWN``, as recovery would: its body was interrupted or failed
        and may have had effects. Returns the result's seq, or None when the call has a
        result already or has not started."""
        found = self.tracker.pending(call_id)
        if found is None or found.call_seq is None:
            return None
        same = sum(1 for c in self.tracker.unanswered() if c.call_id == call_id)
        turn, step = found.turn, found.step
        result = synthetic_result(found, turn=turn, step=step, ts=self.clock(), ambiguous=same > 1)
        return await self._answer(call_id, [result])

    def tool_call(self, call: ToolCallRequest | Mapping[str, Any], *, errors: str = "result") -> ToolCall:
        """A :class:`ToolCall` scope for one of the assistant's calls (``{"id","name",
        "arguments"}`` or a ToolCallRequest): ``async with step.tool_call(call) as tc``."""
        return ToolCall(self, call, errors=errors)

    async def run_tool(self, call: ToolCallRequest | Mapping[str, Any], tool: ToolFn, *,
                       errors: str = "result") -> ToolOutcome:
        """Run ``tool`` for ``call`` in a :class:`ToolCall` scope (durable ``tool/call``,
        body, durable ``tool/result``) and return what was recorded. A tool that raises is
        an error result (``TOOL_ERROR``), unless ``errors="raise"``; an output the store
        cannot hold (over the record limit) is an error result naming its size
        (``TOOL_OUTPUT_NOT_RECORDED``). Raises :class:`CallNotPending` when the call was
        answered while the body ran (its result is then not written)."""
        async with self.tool_call(call, errors=errors) as tc:
            value = tool(tc.call.arguments)
            if inspect.isawaitable(value):
                value = await value
            tc.result(value)  # type: ignore[arg-type]
        if tc.outcome is None:  # answered while the body ran: its result was not written
            raise CallNotPending(
                f"call {tc.call.id!r} ({tc.call.name}) was answered while its body ran (by the step's recovery, "
                "or another task): its result was not written, the log keeps the first answer"
            )
        return tc.outcome

    # -- approvals ----------------------------------------------------------------------

    async def request_approval(self, call: ToolCallRequest | Mapping[str, Any], *, by: str | None = None,
                               reason: str | None = None) -> int:
        """Pause ``call`` for a human's decision: appends ``tool/approval`` with state
        ``requested`` (durable on return; returns its seq). Do not run the call until it
        is approved. Until then live step recovery and crash repair never answer it and
        leave its step and turn open (the session scans ``suspended``); the runtime may
        stop here and resume later (:meth:`WriteBehind.step` with ``resume=True``).
        Raises OutsideStep outside a step, and CallNotPending (nothing written) for a
        call that may not run now (:meth:`check_pending`): approval comes before a call
        starts."""
        turn, step = self.position("an approval request")
        found = _as_call(call)
        self.check_pending(found)  # asked for, no result, not started, not awaiting already
        self._running.add(found.id)  # no tool-call scope may start it while the request is written
        try:
            seq = await self._start(
                found.id, [approval_event(found.id, "requested", turn=turn, step=step, by=by, reason=reason)])
        finally:
            self._running.discard(found.id)
        if seq is None:
            raise CallNotPending(f"call {found.id!r} ({found.name}) was answered, started or paused for approval "
                                 "before its approval request was written; nothing written")
        return seq

    def awaiting_approval(self) -> list[str]:
        """The call ids whose latest ``tool/approval`` is ``requested``, in log order."""
        return [c.call_id for c in self.tracker.awaiting()]

    def _awaiting(self, call_id: str) -> Any:
        for call in self.tracker.awaiting():
            if call.call_id == call_id:
                return call
        raise NotAwaitingApproval(
            f"call {call_id!r} is not awaiting approval (no tool/approval 'requested' is its latest "
            "state in the scope's view of the session)"
        )

    async def approve(self, call_id: str, *, by: str | None = None, reason: str | None = None) -> int:
        """Record that a human approved the awaiting call ``call_id`` (``tool/approval``
        ``approved``; durable on return). Then run it as usual (:meth:`run_tool` /
        :meth:`tool_call`: ``tool/call`` first). Raises NotAwaitingApproval."""
        call = self._awaiting(call_id)
        return await self._resolve(call_id, [approval_event(call_id, "approved", turn=call.turn, step=call.step, by=by,
                                                            reason=reason)])

    async def reject(self, call_id: str, *, by: str | None = None, reason: str | None = None) -> int:
        """Record that a human rejected the awaiting call ``call_id``: ``tool/approval``
        ``rejected`` and the call's ``tool/result`` (an error the model reads: the call was
        rejected and did not run, code ``TOOL_NOT_STARTED``; ``TOOL_OUTCOME_UNKNOWN`` with
        ``call_seq`` when a ``tool/call`` of it is durable all the same), in one durable
        batch. Raises NotAwaitingApproval."""
        call = self._awaiting(call_id)
        if call.call_seq is None:
            text, code = rejected_text(call.name, call_id), TOOL_NOT_STARTED
        else:  # its tool/call is durable (written around the scope): it may have run
            text = (unknown_outcome_text(call.name, call_id, call.call_seq)
                    + " A human then rejected the call.")
            code = TOOL_OUTCOME_UNKNOWN
        if reason:
            text += f" Reason given: {reason}"
        result = {"type": TOOL_RESULT, "turn": call.turn, "step": call.step, "call_id": call_id,
                  "name": call.name, "output": text, "is_error": True, "code": code}
        if code == TOOL_OUTCOME_UNKNOWN:
            result["call_seq"] = call.call_seq
        return await self._resolve(call_id, [approval_event(call_id, "rejected", turn=call.turn, step=call.step, by=by,
                                                            reason=reason), result])

    async def _resolve(self, call_id: str, events: list[Mapping[str, Any]]) -> int:
        """Append a human's decision on ``call_id`` if it still awaits one when its turn to
        be written comes (two decisions racing: the second raises NotAwaitingApproval)."""
        def awaiting() -> bool:
            return any(c.call_id == call_id for c in self.tracker.awaiting())

        last = await _to_completion(self._append_task(events, None, awaiting))
        if last is None:
            self._awaiting(call_id)  # raises NotAwaitingApproval
        assert last is not None
        return last

    def model_request(self, request: str, results: Sequence[str] = ()) -> ModelRequest:
        """A :class:`ModelRequest` checkpoint: ``async with step.model_request("r1", results=ids)``."""
        return ModelRequest(self, request, results)

    def __enter__(self) -> StepScope:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is not None:
            self.recover(exc)
        return False

    async def __aenter__(self) -> StepScope:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is not None:
            await self.recover_async(exc)
        return False


async def _settle(task: asyncio.Future[Any]) -> asyncio.CancelledError | None:
    """Wait until ``task`` is done, whatever happens to the caller; return the caller's
    cancellation if one arrived meanwhile (the task is never cancelled by it)."""
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            if not task.done():
                cancelled = exc
        except BaseException:
            pass  # the task failed: its exception is read by the caller
    return cancelled


async def _to_completion(coro: Awaitable[_T]) -> _T:
    """Await ``coro`` as a task that a cancellation of the caller does not interrupt;
    once it is done, re-raise the caller's cancellation (if any), else its outcome."""
    task = asyncio.ensure_future(coro)
    cancelled = await _settle(task)
    if cancelled is not None:
        raise cancelled from (None if task.cancelled() else task.exception())
    return task.result()


# --- checkpoints: tool calls and model requests ----------------------------------------


TOOL_ERROR = "TOOL_ERROR"
"""``code`` of the result a tool-call scope records when the tool body raised: the model
reads the exception text as the tool's output, and the step goes on."""

TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
"""``code`` of the local error result :func:`dispatch_tools` records for a call naming a
tool it does not have (not synthetic: the runtime answered it; the model should know)."""

TOOL_OUTPUT_NOT_RECORDED = "TOOL_OUTPUT_NOT_RECORDED"
"""``code`` of the error result a tool-call scope records when the body returned but the
store refused its result as it was (an output over the record limit, text that is not
valid Unicode): the body ran to its end, so the call is answered with what is known (its
output's size and the store's reason), never left to recovery as "maybe ran"."""


class NotAwaitingApproval(SessionLogError):
    """An approval was resolved for a call that is not awaiting one."""


class CallNotPending(SessionLogError):
    """A tool call was to be run (or paused for approval) that may not run now: it
    already has a result, the assistant never asked for it (in the scope's view of the
    session), it awaits a human's approval, or it has started (a tool-call scope of it is
    open, or its ``tool/call`` is durable: its body may have run). Nothing was written
    and the body did not run."""


class OutsideStep(SessionLogError):
    """A step-scoped record (a tool call, an approval) was asked for while the scope knows
    no open step: it would be written with no ``turn`` or ``step``."""


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool returns: the ``output`` text the model reads, whether it is an error,
    and an optional machine-readable ``code`` (e.g. ``TOOL_ERROR``).

    The tool function contract (what :meth:`StepScope.run_tool` and
    :func:`dispatch_tools` call): ``tool(arguments)`` takes the call's ``arguments`` (the
    JSON object the model sent) and returns, or is a coroutine returning, either a
    ``str`` (a successful output) or a :class:`ToolOutcome`. Raising an ``Exception``
    means the tool failed: its text becomes an error result (``TOOL_ERROR``) the model can
    read, unless the runtime asked for ``errors="raise"``. A cancellation propagates; the
    call's tool-call scope first records ``TOOL_OUTCOME_UNKNOWN`` (the body may have had
    effects).
    A tool is only called after its ``tool/call`` is durable, so it must expect that after
    a crash it may be reported as "maybe ran", never silently retried."""

    output: str
    is_error: bool = False
    code: str | None = None


ToolFn = Callable[[Any], "Awaitable[str | ToolOutcome] | str | ToolOutcome"]


def tool_outcome(value: object) -> ToolOutcome:
    """A tool's return value as a :class:`ToolOutcome` (a ``str`` is a successful output)."""
    if isinstance(value, ToolOutcome):
        return value
    if isinstance(value, str):
        return ToolOutcome(value)
    raise TypeError(f"a tool returns str or ToolOutcome, not {type(value).__name__}")


def error_outcome(exc: BaseException) -> ToolOutcome:
    """The error result of a tool body that raised ``exc``: the exception's type and text."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ToolOutcome(f"{TOOL_ERROR}: the tool raised {text}", is_error=True, code=TOOL_ERROR)


def unrecorded_outcome(outcome: ToolOutcome, refused: InvalidEvent) -> ToolOutcome:
    """The error result recorded in place of ``outcome`` when the store refused its record
    (``refused``): the body ran; its output's size and the refusal, not the output."""
    size = len(outcome.output.encode("utf-8", "surrogatepass"))
    what = "an error output" if outcome.is_error else "its output"
    text = (f"{TOOL_OUTPUT_NOT_RECORDED}: the tool ran to its end, but {what} ({size} bytes) could not be "
            f"recorded (the session log refused it: {refused}), so it is not shown here. Whatever the tool "
            "did has been done. If you need the output, ask for less of it (a narrower query, a range, a summary).")
    return ToolOutcome(text, is_error=True, code=TOOL_OUTPUT_NOT_RECORDED)


def _as_call(call: ToolCallRequest | Mapping[str, Any]) -> ToolCallRequest:
    if isinstance(call, ToolCallRequest):
        return call
    found = requested_calls([dict(call)])
    if not found:
        raise InvalidEvent(f"not a tool call (an object with string id and name): {call!r}")
    return found[0]


def _cancellation(exc: BaseException) -> bool:
    return failure_status(exc) == "aborted"


class ToolCall:
    """Scope of one tool call in a step: the durable intent precedes the side effect.

    ``async with step.tool_call(call) as tc:`` appends ``tool/call`` and waits until it is
    durable; only then does the body run (if that append fails, the body does not run
    and the error propagates). ``tc.result(value)`` sets what the tool returned; on exit
    the ``tool/result`` is appended (durable on return; ``tc.outcome`` is what was
    recorded). A body that raises an ``Exception`` is recorded as an error result with
    the exception's text (code ``TOOL_ERROR``) and the exception is suppressed: the step
    goes on. With ``errors="raise"`` it propagates instead and the step fails; the call
    is answered ``TOOL_OUTCOME_UNKNOWN`` first (the body may have done part of its work),
    as it is for a cancellation, which always propagates. The scope takes its call for
    its whole life: another scope of the same call is refused (:class:`CallNotPending`). A body that sets no result records an
    empty successful output. A result the store refuses as it is (an output over the
    record limit) is recorded as an error result instead, code ``TOOL_OUTPUT_NOT_RECORDED``,
    naming the output's size and the store's reason: the body ran, and the model is told
    so rather than the call being left "maybe ran". ``tc.outcome`` is what was recorded."""

    def __init__(self, scope: StepScope, call: ToolCallRequest | Mapping[str, Any], *, errors: str = "result") -> None:
        if errors not in ("result", "raise"):
            raise ValueError(f"errors must be 'result' or 'raise', not {errors!r}")
        self.scope = scope
        self.call = _as_call(call)
        self.errors = errors
        self.outcome: ToolOutcome | None = None
        self.call_seq: int | None = None
        self._value: ToolOutcome | None = None

    def result(self, value: str | ToolOutcome) -> None:
        """What the tool returned (recorded when the scope exits)."""
        self._value = tool_outcome(value)

    async def __aenter__(self) -> ToolCall:
        turn, step = self.scope.position("a tool call")
        scope, call = self.scope, self.call
        scope.check_pending(call)
        scope._running.add(call.id)  # taken: a second scope for it is refused until it is answered
        try:
            seq = await scope._start(
                call.id, [{"type": TOOL_CALL, "turn": turn, "step": step, "call_id": call.id, "name": call.name}]
            )
            if seq is None:  # answered while the intent waited its turn (step recovery): never started
                raise CallNotPending(f"call {call.id!r} ({call.name}) was answered, started or paused for approval "
                                     "before its tool/call was written (by the step's recovery, another task or "
                                     "another writer of the session); not run")
            self.call_seq = seq
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                # Cancelled while the intent was written: if it is durable, the body will not
                # run now but the call is started; it is answered as a repair would answer it.
                await self._answer_started(exc)
            if not (isinstance(exc, AppendFailed) and exc.outcome_unknown):
                # Not written (or written, and then the tracker knows its tool/call): the
                # scope no longer holds the call; an outcome unknown keeps it refused.
                scope._running.discard(call.id)
            raise
        return self

    async def _answer_started(self, exc: BaseException) -> None:
        """Answer the call ``TOOL_OUTCOME_UNKNOWN`` if it started and has no result, as
        ``exc`` (the original failure, which propagates) leaves the scope."""
        try:
            await self.scope.answer_unknown(self.call.id)
        except BaseException as failure:  # noqa: BLE001 - the original propagates, as it is
            if isinstance(failure, asyncio.CancelledError) and self.scope.tracker.pending(self.call.id) is None:
                return  # cancelled again once the answer was durable: nothing failed
            _attach(exc, failure)  # step recovery tries again; else a repair answers it

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        try:
            return await self._exit(exc)
        finally:
            self.scope._running.discard(self.call.id)

    async def _exit(self, exc: BaseException | None) -> bool:
        if exc is None:
            outcome = self._value if self._value is not None else ToolOutcome("")
        elif not isinstance(exc, (Exception, asyncio.CancelledError)):
            return False  # KeyboardInterrupt, SystemExit: step recovery, or a repair, answers it
        elif _cancellation(exc) or self.errors == "raise":
            # The body was interrupted or failed part-way: answered now, as step recovery
            # would answer it, whether or not the step sees the exception (a runtime may
            # catch a timeout and go on; a body may end in a cancellation of its own).
            await self._answer_started(exc)
            return False
        else:
            outcome = error_outcome(exc)
        try:
            # Written only if the call is still owed a result then (step recovery, or another
            # task, may answer it while this one waits its turn): never a second result.
            if await self.scope._answer(self.call.id, [self.scope.result_event(self.call, outcome)]) is None:
                return exc is not None  # tc.outcome stays None: nothing was recorded
        except (InvalidEvent, asyncio.CancelledError) as failed:
            refused = failed if isinstance(failed, InvalidEvent) else failed.__cause__
            if not isinstance(refused, InvalidEvent):
                # Cancelled while the result was written: it is durable (the append runs to
                # completion), or it failed and the call is answered as a failed body is.
                await self._answer_started(failed)
                raise
            # Nothing was written, and the body has run: say so, with what is known of its
            # output (a cancellation that came meanwhile goes on once that is durable).
            outcome = unrecorded_outcome(outcome, refused)
            try:
                await self.scope._answer(self.call.id, [self.scope.result_event(self.call, outcome)])
            except BaseException as again:
                if failed is refused:
                    raise
                _attach(failed, again)
            if failed is not refused:
                self.outcome = outcome
                raise failed from None
        self.outcome = outcome
        return exc is not None


class ModelRequest:
    """Checkpoint before a model request: ``async with step.model_request("r1", results=[...])``
    appends ``llm/request`` (``request``: the runtime's id, ``results``: the call ids the
    request carries) and waits until it is durable; only then does the body (sending the
    request) run, and not at all if that append fails. On exit ``llm/response`` is
    appended (with ``response_id`` when the body set it); when the body raised, the
    response records ``error`` (nothing was delivered) and the exception propagates."""

    def __init__(self, scope: StepScope, request: str, results: Sequence[str] = ()) -> None:
        self.scope = scope
        self.request = request
        self.results = list(results)
        self.response_id: str | None = None
        self.seq: int | None = None

    async def __aenter__(self) -> ModelRequest:
        self.seq = await self.scope.append_async(
            [{"type": LLM_REQUEST, "request": self.request, "results": self.results}]
        )
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        event: dict[str, Any] = {"type": LLM_RESPONSE, "request": self.request}
        if self.response_id is not None:
            event["response_id"] = self.response_id
        if exc is not None:
            event["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        await self.scope.append_async([event])
        return False


# --- parallel tool dispatch -------------------------------------------------------------


async def dispatch_tools(
    scope: StepScope,
    calls: Iterable[ToolCallRequest | Mapping[str, Any]],
    tools: Mapping[str, ToolFn],
    *,
    concurrency: int = 4,
    errors: str = "result",
) -> None:
    """Run an assistant message's ``calls`` (its ``tool_calls`` entries, in order) with at
    most ``concurrency`` bodies at once, each in a :class:`ToolCall` scope.

    For each call, in the assistant's order: a durable ``tool/call`` is appended before
    its body starts, and its ``tool/result`` when it returns. A call id repeated in the
    message is one call (its first occurrence, as the views count it). A call naming a
    tool not in ``tools`` gets a local error result (code ``TOOL_NOT_FOUND``, no
    ``tool/call``: nothing ran). A body that raises gets an error result (``TOOL_ERROR``)
    and the others go on; with ``errors="raise"`` it is a failure of the step instead: no
    new call is started, the started ones are waited for (their results recorded), then
    the first failure is raised, so the scope's recovery never races a running dispatch.
    On cancellation the started bodies are cancelled and waited for, then the
    cancellation propagates. Raises :class:`OutsideStep` (nothing written) when the
    scope knows no open step."""
    scope.position("dispatch_tools")
    requested = [_as_call(c) for c in calls]
    seen: set[str] = set()
    todo = [c for c in requested if not (c.id in seen or seen.add(c.id))]  # first occurrences, in order
    for call in todo:  # before anything runs: all of them may, or none does
        scope.check_pending(call)
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an int >= 1, not {concurrency!r}")
    slots = asyncio.Semaphore(concurrency)
    started: list[asyncio.Task[None]] = []
    scopes: list[ToolCall] = []  # the tool-call scopes entered, whose tasks are in ``started``
    failures: list[BaseException] = []

    async def run(tc: ToolCall, body: ToolFn) -> None:
        try:
            try:
                value = body(tc.call.arguments)
                if inspect.isawaitable(value):
                    value = await value
                tc.result(value)  # type: ignore[arg-type]
            except BaseException as exc:
                if not await tc.__aexit__(type(exc), exc, exc.__traceback__):
                    raise
            else:
                await tc.__aexit__(None, None, None)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            failures.append(exc)
            raise
        finally:
            slots.release()

    try:
        for call in todo:
            if failures:
                break
            body = tools.get(call.name)
            if body is None:
                text = (f"{TOOL_NOT_FOUND}: there is no tool named {call.name!r}; the call (id {call.id}) "
                        "did nothing. Use one of the available tools.")
                # Only if still owed an answer then (another dispatch of the message, or step
                # recovery, may have answered it meanwhile): never a second result.
                await scope._answer(call.id, [scope.result_event(call, ToolOutcome(text, True, TOOL_NOT_FOUND))])
                continue
            await slots.acquire()
            if failures:
                slots.release()
                break
            tc = ToolCall(scope, call, errors=errors)
            try:
                await tc.__aenter__()  # the durable intent precedes the side effect
            except BaseException:
                slots.release()
                raise
            scopes.append(tc)
            started.append(asyncio.create_task(run(tc, body)))
    except asyncio.CancelledError as exc:
        await _cancel_started(started, scopes, exc)
        raise
    except BaseException:
        await _to_completion(asyncio.gather(*started, return_exceptions=True))
        raise
    try:
        await asyncio.gather(*started, return_exceptions=True)
    except asyncio.CancelledError as exc:
        await _cancel_started(started, scopes, exc)
        raise
    if failures:
        raise failures[0]



async def _cancel_started(started: list[asyncio.Task[None]], scopes: list[ToolCall], exc: BaseException) -> None:
    """Cancel the started bodies and wait for them. A task cancelled before it ever ran
    never reaches its tool-call scope's exit: its call, whose ``tool/call`` is durable, is
    answered here as that exit would have answered it."""
    for task in started:
        task.cancel()
    try:
        await _to_completion(asyncio.gather(*started, return_exceptions=True))
    finally:  # cancelled again meanwhile: the bodies have ended all the same
        for tc in scopes:
            await tc._answer_started(exc)

__all__ = [
    "TOOL_ERROR",
    "TOOL_NOT_FOUND",
    "TOOL_OUTPUT_NOT_RECORDED",
    "Appender",
    "CallNotPending",
    "ModelRequest",
    "NotAwaitingApproval",
    "OutsideStep",
    "StepScope",
    "ToolCall",
    "ToolFn",
    "ToolOutcome",
    "dispatch_tools",
    "error_outcome",
    "failure_status",
    "tool_outcome",
    "unrecorded_outcome",
]
