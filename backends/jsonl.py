"""JSONL backend: ``DIR/<id>.jsonl``, one record per line, each line ending in ``\\n``.

A batch is the concatenation of its lines. Batches are not atomic here: after a crash an
unacknowledged batch may survive as a prefix of its whole records (``atomic_batches``
is False); the scanner never keeps a partial line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sessionlog.contract import CorruptLog, DamageKind
from sessionlog.durable import FileSystem
from sessionlog.events import Record, RecordError
from sessionlog.scan import DEFAULT_LIMITS, Limits, LineScan, check_header, tail_seqs

from .filestore import FileStore


class JsonlFraming:
    """Records as newline-terminated lines."""

    suffix = ".jsonl"
    atomic_batches = False

    def encode(self, lines: Sequence[bytes]) -> bytes:
        # One join makes the batch, its last newline too (not a join, then a copy to add it).
        return b"\n".join([*lines, b""]) if lines else b"\n"

    def encode_block(self, block: bytes) -> bytes:
        """The bytes appended for a batch already encoded as JSONL (each record line
        ending in a newline): the block itself, not copied."""
        return block

    def scan(
        self, read: Callable[[int], bytes], *, session_id: str | None, where: str, limits: Limits, owned: bool
    ) -> LineScan:
        return LineScan(read, session_id=session_id, where=where, limits=limits, owned=owned)

    def dropped_seqs(self, read: Callable[[int], bytes], limits: Limits) -> tuple[int, int] | None:
        """First and last seq of the records that decode in a quarantined tail."""
        return tail_seqs(read, limits)

    def tail(
        self, fs: FileSystem, fd: int, size: int, *, session_id: str, where: str, limits: Limits
    ) -> tuple[int, float]:
        """Validate the header and everything within one append's reach of the end: each
        whole line there decodes and the seqs run on to the last one. A NUL hole, a seq
        break or a corrupt record that the last append could have left is found before a
        new record is written after it. Deeper history is the business of a full scan."""
        head = fs.pread(fd, min(HEAD_PROBE, limits.record_limit + 2), 0)
        nl = head.find(b"\n")
        if nl < 0 and len(head) == HEAD_PROBE:  # a header longer than the probe: read it whole
            head = fs.pread(fd, limits.record_limit + 2, 0)
            nl = head.find(b"\n")
        if nl > limits.record_limit:  # what scan refuses too: never append after it
            raise CorruptLog(f"{where}: the header at offset 0 exceeds the record limit ({limits.record_limit} bytes)",
                             path=where, offset=0, kind=str(DamageKind.CORRUPT))
        header = _decode(head[:nl] if nl >= 0 else b"", where, 0, "the header")
        check_header(header, session_id, where)
        if size == nl + 1:
            return header.seq, header.ts
        start = max(nl + 1, size - max(limits.batch_limit, limits.record_limit + 2))
        data = fs.pread(fd, size - start, start)
        if not data.endswith(b"\n"):
            torn = start + data.rfind(b"\n") + 1
            raise CorruptLog(
                f"{where}: the last record, at offset {torn}, ends without a newline (torn: "
                f"{size - torn} bytes before EOF at {size}); repair the session before appending",
                path=where, offset=torn, kind=str(DamageKind.TORN),
            )
        # A window may start mid-record: its first (partial) line is skipped, unless the
        # byte before the window ends a line.
        at_boundary = start == nl + 1 or fs.pread(fd, 1, start - 1) == b"\n"
        skip = 0 if at_boundary else data.find(b"\n") + 1
        if skip == len(data):
            raise CorruptLog(f"{where}: the last record exceeds the record limit", path=where, offset=start)
        offset = start + skip
        expected = header.seq + 1 if start == nl + 1 else None
        last = header
        for line in data[skip:-1].split(b"\n"):
            if len(line) > limits.record_limit:
                raise CorruptLog(f"{where}: the record at offset {offset} exceeds the record limit",
                                 path=where, offset=offset)
            record = _decode(line, where, offset, "a record within the last append's reach")
            if expected is not None and record.seq != expected:
                raise CorruptLog(
                    f"{where}: seq {record.seq} at offset {offset} where {expected} was expected; "
                    "repair the session (with force) before appending",
                    path=where, offset=offset, kind=str(DamageKind.SEQ_BREAK),
                )
            expected = record.seq + 1
            offset += len(line) + 1
            last = record
        return last.seq, last.ts


HEAD_PROBE = 64 << 10
"""Bytes read at offset 0 to find the header line when a session is opened (the whole
record limit only when the header is longer)."""


def _decode(line: bytes, where: str, offset: int, what: str) -> Record:
    try:
        return Record.from_line(line)
    except RecordError as exc:
        raise CorruptLog(
            f"{where}: {what} at offset {offset} does not decode ({exc.reason}); repair the session "
            "before appending",
            path=where, offset=offset, kind=str(DamageKind.CORRUPT),
        ) from None


def open_jsonl(directory: str, *, fs: FileSystem | None = None, limits: Limits = DEFAULT_LIMITS,
               lock_timeout: float = 10.0, create_dir: bool = True, unsafe: bool = False) -> FileStore:
    """The JSONL store in ``directory`` (created 0700 if missing, unless ``create_dir`` is
    False: then nothing is written when the store is opened)."""
    kwargs = {} if fs is None else {"fs": fs}
    return FileStore(directory, JsonlFraming(), scheme="jsonl", limits=limits, lock_timeout=lock_timeout,
                     create_dir=create_dir, unsafe=unsafe, **kwargs)


def open_url(url: str, **options: object) -> FileStore:
    """``jsonl:DIR``."""
    directory = url.partition(":")[2]
    if directory.startswith("//"):
        directory = directory[2:]
    if not directory:
        from sessionlog import InvalidStoreUrl

        raise InvalidStoreUrl(f"{url!r}: a jsonl URL names a directory: jsonl:DIR")
    return open_jsonl(directory, **options)  # type: ignore[arg-type]
