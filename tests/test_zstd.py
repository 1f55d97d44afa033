"""The Zstd backend: the frame format on disk, the frame scanner's damage rules, batch
atomicity, limits against hostile files, interop with the zstd tool and python-zstandard."""

from __future__ import annotations

import io
import os
import shutil
import subprocess

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionlog.backends.zstd import TAIL_WINDOW, compress_frame, open_zstd
from sessionlog.backends.zstd_frames import FrameLimits, FrameScan
from sessions import answered_exactly_once, batches, crashed_sessions

import sessionlog
from sessionlog import AppendFailed, CorruptLog, DamageKind, InvalidStoreUrl, Limits
from sessionlog.convert import convert
from sessionlog.durable import FileSystem

EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    400 if os.environ.get("SESSIONLOG_SLOW") else 40
)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])
ZSTD_CLI = shutil.which("zstd")
SKIPPABLE = (0x184D2A5A).to_bytes(4, "little")
HUGE_WINDOW = b"\x28\xb5\x2f\xfd" + bytes([0x04, 31 << 3]) + b"\x01\x00\x00" + b"\0" * 4
"""A frame header declaring a 2 TiB window (no single segment, checksum flag) and one
empty last raw block."""
SMALL = Limits(record_limit=1000, batch_limit=1000)

TURN = [
    {"type": "turn/start", "turn": "t1"},
    {"type": "user/message", "turn": "t1", "content": "list the files"},
    {"type": "step/start", "turn": "t1", "step": 1},
    {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
     "tool_calls": [{"id": "c1", "name": "ls", "arguments": {"path": "."}}]},
    {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c1", "name": "ls"},
    {"type": "tool/result", "turn": "t1", "step": 1, "call_id": "c1", "output": "a.txt\nb.txt", "is_error": False},
    {"type": "runtime/custom", "nested": {"keep": [1, 2.5, None, "ü"]}, "extra": "verbatim"},
    {"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
    {"type": "turn/end", "turn": "t1", "status": "completed"},
]


def split_frames(data: bytes) -> list[bytes]:
    """The frames of a file, found by python-zstandard itself (not by our walker)."""
    frames = []
    while data:
        obj = zstandard.ZstdDecompressor().decompressobj()
        obj.decompress(data)
        rest = obj.unused_data
        frames.append(data[: len(data) - len(rest)])
        data = rest
    return frames


def frame_content(frame: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(frame)


def scan(data: bytes, *, owned: bool = False, limits: Limits = Limits()) -> tuple[list[bytes], FrameScan]:
    """Scan an in-memory log with the pure frame scanner."""
    src = io.BytesIO(data)
    scanner = FrameScan(src.read, session_id="s", where="<mem>", limits=limits, owned=owned)
    return [r.raw for r in scanner], scanner


def make_log(directory: str, parts: list[list[dict]], **options) -> bytes:
    store = open_zstd(directory, **options)
    store.create("s")
    for batch in parts:
        store.append("s", batch)
    with open(os.path.join(directory, "s.jsonl.zst"), "rb") as f:
        return f.read()


@pytest.fixture
def log(tmp_path) -> bytes:
    """A session of nine one-record frames after the header frame."""
    return make_log(str(tmp_path / "store"), [[e] for e in TURN])


def records_of(frames: list[bytes]) -> list[bytes]:
    return [line for f in frames for line in frame_content(f).splitlines()]


# --- the format on disk ------------------------------------------------------------


def test_each_batch_is_one_frame_with_content_size_and_checksum(tmp_path):
    log = make_log(str(tmp_path), [TURN[:3], TURN[3:4], TURN[4:]])
    frames = split_frames(log)
    assert len(frames) == 4  # header frame + one per append
    for frame in frames:
        params = zstandard.get_frame_parameters(frame)
        assert params.has_checksum
        assert params.content_size == len(frame_content(frame))
        assert frame_content(frame).endswith(b"\n")
    assert [len(frame_content(f).splitlines()) for f in frames] == [1, 3, 1, 5]


def test_frame_content_is_the_jsonl_backends_bytes(tmp_path):
    """The same session, created by appends in JSONL, converted to Zstd: the frames'
    contents concatenated are the JSONL file, byte for byte."""
    jsonl = sessionlog.open_store(f"jsonl:{tmp_path / 'j'}")
    jsonl.create("s")
    for e in TURN:
        jsonl.append("s", [e])
    convert(f"jsonl:{tmp_path / 'j'}", f"zstd:{tmp_path / 'z'}")
    data = (tmp_path / "z" / "s.jsonl.zst").read_bytes()
    expected = (tmp_path / "j" / "s.jsonl").read_bytes()
    assert b"".join(frame_content(f) for f in split_frames(data)) == expected
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    assert reader.read() == expected


@pytest.mark.skipif(ZSTD_CLI is None, reason="the zstd command-line tool is not installed")
def test_zstd_dc_prints_the_jsonl_log(tmp_path):
    zdir = tmp_path / "z"
    store = open_zstd(str(zdir))
    store.create("s")
    for i in range(0, len(TURN), 2):
        store.append("s", TURN[i:i + 2])
    convert(f"zstd:{zdir}", f"jsonl:{tmp_path / 'j'}")
    out = subprocess.run([ZSTD_CLI, "-dc", str(zdir / "s.jsonl.zst")], capture_output=True, check=True).stdout
    assert out == (tmp_path / "j" / "s.jsonl").read_bytes()
    assert [r.raw for r in store.read("s")] == out.splitlines()
    # And zstd -t (integrity test, checksums included) accepts the file.
    subprocess.run([ZSTD_CLI, "-tq", str(zdir / "s.jsonl.zst")], check=True)


@pytest.mark.skipif(ZSTD_CLI is None, reason="the zstd command-line tool is not installed")
def test_a_log_compressed_by_the_zstd_tool_is_read(tmp_path):
    """Reading needs no configuration: a JSONL log compressed by ``zstd`` (any level,
    one frame with content size and checksum) is a Zstd session."""
    jsonl = sessionlog.open_store(f"jsonl:{tmp_path / 'j'}")
    jsonl.create("s", TURN)
    (tmp_path / "z").mkdir()
    subprocess.run([ZSTD_CLI, "-q", "-19", "--check", str(tmp_path / "j" / "s.jsonl"), "-o",
                    str(tmp_path / "z" / "s.jsonl.zst")], check=True)
    store = open_zstd(str(tmp_path / "z"))
    assert store.scan("s").status == "clean"
    assert [r.raw for r in store.read("s")] == (tmp_path / "j" / "s.jsonl").read_bytes().splitlines()
    store.append("s", [{"type": "note"}])  # the tail check accepts the foreign frame too
    assert store.scan("s").last_seq == len(TURN) + 2


def test_compression_level_is_a_write_option_only(tmp_path):
    for level in (-5, 1, 19):
        d = str(tmp_path / f"l{level}")
        st = sessionlog.open_store(f"zstd:{d}", level=level)
        st.create("s", TURN)
        reader = sessionlog.open_store(f"zstd:{d}")  # no options
        assert reader.scan("s").status == "clean"
        assert reader.scan("s").record_count == len(TURN) + 1
    with pytest.raises(InvalidStoreUrl):
        sessionlog.open_store(f"zstd:{tmp_path / 'bad'}", level=99)


def test_atomic_batches_is_declared_true(tmp_path):
    assert open_zstd(str(tmp_path)).atomic_batches is True


# --- prefix scanning: any cut, any flipped byte ----------------------------------


def test_cut_at_every_offset_keeps_exactly_the_whole_frames(log):
    frames = split_frames(log)
    ends = [sum(map(len, frames[: i + 1])) for i in range(len(frames))]
    for cut in range(ends[0], len(log) + 1):
        whole = [f for f, end in zip(frames, ends) if end <= cut]
        kept, scanner = scan(log[:cut])
        assert kept == records_of(whole), cut
        assert scanner.stable_offset == sum(map(len, whole))
        if scanner.stable_offset == cut:
            assert scanner.damage is None
        else:
            assert scanner.damage.kind is DamageKind.TORN, (cut, scanner.damage)
            assert scanner.damage.length == cut - scanner.stable_offset
            assert scanner.damage.records_after == 0
        _, owned = scan(log[:cut], owned=True)
        assert owned.damage is None or owned.damage.kind is DamageKind.IN_FLIGHT


def test_a_cut_inside_the_header_frame_is_not_a_session_log(log):
    first = len(split_frames(log)[0])
    for cut in range(1, first):
        with pytest.raises(CorruptLog, match="not a session log"):
            scan(log[:cut])
    with pytest.raises(CorruptLog, match="not a session log"):
        scan(b"")


@SETTINGS
@given(data=st.data())
def test_any_cut_of_any_session_keeps_the_whole_frames(data, tmp_path_factory):
    events = data.draw(crashed_sessions())
    parts = data.draw(batches(events))
    log = make_log(str(tmp_path_factory.mktemp("s")), parts)
    frames = split_frames(log)
    cut = len(frames[0]) + data.draw(st.integers(0, 1 << 30)) % (len(log) - len(frames[0]) + 1)
    kept, scanner = scan(log[:cut])
    whole, pos = [], 0
    for f in frames:
        if pos + len(f) > cut:
            break
        whole.append(f)
        pos += len(f)
    assert kept == records_of(whole)
    assert scanner.stable_offset == pos
    assert (scanner.damage is None) == (pos == cut)


@pytest.mark.parametrize("mask", [0x01, 0x10, 0x80, 0xFF])
def test_a_flipped_byte_anywhere_is_detected(log, mask):
    """A flipped byte in frame k: the scan keeps exactly frames 0..k-1 and reports damage
    at frame k (mid-log when whole frames follow), or refuses the file when k is the
    header frame — it never returns a changed record.

    The one exception is a flip the decoder cannot see because it does not change the
    content (a don't-care bit of an entropy table): the content and its checksum are
    the original ones, and so are the records returned."""
    frames = split_frames(log)
    starts = [sum(map(len, frames[:i])) for i in range(len(frames))]
    for at in range(len(log)):
        k = max(i for i, s in enumerate(starts) if s <= at)
        bad = bytearray(log)
        bad[at] ^= mask
        if k == 0:
            try:
                kept, scanner = scan(bytes(bad))
            except CorruptLog:
                continue
            assert scanner.damage is None and kept == records_of(frames), at
            continue
        try:
            kept, scanner = scan(bytes(bad))
        except CorruptLog as exc:  # a size field flipped beyond the limits: an error
            assert "exceeds" in str(exc), at
            continue
        if scanner.damage is None:
            flipped = bytes(bad[starts[k]:starts[k] + len(frames[k])])
            assert frame_content(flipped) == frame_content(frames[k]), at
            assert kept == records_of(frames), at
            continue
        assert kept == records_of(frames[:k]), at
        assert scanner.damage is not None and scanner.damage.offset == starts[k], at
        expected = {DamageKind.MID_LOG} if k < len(frames) - 1 else {DamageKind.CORRUPT, DamageKind.TORN}
        assert scanner.damage.kind in expected, (at, scanner.damage)
        if scanner.damage.kind is DamageKind.MID_LOG:
            assert scanner.damage.records_after == len(records_of(frames[k + 1:]))
            assert scanner.damage.dropped_seqs == (k + 2, len(frames))


def test_a_frame_is_the_unit_of_damage(tmp_path):
    """A frame whose checksum verifies but holds a line that does not decode is damage as a
    whole, its decodable records counted as records after the damage (never cut silently)."""
    log = make_log(str(tmp_path), [TURN[:2]])
    bad = compress_frame(b'{"seq":4,"ts":1,"type":"x"}\nnot json\n', 3)
    kept, scanner = scan(log + bad)
    assert len(kept) == 3
    assert scanner.damage.kind is DamageKind.MID_LOG
    assert scanner.damage.records_after == 1
    kept, scanner = scan(log + compress_frame(b"not json\n", 3))
    assert scanner.damage.kind is DamageKind.CORRUPT
    kept, scanner = scan(log + compress_frame(b'{"seq":4,"ts":1,"type":"x"}', 3))  # no newline
    assert scanner.damage.kind is DamageKind.CORRUPT


def test_a_whole_frame_with_the_wrong_seq_is_a_seq_break(tmp_path):
    log = make_log(str(tmp_path), [TURN[:2]])
    kept, scanner = scan(log + compress_frame(b'{"seq":9,"ts":1,"type":"x"}\n', 3))
    assert len(kept) == 3
    assert scanner.damage.kind is DamageKind.SEQ_BREAK
    assert scanner.damage.dropped_seqs == (9, 9)


# --- zero-fill -------------------------------------------------------------------


def test_nuls_at_the_end_are_zero_fill(log):
    kept, scanner = scan(log + b"\0" * 5000)
    assert scanner.damage.kind is DamageKind.ZERO_FILL
    assert scanner.stable_offset == len(log)


def test_nuls_then_a_whole_frame_within_the_batch_limit_are_mid_log(log):
    """Every write to a Zstd log is one frame, and the next one starts after its sync: a
    verified frame after the NULs is a later append, so the NULs lie in acknowledged
    history, however close to it (JSONL, whose appends have no boundaries, judges by
    the batch limit instead)."""
    frames = split_frames(log)
    body = b"".join(frames[:-1])
    kept, scanner = scan(body + b"\0" * 4096 + frames[-1])
    assert scanner.damage.kind is DamageKind.MID_LOG
    assert scanner.damage.records_after == 1
    assert kept == records_of(frames[:-1])


def test_nuls_then_frames_beyond_one_append_are_mid_log(log):
    frames = split_frames(log)
    body = b"".join(frames[:-1])
    limits = Limits(record_limit=1024, batch_limit=2048)
    kept, scanner = scan(body + b"\0" * 4096 + frames[-1], limits=limits)
    assert scanner.damage.kind is DamageKind.MID_LOG
    assert scanner.damage.kind.needs_force


# --- skippable frames ------------------------------------------------------------


def skippable(payload: bytes) -> bytes:
    return SKIPPABLE + len(payload).to_bytes(4, "little") + payload


def test_skippable_frames_are_skipped_and_counted(tmp_path):
    d = tmp_path / "store"
    log = make_log(str(d), [TURN[:3], TURN[3:]])
    frames = split_frames(log)
    mixed = frames[0] + skippable(b"seek table?") + frames[1] + skippable(b"") + frames[2] + skippable(b"x" * 100)
    kept, scanner = scan(mixed)
    assert kept == records_of(frames)
    assert scanner.damage is None and scanner.skipped_frames == 3
    (d / "s.jsonl.zst").write_bytes(mixed)
    store = open_zstd(str(d))
    assert store.scan("s").status == "clean"
    assert store.frame_stats("s").skipped_frames == 3
    store.append("s", [{"type": "after-skippable"}])  # tail check walks past the skippable frame
    assert store.scan("s").last_seq == len(TURN) + 2
    if ZSTD_CLI:
        out = subprocess.run([ZSTD_CLI, "-dc", str(d / "s.jsonl.zst")], capture_output=True, check=True).stdout
        assert out.splitlines() == [r.raw for r in store.read("s")]


def test_a_skippable_frame_cut_short_is_torn(log):
    kept, scanner = scan(log + skippable(b"0123456789")[:-3])
    assert scanner.damage.kind is DamageKind.TORN
    assert scanner.stable_offset == len(log)


# --- limits against hostile files -------------------------------------------------


def test_a_frame_declaring_content_over_the_limit_is_corrupt(tmp_path):
    """After the header frame a frame over the limits is damage (a flipped size field
    looks just like it), never buffered past the limit."""
    log = make_log(str(tmp_path), [])
    limits = Limits(record_limit=1000, batch_limit=1000)
    big = compress_frame(b'{"seq":2,"ts":1,"type":"x","pad":"' + b"a" * 5000 + b'"}\n', 3)
    kept, scanner = scan(log + big, limits=limits)
    assert len(kept) == 1 and scanner.stable_offset == len(log)
    assert scanner.damage.kind is DamageKind.CORRUPT
    assert "exceeds the frame limit" in scanner.damage.reason


def test_a_frame_declaring_a_huge_window_is_corrupt(tmp_path):
    log = make_log(str(tmp_path), [])
    kept, scanner = scan(log + HUGE_WINDOW)
    assert len(kept) == 1 and scanner.damage.kind is DamageKind.CORRUPT
    assert "window limit" in scanner.damage.reason


def test_a_decompression_bomb_without_content_size_is_bounded(tmp_path):
    """A frame with no content size whose output would exceed the frame limit is a bad
    frame: decompression stops at the limit instead of exhausting memory."""
    log = make_log(str(tmp_path), [])
    cctx = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False)
    bomb = cctx.compress(b"\n" * (64 << 20))
    assert len(bomb) < 64 << 10
    kept, scanner = scan(log + bomb)
    assert len(kept) == 1
    assert scanner.damage.kind is DamageKind.CORRUPT


def test_frames_without_a_checksum_or_with_a_dictionary_are_bad(tmp_path):
    log = make_log(str(tmp_path), [])
    no_check = zstandard.ZstdCompressor(write_checksum=False).compress(b'{"seq":2,"ts":1,"type":"x"}\n')
    _, scanner = scan(log + no_check)
    assert scanner.damage.kind is DamageKind.CORRUPT
    assert "checksum" in scanner.damage.reason


def test_garbage_is_not_a_session_log(tmp_path):
    with pytest.raises(CorruptLog, match="not a session log"):
        scan(os.urandom(4096))
    with pytest.raises(CorruptLog, match="not a session log"):
        scan(b'{"seq":1,"ts":1,"type":"session/start","session":"s","format":"sessionlog/1"}\n')


# --- batches are atomic; append and repair ---------------------------------------


def test_every_prefix_of_an_unacknowledged_batch_leaves_it_absent(tmp_path):
    """A crash at any point of the write: after a scan (and a repair) the batch is either
    all there or not there at all."""
    d = str(tmp_path / "store")
    before = make_log(d, [TURN[:2]])
    store = open_zstd(d)
    store.append("s", TURN[2:7])
    after = (tmp_path / "store" / "s.jsonl.zst").read_bytes()
    n_before = len(records_of(split_frames(before)))
    for cut in range(len(before), len(after) + 1):
        kept, _ = scan(after[:cut])
        assert len(kept) == (n_before + 5 if cut == len(after) else n_before), cut


class FailingSync(FileSystem):
    def __init__(self) -> None:
        self.armed = False

    def fdatasync(self, fd: int) -> None:
        if self.armed:
            raise OSError(5, "Input/output error")
        super().fdatasync(fd)


def test_a_failed_sync_rolls_the_frame_back(tmp_path):
    fs = FailingSync()
    d = str(tmp_path / "store")
    store = sessionlog.open_store(f"zstd:{d}", fs=fs)
    store.create("s", TURN[:2])
    path = tmp_path / "store" / "s.jsonl.zst"
    before = path.read_bytes()
    fs.armed = True
    with pytest.raises(AppendFailed):
        store.append("s", TURN[2:])
    assert path.read_bytes() == before
    fs.armed = False
    assert store.append("s", TURN[2:]) == len(TURN) + 1


def test_append_to_a_torn_tail_is_refused_until_repaired(log, tmp_path):
    d = tmp_path / "store"
    path = d / "s.jsonl.zst"
    path.write_bytes(log[:-2])
    store = open_zstd(str(d))
    with pytest.raises(CorruptLog):
        store.append("s", [{"type": "x"}])
    report = store.repair("s")
    assert report.status == "repaired" and report.damage.kind is DamageKind.TORN
    store.append("s", [{"type": "x"}])
    assert store.scan("s").status == "clean"


def test_repair_appends_one_frame_with_marker_and_closers(tmp_path):
    d = tmp_path / "store"
    log = make_log(str(d), [TURN[:4], TURN[4:5]])  # a durable tool/call, no result
    path = d / "s.jsonl.zst"
    path.write_bytes(log + b"\x28\xb5\x2f\xfd\x24")  # a frame cut after its header byte
    store = open_zstd(str(d))
    report = store.repair("s")
    frames = split_frames(path.read_bytes())
    assert b"".join(frames[:-1]) == log  # cut back to the last whole frame
    last = frame_content(frames[-1]).splitlines()
    assert [r.raw for r in report.appended] == last
    types = [sessionlog.Record.from_line(line).type for line in last]
    assert types == ["log/truncated", "tool/result", "step/end", "turn/end"]
    quarantined = open(report.quarantine, "rb").read()
    assert quarantined == b"\x28\xb5\x2f\xfd\x24"


@SETTINGS
@given(data=st.data())
def test_repair_then_rescan_is_clean_and_idempotent(data, tmp_path_factory):
    d = tmp_path_factory.mktemp("s")
    events = data.draw(crashed_sessions())
    log = make_log(str(d), data.draw(batches(events)))
    first = len(split_frames(log)[0])
    cut = first + data.draw(st.integers(0, 1 << 30)) % (len(log) - first + 1)
    tail = data.draw(st.sampled_from([b"", b"\0" * 700, b"\x28\xb5\x2f", os.urandom(50)]))
    path = d / "s.jsonl.zst"
    path.write_bytes(log[:cut] + tail)
    store = open_zstd(str(d))
    report = store.repair("s")
    assert report.status in ("repaired", "clean")
    result = store.scan("s")
    assert result.status == "clean", result
    assert answered_exactly_once(result.records) == []
    repaired = path.read_bytes()
    assert store.repair("s").status == "clean"
    assert path.read_bytes() == repaired


# --- opening for append validates one append's reach -----------------------------


def session_dir(tmp_path, data: bytes, name: str = "store") -> tuple[str, object]:
    """A store directory holding ``data`` as session ``s``."""
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    path = d / "s.jsonl.zst"
    path.write_bytes(data)
    return str(d), path


def test_append_after_a_duplicated_last_frame_is_refused(log, tmp_path):
    """The last frame written twice: scan reports a seq-break (needs force); an append
    must not be acknowledged after it, where read() would never return it."""
    frames = split_frames(log)
    d, path = session_dir(tmp_path, log + frames[-1])
    store = open_zstd(d)
    assert store.scan("s").damage.kind is DamageKind.SEQ_BREAK
    before = path.read_bytes()
    with pytest.raises(CorruptLog) as err:
        store.append("s", [{"type": "x"}])
    assert err.value.kind == "seq-break" and err.value.offset == len(log)
    assert str(len(log)) in str(err.value) and str(path) in str(err.value)
    assert path.read_bytes() == before


def test_append_after_a_gap_between_the_last_two_frames_is_refused(log, tmp_path):
    """A frame missing before the last one: the last two frames' seqs do not join."""
    frames = split_frames(log)
    d, _ = session_dir(tmp_path, b"".join(frames[:-2]) + frames[-1])
    store = open_zstd(d)
    assert store.scan("s").damage.kind is DamageKind.SEQ_BREAK
    with pytest.raises(CorruptLog) as err:
        store.append("s", [{"type": "x"}])
    assert err.value.kind == "seq-break"
    assert err.value.offset == sum(map(len, frames[:-2]))


@pytest.mark.parametrize("damage", ["repeated-frame", "bad-checksum"])
def test_damage_anywhere_in_one_appends_reach_refuses_an_append(log, tmp_path, damage):
    """Opening checks every frame within one append's reach, as JSONL checks every line
    there: a repeated frame or a frame failing its checksum before the last two refuses
    the append (read() would never return the record), and no byte changes."""
    frames = split_frames(log)
    if damage == "repeated-frame":
        bad = b"".join(frames[:-2]) + frames[-3] + b"".join(frames[-2:])
        kind = DamageKind.SEQ_BREAK
    else:
        third = bytearray(frames[-3])
        third[-6] ^= 0x40  # inside the content (just before the 4-byte checksum)
        bad = b"".join(frames[:-3]) + bytes(third) + b"".join(frames[-2:])
        kind = DamageKind.MID_LOG
    d, path = session_dir(tmp_path, bad)
    store = open_zstd(d)
    assert store.scan("s").damage.kind is kind
    with pytest.raises(CorruptLog):
        store.append("s", [{"type": "acknowledged?"}])
    assert path.read_bytes() == bad


def test_seq_damage_beyond_one_appends_reach_is_left_to_scan(log, tmp_path):
    """What opening does not read: frames before one append's reach (here a reach of
    two small frames). A repeated frame there lets an append land; scan reports the
    seq-break, which needs force, so a plain repair never cuts the acknowledged record."""
    from sessionlog.scan import Limits

    frames = split_frames(log)
    bad = b"".join(frames[:-3]) + frames[-4] + b"".join(frames[-3:])
    d, path = session_dir(tmp_path, bad)
    store = open_zstd(d, limits=Limits(batch_limit=len(frames[-1]) + len(frames[-2])))
    store.append("s", [{"type": "probe"}])
    assert store.scan("s").damage.kind is DamageKind.SEQ_BREAK
    after = path.read_bytes()
    assert store.repair("s").status == "refused"
    assert path.read_bytes() == after


def test_append_after_nuls_before_a_whole_frame_is_refused_and_needs_force(log, tmp_path):
    """A NUL hole then one whole frame: the frame is a later append, so the hole lies in
    acknowledged history (mid-log). An append is refused, naming it as scan does; a plain
    repair changes nothing; a forced one cuts there (the frame is quarantined)."""
    frames = split_frames(log)
    body = b"".join(frames[:-1])
    image = body + b"\0" * 4096 + frames[-1]
    d, path = session_dir(tmp_path, image)
    store = open_zstd(d)
    assert store.scan("s").damage.kind is DamageKind.MID_LOG
    with pytest.raises(CorruptLog) as err:
        store.append("s", [{"type": "acknowledged?"}])
    assert path.read_bytes() == image
    assert err.value.kind == "mid-log" and err.value.offset == len(body)
    assert store.repair("s").status == "refused"
    assert path.read_bytes() == image
    assert store.repair("s", force=True).status == "repaired"
    seq = store.append("s", [{"type": "after-repair"}])
    assert store.repair("s").status == "clean"
    assert [r.seq for r in store.read("s")][-1] == seq


def test_append_after_a_bad_frame_followed_by_a_good_one_is_refused(log, tmp_path):
    """A frame that fails its checksum before a whole last frame: mid-log (needs force)."""
    frames = split_frames(log)
    bad = bytearray(frames[-2])
    bad[-1] ^= 0xFF  # the content checksum
    d, path = session_dir(tmp_path, b"".join(frames[:-2]) + bytes(bad) + frames[-1])
    store = open_zstd(d)
    assert store.scan("s").damage.kind is DamageKind.MID_LOG
    with pytest.raises(CorruptLog) as err:
        store.append("s", [{"type": "x"}])
    assert path.read_bytes() == b"".join(frames[:-2]) + bytes(bad) + frames[-1]
    assert err.value.kind == "mid-log" and err.value.offset == sum(map(len, frames[:-2]))


def mutations() -> st.SearchStrategy:
    return st.one_of(
        st.tuples(st.just("duplicate"), st.integers(1, 1 << 20)),
        st.tuples(st.just("drop"), st.integers(1, 1 << 20)),
        st.tuples(st.just("swap"), st.integers(1, 1 << 20)),
        st.tuples(st.just("nuls"), st.integers(1, 1 << 20), st.integers(1, 3000)),
        st.tuples(st.just("flip"), st.integers(0, 1 << 30), st.integers(1, 255)),
        st.tuples(st.just("cut"), st.integers(0, 1 << 30)),
        st.tuples(st.just("none")),
    )


def mutate(frames: list[bytes], how: tuple) -> bytes:
    """The log with its frames after the header frame changed by ``how``."""
    head, rest = frames[:1], list(frames[1:])
    what = how[0]
    if what == "none" or not rest:
        return b"".join(frames)
    i = how[1] % len(rest)
    if what == "duplicate":
        rest.insert(i, rest[i])
    elif what == "drop":
        del rest[i]
    elif what == "swap":
        j = (i + 1) % len(rest)
        rest[i], rest[j] = rest[j], rest[i]
    elif what == "nuls":
        rest[i] = b"\0" * how[2] + rest[i]
    body = b"".join(rest)
    if what == "flip":
        at = how[1] % len(body)
        body = body[:at] + bytes([body[at] ^ how[2]]) + body[at + 1:]
    elif what == "cut":
        body = body[: how[1] % (len(body) + 1)]
    return b"".join(head) + body


@SETTINGS
@given(data=st.data())
def test_an_acknowledged_append_is_never_cut_by_a_plain_repair(data, tmp_path_factory):
    """Any damage after the header frame (a repeated, dropped or swapped frame, NULs, a
    flipped byte, a cut): opening for append refuses only what scan reports as damage,
    and when it acknowledges an append the record is either read back, or behind damage
    that needs force — never behind damage a plain repair would truncate it with."""
    d = tmp_path_factory.mktemp("s")
    events = data.draw(crashed_sessions())
    log = make_log(str(d), data.draw(batches(events)))
    bad = mutate(split_frames(log), data.draw(mutations()))
    path = d / "s.jsonl.zst"
    path.write_bytes(bad)
    store = open_zstd(str(d))
    damage = store.scan("s").damage
    try:
        seq = store.append("s", [{"type": "probe"}])
    except CorruptLog as exc:
        assert damage is not None, exc
        assert path.read_bytes() == bad
        assert exc.offset is not None and exc.offset <= len(bad)
        return
    if damage is None:
        assert [r.seq for r in store.read("s")][-1] == seq
        return
    assert damage.kind.needs_force, damage
    after = path.read_bytes()
    assert store.repair("s").status == "refused"
    assert path.read_bytes() == after


class CountingReads(FileSystem):
    def __init__(self) -> None:
        self.bytes_read = 0

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        data = super().pread(fd, n, offset)
        self.bytes_read += len(data)
        return data


def test_opening_a_large_log_reads_only_one_appends_reach(tmp_path):
    """The tail check reads the header frame and about one append's reach from the
    end, whatever the log's size."""
    limits = Limits(record_limit=4096, batch_limit=16 << 10)
    d = str(tmp_path / "store")
    store = open_zstd(d, limits=limits)
    store.create("s")
    rnd = __import__("random").Random(7)
    for i in range(600):
        store.append("s", [{"type": "tool/result", "i": i, "output": f"{rnd.getrandbits(4800):x}"}])
    size = os.path.getsize(os.path.join(d, "s.jsonl.zst"))
    assert size > 16 * limits.batch_limit
    fs = CountingReads()
    counted = open_zstd(d, limits=limits, fs=fs)
    with counted.session("s") as handle:
        opened = fs.bytes_read
        handle.append([{"type": "x"}])
    # The header frame's read-ahead, the window where a frame start before the reach is
    # looked for, and the reach itself (at most one frame more than the batch limit).
    bound = 2 * TAIL_WINDOW + limits.batch_limit + FrameLimits.from_limits(limits).frame
    assert opened <= bound < size // 2, (opened, bound, size)


def test_damage_beyond_one_appends_reach_is_left_to_scan(tmp_path):
    """What opening does not look at: a NUL hole more than one append's reach before the
    end. The append lands, and scan then reports the hole as mid-log (needs force): a
    plain repair never cuts the acknowledged record."""
    limits = Limits(record_limit=1024, batch_limit=2048)
    d = str(tmp_path / "store")
    log = make_log(d, [[{"type": "e", "i": i, "pad": f"{i * 7919:x}" * 20}] for i in range(400)], limits=limits)
    frames = split_frames(log)
    assert len(log) - len(frames[0]) > 3 * limits.batch_limit + 2 * FrameLimits.from_limits(limits).frame
    bad = frames[0] + b"\0" * 600 + b"".join(frames[1:])
    path = tmp_path / "store" / "s.jsonl.zst"
    path.write_bytes(bad)
    store = open_zstd(d, limits=limits)
    assert store.append("s", [{"type": "probe"}]) == 402
    assert b'"type":"probe"}\n' in frame_content(path.read_bytes()[len(bad):])
    assert store.scan("s").damage.kind is DamageKind.MID_LOG
    assert store.repair("s").status == "refused"
    assert path.read_bytes()[: len(bad)] == bad


# --- a damaged size field is damage, not an error ----------------------------------


def fcs_field(frame: bytes) -> tuple[int, int]:
    """(offset, length) of a zstd frame's content-size field."""
    fhd = frame[4]
    single, did_len = fhd & 0x20, (0, 1, 2, 4)[fhd & 3]
    fcs_len = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    return 5 + (0 if single else 1) + did_len, fcs_len


def test_a_flipped_content_size_bit_in_the_last_frame_is_repairable(tmp_path):
    """Every single-bit flip of the last frame's content-size field: scan reports corrupt
    (never an error), repair truncates the frame, and the session is clean again."""
    d = str(tmp_path / "store")
    log = make_log(d, [TURN[:3], [{"type": "pad", "pad": "x" * 300}]], limits=SMALL)
    frames = split_frames(log)
    start = len(log) - len(frames[-1])
    at, n = fcs_field(frames[-1])
    assert n >= 2
    path = tmp_path / "store" / "s.jsonl.zst"
    over_limit = 0
    for bit in range(8 * n):
        bad = bytearray(log)
        bad[start + at + bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(bad))
        store = open_zstd(d, limits=SMALL)
        result = store.scan("s")
        assert result.damage.kind is DamageKind.CORRUPT and result.damage.offset == start, (bit, result.damage)
        assert result.status == "repairable"
        over_limit += "exceeds the frame limit" in result.damage.reason
        with pytest.raises(CorruptLog) as err:
            store.append("s", [{"type": "x"}])
        assert err.value.kind == "corrupt" and err.value.offset == start
        report = store.repair("s")
        assert report.status == "repaired" and report.damage.kind is DamageKind.CORRUPT
        assert store.scan("s").status == "clean"
        assert path.read_bytes().startswith(log[:start])
    assert over_limit >= 4  # the high bits declare sizes beyond the limit


def test_the_cli_scans_and_repairs_a_flipped_size_field(tmp_path):
    from sessionlog.cli import main

    d = str(tmp_path / "store")
    log = make_log(d, [TURN[:3], [{"type": "pad", "pad": "x" * 70_000}]])
    frames = split_frames(log)
    start = len(log) - len(frames[-1])
    at, n = fcs_field(frames[-1])
    bad = bytearray(log)
    bad[start + at + n - 1] ^= 0x80
    assert int.from_bytes(bad[start + at:start + at + n], "little") > FrameLimits.from_limits(Limits()).content
    path = tmp_path / "store" / "s.jsonl.zst"
    path.write_bytes(bytes(bad))
    out = io.StringIO()
    assert main(["scan", str(path)], out) == 1, out.getvalue()
    assert "corrupt" in out.getvalue()
    assert main(["repair", str(path)], io.StringIO()) == 0
    assert main(["scan", str(path)], io.StringIO()) == 0
    assert path.read_bytes().startswith(log[:start])


def test_a_frame_over_the_limits_before_good_frames_is_mid_log(log):
    frames = split_frames(log)
    body, after = b"".join(frames[:3]), b"".join(frames[3:])
    too_big = compress_frame(b'{"seq":4,"ts":1,"type":"x","pad":"' + b"a" * 5000 + b'"}\n', 3)
    for hostile, limits in ((HUGE_WINDOW, Limits()), (too_big, SMALL)):
        kept, scanner = scan(body + hostile + after, limits=limits)
        assert kept == records_of(frames[:3])
        assert scanner.damage.kind is DamageKind.MID_LOG
        assert scanner.damage.offset == len(body)
        assert scanner.damage.records_after == len(records_of(frames[3:]))
        assert "limit" in scanner.damage.reason


def test_a_header_frame_over_the_limits_is_an_error(tmp_path):
    """The first frame over the limits is not damage: the file is not a session log this
    reader can take (an error, exit 4), and nothing is repaired."""
    store = open_zstd(str(tmp_path))
    store.create("s", [{"type": "pad", "pad": "a" * 5000}])
    log = (tmp_path / "s.jsonl.zst").read_bytes()
    assert len(split_frames(log)) == 1
    for session_id in (None, "s"):
        with pytest.raises(CorruptLog, match="exceeds the frame limit") as err:
            list(FrameScan(io.BytesIO(log).read, session_id=session_id, where="<mem>", limits=SMALL))
        assert err.value.offset == 0 and err.value.kind is None
    with pytest.raises(CorruptLog, match="window limit"):
        scan(HUGE_WINDOW + log)
    small = open_zstd(str(tmp_path), limits=SMALL)
    with pytest.raises(CorruptLog, match="exceeds the frame limit"):
        small.scan("s")
    with pytest.raises(CorruptLog, match="exceeds the frame limit"):
        small.append("s", [{"type": "x"}])
    assert (tmp_path / "s.jsonl.zst").read_bytes() == log


# --- large, multi-block frames (what compact writes) ------------------------------


class BigLog(tuple):
    def __repr__(self) -> str:  # keep hypothesis' failure reports short
        return "<big log>"


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> tuple[str, bytes]:
    """A compacted session whose frames span several 128 KiB blocks."""
    d = tmp_path_factory.mktemp("big")
    store = open_zstd(str(d))
    store.create("s")
    rnd = __import__("random").Random(5)
    words = ["alpha", "beta", "gamma", "delta", "tool", "call", "result", "file", "line"]
    for i in range(40):
        store.append("s", [{"type": "tool/result", "call_id": f"c{i}", "is_error": False,
                            "output": " ".join(rnd.choice(words) + str(rnd.randrange(10**6)) for _ in range(3000))}])
    assert store.compact("s", frame_bytes=300_000).status == "compacted"
    return BigLog((str(d), (d / "s.jsonl.zst").read_bytes()))


def test_large_frames_have_several_blocks_and_append_after_them(big_log, tmp_path):
    d, log = big_log
    frames = split_frames(log)
    assert len(frames) >= 3 and max(map(len, frames)) > 1 << 16  # beyond the tail read-ahead
    kept, scanner = scan(log)
    assert scanner.damage is None and kept == records_of(frames)
    copy = tmp_path / "s.jsonl.zst"
    copy.write_bytes(log)
    store = open_zstd(str(tmp_path))
    assert store.append("s", [{"type": "after-big-frame"}]) == len(kept) + 1


@SETTINGS
@given(data=st.data())
def test_large_frames_cut_or_flipped_anywhere(big_log, data):
    _, log = big_log
    frames = split_frames(log)
    starts = [sum(map(len, frames[:i])) for i in range(len(frames))]
    at = data.draw(st.integers(starts[1], len(log) - 1))
    k = max(i for i, s in enumerate(starts) if s <= at)
    kept, scanner = scan(log[:at])
    assert kept == records_of(frames[:k])
    if at == starts[k]:
        assert scanner.damage is None
    else:
        assert scanner.damage.kind is DamageKind.TORN and scanner.damage.offset == starts[k]
    bad = bytearray(log)
    bad[at] ^= data.draw(st.integers(1, 255))
    try:
        kept, scanner = scan(bytes(bad))
    except CorruptLog as exc:
        assert "exceeds" in str(exc)
        return
    if scanner.damage is None:  # a don't-care bit: the content is the original
        assert kept == records_of(frames)
    else:
        assert kept == records_of(frames[:k]) and scanner.damage.offset == starts[k]


CHILD_WRITER = """
import sys
import sessionlog
store = sessionlog.open_store(sys.argv[1])
store.create("s")
with store.session("s") as handle:
    print("ready", flush=True)
    i = 0
    while True:
        n = 1 + i % 5
        handle.append([{"type": "batch", "batch": i, "part": j, "of": n, "pad": "x" * (i % 700)} for j in range(n)])
        print(i, flush=True)
        i += 1
"""


@pytest.mark.kill
@pytest.mark.parametrize("delay", [0.05, 0.2, 0.45])
def test_sigkill_mid_append_leaves_whole_batches_and_every_acknowledged_one(tmp_path, delay):
    import signal
    import sys
    import time

    url = f"zstd:{tmp_path / 'st'}"
    child = subprocess.Popen([sys.executable, "-c", CHILD_WRITER, url], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait()
    acknowledged = [int(x) for x in child.stdout.read().split()]
    store = sessionlog.open_store(url)
    result = store.scan("s")
    batches_seen: dict[int, list[int]] = {}
    for r in result.records[1:]:
        batches_seen.setdefault(r["batch"], []).append(r["part"])
    for i, parts in batches_seen.items():
        assert parts == list(range(1 + i % 5)), f"batch {i} is not whole: {parts}"
    assert set(acknowledged) <= set(batches_seen)
    assert sorted(batches_seen) == list(range(len(batches_seen)))
    assert len(batches_seen) - len(acknowledged) in (0, 1)
    store.repair("s")
    assert store.scan("s").status == "clean"


@pytest.mark.parametrize("rewrite", ["convert", "compact"])
def test_a_flipped_byte_in_a_whole_session_frame_is_damage_not_a_lost_header(tmp_path, rewrite):
    """A session written whole (convert, compact) keeps its header in a frame of its own:
    a flipped byte in the records' frame is damage at that frame's offset (repairable),
    never 'not a session log' with no way forward."""
    jsonl = sessionlog.open_store(f"jsonl:{tmp_path / 'j'}")
    jsonl.create("s1")
    for i in range(300):
        jsonl.append("s1", [{"type": "user/message", "turn": "t1", "content": f"hello {i} " * 5}])
    jsonl.close()
    if rewrite == "convert":
        convert(f"jsonl:{tmp_path / 'j'}", f"zstd:{tmp_path / 'z'}")
    else:
        shutil.copytree(tmp_path / "j", tmp_path / "plain")
        convert(f"jsonl:{tmp_path / 'plain'}", f"zstd:{tmp_path / 'z'}")
        with sessionlog.open_store(f"zstd:{tmp_path / 'z'}") as store:
            store.compact("s1")
    path = tmp_path / "z" / "s1.jsonl.zst"
    data = bytearray(path.read_bytes())
    header = zstandard.ZstdDecompressor().decompressobj()
    assert header.decompress(bytes(data)).count(b"\n") == 1  # the first frame is the header alone
    second = len(data) - len(header.unused_data)
    data[(second + len(data)) // 2] ^= 0x10
    path.write_bytes(bytes(data))

    with sessionlog.open_store(f"zstd:{tmp_path / 'z'}") as store:
        res = store.scan("s1")
        assert res.damage is not None and res.damage.offset == second
        assert res.last_seq == 1 and res.status.value == "repairable"
