"""A session per file in a store directory: lock, publish, append, scan, repair.

The JSONL and Zstd backends differ only in how a batch of records becomes bytes and how
those bytes are scanned back (their :class:`Framing`); everything else, and every
durability step, is here once, on the core's primitives (``sessionlog.durable``).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from sessionlog.contract import (
    AppendFailed,
    CorruptLog,
    Damage,
    DamageKind,
    ImportCheck,
    InvalidEvent,
    InvalidSessionId,
    IOFailure,
    OwnershipLost,
    RepairReport,
    ScanResult,
    SequenceConflict,
    SessionExists,
    SessionLogError,
    SessionNotFound,
    StoreClosed,
    durable_batches,
    events_list,
    read_start,
    repair_reason,
    synthetic_lines,
)
from sessionlog.durable import (
    O_NOFOLLOW,
    OS,
    FileLock,
    FileSystem,
    durable_append,
    ensure_name_durable,
    ensure_store_dir,
    file_state,
    forget_name,
    fsync_dir,
    lock_is_held,
    log_fence,
    name_still_durable,
    parse_quarantine_name,
    printable,
    publish_new,
    quarantine_name,
    sweep_temps,
    track_log_fd,
    untrack_log_fd,
)
from sessionlog.events import (
    LOG_TRUNCATED,
    Record,
    RecordRun,
    header_event,
    valid_session_id,
)
from sessionlog.scan import DEFAULT_LIMITS, Limits, encode_batch, encode_block
from sessionlog.transcript import PendingCalls, crash_plan, truncation_marker
from sessionlog.writer import WriteBehind

READ_CHUNK = 1 << 20
_READ_RESTARTS = 3  # a reader starts over this often when the file moves under it
_SCAN_RETRIES = 3  # a scan looks again this often when it found damage while the file changed
# Where fsync/fdatasync (or F_FULLFSYNC) and flock give the guarantees docs/backends.md states.
_DURABLE_PLATFORMS = ("linux", "darwin")


class PrefixScanner(Protocol):
    """What a framing's scan returns: iterate for the prefix's records, then read the rest."""

    stable_offset: int
    last_seq: int
    last_ts: float
    count: int
    damage: Damage | None

    def __iter__(self) -> Iterator[Record]: ...

    def runs(self) -> Iterator[RecordRun]:
        """The prefix's records a run at a time (instead of iterating record by record)."""
        ...


class Framing(Protocol):
    """How one file backend lays records out in bytes."""

    suffix: str
    atomic_batches: bool

    def encode(self, lines: Sequence[bytes]) -> bytes:
        """The bytes appended for one batch of record lines (no newlines in ``lines``)."""
        ...

    def scan(
        self, read: Callable[[int], bytes], *, session_id: str | None, where: str, limits: Limits, owned: bool
    ) -> PrefixScanner:
        """A scanner over the whole file from offset 0."""
        ...

    def dropped_seqs(self, read: Callable[[int], bytes], limits: Limits) -> tuple[int, int] | None:
        """The first and last seq of the records that still decode in a quarantined tail
        read from its start (None when none do)."""
        ...

    def tail(
        self, fs: FileSystem, fd: int, size: int, *, session_id: str, where: str, limits: Limits
    ) -> tuple[int, float]:
        """Validate the header and the tail (last complete record, nothing after it) of an
        open file of ``size`` bytes; return the last ``(seq, ts)``. Raises CorruptLog."""
        ...


def fd_reader(fs: FileSystem, fd: int, start: int = 0) -> Callable[[int], bytes]:
    """Sequential ``read(n)`` over an open file from ``start``, through the I/O seam."""
    pos = start

    def read(n: int) -> bytes:
        nonlocal pos
        chunk = fs.pread(fd, n, pos)
        pos += len(chunk)
        return chunk

    return read


# Files whose rollback failed in this process: (st_dev, st_ino) -> why. Appends to them are
# refused by every store object in this process; a later process rescans.
_POISONED: dict[tuple[int, int], str] = {}


def poison(file: tuple[int, int], why: str) -> None:
    _POISONED[file] = why


def check_not_poisoned(file: tuple[int, int], path: str) -> None:
    why = _POISONED.get(file)
    if why is not None:
        raise AppendFailed(
            f"{path}: a rollback failed earlier in this process; appends and repairs are refused "
            f"until a new process rescans ({why})",
            outcome_unknown=True,
        )


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    """What changes when a file is written or cut: its size and its times."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _reread(damage: Damage, changed: bool, seen: tuple[DamageKind, int] | None) -> bool:
    """True when a reader should read the file again for ``damage``, found while the file
    ``changed`` under it: a repair may have cut the file and appends grown it back, and
    bytes read before the cut then run on into bytes written after it. Not for a write in
    flight (not damage), nor for damage already ``seen`` at that place (it is in the file)."""
    return changed and damage.kind.status is not None and (damage.kind, damage.offset) != seen


def _refuse_unnameable(report: RepairReport, session_id: str, suffix: str) -> None:
    """Raise before a repair changes anything when its ``log/truncated`` record cannot
    name the quarantine file: a log whose file name is not UTF-8."""
    if report.quarantine is not None and printable(report.quarantine) is not report.quarantine:
        raise SessionLogError(
            f"{printable(report.path or '')}: the file name is not valid UTF-8, and the log/truncated record "
            "repair writes must name its quarantine file (a JSON string); rename the log "
            f"(to {session_id}{suffix}, say) and repair again: nothing was changed"
        )


def _io_error(exc: OSError, path: str, what: str) -> SessionLogError:
    if isinstance(exc, FileNotFoundError):
        return SessionNotFound(f"{path}: no such session")
    return IOFailure(f"{path}: {what} failed: {exc.strerror or exc}")


class FileSession:
    """The single writer of one session file, for as long as it is open.

    Holds the session's flock; appends check that the path still names the open inode
    and that its size is the remembered end, then write and fdatasync. After a failed
    append the handle is unusable (open a new one)."""

    def __init__(self, store: FileStore, session_id: str, *, timeout: float, lock: FileLock | None = None) -> None:
        self.store = store
        self.session_id = session_id
        self.path = store.path_of(session_id)
        self._fs = store.fs
        self._fd: int | None = None
        self._failed: str | None = None
        self._grown = False  # appended to since the tail was last remembered (see close)
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._lock = lock if lock is not None else store.take_lock(session_id, timeout)
        try:
            self._open()
        except BaseException:
            self._lock.release()
            raise

    # -- state -------------------------------------------------------------------------

    def _open(self) -> None:
        fs = self._fs
        try:
            fd = fs.open(self.path, os.O_RDWR | os.O_APPEND | O_NOFOLLOW)
        except FileNotFoundError:
            raise SessionNotFound(f"{self.path}: no such session") from None
        except OSError as exc:
            raise _io_error(exc, self.path, "open") from exc
        track_log_fd(fd)
        try:
            st = fs.fstat(fd)
            self._file = (st.st_dev, st.st_ino)
            self._ino, self._end = st.st_ino, st.st_size
            check_not_poisoned(self._file, self.path)
            try:
                # Before the first append through this process is acknowledged, the
                # file's name must survive power loss too (its create may have died
                # before the directory fsync).
                ensure_name_durable(fs, self.store.directory, self.path, st)
            except OSError as exc:
                raise _io_error(exc, self.store.directory, "making the session's name durable") from exc
            cached = self.store._tails.get(self.session_id)
            if cached is not None and cached[0] == file_state(st):
                # This store wrote or validated exactly this file state under the lock.
                self._last_seq, self._last_ts = cached[1], cached[2]
            else:
                try:
                    self._last_seq, self._last_ts = self.store.framing.tail(
                        fs, fd, self._end, session_id=self.session_id, where=self.path, limits=self.store.limits
                    )
                except CorruptLog as exc:
                    raise self._as_scanned(exc) from None
                self._remember(st)
        except OSError as exc:
            untrack_log_fd(fd)
            fs.close(fd)
            raise _io_error(exc, self.path, "reading the tail") from exc
        except BaseException:
            untrack_log_fd(fd)
            fs.close(fd)
            raise
        self._fd = fd

    def _as_scanned(self, refused: CorruptLog) -> CorruptLog:
        """The refusal of a damaged tail as ``scan`` names the damage (its kind, its
        offset, and the repair it needs): the tail check sees only the last append's
        reach, so it cannot tell a corrupt tail from mid-log damage, nor torn bytes from
        a power loss's NULs. Its own finding stands when a scan finds no damage (a header
        or record over the limit, which scan refuses as not a session log)."""
        try:
            damage = self.store._scan(self.session_id, owned=False)[0].damage  # under the lock: nobody writes
        except SessionLogError:
            return refused
        if damage is None:
            return refused
        if damage.kind.needs_force:
            advice = (f"{damage.records_after} records that still decode lie after it: repair the session "
                      "with force (they are quarantined) or salvage it before appending")
        else:
            advice = "repair the session before appending"
        return CorruptLog(f"{self.path}: {damage.kind} at offset {damage.offset}: {damage.reason}; {advice}",
                          path=self.path, offset=damage.offset, kind=str(damage.kind))

    def _remember(self, st: os.stat_result) -> None:
        self.store._tails[self.session_id] = (file_state(st), self._last_seq, self._last_ts)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            untrack_log_fd(fd)
            try:
                self._fs.close(fd)
            except OSError:
                pass

    @property
    def last_seq(self) -> int:
        """The seq of the session's last durable record."""
        return self._last_seq

    @property
    def end(self) -> int:
        return self._end

    # -- writing -----------------------------------------------------------------------

    def append(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> int:
        """Append ``events`` as one durable batch; returns the last seq assigned.

        Durable on return. Raises SequenceConflict when ``expect_seq`` is not the last
        seq, InvalidEvent for an event over the limits, AppendFailed when the write or
        sync failed (the batch was rolled back; this handle is then closed)."""
        batch = events_list(events)
        with self._mutex:
            self._check_usable()
            # Under the lock: the path must still name the open file at its remembered end.
            try:
                st = self._fs.stat(self.path)
            except FileNotFoundError:
                raise SessionNotFound(f"{self.path}: session was deleted") from None
            except OSError as exc:
                raise _io_error(exc, self.path, "stat") from exc
            if st.st_ino != self._ino or st.st_size != self._end:
                # Nobody writes to a session while this handle holds its lock. The file was
                # replaced or changed all the same: by a copy of the same records (a compaction
                # by hand), which is fine, or by a writer without the lock (this handle's lock
                # file was removed, say), whose records this handle's owner never saw: then
                # what it knows of the session is stale, and nothing is written.
                known = (self._last_seq, self._last_ts)
                self._close_fd()
                self._open()
                if (self._last_seq, self._last_ts) != known:
                    lost = OwnershipLost(
                        f"{self.path}: another writer wrote to the log while this handle owned the session (it "
                        f"ended at seq {known[0]}, now at seq {self._last_seq}); nothing was written: close this "
                        "handle, then open the session again"
                    )
                    try:
                        self._lock.check()  # the likely cause, said as such
                    except OwnershipLost as exc:
                        lost = exc
                    except AppendFailed:
                        pass
                    self._failed = str(lost)
                    raise lost
            if expect_seq is not None and expect_seq != self._last_seq:
                raise SequenceConflict(
                    f"{self.path}: expected last seq {expect_seq}, found {self._last_seq}",
                    expected=expect_seq, found=self._last_seq,
                )
            if not batch:
                return self._last_seq
            data, n, last_ts = self.store.encode_framed(batch, self._last_seq + 1)
            return self._write(data, n, last_ts)

    def _write(self, data: bytes, n: int, last_ts: float) -> int:
        """Write one encoded batch durably. Nothing after the sync can fail.

        The write is fenced: it holds an exclusive ``flock`` on the log file's own
        descriptor (every writer of the file takes it) from the checks to the sync.
        Under it the session's lock file must still be the one this handle locked, and
        the file must still end where this handle left it: else another writer owns the
        session or wrote to it (its lock file was removed, say), and nothing is written
        (OwnershipLost) rather than a batch with seqs another writer has used, or a
        rollback that would cut its records."""
        assert self._fd is not None
        fs, fd = self._fs, self._fd
        self.store._tails.pop(self.session_id, None)
        try:
            with log_fence(fs, fd, self.path):
                self._fenced_checks()
                self._end = durable_append(fs, fd, data, self._end)
        except AppendFailed as exc:
            self._failed = str(exc)
            if exc.outcome_unknown:
                poison(self._file, str(exc))
            self._close_fd()  # after the fence is released on it
            raise
        self._last_seq += n
        self._last_ts = last_ts
        self._grown = True  # the tail is remembered when the handle closes: one fstat, not one per append
        return self._last_seq

    def _fenced_checks(self) -> None:
        """Under the log's fence: the lock file is still the one this handle locked, and
        the path still names the open file, ending where this handle's appends left it."""
        self._lock.check()
        try:
            named = self._fs.stat(self.path)
        except FileNotFoundError:
            raise OwnershipLost(f"{self.path}: the log was removed while this handle owned the session; "
                                "nothing was written") from None
        except OSError as exc:
            raise AppendFailed(f"{self.path}: stat failed before the append: {exc.strerror or exc}; "
                               "nothing was written") from exc
        if (named.st_ino, named.st_size) != (self._ino, self._end):
            what = "replaced" if named.st_ino != self._ino else f"{named.st_size} bytes long"
            raise OwnershipLost(
                f"{self.path}: the log was {what} where this handle's appends left it at {self._end} bytes: "
                "another writer wrote to it while this handle owned the session; nothing was written: close "
                "this handle, then open the session again"
            )

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise StoreClosed(f"{self.path}: this handle failed earlier ({self._failed}); open a new one")
        if self._fd is None or not self._lock.held:
            raise StoreClosed(f"{self.path}: session handle is closed")
        if _POISONED:
            check_not_poisoned(self._file, self.path)

    def records(self, after_seq: int = 0) -> Iterator[Record]:
        """Stream the session's records with seq > ``after_seq``."""
        return self.store.read(self.session_id, after_seq)

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Release the lock (after an append in flight on another thread has finished).
        Closing never raises over an exception already in flight. In a forked child, the
        handle's descriptors are dropped without waiting: an append that was in flight in
        the parent's thread at the fork holds the child's copy of the mutex forever."""
        if os.getpid() != self._pid:
            self._close_fd()
            self._lock.release()
            return
        with self._mutex:
            if self._grown and self._fd is not None and self._failed is None:
                # The next open of the session in this process reuses this tail: only when
                # the file is as this handle's appends left it and the lock is still on the
                # file its path names (no other writer can have written meanwhile).
                try:
                    st = self._fs.fstat(self._fd)
                    self._lock.check()
                except (OSError, SessionLogError):
                    pass  # no cache: the next open validates the tail and the name
                else:
                    if (st.st_ino, st.st_size) == (self._ino, self._end):
                        self._remember(st)
                        name_still_durable(self.path, st)
            self._close_fd()
            self._lock.release()

    def __enter__(self) -> FileSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FileStore:
    """The event store over a directory of session files with one :class:`Framing`."""

    def __init__(
        self,
        directory: str,
        framing: Framing,
        *,
        scheme: str,
        fs: FileSystem = OS,
        limits: Limits = DEFAULT_LIMITS,
        lock_timeout: float = 10.0,
        create_dir: bool = True,
        unsafe: bool = False,
    ) -> None:
        if not unsafe and sys.platform not in _DURABLE_PLATFORMS:
            raise SessionLogError(
                f"{directory}: sessionlog cannot promise durable appends on {sys.platform}; "
                "pass unsafe=True to write anyway"
            )
        self.directory = os.path.abspath(directory)
        self.framing = framing
        self.fs = fs
        self.limits = limits
        self.lock_timeout = lock_timeout
        self.url = f"{scheme}:{directory}"
        self.atomic_batches = framing.atomic_batches
        # A framing with ``encode_block`` (JSONL, Zstd) takes a batch's JSONL bytes as encoded.
        self._encode_block: Callable[[bytes], bytes] | None = getattr(framing, "encode_block", None)
        self._tails: dict[str, tuple[tuple[int, int, int, int, int], int, float]] = {}
        # Sessions kept in a file not named <id><suffix>: a copied or renamed log opened by
        # its header (sessionlog.targets); its quarantines are named after that file.
        self.file_names: dict[str, str] = {}
        self._closed = False
        if create_dir:
            try:
                ensure_store_dir(fs, self.directory)
                sweep_temps(fs, self.directory)
            except OSError as exc:
                raise IOFailure(f"{self.directory}: cannot open store: {exc.strerror or exc}") from exc

    # -- names -------------------------------------------------------------------------

    def check_id(self, session_id: str) -> None:
        """Raise InvalidSessionId for a bad id, StoreClosed after close()."""
        if not valid_session_id(session_id):
            raise InvalidSessionId(
                f"invalid session id {session_id!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}, no '..'"
            )
        if self._closed:
            raise StoreClosed(f"{self.url}: store is closed")

    def file_name(self, session_id: str) -> str:
        return self.file_names.get(session_id) or session_id + self.framing.suffix

    def path_of(self, session_id: str) -> str:
        return os.path.join(self.directory, self.file_name(session_id))

    def lock_path_of(self, session_id: str) -> str:
        return os.path.join(self.directory, f".{session_id}.lock")

    def writer(self, **options: Any) -> WriteBehind:
        """Write-behind over this store (``async with store.writer() as w``): events are
        accepted at once and made durable in batches; see :class:`sessionlog.writer.WriteBehind`."""
        return WriteBehind(self, **options)

    def sessions(self) -> list[str]:
        """The ids of every session in the store, sorted."""
        suffix = self.framing.suffix
        try:
            names = self.fs.listdir(self.directory)
        except OSError as exc:
            raise IOFailure(f"{self.directory}: cannot list: {exc.strerror or exc}") from exc
        out = []
        for name in names:
            if name.endswith(suffix) and not name.startswith("."):
                sid = name[: -len(suffix)]
                if valid_session_id(sid):
                    out.append(sid)
        return sorted(out)

    def quarantines(self, session_id: str) -> list[str]:
        """File names of the session's quarantined tails, oldest first."""
        log_name = self.file_name(session_id)
        try:
            names = self.fs.listdir(self.directory)
        except OSError as exc:
            raise IOFailure(f"{self.directory}: cannot list: {exc.strerror or exc}") from exc
        return sorted(n for n in names if parse_quarantine_name(log_name, n) is not None)

    # -- encoding ----------------------------------------------------------------------

    def encode_batch(self, events: Sequence[Mapping[str, Any]], first_seq: int) -> list[bytes]:
        """Record lines for ``events`` with seq from ``first_seq``, within the limits."""
        return encode_batch(events, first_seq, self.limits)

    def encode_framed(self, events: Sequence[Mapping[str, Any]], first_seq: int) -> tuple[bytes, int, float]:
        """The bytes one append of ``events`` (seq from ``first_seq``) adds to a log in
        this store's framing, the number of records and the last record's ``ts``. Raises
        InvalidEvent for an event at fault or a batch over the batch limit.

        A framing with ``encode_block`` (JSONL, Zstd) takes the batch's JSONL bytes as they
        were encoded, without a copy; any other is given the record lines."""
        block, n, last_ts = encode_block(events, first_seq, self.limits)
        encode_block_ = self._encode_block
        if encode_block_ is not None:
            data = encode_block_(block)
        else:
            lines = block.split(b"\n")
            lines.pop()
            data = self.framing.encode(lines)
        if len(data) > self.limits.batch_limit:
            raise InvalidEvent(
                f"batch of {len(data)} bytes exceeds the batch limit of {self.limits.batch_limit} bytes; split it"
            )
        return data, n, last_ts

    # -- the contract ------------------------------------------------------------------

    def create(self, session_id: str, events: Sequence[Mapping[str, Any]] = ()) -> int:
        """Publish a new session: header (seq 1) and ``events``, durable on return."""
        self.check_id(session_id)
        batch = [header_event(session_id), *events_list(events)]
        data, n, _ = self.encode_framed(batch, 1)
        self._tails.pop(session_id, None)
        try:
            publish_new(self.fs, self.directory, self.file_name(session_id), [data])
        except FileExistsError:
            raise SessionExists(f"{self.path_of(session_id)}: session {session_id!r} already exists") from None
        except OSError as exc:
            raise IOFailure(f"{self.path_of(session_id)}: create failed: {exc.strerror or exc}") from exc
        return n

    def import_session(self, session_id: str, records: Iterable[Record]) -> int:
        """Publish a new session of exactly ``records`` (bytes verbatim), all or nothing:
        the file is written under a temp name, fsynced, then linked into place."""
        self.check_id(session_id)
        check = ImportCheck(session_id)
        self._tails.pop(session_id, None)
        try:
            publish_new(self.fs, self.directory, self.file_name(session_id),
                        self._batches(map(check, records)))
        except FileExistsError:
            raise SessionExists(f"{self.path_of(session_id)}: session {session_id!r} already exists") from None
        except OSError as exc:
            raise IOFailure(f"{self.path_of(session_id)}: import failed: {exc.strerror or exc}") from exc
        if check.last_seq == 0:
            raise InvalidEvent(f"import of {session_id!r}: no records")  # pragma: no cover - publish wrote nothing
        return check.last_seq

    def _batches(self, records: Iterable[Record]) -> Iterator[bytes]:
        """Group records into batches of at most the batch limit (for Zstd: frames of up to
        1 MiB of records, what ``compact`` writes). The header goes alone in the first
        batch: damage anywhere later (a Zstd frame failing its checksum) is then damage at
        its offset, never a file without a header."""
        lines: list[bytes] = []
        size = 0
        limit = self.limits.batch_limit
        header = True  # lines hold only the header so far
        for record in records:
            if lines and (header or size + len(record.raw) + 1 > limit):
                yield self.framing.encode(lines)
                lines, size, header = [], 0, False
            lines.append(record.raw)
            size += len(record.raw) + 1
        if lines:
            yield self.framing.encode(lines)

    def session(
        self, session_id: str, *, repair: bool = False, create: bool = False, timeout: float = 0.0
    ) -> FileSession:
        """Own the session until the handle is closed (SessionLocked if another writer does).

        ``create=True`` publishes the session first if it does not exist; ``repair=True``
        repairs a damaged tail and closes an open transcript first (never with force)."""
        self.check_id(session_id)
        if create:
            try:
                self.create(session_id)
            except SessionExists:
                pass
        if not repair:
            return FileSession(self, session_id, timeout=timeout)
        # Repair and open under one hold of the lock: no other writer can get in between.
        lock = self.take_lock(session_id, timeout)
        try:
            report = self._repair_locked(session_id, force=False, lock=lock)
            if report.status == "refused":
                raise CorruptLog(
                    f"{self.path_of(session_id)}: {report.reason}",
                    path=self.path_of(session_id),
                    offset=report.damage.offset if report.damage else None,
                    kind=str(report.damage.kind) if report.damage else None,
                )
            return FileSession(self, session_id, timeout=timeout, lock=lock)
        except BaseException:
            lock.release()
            raise

    def take_lock(self, session_id: str, timeout: float, *, missing_ok: bool = False) -> FileLock:
        """Own the session's lock file (SessionLocked if another writer holds it).

        A session whose log does not exist is SessionNotFound before its lock file is
        made: lock files are never removed (see :class:`FileLock`), so one made for a
        misspelled id would stay. ``missing_ok``: the log may be gone (a delete finishing
        what a killed one left)."""
        if not missing_ok:
            path = self.path_of(session_id)
            try:
                self.fs.stat(path)
            except FileNotFoundError:
                raise SessionNotFound(f"{path}: no such session") from None
            except OSError as exc:
                raise _io_error(exc, path, "stat") from exc
        lock = FileLock(self.fs, self.lock_path_of(session_id))
        try:
            lock.acquire(timeout)
        except OSError as exc:
            raise _io_error(exc, lock.path, "taking the lock") from exc
        return lock

    def _owned(self, session_id: str) -> bool:
        path = self.lock_path_of(session_id)
        try:
            return lock_is_held(self.fs, path)
        except OSError as exc:
            raise _io_error(exc, path, "probing the lock") from exc

    def append(
        self, session_id: str, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None
    ) -> int:
        """One-shot durable append: takes the lock (waiting up to ``lock_timeout``) for this call."""
        self.check_id(session_id)
        batch = events_list(events)
        with FileSession(self, session_id, timeout=self.lock_timeout) as handle:
            return handle.append(batch, expect_seq=expect_seq)

    def open_read(self, session_id: str) -> int:
        """A read-only descriptor of the session file (O_NOFOLLOW); SessionNotFound, IOFailure."""
        path = self.path_of(session_id)
        try:
            return self.fs.open(path, os.O_RDONLY | O_NOFOLLOW)
        except OSError as exc:
            raise _io_error(exc, path, "open") from exc

    def scan(self, session_id: str) -> ScanResult:
        """Validate every record (never writes, never creates a lock file)."""
        self.check_id(session_id)
        owned = self._owned(session_id)
        result, changed = self._scan(session_id, owned=owned)
        if result.damage is not None and result.damage.kind is DamageKind.TORN:
            # A writer may have started (its write is in flight) or finished (the line is
            # whole now) while this scan read: look again with a fresh probe.
            result, changed = self._scan(session_id, owned=self._owned(session_id))
        seen = None
        for _ in range(_SCAN_RETRIES):
            damage = result.damage
            if damage is None or not _reread(damage, changed, seen):
                break
            seen = (damage.kind, damage.offset)
            result, changed = self._scan(session_id, owned=self._owned(session_id))
        return result

    def _scan(self, session_id: str, *, owned: bool) -> tuple[ScanResult, bool]:
        """A scan of the session's file, and whether the file changed while it was read."""
        path = self.path_of(session_id)
        fd = self.open_read(session_id)
        tracker = PendingCalls()
        named: set[str] = set()
        run = None
        try:
            before = _stamp(self.fs.fstat(fd))
            scanner = self.framing.scan(
                fd_reader(self.fs, fd), session_id=session_id, where=path, limits=self.limits, owned=owned
            )
            for run in scanner.runs():
                tracker.feed_run(run)
                if LOG_TRUNCATED in run.types:
                    for record in run.records():
                        if record.type == LOG_TRUNCATED:
                            q = record.get("quarantine")
                            if isinstance(q, str):
                                named.add(q)
            changed = _stamp(self.fs.fstat(fd)) != before
        except OSError as exc:
            raise _io_error(exc, path, "read") from exc
        finally:
            self.fs.close(fd)
        unmarked = [q for q in self.quarantines(session_id) if q not in named]
        result = ScanResult.of_prefix(
            session_id, path, scanner, tracker, stable_offset=scanner.stable_offset, owned=owned,
            unmarked_quarantines=unmarked, load=lambda: self.read_prefix(session_id),
            last_raw=run.last_raw() if run is not None else None,
        )
        return result, changed

    def read(self, session_id: str, after_seq: int = 0) -> Iterator[Record]:
        """Stream the durable prefix's records with seq > ``after_seq``.

        Raises SequenceConflict (at the end) when ``after_seq`` lies beyond the log's
        last record: the reader saw records that are no longer there."""
        self.check_id(session_id)
        return self._read(session_id, read_start(after_seq), whole=True)

    def read_prefix(self, session_id: str, after_seq: int = 0) -> Iterator[Record]:
        """:meth:`read` that ends quietly at damage needing ``--force`` (see
        :func:`sessionlog.contract.read_prefix`)."""
        self.check_id(session_id)
        return self._read(session_id, read_start(after_seq), whole=False)

    def _read(self, session_id: str, after_seq: int, *, whole: bool) -> Iterator[Record]:
        path = self.path_of(session_id)
        last = after_seq
        seen = None
        for _ in range(_READ_RESTARTS):
            fd = self.open_read(session_id)
            try:
                st = self.fs.fstat(fd)
                ino, before = st.st_ino, _stamp(st)
                scanner = self.framing.scan(
                    fd_reader(self.fs, fd), session_id=session_id, where=path, limits=self.limits, owned=True
                )
                for record in scanner:
                    if record.seq > last:
                        last = record.seq
                        yield record
                damage = scanner.damage
                if damage is None:
                    break
                changed = _stamp(self.fs.fstat(fd)) != before
                if not _reread(damage, changed, seen) and not self._moved(path, ino, damage.offset + damage.length):
                    break
                seen = (damage.kind, damage.offset)
                # The file shrank, was replaced or changed under this reader (repair,
                # compact): never join bytes across that EOF; start over after the last
                # record given.
            except OSError as exc:
                raise _io_error(exc, path, "read") from exc
            finally:
                self.fs.close(fd)
        damage = scanner.damage
        if whole and damage is not None and damage.kind.needs_force:
            # Records that still decode lie after the damage: what was given is not the whole
            # history, and a caller must not take it for that (a model fed it, a resume from it).
            raise CorruptLog(
                f"{path}: {damage.kind} at offset {damage.offset}: read stopped at seq {scanner.last_seq}; "
                f"{damage.records_after} decodable records after the damage were not read ({damage.reason}); "
                "see `sessionlog scan`, then repair with force or salvage",
                path=path, offset=damage.offset, kind=str(damage.kind),
            )
        if after_seq > scanner.last_seq:
            raise SequenceConflict(
                f"{path}: read after seq {after_seq}, but the log ends at seq {scanner.last_seq}",
                expected=after_seq, found=scanner.last_seq,
            )

    def _moved(self, path: str, ino: int, seen: int) -> bool:
        """True when ``path`` is no longer the file a reader read ``seen`` bytes of: it was
        replaced, or it shrank."""
        try:
            st = self.fs.stat(path)
        except FileNotFoundError:
            return False
        return st.st_ino != ino or st.st_size < seen

    def repair(
        self, session_id: str, *, force: bool = False, dry_run: bool = False, expire_approvals: bool = False
    ) -> RepairReport:
        """Quarantine and cut a damaged tail, then close the open transcript, each step
        durable, under the lock (SessionLocked while a writer owns the session).

        ``mid-log`` and ``seq-break`` are refused (status "refused") unless ``force``.
        A second repair appends nothing. ``dry_run`` reports without writing (and
        without taking the lock)."""
        self.check_id(session_id)
        if dry_run or not self._lock_exists(session_id):
            # A dry run takes no lock. Without a lock file nobody owns the session (a writer
            # makes the file first) and taking the lock would create it: a repair with
            # nothing to write (clean, refused, no such session) answers from this scan
            # and leaves the directory as it was.
            if dry_run and self._owned(session_id):
                return RepairReport(session_id, self.path_of(session_id), "refused",
                                    reason="a writer owns the session")
            report = self._repair_plan(self._scan(session_id, owned=False)[0], force=force,
                                       expire_approvals=expire_approvals)
            if dry_run or report.status != "repaired":
                return report
            _refuse_unnameable(report, session_id, self.framing.suffix)
        lock = self.take_lock(session_id, 0.0)
        try:
            return self._repair_locked(session_id, force=force, lock=lock, expire_approvals=expire_approvals)
        finally:
            lock.release()

    def _lock_exists(self, session_id: str) -> bool:
        path = self.lock_path_of(session_id)
        try:
            self.fs.stat(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise _io_error(exc, path, "probing the lock") from exc
        return True

    def _repair_plan(self, scan: ScanResult, *, force: bool, expire_approvals: bool = False) -> RepairReport:
        path = scan.path
        damage = scan.damage
        report = RepairReport(scan.session, path, "clean", damage=damage)
        if damage is not None and damage.kind.needs_force and not force:
            report.status = "refused"
            report.reason = damage.refusal()
            return report
        events: list[dict[str, Any]] = []
        quarantine = None
        for name in scan.unmarked_quarantines:
            marker = self._marker_for_orphan(scan.session, name, scan.last_ts)
            if damage is not None and (marker["offset"], marker["dropped_bytes"]) == (damage.offset, damage.length):
                quarantine = name  # an earlier repair published this tail, then stopped before its cut
            else:
                events.append(marker)
        if damage is not None:
            if quarantine is None:
                quarantine = quarantine_name(self.file_name(scan.session), damage.offset, str(damage.kind))
                report.publish_quarantine = True
            events.append(
                truncation_marker(
                    offset=damage.offset, dropped_bytes=damage.length, reason=str(damage.kind),
                    # A name that is not UTF-8 cannot be JSON text: the plan (a dry run, a
                    # view) shows it escaped; a repair refuses it (_refuse_unnameable).
                    quarantine=printable(quarantine),
                    ts=scan.last_ts, dropped_seqs=damage.dropped_seqs,
                )
            )
            report.truncated_bytes = damage.length
            report.quarantine = os.path.join(self.directory, quarantine)
        markers = len(events)
        events.extend(crash_plan(scan.tracker, expire_approvals=expire_approvals))
        if not events:
            return report
        report.status = "repaired"
        report.reason = repair_reason(damage, unmarked=bool(scan.unmarked_quarantines),
                                      transcript=len(events) > markers)
        lines = synthetic_lines(events, scan.last_seq + 1, record_limit=self.limits.record_limit)
        report.appended = [Record.from_line(line) for line in lines]
        return report

    def _marker_for_orphan(self, session_id: str, name: str, ts: float) -> dict[str, Any]:
        """The marker that a repair interrupted between truncate and append did not write:
        the quarantine's name carries the cut's offset and kind, its bytes the seqs of
        the records it holds (``dropped_seqs``, as the interrupted repair's scan saw them)."""
        parsed = parse_quarantine_name(self.file_name(session_id), name)
        offset, reason = parsed if parsed is not None else (0, "unknown")
        path = os.path.join(self.directory, name)
        try:
            fd = self.fs.open(path, os.O_RDONLY | O_NOFOLLOW)
            try:
                size = self.fs.fstat(fd).st_size
                dropped = self.framing.dropped_seqs(fd_reader(self.fs, fd), self.limits)
            finally:
                self.fs.close(fd)
        except OSError as exc:
            raise _io_error(exc, path, "reading the quarantine") from exc
        return truncation_marker(offset=offset, dropped_bytes=size, reason=reason, quarantine=name, ts=ts,
                                 dropped_seqs=dropped)

    def _repair_locked(self, session_id: str, *, force: bool, lock: FileLock,
                       expire_approvals: bool = False) -> RepairReport:
        scan, _ = self._scan(session_id, owned=False)  # under the lock: nobody writes meanwhile
        report = self._repair_plan(scan, force=force, expire_approvals=expire_approvals)
        if report.status != "repaired":
            return report
        _refuse_unnameable(report, session_id, self.framing.suffix)
        fs = self.fs
        path = self.path_of(session_id)
        damage = scan.damage
        try:
            fd = fs.open(path, os.O_RDWR | os.O_APPEND | O_NOFOLLOW)
        except OSError as exc:
            raise _io_error(exc, path, "open") from exc
        track_log_fd(fd)  # it will carry the fence: a child forked from now on must not keep it
        try:
            # Fenced as an append is (FileSession._write): holding the log file's own lock,
            # the file must be as the scan read it, or another writer wrote to it (its lock
            # file was removed, say) and nothing is cut or appended.
            with log_fence(fs, fd, path):  # released before the descriptor is closed
                lock.check()  # the repair's lock file is still the one it locked
                st = fs.fstat(fd)
                scanned = damage.offset + damage.length if damage is not None else scan.stable_offset
                if st.st_size != scanned:
                    raise OwnershipLost(
                        f"{path}: the log is {st.st_size} bytes where the repair's scan read {scanned}: another "
                        "writer wrote to it while the repair held the session's lock; nothing was written"
                    )
                check_not_poisoned((st.st_dev, st.st_ino), path)
                ensure_name_durable(fs, self.directory, path, st)
                self._tails.pop(session_id, None)
                end = scan.stable_offset
                if damage is not None:
                    assert report.quarantine is not None
                    if report.publish_quarantine:
                        # 1. The tail is published under its quarantine name: after this it
                        #    survives power loss on its own, before a byte of the log is cut.
                        publish_new(
                            fs, self.directory, os.path.basename(report.quarantine),
                            _chunks(fs, fd, damage.offset, damage.offset + damage.length),
                        )
                    # 2. The log is cut back to its stable prefix (durable on return).
                    try:
                        fs.ftruncate(fd, damage.offset)
                    except OSError as exc:
                        if report.publish_quarantine:
                            # Nothing was cut (an append-only file, say): the copy just
                            # published is withdrawn, and the failed repair changed nothing.
                            fs.unlink(report.quarantine)
                            fsync_dir(fs, self.directory)
                        raise IOFailure(f"{path}: repair failed cutting the log at offset {damage.offset}: "
                                        f"{exc.strerror or exc}; the log was left as it was") from exc
                    try:
                        fs.fsync(fd)
                    except OSError as exc:
                        raise IOFailure(
                            f"{path}: repair failed after quarantining the tail in {report.quarantine} "
                            f"(the next repair names it): fsync: {exc.strerror or exc}"
                        ) from exc
                # 3. Marker, synthetic results and closers, in that order, in durable batches
                #    of at most the batch limit: a crash between two leaves a clean log whose
                #    next repair answers what is still unanswered and closes what is open.
                for batch in durable_batches([r.raw for r in report.appended], self.limits.batch_limit):
                    try:
                        end = durable_append(fs, fd, self.framing.encode(batch), end)
                    except AppendFailed as exc:
                        if exc.outcome_unknown:
                            poison((st.st_dev, st.st_ino), str(exc))
                        raise
        except OSError as exc:
            raise IOFailure(f"{path}: repair failed: {exc.strerror or exc}") from exc
        finally:
            untrack_log_fd(fd)
            fs.close(fd)
        return report

    def delete(self, session_id: str) -> None:
        """Remove the session and its quarantine files durably (SessionLocked if owned)."""
        self.check_id(session_id)
        path = self.path_of(session_id)
        lock = self.take_lock(session_id, self.lock_timeout, missing_ok=bool(self.quarantines(session_id)))
        self._tails.pop(session_id, None)
        try:
            # The quarantines first, the log last: a delete killed halfway leaves the
            # session (which a second delete removes), never quarantines without their log
            # for the next session of this id to take for its own. One a killed delete
            # left so (before this order) goes with the next delete of the id.
            leftovers = self.quarantines(session_id)
            for name in leftovers:
                self.fs.unlink(os.path.join(self.directory, name))
            try:
                st = self.fs.stat(path)
                self.fs.unlink(path)
                _POISONED.pop((st.st_dev, st.st_ino), None)  # the inode may be reused by a new session
                forget_name(path)
            except FileNotFoundError:
                if not leftovers:
                    raise SessionNotFound(f"{path}: no such session") from None
            fsync_dir(self.fs, self.directory)  # the removal survives power loss
        except OSError as exc:
            raise IOFailure(f"{path}: delete failed: {exc.strerror or exc}") from exc
        finally:
            lock.release()

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunks(fs: FileSystem, fd: int, start: int, stop: int) -> Iterator[bytes]:
    pos = start
    while pos < stop:
        chunk = fs.pread(fd, min(READ_CHUNK, stop - pos), pos)
        if not chunk:
            raise OSError(errno.EIO, "file shrank while quarantining its tail")
        pos += len(chunk)
        yield chunk
