"""Undo a repair: put a session's quarantined bytes back where the repair cut them.

A repair publishes the tail it cuts as a quarantine file, truncates the log at the
stable offset and appends its ``log/truncated`` marker and synthetic records there. The
log before the repair is therefore the repaired log's first ``offset`` bytes followed by
the quarantine's bytes. :func:`restore` rebuilds exactly that, for the latest repair of a
file-store session (JSONL or Zstd), and refuses whenever it cannot be done without loss.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .contract import IOFailure, SessionLocked, SessionLogError, read_prefix
from .durable import O_NOFOLLOW, fsync_dir, log_fence, publish_replace, track_log_fd, untrack_log_fd
from .events import LOG_TRUNCATED

CHUNK = 1 << 20


class RestoreRefused(SessionLogError):
    """The quarantined bytes cannot be put back without losing something (records were
    appended after the repair, the quarantine is missing, the prefix is not what the
    repair left): nothing was changed."""


@dataclass(slots=True)
class RestoreReport:
    """What ``restore`` did to one session: ``status`` "restored" (the log is again what
    it was before its latest repair; the quarantine file was renamed ``*.restored``),
    "nothing" (no repair of this session quarantined anything) or "refused" (``reason``;
    nothing changed). ``restored_bytes`` is the quarantine's length, ``removed_records``
    the repair's own records taken out."""

    session: str
    path: str | None
    status: str
    reason: str | None = None
    quarantine: str | None = None
    offset: int | None = None
    restored_bytes: int = 0
    removed_records: int = 0

    @property
    def exit_code(self) -> int:
        return {"restored": 0, "nothing": 0, "locked": 5}.get(self.status, 4)

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "path": self.path, "status": self.status, "reason": self.reason,
                "quarantine": self.quarantine, "offset": self.offset, "restored_bytes": self.restored_bytes,
                "removed_records": self.removed_records}


def restore(store: Any, session_id: str, *, dry_run: bool = False) -> RestoreReport:
    """Restore ``session_id`` of a file store to what it was before its latest repair.

    Under the session's lock (SessionLocked while a writer owns it). Refuses, changing
    nothing, unless every record from the repair's ``log/truncated`` marker to the end is
    one the repair wrote (``synthetic``) and the log before the repair's batch (its
    marker, after the markers of stopped repairs it finished) is exactly the durable
    prefix the repair cut at. The new log is published atomically (temp file,
    fsync, rename, directory fsync); then the quarantine is renamed ``<name>.restored``
    (a crash in between leaves a log whose damaged tail and quarantine the next repair
    recognizes). ``dry_run`` checks everything and writes nothing, not even the lock
    file: it probes the lock (SessionLocked while a writer owns it) instead of taking it;
    a restore with nothing to do, or refused, answers the same way. Raises RestoreRefused
    for a store that is not a file store, IOFailure."""
    if not hasattr(store, "framing"):
        raise RestoreRefused(f"{store.url}: restore works on file stores (jsonl:, zstd:); on SQL stores "
                             "the quarantined rows are in the sessionlog_quarantine table")
    # Probe the lock, never create its file: a dry run, and a restore with nothing to do or
    # refused (the answer a look without the lock gives), leave every byte and name as
    # they were (a read-only file system included); only a restore about to write locks.
    if store._owned(session_id):
        raise SessionLocked(f"{store.path_of(session_id)}: a writer owns session {session_id!r}")
    looked = _restore_locked(store, session_id, True)
    if dry_run or looked.status != "restored":
        return looked
    lock = store.take_lock(session_id, 0.0)
    try:
        return _restore_locked(store, session_id, dry_run, lock)
    finally:
        lock.release()


def _restore_locked(store: Any, sid: str, dry_run: bool, lock: Any = None) -> RestoreReport:
    path = store.path_of(sid)
    report = RestoreReport(sid, path, "nothing")
    marker = None  # the latest repair's marker
    markers: list[Any] = []  # the markers after the latest record no repair wrote
    last_seq = 0
    unsynthetic = None  # the latest record no repair wrote
    for record in read_prefix(store, sid):
        last_seq = record.seq
        if record.type == LOG_TRUNCATED and isinstance(record.get("quarantine"), str):
            marker = record
            markers.append(record)
        elif record.get("synthetic") is not True:
            unsynthetic = record
            markers = []
    if marker is None:
        report.reason = "no repair of this session quarantined anything"
        return report
    report.offset = offset = marker["offset"]
    if not markers:
        report.quarantine = _quarantine(store, marker)
        return _refused(report, f"record {unsynthetic.seq} ({unsynthetic.type}) was appended after the repair "
                        f"that cut at offset {offset}: restoring would lose it")
    fs = store.fs
    fd = store.open_read(sid)
    track_log_fd(fd)  # it will carry the fence: a child forked from now on must not keep it
    q_fds: list[int] = []
    try:
        st = fs.fstat(fd)
        scanner = store.framing.scan(_bounded(fs, fd, offset), session_id=sid, where=path,
                                     limits=store.limits, owned=False)
        for _ in scanner:
            pass
        # The latest repair's batch starts at the offset it cut at: its marker (after the
        # markers of earlier repairs it finished: their quarantines published and their cuts
        # made, their markers not yet durable when they stopped), then results and closers;
        # every record after the offset is one a repair wrote.
        batch = [m for m in markers if m.seq > scanner.last_seq]
        if (scanner.damage is not None or scanner.stable_offset != offset or not batch
                or (unsynthetic is not None and unsynthetic.seq > scanner.last_seq)):
            report.quarantine = _quarantine(store, marker)
            return _refused(report, f"the log's first {offset} bytes are not the prefix the repair left "
                            f"(records before its batch; its marker is seq {marker.seq}), or records a "
                            "writer appended follow them: restoring would lose them")
        # Finished repairs that cut at this very offset had cut there first: the bytes there
        # before any repair are the oldest quarantine's; the newer ones hold what a stopped
        # repair had begun to write after its cut (its own output, undone with it).
        undone = [m for m in batch if m["offset"] == offset] if batch[0]["offset"] == offset else [marker]
        report.quarantine = _quarantine(store, undone[0])
        report.removed_records = last_seq - scanner.last_seq
        for m in undone:
            try:
                q_fds.append(fs.open(_quarantine(store, m), os.O_RDONLY | O_NOFOLLOW))
            except FileNotFoundError:
                return _refused(report, f"the quarantine {m['quarantine']} named by the repair's marker "
                                f"(seq {m.seq}) is gone")
            except OSError as exc:
                raise IOFailure(f"{m['quarantine']}: cannot read the quarantine: {exc.strerror or exc}") from exc
            q_size = fs.fstat(q_fds[-1]).st_size
            if q_size != m.get("dropped_bytes", q_size):
                return _refused(report, f"the quarantine {m['quarantine']} holds {q_size} bytes, its marker "
                                f"(seq {m.seq}) says {m['dropped_bytes']}")
        report.restored_bytes = fs.fstat(q_fds[0]).st_size
        if dry_run:
            report.status = "restored"
            return report
        try:
            # Fenced as an append is: no append lands in the old file after the check
            # publish_replace makes (it would be lost with the old file).
            with log_fence(fs, fd, path):
                if lock is not None:
                    lock.check()  # the restore's lock file is still the one it locked
                publish_replace(fs, store.directory, os.path.basename(path),
                                _content(fs, fd, offset, q_fds[0]), expect=st)
        except FileExistsError:
            return _refused(report, "the log changed while it was being restored")
        # The log holds the quarantined bytes again: the quarantines are no longer cut tails.
        for m in undone:
            fs.rename(_quarantine(store, m), _quarantine(store, m) + ".restored")
        fsync_dir(fs, store.directory)
    except OSError as exc:
        raise IOFailure(f"{path}: restore failed: {exc.strerror or exc}") from exc
    finally:
        untrack_log_fd(fd)
        fs.close(fd)
        for q_fd in q_fds:
            fs.close(q_fd)
    store._tails.pop(sid, None)  # the remembered tail of this log is gone
    report.status = "restored"
    report.quarantine += ".restored"
    return report


def _quarantine(store: Any, marker: Any) -> str:
    """The path of the quarantine file a ``log/truncated`` marker names."""
    return os.path.join(store.directory, marker["quarantine"])


def _refused(report: RestoreReport, reason: str) -> RestoreReport:
    report.status, report.reason = "refused", reason
    return report


def _bounded(fs: Any, fd: int, size: int) -> Callable[[int], bytes]:
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        data = fs.pread(fd, min(n, size - pos), pos) if pos < size else b""
        pos += len(data)
        return data

    return read


def _content(fs: Any, fd: int, offset: int, q_fd: int) -> Iterator[bytes]:
    pos = 0
    while pos < offset:
        chunk = fs.pread(fd, min(CHUNK, offset - pos), pos)
        if not chunk:
            raise IOFailure(f"the log ends before offset {offset}")
        pos += len(chunk)
        yield chunk
    pos = 0
    while chunk := fs.pread(q_fd, CHUNK, pos):
        pos += len(chunk)
        yield chunk
