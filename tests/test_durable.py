"""Durability under injected faults, through the engine's one I/O seam (durable.FileSystem)."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil

import pytest
from sessionlog.backends.jsonl import open_jsonl

import sessionlog
from sessionlog import AppendFailed, CorruptLog, DamageKind, SessionExists, StoreClosed
from sessionlog.durable import FileSystem

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


class Faulty(FileSystem):
    """Fails the Nth call of one operation (1-based), once, with the given exception."""

    def __init__(self) -> None:
        self.plan: dict[str, tuple[int, BaseException]] = {}
        self.calls: dict[str, int] = {}
        self.short_writes = False

    def fail(self, op: str, nth: int = 1, exc: BaseException | None = None) -> None:
        self.calls[op] = 0
        self.plan[op] = (nth, exc if exc is not None else OSError(errno.EIO, "injected I/O error"))

    def _hit(self, op: str) -> None:
        if op in self.plan:
            self.calls[op] += 1
            nth, exc = self.plan[op]
            if self.calls[op] == nth:
                del self.plan[op]
                raise exc

    def write(self, fd, data):
        self._hit("write")
        if self.short_writes and len(data) > 1:
            return super().write(fd, data[: max(1, len(data) // 3)])
        return super().write(fd, data)

    def fsync(self, fd):
        self._hit("fsync")
        super().fsync(fd)

    def fdatasync(self, fd):
        self._hit("fdatasync")
        super().fdatasync(fd)

    def ftruncate(self, fd, size):
        self._hit("ftruncate")
        super().ftruncate(fd, size)

    def link(self, src, dst):
        self._hit("link")
        super().link(src, dst)


@pytest.fixture
def faulty(tmp_path):
    fs = Faulty()
    store = open_jsonl(str(tmp_path / "store"), fs=fs)
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    return store, fs, tmp_path / "store" / "s1.jsonl"


def test_failed_fdatasync_rolls_back_and_poisons_the_handle(faulty):
    store, fs, path = faulty
    before = path.read_bytes()
    with store.session("s1") as s:
        fs.fail("fdatasync")
        with pytest.raises(AppendFailed) as info:
            s.append([{"type": "x"}])
        assert not info.value.outcome_unknown
        assert isinstance(info.value.__cause__, OSError)
        assert path.read_bytes() == before  # truncated back
        with pytest.raises(StoreClosed):
            s.append([{"type": "y"}])
    # A new handle works, and the seq was not consumed by the failed batch.
    assert store.append("s1", [{"type": "y"}]) == 3
    assert [r["type"] for r in store.read("s1")] == ["session/start", "turn/start", "y"]


def test_enospc_mid_batch_rolls_back(faulty):
    store, fs, path = faulty
    before = path.read_bytes()
    fs.short_writes = True
    fs.fail("write", nth=2, exc=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(AppendFailed) as info:
        store.append("s1", [{"type": "x", "blob": "a" * 5000}])
    assert info.value.__cause__.errno == errno.ENOSPC
    assert path.read_bytes() == before


def test_short_writes_are_completed(faulty):
    store, fs, path = faulty
    fs.short_writes = True
    store.append("s1", [{"type": "x", "blob": "b" * 10000}, {"type": "y"}])
    assert [r["type"] for r in store.read("s1")][-2:] == ["x", "y"]
    assert store.scan("s1").damage is None


def test_keyboard_interrupt_during_sync_rolls_back(faulty):
    store, fs, path = faulty
    before = path.read_bytes()
    fs.fail("fdatasync", exc=KeyboardInterrupt())
    with pytest.raises(AppendFailed) as info:
        store.append("s1", [{"type": "x"}])
    assert isinstance(info.value.__cause__, KeyboardInterrupt)
    assert path.read_bytes() == before


def test_failed_rollback_is_unknown_and_refuses_further_appends(faulty):
    store, fs, path = faulty
    fs.fail("fdatasync")
    fs.fail("ftruncate")
    with pytest.raises(AppendFailed) as info:
        store.append("s1", [{"type": "x"}])
    assert info.value.outcome_unknown
    with pytest.raises(AppendFailed) as again:
        store.append("s1", [{"type": "y"}])
    assert again.value.outcome_unknown
    # A later process (a new store object here) rescans and finds the batch whole.
    fresh = open_jsonl(str(path.parent))
    assert [r["type"] for r in fresh.read("s1")][-1] == "x"


def test_failed_publish_leaves_nothing(tmp_path):
    fs = Faulty()
    store = open_jsonl(str(tmp_path / "st"), fs=fs)
    fs.fail("fsync")
    with pytest.raises(sessionlog.SessionLogError):
        store.create("s1")
    assert os.listdir(tmp_path / "st") == []
    store.create("s1")
    assert store.sessions() == ["s1"]


def test_create_never_overwrites(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s1", [{"type": "mine"}])
    with pytest.raises(SessionExists):
        store.create("s1", [{"type": "theirs"}])
    assert [r["type"] for r in store.read("s1")] == ["session/start", "mine"]
    assert not [n for n in os.listdir(tmp_path / "st") if n.endswith(".tmp")]


def test_modes(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s1")
    with store.session("s1"):
        pass
    assert os.stat(tmp_path / "st").st_mode & 0o777 == 0o700
    assert os.stat(tmp_path / "st" / "s1.jsonl").st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "st" / ".s1.lock").st_mode & 0o777 == 0o600


def test_symlinked_session_file_is_refused(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("real")
    os.symlink(tmp_path / "st" / "real.jsonl", tmp_path / "st" / "link.jsonl")
    with pytest.raises(sessionlog.SessionLogError):
        store.append("link", [{"type": "x"}])
    with pytest.raises(sessionlog.SessionLogError):
        store.scan("link")


def test_append_to_damaged_tail_is_refused(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s1")
    path = tmp_path / "st" / "s1.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"seq":2,"ts":1,"ty')
    before = path.read_bytes()
    with pytest.raises(CorruptLog) as info:
        store.append("s1", [{"type": "x"}])
    assert info.value.path.endswith("s1.jsonl")
    assert path.read_bytes() == before  # never glued onto the torn line
    with store.session("s1", repair=True) as s:
        assert s.append([{"type": "x"}]) == 3
    assert store.scan("s1").status == "clean"


def test_handle_follows_another_writer(tmp_path):
    a = open_jsonl(str(tmp_path / "st"))
    b = open_jsonl(str(tmp_path / "st"))
    a.create("s1")
    assert a.append("s1", [{"type": "from-a"}]) == 2
    assert b.append("s1", [{"type": "from-b"}]) == 3
    assert a.append("s1", [{"type": "from-a"}]) == 4
    assert [r["seq"] for r in a.read("s1")] == [1, 2, 3, 4]


def test_handle_notices_a_replaced_file(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s1", [{"type": "x"}])
    path = tmp_path / "st" / "s1.jsonl"
    with store.session("s1") as s:
        s.append([{"type": "y"}])
        # What compact does: a new inode with the same records renamed over the old name.
        tmp = tmp_path / "st" / "copy"
        shutil.copyfile(path, tmp)
        os.rename(tmp, path)
        assert s.append([{"type": "z"}]) == 4
    assert [r["type"] for r in store.read("s1")] == ["session/start", "x", "y", "z"]


def test_repair_interrupted_after_its_cut_is_finished_by_the_next(tmp_path):
    fs = Faulty()
    store = open_jsonl(str(tmp_path / "st"), fs=fs)
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    path = tmp_path / "st" / "s1.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"seq":3,"ts":1,"type":"tool')
    torn = path.read_bytes()
    fs.fail("write", nth=2)  # the 1st write publishes the quarantine, the 2nd appends the marker
    with pytest.raises(sessionlog.SessionLogError):
        store.repair("s1")
    quarantines = [n for n in os.listdir(path.parent) if n.endswith(".quarantine")]
    assert len(quarantines) == 1
    cut = path.read_bytes()
    assert torn == cut + (path.parent / quarantines[0]).read_bytes()
    res = store.scan("s1")
    assert res.damage is None and res.status == "repairable"
    assert res.unmarked_quarantines == quarantines
    from sessionlog.cli import main

    out = io.StringIO()
    assert main(["scan", str(path)], out=out) == 1  # the table says what is left to do
    assert f"{quarantines[0]} holds bytes cut from the log that no log/truncated record names" in out.getvalue()
    out = io.StringIO()
    assert main(["scan", str(path), "--json"], out=out) == 1
    assert json.loads(out.getvalue())["unmarked_quarantines"] == quarantines
    rep = store.repair("s1")
    assert rep.reason == "unmarked quarantine and open transcript"  # the marker, then turn t1's closer
    marker = dict(rep.appended[0])
    assert marker["type"] == "log/truncated" and marker["quarantine"] == quarantines[0]
    assert marker["offset"] == len(cut) and marker["dropped_bytes"] == len(torn) - len(cut)
    assert store.scan("s1").status == "clean"
    assert store.repair("s1").status == "clean"


class Crash(BaseException):
    """The process stopping where it is raised (nothing after it runs, no handler but the
    test's own)."""


def test_repair_interrupted_before_its_cut_reuses_the_quarantine(tmp_path):
    fs = Faulty()
    store = open_jsonl(str(tmp_path / "st"), fs=fs)
    store.create("s1")
    path = tmp_path / "st" / "s1.jsonl"
    with open(path, "ab") as f:
        f.write(b"\0" * 100)
    fs.fail("ftruncate", exc=Crash())
    with pytest.raises(Crash):
        store.repair("s1")
    assert len([n for n in os.listdir(path.parent) if n.endswith(".quarantine")]) == 1
    rep = store.repair("s1")
    quarantines = [n for n in os.listdir(path.parent) if n.endswith(".quarantine")]
    assert len(quarantines) == 1
    assert [r["type"] for r in rep.appended] == ["log/truncated"]
    assert store.scan("s1").status == "clean"


def torn_session(tmp_path):
    """A JSONL session on a Faulty file system whose last record is torn."""
    fs = Faulty()
    store = open_jsonl(str(tmp_path / "st"), fs=fs)
    store.create("s1")
    path = tmp_path / "st" / "s1.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"seq":2,"ts"')
    return fs, store, path


def test_a_repair_that_cannot_cut_the_log_leaves_no_quarantine(tmp_path):
    """The cut fails (an append-only file refuses it): the tail's copy, published just
    before, is withdrawn; the error says where and why; the log keeps every byte and a
    second scan finds no quarantine to name."""
    fs, store, path = torn_session(tmp_path)
    data = path.read_bytes()
    fs.fail("ftruncate", exc=OSError(errno.EPERM, "Operation not permitted"))
    with pytest.raises(sessionlog.IOFailure, match="cutting the log at offset .*Operation not permitted"):
        store.repair("s1")
    assert path.read_bytes() == data
    assert not [n for n in os.listdir(path.parent) if n.endswith(".quarantine")]
    assert store.scan("s1").unmarked_quarantines == []


def test_a_repair_whose_cut_is_not_made_durable_names_its_quarantine(tmp_path):
    """The cut is made but its fsync fails: the quarantine stays (the log may have lost
    the tail), the error names it, and the next repair marks it."""
    fs, store, path = torn_session(tmp_path)
    real_ftruncate = fs.ftruncate

    def ftruncate(fd, size):
        real_ftruncate(fd, size)
        fs.fail("fsync")

    fs.ftruncate = ftruncate
    with pytest.raises(sessionlog.IOFailure, match=r"after quarantining the tail in .*\.quarantine") as info:
        store.repair("s1")
    [quarantine] = [n for n in os.listdir(path.parent) if n.endswith(".quarantine")]
    assert quarantine in str(info.value)
    fs.ftruncate = real_ftruncate
    rep = store.repair("s1")
    assert [r["type"] for r in rep.appended] == ["log/truncated"] and rep.appended[0]["quarantine"] == quarantine
    assert store.scan("s1").status == "clean"


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(FIXTURES) if n.endswith(".jsonl")))
def test_scan_never_writes(tmp_path, name):
    shutil.copy(os.path.join(FIXTURES, name), tmp_path / name)
    st_before = os.stat(tmp_path / name)
    data = (tmp_path / name).read_bytes()
    store = open_jsonl(str(tmp_path), create_dir=False)
    store.scan(name[: -len(".jsonl")])
    store.repair(name[: -len(".jsonl")], dry_run=True)
    assert (tmp_path / name).read_bytes() == data
    assert os.stat(tmp_path / name).st_mtime_ns == st_before.st_mtime_ns
    assert os.listdir(tmp_path) == [name]  # no lock file, no temp


@pytest.mark.parametrize("name", ["mid-log.jsonl", "seq-break.jsonl"])
def test_refused_repair_changes_no_byte(tmp_path, name):
    shutil.copy(os.path.join(FIXTURES, name), tmp_path / name)
    data = (tmp_path / name).read_bytes()
    store = open_jsonl(str(tmp_path))
    rep = store.repair(name[: -len(".jsonl")])
    assert rep.status == "refused"
    assert (tmp_path / name).read_bytes() == data
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".quarantine")]


# --- regressions found in review ------------------------------------------------------


def test_non_string_keys_are_refused_before_anything_is_written(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s1")
    path = tmp_path / "st" / "s1.jsonl"
    before = path.read_bytes()
    for event in ({"type": "x", 1: "a", "1": "b"}, {"type": "x", 1: "a"}):
        with pytest.raises(sessionlog.InvalidEvent):
            store.append("s1", [{"type": "ok"}, event])
    assert path.read_bytes() == before
    assert store.scan("s1").status == "clean"


@pytest.mark.parametrize("damage", ["zero-fill", "seq-break", "corrupt"])
def test_append_is_refused_after_damage_within_one_append(tmp_path, damage):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s1", [{"type": "a", "i": i} for i in range(5)])
    path = tmp_path / "st" / "s1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    if damage == "zero-fill":  # a NUL hole, then a later page of the same write that landed
        bad = b"".join(lines[:4]) + b"\0" * 50 + b"\n" + lines[5]
    elif damage == "seq-break":  # the last record repeated
        bad = b"".join(lines) + lines[-1]
    else:  # a whole line that does not decode, then a record
        bad = b"".join(lines[:5]) + b"{not json}\n" + lines[5]
    path.write_bytes(bad)
    fresh = open_jsonl(str(tmp_path / "st"))
    with pytest.raises(CorruptLog):
        fresh.append("s1", [{"type": "new"}])
    assert path.read_bytes() == bad  # nothing glued after the damage


def test_quarantine_of_a_longer_session_id_is_not_claimed(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("a")
    store.create("a.jsonl.x")
    with open(tmp_path / "st" / "a.jsonl.x.jsonl", "ab") as f:
        f.write(b'{"seq":2,"ts":1,"ty')
    rep = store.repair("a.jsonl.x")
    assert rep.quarantine is not None
    assert store.scan("a").status == "clean"
    assert store.repair("a").status == "clean"
    store.delete("a")
    assert os.path.exists(rep.quarantine)  # the other session's dropped bytes are kept


def test_os_errors_on_the_lock_file_are_session_log_errors(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s")
    lock = tmp_path / "st" / ".s.lock"
    os.symlink(tmp_path / "elsewhere", lock)  # O_NOFOLLOW: ELOOP
    for call in (lambda: store.scan("s"), lambda: store.repair("s", dry_run=True),
                 lambda: store.session("s", repair=True), lambda: store.delete("s"),
                 lambda: store.append("s", [{"type": "x"}])):
        with pytest.raises(sessionlog.IOFailure) as info:
            call()
        assert isinstance(info.value.__cause__, OSError)


def test_a_scanner_probe_never_makes_a_writer_fail(tmp_path):
    import threading

    store = open_jsonl(str(tmp_path / "st"))
    store.create("s")
    stop = threading.Event()

    def scanner():
        while not stop.is_set():
            store.scan("s")

    t = threading.Thread(target=scanner)
    t.start()
    try:
        for _ in range(300):
            with store.session("s"):  # timeout 0: only a real owner may refuse it
                pass
    finally:
        stop.set()
        t.join()


def test_failed_rollback_poisons_the_file_for_every_store_in_the_process(faulty):
    store, fs, path = faulty
    fs.fail("fdatasync")
    fs.fail("ftruncate")
    with pytest.raises(AppendFailed):
        store.append("s1", [{"type": "x"}])
    other = open_jsonl(str(path.parent))
    with pytest.raises(AppendFailed) as info:
        other.append("s1", [{"type": "y"}])
    assert info.value.outcome_unknown
    with pytest.raises(AppendFailed):
        other.repair("s1")


def test_a_last_record_of_exactly_the_record_limit_can_be_appended_after(tmp_path):
    limits = sessionlog.Limits(record_limit=200, batch_limit=4096)
    store = open_jsonl(str(tmp_path / "st"), limits=limits)
    store.create("s")
    filler = {"type": "x", "pad": ""}
    size = len(b'{"seq":2,"ts":1796000000.123456,"type":"x","pad":""}')
    store.append("s", [{**filler, "ts": 1796000000.123456, "pad": "p" * (200 - size)}])
    assert max(len(r.raw) for r in store.read("s")) == 200
    fresh = open_jsonl(str(tmp_path / "st"), limits=limits)
    assert fresh.append("s", [{"type": "y"}]) == 3


def test_session_repair_holds_the_lock_until_the_handle_is_open(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s", [{"type": "turn/start", "turn": "t"}])
    with store.session("s", repair=True) as s:
        assert s.last_seq == 3
        with pytest.raises(sessionlog.SessionLocked):
            store.session("s")


def test_tail_window_starting_exactly_on_a_line_boundary_is_checked(tmp_path):
    limits = sessionlog.Limits(record_limit=200, batch_limit=400)
    store = open_jsonl(str(tmp_path / "st"), limits=limits)
    store.create("s")
    for i in range(30):
        store.append("s", [{"type": "a", "i": i}])
    path = tmp_path / "st" / "s.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    keep, landed = b"".join(lines[:-4]), b"".join(lines[-2:])
    # The last append (exactly one batch_limit of bytes) lost its first pages to NULs; the
    # window of one append's reach then starts exactly at the NUL hole.
    path.write_bytes(keep + b"\0" * (limits.batch_limit - len(landed)) + landed)
    fresh = open_jsonl(str(tmp_path / "st"), limits=limits)
    assert fresh.scan("s").damage.kind is DamageKind.ZERO_FILL
    with pytest.raises(CorruptLog):
        fresh.append("s", [{"type": "new"}])


def test_a_recreated_session_never_reuses_a_cached_tail(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s", [{"type": "a"}])
    store.append("s", [{"type": "b"}])  # caches the tail (seq 3)
    store.delete("s")
    store.create("s")  # seq 1 only
    assert store.append("s", [{"type": "x"}]) == 2


def test_repair_with_an_unknown_outcome_poisons_the_file(tmp_path):
    fs = Faulty()
    store = open_jsonl(str(tmp_path / "st"), fs=fs)
    store.create("s", [{"type": "turn/start", "turn": "t"}])
    fs.fail("fdatasync")
    fs.fail("ftruncate")
    with pytest.raises(AppendFailed) as info:
        store.repair("s")
    assert info.value.outcome_unknown
    with pytest.raises(AppendFailed):
        store.append("s", [{"type": "x"}])


def test_a_reader_starts_over_when_the_file_is_replaced_under_it(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s")
    for k in range(20):
        store.append("s", [{"type": "a", "pad": "p" * 100, "i": i} for i in range(1000)])
    path = tmp_path / "st" / "s.jsonl"
    whole = path.read_bytes()
    assert len(whole) > 2 << 20  # more than the reader buffers at once
    reader = store.read("s")
    first = [next(reader) for _ in range(10)]
    # What a repair or compact leaves: a new file (new inode) with the same records, while
    # the old one (still open by the reader) loses its tail.
    tmp = tmp_path / "st" / "copy"
    tmp.write_bytes(whole)
    with open(path, "r+b") as f:
        f.truncate(len(whole) // 2 + 7)  # mid-record: the old file now ends torn
    os.rename(tmp, path)
    rest = list(reader)
    seqs = [r.seq for r in first + rest]
    assert seqs == list(range(1, 20002))  # nothing joined across the torn EOF, nothing repeated


def test_a_reader_does_not_start_over_on_a_damaged_file_that_did_not_move(tmp_path):
    store = open_jsonl(str(tmp_path / "st"))
    store.create("s", [{"type": "a"}])
    with open(tmp_path / "st" / "s.jsonl", "ab") as f:
        f.write(b'{"seq":3,"ts":1,"ty')
    assert [r.seq for r in store.read("s")] == [1, 2]


class Journal(FileSystem):
    """Records directory fsyncs and data syncs, in order."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self._dirs: set[int] = set()

    def open(self, path, flags, mode=0o600):
        fd = super().open(path, flags, mode)
        if flags & os.O_DIRECTORY:
            self._dirs.add(fd)
        else:
            self._dirs.discard(fd)
        return fd

    def fsync(self, fd):
        self.log.append("dir" if fd in self._dirs else "file")
        super().fsync(fd)

    def fdatasync(self, fd):
        self.log.append("data")
        super().fdatasync(fd)


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_a_session_name_left_undurable_is_made_durable_before_the_first_ack(tmp_path, scheme):
    # A create in another process linked the name and died before its directory fsync:
    # modeled by a copy, whose name this process never made durable.
    other = sessionlog.open_store(f"{scheme}:{tmp_path / 'other'}")
    other.create("s1")
    name = other.file_name("s1")
    os.mkdir(tmp_path / "st", 0o700)
    shutil.copy(tmp_path / "other" / name, tmp_path / "st" / name)
    fs = Journal()
    store = sessionlog.open_store(f"{scheme}:{tmp_path / 'st'}", fs=fs)
    fs.log.clear()
    store.append("s1", [{"type": "x"}])
    assert "dir" in fs.log and fs.log.index("dir") < fs.log.index("data")
    # Once per process: later handles and appends do not fsync the directory again.
    fs.log.clear()
    with store.session("s1") as s:
        s.append([{"type": "y"}])
    store.append("s1", [{"type": "z"}])
    assert "dir" not in fs.log and fs.log.count("data") == 2


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_an_undurable_name_on_an_inode_this_process_knows_is_made_durable(tmp_path, scheme):
    # The file's inode is one whose name this process made durable elsewhere: a second
    # name linked to it (as a file deleted outside the engine frees its inode number for
    # the next create) is still not durable until its own directory is fsynced.
    fs, path = _appended_once(tmp_path / "a", scheme)
    os.mkdir(tmp_path / "b", 0o700)
    os.link(path, tmp_path / "b" / path.name)
    _assert_name_made_durable_before_the_ack(sessionlog.open_store(f"{scheme}:{tmp_path / 'b'}", fs=fs), fs)


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_a_session_file_replaced_outside_the_engine_has_its_name_made_durable(tmp_path, scheme):
    fs, path = _appended_once(tmp_path / "st", scheme)
    kept = path.read_bytes()
    os.unlink(path)  # deleted outside the engine, then written back by a create that died before its fsync
    path.write_bytes(kept)
    _assert_name_made_durable_before_the_ack(sessionlog.open_store(f"{scheme}:{tmp_path / 'st'}", fs=fs), fs)


def _appended_once(directory, scheme):
    """A journaled store in ``directory`` with session "s1" appended to once: the
    journal and the session's path."""
    fs = Journal()
    store = sessionlog.open_store(f"{scheme}:{directory}", fs=fs)
    store.create("s1")
    store.append("s1", [{"type": "x"}])
    return fs, directory / store.file_name("s1")


def _assert_name_made_durable_before_the_ack(store, fs):
    fs.log.clear()
    store.append("s1", [{"type": "y"}])
    assert "dir" in fs.log and fs.log.index("dir") < fs.log.index("data")


def test_a_repair_makes_an_undurable_name_durable_before_it_writes(tmp_path):
    os.mkdir(tmp_path / "st", 0o700)
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), tmp_path / "st" / "torn.jsonl")
    fs = Journal()
    store = open_jsonl(str(tmp_path / "st"), fs=fs)
    fs.log.clear()
    assert store.repair("torn").status == "repaired"
    # the log's name first, then the quarantine's publish (file, dir), the cut, the batch
    assert fs.log[:3] == ["dir", "file", "dir"] and fs.log[-1] == "data"


def _fifo_cases(store):
    return {
        "scan": lambda: store.scan("s"),
        "read": lambda: list(store.read("s")),
        "session": lambda: store.session("s"),
        "append": lambda: store.append("s", [{"type": "x"}]),
        "repair": lambda: store.repair("s"),
        "dry-run": lambda: store.repair("s", dry_run=True),
    }


def _outcome(call, timeout=10.0):
    """What ``call`` raised, run in a thread that a hang cannot take down with the test."""
    import threading

    box: list[BaseException | None] = []

    def run():
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            box.append(exc)
        else:
            box.append(None)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "hung on a FIFO"
    return box[0]


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
@pytest.mark.parametrize("where", ["log", "lock"])
def test_a_fifo_planted_at_a_session_or_lock_path_is_refused_without_hanging(tmp_path, scheme, where):
    store = sessionlog.open_store(f"{scheme}:{tmp_path / 'st'}")
    store.create("s")
    path = store.path_of("s") if where == "log" else store.lock_path_of("s")
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path, 0o600)
    for what, call in _fifo_cases(store).items():
        exc = _outcome(call)
        if what == "read" and where == "lock":
            assert exc is None  # a reader never looks at the lock
            continue
        assert isinstance(exc, sessionlog.IOFailure), (what, exc)
        assert path in str(exc) and "FIFO" in str(exc), (what, str(exc))
        assert isinstance(exc.__cause__, OSError)
    assert os.path.exists(path) and not os.path.isfile(path)  # nothing replaced it


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
@pytest.mark.parametrize("where", ["log", "lock"])
def test_a_symlink_at_a_session_or_lock_path_is_refused_saying_so(tmp_path, scheme, where):
    """Never through a link: the error says it is a symbolic link (not ELOOP's 'too many
    levels of symbolic links'), and the link's target is never touched."""
    store = sessionlog.open_store(f"{scheme}:{tmp_path / 'st'}")
    store.create("s")
    path = store.path_of("s") if where == "log" else store.lock_path_of("s")
    target = tmp_path / "elsewhere"
    os.replace(path, target) if os.path.exists(path) else target.write_bytes(b"")
    before = target.read_bytes()
    os.symlink(target, path)
    for what, call in _fifo_cases(store).items():
        exc = _outcome(call)
        if what == "read" and where == "lock":
            assert exc is None
            continue
        assert isinstance(exc, sessionlog.IOFailure), (what, exc)
        assert path in str(exc) and "symbolic link" in str(exc) and "too many levels" not in str(exc).lower(), \
            (what, str(exc))
        assert f"name the file it points to, {target}" in str(exc), str(exc)  # what to do instead
    assert target.read_bytes() == before and os.path.islink(path)


def test_cli_scan_and_repair_of_a_fifo_exit_4_naming_it(tmp_path):
    import subprocess
    import sys

    store = open_jsonl(str(tmp_path / "st"))
    store.create("s")
    os.unlink(store.path_of("s"))
    os.mkfifo(store.path_of("s"), 0o600)
    for command in ("scan", "repair"):
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from sessionlog.cli import main; sys.exit(main())",
             command, "--json", str(tmp_path / "st")],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 4, (command, done.stdout, done.stderr)
        assert "s.jsonl" in done.stdout + done.stderr and "FIFO" in done.stdout + done.stderr


class NoLocks(FileSystem):
    def lock_descriptor(self, fd, *, blocking):
        raise OSError(errno.ENOLCK, "injected: no locks available")


def test_the_lock_is_taken_through_the_seam(tmp_path):
    store = open_jsonl(str(tmp_path / "st"), fs=NoLocks())
    store.create("s")
    with pytest.raises(sessionlog.IOFailure) as info:
        store.session("s")
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOLCK
    fds_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(sessionlog.IOFailure):
        store.append("s", [{"type": "x"}])
    assert len(os.listdir("/proc/self/fd")) == fds_before  # the lock file's descriptor was closed


def test_a_lock_wait_ends_at_its_timeout_or_when_the_owner_leaves(tmp_path):
    import threading
    import time

    store = open_jsonl(str(tmp_path / "st"))
    store.create("s")
    owner = store.session("s")
    start = time.monotonic()
    with pytest.raises(sessionlog.SessionLocked):
        store.session("s", timeout=0.2)
    assert time.monotonic() - start >= 0.2
    threading.Timer(0.1, owner.close).start()
    with store.session("s", timeout=None) as s:  # no deadline: waits for the owner
        assert s.append([{"type": "x"}]) == 2
    threading.Timer(0.1, store.session("s").close).start()
    with store.session("s", timeout=30) as s:
        assert s.append([{"type": "y"}]) == 3


@pytest.mark.parametrize(("fixture", "kind", "code"), [("mid-log", "mid-log", 3), ("seq-break", "seq-break", 3),
                                                      ("corrupt-last", "corrupt", 1), ("healthy", None, 0)])
def test_damage_before_a_live_writers_tail_is_still_reported(tmp_path, fixture, kind, code):
    import io

    from sessionlog.cli import main
    from sessionlog.durable import OS, FileLock

    os.mkdir(tmp_path / "st", 0o700)
    shutil.copy(os.path.join(FIXTURES, f"{fixture}.jsonl"), tmp_path / "st" / f"{fixture}.jsonl")
    store = open_jsonl(str(tmp_path / "st"))
    writer = FileLock(OS, store.lock_path_of(fixture))  # a live writer owns the session
    writer.acquire()
    try:
        with open(tmp_path / "st" / f"{fixture}.jsonl", "ab") as f:
            f.write(b'{"seq":999,"ts":1.0,"type":"tool/res')  # its write in flight
        res = store.scan(fixture)
        assert res.status == "open"
        assert (res.damage.kind if kind else None) == kind
        out = io.StringIO()
        assert main(["scan", "--json", str(tmp_path / "st")], out) == code
        row = json.loads(out.getvalue())
        assert row["status"] == "open" and (row["damage"] or {}).get("kind", "in-flight") == (kind or "in-flight")
        with pytest.raises(sessionlog.SessionLocked):
            store.repair(fixture, force=True)
    finally:
        writer.release()


def _mid_log_session(store, path) -> tuple[int, int]:
    """A session with a bad record/frame in the middle and records after it; returns the
    seqs that decode after the damage."""
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    for i in range(6):
        store.append("s1", [{"type": "note", "i": i, "text": "z" * 200}])
    data = bytearray(path.read_bytes())
    at = data.find(b'"i":2') if path.suffix == ".jsonl" else len(data) // 2
    data[at] ^= 0x20
    path.write_bytes(bytes(data))
    res = store.scan("s1")
    assert res.damage.kind is DamageKind.MID_LOG and res.damage.dropped_seqs is not None, res.damage
    return res.damage.dropped_seqs


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_a_forced_repair_interrupted_after_its_cut_keeps_dropped_seqs(tmp_path, scheme):
    fs = Faulty()
    store = sessionlog.open_store(f"{scheme}:{tmp_path / 'st'}", fs=fs)
    path = tmp_path / "st" / store.file_name("s1")
    dropped = _mid_log_session(store, path)
    fs.fail("write", nth=2)  # the 1st write publishes the quarantine, the 2nd appends the marker
    with pytest.raises(sessionlog.SessionLogError):
        store.repair("s1", force=True)
    assert store.scan("s1").damage is None  # cut, no marker: what a kill there leaves
    rep = store.repair("s1")
    [marker] = [dict(r) for r in rep.appended if r["type"] == "log/truncated"]
    assert tuple(marker["dropped_seqs"]) == dropped
    assert marker["reason"] == "mid-log"
    assert store.repair("s1").status == "clean"


def test_sql_marker_rebuilt_from_its_quarantine_keeps_dropped_seqs(tmp_path):
    import sqlite3

    db = tmp_path / "st.db"
    store = sessionlog.open_store(f"sqlite:///{db}")
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    for i in range(5):
        store.append("s1", [{"type": "note", "i": i}])
    with sqlite3.connect(db) as c:
        c.execute("UPDATE sessionlog_records SET record = ? WHERE session_id = 's1' AND seq = 4", (b"garbage",))
    dropped = store.scan("s1").damage.dropped_seqs
    assert dropped == (5, 7)
    rep = store.repair("s1", force=True)
    first = rep.appended[0]["seq"]
    with sqlite3.connect(db) as c:  # the marker and what came after it never landed
        c.execute("DELETE FROM sessionlog_records WHERE session_id = 's1' AND seq >= ?", (first,))
    res = store.scan("s1")
    assert res.unmarked_quarantines == [rep.quarantine]
    [marker] = [dict(r) for r in store.repair("s1").appended if r["type"] == "log/truncated"]
    assert marker["quarantine"] == rep.quarantine and tuple(marker["dropped_seqs"]) == dropped


def test_a_repair_stopped_after_any_prefix_of_its_plan_is_finished_by_the_next(tmp_path):
    """What a crash between two of a large repair's batches leaves, at every split point
    (not only batch boundaries): the next repair answers each call exactly once and
    closes everything."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from sessions import answered_exactly_once, crashed_sessions

    counter = iter(range(1 << 30))

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(events=crashed_sessions(), data=st.data())
    def run(events, data):
        store = open_jsonl(str(tmp_path / f"st{next(counter)}"))
        store.create("s", events)
        plan = store.repair("s", dry_run=True).appended
        k = data.draw(st.integers(0, len(plan)))
        if k:
            store.append("s", [{key: value for key, value in r.to_dict().items() if key != "seq"}
                               for r in plan[:k]])
        store.repair("s")
        records = list(store.read("s"))
        assert answered_exactly_once(records) == []
        assert store.scan("s").status == "clean"

    run()


@pytest.mark.parametrize("meta_bytes", [0, 60_000, 200_000])
def test_a_session_whose_header_is_longer_than_the_first_read_still_opens(tmp_path, meta_bytes):
    """Opening a JSONL session reads a short probe at offset 0 for the header line and the
    whole record limit only when the header is longer: either way the same header, and a
    header with no newline within the record limit is still refused."""
    store = open_jsonl(str(tmp_path))
    store.create("s1")
    path = tmp_path / "s1.jsonl"
    header = json.loads(path.read_bytes().splitlines()[0])
    header["meta"] = "m" * meta_bytes  # an unknown header member: kept, never re-encoded
    path.write_bytes(json.dumps(header, separators=(",", ":")).encode() + b"\n")
    with store.session("s1") as s:
        assert s.append([{"type": "note/x", "n": 1}]) == 2
    assert [r["seq"] for r in store.read("s1")] == [1, 2]
    assert store.scan("s1").status is sessionlog.Status.CLEAN
    path.write_bytes(b'{"seq":1' + b" " * (2 << 20))  # no line end within the record limit
    with pytest.raises(CorruptLog, match="the header"):
        store.session("s1")


def test_a_header_over_the_record_limit_is_refused_at_open_as_scan_refuses_it(tmp_path):
    """A header line one byte over the record limit: scan says it is not a session log,
    so opening the session for appends refuses it too (nothing is appended after it)."""
    from sessionlog.scan import Limits

    store = open_jsonl(str(tmp_path), limits=Limits(record_limit=200, batch_limit=4096))
    store.create("s1")
    path = tmp_path / "s1.jsonl"
    header = json.loads(path.read_bytes().splitlines()[0])
    base = len(json.dumps(dict(header, meta=""), separators=(",", ":")))
    for size, opens in ((200, True), (201, False)):
        header["meta"] = "m" * (size - base)
        line = json.dumps(header, separators=(",", ":")).encode()
        assert len(line) == size
        path.write_bytes(line + b"\n")
        if opens:
            with store.session("s1") as s:
                assert s.append([{"type": "note/x"}]) == 2
            assert store.scan("s1").status is sessionlog.Status.CLEAN
        else:
            with pytest.raises(CorruptLog):
                store.scan("s1")
            with pytest.raises(CorruptLog, match="exceeds the record limit"):
                store.session("s1")
            assert path.read_bytes() == line + b"\n"


class CountingReads(FileSystem):
    def __init__(self) -> None:
        self.preads = 0

    def pread(self, fd, n, offset):
        self.preads += 1
        return super().pread(fd, n, offset)


def test_a_closed_handle_leaves_its_tail_for_the_next_open_and_a_change_voids_it(tmp_path):
    fs = CountingReads()
    store = open_jsonl(str(tmp_path), fs=fs)
    store.create("s")
    with store.session("s") as h:
        for i in range(3):
            h.append([{"type": "ev", "i": i}])
    before = fs.preads
    with store.session("s") as h:  # the tail the last handle left: nothing read
        assert h.last_seq == 4
    assert fs.preads == before
    with open(store.path_of("s"), "ab") as f:  # another writer (no lock: a test) appends a record
        f.write(b'{"seq":5,"ts":1.0,"type":"ev"}\n')
    with store.session("s") as h:  # the file changed: its tail is read again
        assert h.last_seq == 5
    assert fs.preads > before


class CutAndRegrownWhileRead(FileSystem):
    """A reader's file is repaired and grown back between two of its reads: what another
    process can do to a file it does not own (the second read of a scan triggers it)."""

    def __init__(self, meanwhile):
        self.meanwhile, self.reads = meanwhile, 0

    def pread(self, fd, n, offset):
        self.reads += 1
        if self.reads == 2 and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        return super().pread(fd, n, offset)


@pytest.mark.parametrize("how", ["scan", "read"])
def test_a_file_cut_and_grown_back_while_read_is_never_joined_across_the_cut(tmp_path, how):
    """A torn tail read in part, then cut by a repair and grown back by appends before the
    next read: the bytes before the cut would run on into the records after it and look
    like mid-log damage (needs --force) on a log that has none. The reader sees the file
    changed under it and reads it again."""
    d = str(tmp_path / "st")
    plain = open_jsonl(d)
    plain.create("s1", [{"type": "x/ev", "i": i} for i in range(3)])
    path = tmp_path / "st" / "s1.jsonl"
    torn = b'{"seq":5,"ts":1.0,"type":"x/ev","pad":"' + b"b" * 700_000  # longer than one read
    with open(path, "ab") as f:
        f.write(torn)

    def repair_and_append():
        assert plain.repair("s1").status == "repaired"
        plain.append("s1", [{"type": "x/ev", "i": i, "pad": "a" * 30_000} for i in range(30)])

    reader = open_jsonl(d, fs=CutAndRegrownWhileRead(repair_and_append))
    if how == "scan":
        res = reader.scan("s1")
        assert res.damage is None and res.last_seq == 35, res.damage  # header, 3, marker, 30
    else:
        seqs = [r.seq for r in reader.read("s1")]
        assert seqs == list(range(1, 36))
    assert reader.fs.meanwhile is None  # it did happen under the reader
    assert plain.scan("s1").status == "clean"


class DirSyncs(FileSystem):
    """Records the path of each directory fsynced."""

    def __init__(self) -> None:
        self.synced: list[str] = []
        self._paths: dict[int, str] = {}

    def open(self, path, flags, mode=0o600):
        fd = super().open(path, flags, mode)
        self._paths[fd] = os.path.abspath(path)
        return fd

    def fsync(self, fd):
        if os.path.isdir(self._paths.get(fd, "")):
            self.synced.append(self._paths[fd])
        super().fsync(fd)


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_a_store_directory_made_by_another_creator_is_made_durable_in_its_parent(tmp_path, scheme):
    # Another process made the store's directory and has not fsynced its parent yet (it
    # is paused, or it died): opening the store for writing does it before any ack.
    from sessionlog.durable import ensure_store_dir

    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    fs = DirSyncs()
    sessionlog.open_store(f"{scheme}:{root / 'a'}", fs=fs)
    assert str(root) in fs.synced
    fs.synced.clear()
    ensure_store_dir(fs, str(root / "a" / "b" / "c"))  # the missing ones are created, each made durable
    assert fs.synced == [str(root / "a"), str(root / "a" / "b")]


class ParentCannotSync(DirSyncs):
    """A store directory bound into a read-only image: its parent cannot be fsynced."""

    def __init__(self, parent: str) -> None:
        super().__init__()
        self.parent = parent

    def fsync(self, fd):
        if self._paths.get(fd) == self.parent:
            raise OSError(errno.EINVAL, "Invalid argument")
        super().fsync(fd)


def test_an_existing_store_directory_whose_parent_cannot_be_fsynced_still_opens(tmp_path):
    (tmp_path / "st").mkdir()
    store = open_jsonl(str(tmp_path / "st"), fs=ParentCannotSync(str(tmp_path)))
    store.create("s")
    assert store.append("s", [{"type": "x"}]) == 2


class LogUnlinkFails(FileSystem):
    """A delete dies where it unlinks the log itself (its quarantines come first)."""

    def unlink(self, path):
        if path.endswith((".jsonl", ".jsonl.zst")):
            raise OSError(errno.EIO, "Input/output error")
        super().unlink(path)


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_a_delete_cut_short_never_leaves_quarantines_for_the_next_session_of_its_id(tmp_path, scheme):
    store = sessionlog.open_store(f"{scheme}:{tmp_path}")
    store.create("s", [{"type": "x"}])
    path = tmp_path / store.file_name("s")
    with open(path, "ab") as f:
        f.write(b'{"seq":3,"ts":1,"ty')  # a torn tail: repair quarantines it
    assert store.repair("s").status == "repaired" and store.quarantines("s")
    broken = sessionlog.open_store(f"{scheme}:{tmp_path}", fs=LogUnlinkFails())
    with pytest.raises(sessionlog.IOFailure):
        broken.delete("s")
    assert path.exists() and store.quarantines("s") == []  # the session is still there, whole
    # A log a killed delete removed before its quarantines (the order before this fix):
    # the next delete of the id removes what is left, and a new session starts clean.
    store.repair("s")
    with open(path, "ab") as f:
        f.write(b'{"seq":9,"ts":1,"ty')
    assert store.repair("s").status == "repaired" and store.quarantines("s")
    os.unlink(path)
    store.delete("s")
    assert store.quarantines("s") == []
    with pytest.raises(sessionlog.SessionNotFound):
        store.delete("s")
    store.create("s")
    assert store.scan("s").status.value == "clean"
