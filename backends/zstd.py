"""Zstd backend: ``DIR/<id>.jsonl.zst``, a concatenation of standard zstd frames.

One frame per append batch, each with its content size and content checksum, each
frame's content one or more whole JSONL records, byte-identical to what the JSONL backend
writes for the same batch: ``zstd -dc DIR/<id>.jsonl.zst`` prints the session's JSONL log.

**A batch is atomic here** (``atomic_batches = True``): a frame is verified whole by its
checksum before any of its records is read, so after a crash an unacknowledged batch is
either entirely in the log or entirely absent — never a prefix of its records, as it may be
on JSONL. Repair keeps or quarantines a frame whole, for the same reason.

Everything but the framing (lock, publish, append with rollback, repair, import) is the
shared :class:`~sessionlog.backends.filestore.FileStore`. Reading needs no configuration;
the compression ``level`` only affects writing.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import zstandard

from sessionlog import InvalidStoreUrl
from sessionlog.contract import (
    CompactReport,
    CorruptLog,
    DamageKind,
    InvalidEvent,
    IOFailure,
    SessionLocked,
    SessionLogError,
    SessionNotFound,
)
from sessionlog.durable import (
    O_NOFOLLOW,
    OS,
    FileLock,
    FileSystem,
    fsync_dir,
    log_fence,
    temp_name,
    track_log_fd,
    untrack_log_fd,
    write_all,
)
from sessionlog.events import Record, RecordError
from sessionlog.scan import DEFAULT_LIMITS, Limits, check_header

from .filestore import FileStore, fd_reader
from .zstd_frames import (
    ZSTD_MAGIC,
    Broken,
    FrameLimits,
    FrameScan,
    Shape,
    decompress_frame,
    frame_records,
    tail_seqs,
    walk_frame,
)

DEFAULT_LEVEL = 3
"""Per-append frames are small; level 3 is zstd's default speed/ratio balance."""
COMPACT_LEVEL = 9
"""``compact`` runs offline on large frames, where a higher level pays off."""
TAIL_WINDOW = 1 << 16


class _Compressors(threading.local):
    def __init__(self) -> None:
        self.by_level: dict[int, zstandard.ZstdCompressor] = {}


_CCTX = _Compressors()


def compress_frame(content: bytes, level: int) -> bytes:
    """One standard zstd frame holding ``content``, with content size and checksum."""
    cctx = _CCTX.by_level.get(level)
    if cctx is None:
        cctx = _CCTX.by_level[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True
        )
    return cctx.compress(content)


class ZstdFraming:
    """Records as zstd frames, one per batch (see the module docstring)."""

    suffix = ".jsonl.zst"
    atomic_batches = True

    def __init__(self, level: int = DEFAULT_LEVEL, limits: Limits = DEFAULT_LIMITS) -> None:
        if not isinstance(level, int) or not -(1 << 17) <= level <= 22:
            raise InvalidStoreUrl(f"zstd level {level!r} is not an integer in -131072..22")
        self.level = level
        self.limits = limits
        self.frame_limits = FrameLimits.from_limits(limits)

    def encode(self, lines: Sequence[bytes]) -> bytes:
        """One frame whose content is ``lines`` as JSONL. Raises InvalidEvent when the
        content exceeds the frame limit (what a reader would refuse)."""
        # One join makes the content (the trailing newline too): no second copy of the batch.
        return self.encode_block(b"\n".join([*lines, b""]) if lines else b"\n")

    def encode_block(self, block: bytes) -> bytes:
        """One frame whose content is a batch's JSONL bytes as they were encoded (each
        line ending in a newline), compressed without splitting them first. Raises
        InvalidEvent when the content exceeds the frame limit."""
        content = block or b"\n"
        if len(content) > self.frame_limits.content:
            raise InvalidEvent(
                f"batch of {len(content)} bytes exceeds the batch limit of {self.frame_limits.content} bytes; split it"
            )
        return compress_frame(content, self.level)

    def scan(
        self, read: Callable[[int], bytes], *, session_id: str | None, where: str, limits: Limits, owned: bool
    ) -> FrameScan:
        return FrameScan(read, session_id=session_id, where=where, limits=limits, owned=owned)

    def dropped_seqs(self, read: Callable[[int], bytes], limits: Limits) -> tuple[int, int] | None:
        """First and last seq of the records in the verified frames of a quarantined tail."""
        return tail_seqs(read, limits)

    def tail(
        self, fs: FileSystem, fd: int, size: int, *, session_id: str, where: str, limits: Limits
    ) -> tuple[int, float]:
        """Validate the header frame and one append's reach before EOF; return the last
        record's ``(seq, ts)``.

        One append's reach is the last ``batch_limit`` bytes: damage there is found before
        an append lands after it (a NUL run followed by frames is ``mid-log`` to a scan,
        one with nothing after it ``zero-fill``). From a frame start at or before the reach (the last
        one there that verifies) to ``size``, frame headers are walked: whole frames, no
        NUL run or garbage, ending exactly at ``size``. Every data frame there is
        decompressed: each passes its checksum and holds whole records whose seqs run on
        from the frame before (a repeated or missing batch), as JSONL checks every line in
        its reach. Damage further back is left to ``scan``: with an append after it, it is
        ``seq-break`` or ``mid-log``, never cut without ``force``. Reads the header frame
        and about one append's reach; headers further back only when no frame start
        before the reach verifies.

        Raises CorruptLog with ``path``, ``offset`` and ``kind`` the damage as seen from
        the tail (``torn``, ``zero-fill``, ``corrupt``, ``seq-break``; None when the
        header frame itself is over the limits)."""
        flimits = FrameLimits.from_limits(limits)
        src = _PreadSource(fs, fd, size)
        first = _header_frame(src, size, where, flimits)
        header = _verified(src.get, first, None, where, limits, flimits)
        check_header(header[0], session_id, where)
        reach = size - limits.batch_limit
        start, before = first.end, header[-1]
        if reach > first.end:
            start, before = _boundary_before(src, reach, first.end, where, limits, flimits), None
        last = _check_frames(src, start, size, before, where, limits, flimits)
        return last.seq, last.ts


class _PreadSource:
    """Random access to an open file of known size through a small read-ahead window."""

    def __init__(self, fs: FileSystem, fd: int, size: int) -> None:
        self._fs, self._fd, self.size = fs, fd, size
        self._base = 0
        self._buf = b""

    def get(self, pos: int, n: int) -> bytes:
        n = max(0, min(n, self.size - pos))
        if not n:
            return b""
        i = pos - self._base
        if i < 0 or i + n > len(self._buf):
            self._buf = self._fs.pread(self._fd, max(n, TAIL_WINDOW), pos)
            self._base, i = pos, 0
        return self._buf[i : i + n]


def _refused(where: str, offset: int, kind: DamageKind | None, reason: str) -> CorruptLog:
    return CorruptLog(
        f"{where}: {kind or 'frame'} at offset {offset}: {reason}; repair the session before appending",
        path=where, offset=offset, kind=None if kind is None else str(kind),
    )


def _whole(src: _PreadSource, shape: Shape | Broken, where: str) -> Shape:
    """``shape`` when it is a whole frame, else the refusal naming what is there."""
    if isinstance(shape, Shape):
        return shape
    if shape.torn:
        kind = DamageKind.TORN
    elif src.get(shape.start, 1) == b"\0":
        kind = DamageKind.ZERO_FILL
    else:
        kind = DamageKind.CORRUPT  # over the limits too: after the header frame that is damage
    reason = "NUL bytes where a frame should start" if kind is DamageKind.ZERO_FILL else shape.reason
    raise _refused(where, shape.start, kind, reason)


def _header_frame(src: _PreadSource, size: int, where: str, flimits: FrameLimits) -> Shape:
    """The first data frame (skippable frames before it are skipped)."""
    pos = 0
    while True:
        if pos >= size:
            raise CorruptLog(f"{where}: not a session log: no data frame", path=where, offset=pos)
        shape = walk_frame(src.get, pos, flimits)
        if isinstance(shape, Broken):
            kind = None if shape.over_limit else DamageKind.TORN if shape.torn else DamageKind.CORRUPT
            raise _refused(where, pos, kind, shape.reason)
        if not shape.skippable:
            return shape
        pos = shape.end


def _verified(get: Callable[[int, int], bytes], shape: Shape, expected_seq: int | None, where: str, limits: Limits,
              flimits: FrameLimits) -> list[Record]:
    """The records of a whole frame that decompresses, verifies and holds whole records
    from ``expected_seq`` (any seq when None); else the refusal."""
    content = decompress_frame(get(shape.start, shape.end - shape.start), shape, flimits)
    if isinstance(content, str):
        raise _refused(where, shape.start, DamageKind.CORRUPT, content)
    records, damage, reason = frame_records(content, expected_seq=expected_seq, where=where, offset=shape.start,
                                            limits=limits)
    if reason is not None:
        seq_break = damage is not None and damage.kind is DamageKind.SEQ_BREAK
        raise _refused(where, shape.start, DamageKind.SEQ_BREAK if seq_break else DamageKind.CORRUPT, reason)
    return records


def _chained(get: Callable[[int, int], bytes], shape: Shape, expected_seq: int | None,
             flimits: FrameLimits) -> Record | None:
    """The last record of a frame that decompresses, passes its checksum, ends with a
    whole line and whose first record decodes with ``expected_seq`` (any when None);
    None when any of that does not hold (:func:`_verified` then says what)."""
    content = decompress_frame(get(shape.start, shape.end - shape.start), shape, flimits)
    if isinstance(content, str) or not content.endswith(b"\n"):
        return None
    first_end = content.find(b"\n")
    try:
        first = Record.from_line(content[:first_end])
        last = Record.from_line(content[content.rfind(b"\n", 0, len(content) - 1) + 1 : -1])
    except RecordError:
        return None
    if expected_seq is not None and first.seq != expected_seq or last.seq < first.seq:
        return None
    return last


def _boundary_before(src: _PreadSource, reach: int, floor: int, where: str, limits: Limits,
                     flimits: FrameLimits) -> int:
    """A frame start at or before ``reach`` and after ``floor`` (the header frame's end).

    The common case reads a little before the reach: the last frame magic at or before
    ``reach`` whose frame verifies, looked for in a small window, then one frame limit
    back (a whole log has a frame starting within one frame limit before any offset).
    Otherwise the frame headers are walked from ``floor``, refusing the first damage."""
    for span in (TAIL_WINDOW, flimits.frame):
        lo = max(floor, reach - span)
        data = src.get(lo, reach + len(ZSTD_MAGIC) - lo)
        i = len(data)
        while (i := data.rfind(ZSTD_MAGIC, 0, i)) >= 0:
            shape = walk_frame(src.get, lo + i, flimits)
            if isinstance(shape, Shape) and not shape.skippable:
                content = decompress_frame(src.get(shape.start, shape.end - shape.start), shape, flimits)
                if not isinstance(content, str):
                    _, _, reason = frame_records(content, expected_seq=None, where=where, offset=shape.start,
                                                 limits=limits)
                    if reason is None:
                        return shape.start
        if lo == floor:
            break
    pos = floor
    while True:
        shape = _whole(src, walk_frame(src.get, pos, flimits), where)
        if shape.end > reach:
            return pos
        pos = shape.end


def _check_frames(src: _PreadSource, pos: int, size: int, before: Record | None, where: str, limits: Limits,
                  flimits: FrameLimits) -> Record:
    """Walk ``pos``..``size`` by the frame headers: whole frames, no NUL run, ending
    exactly at ``size``. Then verify every data frame there, as JSONL checks every line in
    one append's reach: each decompresses and passes its checksum, and its records' seqs
    run on from the frame before (from ``before``, the last record before ``pos``, when
    known). The last two frames have every record decoded; those before them their first
    and last (their checksums vouch for the bytes between). Returns the last record;
    refuses the first defect."""
    data = src.get(pos, size - pos)  # one read for the whole span
    base = pos

    def get(at: int, n: int) -> bytes:
        return data[at - base : at - base + n]

    frames: list[Shape] = []
    while pos < size:
        shape = _whole(src, walk_frame(get, pos, flimits), where)
        if not shape.skippable:
            frames.append(shape)
        pos = shape.end
    last = before
    for k, shape in enumerate(frames):
        expected = None if last is None else last.seq + 1
        if k < len(frames) - 2:
            last = _chained(get, shape, expected, flimits) or _verified(get, shape, expected, where, limits, flimits)[-1]
        else:  # the last two (what the last appends wrote): every record decoded
            last = _verified(get, shape, expected, where, limits, flimits)[-1]
    if last is None:  # only skippable frames from a boundary found by walking from the header frame
        raise _refused(where, base, DamageKind.CORRUPT, "no data frame in one append's reach")
    return last


# --- the store --------------------------------------------------------------------------------


@dataclass(slots=True)
class FrameStats:
    """What a session file holds, frame by frame (from a full scan)."""

    frames: int
    skipped_frames: int
    records: int
    file_bytes: int
    content_bytes: int




class ZstdStore(FileStore):
    """The Zstd event store: :class:`FileStore` over :class:`ZstdFraming`, plus
    :meth:`compact` and :meth:`frame_stats`."""

    framing: ZstdFraming

    def frame_stats(self, session_id: str) -> FrameStats:
        """Count the session's frames (and skippable frames, which readers skip).
        Never writes. Raises SessionNotFound, CorruptLog, IOFailure."""
        self.check_id(session_id)
        path = self.path_of(session_id)
        fd = self.open_read(session_id)
        try:
            scanner = self.framing.scan(fd_reader(self.fs, fd), session_id=session_id, where=path,
                                        limits=self.limits, owned=True)
            content = sum(len(r.raw) + 1 for r in scanner)
            size = self.fs.fstat(fd).st_size
        except OSError as exc:
            raise IOFailure(f"{path}: read failed: {exc.strerror or exc}") from exc
        finally:
            self.fs.close(fd)
        return FrameStats(scanner.frames, scanner.skipped_frames, scanner.count, size, content)

    def compact(
        self,
        session_id: str,
        *,
        frame_bytes: int | None = None,
        level: int = COMPACT_LEVEL,
        progress: Callable[[int], None] | None = None,
    ) -> CompactReport:
        """Rewrite the session into frames of up to ``frame_bytes`` of records (default:
        the batch limit, 1 MiB), so one bad frame never takes more history with it.

        The records are streamed into a new temp file, which is fsynced and scanned back —
        its records must be byte-identical to the old log's — then, under the writer lock
        (status "locked" when a writer owns it), renamed over the log and the directory
        fsynced; a log that grew before the lock was taken is copied again under it. A log
        already compact or damaged gets no lock file. A writer in another process notices
        the new inode on its next append. A damaged log is never compacted (status "refused"); skippable frames are
        not carried over (``dropped_skippable_frames``). Raises SessionNotFound,
        CorruptLog / UnsupportedFormat (not a session log), IOFailure."""
        self.check_id(session_id)
        frame_bytes = min(frame_bytes or self.limits.batch_limit, self.framing.frame_limits.content)
        path = self.path_of(session_id)
        # The copy is made and compared before the lock is taken: a log that is already
        # compact, or damaged, is left without a lock file made for it (lock files are
        # never removed). The lock is taken to replace the log; if a writer appended
        # meanwhile, the copy is made again under it.
        held: list[FileLock] = []
        try:
            while True:
                report = CompactReport(session_id, path, "unchanged")
                if not held and self._owned(session_id):
                    self.fs.stat(path)  # SessionNotFound / IOFailure first, as take_lock gives them
                    report.status = "locked"
                    report.reason = f"{self.lock_path_of(session_id)}: another writer owns this session"
                    return report
                try:
                    done = self._compact_once(session_id, report, frame_bytes, level, progress, held)
                except SessionLocked as exc:
                    report.status, report.reason = "locked", str(exc)
                    return report
                if done is not None:
                    return done
        finally:
            for lock in held:
                lock.release()

    def _compact_once(self, session_id: str, report: CompactReport, frame_bytes: int, level: int,
                      progress: Callable[[int], None] | None, held: list[FileLock]) -> CompactReport | None:
        """One compaction attempt; the lock is taken (into ``held``) only to replace the
        log. None when the log grew or was replaced before the lock was taken: the caller
        tries again, holding it."""
        fs, path = self.fs, report.path
        fd = self.open_read(session_id)
        track_log_fd(fd)  # it will carry the fence: a child forked from now on must not keep it
        tmp = os.path.join(self.directory, temp_name(self.file_name(session_id)))
        tmp_fd: int | None = None
        renamed = False
        try:
            st = fs.fstat(fd)
            report.bytes_before = st.st_size
            tmp_fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW)
            old_bytes, new_bytes = hashlib.sha256(), hashlib.sha256()
            read = fd_reader(fs, fd)

            def read_hashed(n: int) -> bytes:
                chunk = read(n)
                old_bytes.update(chunk)
                return chunk

            scanner = self.framing.scan(read_hashed, session_id=session_id, where=path,
                                        limits=self.limits, owned=False)
            digest = hashlib.sha256()
            written = 0
            for content in _regroup(scanner, frame_bytes, digest, progress):
                data = compress_frame(content, level)
                write_all(fs, tmp_fd, data)
                new_bytes.update(data)
                written += len(data)
                report.frames_after += 1
                report.content_bytes += len(content)
            report.frames_before = scanner.frames
            report.records = scanner.count
            report.dropped_skippable_frames = scanner.skipped_frames
            if scanner.damage is not None:
                report.status, report.damage = "refused", scanner.damage
                report.reason = (f"{scanner.damage.kind} at offset {scanner.damage.offset} "
                                 f"({scanner.damage.reason}): repair the session before compacting")
                return report
            while read_hashed(1 << 20):  # hash any bytes the scan did not need to read
                pass
            if written == report.bytes_before and new_bytes.digest() == old_bytes.digest():
                report.bytes_after = written
                return report  # already exactly what compaction writes
            fs.fsync(tmp_fd)  # the compacted log is durable under its temp name
            fs.close(tmp_fd)
            tmp_fd = None
            self._verify_copy(tmp, session_id, scanner, digest.digest())
            if not held:
                held.append(self.take_lock(session_id, 0.0))
                now = fs.stat(path)
                if (now.st_ino, now.st_size, now.st_mtime_ns) != (st.st_ino, st.st_size, st.st_mtime_ns):
                    return None  # a writer appended before the lock was taken: again, under it
            # Fenced as an append is: holding the old log's write lock from this check to
            # the rename, no append of a writer that lost its lock lands in the old file
            # after the check (and is lost with it); one that comes later finds the file
            # replaced and writes nothing.
            with log_fence(fs, fd, path):
                now = fs.stat(path)
                if (now.st_ino, now.st_size) != (st.st_ino, st.st_size):
                    raise IOFailure(f"{path}: the log changed during compaction (a writer ignoring the lock?); "
                                    "left unchanged")
                fs.rename(tmp, path)
                renamed = True
                fsync_dir(fs, self.directory)  # the new log replaces the old one across power loss
            report.status, report.bytes_after = "compacted", written
            return report
        except OSError as exc:
            raise IOFailure(f"{path}: compact failed: {exc.strerror or exc}") from exc
        finally:
            untrack_log_fd(fd)
            fs.close(fd)
            if tmp_fd is not None:
                fs.close(tmp_fd)
            if not renamed:
                try:
                    fs.unlink(tmp)
                except FileNotFoundError:
                    pass

    def _verify_copy(self, tmp: str, session_id: str, before: FrameScan, digest: bytes) -> None:
        """Scan the new file: same records, byte for byte, and nothing else."""
        fd = self.fs.open(tmp, os.O_RDONLY | O_NOFOLLOW)
        try:
            after = self.framing.scan(fd_reader(self.fs, fd), session_id=session_id, where=tmp,
                                      limits=self.limits, owned=False)
            check = hashlib.sha256()
            for record in after:
                check.update(record.raw)
                check.update(b"\n")
            size = self.fs.fstat(fd).st_size
        finally:
            self.fs.close(fd)
        same = (after.damage is None and after.stable_offset == size and after.count == before.count
                and after.last_seq == before.last_seq and after.last_ts == before.last_ts
                and check.digest() == digest)
        if not same:  # pragma: no cover - would be a bug in the encoder or the scanner
            raise SessionLogError(f"{tmp}: the compacted copy does not scan to the same records; "
                                  "the log was left unchanged")


def _regroup(records: Iterator[Record] | FrameScan, frame_bytes: int, digest: Any,
             progress: Callable[[int], None] | None) -> Iterator[bytes]:
    """Frame contents of up to ``frame_bytes`` (a larger record alone in its frame). The
    header record gets a frame of its own, so a flipped byte in any later frame is damage
    at that frame's offset, never a log without a header."""
    lines: list[bytes] = []
    size = 0
    header = True  # lines hold only the header so far
    for record in records:
        n = len(record.raw) + 1
        if lines and (header or size + n > frame_bytes):
            yield b"".join(lines)
            if progress is not None:
                progress(len(lines))
            lines, size, header = [], 0, False
        lines.append(record.raw + b"\n")
        digest.update(record.raw)
        digest.update(b"\n")
        size += n
    if lines:
        yield b"".join(lines)
        if progress is not None:
            progress(len(lines))


def open_zstd(
    directory: str,
    *,
    fs: FileSystem | None = None,
    limits: Limits = DEFAULT_LIMITS,
    lock_timeout: float = 10.0,
    level: int = DEFAULT_LEVEL,
    create_dir: bool = True,
    unsafe: bool = False,
) -> ZstdStore:
    """The Zstd store in ``directory`` (created 0700 if missing, unless ``create_dir``
    is False: then nothing is written when the store is opened). ``level`` is the
    compression level of appended frames; reading accepts any level. Raises
    InvalidStoreUrl for a bad level, IOFailure."""
    return ZstdStore(directory, ZstdFraming(level, limits), scheme="zstd", fs=fs or OS, limits=limits,
                     lock_timeout=lock_timeout, create_dir=create_dir, unsafe=unsafe)


def open_url(url: str, **options: object) -> ZstdStore:
    """``zstd:DIR``. Options: fs, limits, lock_timeout, level, create_dir, unsafe."""
    directory = url.partition(":")[2]
    if directory.startswith("//"):
        directory = directory[2:]
    if not directory:
        raise InvalidStoreUrl(f"{url!r}: a zstd URL names a directory: zstd:DIR")
    if not os.path.isdir(directory) and options.get("create_dir") is False:
        raise SessionNotFound(f"{directory}: no such store directory")
    return open_zstd(directory, **options)  # type: ignore[arg-type]
