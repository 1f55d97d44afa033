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
message's calls in parallel under the scope with the quiescence rule of DESIGN.md
section 5: after a failure it starts no new call and waits for the started ones before
recovery runs.
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

from .contract import SequenceConflict, events_list, plan_batches
from .events import (
    TOOL_CALL,
    TOOL_RESULT,
    TURN_END,
    Record,
    ToolCallRequest,
    requested_calls,
)
from .transcript import PendingCalls, closers, recovery_results

_T = TypeVar("_T")

TOOL_NOT_FOUND = "TOOL_NOT_FOUND"
"""``code`` of the local error result :func:`dispatch_tools` records for a call naming a
tool it does not have (not synthetic: the runtime answered it; the model should know)."""


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
        self._async_lock: asyncio.Lock | None = None

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

    async def _append_task(self, batch: list[Mapping[str, Any]], expect_seq: int | None) -> int:
        if self._async_lock is None:
            self._async_lock = asyncio.Lock()
        async with self._async_lock:
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
        return await _to_completion(self._append_task(events_list(events), expect_seq))

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


# --- parallel tool dispatch -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What a tool returned: its ``output`` text and whether it is an error."""

    output: str
    is_error: bool = False


ToolFn = Callable[[Any], Awaitable["str | ToolOutcome"]]


async def dispatch_tools(
    scope: StepScope,
    calls: Iterable[ToolCallRequest | Mapping[str, Any]],
    tools: Mapping[str, ToolFn],
    *,
    concurrency: int = 4,
) -> None:
    """Run an assistant message's ``calls`` (its ``tool_calls`` entries, in order) with at most ``concurrency`` bodies at once.

    For each call: a durable ``tool/call`` is appended before its body starts, and its
    ``tool/result`` when it returns. A call naming a tool not in ``tools`` gets a local
    error result (code ``TOOL_NOT_FOUND``, no ``tool/call``: nothing ran). A body that
    raises is a failure of the step: no new call is started, the started ones are waited
    for (their results recorded), then the first failure is raised — so the scope's
    recovery never races a running dispatch. On cancellation the started bodies are
    cancelled and waited for, then the cancellation propagates."""
    requested = requested_calls([dict(c) if isinstance(c, Mapping) else
                                 {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls])
    # A call id repeated in one message is one call (as the tracker and the views count it):
    # its body runs once.
    todo = list({call.id: call for call in reversed(requested)}.values())[::-1]
    turn = scope.tracker.step_turn if scope.tracker.step_turn is not None else scope.tracker.open_turn
    step = scope.tracker.open_step
    slots = asyncio.Semaphore(concurrency)
    started: list[asyncio.Task[None]] = []
    failures: list[BaseException] = []

    def result_event(call: ToolCallRequest, outcome: ToolOutcome, code: str | None = None) -> dict[str, Any]:
        event = {"type": TOOL_RESULT, "turn": turn, "step": step, "call_id": call.id, "name": call.name,
                 "output": outcome.output, "is_error": outcome.is_error}
        if code is not None:
            event["code"] = code
        return event

    async def run(call: ToolCallRequest, body: ToolFn) -> None:
        try:
            value = await body(call.arguments)
            outcome = value if isinstance(value, ToolOutcome) else ToolOutcome(str(value))
            await scope.append_async([result_event(call, outcome)])
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
                await scope.append_async([result_event(call, ToolOutcome(text, True), TOOL_NOT_FOUND)])
                continue
            await slots.acquire()
            if failures:
                slots.release()
                break
            try:
                # The durable intent precedes the side effect.
                await scope.append_async([{"type": TOOL_CALL, "turn": turn, "step": step,
                                           "call_id": call.id, "name": call.name}])
            except BaseException:
                slots.release()
                raise
            started.append(asyncio.create_task(run(call, body)))
    except asyncio.CancelledError:
        for task in started:
            task.cancel()
        await _to_completion(asyncio.gather(*started, return_exceptions=True))
        raise
    except BaseException:
        await _to_completion(asyncio.gather(*started, return_exceptions=True))
        raise
    try:
        await asyncio.gather(*started, return_exceptions=True)
    except asyncio.CancelledError:
        for task in started:
            task.cancel()
        await _to_completion(asyncio.gather(*started, return_exceptions=True))
        raise
    if failures:
        raise failures[0]


__all__ = [
    "TOOL_NOT_FOUND",
    "Appender",
    "StepScope",
    "ToolOutcome",
    "dispatch_tools",
    "failure_status",
]
