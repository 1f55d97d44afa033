"""A command that fails, or writes nothing, changes nothing: no new DST directory or
database file, no temp file, no lock file, and a DST that existed keeps every byte.
Each test compares the whole directory tree (names and bytes) before and after."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sessionlog
from sessionlog.cli import main
from sessionlog.contract import IOFailure
from sessionlog.restore import restore

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def run(*args: str) -> int:
    return main(list(args), io.StringIO())


def tree(root: Path) -> dict[str, bytes | str]:
    """Every directory and file under ``root`` (hidden ones too), with each file's bytes."""
    found: dict[str, bytes | str] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(directory, name), root)] = "<dir>"
        for name in files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, root)] = Path(path).read_bytes()
    return found


def changes(before: dict[str, bytes | str], after: dict[str, bytes | str]) -> list[str]:
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("healthy", "torn", "mid-log"):
        shutil.copy(FIXTURES / f"{name}.jsonl", src / f"{name}.jsonl")
    shutil.copy(FIXTURES / "bad" / "not-a-log.jsonl", tmp_path / "not-a-log.jsonl")
    shutil.copy(FIXTURES / "bad" / "future-format.jsonl", tmp_path / "future-format.jsonl")
    shutil.copy(FIXTURES / "claude-code" / "dangling-call.jsonl", tmp_path / "claude-code.jsonl")
    (tmp_path / "empty-store").mkdir()
    return tmp_path


# Where a new DST would go: every backend a path can name, and a new directory for DIR/<id>.jsonl.
NEW_DSTS = {
    "jsonl": "jsonl:{w}/out",
    "zstd": "zstd:{w}/out",
    "sqlite": "sqlite:///{w}/out.db",
    "new-dir-file": "{w}/out/{sid}.jsonl",
}

# SRC that converts nothing, and the exit code it gets.
FAILING = {
    "claude-code transcript that needs repair": (["{w}/claude-code.jsonl"], "claude-code", 1),
    "missing SRC": (["{w}/missing.jsonl"], "missing", 4),
    "not a session log": (["{w}/not-a-log.jsonl"], "not-a-log", 4),
    "unsupported format": (["{w}/future-format.jsonl"], "future-format", 4),
    "damaged, needs --repaired": (["{w}/src/torn.jsonl"], "torn", 1),
    "damaged, needs --force": (["{w}/src/mid-log.jsonl", "--repaired"], "mid-log", 3),
    "session not in SRC": (["{w}/src", "--session", "nope"], "nope", 4),
    "empty SRC store": (["jsonl:{w}/empty-store"], "x", 0),
}
# A DST file names its session: the empty store does not have it.
NAMED_DST_CODE = {"empty SRC store": 4}


@pytest.mark.parametrize("dst_kind", NEW_DSTS)
@pytest.mark.parametrize("case", FAILING)
def test_a_convert_that_converts_nothing_creates_no_dst(work: Path, case: str, dst_kind: str) -> None:
    args, sid, code = FAILING[case]
    src, *options = (a.format(w=work) for a in args)
    dst = NEW_DSTS[dst_kind].format(w=work, sid=sid)
    if dst_kind == "new-dir-file":
        code = NAMED_DST_CODE.get(case, code)
    before = tree(work)
    assert run("convert", src, dst, *options) == code
    assert changes(before, tree(work)) == [], f"convert {case} into {dst} left files behind"


@pytest.mark.parametrize("argv", [
    ["convert", "{w}/src/healthy.jsonl", "jsonl:{w}/out", "--bogus"],
    ["convert", "jsonl:{w}/out"],
    ["convert", "-", "jsonl:{w}/out"],
    ["convert", "{w}/src/healthy.jsonl", "{w}/out"],  # a new plain path: the backend cannot be told
], ids=["bad option", "no DST", "stdin", "plain new path"])
def test_a_convert_usage_error_creates_nothing(work: Path, argv: list[str]) -> None:
    before = tree(work)
    assert run(*(a.format(w=work) for a in argv)) == 2
    assert changes(before, tree(work)) == []


def test_a_convert_naming_a_session_its_src_file_does_not_hold_exits_4_and_creates_nothing(work: Path) -> None:
    before = tree(work)
    assert run("convert", f"{work}/src/healthy.jsonl", f"jsonl:{work}/out", "--session", "other") == 4
    assert changes(before, tree(work)) == []


def test_a_convert_of_a_locked_session_creates_no_dst(work: Path) -> None:
    store = sessionlog.open_store(f"jsonl:{work}/src")
    with store.session("healthy"):
        before = tree(work)
        assert run("convert", f"{work}/src/healthy.jsonl", f"zstd:{work}/out") == 5
        assert changes(before, tree(work)) == []


@pytest.mark.parametrize("dst", ["jsonl:{w}/dst", "zstd:{w}/dst", "sqlite:///{w}/dst.db"])
def test_an_existing_dst_keeps_every_byte_when_nothing_is_converted(work: Path, dst: str) -> None:
    dst = dst.format(w=work)
    assert run("convert", f"{work}/src/healthy.jsonl", dst) == 0
    before = tree(work)
    for src, options, code in ((f"{work}/src/torn.jsonl", [], 1), (f"{work}/not-a-log.jsonl", [], 4),
                               (f"{work}/src/mid-log.jsonl", ["--repaired"], 3)):
        assert run("convert", src, dst, *options) == code
        assert changes(before, tree(work)) == [], f"convert {src} changed the existing {dst}"


def _failing_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every backend's import fails as a full disk would, after DST was opened (created)."""
    from sessionlog.backends.filestore import FileStore  # ZstdStore's too
    from sessionlog.backends.sql import SqlStore

    def import_session(self: object, session_id: str, records: object) -> int:
        raise IOFailure(f"{session_id}: import failed: No space left on device")

    monkeypatch.setattr(FileStore, "import_session", import_session)
    monkeypatch.setattr(SqlStore, "import_session", import_session)


@pytest.mark.parametrize("command,sid", [("convert", "healthy"), ("salvage", "torn")])
@pytest.mark.parametrize("dst_kind", NEW_DSTS)
def test_a_command_whose_write_fails_removes_the_dst_it_created(work: Path, dst_kind: str, command: str, sid: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_import(monkeypatch)
    before = tree(work)
    assert run(command, f"{work}/src/{sid}.jsonl", NEW_DSTS[dst_kind].format(w=work, sid=sid)) == 4
    assert changes(before, tree(work)) == []


@pytest.mark.parametrize("source", ["{w}/not-a-log.jsonl", "{w}/missing.jsonl"])
def test_a_salvage_with_nothing_to_salvage_creates_no_dst(work: Path, source: str) -> None:
    before = tree(work)
    assert run("salvage", source.format(w=work), f"zstd:{work}/out") == 4
    assert run("salvage", source.format(w=work), f"{work}/out/x.jsonl") == 4
    assert changes(before, tree(work)) == []


def test_restore_dry_run_creates_no_lock_file(work: Path) -> None:
    assert run("repair", f"{work}/src/torn.jsonl") == 0  # something to restore
    before = tree(work)
    assert run("restore", f"{work}/src/torn.jsonl", "--dry-run") == 0
    assert run("restore", f"{work}/src", "--dry-run") == 0
    assert changes(before, tree(work)) == []


def test_restore_dry_run_of_a_locked_session_exits_5_and_creates_nothing(work: Path) -> None:
    assert run("repair", f"{work}/src/torn.jsonl") == 0
    store = sessionlog.open_store(f"jsonl:{work}/src")
    with store.session("torn"):
        before = tree(work)
        assert run("restore", f"{work}/src/torn.jsonl", "--dry-run") == 5
        assert changes(before, tree(work)) == []


@pytest.mark.parametrize("argv", [
    ["repair", "{w}/src", "--dry-run"],
    ["repair", "{w}/src/mid-log.jsonl", "--dry-run", "--force"],
    ["repair", "jsonl:{w}/missing"],
    ["repair", "sqlite:///{w}/missing.db"],
    ["scan", "{w}/src"],
    ["scan", "zstd:{w}/missing"],
    ["show", "{w}/src/mid-log.jsonl", "--format", "anthropic", "--check"],
    ["show", "{w}/not-a-log.jsonl"],
    ["compact", "{w}/src"],
    ["compact", "zstd:{w}/missing"],
    ["restore", "{w}/missing.jsonl"],
], ids=lambda argv: " ".join(argv).replace("{w}/", ""))
def test_read_only_and_failing_commands_change_nothing(work: Path, argv: list[str]) -> None:
    before = tree(work)
    run(*(a.format(w=work) for a in argv))
    assert changes(before, tree(work)) == []


STORES = {"jsonl": "jsonl:{w}/store", "zstd": "zstd:{w}/store", "sqlite": "sqlite:///{w}/store.db"}


@pytest.mark.parametrize("backend", sorted(STORES))
def test_a_repair_with_nothing_to_write_creates_no_lock_file(work: Path, backend: str) -> None:
    # Taking a session's lock the first time creates its lock file: a repair that finds
    # nothing to do (a clean session, no such session) must not leave one behind.
    url = STORES[backend].format(w=work)
    source = sessionlog.open_store(f"jsonl:{work}/src")
    with sessionlog.open_store(url) as store:
        store.import_session("healthy", source.read("healthy"))
    before = tree(work)
    assert run("repair", url, "--session", "healthy") == 0
    assert run("repair", url) == 0
    assert run("repair", url, "--session", "nope") != 0
    assert changes(before, tree(work)) == []
    # A repair that does write still takes the lock (and so makes its file).
    with sessionlog.open_store(url) as store:
        store.append("healthy", [{"type": "turn/start", "turn": "t-open"}])
    assert run("repair", url, "--session", "healthy") == 0
    with sessionlog.open_store(url) as store:
        assert store.read("healthy") and list(store.read("healthy"))[-1]["type"] == "turn/end"
        assert store.scan("healthy").status.value == "clean"


def test_a_refused_repair_creates_no_lock_file(work: Path) -> None:
    before = tree(work)
    assert run("repair", f"{work}/src/mid-log.jsonl") == 3
    assert run("repair", f"jsonl:{work}/src", "--session", "mid-log") == 3
    assert changes(before, tree(work)) == []


@pytest.mark.parametrize("backend", sorted(STORES))
def test_reading_commands_leave_every_byte_and_file_as_they_were(work: Path, backend: str) -> None:
    """scan, show and the dry runs write nothing: not a byte of the store, and no file
    beside it but the -wal (empty) and -shm files SQLite makes for any reader of a WAL
    database, which a read-only connection cannot remove."""
    url = STORES[backend].format(w=work)
    source = sessionlog.open_store(f"jsonl:{work}/src")
    with sessionlog.open_store(url) as store:
        store.import_session("healthy", source.read("healthy"))
        store.import_session("torn", source.read("torn"))
    before = tree(work)
    assert run("scan", url) in (0, 1)
    assert run("show", url, "--session", "healthy") == 0
    assert run("show", url, "--session", "healthy", "--format", "openai", "--check") == 0
    assert run("repair", url, "--dry-run") == 0
    after = tree(work)
    if backend == "sqlite":
        assert after.pop("store.db-wal", b"") == b""
        after.pop("store.db-shm", None)
    assert changes(before, after) == []


def test_a_reading_command_never_checkpoints_another_writers_frames_into_the_database(tmp_path: Path) -> None:
    """Another process appends while a read-only command has the database open, and its
    commit stays in the WAL: when the command ends, not a byte of the database file has
    changed (nothing it opened checkpoints)."""
    from sessionlog.targets import close_opened, open_source

    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    with sessionlog.open_store(url) as store:
        store.create("s")
    before = db.read_bytes()
    reader = open_source(url)
    assert reader.scan("s").status.value == "clean"
    writer = f"import sessionlog\nwith sessionlog.open_store({url!r}) as s: s.append('s', [{{'type': 'note'}}])"
    subprocess.run([sys.executable, "-c", writer], check=True)
    close_opened()
    assert db.read_bytes() == before
    with sessionlog.open_store(url) as store:
        assert store.scan("s").last_seq == 2  # the append is in the WAL, durable


@pytest.mark.parametrize("backend", ["jsonl", "zstd"])
def test_a_call_on_a_session_that_does_not_exist_creates_no_lock_file(tmp_path: Path, backend: str) -> None:
    """A misspelled id is SessionNotFound from every call that would own the session, and
    leaves no lock file behind (lock files are never removed, so one made would stay)."""
    store = sessionlog.open_store(f"{backend}:{tmp_path}")
    store.create("s1")
    before = tree(tmp_path)
    calls = {
        "append": lambda: store.append("typo", [{"type": "x"}]),
        "session": lambda: store.session("typo"),
        "session(repair=True)": lambda: store.session("typo", repair=True),
        "repair": lambda: store.repair("typo"),
        "delete": lambda: store.delete("typo"),
        "restore": lambda: restore(store, "typo"),
    }
    if backend == "zstd":
        calls["compact"] = lambda: store.compact("typo")
    for name, call in calls.items():
        with pytest.raises(sessionlog.SessionNotFound):
            call()
        assert changes(before, tree(tmp_path)) == [], name
