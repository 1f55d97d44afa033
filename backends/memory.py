"""In-memory backend (``memory:``): the same contract, nothing durable. For runtimes' own
unit tests. Records are kept as the exact bytes the file backends would write."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from sessionlog.contract import (
    ImportCheck,
    InvalidEvent,
    InvalidSessionId,
    RepairReport,
    ScanResult,
    SequenceConflict,
    SessionExists,
    SessionLocked,
    SessionNotFound,
    StoreClosed,
    events_list,
    read_start,
    synthetic_lines,
)
from sessionlog.events import (
    Record,
    header_event,
    valid_session_id,
)
from sessionlog.scan import DEFAULT_LIMITS, Limits, encode_batch
from sessionlog.transcript import PendingCalls, crash_plan
from sessionlog.writer import WriteBehind


class MemorySession:
    """The owner of one in-memory session until closed."""

    def __init__(self, store: MemoryStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self._open = True

    @property
    def last_seq(self) -> int:
        return len(self.store._records(self.session_id))

    def append(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> int:
        if not self._open:
            raise StoreClosed(f"memory:{self.session_id}: session handle is closed")
        return self.store._append(self.session_id, events_list(events), expect_seq, owner=self)

    def records(self, after_seq: int = 0) -> Iterator[Record]:
        return self.store.read(self.session_id, after_seq)

    def close(self) -> None:
        if self._open:
            self._open = False
            self.store._release(self.session_id, self)

    def __enter__(self) -> MemorySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MemoryStore:
    """Sessions in a dict; one writer per session; same errors as the durable backends."""

    atomic_batches = True

    def __init__(self, *, limits: Limits = DEFAULT_LIMITS, lock_timeout: float = 10.0) -> None:
        self.url = "memory:"
        self.limits = limits
        self.lock_timeout = lock_timeout
        self._sessions: dict[str, list[Record]] = {}
        self._owners: dict[str, object] = {}
        self._cond = threading.Condition()
        self._closed = False

    def _check_id(self, session_id: str) -> None:
        if not valid_session_id(session_id):
            raise InvalidSessionId(
                f"invalid session id {session_id!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}, no '..'"
            )
        if self._closed:
            raise StoreClosed("memory: store is closed")

    def _records(self, session_id: str) -> list[Record]:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(f"memory:{session_id}: no such session") from None

    def _encode(self, events: Sequence[Mapping[str, Any]], first_seq: int) -> list[Record]:
        return [Record.from_line(line) for line in encode_batch(events, first_seq, self.limits)]

    def _encode_plan(self, events: Sequence[Mapping[str, Any]], first_seq: int) -> list[Record]:
        """A repair's synthetic records: never refused for their total size (the durable
        backends write them in several batches; here the list is extended at once)."""
        return [Record.from_line(line)
                for line in synthetic_lines(events, first_seq, record_limit=self.limits.record_limit)]

    def create(self, session_id: str, events: Sequence[Mapping[str, Any]] = ()) -> int:
        self._check_id(session_id)
        records = self._encode([header_event(session_id), *events_list(events)], 1)
        with self._cond:
            if session_id in self._sessions:
                raise SessionExists(f"memory:{session_id}: session already exists")
            self._sessions[session_id] = records
        return len(records)

    def import_session(self, session_id: str, records: Iterable[Record]) -> int:
        self._check_id(session_id)
        check = ImportCheck(session_id)
        copied = [Record.from_line(bytes(check(r).raw)) for r in records]
        if not copied:
            raise InvalidEvent(f"import of {session_id!r}: no records")
        with self._cond:
            if session_id in self._sessions:
                raise SessionExists(f"memory:{session_id}: session already exists")
            self._sessions[session_id] = copied
        return len(copied)

    def _acquire(self, session_id: str, owner: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            self._records(session_id)
            while self._owners.get(session_id) not in (None, owner):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SessionLocked(f"memory:{session_id}: another writer owns this session")
                self._cond.wait(remaining)
            self._owners[session_id] = owner

    def _release(self, session_id: str, owner: object) -> None:
        with self._cond:
            if self._owners.get(session_id) is owner:
                del self._owners[session_id]
                self._cond.notify_all()

    def _append(
        self, session_id: str, events: list[Mapping[str, Any]], expect_seq: int | None, *, owner: object
    ) -> int:
        with self._cond:
            if self._owners.get(session_id) is not owner:
                raise SessionLocked(f"memory:{session_id}: another writer owns this session")
            records = self._records(session_id)
            last = len(records)
            if expect_seq is not None and expect_seq != last:
                raise SequenceConflict(
                    f"memory:{session_id}: expected last seq {expect_seq}, found {last}",
                    expected=expect_seq, found=last,
                )
            records.extend(self._encode(events, last + 1))
            return len(records)

    def append(
        self, session_id: str, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None
    ) -> int:
        self._check_id(session_id)
        batch = events_list(events)
        owner = object()
        self._acquire(session_id, owner, self.lock_timeout)
        try:
            return self._append(session_id, batch, expect_seq, owner=owner)
        finally:
            self._release(session_id, owner)

    def session(
        self, session_id: str, *, repair: bool = False, create: bool = False, timeout: float = 0.0
    ) -> MemorySession:
        self._check_id(session_id)
        if create and session_id not in self._sessions:
            try:
                self.create(session_id)
            except SessionExists:
                pass
        if repair:
            self.repair(session_id)
        handle = MemorySession(self, session_id)
        self._acquire(session_id, handle, timeout)
        return handle

    def scan(self, session_id: str) -> ScanResult:
        self._check_id(session_id)
        with self._cond:
            records = list(self._records(session_id))
            owned = session_id in self._owners
        tracker = PendingCalls().feed_all(records)
        return ScanResult(
            session=session_id,
            path=None,
            record_count=len(records),
            last_seq=len(records),
            last_ts=records[-1].ts,
            stable_offset=sum(len(r.raw) + 1 for r in records),
            damage=None,
            open_turn=tracker.open_turn,
            open_step=tracker.open_step,
            unanswered_calls=[c.call_id for c in tracker.unanswered()],
            awaiting_approval=[c.call_id for c in tracker.awaiting()],
            suspended=tracker.suspended,
            owned=owned,
            tracker=tracker,
            # Read on access, like every backend: exactly seq 1..last_seq, or CorruptLog.
            _load=lambda: self.read(session_id),
            _last_raw=bytes(records[-1].raw),
        )

    def read(self, session_id: str, after_seq: int = 0) -> Iterator[Record]:
        self._check_id(session_id)
        after_seq = read_start(after_seq)
        records = list(self._records(session_id))
        if after_seq > len(records):
            raise SequenceConflict(
                f"memory:{session_id}: read after seq {after_seq}, but the log ends at seq {len(records)}",
                expected=after_seq, found=len(records),
            )
        return iter(records[after_seq:])

    def repair(
        self, session_id: str, *, force: bool = False, dry_run: bool = False, expire_approvals: bool = False
    ) -> RepairReport:
        self._check_id(session_id)
        owner = object()
        if dry_run:
            scan = self.scan(session_id)
            if scan.owned:
                return RepairReport(session_id, None, "refused", reason="a writer owns the session")
            plan = crash_plan(scan.tracker, expire_approvals=expire_approvals)
            appended = self._encode_plan(plan, scan.last_seq + 1) if plan else []
            return RepairReport(session_id, None, "repaired" if plan else "clean",
                                reason="open transcript" if plan else None, appended=list(appended))
        self._acquire(session_id, owner, 0.0)
        try:
            scan = self.scan(session_id)
            plan = crash_plan(scan.tracker, expire_approvals=expire_approvals)
            if not plan:
                return RepairReport(session_id, None, "clean")
            records = self._sessions[session_id]
            new = self._encode_plan(plan, len(records) + 1)
            records.extend(new)
            return RepairReport(session_id, None, "repaired", reason="open transcript", appended=list(new))
        finally:
            self._release(session_id, owner)

    def delete(self, session_id: str) -> None:
        self._check_id(session_id)
        owner = object()
        self._acquire(session_id, owner, self.lock_timeout)
        try:
            del self._sessions[session_id]
        finally:
            self._release(session_id, owner)

    def writer(self, **options: Any) -> WriteBehind:
        """Write-behind over this store (``async with store.writer() as w``): events are
        accepted at once and made durable in batches; see :class:`sessionlog.writer.WriteBehind`."""
        return WriteBehind(self, **options)

    def sessions(self) -> list[str]:
        return sorted(self._sessions)

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_url(url: str, **options: object) -> MemoryStore:
    """``memory:`` (a new, empty store each time)."""
    return MemoryStore(**options)  # type: ignore[arg-type]
