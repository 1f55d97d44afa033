"""The Zstd scan's fast path (runs of whole frames decoded as one region) against its
exact path (each frame by itself, ``region=0``): on any log, damaged in any way, both give
the same records, the same summary and the same damage or error, byte for byte."""

from __future__ import annotations

import errno
import io
import os
import random
import signal
import subprocess
import sys
import threading
from itertools import chain

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionlog.backends.zstd import compress_frame, open_zstd
from sessionlog.backends.zstd_frames import INFLATE_AFTER, INFLATE_BATCH, MIN_REGION, REGION, FrameScan

from sessionlog import DamageKind, Limits, SessionLogError
from sessionlog.durable import FileSystem
from sessionlog.events import Record, RecordRun, encode_record, header_event

EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    1000 if os.environ.get("SESSIONLOG_SLOW") else 100
)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SKIPPABLE = (0x184D2A5A).to_bytes(4, "little")
LIMITS = (Limits(), Limits(record_limit=300, batch_limit=1500))
REGIONS = (REGION, MIN_REGION, 1, 700, 1 << 20)
"""Fast-path region sizes compared with the exact path: the default, the smallest a
failed batch shrinks to, one frame per batch, a few frames, everything at once."""
INFLATED = ((REGION, 1), (1, 700), (MIN_REGION, INFLATE_BATCH), (1 << 20, 1 << 20))
"""(region, inflate batch) of fast paths that have the frames ahead of them decompressed
by the worker thread from the first one on: one frame a batch (and one frame walked
ahead), a few, the default, everything at once."""


def _line(kind: str, seq: int) -> bytes:
    """One line of a frame's content (no newline): a valid record, or one of the shapes
    the exact rules judge (accept or refuse) that the fast path may not prove."""
    if kind == "compact":
        return b'{"seq":%d,"ts":1.5,"type":"x","v":"%s"}' % (seq, b"a" * (seq % 7))
    if kind == "spaced":  # valid: json.dumps defaults
        return b'{"seq": %d, "ts": 1.5, "type": "x", "v": [1, 2]}' % seq
    if kind == "crlf":  # valid: \r is whitespace between tokens
        return b'{"seq":%d,"ts":1.5,"type":"x"}\r' % seq
    if kind == "nested-dup":  # valid: a repeated key below the top level
        return b'{"seq":%d,"ts":1.5,"type":"x","o":{"a":1,"a":2}}' % seq
    if kind == "deep-128":  # valid: 128 deep, the top object included
        return b'{"seq":%d,"ts":1.5,"type":"x","d":%s1%s}' % (seq, b"[" * 127, b"]" * 127)
    if kind == "deep-129":
        return b'{"seq":%d,"ts":1.5,"type":"x","d":%s1%s}' % (seq, b"[" * 128, b"]" * 128)
    if kind == "dup":  # a repeated top-level key
        return b'{"seq":%d,"ts":1.5,"type":"x","a":1,"a":2}' % seq
    if kind == "utf8":
        return b'{"seq":%d,"ts":1.5,"type":"x","s":"\xff\xfe"}' % seq
    if kind == "wrong-seq":
        return b'{"seq":%d,"ts":1.5,"type":"x"}' % (seq + 3)
    if kind == "empty-type":
        return b'{"seq":%d,"ts":1.5,"type":""}' % seq
    if kind == "no-ts":
        return b'{"seq":%d,"type":"x"}' % seq
    if kind == "blank":
        return b""
    if kind == "nul":
        return b"\0" * 12
    if kind == "long":  # over the small record limit
        return b'{"seq":%d,"ts":1.5,"type":"x","pad":"%s"}' % (seq, b"p" * 400)
    if kind == "array":
        return b"[%d]" % seq
    raise AssertionError(kind)


VALID = ("compact", "compact", "compact", "compact", "spaced", "crlf", "nested-dup", "deep-128")
KINDS = VALID + ("deep-129", "dup", "utf8", "wrong-seq", "empty-type", "no-ts", "blank", "nul", "long", "array")


@st.composite
def logs(draw: st.DrawFn) -> bytes:
    """A session log of frames: the header frame, then frames of a few lines each, mostly
    valid records; some frames empty, cut inside a record, or preceded by a skippable
    frame."""
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    seq = 2
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 15)) == 0:
            out.append(SKIPPABLE + (3).to_bytes(4, "little") + b"abc")
        lines = []
        for _ in range(draw(st.integers(0, 5))):
            kind = draw(st.sampled_from(VALID) if draw(st.integers(0, 3)) else st.sampled_from(KINDS))
            lines.append(_line(kind, seq))
            seq += 1
        content = b"".join(line + b"\n" for line in lines)
        if content and draw(st.integers(0, 15)) == 0:
            content = content[: draw(st.integers(0, len(content) - 1))]  # ends inside a record
        out.append(compress_frame(content, draw(st.sampled_from((1, 3)))))
    return b"".join(out)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A log with damage anywhere: cut at any byte, bytes flipped, a NUL run written over
    it or appended, garbage or a copy of a frame spliced in."""
    data = bytearray(draw(logs()))
    for _ in range(draw(st.integers(0, 2))):
        what = draw(st.sampled_from(("cut", "flip", "nuls", "append-nuls", "splice", "duplicate")))
        at = draw(st.integers(0, len(data)))
        if what == "cut":
            del data[at:]
        elif what == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif what == "nuls":
            n = draw(st.integers(1, 200))
            data[at : at + n] = bytes(min(n, len(data) - at))
        elif what == "append-nuls":
            data += bytes(draw(st.integers(1, 3000)))
        elif what == "splice":
            data[at:at] = draw(st.binary(max_size=20))
        elif what == "duplicate":
            i = draw(st.integers(0, len(data)))
            data[at:at] = data[i : i + draw(st.integers(1, 300))]
    return bytes(data)


def run_records(run: RecordRun) -> list[Record]:
    """The records of ``run``, checked against its parallel lists (what a scan's tracker
    reads instead of the records)."""
    records = run.records()
    assert run.data == b"".join(r.raw + b"\n" for r in records)
    assert run.seqs == [r.seq for r in records] and run.tss == [r.ts for r in records]
    assert run.types == [r.type for r in records] and len(run) == len(records) > 0
    assert [dict(m) for m in run.members] == [dict(Record.from_line(r.raw)._members) for r in records]
    assert run.last_raw() == records[-1].raw
    return records


def outcome(data: bytes, *, region: int, limits: Limits, owned: bool, session_id: str | None,
            by_runs: bool = False, inflate_batch: int | None = None) -> tuple:
    """Everything a scan says about ``data``: its records and summary, and its damage or
    the error it raised (type, message, offset). ``by_runs``: read through ``runs()``;
    ``inflate_batch``: frames decompressed ahead by the worker from the start, in batches
    of that many compressed bytes (None: the default, after 1 MiB)."""
    inflate = {} if inflate_batch is None else {"inflate_after": 0, "inflate_batch": inflate_batch}
    scanner = FrameScan(io.BytesIO(data).read, session_id=session_id, where="<mem>", limits=limits, owned=owned,
                        region=region, **inflate)
    records = []
    error = None
    try:
        for record in chain.from_iterable(map(run_records, scanner.runs())) if by_runs else scanner:
            records.append((record.raw, record.seq, record.ts, record.type))
    except SessionLogError as exc:
        error = (type(exc).__name__, str(exc), getattr(exc, "offset", None))
    return (records, error, scanner.stable_offset, scanner.last_seq, scanner.last_ts, scanner.count,
            scanner.frames, scanner.skipped_frames, scanner.damage)


def assert_same(data: bytes, limits: Limits, owned: bool = False, session_id: str | None = "s") -> tuple:
    exact = outcome(data, region=0, limits=limits, owned=owned, session_id=session_id)
    for region in REGIONS:
        assert outcome(data, region=region, limits=limits, owned=owned, session_id=session_id) == exact, region
        assert outcome(data, region=region, limits=limits, owned=owned, session_id=session_id,
                       by_runs=True) == exact, region
    for region, batch in INFLATED:
        assert outcome(data, region=region, limits=limits, owned=owned, session_id=session_id,
                       inflate_batch=batch) == exact, (region, batch)
    return exact


@SETTINGS
@given(data=logs(), limits=st.sampled_from(LIMITS))
def test_fast_path_equals_exact_path_on_any_log(data, limits):
    assert_same(data, limits)


@SETTINGS
@given(data=damaged(), limits=st.sampled_from(LIMITS), owned=st.booleans(),
       session_id=st.sampled_from(("s", None)))
def test_fast_path_equals_exact_path_on_damaged_logs(data, limits, owned, session_id):
    assert_same(data, limits, owned, session_id)


def _clean_log(frames: int, per_frame: int) -> bytes:
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    seq = 2
    for _ in range(frames):
        out.append(compress_frame(b"".join(_line("compact", s) + b"\n" for s in range(seq, seq + per_frame)), 3))
        seq += per_frame
    return b"".join(out)


@pytest.mark.parametrize("cut", [0, 1, 17, 100, 1000])
def test_a_cut_or_flip_near_every_frame_boundary(cut):
    """Every frame boundary of a clean multi-frame log, cut or flipped ``cut`` bytes
    after it: the fast path agrees with the exact path."""
    data = _clean_log(frames=8, per_frame=40)
    assert_same(data, Limits())[1] is None
    starts = [i for i in range(len(data)) if data.startswith(b"\x28\xb5\x2f\xfd", i)]
    for start in starts:
        at = min(start + cut, len(data) - 1)
        assert_same(data[:at], Limits())
        flipped = bytearray(data)
        flipped[at] ^= 0x40
        assert_same(bytes(flipped), Limits())


def test_the_fast_path_takes_whole_runs_of_frames():
    """A clean log comes out whole through either path, in as many frames as it has."""
    data = _clean_log(frames=50, per_frame=64)
    exact = assert_same(data, Limits())
    records, error, stable, last_seq, _, count, frames, skipped, damage = exact
    assert error is None and damage is None and skipped == 0
    assert stable == len(data) and frames == 51 and count == last_seq == 1 + 50 * 64 == len(records)


@pytest.mark.parametrize("kind", KINDS + ("padded",))
def test_a_frame_larger_than_a_region(kind):
    """A frame of ~300 kB (``convert`` and ``compact`` write frames of up to a batch
    limit; the fast path takes a frame larger than its region alone): the same result as
    the exact path whatever one line past its first 128 KiB holds, and a clean one taken
    whole (one run, every record)."""
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    lines, size, seq = [], 0, 2
    while size < 300_000:
        odd = kind if 2 * REGION < size < 2 * REGION + 100 else "compact"
        line = _padded(seq) if odd == "padded" else _line(odd, seq)
        lines.append(line)
        size += len(line) + 1
        seq += 1
    out.append(compress_frame(b"".join(line + b"\n" for line in lines), 3))
    data = b"".join(out)
    limits = Limits(record_limit=1 << 20, batch_limit=1 << 20)
    exact = assert_same(data, limits)
    if kind in VALID + ("padded", "long"):  # "long" is within these limits
        records, error, stable, last_seq, _, count, frames, skipped, damage = exact
        assert error is None and damage is None and frames == 2 and count == last_seq == seq - 1
        scanner = FrameScan(io.BytesIO(data).read, session_id="s", where="<mem>", limits=limits)
        assert [len(run) for run in scanner.runs()] == [1, seq - 2]  # the big frame is one run
    else:
        assert exact[8] is not None or exact[1] is not None  # the frame is damage, whole


def test_a_mostly_odd_log_stays_linear():
    """Every frame holds a record only the exact rules accept (spaces): each batch fails,
    the next is smaller, and the result is the exact path's."""
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    seq = 2
    for _ in range(40):
        lines = [_line("compact", s) for s in range(seq, seq + 20)] + [_line("spaced", seq + 20)]
        out.append(compress_frame(b"".join(line + b"\n" for line in lines), 3))
        seq += 21
    exact = assert_same(b"".join(out), Limits())
    assert exact[1] is None and exact[8] is None and exact[5] == seq - 1


# --- runs of many frames with one bad frame inside (what the fast path batches) -------

def _set_content_size(frame: bytes, delta: int) -> bytes:
    """``frame`` with its Frame_Content_Size field moved by ``delta`` (clamped to what the
    field holds); the blocks and the checksum are left as they are."""
    fhd = frame[4]
    fcs_flag, single, did_flag = fhd >> 6, fhd & 0x20, fhd & 0x03
    fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    if not fcs_len:
        return frame
    bias = 256 if fcs_len == 2 else 0
    size = int.from_bytes(frame[at : at + fcs_len], "little") + bias
    size = min(max(size + delta, bias), bias + (1 << (8 * fcs_len)) - 1)
    return frame[:at] + (size - bias).to_bytes(fcs_len, "little") + frame[at + fcs_len :]


def _odd_frame(kind: str, content: bytes, level: int) -> bytes:
    """A frame holding ``content`` that is bad (or unusual but valid) in one way."""
    frame = compress_frame(content, level)
    if kind == "checksum":  # the content checksum does not match
        return frame[:-4] + bytes(b ^ 0x5A for b in frame[-4:])
    if kind in ("size+1", "size-1", "size+300"):  # the header's content size is wrong
        return _set_content_size(frame, int(kind[4:]))
    if kind == "no-size":  # valid: no content size in the header
        return zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=False).compress(content)
    if kind == "no-checksum":
        return zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True).compress(content)
    if kind == "block":  # a byte of the compressed block flipped
        i = len(frame) // 2
        return frame[:i] + bytes([frame[i] ^ 0x10]) + frame[i + 1 :]
    if kind == "no-newline":  # the last record cut before its newline
        return compress_frame(content[:-1], level)
    if kind == "mid-record":
        return compress_frame(content[: len(content) // 2], level)
    if kind == "empty":
        return compress_frame(b"", level)
    if kind == "skippable":  # valid: a skippable frame before the frame
        return SKIPPABLE + (5).to_bytes(4, "little") + b"12345" + frame
    if kind == "multi-block":  # valid: the content padded past one 128 KiB block
        return frame
    raise AssertionError(kind)


def _padded(seq: int) -> bytes:
    """A valid record of 140 kB: its frame holds more than one 128 KiB block."""
    return b'{"seq":%d,"ts":1.5,"type":"x","pad":"%s"}' % (seq, bytes(range(48, 58)) * 14000)


ODD = ("checksum", "size+1", "size-1", "size+300", "no-size", "no-checksum", "block", "no-newline",
       "mid-record", "empty", "skippable", "multi-block")


@st.composite
def runs_with_a_bad_frame(draw: st.DrawFn) -> bytes:
    """A header frame, then a run of frames of whole compact records (what one fast-path
    batch takes), with frames that are bad or unusual at any places in it (``split``: a
    record begun in one frame and finished in the next, each frame decompressing
    cleanly: joined, the two would hold whole lines)."""
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    seq = 2
    n = draw(st.integers(1, 14))
    odd = {draw(st.integers(0, n - 1)): draw(st.sampled_from(ODD + ("split",))) for _ in range(draw(st.integers(1, 3)))}
    carry = b""  # the tail of a record split across two frames ("split")
    for k in range(n):
        kind = odd.get(k)
        lines = [_line("compact", s) for s in range(seq, seq + draw(st.integers(1, 6)))]
        if kind == "multi-block":
            lines[-1] = _padded(seq + len(lines) - 1)
        content = carry + b"".join(line + b"\n" for line in lines)
        carry = b""
        level = draw(st.sampled_from((1, 3)))
        if kind == "split":  # the frame ends inside a record the next frame finishes
            cut = draw(st.integers(1, len(lines[-1])))
            content, carry = content[: len(content) - len(lines[-1]) - 1 + cut], lines[-1][cut:] + b"\n"
            out.append(compress_frame(content, level))
        else:
            out.append(compress_frame(content, level) if kind is None else _odd_frame(kind, content, level))
        seq += len(lines)
    data = b"".join(out)
    if draw(st.integers(0, 3)) == 0:
        data = data[: draw(st.integers(0, len(data)))]  # cut at any byte
    return data


@SETTINGS
@given(data=runs_with_a_bad_frame(), limits=st.sampled_from(LIMITS), owned=st.booleans())
def test_a_bad_frame_inside_a_run_of_frames(data, limits, owned):
    """A frame with a wrong checksum or content size, cut inside a record, or otherwise
    bad, anywhere in a run the fast path would batch (and any cut of such a log): the
    same prefix, offsets and damage as the exact path."""
    assert_same(data, limits, owned)


@pytest.mark.parametrize("kind", ODD)
def test_each_bad_frame_kind_in_the_middle_of_a_run(kind):
    """Ten good frames, the odd one, ten good frames: the fast path agrees with the exact
    path; the bad kinds stop the prefix at the odd frame, with a damage of the right kind."""
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    seq = 2
    for k in range(21):
        lines = [_line("compact", s) for s in range(seq, seq + 4)]
        if k == 10 and kind == "multi-block":
            lines[-1] = _padded(seq + 3)
        content = b"".join(line + b"\n" for line in lines)
        out.append(_odd_frame(kind, content, 3) if k == 10 else compress_frame(content, 3))
        seq += 4
    data = b"".join(out)
    records, error, stable, last_seq, _, count, frames, skipped, damage = assert_same(data, Limits())
    assert error is None
    odd_at = sum(map(len, out[:11]))
    if kind in ("no-size", "skippable", "multi-block"):
        assert damage is None and count == 1 + 21 * 4 and stable == len(data)
        assert skipped == (kind == "skippable")
    else:
        assert damage is not None and damage.kind is DamageKind.MID_LOG
        assert stable == damage.offset == odd_at
        assert count == last_seq == 1 + 10 * 4


@pytest.mark.parametrize("kind", ("checksum", "size+1", "size-1", "block"))
def test_every_cut_of_a_run_with_a_bad_frame(kind):
    """A run with a bad frame in it, cut at every byte: fast path = exact path."""
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    seq = 2
    for k in range(4):
        content = b"".join(_line("compact", s) + b"\n" for s in range(seq, seq + 3))
        out.append(_odd_frame(kind, content, 3) if k == 2 else compress_frame(content, 3))
        seq += 3
    data = b"".join(out)
    for cut in range(len(out[0]) - 1, len(data) + 1):
        assert_same(data[:cut], Limits())


# --- walk_frame against the implementation it replaced -------------------------------

def _reference_walk(get, pos, limits):
    """walk_frame as it was before its header decode was table-driven (5359108): the
    oracle the current one is compared with."""
    from sessionlog.backends.zstd_frames import (MAX_BLOCK, SKIPPABLE_MAGIC, SKIPPABLE_MASK, ZSTD_MAGIC, Broken,
                                                 Shape, _skippable_prefix, window_size)
    data = get(pos, 18)
    head = data[:4]
    if len(head) < 4:
        if ZSTD_MAGIC.startswith(head) or _skippable_prefix(head):
            return Broken(pos, "frame magic cut short by EOF", torn=True)
        return Broken(pos, "not a zstd frame")
    if head != ZSTD_MAGIC:
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
    header = data[4:]
    if not header:
        return Broken(pos, "frame header cut short by EOF", torn=True)
    fhd = header[0]
    if fhd & 0x18:
        return Broken(pos, "frame header reserved or unused bit is set")
    fcs_flag, single, checksum, did_flag = fhd >> 6, fhd & 0x20, fhd & 0x04, fhd & 0x03
    fcs_len = (1 if single else 0, 2, 4, 8)[fcs_flag]
    did_len = (0, 1, 2, 4)[did_flag]
    wd_len = 0 if single else 1
    header_len = 1 + wd_len + did_len + fcs_len
    if len(header) < header_len:
        return Broken(pos, "frame header cut short by EOF", torn=True)
    i = 1
    window = None
    if not single:
        window = window_size(header[1])
        i = 2
    dict_id = int.from_bytes(header[i : i + did_len], "little")
    i += did_len
    content_size = None
    if fcs_len:
        content_size = int.from_bytes(header[i : i + fcs_len], "little") + (256 if fcs_len == 2 else 0)
    if window is not None and window > limits.window:
        return Broken(pos, f"frame window of {window} bytes exceeds the window limit of {limits.window}",
                      over_limit=True)
    if content_size is not None and content_size > limits.content:
        return Broken(pos, f"frame content of {content_size} bytes exceeds the frame limit of "
                      f"{limits.content}", over_limit=True)
    if dict_id:
        return Broken(pos, f"frame needs dictionary {dict_id}; session logs use none")
    if not checksum:
        return Broken(pos, "frame has no content checksum")
    at = pos + 4 + header_len
    regenerated = 0
    while True:
        bh = data[at - pos : at - pos + 3] if at - pos + 3 <= len(data) else get(at, 3)
        if len(bh) < 3:
            return Broken(pos, "block cut short by EOF", torn=True)
        word = bh[0] | bh[1] << 8 | bh[2] << 16
        kind, size = (word >> 1) & 3, word >> 3
        if kind == 3:
            return Broken(pos, "reserved block type")
        if size > MAX_BLOCK:
            return Broken(pos, f"block of {size} bytes exceeds the 128 KiB block maximum")
        if kind != 2:
            regenerated += size
        at += 4 if kind == 1 else 3 + size
        if at - pos > limits.frame:
            return Broken(pos, f"frame exceeds the frame limit of {limits.frame} bytes", over_limit=True)
        if word & 1:
            break
    if content_size is not None and regenerated > content_size:
        return Broken(pos, "blocks hold more than the frame's content size")
    at += 4
    if not get(at - 1, 1):
        return Broken(pos, "block or content checksum cut short by EOF", torn=True)
    return Shape(pos, at, skippable=False, content_size=content_size)


@st.composite
def frame_bytes(draw: st.DrawFn) -> bytes:
    """Bytes at a frame start: a real frame (any level, with or without content size,
    checksum, dictionary id, as one or many blocks), a skippable frame, or garbage; then
    with header bytes overwritten, bytes flipped, or cut anywhere."""
    what = draw(st.sampled_from(("frame", "frame", "frame", "skippable", "garbage")))
    if what == "frame":
        content = draw(st.sampled_from((b"", b"x", b'{"a":1}\n' * 40, bytes(range(256)) * 600, b"a" * 300000)))
        params = dict(write_checksum=draw(st.booleans()), write_content_size=draw(st.booleans()),
                      write_dict_id=False)
        data = zstandard.ZstdCompressor(level=draw(st.sampled_from((-5, 1, 3, 19))), **params).compress(content)
    elif what == "skippable":
        data = SKIPPABLE + draw(st.binary(min_size=0, max_size=12))
    else:
        data = b"\x28\xb5\x2f\xfd" + draw(st.binary(max_size=40)) if draw(st.booleans()) else draw(st.binary(max_size=30))
    data = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        if not data:
            break
        at = draw(st.integers(0, min(len(data) - 1, 20) if draw(st.booleans()) else len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        del data[draw(st.integers(0, len(data))) :]
    return bytes(data)


@SETTINGS
@given(prefix=st.binary(max_size=3), data=frame_bytes(), limits=st.sampled_from(LIMITS + (Limits(batch_limit=70000),)))
def test_walk_frame_equals_its_reference(prefix, data, limits):
    from sessionlog.backends.zstd_frames import FrameLimits, walk_frame
    flimits = FrameLimits.from_limits(limits)
    whole = prefix + data
    get = lambda offset, n: whole[offset : offset + n]  # noqa: E731
    assert walk_frame(get, len(prefix), flimits) == _reference_walk(get, len(prefix), flimits)


@SETTINGS
@given(prefix=st.binary(max_size=3), data=frame_bytes(), suffix=st.binary(max_size=20),
       limits=st.sampled_from(LIMITS + (Limits(batch_limit=70000),)))
def test_the_buffered_walk_is_walk_frame_or_declines(prefix, data, suffix, limits):
    """The fast path's walk over the buffer says what walk_frame says, or nothing."""
    from sessionlog.backends.zstd_frames import FrameLimits, _walk_buffered, walk_frame
    flimits = FrameLimits.from_limits(limits)
    whole = prefix + data + suffix
    get = lambda offset, n: whole[offset : offset + n]  # noqa: E731
    for base in (0, 1000):
        shape = _walk_buffered(whole, len(prefix), base, flimits)
        if shape is not None:
            expect = walk_frame(get, len(prefix), flimits)
            assert (shape.start - base, shape.end - base, shape.skippable, shape.content_size) == (
                expect.start, expect.end, expect.skippable, expect.content_size)


def test_the_buffered_walk_takes_every_frame_a_scan_writes():
    """Not a walk that always declines: every frame of a clean log (one or many blocks,
    with or without a content size) is walked in the buffer, as walk_frame walks it."""
    from sessionlog.backends.zstd_frames import FrameLimits, _walk_buffered, walk_frame
    flimits = FrameLimits.from_limits(Limits())
    no_size = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=False)
    data = _clean_log(frames=6, per_frame=20) + compress_frame(_padded(122) + b"\n", 3) + no_size.compress(
        _line("compact", 123) + b"\n") + b"\0" * 18
    get = lambda offset, n: data[offset : offset + n]  # noqa: E731
    pos = walked = 0
    while pos < len(data) - 18:
        shape = _walk_buffered(data, pos, 0, flimits)
        assert shape is not None and shape == walk_frame(get, pos, flimits)
        pos = shape.end
        walked += 1
    assert walked == 9


def _large_log(records: int = 4000) -> bytes:
    """A clean log of well over INFLATE_AFTER compressed bytes (records of random text
    that compress poorly), 50 records a frame."""
    rng = random.Random(5)
    out = [compress_frame(encode_record(header_event("s"), 1, 1.0) + b"\n", 3)]
    for first in range(2, records + 2, 50):
        lines = [encode_record({"type": "x", "v": rng.randbytes(600).hex()}, seq, 1.5)
                 for seq in range(first, first + 50)]
        out.append(compress_frame(b"".join(line + b"\n" for line in lines), 3))
    data = b"".join(out)
    assert len(data) > INFLATE_AFTER
    return data


def _inflaters() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sessionlog-zstd-inflate"]


def _ended(threads: list[threading.Thread]) -> bool:
    for thread in threads:
        thread.join(5)
    return not any(t.is_alive() for t in threads)


def test_a_large_log_read_with_the_worker_is_the_exact_paths_whatever_is_flipped():
    """Past INFLATE_AFTER the frames ahead are decompressed by a worker thread: a large
    log, clean or with a byte flipped in a frame far in, scans exactly as the exact path
    scans it (records, summary, damage), and the worker is gone when the scan is."""
    data = _large_log()
    starts = [i for i in range(len(data)) if data.startswith(b"\x28\xb5\x2f\xfd", i)]
    before = set(_inflaters())
    for at in (None, starts[len(starts) // 2] + 40, starts[-1] + 30, len(data) - 2):
        log = data
        if at is not None:
            flipped = bytearray(data)
            flipped[at] ^= 0x10
            log = bytes(flipped)
        exact = outcome(log, region=0, limits=Limits(), owned=False, session_id="s")
        assert outcome(log, region=REGION, limits=Limits(), owned=False, session_id="s") == exact
        assert (exact[8] is None) == (at is None)
    assert _ended([t for t in _inflaters() if t not in before])


def test_a_scan_left_half_way_ends_its_worker():
    """A reader that stops early (the records of a large log read in part, the scan
    dropped) leaves no worker thread behind."""
    data = _large_log()
    before = set(_inflaters())
    scanner = FrameScan(io.BytesIO(data).read, session_id="s", where="<mem>")
    runs = scanner.runs()
    seen = 0
    for run in runs:
        seen += len(run)
        if seen > 2000:
            break
    started = [t for t in _inflaters() if t not in before]
    assert started  # the scan was past INFLATE_AFTER: its worker was running
    runs.close()
    assert _ended(started)


def _then(frames: list[bytes]) -> bytes:
    """:func:`_large_log`'s first 1.2 MiB of frames (the worker starts in them), then
    ``frames``."""
    data = _large_log(2000)
    return data + b"".join(frames)


_RSS_AFTER_FIRST_BIG_RECORD = """
import io, sys, time
from sessionlog.backends.zstd_frames import FrameScan

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) << 10

data = open(sys.argv[1], "rb").read()
before = rss()
scanner = FrameScan(io.BytesIO(data).read, session_id="s", where="<mem>")
for record in scanner:
    if len(record.raw) > 100_000:
        break  # a reader slower than the worker
time.sleep(1)
print(rss() - before)
"""


def test_what_is_decompressed_ahead_is_bounded_by_the_content_the_frames_declare(tmp_path):
    """Frames of one 1 MiB record of repeated bytes compress to ~100 bytes each: walked
    ahead by their compressed size alone, the worker decompressed thousands of them
    (1.8 GiB held for a reader that paused at the first one). What is decompressed ahead
    is bounded by the content the frames declare too (a few MiB)."""
    big = [compress_frame(encode_record({"type": "x", "v": "a" * 1_000_000}, seq, 1.5) + b"\n", 3)
           for seq in range(2002, 2402)]
    assert max(map(len, big)) < 2000
    path = tmp_path / "bomb.jsonl.zst"
    path.write_bytes(_then(big))
    out = subprocess.run([sys.executable, "-c", _RSS_AFTER_FIRST_BIG_RECORD, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"the measuring child failed (exit {out.returncode}):\n{out.stderr}"
    assert int(out.stdout) < 100 << 20, out.stdout  # 400 MiB when not bounded


def test_a_scan_that_ends_at_damage_leaves_no_work_behind():
    """A scan that stops at damage (here frames of 1 MiB of bytes that are no records,
    ~100 bytes each compressed) drops what was handed to the worker and not begun: the
    worker ends at once, not after decompressing all it was given."""
    junk = compress_frame(b"a" * (1 << 20), 3)
    data = _then([junk] * 2000)
    before = set(_inflaters())
    scanner = FrameScan(io.BytesIO(data).read, session_id="s", where="<mem>")
    assert sum(1 for _ in scanner) == 2001 and scanner.damage is not None
    started = [t for t in _inflaters() if t not in before]
    for thread in started:
        thread.join(0.5)
    assert not any(t.is_alive() for t in started)


def test_a_fault_past_what_a_reader_needs_is_not_met_by_reading_ahead(tmp_path):
    """Through the I/O seam, a read that fails past the bytes an early-stopping reader
    needs (a bad sector further on) is not that reader's error: the worker's reads
    ahead that fail end reading ahead, and the reader meets a fault only where it reads
    by itself, as without the worker."""
    store = open_zstd(str(tmp_path))
    store.create("s")
    rng = random.Random(1)
    for _ in range(60):
        store.append("s", [{"type": "x", "v": rng.randbytes(600).hex()} for _ in range(50)])
    store.close()

    class Faulty(FileSystem):
        def __init__(self, fail_past: int | None) -> None:
            self.fail_past, self.furthest = fail_past, 0

        def pread(self, fd: int, n: int, offset: int) -> bytes:
            if self.fail_past is not None and offset + n > self.fail_past:
                raise OSError(errno.EIO, "injected: a bad sector")
            data = super().pread(fd, n, offset)
            self.furthest = max(self.furthest, offset + len(data))
            return data

    def first_records(fs: Faulty, inflate_after: int | None) -> int:
        reader = open_zstd(str(tmp_path), fs=fs, create_dir=False)
        FrameScan.__init__.__kwdefaults__["inflate_after"] = inflate_after
        try:
            records = reader.read("s")
            got = [next(records) for _ in range(2000)]
            records.close()
            return len(got)
        finally:
            FrameScan.__init__.__kwdefaults__["inflate_after"] = INFLATE_AFTER
            reader.close()

    alone = Faulty(None)
    assert first_records(alone, None) == 2000
    assert first_records(Faulty(alone.furthest + 1), None) == 2000  # the fault lies past what it reads
    assert first_records(Faulty(alone.furthest + 1), INFLATE_AFTER) == 2000


def test_a_child_forked_mid_scan_reads_on_without_the_parents_worker():
    """A process forked during a scan (a generator handed to a forked worker process):
    the child has no worker thread; it reads on by itself instead of waiting for one."""
    data = _large_log()
    scanner = FrameScan(io.BytesIO(data).read, session_id="s", where="<mem>", inflate_after=0)
    records = iter(scanner)
    got = [next(records) for _ in range(100)]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        signal.alarm(20)
        os._exit(0 if len(got) + sum(1 for _ in records) == 4001 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert len(got) + sum(1 for _ in records) == 4001
