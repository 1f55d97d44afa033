"""asyncio write-behind: events are accepted at once and made durable in batches.

One pending queue per session, a batching deadline, at most one write in flight per
session, and a flush barrier. Events that arrive while a write is in flight go into the
next batch: that is group commit. Durable writes run in a worker thread (fdatasync blocks).

    async with WriteBehind(store) as writer:
        seq = await writer.append("s1", [{"type": "tool/call", ...}])   # durable
        writer.submit("s1", [{"type": "llm/chunk", ...}])                # accepted only
        await writer.flush("s1")                                          # checkpoint

Failure contract, per session:

- A batch that failed and was rolled back goes back to the head of the queue, in order,
  and the automatic path pauses. The failure is reported to ``on_error``; the producers
  of queued events keep waiting (their events are not written, and not lost). While
  paused, new events are refused at once with the failure. :meth:`WriteBehind.flush`
  retries the queue and raises if it fails again (the queue is kept for a later flush).
- A batch whose outcome is unknown (``AppendFailed.outcome_unknown``: a commit error, a
  failed rollback) is never written again: its producers get that error, the other
  queued events are failed and dropped, and the session refuses new events.
- An event the store refuses (``InvalidEvent``) fails only its producer.
- :meth:`WriteBehind.close` stops admission and flushes; events that still cannot be
  written are failed and dropped. A producer told its events failed can rely on them not
  being written later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contract import (
    AppendFailed,
    EventStore,
    InvalidEvent,
    SessionHandle,
    SessionLogError,
    StoreClosed,
)


@dataclass
class _Pending:
    events: list[Mapping[str, Any]]
    future: asyncio.Future[int]


@dataclass
class _Lane:
    """The queue and writer state of one session."""

    session_id: str
    queue: list[_Pending] = field(default_factory=list)
    handle: SessionHandle | None = None
    task: asyncio.Task[None] | None = None
    paused: BaseException | None = None  # a retryable failure: the automatic path waits for flush()
    dead: BaseException | None = None  # an unknown outcome: nothing more is written
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class WriteBehind:
    """Write-behind over an :class:`EventStore` for any number of sessions.

    ``max_delay``: how long (seconds) the first event of a batch may wait for company.
    ``max_batch``: most events per batch (the store also enforces its byte limit).
    Each session is owned (``store.session``) from its first write until :meth:`close`.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        max_delay: float = 0.0,
        max_batch: int = 1024,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.store = store
        self.max_delay = max_delay
        self.max_batch = max_batch
        self.on_error = on_error
        self._lanes: dict[str, _Lane] = {}
        self._closing = False

    # -- admission ---------------------------------------------------------------------

    def submit(self, session_id: str, events: Sequence[Mapping[str, Any]]) -> asyncio.Future[int]:
        """Accept ``events`` for ``session_id`` now; the future resolves to the last seq
        once they are durable. Raises StoreClosed after close() began, and the session's
        failure while it is paused or stopped."""
        if self._closing:
            raise StoreClosed("write-behind is closing: no new events are accepted")
        lane = self._lanes.get(session_id)
        if lane is None:
            lane = self._lanes[session_id] = _Lane(session_id)
            lane.idle.set()
        failure = lane.dead or lane.paused
        if failure is not None:
            raise failure
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        lane.queue.append(_Pending(list(events), future))
        self._start(lane)
        return future

    async def append(self, session_id: str, events: Sequence[Mapping[str, Any]]) -> int:
        """Accept ``events`` and wait until they are durable; returns the last seq."""
        return await self.submit(session_id, events)

    def failure(self, session_id: str) -> BaseException | None:
        """What keeps the session's queue from being written (None when it is healthy)."""
        lane = self._lanes.get(session_id)
        return None if lane is None else lane.dead or lane.paused

    # -- the write path ----------------------------------------------------------------

    def _start(self, lane: _Lane) -> None:
        """Start the lane's drain task unless one is running (at most one write in flight)."""
        if lane.task is None:
            lane.idle.clear()
            lane.task = asyncio.get_running_loop().create_task(self._drain(lane))

    async def _drain(self, lane: _Lane) -> None:
        try:
            if self.max_delay > 0:
                await asyncio.sleep(self.max_delay)  # the batching deadline
            while lane.queue and lane.paused is None and lane.dead is None:
                await self._write_next(lane)
        finally:
            lane.task = None
            lane.idle.set()

    async def _write_next(self, lane: _Lane) -> None:
        batch: list[_Pending] = []
        n = 0
        for pending in lane.queue:
            if batch and n + len(pending.events) > self.max_batch:
                break
            batch.append(pending)
            n += len(pending.events)
        del lane.queue[: len(batch)]
        try:
            _resolve(batch, await self._write(lane, batch))
        except InvalidEvent as exc:
            await self._write_each(lane, batch, exc)
        except BaseException as exc:
            self._failed(lane, batch, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def _write_each(self, lane: _Lane, batch: list[_Pending], cause: InvalidEvent) -> None:
        """The grouped batch was refused: write each producer's events on their own, so
        only the producer at fault fails."""
        if len(batch) == 1:
            _fail(batch, cause)
            return
        for i, pending in enumerate(batch):
            try:
                _resolve([pending], await self._write(lane, [pending]))
            except InvalidEvent as exc:
                _fail([pending], exc)
            except BaseException as exc:
                self._failed(lane, batch[i:], exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return

    def _failed(self, lane: _Lane, batch: list[_Pending], exc: BaseException) -> None:
        """Nothing of ``batch`` was written (or, for an unknown outcome, maybe some was).
        Producers already answered (written before a cancellation) are left out."""
        batch = [p for p in batch if not p.future.done()]
        if isinstance(exc, AppendFailed) and exc.outcome_unknown:
            self._stop(lane, batch, exc)
        elif isinstance(exc, asyncio.CancelledError):
            lane.queue[:0] = batch
        else:  # rolled back, SessionLocked, IOFailure...: retry on flush()
            self._pause(lane, batch, exc)

    async def _write(self, lane: _Lane, batch: list[_Pending]) -> int:
        """One durable append of ``batch`` in a worker thread. If the awaiting task is
        cancelled, the thread's outcome is still awaited and settled before the
        cancellation goes on, so a batch is never both written and requeued."""
        events = [e for p in batch for e in p.events]
        thread = asyncio.ensure_future(asyncio.to_thread(self._write_sync, lane, events))
        try:
            return await asyncio.shield(thread)
        except asyncio.CancelledError:
            try:
                last = await thread
            except AppendFailed as exc:
                if exc.outcome_unknown:  # maybe written: never requeued, never written again
                    self._stop(lane, batch, exc)
            except BaseException:
                pass  # not written: the caller requeues it
            else:
                _resolve(batch, last)  # written: answered, so never requeued
            raise

    def _write_sync(self, lane: _Lane, events: list[Mapping[str, Any]]) -> int:
        handle = lane.handle
        if handle is None:
            handle = lane.handle = self.store.session(lane.session_id)
        try:
            return handle.append(events)
        except AppendFailed:
            # A failed handle is unusable; the next write opens a new one.
            with contextlib.suppress(SessionLogError):
                handle.close()
            if lane.handle is handle:
                lane.handle = None
            raise

    def _pause(self, lane: _Lane, batch: list[_Pending], exc: BaseException) -> None:
        lane.queue[:0] = batch
        lane.paused = exc
        self._report(lane, exc)

    def _stop(self, lane: _Lane, batch: list[_Pending], exc: AppendFailed) -> None:
        lane.dead = exc
        _fail(batch, exc)
        stopped = StoreClosed(f"{lane.session_id}: not written: an earlier batch's outcome is unknown ({exc})")
        _fail(lane.queue, stopped)
        lane.queue.clear()
        self._report(lane, exc)

    def _report(self, lane: _Lane, exc: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(lane.session_id, exc)

    # -- barrier and shutdown ----------------------------------------------------------

    async def flush(self, session_id: str | None = None) -> None:
        """Wait until everything accepted so far (for one session, or all) is durable.

        A paused session is retried; if its queue still cannot be written the failure
        is raised and the queue is kept (a later flush retries it)."""
        if session_id is None:
            lanes = list(self._lanes.values())
        else:
            lanes = [self._lanes[session_id]] if session_id in self._lanes else []
        for lane in lanes:
            while True:
                await lane.idle.wait()
                if lane.dead is not None:
                    raise lane.dead
                if not lane.queue:
                    lane.paused = None
                    break
                if lane.paused is not None:
                    cause, lane.paused = lane.paused, None
                    self._start(lane)
                    await lane.idle.wait()
                    if lane.paused is not None:
                        raise lane.paused from cause
                    continue
                self._start(lane)

    async def close(self) -> None:
        """Stop admission, flush every session, release every session it owns. Events
        that cannot be written are failed and dropped; the first failure is raised."""
        self._closing = True
        first: BaseException | None = None
        for lane in list(self._lanes.values()):
            try:
                await self.flush(lane.session_id)
            except BaseException as exc:
                first = first or exc
                if lane.task is not None:
                    # A write may be in flight in its thread: let it finish and settle
                    # before the handle (its descriptor and its lock) goes away.
                    await _settled(lane.task)
                _fail(lane.queue, exc)
                lane.queue.clear()
            if lane.handle is not None:
                handle, lane.handle = lane.handle, None
                await _settled(asyncio.ensure_future(asyncio.to_thread(handle.close)))
        if first is not None:
            raise first

    async def __aenter__(self) -> WriteBehind:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _settled(task: asyncio.Future[Any]) -> None:
    """Wait for ``task`` to finish, even if the waiting task is cancelled meanwhile (the
    cancellation is raised afterwards)."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except BaseException:
            break
    if cancelled:
        raise asyncio.CancelledError


def _resolve(batch: list[_Pending], last: int) -> None:
    """Each producer gets the seq of its own last event."""
    end = last - sum(len(p.events) for p in batch)
    for pending in batch:
        end += len(pending.events)
        if not pending.future.done():
            pending.future.set_result(end)


def _fail(pending: list[_Pending], exc: BaseException) -> None:
    for p in pending:
        if not p.future.done():
            p.future.set_exception(exc)
            p.future.exception()  # retrieved: the failure is also reported to on_error
