"""Durability under injected faults, through the engine's one I/O seam (durable.FileSystem)."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

import sessionlog
from sessionlog import AppendFailed, CorruptLog, SessionExists, StoreClosed
from sessionlog.backends.jsonl import open_jsonl
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
    rep = store.repair("s1")
    marker = dict(rep.appended[0])
    assert marker["type"] == "log/truncated" and marker["quarantine"] == quarantines[0]
    assert marker["offset"] == len(cut) and marker["dropped_bytes"] == len(torn) - len(cut)
    assert store.scan("s1").status == "clean"
    assert store.repair("s1").status == "clean"


def test_repair_interrupted_before_its_cut_reuses_the_quarantine(tmp_path):
    fs = Faulty()
    store = open_jsonl(str(tmp_path / "st"), fs=fs)
    store.create("s1")
    path = tmp_path / "st" / "s1.jsonl"
    with open(path, "ab") as f:
        f.write(b"\0" * 100)
    fs.fail("ftruncate")
    with pytest.raises(sessionlog.SessionLogError):
        store.repair("s1")
    rep = store.repair("s1")
    quarantines = [n for n in os.listdir(path.parent) if n.endswith(".quarantine")]
    assert len(quarantines) == 1
    assert [r["type"] for r in rep.appended] == ["log/truncated"]
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
