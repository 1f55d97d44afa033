"""asyncio write-behind: events are accepted at once and made durable in batches.

One pending queue per session, a batching deadline, at most one write in flight per
session, and a flush barrier. Events that arrive while a write is in flight go into the
next batch: that is group commit. Durable writes run in a worker thread (fdatasync blocks).

    async with WriteBehind(store) as writer:
        seq = await writer.append("s1", [{"type": "tool/call", ...}])   # durable
        writer.submit("s1", [{"type": "llm/chunk", ...}])                # accepted only
        await writer.flush("s1")                                          # checkpoint

A failed batch goes back to the head of its queue, in order, and the automatic path
pauses for that session: the failure is reported to the awaiting producers and to
``on_error``; an explicit :meth:`WriteBehind.flush` retries and raises if it fails again.
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
    paused: BaseException | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)


class WriteBehind:
    """Write-behind over an :class:`EventStore` for any number of sessions.

    ``max_delay``: how long (seconds) the first event of a batch may wait for company.
    ``max_batch``: most events per batch (the store also enforces its byte limit).
    Each session is owned (``store.session``) from its first event until :meth:`close`.
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
        once they are durable (or to the error that kept them from being written)."""
        if self._closing:
            raise StoreClosed("write-behind is closing: no new events are accepted")
        lane = self._lanes.get(session_id)
        if lane is None:
            lane = self._lanes[session_id] = _Lane(session_id)
            lane.idle.set()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        lane.queue.append(_Pending(list(events), future))
        if lane.paused is None:
            self._start(lane)
        return future

    def _start(self, lane: _Lane) -> None:
        """Start the lane's drain task unless one is running (at most one write in flight)."""
        if lane.task is None:
            lane.idle.clear()
            lane.task = asyncio.get_running_loop().create_task(self._drain(lane))

    async def append(self, session_id: str, events: Sequence[Mapping[str, Any]]) -> int:
        """Accept ``events`` and wait until they are durable; returns the last seq."""
        return await self.submit(session_id, events)

    # -- the write path ----------------------------------------------------------------

    async def _drain(self, lane: _Lane) -> None:
        try:
            if self.max_delay > 0:
                await asyncio.sleep(self.max_delay)  # the batching deadline
            while lane.queue and lane.paused is None:
                await self._write_one(lane)
        finally:
            lane.task = None
            lane.idle.set()

    async def _write_one(self, lane: _Lane) -> None:
        batch: list[_Pending] = []
        n = 0
        for pending in lane.queue:
            if batch and n + len(pending.events) > self.max_batch:
                break
            batch.append(pending)
            n += len(pending.events)
        del lane.queue[: len(batch)]
        events = [e for p in batch for e in p.events]
        try:
            last = await asyncio.to_thread(self._write_sync, lane, events)
        except InvalidEvent as exc:
            # Nothing was written. Fail only the producer whose events are at fault.
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            for pending in batch:
                try:
                    seq = await asyncio.to_thread(self._write_sync, lane, pending.events)
                except InvalidEvent as single:
                    pending.future.set_exception(single)
                else:
                    pending.future.set_result(seq)
            return
        except BaseException as exc:
            # Back to the head of the queue, in order; the automatic path pauses.
            lane.queue[:0] = batch
            lane.paused = exc
            self._report(lane, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        # Each producer gets the seq of its own last event.
        first = last - len(events) + 1
        end = first - 1
        for pending in batch:
            end += len(pending.events)
            if not pending.future.done():
                pending.future.set_result(end)

    def _write_sync(self, lane: _Lane, events: list[Mapping[str, Any]]) -> int:
        if lane.handle is None:
            lane.handle = self.store.session(lane.session_id)
        try:
            return lane.handle.append(events)
        except AppendFailed:
            # A failed handle is unusable; a later flush opens a new one.
            with contextlib.suppress(SessionLogError):
                lane.handle.close()
            lane.handle = None
            raise

    def _report(self, lane: _Lane, exc: BaseException) -> None:
        for pending in lane.queue:
            if not pending.future.done():
                pending.future.set_exception(exc)
                pending.future.exception()  # retrieved: the failure is also reported below
        if self.on_error is not None:
            self.on_error(lane.session_id, exc)

    # -- barrier and shutdown ----------------------------------------------------------

    async def flush(self, session_id: str | None = None) -> None:
        """Wait until everything accepted so far (for one session, or all) is durable.

        A paused session is retried once; if its queue still cannot be written the
        failure is raised (the events stay queued, in order)."""
        if session_id is None:
            lanes = list(self._lanes.values())
        else:
            lanes = [self._lanes[session_id]] if session_id in self._lanes else []
        for lane in lanes:
            while True:
                await lane.idle.wait()
                if not lane.queue:
                    lane.paused = None
                    break
                if lane.paused is not None:
                    cause, lane.paused = lane.paused, None
                    loop = asyncio.get_running_loop()
                    for pending in lane.queue:  # their old futures carry the failure
                        if pending.future.done():
                            pending.future = loop.create_future()
                    self._start(lane)
                    await asyncio.shield(lane.task)  # type: ignore[arg-type]
                    if lane.paused is not None:
                        raise lane.paused from cause
                    continue
                self._start(lane)

    async def close(self) -> None:
        """Stop admission, flush every session, release every session it owns."""
        self._closing = True
        try:
            await self.flush()
        finally:
            for lane in self._lanes.values():
                if lane.handle is not None:
                    await asyncio.to_thread(lane.handle.close)
                    lane.handle = None

    async def __aenter__(self) -> WriteBehind:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
