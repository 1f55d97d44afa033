"""The Zstd scan's fast path (runs of whole frames decoded as one region) against its
exact path (each frame by itself, ``region=0``): on any log, damaged in any way, both give
the same records, the same summary and the same damage or error, byte for byte."""

from __future__ import annotations

import io
from itertools import chain
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionlog.backends.zstd import compress_frame
from sessionlog.backends.zstd_frames import MIN_REGION, REGION, FrameScan

from sessionlog import Limits, SessionLogError
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
            by_runs: bool = False) -> tuple:
    """Everything a scan says about ``data``: its records and summary, and its damage or
    the error it raised (type, message, offset). ``by_runs``: read through ``runs()``."""
    scanner = FrameScan(io.BytesIO(data).read, session_id=session_id, where="<mem>", limits=limits, owned=owned,
                        region=region)
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
