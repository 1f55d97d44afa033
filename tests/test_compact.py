"""compact: a Zstd session rewritten into large frames, under the writer lock, atomically,
with identical scan results — never while damaged or owned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import zstandard
from sessionlog.backends.zstd import open_zstd

import sessionlog
from sessionlog import DamageKind, IOFailure
from sessionlog.convert import NothingToCompact, compact, compact_row, exit_code
from sessionlog.durable import FileSystem

CALL = [
    {"type": "turn/start", "turn": "t1"},
    {"type": "user/message", "turn": "t1", "content": "deploy it"},
    {"type": "step/start", "turn": "t1", "step": 1},
    {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
     "tool_calls": [{"id": "c1", "name": "deploy", "arguments": {}}]},
    {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c1", "name": "deploy"},
]


def frames_of(data: bytes) -> list[bytes]:
    out = []
    while data:
        obj = zstandard.ZstdDecompressor().decompressobj()
        obj.decompress(data)
        rest = obj.unused_data
        out.append(data[: len(data) - len(rest)])
        data = rest
    return out


def summary(store, sid: str) -> tuple:
    r = store.scan(sid)
    return (r.status, r.record_count, r.last_seq, r.last_ts, r.stable_offset == os.path.getsize(r.path),
            r.damage, r.open_turn, r.open_step, r.unanswered_calls, [x.raw for x in r.records])


def fill(store, sid: str, n: int = 300) -> None:
    store.create(sid)
    for i in range(n):
        store.append(sid, [{"type": "tool/result", "turn": "t0", "step": 1, "call_id": f"c{i}",
                            "output": f"line {i} " * (i % 17), "is_error": False, "unknown": {"k": i}}])


def test_compact_rewrites_into_larger_frames_with_identical_scan(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "s")
    store.append("s", CALL)  # an open turn with an unanswered call: kept as it is
    path = tmp_path / "s.jsonl.zst"
    before = summary(store, "s")
    old_ino, old_size = path.stat().st_ino, path.stat().st_size
    report = store.compact("s", frame_bytes=4096)
    assert report.status == "compacted"
    assert report.frames_before == 302 and report.frames_after == len(frames_of(path.read_bytes()))
    assert report.frames_after < 20
    assert summary(store, "s") == before
    assert path.stat().st_ino != old_ino and path.stat().st_size < old_size
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    for frame in frames_of(path.read_bytes()):
        assert len(zstandard.ZstdDecompressor().decompress(frame)) <= 4096
        assert zstandard.get_frame_parameters(frame).has_checksum
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    # The default: frames up to the batch limit (1 MiB): the header's own frame, then one
    # frame for the rest of this session.
    assert store.compact("s").frames_after == 2
    assert summary(store, "s") == before


def test_compacting_twice_changes_nothing(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "s", 50)
    assert store.compact("s").status == "compacted"
    data = (tmp_path / "s.jsonl.zst").read_bytes()
    ino = (tmp_path / "s.jsonl.zst").stat().st_ino
    assert store.compact("s").status == "unchanged"
    assert (tmp_path / "s.jsonl.zst").read_bytes() == data
    assert (tmp_path / "s.jsonl.zst").stat().st_ino == ino


def test_a_damaged_session_is_never_compacted(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "s", 20)
    path = tmp_path / "s.jsonl.zst"
    path.write_bytes(path.read_bytes()[:-5])
    damaged = path.read_bytes()
    report = store.compact("s")
    assert report.status == "refused" and report.damage.kind is DamageKind.TORN
    assert path.read_bytes() == damaged
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    [result] = compact(f"zstd:{tmp_path}")
    assert result.status == "refused" and result.exit_code == 1
    row = compact_row(result)  # nothing was rewritten: no counts of frames never written
    assert (row["frames_before"], row["frames_after"], row["bytes_after"]) == (None, None, None)
    assert row["bytes_before"] == len(damaged)
    store.repair("s")
    assert store.compact("s").status == "compacted"


def test_an_owned_session_is_not_compacted(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "s", 10)
    data = (tmp_path / "s.jsonl.zst").read_bytes()
    with store.session("s"):
        assert store.compact("s").status == "locked"
        [result] = compact(f"zstd:{tmp_path}")
        assert result.exit_code == 5
    assert (tmp_path / "s.jsonl.zst").read_bytes() == data


def test_compact_makes_no_lock_file_unless_it_replaces_the_log(tmp_path):
    """A log already compact, or damaged, is left as it is with no lock file made for it
    (lock files are never removed): the lock is taken only to replace the log."""
    store = open_zstd(str(tmp_path))
    fill(store, "s", 20)
    fill(store, "d", 20)
    assert store.compact("s").status == "compacted"
    torn = tmp_path / "d.jsonl.zst"
    torn.write_bytes(torn.read_bytes()[:-5])
    for name in os.listdir(tmp_path):
        if name.endswith(".lock"):
            os.unlink(tmp_path / name)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    assert store.compact("s").status == "unchanged"
    assert store.compact("d").status == "refused"
    assert [row.status for row in compact(f"zstd:{tmp_path}")] == ["refused", "unchanged"]
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before


def test_an_append_while_compact_copies_the_log_is_kept(tmp_path):
    """The copy is made before the lock is taken: an append that lands meanwhile (another
    writer holding the lock for it) makes compact copy the log again under the lock, and
    the compacted log holds it."""
    store = open_zstd(str(tmp_path))
    fill(store, "s", 300)
    other = sessionlog.open_store(f"zstd:{tmp_path}")
    appended: list[int] = []

    def append_once(_done: int) -> None:
        if not appended:
            appended.append(other.append("s", [{"type": "during", "k": 1}]))

    report = store.compact("s", frame_bytes=4096, progress=append_once)
    assert report.status == "compacted" and appended == [302]
    records = [record.raw for record in store.read("s")]
    assert len(records) == 302 and b'"type":"during"' in records[-1]
    assert store.scan("s").status.value == "clean"


def test_appends_after_compaction_continue_the_log(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "s", 10)
    other = sessionlog.open_store(f"zstd:{tmp_path}")  # another store object, as another process would
    assert other.append("s", [{"type": "before"}]) == 12
    store.compact("s")
    assert other.append("s", [{"type": "after"}]) == 13
    with other.session("s") as handle:
        assert handle.append([{"type": "owned"}]) == 14
    assert store.scan("s").status == "clean"
    assert [r.type for r in store.read("s", after_seq=11)] == ["before", "after", "owned"]


def test_skippable_frames_are_not_carried_over(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "s", 5)
    path = tmp_path / "s.jsonl.zst"
    path.write_bytes(path.read_bytes() + b"\x50\x2a\x4d\x18\x03\x00\x00\x00abc")
    before = [r.raw for r in store.read("s")]
    report = store.compact("s")
    assert report.status == "compacted" and report.dropped_skippable_frames == 1
    assert [r.raw for r in store.read("s")] == before
    assert store.frame_stats("s").skipped_frames == 0


class FailingFs(FileSystem):
    def __init__(self, op: str) -> None:
        self.op = op
        self.armed = False

    def rename(self, src: str, dst: str) -> None:
        if self.armed and self.op == "rename":
            raise OSError(28, "No space left on device")
        super().rename(src, dst)

    def fsync(self, fd: int) -> None:
        if self.armed and self.op == "fsync":
            raise OSError(5, "Input/output error")
        super().fsync(fd)


@pytest.mark.parametrize("op", ["rename", "fsync"])
def test_a_failed_compaction_leaves_the_log_as_it_was(tmp_path, op):
    fs = FailingFs(op)
    store = open_zstd(str(tmp_path), fs=fs)
    fill(store, "s", 30)
    data = (tmp_path / "s.jsonl.zst").read_bytes()
    fs.armed = True
    with pytest.raises(IOFailure) as info:
        store.compact("s")
    assert isinstance(info.value.__cause__, OSError)
    assert (tmp_path / "s.jsonl.zst").read_bytes() == data
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    fs.armed = False
    assert store.compact("s").status == "compacted"


def test_compact_a_whole_store_reports_each_session(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "a", 20)
    fill(store, "b", 1)
    store.compact("b")
    fill(store, "c", 5)
    (tmp_path / "c.jsonl.zst").write_bytes((tmp_path / "c.jsonl.zst").read_bytes() + b"\0" * 10)
    results = {r.session: r for r in compact(str(tmp_path))}  # a plain directory works too
    assert {k: r.status for k, r in results.items()} == {"a": "compacted", "b": "unchanged", "c": "refused"}
    assert exit_code(results.values()) == 1
    [one] = compact(str(tmp_path / "a.jsonl.zst"))
    assert one.session == "a" and one.status == "unchanged"
    jsonl = sessionlog.open_store(f"jsonl:{tmp_path / 'j'}")
    jsonl.create("x")
    with pytest.raises(NothingToCompact):
        compact(f"jsonl:{tmp_path / 'j'}")


CHILD_APPENDS = textwrap.dedent("""
    import sys
    import sessionlog
    store = sessionlog.open_store(sys.argv[1], lock_timeout=30)
    for i in range(int(sys.argv[2])):
        store.append("s", [{"type": "child", "i": i}])
        print(i, flush=True)
""")


def test_concurrent_appends_in_another_process_survive_compaction(tmp_path):
    """A writer process doing one-shot appends while this process compacts again and
    again: every acknowledged append is in the compacted log, in order."""
    store = open_zstd(str(tmp_path))
    fill(store, "s", 20)
    n = 150
    child = subprocess.Popen([sys.executable, "-c", CHILD_APPENDS, f"zstd:{tmp_path}", str(n)],
                             stdout=subprocess.PIPE, text=True)
    compacted = 0
    while child.poll() is None:
        report = store.compact("s", frame_bytes=[2048, 8192][compacted % 2])
        compacted += report.status == "compacted"
        time.sleep(0.002)
    assert child.wait() == 0
    acknowledged = child.stdout.read().split()
    assert len(acknowledged) == n
    assert compacted >= 1
    result = store.scan("s")
    assert result.status == "clean"
    assert [r["i"] for r in result.records if r.type == "child"] == list(range(n))


CHILD_COMPACTS = textwrap.dedent("""
    import sys
    from sessionlog.backends.zstd import open_zstd
    store = open_zstd(sys.argv[1])
    i = 0
    print("ready", flush=True)
    while True:
        store.compact("s", frame_bytes=[1024, 65536][i % 2], level=1)
        i += 1
""")


@pytest.mark.kill
def test_sigkill_during_compaction_never_loses_the_log(tmp_path):
    store = open_zstd(str(tmp_path))
    fill(store, "s", 400)
    expected = summary(store, "s")
    for delay in (0.05, 0.13, 0.31):
        child = subprocess.Popen([sys.executable, "-c", CHILD_COMPACTS, str(tmp_path)], stdout=subprocess.PIPE)
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert summary(store, "s") == expected
    open_zstd(str(tmp_path))  # a new store sweeps the dead compactor's temp file
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
