"""The zstd frame layer of the Zstd backend: walk frames, verify them, scan a log of them.

Pure: bytes come from a ``read(n)`` callable (or a ``get(offset, n)`` callable for random
access) and nothing here touches the file system. The format is RFC 8878:

* a zstd frame is ``magic 0xFD2FB528 | header (2-14 bytes) | blocks | [checksum]``; each
  block has a 3-byte header (last-block bit, type raw/RLE/compressed/reserved, size), so a
  frame's end is found by walking headers, without decompressing anything;
* a skippable frame is ``magic 0x184D2A5? | u32 size | size bytes``: tolerated (skipped
  and counted), never produced.

A session log frame must carry its content checksum (the low 32 bits of XXH64 of the
content, verified by the decompressor) and hold one or more whole JSONL records. The
frame is the unit: it is kept or reported as damage whole, never partially.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import chain
from struct import Struct

import zstandard

from sessionlog.contract import CorruptLog, Damage, DamageKind, Failure, power_loss_nuls
from sessionlog.events import Record, RecordError, RecordRun, region_run
from sessionlog.scan import DEFAULT_LIMITS, Limits, LineScan, check_header, tail_damage

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # 0xFD2FB528, little-endian
SKIPPABLE_MASK = 0xFFFFFFF0
SKIPPABLE_MAGIC = 0x184D2A50
MAX_BLOCK = 128 * 1024  # RFC 8878 Block_Maximum_Size ceiling
READ_CHUNK = 256 << 10
"""Compressed bytes a scan reads at a time (more when one frame needs more): a few regions'
worth, so what is read stays in cache until it is decompressed and decoded (as
:data:`sessionlog.scan.CHUNK`)."""
REGION = 64 << 10
"""The most frame content one fast-path attempt of a scan decodes at once (whole frames;
a larger frame alone). Regions that stay in cache decode faster."""
MIN_REGION = 4 << 10
INFLATE_AFTER = 1 << 20
"""Compressed bytes a scan reads before it decompresses the frames ahead of it in a
worker thread (see :class:`Inflater`): a log smaller than this never starts one."""
INFLATE_BATCH = 256 << 10
"""Compressed bytes of frames the worker decompresses in one call; the scan keeps two
batches in its hands (one batch ahead was measured slower than none: the scan then
waits for each one)."""
_INFLATE_EXPANSION = 16
"""The frames of a batch declare at most this many times :data:`INFLATE_BATCH` bytes of
content (or one frame limit, for a batch of one frame), and those walked ahead of the
scan twice that: headers are read before anything is decompressed, a frame of repeated
bytes compresses a thousandfold, and a hostile header may declare a content its blocks
do not hold."""


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Bounds a hostile file cannot push a reader past.

    ``content``: the largest frame content (decompressed) accepted, ``frame``: the largest
    frame in bytes (compressed, or a skippable frame's size), ``window``: the largest
    window a frame may declare. Derived from :class:`Limits`: a frame holds at most one
    batch (``batch_limit``), or one record of up to ``record_limit``."""

    content: int
    frame: int
    window: int

    @classmethod
    def from_limits(cls, limits: Limits) -> FrameLimits:
        content = max(limits.batch_limit, limits.record_limit + 1)
        # zstd's worst case expansion is tiny (raw blocks: 3 bytes per 128 KiB + header).
        frame = content + content // 128 + 1024
        window = max(1 << 23, 1 << (content - 1).bit_length())
        return cls(content=content, frame=frame, window=window)


@dataclass(slots=True)  # not frozen: built once per frame walked, and frozen init costs twice as much
class Shape:
    """A structurally whole frame at ``start``..``end`` (absolute offsets)."""

    start: int
    end: int
    skippable: bool
    content_size: int | None = None


@dataclass(frozen=True, slots=True)
class Broken:
    """No whole frame at ``start``: ``torn`` when EOF cut a consistent prefix short,
    ``over_limit`` when the frame declares sizes beyond the limits, else garbage."""

    start: int
    reason: str
    torn: bool = False
    over_limit: bool = False


def window_size(descriptor: int) -> int:
    """RFC 8878 Window_Descriptor: ``2**(10+exponent) * (1 + mantissa/8)``."""
    base = 1 << (10 + (descriptor >> 3))
    return base + (base >> 3) * (descriptor & 7)


def _frame_descriptors() -> list[tuple[int, int, int, int, int] | None]:
    """Per Frame_Header_Descriptor byte: ``(header_len, window_len, dict_len, fcs_len,
    checksum)`` (the header after the magic, descriptor included; ``window_len`` 0 for a
    single-segment frame, which has no window byte), or None when the reserved or unused
    bit is set."""
    table: list[tuple[int, int, int, int, int] | None] = []
    for fhd in range(256):
        if fhd & 0x18:
            table.append(None)
            continue
        fcs_flag, single, checksum, did_flag = fhd >> 6, fhd & 0x20, fhd & 0x04, fhd & 0x03
        fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
        did_len = (0, 1, 2, 4)[did_flag]
        wd_len = 0 if single else 1
        table.append((1 + wd_len + did_len + fcs_len, wd_len, did_len, fcs_len, checksum))
    return table


_FHD = _frame_descriptors()


def walk_frame(get: Callable[[int, int], bytes], pos: int, limits: FrameLimits) -> Shape | Broken:
    """Find the end of the frame starting at ``pos`` from its headers alone.

    ``get(offset, n)`` returns up to ``n`` bytes at ``offset`` (fewer only at EOF)."""
    data = get(pos, 18)  # the magic and the longest frame header (descriptor, window, dictionary, size)
    if data[:4] != ZSTD_MAGIC or len(data) < 5:
        return _walk_other(get, pos, limits, data)
    fhd = _FHD[data[4]]
    if fhd is None:  # reserved bit (must be 0); the unused bit, which no encoder sets
        return Broken(pos, "frame header reserved or unused bit is set")
    header_len, wd_len, did_len, fcs_len, checksum = fhd
    if len(data) < 4 + header_len:
        return Broken(pos, "frame header cut short by EOF", torn=True)
    i = 5 + wd_len  # after the descriptor and the window byte
    content_size: int | None = None
    if fcs_len:
        content_size = int.from_bytes(data[i + did_len : i + did_len + fcs_len], "little")
        if fcs_len == 2:
            content_size += 256
    if wd_len:
        window = window_size(data[5])
        if window > limits.window:
            return Broken(pos, f"frame window of {window} bytes exceeds the window limit of {limits.window}",
                          over_limit=True)
    if content_size is not None and content_size > limits.content:
        return Broken(pos, f"frame content of {content_size} bytes exceeds the frame limit of "
                      f"{limits.content}", over_limit=True)
    if did_len:
        dict_id = int.from_bytes(data[i : i + did_len], "little")
        if dict_id:
            return Broken(pos, f"frame needs dictionary {dict_id}; session logs use none")
    if not checksum:
        return Broken(pos, "frame has no content checksum")
    at = 4 + header_len  # relative to pos from here
    frame_limit = limits.frame
    regenerated = 0
    while True:
        bh = data[at : at + 3] if at + 3 <= len(data) else get(pos + at, 3)
        if len(bh) < 3:  # also where a previous block's payload was cut short
            return Broken(pos, "block cut short by EOF", torn=True)
        word = int.from_bytes(bh, "little")
        kind, size = (word >> 1) & 3, word >> 3
        if kind == 3:
            return Broken(pos, "reserved block type")
        if size > MAX_BLOCK:
            return Broken(pos, f"block of {size} bytes exceeds the 128 KiB block maximum")
        if kind == 1:
            regenerated += size
            at += 4
        else:
            if kind == 0:
                regenerated += size
            at += 3 + size
        if at > frame_limit:
            return Broken(pos, f"frame exceeds the frame limit of {frame_limit} bytes", over_limit=True)
        if word & 1:
            break
    if content_size is not None and regenerated > content_size:
        return Broken(pos, "blocks hold more than the frame's content size")
    at += pos + 4
    if not get(at - 1, 1):
        return Broken(pos, "block or content checksum cut short by EOF", torn=True)
    return Shape(pos, at, False, content_size)


def _walk_buffered(buf: bytes, i: int, base: int, limits: FrameLimits) -> Shape | None:
    """:func:`walk_frame`'s Shape for the data frame at ``buf[i:]`` (``base`` the offset of
    ``buf``) when its headers, blocks and checksum all lie in ``buf`` and it has no
    dictionary id field; None for anything else, which :func:`walk_frame` then judges.
    The scan's fast path walks each frame here: no reads, no slices."""
    n = len(buf)
    if i + 18 > n or not buf.startswith(ZSTD_MAGIC, i):
        return None
    fhd = _FHD[buf[i + 4]]
    if fhd is None:
        return None
    header_len, wd_len, did_len, fcs_len, checksum = fhd
    if did_len or not checksum:
        return None
    if wd_len and window_size(buf[i + 5]) > limits.window:
        return None
    content_size: int | None = None
    if fcs_len:
        k = i + 5 + wd_len
        content_size = int.from_bytes(buf[k : k + fcs_len], "little")
        if fcs_len == 2:
            content_size += 256
        if content_size > limits.content:
            return None
    at = i + 4 + header_len
    last = i + limits.frame  # the furthest a frame may end (before its checksum)
    regenerated = 0
    while True:
        if at + 3 > n:
            return None
        word = buf[at] | buf[at + 1] << 8 | buf[at + 2] << 16
        kind, size = (word >> 1) & 3, word >> 3
        if kind == 3 or size > MAX_BLOCK:
            return None
        if kind == 1:
            regenerated += size
            at += 4
        else:
            if kind == 0:
                regenerated += size
            at += 3 + size
        if at > last:
            return None
        if word & 1:
            break
    at += 4
    if at > n or (content_size is not None and regenerated > content_size):
        return None
    return Shape(base + i, base + at, False, content_size)


def _walk_other(get: Callable[[int, int], bytes], pos: int, limits: FrameLimits, data: bytes) -> Shape | Broken:
    """:func:`walk_frame` where ``data`` (the first 18 bytes at ``pos``) is not the
    magic and a frame header's first byte: a skippable frame, or no frame."""
    head = data[:4]
    if len(head) < 4:
        if ZSTD_MAGIC.startswith(head) or _skippable_prefix(head):
            return Broken(pos, "frame magic cut short by EOF", torn=True)
        return Broken(pos, "not a zstd frame")
    if head == ZSTD_MAGIC:
        return Broken(pos, "frame header cut short by EOF", torn=True)
    magic = int.from_bytes(head, "little")
    if magic & SKIPPABLE_MASK != SKIPPABLE_MAGIC:
        return Broken(pos, "not a zstd frame (bad magic number)")
    size_field = data[4:8]
    if len(size_field) < 4:
        return Broken(pos, "skippable frame header cut short by EOF", torn=True)
    size = int.from_bytes(size_field, "little")
    if size > limits.frame:
        return Broken(pos, f"skippable frame of {size} bytes exceeds the frame limit of {limits.frame}",
                      over_limit=True)
    end = pos + 8 + size
    if len(get(end - 1, 1)) < 1 and size:
        return Broken(pos, "skippable frame cut short by EOF", torn=True)
    return Shape(pos, end, skippable=True)


def _skippable_prefix(head: bytes) -> bool:
    full = SKIPPABLE_MAGIC.to_bytes(4, "little")
    return len(head) >= 1 and full[1 : len(head)] == head[1:] and head[0] & 0xF0 == full[0]


class _Decompressors(threading.local):
    def __init__(self) -> None:
        self.by_window: dict[int, zstandard.ZstdDecompressor] = {}


_DCTX = _Decompressors()


def decompress_frame(frame: bytes | memoryview, shape: Shape, limits: FrameLimits) -> bytes | str:
    """The verified content of a structurally whole frame, or a reason it is bad.

    The decompressor checks the content checksum and the declared content size; output
    is bounded by the frame limit either way."""
    dctx = _DCTX.by_window.get(limits.window)
    if dctx is None:
        dctx = _DCTX.by_window[limits.window] = zstandard.ZstdDecompressor(max_window_size=limits.window)
    try:
        content = dctx.decompress(frame, max_output_size=limits.content)
    except zstandard.ZstdError as exc:
        return f"frame does not decompress ({exc})"
    if shape.content_size is not None and len(content) != shape.content_size:
        return f"frame content is {len(content)} bytes, its header says {shape.content_size}"
    return content


def _content_reader(content: bytes) -> Callable[[int], bytes]:
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        chunk = content[pos : pos + n]
        pos += len(chunk)
        return chunk

    return read


def frame_records(
    content: bytes, *, expected_seq: int | None, where: str, offset: int, limits: Limits
) -> tuple[list[Record], Damage | None, str | None]:
    """The records of a frame's content, checked by the JSONL prefix rules.

    Returns ``(records, damage, reason)``: ``damage`` is the content's first defect (a
    ``seq-break`` when a whole record has the wrong seq), ``reason`` says why the frame is
    not a run of whole records (empty, or a line that does not decode / is cut). A record
    over the record limit is an error (CorruptLog), as it is in a JSONL log.
    ``expected_seq=None`` takes the first record's seq as given (tail validation)."""
    if not content:
        return [], None, "frame holds no records"
    if expected_seq is None:
        nl = content.find(b"\n")
        try:
            expected_seq = Record.from_line(content[:nl] if nl >= 0 else content).seq
        except RecordError as exc:
            return [], None, f"record does not decode ({exc.reason})"
    fast = _whole_records(content, expected_seq, limits.record_limit)
    if fast is not None:
        return fast, None, None
    # Anything unusual: the JSONL scanner's rules say exactly what is wrong.
    lines = LineScan(_content_reader(content), session_id=None, where=where, expected_seq=expected_seq,
                     limits=limits)
    try:
        records = list(lines)
    except CorruptLog as exc:
        raise CorruptLog(f"{where}: in the frame at offset {offset}: {exc}", path=where, offset=offset) from None
    damage = lines.damage
    if damage is None:
        return records, None, None
    if damage.kind is DamageKind.SEQ_BREAK:
        return records, damage, f"record {damage.reason}"
    return records, damage, f"frame content is not whole records ({damage.reason})"


def _whole_records(content: bytes, expected_seq: int, record_limit: int) -> list[Record] | None:
    """The records of content that is nothing but whole, decodable, contiguous records
    within the record limit (the scan's fast path); None when anything is off (then
    LineScan classifies it)."""
    if not content.endswith(b"\n"):
        return None
    run, whole = region_run(content, expected_seq)
    # region_run proves a prefix of whole lines and says whether it is all of them. A line
    # the fast path could not prove (a record written with spaces, say): the exact rules
    # take the whole frame.
    if not whole:
        return None
    records = run.records()
    if len(content) > record_limit and max(len(r.raw) for r in records) > record_limit:
        return None
    return records


class ByteStream:
    """Forward-only buffered access to ``read(n)`` by absolute offset, with a bounded
    buffer: bytes before the ``release``d offset are dropped when more is read."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self.buf = b""
        self.base = 0
        self.keep = 0
        self.eof = False

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def get(self, pos: int, n: int) -> bytes:
        i = pos - self.base
        if 0 <= i and i + n <= len(self.buf):
            return self.buf[i : i + n]
        while self.end < pos + n and not self.eof:
            self._more(pos + n - self.end)
        i = pos - self.base
        if i < 0:  # pragma: no cover - callers only move forward
            raise ValueError("ByteStream is forward-only")
        return self.buf[i : i + n]

    def view(self, pos: int, n: int) -> memoryview:
        """:meth:`get` without copying the bytes out of the buffer (a frame handed to the
        decompressor). The buffer is never changed in place: reading more makes a new
        one, and the view keeps the bytes it shows."""
        i = pos - self.base
        if not (0 <= i and i + n <= len(self.buf)):
            self.get(pos, n)  # reads what is missing
            i = pos - self.base
        return memoryview(self.buf)[i : i + n]

    def release(self, pos: int) -> None:
        """Bytes before ``pos`` will not be asked for again."""
        if pos > self.keep:
            self.keep = pos

    def _more(self, need: int = 1) -> None:
        """Read ``need`` bytes more, at least a chunk (what one frame's walk asks for at
        once is read in one go: its bytes are copied into the buffer once)."""
        chunk = self._read(max(READ_CHUNK, need))
        if not chunk:
            self.eof = True
            return
        buf = self.buf
        drop = min(self.keep - self.base, len(buf))
        if drop <= 0:
            self.buf = buf + chunk if buf else bytes(chunk)
            return
        self.base += drop
        # One copy of what is kept and the chunk (a slice then a concatenation is two).
        self.buf = b"".join((memoryview(buf)[drop:], chunk)) if drop < len(buf) else bytes(chunk)


class FrameScan:
    """Stream the longest valid prefix of a zstd-framed session log.

    Iterate for the prefix's records (a frame's records are yielded only after the whole
    frame verified); afterwards ``stable_offset``, ``last_seq``, ``last_ts``, ``count``,
    ``damage`` describe it, ``skipped_frames`` counts skippable frames in the prefix.

    The tail after the prefix is classified by the damage table (docs/damage.md), a frame being the
    unit: an EOF-interrupted frame is ``torn`` (``in-flight`` when ``owned``); a frame
    that fails decompression or its checksum, or whose content is not whole records, is
    ``corrupt`` — ``mid-log`` when verified frames with decodable records follow it; a
    NUL run at the stable offset is ``zero-fill`` when nothing decodes after it (a frame
    is one append, begun after the one before it was durable: a verified frame after the
    NULs is a later append), else ``mid-log``; a whole frame whose records decode
    with the wrong seq is ``seq-break``. A frame declaring sizes over the limits is a bad
    frame like any other (a flipped bit in a size field), read no further than its
    headers; only the first frame over the limits is an error (CorruptLog): no reader
    with these limits can take the file.

    After the header frame, runs of whole frames holding up to ``region`` bytes of
    content are decoded as one region (the fast path); a frame is taken only when every
    one of its records is proven, else it goes to the exact rules alone, which say what is
    wrong with it. ``region=0`` takes every frame alone (the exact path the tests compare
    the fast path with).

    Once ``inflate_after`` bytes are read (None: never), the fast path has the frames
    ahead of it decompressed in a worker thread (:class:`Inflater`), ``inflate_batch``
    compressed bytes at a call, while it decodes: the scan takes the same frames, with
    the same checks, in the same order; a frame the worker could not decompress is
    decompressed again here, and judged as ever.
    """

    def __init__(
        self,
        read: Callable[[int], bytes],
        *,
        session_id: str | None,
        where: str,
        limits: Limits = DEFAULT_LIMITS,
        owned: bool = False,
        region: int = REGION,
        inflate_after: int | None = INFLATE_AFTER,
        inflate_batch: int = INFLATE_BATCH,
    ) -> None:
        self.session_id = session_id
        self.region = region
        self.where = where
        self.limits = limits
        self.frame_limits = FrameLimits.from_limits(limits)
        self.owned = owned
        self.stable_offset = 0
        self.last_seq = 0
        self.last_ts = 0.0
        self.count = 0
        self.frames = 0
        self.skipped_frames = 0
        self.damage: Damage | None = None
        self._stream = ByteStream(read)
        self._done = False
        self._ahead: Shape | None = None  # the frame after the last batch, walked already
        self._inflate_after = inflate_after
        self._inflate_batch = inflate_batch
        self._inflater: Inflater | None = None
        self._walked = 0  # the frames before this offset are walked (and handed to the inflater)
        self._shapes: deque[Shape] = deque()  # the frames walked ahead, in order
        self._content_ahead = 0  # the content they declare
        self._walking = True  # False once a read ahead failed: the scan reads on by itself

    def __iter__(self) -> Iterator[Record]:
        # The records go out run by run in one C-level loop.
        return chain.from_iterable(map(RecordRun.records, self.runs()))

    def runs(self) -> Iterator[RecordRun]:
        """The records of the prefix, a verified run of frames at a time (iterate a
        scanner once, either way); the summary is brought up to date before each run is
        handed out, as its frames verified."""
        if self._done:
            raise RuntimeError("a FrameScan is iterated once")
        self._done = True
        return self._runs()

    def _runs(self) -> Iterator[RecordRun]:
        try:
            yield from self._scan_runs()
        finally:
            if self._inflater is not None:
                self._inflater.close()

    def _scan_runs(self) -> Iterator[RecordRun]:
        stream = self._stream
        region = self.region
        span = region  # content bytes the next batch may hold (shrinks after a failed batch)
        pos = 0
        while True:
            stream.release(pos)
            if span and self.count:
                # The fast path (never for the header frame): a run of whole frames whose
                # contents are decoded as one region. A frame is taken only when every one
                # of its records is proven; the first frame that is not goes to the exact
                # path below with its content, and the next batch is smaller.
                shapes, contents = self._gather(pos, span)
                if shapes:
                    run, taken = self._batch(contents)
                    if taken:
                        pos = self.stable_offset = shapes[taken - 1].end
                        self.frames += taken
                        self.count += len(run)
                        self.last_seq = run.seqs[-1]
                        self.last_ts = run.tss[-1]
                        yield run
                    if taken == len(shapes):
                        span = min(2 * span, region)
                        continue
                    span = max(MIN_REGION, min(region, 2 * sum(map(len, contents[:taken]))))
                    shape, content = shapes[taken], bytes(contents[taken])
                    # The exact rules for this frame, from its verified content.
                    step = self._frame(pos, shape, content)
                else:
                    step = self._frame(pos)
            else:
                step = self._frame(pos)
            if step is None:
                return
            end, records = step
            pos = self.stable_offset = end
            if records:
                self.frames += 1
                self.count += len(records)
                self.last_seq = records[-1].seq
                self.last_ts = records[-1].ts
                yield RecordRun.of(records)

    def _frame(self, pos: int, shape: Shape | None = None, content: bytes | None = None
               ) -> tuple[int, list[Record]] | None:
        """The exact path: the frame at ``pos`` by itself (``shape`` and its verified
        ``content`` when the fast path has them already). Returns the frame's end and its
        records (none for a skippable frame), or None at EOF or damage (``_fail``
        classified it). Raises CorruptLog when the file is not a session log."""
        stream, flimits = self._stream, self.frame_limits
        if shape is None:
            if not stream.get(pos, 1):
                if self.count == 0 and self.session_id is not None:
                    raise CorruptLog(f"{self.where}: not a session log: no data frame", path=self.where, offset=0)
                return None
            walked = walk_frame(stream.get, pos, flimits)
            if isinstance(walked, Broken):
                if walked.over_limit and self.count == 0:
                    # No record yet: a reader with these limits cannot take this file at all.
                    raise CorruptLog(f"{self.where}: frame at offset {pos}: {walked.reason}",
                                     path=self.where, offset=pos)
                # After the header frame, sizes over the limits are what one flipped bit in
                # a size field looks like: damage like any bad frame (never buffered).
                self._fail(pos, "torn" if walked.torn else "bad", walked.reason)
                return None
            shape = walked
            if shape.skippable:
                self.skipped_frames += 1
                return shape.end, []
            decompressed = decompress_frame(stream.get(pos, shape.end - pos), shape, flimits)
            if isinstance(decompressed, str):
                self._fail(pos, "bad", decompressed, end=shape.end)
                return None
            content = decompressed
        assert content is not None
        records, damage, reason = frame_records(
            content, expected_seq=self.last_seq + 1, where=self.where, offset=pos, limits=self.limits
        )
        if reason is not None:
            self._fail(pos, "seq" if damage is not None and damage.kind is DamageKind.SEQ_BREAK else "bad",
                       reason, end=shape.end)
            return None
        if self.count == 0 and self.session_id is not None:
            check_header(records[0], self.session_id, self.where)
        return shape.end, records

    def _gather(self, pos: int, span: int) -> tuple[list[Shape], list[bytes]]:
        """The run of frames from ``pos`` the fast path may take at once: whole data frames
        that decompress and verify, each content ending in a newline, their contents
        adding up to at most ``span`` bytes (at least one frame). Stops before anything
        else (EOF, a skippable or broken frame, one that does not verify, a content that
        is empty or cut inside a record): the exact path takes that frame."""
        stream, flimits = self._stream, self.frame_limits
        get = stream.get
        shapes: list[Shape] = []
        contents: list[bytes] = []
        total = 0
        inflater = self._inflater
        if inflater is not None and inflater.pid != os.getpid():
            inflater = self._inflater = None  # forked mid-scan: the worker is the parent's
        if inflater is None and self._inflate_after is not None and pos >= self._inflate_after:
            inflater = self._inflater = Inflater(flimits)
        while True:
            if inflater is not None and self._walking:
                self._walk_ahead(pos, inflater)
            shape = self._walked_shape(pos) if self._shapes else None
            if shape is None:
                shape, self._ahead = self._ahead, None
                if shape is None or shape.start != pos:
                    shape = _walk_buffered(stream.buf, pos - stream.base, stream.base, flimits) or walk_frame(
                        get, pos, flimits)
            if shape.__class__ is not Shape or shape.skippable:
                break
            size = shape.content_size
            if contents and (size is None or total + size > span):
                self._ahead = shape  # where the next batch starts: not walked twice
                break
            end = shape.end
            content = inflater.take(pos) if inflater is not None else None
            if content is not None:
                if memoryview(content)[-1:] != b"\n":
                    break
            else:
                content = decompress_frame(stream.view(pos, end - pos), shape, flimits)
                if isinstance(content, str) or content[-1:] != b"\n":
                    break
            shapes.append(shape)
            contents.append(content)
            total += len(content)
            pos = end
            if total >= span or (pos >= stream.base + len(stream.buf) and not get(pos, 1)):
                break
        return shapes, contents

    def _walked_shape(self, pos: int) -> Shape | None:
        """The frame at ``pos`` if it was walked ahead (those before it are dropped)."""
        ahead = self._shapes
        while ahead and ahead[0].start <= pos:
            shape = ahead.popleft()
            self._content_ahead -= shape.content_size or 0
            if shape.start == pos:
                return shape
        return None

    def _walk_ahead(self, pos: int, inflater: Inflater) -> None:
        """Walk the frames after ``pos`` up to two batches ahead of it (their declared
        content bounded too) and hand them to ``inflater`` a batch at a time. Walking
        stops at anything but a whole data frame with its content size (the exact path
        judges it when the scan gets there; walking goes on after it). A read that fails
        ahead ends walking ahead for this scan: what the scan reads by itself, and the
        errors it meets there, are what they would have been."""
        if self._walked < pos:
            self._walked = pos
        stream, flimits, shapes = self._stream, self.frame_limits, self._shapes
        batch = self._inflate_batch
        most = max(_INFLATE_EXPANSION * batch, flimits.content)
        while self._walked - pos < 2 * batch and self._content_ahead < 2 * most:
            first = at = self._walked
            walked: list[Shape] = []
            content = 0
            while at - first < batch:
                try:
                    shape = _walk_buffered(stream.buf, at - stream.base, stream.base, flimits) or walk_frame(
                        stream.get, at, flimits)
                except Exception:  # noqa: BLE001 - a read ahead failed: the scan will read there itself
                    self._walking = False
                    break
                size = shape.content_size if shape.__class__ is Shape and not shape.skippable else None
                if not size:
                    break  # (an empty frame is damage; the decompressor's batch call mishandles one)
                if walked and content + size > most:
                    break  # the contents the headers declare (the batch call allocates them) are bounded
                content += size
                walked.append(shape)
                at = shape.end
            if not walked:
                return
            shapes.extend(walked)
            self._content_ahead += content
            inflater.submit(stream.view(first, at - first), walked)
            self._walked = at

    def _batch(self, contents: list[bytes]) -> tuple[RecordRun, int]:
        """The records of the leading frames whose every record the fast path proves,
        and how many frames that is (``contents``: whole frames' contents, each ending in
        a newline)."""
        body = contents[0] if len(contents) == 1 and type(contents[0]) is bytes else b"".join(contents)
        run, whole = region_run(body, self.last_seq + 1)
        limit = self.limits.record_limit
        if len(body) > limit and len(run):
            over = [k for k, line in enumerate(run.lines()) if len(line) > limit]
            if over:
                run = run.head(over[0])  # the exact path reports a record over the limit
                whole = False
        if whole:
            return run, len(contents)
        taken = lines = 0
        for content in contents:
            n = lines + bytes(content).count(b"\n")
            if n > len(run):
                break
            lines = n
            taken += 1
        return run.head(lines), taken

    def _fail(self, offset: int, what: str, reason: str, end: int | None = None) -> None:
        """Classify the tail at ``offset``: ``what`` is "torn", "seq" or "bad"; ``end``
        the damaged frame's end when its headers were whole."""
        if self.count == 0 and self.session_id is not None:
            raise CorruptLog(
                f"{self.where}: not a session log: no valid first frame at offset {offset} ({reason})",
                path=self.where, offset=offset,
            )
        # The damaged frame's bytes (read before the tail walk releases them): to its end
        # when its headers were whole, else up to the next frame that verifies or EOF,
        # at most one frame limit. A whole frame with the wrong seq verified: no NULs.
        unit = self._stream.get(offset, self.frame_limits.frame if end is None else end - offset)
        tail = TailCount(self._stream, offset, self.frame_limits, self.limits)
        tail.run()
        if end is None and tail.first_frame is not None:
            unit = unit[: tail.first_frame - offset]
        failure = {"seq": Failure.WRONG_SEQ, "torn": Failure.CUT_SHORT}.get(what, Failure.UNDECODABLE)
        nul = what != "seq" and power_loss_nuls(unit, offset, eof=offset + len(unit) >= tail.end)
        self.damage = tail_damage(offset, nul, failure, reason, tail, self.limits, owned=self.owned, framed=True)


_SEGMENT = Struct("<QQ")
_NOT_TAKEN: bytes | None = None


class Inflater:
    """Frames decompressed ahead of a scan in a worker thread of their own.

    zstd decompression releases Python's interpreter lock, so a frame's content can be
    made on another core while the scan decodes the records of the frames before it. The
    scan walks the frames (cheap, from their headers) and hands them over a batch at a
    time (:meth:`submit`); the worker decompresses a batch in one call, each frame
    checked as :func:`decompress_frame` checks it (its checksum, its declared content
    size, the window limit). :meth:`take` gives a frame's content, waiting for its batch
    if need be, or None when the worker could not decompress its batch (the scan then
    decompresses the frame itself and says what is wrong with it). The worker touches
    nothing but the bytes handed to it: no file, no descriptor."""

    def __init__(self, limits: FrameLimits) -> None:
        self.pid = os.getpid()  # a child forked mid-scan has no worker: it makes its own
        self._window = limits.window
        self._jobs: queue.SimpleQueue[tuple[memoryview, list[Shape], Future[list[bytes] | None]] | None] = (
            queue.SimpleQueue())
        self._batches: deque[tuple[list[Shape], Future[list[bytes] | None]]] = deque()
        self._ready: deque[tuple[int, bytes]] = deque()
        self._thread = threading.Thread(target=self._work, name="sessionlog-zstd-inflate", daemon=True)
        self._thread.start()

    def submit(self, frames: memoryview, shapes: list[Shape]) -> None:
        """Decompress the whole data frames ``shapes`` (each with its content size),
        which ``frames`` holds back to back, ahead of the scan."""
        future: Future[list[bytes] | None] = Future()
        self._batches.append((shapes, future))
        self._jobs.put((frames, shapes, future))

    def take(self, start: int) -> bytes | None:
        """The content of the frame at ``start`` if it was handed over, else None. Frames
        are taken in order; those passed over are dropped."""
        ready = self._ready
        while True:
            while ready and ready[0][0] < start:
                ready.popleft()
            if ready:
                return ready.popleft()[1] if ready[0][0] == start else None
            batches = self._batches
            while batches and batches[0][0][-1].start < start:
                batches.popleft()
            if not batches or batches[0][0][0].start > start:
                return None
            shapes, future = batches.popleft()
            contents = future.result()
            if contents is None:
                return None
            ready.extend(zip([s.start for s in shapes], contents))

    def close(self) -> None:
        """Stop the worker: the batches not begun are dropped, the one under way (if any)
        is the last, and nothing waits for it."""
        jobs = self._jobs
        try:
            while True:
                jobs.get_nowait()
        except queue.Empty:
            pass
        jobs.put(None)
        self._batches.clear()
        self._ready.clear()

    def _work(self) -> None:
        dctx = zstandard.ZstdDecompressor(max_window_size=self._window)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            frames, shapes, future = job
            base = shapes[0].start
            try:
                out = dctx.multi_decompress_to_buffer(zstandard.BufferWithSegments(
                    frames, b"".join([_SEGMENT.pack(s.start - base, s.end - s.start) for s in shapes])))
                contents = list(out)
                if list(map(len, contents)) != [s.content_size for s in shapes]:
                    contents = None  # pragma: no cover - zstd checks the declared size
            except Exception:  # noqa: BLE001 - any failure: the scan decompresses these frames itself
                contents = None
            future.set_result(contents)


class TailCount:
    """Walk the tail after damage: its length, and the records that still decode in the
    verified frames found in it (resynchronizing on the frame magic)."""

    def __init__(self, stream: ByteStream, offset: int, frame_limits: FrameLimits, limits: Limits) -> None:
        self._stream = stream
        self._offset = offset
        self._flimits = frame_limits
        self._limits = limits
        self.end = offset
        self.count = 0
        self.first_seq = 0
        self.last_seq = 0
        self.last_end = offset  # end of the last frame with decodable records (offset if none)
        self.first_frame: int | None = None  # start of the first frame after offset that verifies

    def run(self) -> None:
        stream, flimits = self._stream, self._flimits
        pos = self._offset
        while True:
            stream.release(pos)
            # Find the next magic at or after pos, reading forward a chunk at a time.
            while True:
                i = stream.buf.find(ZSTD_MAGIC, max(pos - stream.base, 0))
                if i >= 0:
                    pos = stream.base + i
                    break
                if stream.eof:
                    self.end = stream.end
                    return
                pos = max(pos, stream.end - 3)
                stream.release(pos)
                stream.get(stream.end, 1)  # read more
            shape = walk_frame(stream.get, pos, flimits)
            if isinstance(shape, Broken) or shape.skippable:
                pos += 1
                continue
            content = decompress_frame(stream.get(pos, shape.end - pos), shape, flimits)
            if isinstance(content, str):
                pos += 1
                continue
            if self.first_frame is None and pos > self._offset:
                self.first_frame = pos
            found = self._count(content)
            if found:
                self.last_end = shape.end
            pos = shape.end

    def _count(self, content: bytes) -> int:
        found = 0
        lines = content.split(b"\n")
        for line in lines[:-1]:  # the part after the last newline is not a whole line
            if len(line) > self._limits.record_limit:
                continue
            try:
                record = Record.from_line(line)
            except RecordError:
                continue
            if not self.count:
                self.first_seq = record.seq
            self.count += 1
            self.last_seq = record.seq
            found += 1
        return found


def tail_seqs(read: Callable[[int], bytes], limits: Limits = DEFAULT_LIMITS) -> tuple[int, int] | None:
    """The first and last seq of the records in the verified frames of a tail read from
    its start (a quarantined Zstd tail): the ``dropped_seqs`` its scan reported, rebuilt."""
    tail = TailCount(ByteStream(read), 0, FrameLimits.from_limits(limits), limits)
    tail.run()
    return (tail.first_seq, tail.last_seq) if tail.count else None
