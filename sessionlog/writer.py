"""asyncio write-behind: events are accepted at once and made durable in batches.

One pending queue per session, at most one write in flight per session, an optional
batching deadline, and a flush barrier. Events that arrive while a write is in flight go
into the next batch: that is group commit. A batch is bounded by count (``max_batch``)
and by bytes (the store's batch limit, less a margin), so a burst of large events never
falls back to one sync per event. The bounds group producers; they never refuse one: a
producer's events that do not fit them (an output of nearly the batch limit) are written
as a batch of their own, so the writer takes whatever one ``store.append`` takes.

    async with WriteBehind(store) as writer:
        seq = await writer.append("s1", [{"type": "tool/call", ...}])   # durable
        writer.submit("s1", [{"type": "llm/chunk", ...}])                # accepted only
        await writer.flush("s1")                                          # checkpoint

**One owner per session.** A session has one writer at a time: the write-behind owns a
session (``store.session(id)``) from its first write until :meth:`WriteBehind.close`.
If another handle owns it, the events waiting for that write fail with
:class:`~sessionlog.SessionLocked` (after waiting up to ``lock_wait`` seconds for the
owner to let go; 0 by default), and the next event tries to own it again.

**Where writes run.** A write runs in a worker thread (a sync blocks), except when it
is the only write the writer has to do (one producer's events, no other write in
flight, the session already owned): then ``await append()`` writes it inline, in the
producer's own task. When the loop has other callbacks ready, it first yields once so
that producers ready at the same moment can queue behind it (then they are all written
together, the common way); when nothing else is ready and the loop turned less than
:data:`INLINE_SPAN` (1 ms) ago, it writes at once. A lone append then costs a direct
durable append and a little bookkeeping: no thread hop, no task, the same system calls,
and at most one turn of the loop per millisecond (so a tight loop of appends still lets
timers and I/O run). Loops that do not expose their ready queue (e.g. uvloop) always take
the one turn. ``inline=False`` always uses a thread (the loop is then never blocked by a
sync).

Failure contract, per session; only :class:`~sessionlog.SessionLogError` is ever raised:

- An invalid session id is refused at once, by ``submit`` and ``append`` alike, with the
  store's :class:`~sessionlog.InvalidSessionId`; nothing is queued.
- An event the store refuses (not an event, no ``type``, a ``seq`` of its own, not
  serializable, nested too deep, over the record or batch limit:
  :class:`~sessionlog.InvalidEvent`) fails only its producer: ``submit`` checks the
  events as ``store.append`` does and raises its error at once, accepting nothing (a
  producer that submits and moves on never loses events silently); ``append`` raises the
  store's refusal when its events are written. A batch
  the store refuses when written is split until the refused producer is found; its
  future fails (``on_error`` hears of it too when no ``append`` was awaiting it: a record
  that its real, longer seq pushes over the record or batch limit), and everything else is
  written, in order.
- A batch that failed and was rolled back goes back to the head of the queue, in order,
  and the automatic path pauses. The failure is reported to ``on_error``. Producers
  awaiting :meth:`WriteBehind.append` get the failure at once and their events are
  withdrawn (never written later); events accepted with :meth:`WriteBehind.submit` stay
  queued. While paused, new events are refused at once with the failure.
  :meth:`WriteBehind.flush` retries the queue and raises if it fails again (the queue is
  kept for a later flush).
- Owning the session failed (``SessionLocked``, ``SessionNotFound``, ``CorruptLog``):
  every queued event of the session fails with that error; nothing was written. When
  some of them were submitted (no ``append`` awaiting them), the next
  :meth:`WriteBehind.flush` (or :meth:`WriteBehind.close`) raises the error too, however
  long after: a producer that moved on hears of it at its checkpoint.
- A batch whose outcome is unknown (``AppendFailed.outcome_unknown``: a commit error, a
  failed rollback) is never written again: its producers get that error, the other
  queued events are failed and dropped, and the session refuses new events.
- :meth:`WriteBehind.close` stops admission and flushes; events that still cannot be
  written are failed and dropped. A producer told its events failed can rely on them not
  being written later.
- A cancelled wait is not a cancelled write. When the task awaiting
  :meth:`WriteBehind.append` is cancelled (a ``wait_for`` timeout), its events stay queued
  and are written once, in order, as submitted events are: a failure to write them goes to
  ``on_error`` and the next flush. Cancelling a :meth:`WriteBehind.submit` future is the
  same. Flushes and close wait for them (a flush waits for events to settle, not for
  futures to be done). A producer must not retry a cancelled append (it would record it
  twice): flush, then read the log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import msgspec

from .contract import (
    AppendFailed,
    CorruptLog,
    EventStore,
    InvalidEvent,
    InvalidSessionId,
    OwnershipLost,
    SequenceConflict,
    SessionHandle,
    SessionLocked,
    SessionLogError,
    SessionNotFound,
    StoreClosed,
    events_list,
)
from .events import Record, RecordError, plain_encoding, read_event, valid_session_id
from .scan import DEFAULT_LIMITS, batch_size, encode_batch

ENVELOPE_BYTES = 64
"""Bytes a record takes beyond its event's own encoding, at most: the envelope the store
adds (``{"seq":…,"ts":…,``) and the line's newline."""

SEQ_MARGIN = 16
"""Bytes counted per record on top of its line encoded at seq 1, when a batch is bounded by
bytes before its seqs are known (a seq has at most this many more digits)."""


@dataclass(slots=True, eq=False)
class _Pending:
    events: list[Mapping[str, Any]]
    nbytes: int
    future: asyncio.Future[int]
    expect_seq: int | None = None  # the session's last seq before these events, if the producer named it
    awaited: bool = False  # an append() is waiting on it (withdrawn when the session pauses)
    refused: bool = False  # failed for its own events, not for the session's state
    barriers: list[asyncio.Future[None]] | None = None  # flushes waiting for it to settle
    settled: bool = False  # written, or failed: what a flush waits for (its future may be cancelled first)


@dataclass(eq=False)
class _Lane:
    """The queue and writer state of one session."""

    session_id: str
    queue: deque[_Pending] = field(default_factory=deque)
    handle: SessionHandle | None = None
    task: asyncio.Task[None] | None = None
    last: _Pending | None = None  # the last event accepted: what a flush waits for
    paused: SessionLogError | None = None  # a retryable failure: the automatic path waits for flush()
    dead: SessionLogError | None = None  # an unknown outcome: nothing more is written
    lost: SessionLogError | None = None  # submitted events failed for the session's state: the next flush raises it
    waiters: set[asyncio.Future[None]] = field(default_factory=set)  # flushes waiting (woken when it pauses)
    tail: int | None = None  # the session's last seq as this writer last knew it, owning it


class WriteBehind:
    """Write-behind over an :class:`EventStore` for any number of sessions.

    ``max_delay``: how long (seconds) the first event of a batch may wait for company.
    ``max_batch``: most events per batch. ``max_batch_bytes``: most encoded bytes per
    batch (default, and at most: the store's batch limit, less a margin). These bound how
    producers are grouped, never what one producer may submit: one producer's events
    over them are a batch of their own. ``lock_wait``: seconds to
    wait for another owner of a session before its events fail with SessionLocked.
    ``inline``: write on the event loop when it is the only write to do (see the module
    docstring). ``workers``: threads for writes of different sessions at once.
    ``group_commit``: write the ready batches of different sessions in one store call
    (``store.append_group``: one transaction, one commit); by default when the store has
    it (the SQL stores).
    ``on_error(session_id, exc)`` hears of background failures.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        max_delay: float = 0.0,
        max_batch: int = 1024,
        max_batch_bytes: int | None = None,
        lock_wait: float = 0.0,
        inline: bool = True,
        workers: int = 16,
        group_commit: bool | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.store = store
        self.max_delay = max_delay
        self.max_batch = max_batch
        self._limits = getattr(store, "limits", None) or DEFAULT_LIMITS
        # Batch sizes are estimated before the seqs and stamps are known: a group kept a
        # sixteenth under the store's batch limit is one the store takes.
        limit = self._limits.batch_limit
        ceiling = max(limit - limit // 16, 1)
        self.max_batch_bytes = ceiling if max_batch_bytes is None else min(max_batch_bytes, ceiling)
        self.lock_wait = lock_wait
        self.inline = inline
        self.on_error = on_error
        self._lanes: dict[str, _Lane] = {}
        self._closing = False
        self._in_flight = 0  # writes running in worker threads
        if group_commit is None:
            group_commit = callable(getattr(store, "append_group", None))
        self.group_commit = group_commit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepted = 0  # events accepted so far (a lone append sees whether others came)
        self._turned = -INLINE_SPAN  # loop time when a lone append last let the loop turn
        self._lone_waiting = False  # a lone append is yielding before it writes inline
        self._ready: dict[_Lane, None] = {}  # group commit: sessions with events to write, in order
        self._group_task: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                               thread_name_prefix="sessionlog-writer")

    # -- admission ---------------------------------------------------------------------

    def submit(self, session_id: str, events: Sequence[Mapping[str, Any]], *,
               expect_seq: int | None = None) -> asyncio.Future[int]:
        """Accept ``events`` for ``session_id`` now; the future resolves to the seq of the
        last of them once they are durable (or fails with why they were not written).
        With ``expect_seq`` they are written only if the session's last seq is then
        ``expect_seq`` (else the future fails with SequenceConflict; nothing else does).
        The events are copied as they are now: the caller may reuse or change its dicts
        once this returns, and what is written is what was submitted.

        Raises at once, accepting nothing, what ``store.append(session_id, events)`` would
        raise for them: InvalidSessionId; InvalidEvent (not mappings, no type, a seq of
        their own, not serializable, nested too deep, over the record or batch limit,
        measured at seq 1). Also StoreClosed after close() began, and the session's
        failure while it is paused or stopped. Events ``store.append`` takes are taken:
        when they do not fit ``max_batch_bytes`` they are written as a batch of their
        own."""
        lane, pending = self._accept(session_id, events, expect_seq, checked=True)
        self._start(lane)
        return pending.future

    def _accept(self, session_id: str, events: Sequence[Mapping[str, Any]],
                expect_seq: int | None, *, checked: bool = False) -> tuple[_Lane, _Pending]:
        """Queue the events (what :meth:`submit` does but start writing them)."""
        if not valid_session_id(session_id):  # as the store refuses it, before anything is queued
            raise InvalidSessionId(
                f"invalid session id {session_id!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}, no '..'"
            )
        if self._closing:
            raise StoreClosed("write-behind is closing: no new events are accepted")
        lane = self._lanes.get(session_id)
        if lane is None:
            lane = self._lanes[session_id] = _Lane(session_id)
        failure = lane.dead or lane.paused
        if failure is not None:
            raise failure
        batch = events.copy() if type(events) is list else events_list(events)
        nbytes = None if checked else _encoded_size(batch)
        if nbytes is None:  # checked as the store checks them, or not encodable: the store's refusal
            batch, nbytes = self._snapshot(batch)
        # No bound of the writer's own refuses them: events over max_batch_bytes are a batch
        # of their own (_take), and only the store's limits say what is too large.
        loop = self._loop
        if loop is None or not loop.is_running():  # one get_running_loop (a getpid) per loop, not per event
            loop = self._loop = asyncio.get_running_loop()
        pending = _Pending(batch, nbytes, loop.create_future(), expect_seq)
        lane.queue.append(pending)
        lane.last = pending
        self._accepted += 1
        return lane, pending

    def _snapshot(self, batch: list[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], int]:
        """The events of a submit as they are now, and the bytes they take in a write.

        Every event is checked as the store checks it (the same rules, the same
        InvalidEvent naming the event at fault, the batch limit on the events together):
        an event the store would refuse is
        refused when submitted, not after its producer has moved on. What is queued is a
        private copy (the events encoded now and decoded again): a producer may reuse or
        change its dicts once ``submit`` returns, and what is written is what it
        submitted. The record and batch limits are checked at seq 1 (a later seq has
        more digits); a record or batch that it pushes over a limit fails when written, and
        ``on_error`` hears of it. (``append`` skips this: its producer waits for the
        write and hears why it was refused.)"""
        if not batch:
            return batch, 0
        encoded = plain_encoding(batch)  # the common case: records by construction, only sizes to check
        if encoded is not None:
            nbytes = len(encoded) + ENVELOPE_BYTES * len(batch)  # at least what the batch takes
            if (len(encoded) + ENVELOPE_BYTES <= self._limits.record_limit
                    and nbytes <= self._limits.batch_limit):
                return _decoder.decode(encoded), nbytes
        batch = [_read(event, i) for i, event in enumerate(batch)]  # each mapping's own code runs once
        lines = encode_batch(batch, 1, self._limits)
        copies: list[Mapping[str, Any]] = []
        for event, line in zip(batch, lines, strict=True):
            # The record at seq 1, each member kept as its JSON text: written again, a
            # member is the same bytes (a msgspec.Raw as given, never parsed and re-spelled).
            copy: dict[str, Any] = _raw_members.decode(line)
            del copy["seq"]
            copy["type"] = event["type"]
            if event.get("ts") is None:
                del copy["ts"]  # the store stamps it when written
            else:
                copy["ts"] = event["ts"]
            copies.append(copy)
        return copies, batch_size(lines) + SEQ_MARGIN * len(lines)

    async def append(self, session_id: str, events: Sequence[Mapping[str, Any]], *,
                     expect_seq: int | None = None) -> int:
        """Accept ``events`` and wait until they are durable; returns the seq of the last.

        Raises what :meth:`submit` raises, and why the events were not written
        (InvalidEvent, SequenceConflict, SessionLocked, AppendFailed...): then they never
        will be. Cancelling the wait does not withdraw them: they are written once, as
        submitted events are (do not retry; flush, then read the log)."""
        lane, pending = self._accept(session_id, events, expect_seq)
        pending.awaited = True
        if self._lone(lane, pending):
            loop = self._loop
            assert loop is not None
            if _nothing_ready(loop) and loop.time() - self._turned < INLINE_SPAN:
                # No other callback is ready to run and the loop polled for I/O and timers
                # less than INLINE_SPAN ago: a yield would only poll again and come straight
                # back here. Write it now, inline.
                return self._write_lone(lane, pending)
            # Others are ready (or the loop cannot tell): yield once (a bare yield, no task,
            # no future callback) so that producers among them can queue behind it. If none
            # did and nothing else started, write it here, inline: a direct append plus
            # one turn of the loop. Otherwise it goes the common way, with the others.
            accepted = self._accepted
            self._lone_waiting = True  # producers arriving meanwhile go the common way
            try:
                await _yield_once()
            except BaseException:
                pending.awaited = False  # still queued: written as a submit() is
                pending.future.cancel()
                self._start(lane)
                raise
            finally:
                self._lone_waiting = False
            self._turned = loop.time()
            if self._accepted == accepted and self._lone(lane, pending):
                return self._write_lone(lane, pending)
        self._start(lane)
        try:
            return await pending.future
        except asyncio.CancelledError:
            # The wait is cancelled, not the write: the events stay queued and are written
            # as a submit()'s are (a failure then reaches on_error and the next flush).
            pending.awaited = False
            raise

    def _write_lone(self, lane: _Lane, pending: _Pending) -> int:
        """Write ``pending`` (alone in the queue, nothing in flight) here, on the loop;
        settled as :meth:`_write_next` settles a batch of one."""
        lane.queue.popleft()
        try:
            last = self._write_sync(lane, pending.events, pending.expect_seq)
        except (SequenceConflict, InvalidEvent) as exc:
            _refuse(pending, exc)
        except BaseException as exc:
            self._failed(lane, [pending], exc)
            if not isinstance(exc, Exception):
                raise
        else:
            _resolve([pending], last)
            return last
        return pending.future.result()  # raises why it was not written

    def _lone(self, lane: _Lane, pending: _Pending) -> bool:
        """``pending`` is all the writer has to write and can be written inline now."""
        return (self.inline and not self._lone_waiting and self.max_delay <= 0 and self._in_flight == 0
                and lane.handle is not None
                and lane.task is None and self._group_task is None and len(lane.queue) == 1
                and lane.queue[0] is pending and lane.paused is None and lane.dead is None)

    def session(self, session_id: str) -> WriterSession:
        """An appender for one session through this writer (what a
        :class:`~sessionlog.recovery.StepScope` appends through): ``await
        s.append(events, expect_seq=...)`` is durable on return."""
        return WriterSession(self, session_id)

    def step(self, session_id: str, *, turn: str | None = None, step: int | None = None, resume: bool = False,
             **options: Any) -> Any:
        """A :class:`~sessionlog.recovery.StepScope` over this writer:
        ``async with writer.step("s1", turn="t1", step=1) as step: ...`` (checkpoints,
        tool-call scopes, approvals, live step recovery). ``resume=True`` picks up the
        session where its durable log leaves it (the open turn and step, the calls
        awaiting approval), e.g. after a pause for a human: it reads the log, so flush
        this writer's events for the session first. ``options`` go to StepScope."""
        from .recovery import StepScope
        from .transcript import PendingCalls

        if not resume:
            return StepScope(self.session(session_id), turn=turn, step=step, **options)
        tracker = PendingCalls().feed_all(self.store.read(session_id))
        scope = StepScope(self.session(session_id), tracker=tracker, **options)
        scope.last_seq = tracker.last_seq
        return scope

    def failure(self, session_id: str) -> BaseException | None:
        """What keeps the session's queue from being written (None when it is healthy)."""
        lane = self._lanes.get(session_id)
        return None if lane is None else lane.dead or lane.paused

    # -- the write path ----------------------------------------------------------------

    def _start(self, lane: _Lane) -> None:
        """Start the lane's drain task unless one is running (at most one write in flight);
        with group commit, mark the lane ready for the writer's one group task."""
        if self.group_commit:
            self._ready[lane] = None
            if self._group_task is None:
                self._group_task = self._task(self._drain_groups())
        elif lane.task is None:
            lane.task = self._task(self._drain(lane))

    def _task(self, coro: Any) -> asyncio.Task[None]:
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop.create_task(coro)

    async def _drain(self, lane: _Lane) -> None:
        try:
            if self.max_delay > 0:
                await asyncio.sleep(self.max_delay)  # the batching deadline
            while lane.queue and lane.paused is None and lane.dead is None:
                await self._write_next(lane)
        finally:
            lane.task = None

    # -- group commit across sessions --------------------------------------------------

    async def _drain_groups(self) -> None:
        """Write the ready sessions' next batches together, one group at a time; events
        that arrive meanwhile go into the next group."""
        try:
            if self.max_delay > 0:
                await asyncio.sleep(self.max_delay)
            while True:
                lanes = [lane for lane in self._ready if lane.queue and lane.paused is None and lane.dead is None]
                self._ready.clear()
                if not lanes:
                    return
                if len(lanes) == 1:
                    await self._write_next(lanes[0])
                else:
                    await self._write_group(lanes)
                for lane in lanes:
                    if lane.queue:
                        self._ready[lane] = None
        finally:
            self._group_task = None

    async def _write_group(self, lanes: list[_Lane]) -> None:
        """One ``append_group`` of each lane's next batch. A group refused or rolled back
        wrote nothing: each session's batch is then written on its own, which isolates
        the one at fault. A group whose outcome is unknown is never written again."""
        items = [(lane, self._take(lane)) for lane in lanes]
        self._in_flight += 1
        try:
            thread = asyncio.get_running_loop().run_in_executor(self._executor, self._group_sync, items)
            try:
                ready, unowned, lasts, error = await asyncio.shield(thread)
            except asyncio.CancelledError:
                ready, unowned, lasts, error = await thread
                self._group_settled(ready, unowned, lasts, error, cancelled=True)
                raise
        finally:
            self._in_flight -= 1
        if self._group_settled(ready, unowned, lasts, error, cancelled=False):
            await asyncio.gather(*(self._write_next(lane) for lane, _ in ready))

    def _group_sync(self, items: list[tuple[_Lane, list[_Pending]]]) -> tuple[Any, ...]:
        """In a worker thread: own the sessions not owned yet, then append the group.
        Returns (appended items, items whose session could not be owned with the error,
        last seqs or None, the group's error or None)."""
        ready: list[tuple[_Lane, list[_Pending]]] = []
        unowned: list[tuple[_Lane, list[_Pending], BaseException]] = []
        for lane, batch in items:
            if lane.handle is None:
                try:
                    self._own(lane)
                except BaseException as exc:  # noqa: BLE001 - settled on the loop
                    unowned.append((lane, batch, exc))
                    continue
            ready.append((lane, batch))
        if not ready:
            return ready, unowned, None, None
        group = [(lane.handle, [e for p in batch for e in p.events], batch[0].expect_seq) for lane, batch in ready]
        try:
            lasts = self.store.append_group(group)  # type: ignore[attr-defined]
            for (lane, _), last in zip(ready, lasts, strict=True):
                lane.tail = last
            return ready, unowned, lasts, None
        except BaseException as exc:  # noqa: BLE001 - settled on the loop
            if isinstance(exc, AppendFailed):
                # The store closed the handle it blamed (``group_index``), or every handle of
                # the group: the next write of those owns anew. A handle it did not close
                # is kept, so that its own next write finds out whether its ownership
                # holds (a lock connection that died took every lock on it), rather than
                # taking the session again behind a writer that took it meanwhile.
                index = getattr(exc, "group_index", None)
                for i, (lane, _) in enumerate(ready):
                    if index is None or i == index:
                        handle, lane.handle = lane.handle, None
                        with contextlib.suppress(Exception):
                            handle.close()  # type: ignore[union-attr]
            return ready, unowned, None, exc

    def _group_settled(self, ready: list[tuple[_Lane, list[_Pending]]],
                       unowned: list[tuple[_Lane, list[_Pending], BaseException]],
                       lasts: list[int] | None, error: BaseException | None, *, cancelled: bool) -> bool:
        """Answer the producers of a group; True when its batches (requeued) must be
        written one session at a time."""
        for lane, batch, exc in unowned:
            self._failed(lane, batch, exc)
        if lasts is not None:
            for (_, batch), last in zip(ready, lasts, strict=True):
                _resolve(batch, last)
            return False
        if error is None:
            return False
        if isinstance(error, AppendFailed) and error.outcome_unknown:
            for lane, batch in ready:  # maybe written: never requeued, never written again
                self._stop(lane, batch, error)
            return False
        if isinstance(error, OwnershipLost):
            # Nothing was written; the session whose ownership was lost (``group_index``,
            # or every one) stops as a lone write would; the others go on.
            index = getattr(error, "group_index", None)
            kept = []
            for i, (lane, batch) in enumerate(ready):
                if index is None or i == index:
                    self._stop(lane, batch, error)
                else:
                    kept.append((lane, batch))
            ready[:] = kept
        for lane, batch in ready:  # nothing was written
            lane.queue.extendleft(reversed(batch))
        return not cancelled

    def _take(self, lane: _Lane) -> list[_Pending]:
        """The next batch: a prefix of the queue within the count and byte bounds, or
        one producer's events alone (however many, however large: the store, not this
        bound, decides whether they are too large)."""
        batch: list[_Pending] = []
        count = nbytes = 0
        queue = lane.queue
        while queue:
            pending = queue[0]
            if batch and (count + len(pending.events) > self.max_batch
                          or nbytes + pending.nbytes > self.max_batch_bytes
                          or pending.expect_seq is not None):  # its check is on the batch's start
                break
            batch.append(queue.popleft())
            count += len(pending.events)
            nbytes += pending.nbytes
        return batch

    async def _write_next(self, lane: _Lane) -> None:
        """Write the next batch. If the store refuses it before writing any of it (an
        InvalidEvent), its halves are written in order, split again until each refused
        producer is alone: only those fail, everything else is written, in order."""
        parts: deque[list[_Pending]] = deque([self._take(lane)])
        while parts:
            part = parts.popleft()
            try:
                _resolve(part, await self._write(lane, part))
            except SequenceConflict as exc:  # only a batch led by an expect_seq check conflicts
                _refuse(part[0], exc)
                if len(part) > 1:
                    parts.appendleft(part[1:])
            except InvalidEvent as exc:
                if len(part) == 1:
                    _refuse(part[0], exc)
                    if not part[0].awaited:  # a producer that moved on hears of it here too
                        self._report(lane, exc)
                else:
                    middle = len(part) // 2
                    parts.extendleft((part[middle:], part[:middle]))
            except BaseException as exc:
                self._failed(lane, part + [p for rest in parts for p in rest], exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return

    def _failed(self, lane: _Lane, batch: list[_Pending], exc: BaseException) -> None:
        """Nothing of ``batch`` was written (or, for an unknown outcome, maybe some was).
        Producers already answered (written before a cancellation) are left out."""
        batch = [p for p in batch if not p.settled]
        if isinstance(exc, asyncio.CancelledError):
            lane.queue.extendleft(reversed(batch))
            return
        failure = _as_error(exc)
        if isinstance(failure, AppendFailed) and failure.outcome_unknown:
            self._stop(lane, batch, failure)
        elif isinstance(failure, OwnershipLost):
            # Another writer may have taken the session, and repaired it: what is queued was
            # made under the lost ownership and is never written under a new one.
            self._stop(lane, batch, failure)
        elif isinstance(failure, (SessionLocked, SessionNotFound, CorruptLog, StoreClosed)):
            # Owning the session failed (or the store is gone): nothing was written, and
            # retrying will not help these producers; a later event tries again.
            if not all(p.awaited for p in chain(batch, lane.queue)):
                lane.lost = failure  # a producer that moved on: the next flush raises it
            _fail(batch, failure)
            _fail(lane.queue, failure)
            lane.queue.clear()
            self._report(lane, failure)
        else:  # rolled back, IOFailure...: retry on flush()
            self._pause(lane, batch, failure)

    async def _write(self, lane: _Lane, batch: list[_Pending]) -> int:
        """One durable append of ``batch``: inline when it is the writer's only write,
        else in a worker thread. If the awaiting task is cancelled, the thread's outcome
        is still awaited and settled before the cancellation goes on, so a batch is never
        both written and requeued."""
        events = batch[0].events if len(batch) == 1 else [e for p in batch for e in p.events]
        expect_seq = batch[0].expect_seq
        if self.inline and self._in_flight == 0 and lane.handle is not None and not lane.queue and len(batch) == 1:
            return self._write_sync(lane, events, expect_seq)
        self._in_flight += 1
        try:
            thread = asyncio.get_running_loop().run_in_executor(self._executor, self._write_sync, lane, events,
                                                                expect_seq)
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
        finally:
            self._in_flight -= 1

    def _own(self, lane: _Lane) -> SessionHandle:
        """Open the session for ``lane`` (in a worker thread). A session this writer owned
        before (its handle was closed by a failed write) must end where this writer left
        it: if another writer wrote to it meanwhile (a repair that closed the turn, say),
        what is queued was made without knowing that and is not written (OwnershipLost)."""
        handle = self.store.session(lane.session_id, timeout=self.lock_wait)  # type: ignore[call-arg]
        found = handle.last_seq
        if lane.tail is not None and found != lane.tail:
            with contextlib.suppress(SessionLogError):
                handle.close()
            raise OwnershipLost(
                f"{lane.session_id}: the session changed while this writer did not hold it (it ended at seq "
                f"{lane.tail}, now at {found}): another writer wrote to it; what was queued is not written: "
                "read the session again, then write through a new writer"
            )
        lane.tail = found
        lane.handle = handle
        return handle

    def _write_sync(self, lane: _Lane, events: list[Mapping[str, Any]], expect_seq: int | None = None) -> int:
        handle = lane.handle
        if handle is None:
            handle = self._own(lane)
        try:
            last = handle.append(events, expect_seq=expect_seq)
            lane.tail = last
            return last
        except AppendFailed:
            # A failed handle is unusable; the next write opens a new one.
            with contextlib.suppress(SessionLogError):
                handle.close()
            if lane.handle is handle:
                lane.handle = None
            raise
        except SessionLogError:
            raise
        except Exception as exc:
            # Raised before anything was written (encoding: RecursionError, TypeError...):
            # the events are refused, the handle stays good.
            raise _Refused(f"{lane.session_id}: the store refused the events: {type(exc).__name__}: {exc}") from exc

    def _pause(self, lane: _Lane, batch: list[_Pending], exc: SessionLogError) -> None:
        lane.queue.extendleft(reversed(batch))
        awaited = [p for p in lane.queue if p.awaited]
        if awaited:  # an awaiting producer is told now; its events are withdrawn
            _fail(awaited, exc)
            lane.queue = deque(p for p in lane.queue if not p.awaited)
        lane.paused = exc
        for waiter in lane.waiters:
            if not waiter.done():
                waiter.set_result(None)
        lane.waiters.clear()
        self._report(lane, exc)

    def _stop(self, lane: _Lane, batch: list[_Pending], exc: AppendFailed) -> None:
        """Nothing more is written to the session: ``batch`` fails with ``exc``, the rest
        of its queue with StoreClosed, and new events are refused (``exc``)."""
        lane.dead = exc
        _fail(batch, exc)
        why = ("this writer lost the session's ownership" if isinstance(exc, OwnershipLost)
               else "an earlier batch's outcome is unknown")
        stopped = StoreClosed(f"{lane.session_id}: not written: {why} ({exc})")
        _fail(lane.queue, stopped)
        lane.queue.clear()
        self._report(lane, exc)

    def _report(self, lane: _Lane, exc: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(lane.session_id, exc)

    # -- barrier and shutdown ----------------------------------------------------------

    async def flush(self, session_id: str | None = None) -> None:
        """Wait until every event accepted before this call (for one session, or all) is
        settled: durable, or failed for its own producer. A barrier: events accepted
        after the call do not delay it, however busy the session is.

        A paused session is retried; if its queue still cannot be written the failure
        is raised and the queue is kept (a later flush retries it). Raises the session's
        failure when events accepted before the call were not written because of it
        (SessionLocked, AppendFailed, StoreClosed...), not when one producer's own events
        were refused (that producer's future says so). Submitted events that failed so
        before the call, while no flush was waiting (the session was owned by another
        handle...), are raised here too, once."""
        if session_id is None:
            lanes = list(self._lanes.values())
        else:
            lanes = [self._lanes[session_id]] if session_id in self._lanes else []
        first: SessionLogError | None = None
        for lane in lanes:
            try:
                await self._barrier(lane)
            except SessionLogError as exc:
                if session_id is not None:
                    raise
                first = first or exc
        if first is not None:
            raise first

    async def _barrier(self, lane: _Lane) -> None:
        # Everything accepted so far settles in order: the newest queued event settles
        # last (with an empty queue, the newest accepted, in flight or settled).
        if lane.dead is not None:
            raise lane.dead
        target = lane.queue[-1] if lane.queue else lane.last
        if target is None or target.settled:
            lane.paused = None  # nothing left to retry: its producers were told
            lost, lane.lost = lane.lost, None
            if lost is not None:
                raise lost
            return
        retried: SessionLogError | None = None
        while not target.settled:
            if lane.dead is not None:
                raise lane.dead
            if lane.paused is not None:
                if retried is not None:
                    raise lane.paused  # its own cause (the OSError...) is kept
                retried, lane.paused = lane.paused, None
            self._start(lane)
            # Woken when the target settles or the lane pauses, whichever comes first.
            waiter = asyncio.get_running_loop().create_future()
            lane.waiters.add(waiter)
            if target.barriers is None:
                target.barriers = []
            target.barriers.append(waiter)
            try:
                await waiter
            finally:
                lane.waiters.discard(waiter)
        lost, lane.lost = lane.lost, None
        future = target.future
        exc = None if target.refused or future.cancelled() else future.exception()
        if exc is not None:
            raise exc
        if lost is not None:
            raise lost

    async def close(self) -> None:
        """Stop admission, flush every session, release every session it owns. Events
        that cannot be written are failed and dropped; the first failure is raised."""
        self._closing = True
        first: SessionLogError | None = None
        cancelled: asyncio.CancelledError | None = None
        try:
            for lane in list(self._lanes.values()):
                try:
                    if cancelled is not None:
                        raise cancelled  # no more waiting: settle and release the rest
                    await self.flush(lane.session_id)
                except (SessionLogError, asyncio.CancelledError) as exc:
                    failure: SessionLogError
                    if isinstance(exc, asyncio.CancelledError):
                        cancelled = exc  # raised once every session is released
                        failure = StoreClosed("write-behind closed (cancelled) before these events were written")
                    else:
                        failure = exc
                        first = first or exc
                    _fail(lane.queue, failure)
                    lane.queue.clear()
                    task = lane.task or self._group_task
                    if task is not None:
                        # A write may be in flight in its thread: let it finish and settle
                        # before the handle (its descriptor and its lock) goes away.
                        await _settled(task)
                if lane.handle is not None:
                    handle, lane.handle = lane.handle, None
                    with contextlib.suppress(SessionLogError):
                        await _settled(asyncio.get_running_loop().run_in_executor(self._executor, handle.close))
        finally:
            self._executor.shutdown(wait=False)
        if cancelled is not None:
            raise cancelled
        if first is not None:
            raise first

    async def __aenter__(self) -> WriteBehind:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class WriterSession:
    """One session seen through a :class:`WriteBehind`: durable appends, and reads of the
    durable log (``records``) for a step scope catching up with other producers."""

    def __init__(self, writer: WriteBehind, session_id: str) -> None:
        self.writer = writer
        self.session_id = session_id
        self.store = writer.store

    @property
    def last_seq(self) -> int | None:
        """The session's last durable seq, when this writer already owns it (else None)."""
        lane = self.writer._lanes.get(self.session_id)
        handle = None if lane is None else lane.handle
        if handle is None or (lane is not None and (lane.queue or lane.task is not None or lane in self.writer._ready)):
            return None
        return handle.last_seq

    async def append(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> int:
        """Append through the writer and wait until durable; returns the last seq. A
        paused session is retried first (:meth:`WriteBehind.flush`), so a step's recovery
        can still record after a failed checkpoint once the disk is back."""
        if self.writer.failure(self.session_id) is not None:
            await self.writer.flush(self.session_id)
        return await self.writer.append(self.session_id, events, expect_seq=expect_seq)

    def records(self, after_seq: int = 0) -> Iterator[Record]:
        """The session's durable records with seq > ``after_seq`` (blocking: a read)."""
        return self.store.read(self.session_id, after_seq=after_seq)


class _Refused(InvalidEvent):
    """The store raised something other than a SessionLogError before writing (an
    encoder's RecursionError...): the events are refused, as an InvalidEvent."""


def _read(event: Any, i: int) -> Any:
    """``event`` as a plain dict when it is another mapping (InvalidEvent when reading it
    fails); anything else as it is, for the store's checks to name."""
    if type(event) is dict or not isinstance(event, Mapping):
        return event
    try:
        return read_event(event)
    except RecordError as exc:
        raise InvalidEvent(f"event {i} of the batch: {exc.reason}") from exc.__cause__


def _encoded_size(events: list[Mapping[str, Any]]) -> int | None:
    """Bytes the events take encoded, plus the envelope: a batch's size before its seqs
    are known (at least what it takes); None when they cannot be encoded as they are
    (the caller checks them as the store does, which names the event at fault)."""
    try:
        return len(_encoder.encode(events)) + ENVELOPE_BYTES * len(events)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
        pass
    # Events that are other mappings (the store takes any Mapping) are sized as the store
    # encodes them: read into dicts.
    read = [_read(e, i) for i, e in enumerate(events)]
    try:
        return len(_encoder.encode(read)) + ENVELOPE_BYTES * len(events)
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError):
        return None


_encoder = msgspec.json.Encoder()

_decoder = msgspec.json.Decoder()
_raw_members = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _as_error(exc: BaseException) -> SessionLogError:
    if isinstance(exc, SessionLogError):
        return exc
    failure = AppendFailed(f"write failed: {type(exc).__name__}: {exc}")
    failure.__cause__ = exc
    return failure


INLINE_SPAN = 0.001
"""Seconds a lone producer's appends may run inline without letting the loop turn: a tight
loop of ``await append()`` still lets the loop poll for I/O and run due timers at least
this often (plus one append)."""


def _nothing_ready(loop: asyncio.AbstractEventLoop | None) -> bool:
    """True when ``loop`` is known to have no callback ready to run (the standard
    library's loops keep them in ``_ready``); False when it has or cannot tell, so the
    caller yields once and producers ready now can queue behind its write."""
    ready = getattr(loop, "_ready", None)
    return type(ready) is deque and not ready


@types.coroutine
def _yield_once() -> Iterator[None]:
    """Let the loop run what is ready (``asyncio.sleep(0)`` without its lookups)."""
    yield


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
        if not pending.settled:
            pending.settled = True
            if not pending.future.done():  # a cancelled future: its producer stopped waiting
                pending.future.set_result(end)
            if pending.barriers:
                _wake(pending.barriers)


def _refuse(pending: _Pending, exc: BaseException) -> None:
    pending.refused = True
    _fail([pending], exc if isinstance(exc, SessionLogError) else _as_error(exc))


def _fail(pending: Sequence[_Pending] | deque[_Pending], exc: BaseException) -> None:
    for p in pending:
        if not p.settled:
            p.settled = True
            if not p.future.done():
                p.future.set_exception(exc)
                p.future.exception()  # retrieved: the failure is also reported to on_error
            if p.barriers:
                _wake(p.barriers)


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
