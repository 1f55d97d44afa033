"""Single ownership, under what breaks it in the field: a PostgreSQL lock connection that
dies while an append waits, a second spelling of the same store, a symlink or a hard link
to the SQLite file, a server that ends idle connections, a reopen after a lost lock, a
connection lost at COMMIT, a lock file removed under its holder, a transient failure of
the write-behind, a fork.

The invariant checked: a writer that opened a session saw every record committed before
its open returned, and no append of an earlier owner commits after it (the earlier
owner's append fails instead, writing nothing).

PostgreSQL tests need SESSIONLOG_TEST_POSTGRES_URL (a schema of their own per test)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from postgres import postgres_base_url, postgres_schema_url
from sessionlog.backends import sql_engines
from sessionlog.durable import FileLock, FileSystem
from sessionlog.events import encode_record
from test_sql_fleet import lock_holders, server

import sessionlog
from sessionlog import AppendFailed, SessionLocked, StoreClosed


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_schema_url()


def note(i: int) -> list[dict[str, Any]]:
    return [{"type": "note/x", "i": i}]


def schema_of(url: str) -> str:
    schema = sa.make_url(url).query["schema"]
    assert isinstance(schema, str)
    return schema


def waiting_on_a_lock(app: str) -> bool:
    return bool(server(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = :a AND wait_event_type = 'Lock'", a=app,
    ))


def ddl(sql: str) -> None:
    engine = sa.create_engine(sa.make_url(postgres_base_url()).set(drivername="postgresql+psycopg"))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Started:
    """``fn()`` running in a daemon thread (a hung call never hangs the suite); ``join``
    returns what it returned, or the exception it raised."""

    def __init__(self, fn: Any) -> None:
        self._box: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Any) -> None:
        try:
            self._box.append(fn())
        except BaseException as exc:
            self._box.append(exc)

    def join(self, timeout: float = 30.0) -> Any:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"still running after {timeout} s"
        return self._box[0]

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


async def until(predicate: Any, what: str, timeout: float = 20.0) -> None:
    """:func:`wait_for` on the event loop (which keeps running meanwhile)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# --- PostgreSQL: fencing -------------------------------------------------------------------


def test_an_append_in_flight_when_its_lock_is_lost_never_lands_behind_the_next_owner(pg_url: str) -> None:
    """The owner's append is past its liveness check and waiting for the session's row
    when its lock connection dies and another store takes the session. Either the append
    commits before the new owner's open returns (which then sees it) or it fails: the new
    owner's view of the tail is never stale."""
    app = f"sl_fence_{secrets.token_hex(4)}"
    url_a = f"{pg_url}&application_name={app}"
    schema = schema_of(pg_url)
    with sessionlog.open_store(url_a) as store_a, sessionlog.open_store(pg_url) as store_b:
        store_a.create("s")
        handle_a = store_a.session("s")
        handle_a.append(note(1))
        (holder,) = lock_holders(pg_url, "s")
        blocker = sa.create_engine(sa.make_url(postgres_base_url()).set(drivername="postgresql+psycopg"))
        outcome: dict[str, Any] = {}
        try:
            with blocker.connect() as conn:
                conn.exec_driver_sql(
                    f'SELECT 1 FROM "{schema}".sessionlog_sessions WHERE session_id = %s FOR UPDATE', ("s",)
                )
                append_a = Started(lambda: handle_a.append(note(2)))
                wait_for(lambda: waiting_on_a_lock(app), "the append to wait for the row")
                server("SELECT pg_terminate_backend(:p)", p=holder)
                wait_for(lambda: not lock_holders(pg_url, "s"), "the server to release the lock")
                open_b = Started(lambda: store_b.session("s", timeout=30))
                time.sleep(0.5)  # the new owner's open runs (or waits) while the append waits
                conn.rollback()
            outcome["a"], outcome["b"] = append_a.join(), open_b.join()
        finally:
            blocker.dispose()
        handle_b = outcome["b"]
        assert isinstance(handle_b, sessionlog.backends.sql.SqlSession), outcome
        seqs = [r.seq for r in store_b.read("s")]
        if isinstance(outcome["a"], BaseException):
            assert isinstance(outcome["a"], AppendFailed) and not outcome["a"].outcome_unknown, outcome
            assert seqs == [1, 2]
        else:
            assert outcome["a"] == 3 and seqs == [1, 2, 3]
        # What the new owner saw at open is the tail: its conditional append goes through.
        assert handle_b.last_seq == seqs[-1]
        assert handle_b.append(note(3), expect_seq=handle_b.last_seq) == seqs[-1] + 1
        handle_b.close()
        handle_a.close()


def two_owned(store: Any) -> tuple[Any, Any]:
    """Sessions "s" and "t" of ``store``, each open through a handle of its own; "s" has
    one note appended (seq 2)."""
    store.create("s")
    store.create("t")
    s, t = store.session("s"), store.session("t")
    s.append(note(1))
    return s, t


def test_an_owner_whose_session_was_taken_over_writes_nothing(pg_url: str) -> None:
    """However a second owner came to be (here: its open is simulated by moving the
    session's owner epoch, as a new owner's open does), the first one's appends fail."""
    schema = schema_of(pg_url)
    with sessionlog.open_store(pg_url) as store:
        handle, other = two_owned(store)
        server(f'UPDATE "{schema}".sessionlog_sessions SET owner_epoch = owner_epoch + 1 WHERE session_id = :s '
               "RETURNING owner_epoch",
               s="s")
        with pytest.raises(AppendFailed) as info:
            handle.append(note(2))
        assert not info.value.outcome_unknown
        assert "another writer" in str(info.value) and "'s'" in str(info.value)
        with pytest.raises(StoreClosed):
            handle.append(note(3))
        assert [r.seq for r in store.read("s")] == [1, 2]
        # A group commit holding that session fails as a whole and names it.
        server(f'UPDATE "{schema}".sessionlog_sessions SET owner_epoch = owner_epoch + 1 WHERE session_id = :s '
               "RETURNING owner_epoch",
               s="t")
        with pytest.raises(AppendFailed) as ginfo:
            store.append_group([(other, note(1))])
        assert ginfo.value.group_index == 0
        assert [r.seq for r in store.read("t")] == [1]
        handle.close()
        other.close()


# --- two names for one store ---------------------------------------------------------------


def test_a_url_without_schema_locks_where_its_tables_are(pg_url: str) -> None:
    """Without ``?schema=`` the tables go where the connection's search_path says; the
    ownership lock must follow them, or two spellings of one store have two owners."""
    schema = schema_of(pg_url)
    base = sa.make_url(pg_url).difference_update_query(["schema"])
    by_path = base.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    with sessionlog.open_store(pg_url) as named, sessionlog.open_store(by_path) as pathed:
        named.create("s")
        assert pathed.sessions() == ["s"]
        with named.session("s"):
            assert pathed.scan("s").owned
            with pytest.raises(SessionLocked):
                pathed.session("s")
        with pathed.session("s"):
            with pytest.raises(SessionLocked):
                named.session("s")


def test_a_symlink_to_an_sqlite_file_is_the_same_store(tmp_path: Path) -> None:
    real = tmp_path / "data" / "store.db"
    real.parent.mkdir()
    link_dir = tmp_path / "elsewhere"
    link_dir.mkdir()
    link = link_dir / "link.db"
    with sessionlog.open_store(f"sqlite:///{real}") as store:
        store.create("s")
        link.symlink_to(real)
        with sessionlog.open_store(f"sqlite:///{link}") as through_link:
            with store.session("s") as handle:
                handle.append([
                    {"type": "turn/start", "turn": 1},
                    {"type": "tool/call", "turn": 1, "step": 1, "call_id": "c1", "name": "x", "arguments": "{}"},
                ])
                assert through_link.scan("s").owned
                with pytest.raises(SessionLocked):
                    through_link.session("s")
                with pytest.raises(SessionLocked):
                    through_link.repair("s")
            assert not link_dir.joinpath(".link.db.locks").exists()
    with sessionlog.open_store(f"sqlite:///{real}", read_only=True) as store:
        assert [r.type for r in store.read("s")][-1] == "tool/call"


# --- the lock connection's life ------------------------------------------------------------


def test_a_server_that_ends_idle_sessions_does_not_end_ownership(pg_url: str) -> None:
    url = f"{pg_url}&options=-cidle_session_timeout%3D500"
    with sessionlog.open_store(url) as store, sessionlog.open_store(pg_url) as other:
        store.create("s")
        with store.session("s") as handle:
            handle.append(note(1))
            time.sleep(1.5)  # three times the server's idle limit
            assert other.scan("s").owned
            with pytest.raises(SessionLocked):
                other.session("s")
            assert handle.append(note(2)) == 3


def test_a_lost_lock_does_not_lock_out_its_own_store(pg_url: str) -> None:
    with sessionlog.open_store(pg_url) as store:
        failed, unaware = two_owned(store)
        (holder,) = lock_holders(pg_url, "s")
        server("SELECT pg_terminate_backend(:p)", p=holder)
        wait_for(lambda: not lock_holders(pg_url, "s"), "the server to release the lock")
        with pytest.raises(AppendFailed):
            failed.append(note(2))
        # The failed handle is not closed yet: the session is free, open it again.
        with store.session("s") as again:
            assert again.append(note(3)) == 3
        # No append of "t" noticed the loss yet: opening it again finds out.
        with store.session("t") as again:
            assert again.append(note(4)) == 2
        with pytest.raises(AppendFailed):
            unaware.append(note(5))
        failed.close()
        unaware.close()
        assert [r.seq for r in store.read("s")] == [1, 2, 3]
        assert [r.seq for r in store.read("t")] == [1, 2]


def test_a_connection_lost_at_commit_is_one_error_not_a_logged_traceback(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A deferred trigger ends the server process during COMMIT: the outcome is unknown
    and said so once, as AppendFailed; nothing is logged besides."""
    schema = schema_of(pg_url)
    with sessionlog.open_store(pg_url) as store:
        store.create("s")
        ddl(
            f'CREATE FUNCTION "{schema}".die() RETURNS trigger LANGUAGE plpgsql AS '
            "$$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$"
        )
        ddl(
            f'CREATE CONSTRAINT TRIGGER die AFTER INSERT ON "{schema}".sessionlog_records '
            f'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.seq = 3) EXECUTE FUNCTION "{schema}".die()'
        )
        with store.session("s") as handle:
            handle.append(note(1))
            with caplog.at_level(logging.DEBUG):
                with pytest.raises(AppendFailed) as info:
                    handle.append(note(2))
            assert info.value.outcome_unknown
            noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert not noisy, [r.getMessage() for r in noisy]
        ddl(f'DROP TRIGGER die ON "{schema}".sessionlog_records')
        assert [r.seq for r in store.read("s")] == [1, 2]
        with store.session("s") as handle:
            assert handle.append(note(3)) == 3


# --- a lock lost while it is being used to take the session --------------------------------


@pytest.mark.parametrize("operation", ["open", "repair", "delete"])
def test_a_taker_whose_lock_dies_before_it_writes_writes_nothing(
    pg_url: str, operation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store A takes the session's lock; its lock connection dies before A's open, repair
    or delete writes anything, and store B takes the session and appends. A must then
    write nothing (it no longer holds the lock) and leave B's ownership intact."""
    with sessionlog.open_store(pg_url) as zombie, sessionlog.open_store(pg_url) as other:
        zombie.create("s", OPEN_TURN)
        holder: dict[str, Any] = {}
        real_acquire = sql_engines.AdvisoryOwnership.acquire

        def acquire(self: Any, timeout: float) -> None:
            real_acquire(self, timeout)
            if self.locks is zombie.kind.locks and "b" not in holder:
                server("SELECT pg_terminate_backend(:p)", p=self.token[0])
                wait_for(lambda: not lock_holders(pg_url, "s"), "the server to release the lock")
                holder["b"] = other.session("s")
                holder["seq"] = holder["b"].append([{"type": "user/message", "turn": "t1", "content": "B"}])

        monkeypatch.setattr(sql_engines.AdvisoryOwnership, "acquire", acquire)
        with pytest.raises(sessionlog.IOFailure, match="lock was lost while the session was being taken"):
            if operation == "open":
                zombie.session("s")
            elif operation == "repair":
                zombie.repair("s")
            else:
                zombie.delete("s")
        monkeypatch.undo()
        b = holder["b"]
        assert holder["seq"] == 4
        assert b.append([{"type": "user/message", "turn": "t1", "content": "B again"}]) == 5
        assert [r.type for r in other.read("s")] == [
            "session/start", "turn/start", "step/start", "user/message", "user/message",
        ]
        b.close()
        # The failed taker's store is not locked out: the session is free once B closes.
        with zombie.session("s") as again:
            assert again.last_seq == 5


OPEN_TURN = [{"type": "turn/start", "turn": "t1"}, {"type": "step/start", "turn": "t1", "step": 1}]


# --- the write-behind after its ownership was lost -----------------------------------------


@pytest.mark.parametrize("mode", ["append", "submit", "group"])
def test_the_writer_never_writes_behind_a_writer_that_took_its_session(pg_url: str, mode: str) -> None:
    """The writer's lock connection dies and another store repairs s1 (closing its turn).
    What the writer had queued for s1 was made under the lost ownership: it fails
    (OwnershipLost), and the writer takes nothing more for s1; nothing lands after the
    repair."""
    with sessionlog.open_store(pg_url) as store, sessionlog.open_store(pg_url) as operator:
        store.create("s1")
        store.create("s2")

        outcome: list[Any] = []

        async def main() -> None:
            async with store.writer() as w:
                await w.append("s1", [{"type": "turn/start", "turn": "t1"}])
                await w.append("s2", [{"type": "turn/start", "turn": "t1"}])
                (holder,) = lock_holders(pg_url, "s1")
                server("SELECT pg_terminate_backend(:p)", p=holder)
                wait_for(lambda: not lock_holders(pg_url, "s1"), "the server to release the lock")
                assert operator.repair("s1").status == "repaired"
                late = [{"type": "user/message", "turn": "t1", "content": "after the takeover"}]
                if mode == "append":
                    outcome.extend(await asyncio.gather(w.append("s1", late), return_exceptions=True))
                elif mode == "submit":
                    w.submit("s1", late)
                    outcome.extend(await asyncio.gather(w.flush("s1"), return_exceptions=True))
                else:
                    outcome.extend(await asyncio.gather(w.append("s1", late), w.append("s2", late),
                                                        return_exceptions=True))
                with pytest.raises(sessionlog.OwnershipLost):
                    w.submit("s1", late)  # the session is closed to this writer

        with pytest.raises(sessionlog.OwnershipLost):
            asyncio.run(main())  # and close() says so again
        assert outcome and isinstance(outcome[0], sessionlog.OwnershipLost), outcome
        if mode == "group":  # s2 lost its lock with the same connection: refused too, not re-owned
            assert isinstance(outcome[1], sessionlog.OwnershipLost), outcome
        assert [r.type for r in store.read("s1")][-1] == "turn/end"
        assert "after the takeover" not in [r.get("content") for r in store.read("s1")]


# --- names: the tables a store writes are the ones its locks guard -----------------------


def test_a_store_without_schema_keeps_writing_the_tables_it_opened(pg_url: str) -> None:
    """search_path "a, b" with the store in b: opened without ``?schema=``, the store keys
    its locks by b. When a store later appears in a, the first store still writes b's
    tables (not a's, under b's key, beside a's own owner)."""
    b_url = pg_url
    b = schema_of(b_url)
    a = f"{b}_a"
    base = sa.make_url(b_url).difference_update_query(["schema"])
    a_url = base.update_query_dict({"schema": a}).render_as_string(hide_password=False)
    pathed = base.update_query_dict({"options": f"-csearch_path={a},{b}"}).render_as_string(hide_password=False)
    ddl(f'CREATE SCHEMA "{a}"')
    try:
        with sessionlog.open_store(b_url) as in_b:
            in_b.create("s")
        with sessionlog.open_store(pathed) as first:
            handle = first.session("s")
            handle.append([{"type": "note/first"}])
            with sessionlog.open_store(a_url) as in_a:
                in_a.create("s")
                with in_a.session("s") as theirs:
                    theirs.append([{"type": "note/a"}])
                    handle.append([{"type": "note/first"}])
                    theirs.append([{"type": "note/a"}])
                assert [r.type for r in in_a.read("s")] == ["session/start", "note/a", "note/a"]
            handle.close()
        with sessionlog.open_store(b_url, read_only=True) as in_b:
            assert [r.type for r in in_b.read("s")] == ["session/start", "note/first", "note/first"]
    finally:
        ddl(f'DROP SCHEMA IF EXISTS "{a}" CASCADE')


@pytest.mark.parametrize("isolation", ["serializable", "repeatable read"])
def test_the_migration_sees_a_migration_that_committed_while_it_waited(pg_url: str, isolation: str) -> None:
    """A server whose default isolation is not READ COMMITTED: a store that waited for the
    schema lock while another migrated must see version 2 once it has the lock (its
    snapshot taken before the wait would still say 1: ADD COLUMN again, and fail)."""
    schema = schema_of(pg_url)
    with sessionlog.open_store(pg_url) as store:
        store.create("s")
    ddl(f'ALTER TABLE "{schema}".sessionlog_sessions DROP COLUMN owner_epoch; '
        f"UPDATE \"{schema}\".sessionlog_meta SET value = '1' WHERE key = 'schema_version'")
    url = pg_url + "&options=" + urllib.parse.quote(f"-cdefault_transaction_isolation={isolation.replace(' ', chr(92) + ' ')}")
    engine = sa.create_engine(sa.make_url(postgres_base_url()).set(drivername="postgresql+psycopg"))
    app = f"sl_mig_{secrets.token_hex(4)}"

    def open_and_append() -> int:
        with sessionlog.open_store(f"{url}&application_name={app}") as s:
            return s.append("s", [{"type": "note/x"}])

    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (sql_engines.SCHEMA_LOCK_KEY,))
            opener = Started(open_and_append)
            wait_for(lambda: waiting_on_a_lock(app), "the store to wait for the schema lock")
            conn.exec_driver_sql(f'ALTER TABLE "{schema}".sessionlog_sessions '
                                 "ADD COLUMN owner_epoch BIGINT NOT NULL DEFAULT 0")
            conn.exec_driver_sql(f"UPDATE \"{schema}\".sessionlog_meta SET value = '2' WHERE key = 'schema_version'")
            conn.commit()
        outcome = opener.join(60)
    finally:
        engine.dispose()
    assert outcome == 2, outcome


def test_an_sqlite_file_with_a_second_name_is_refused_for_writing(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with sessionlog.open_store(f"sqlite:///{db}") as store:
        store.create("s")
    os.link(db, tmp_path / "alias.db")
    for name in ("store.db", "alias.db"):
        with pytest.raises(sessionlog.DurabilityRefused, match="2 names"):
            sessionlog.open_store(f"sqlite:///{tmp_path / name}")
        with sessionlog.open_store(f"sqlite:///{tmp_path / name}", read_only=True) as reader:
            assert reader.sessions() == ["s"]


def test_an_sqlite_database_in_a_symlinked_directory_is_written_where_it_lies(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with sessionlog.open_store(f"sqlite:///{tmp_path / 'link' / 'store.db'}") as store:
        store.create("s")
        with store.session("s") as handle:
            handle.append([{"type": "note/x"}])
            with sessionlog.open_store(f"sqlite:///{real / 'store.db'}") as direct:
                with pytest.raises(SessionLocked):
                    direct.session("s")
    assert (real / "store.db").is_file() and (real / ".store.db.locks").is_dir()


# --- a lock file removed under its holder --------------------------------------------------


def _lock_file(url: str, session_id: str) -> Path:
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        return db.parent / f".{db.name}.locks" / f"{session_id}.lock"
    return Path(url.split(":", 1)[1]) / f".{session_id}.lock"


@pytest.mark.parametrize("backend", ["jsonl", "zstd", "sqlite"])
@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_writer_whose_lock_file_was_removed_writes_nothing(tmp_path: Path, backend: str, how: str) -> None:
    """A cleaner of old files removes (or an operator replaces) the lock file of a session
    a long-lived handle holds: another process can then take a lock on a new file. The
    old handle refuses to append (OwnershipLost) instead of writing beside the new owner."""
    url = f"sqlite:///{tmp_path / 'store.db'}" if backend == "sqlite" else f"{backend}:{tmp_path / 'store'}"
    with sessionlog.open_store(url) as store, sessionlog.open_store(url) as other:
        store.create("s")
        old = store.session("s")
        old.append(note(1))
        lock = _lock_file(url, "s")
        lock.unlink()
        if how == "replaced":
            lock.write_bytes(b"")
            lock.chmod(0o600)
        new = other.session("s")  # takes a lock on the file the path names now
        assert new.append(note(2)) == 3
        if backend == "sqlite":  # a group commit names the batch whose lock file went
            store.create("t")
            with store.session("t") as fine:
                with pytest.raises(sessionlog.OwnershipLost) as info:
                    store.append_group([(fine, note(5)), (old, note(6))])
                assert info.value.group_index == 1
                assert fine.append(note(5)) == 2
        else:
            with pytest.raises(sessionlog.OwnershipLost, match="lock file was"):
                old.append(note(3))
        with pytest.raises(StoreClosed):
            old.append(note(4))
        old.close()
        assert [r.get("i") for r in other.read("s")][1:] == [1, 2]
        assert new.append(note(7)) == 4
        new.close()


def test_a_lock_file_removed_while_its_taker_waits_is_not_taken(tmp_path: Path) -> None:
    """A taker that opened the lock file and waits for it while the holder's file is
    removed and a third process takes a new one must not think it holds the session."""
    url = f"jsonl:{tmp_path / 'store'}"
    with sessionlog.open_store(url) as a, sessionlog.open_store(url) as b, sessionlog.open_store(url) as c:
        a.create("s")
        first = a.session("s")
        taker = Started(lambda: b.session("s", timeout=5))
        time.sleep(0.3)  # b has the old file open and waits for its lock
        _lock_file(url, "s").unlink()
        third = c.session("s")  # a new lock file, locked
        first.close()  # b now gets the lock on the removed file: it must not own the session
        time.sleep(0.5)
        assert not taker.done
        third.close()  # the session is free: b takes the lock on the file the path names
        handle = taker.join(10)
        assert handle.append(note(1)) == 2
        handle.close()


# --- the write-behind across a transient failure ------------------------------------------


class _FailingSync(FileSystem):
    """The I/O seam with one failing ``fdatasync`` when armed (the batch is rolled back)."""

    armed = False

    def fdatasync(self, fd: int) -> None:
        if self.armed:
            self.armed = False
            raise OSError(errno.EIO, "injected EIO")
        super().fdatasync(fd)


ASKED = [
    {"type": "turn/start", "turn": "t1"},
    {"type": "step/start", "turn": "t1", "step": 1},
    {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
     "tool_calls": [{"id": "c1", "name": "deploy", "arguments": {}}]},
    {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c1", "name": "deploy"},
]


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_a_writer_paused_by_a_transient_failure_never_writes_behind_another_writer(
    tmp_path: Path, backend: str
) -> None:
    """A rolled-back write (a failed sync, SQLite busy) pauses the session and closes the
    writer's handle. If another writer takes the session meanwhile (here a repair answers
    c1 TOOL_OUTCOME_UNKNOWN and closes the turn), the paused queue (c1's real result) is
    not written behind it by the next flush: OwnershipLost, and c1 keeps one result."""
    fs = _FailingSync()
    if backend == "jsonl":
        url = f"jsonl:{tmp_path / 'store'}"
        store = sessionlog.open_store(url, fs=fs)
    else:
        url = f"sqlite:///{tmp_path / 'store.db'}"
        store = sessionlog.open_store(url, busy_timeout=0.05)
    store.create("s1")
    real = [{"type": "tool/result", "turn": "t1", "step": 1, "call_id": "c1", "output": "deployed (the real result)"}]

    async def main() -> None:
        async with store.writer() as w:
            await w.append("s1", ASKED)
            blocker = None
            if backend == "jsonl":
                fs.armed = True
            else:
                blocker = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
                blocker.execute("BEGIN IMMEDIATE")
            future = w.submit("s1", real)
            await until(lambda: w.failure("s1") is not None, "the write to fail and pause the session")
            if blocker is not None:
                blocker.execute("ROLLBACK")
                blocker.close()
            with sessionlog.open_store(url) as operator:  # the session is not owned now
                assert operator.repair("s1").status == "repaired"
            with pytest.raises(sessionlog.OwnershipLost, match="another writer wrote to it"):
                await w.flush("s1")
            assert isinstance(future.exception(), sessionlog.OwnershipLost)

    with pytest.raises(sessionlog.OwnershipLost):
        asyncio.run(main())
    results = [r for r in store.read("s1") if r.type == "tool/result"]
    assert [r["call_id"] for r in results] == ["c1"]
    assert results[0]["output"] != real[0]["output"]  # the repair's answer, alone
    assert store.scan("s1").status is sessionlog.Status.CLEAN
    store.close()


def test_a_writer_resumes_after_a_transient_failure_when_nobody_else_wrote(tmp_path: Path) -> None:
    fs = _FailingSync()
    with sessionlog.open_store(f"jsonl:{tmp_path / 'store'}", fs=fs) as store:
        store.create("s1")

        async def main() -> None:
            async with store.writer() as w:
                await w.append("s1", ASKED)
                fs.armed = True
                future = w.submit("s1", [{"type": "note/x"}])
                await until(lambda: w.failure("s1") is not None, "the write to fail and pause the session")
                await w.flush("s1")  # retried: nobody else wrote, so the queue is written
                assert future.result() == 6

        asyncio.run(main())
        assert [r.seq for r in store.read("s1")][-1] == 6


# --- the file backends: a stale tail, a slow write, a lock that cannot be checked -----------


@pytest.mark.parametrize("backend", ["jsonl", "zstd"])
def test_a_handle_closed_after_another_writer_appended_leaves_no_stale_tail(tmp_path: Path, backend: str) -> None:
    """The lock file of a handle's session is removed and another store appends; when the
    old handle closes it must not remember the session's end as its own appends left it,
    or the next open in its store would append with seqs already used."""
    url = f"{backend}:{tmp_path / 'store'}"
    with sessionlog.open_store(url) as mine, sessionlog.open_store(url) as theirs:
        mine.create("s")
        handle = mine.session("s")
        handle.append(note(1))
        _lock_file(url, "s").unlink()
        with theirs.session("s") as other:
            assert other.append(note(2)) == 3
            assert other.append(note(3)) == 4
        handle.close()
        with mine.session("s") as again:
            assert again.last_seq == 4
            assert again.append(note(4)) == 5
        assert mine.scan("s").status is sessionlog.Status.CLEAN


def test_an_append_slow_to_write_does_not_reuse_the_seqs_of_another_writer(tmp_path: Path) -> None:
    """P's append passed its checks and is slow to write (dirty-page throttling); its lock
    file is removed and Q appends meanwhile. P's write must not land with Q's seqs: the
    appends to one file are fenced by a lock on the file itself."""
    url = f"jsonl:{tmp_path / 'store'}"
    sessionlog.open_store(url).create("s")
    slow = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, url], stdout=subprocess.PIPE, text=True)
    try:
        assert slow.stdout is not None
        assert slow.stdout.readline().strip() == "writing"
        _lock_file(url, "s").unlink()
        quick = subprocess.run(
            [sys.executable, "-c", "import sys, sessionlog\n"
             "s = sessionlog.open_store(sys.argv[1], lock_timeout=0)\n"
             "try:\n    print(s.append('s', [{'type': 'note/q'}]))\n"
             "except sessionlog.SessionLogError as exc:\n    print(type(exc).__name__)", url],
            capture_output=True, text=True, timeout=60,
        )
        out, _ = slow.communicate(timeout=60)
    finally:
        slow.kill()
    acked = {"slow": out.strip(), "quick": quick.stdout.strip()}
    with sessionlog.open_store(url) as reader:
        scan = reader.scan("s")
        assert scan.status is sessionlog.Status.CLEAN, (acked, scan)
        records = list(reader.read("s"))
    # Every acknowledged append is there, at the seq it was acknowledged with.
    for who, kind in (("slow", "note/p"), ("quick", "note/q")):
        if acked[who].isdigit():
            assert records[int(acked[who]) - 1].type == kind, (acked, [r.type for r in records])
    assert [r.seq for r in records] == list(range(1, len(records) + 1))


_SLOW_WRITER = """
import sys, time
import sessionlog
from sessionlog.durable import FileSystem

class Slow(FileSystem):
    slow = False
    def write(self, fd, data):
        if Slow.slow:
            print("writing", flush=True)
            time.sleep(1.0)
        return super().write(fd, data)

store = sessionlog.open_store(sys.argv[1], fs=Slow())
with store.session("s") as handle:
    handle.append([{"type": "note/p"}])
    Slow.slow = True
    try:
        print(handle.append([{"type": "note/p"}]), flush=True)
    except sessionlog.SessionLogError as exc:
        print(type(exc).__name__, flush=True)
"""


class _LockStatFails(FileSystem):
    """The I/O seam with ``stat`` of a lock file failing (EACCES) while armed."""

    armed = False

    def stat(self, path: str) -> os.stat_result:
        if self.armed and path.endswith(".lock"):
            raise PermissionError(errno.EACCES, "injected EACCES", path)
        return super().stat(path)


def test_a_lock_file_that_cannot_be_checked_is_not_a_lost_ownership(tmp_path: Path) -> None:
    """A stat of the lock file that fails for another reason than its absence (EACCES for a
    moment) writes nothing, but ownership is not lost: the write-behind pauses and its
    next flush writes the queue."""
    fs = _LockStatFails()
    with sessionlog.open_store(f"jsonl:{tmp_path / 'store'}", fs=fs) as store:
        store.create("s1")
        with store.session("s1") as handle:
            fs.armed = True
            with pytest.raises(AppendFailed) as info:
                handle.append(note(1))
            assert not isinstance(info.value, sessionlog.OwnershipLost)
            fs.armed = False

        async def main() -> None:
            async with store.writer() as w:
                await w.append("s1", note(2))
                fs.armed = True
                future = w.submit("s1", note(3))
                await until(lambda: w.failure("s1") is not None, "the write to fail and pause the session")
                fs.armed = False
                await w.flush("s1")
                assert future.result() == 3

        asyncio.run(main())


class _Disagrees(FileSystem):
    """A file system whose ``stat`` never names the file a descriptor has open."""

    def stat(self, path: str) -> os.stat_result:
        st = super().stat(path)
        return os.stat_result((st.st_mode, st.st_ino + 1, *tuple(st)[2:]))


def test_taking_a_lock_whose_file_keeps_changing_ends_at_its_timeout(tmp_path: Path) -> None:
    taker = Started(lambda: FileLock(_Disagrees(), str(tmp_path / ".s.lock")).acquire(0.2))
    assert isinstance(taker.join(10), SessionLocked)


# --- fork ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["jsonl", "sqlite", "postgresql"])
def test_a_forked_child_does_not_keep_its_dead_parents_sessions_owned(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A child forked while its parent owns a session shares the parent's lock descriptor
    (a flock's open file, PostgreSQL's lock-connection socket): killed later, the parent
    must not leave the session owned for as long as the child lives."""
    if backend == "postgresql":
        url = request.getfixturevalue("pg_url")
    else:
        url = f"jsonl:{tmp_path / 'store'}" if backend == "jsonl" else f"sqlite:///{tmp_path / 'store.db'}"
    # The child's copy of the handle is unusable; once the parent is killed, the session
    # is free while the child lives on.
    assert kill_parent_then_append(url, _FORKING_OWNER, [url], "child: StoreClosed") == 3


def kill_parent_then_append(url: str, script: str, args: list[str], said: str) -> int:
    """Run ``script``: a parent that forks a long-lived child, prints the child's pid, then
    prints ``said`` where it is to die. SIGKILL the parent there, then append to session
    "s" from here while the child lives: within 5 s (not after a 10 s wait for a fence or
    a lock the child kept). Returns the seq."""
    parent = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == said
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        with sessionlog.open_store(url, lock_timeout=10) as store:
            started = time.monotonic()
            seq = store.append("s", note(9))
            assert time.monotonic() - started < 5
            return seq
    finally:
        os.kill(child, signal.SIGKILL)


_FORKING_OWNER = """
import os, sys, time
import sessionlog
store = sessionlog.open_store(sys.argv[1])
store.create("s")
handle = store.session("s")
handle.append([{"type": "note/x", "i": 1}])
# The child speaks after the parent's line, each line one write (PYTHONUNBUFFERED makes
# print() two writes, and two processes' writes interleave).
spoken, speak = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(spoken, 1)
    try:
        handle.append([{"type": "note/child"}])
        said = "child: appended"
    except sessionlog.SessionLogError as exc:
        said = "child: " + type(exc).__name__
    sys.stdout.write(said + "\\n")
    sys.stdout.flush()
    time.sleep(60)
    os._exit(0)
sys.stdout.write(f"{pid}\\n")
sys.stdout.flush()
os.write(speak, b"!")
time.sleep(60)
"""


class _BeforeWriteOpen(FileSystem):
    """The I/O seam calling ``hook`` once, when a log file is next opened for writing."""

    hook: Any = None

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        if self.hook is not None and path.endswith(".jsonl") and flags & os.O_APPEND:
            hook, self.hook = self.hook, None
            hook()
        return super().open(path, flags, mode)


@pytest.mark.parametrize("new_owner_wrote", [True, False])
def test_a_repair_that_lost_its_lock_after_its_scan_writes_nothing(tmp_path: Path, new_owner_wrote: bool) -> None:
    """A repair scanned the session (an open turn); before it writes, its lock file is
    removed and another writer takes the session (and appends, or not yet). The repair
    must not close the turn that writer is running: it checks its own lock under the
    fence, and the writer's appends find the log as it left it."""
    fs = _BeforeWriteOpen()
    url = f"jsonl:{tmp_path / 'store'}"
    result = [{"type": "tool/result", "turn": "t1", "step": 1, "call_id": "c1", "output": "ran"}]
    with sessionlog.open_store(url, fs=fs) as store, sessionlog.open_store(url) as other:
        store.create("s", ASKED)
        taken: list[Any] = []

        def take_over() -> None:
            _lock_file(url, "s").unlink()
            taken.append(other.session("s"))
            if new_owner_wrote:
                taken[0].append(result)

        fs.hook = take_over
        with pytest.raises(sessionlog.OwnershipLost, match="lock file was|another writer"):
            store.repair("s")
        handle = taken[0]
        if not new_owner_wrote:
            assert handle.append(result) == 6
        assert [r.type for r in other.read("s")][-2:] == ["tool/call", "tool/result"]
        assert handle.append([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"}]) == 7
        handle.close()


# --- the fence is always released on the descriptor that holds it ---------------------------


def test_a_rolled_back_append_releases_the_fence_before_a_forked_child_could_keep_it(tmp_path: Path) -> None:
    """A forked child shares the log file's open file (and so any flock on it): a failed
    append that closed its descriptor before unlocking left the fence held by the child,
    and the next append of the session waited forever. The fence is released first."""
    fs = _FailingSync()
    with sessionlog.open_store(f"jsonl:{tmp_path / 'store'}", fs=fs) as store:
        store.create("s")
        handle = store.session("s")
        handle.append(note(1))
        child = os.fork()
        if child == 0:  # pragma: no cover - the child only waits
            time.sleep(30)
            os._exit(0)
        try:
            fs.armed = True
            with pytest.raises(AppendFailed):
                handle.append(note(2))  # rolled back; the handle is closed for appends
            handle.close()
            again = Started(lambda: store.append("s", note(3)))
            assert again.join(20) == 3  # not waiting on the child
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)


class _SlowWrite(FileSystem):
    """The I/O seam with every write taking ``delay`` seconds while armed."""

    armed = False
    delay = 1.0
    writing = threading.Event()

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.armed:
            self.writing.set()
            time.sleep(self.delay)
        return super().write(fd, data)


def test_compaction_never_drops_an_append_that_was_writing_as_it_replaced_the_log(tmp_path: Path) -> None:
    """A Zstd handle's append is writing (slowly) when its lock file is removed and another
    store takes the session and compacts it. The append is acknowledged only if the
    compacted log holds it: compaction replaces the log under the same fence as appends."""
    fs = _SlowWrite()
    url = f"zstd:{tmp_path / 'store'}"
    with sessionlog.open_store(url, fs=fs) as store, sessionlog.open_store(url) as other:
        store.create("s")
        handle = store.session("s")
        for i in range(5):
            handle.append(note(i))
        fs.armed = True
        writing = Started(lambda: handle.append(note(99)))
        assert fs.writing.wait(10)
        _lock_file(url, "s").unlink()
        try:
            other.compact("s")
        except sessionlog.SessionLogError:
            pass  # refused: the log changed under it
        acked = writing.join(30)
        fs.armed = False
        handle.close()
        found = [r.get("i") for r in other.read("s")]
        if isinstance(acked, int):
            assert found[acked - 1] == 99, (acked, found)
        assert found[1:6] == [0, 1, 2, 3, 4]


def test_a_handle_never_writes_behind_records_it_did_not_write(tmp_path: Path) -> None:
    """Another writer appended to the log while a handle held the session (without the
    lock): the handle's next append must not adopt those records and write after them."""
    url = f"jsonl:{tmp_path / 'store'}"
    with sessionlog.open_store(url) as store:
        store.create("s", ASKED)
        with store.session("s") as handle:
            path = tmp_path / "store" / "s.jsonl"
            with open(path, "ab") as f:  # a writer that ignores the lock
                f.write(encode_record({"type": "step/end", "turn": "t1", "step": 1, "status": "interrupted"}, 6, 1.0)
                        + b"\n")
            with pytest.raises(sessionlog.OwnershipLost, match="another writer wrote"):
                handle.append(note(1))
        # A copy of the same records renamed over the log (a compaction by hand) is not that.
        with store.session("s") as handle:
            copy = tmp_path / "store" / "copy"
            copy.write_bytes(path.read_bytes())
            os.rename(copy, path)
            assert handle.append(note(2)) == 7


def test_a_parent_killed_inside_the_fence_does_not_leave_it_to_its_forked_child(tmp_path: Path) -> None:
    url = f"jsonl:{tmp_path / 'store'}"
    assert isinstance(kill_parent_then_append(url, _KILLED_IN_FENCE, [url], "syncing"), int)


_KILLED_IN_FENCE = """
import os, sys, time
import sessionlog
from sessionlog.durable import FileSystem

class SlowSync(FileSystem):
    armed = False
    def fdatasync(self, fd):
        if SlowSync.armed:
            print("syncing", flush=True)
            time.sleep(60)
        return super().fdatasync(fd)

store = sessionlog.open_store(sys.argv[1], fs=SlowSync())
store.create("s")
handle = store.session("s")
handle.append([{"type": "note/x", "i": 1}])
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
SlowSync.armed = True
handle.append([{"type": "note/x", "i": 2}])
"""


class _ForkOnTempOpen(FileSystem):
    """The I/O seam forking a long-lived child when a temp file is created (a compaction's,
    after it opened the log), then making ``rename`` slow, so the parent can be killed
    inside the compaction's fence."""

    armed = False
    child = 0

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        if self.armed and flags & os.O_EXCL and not self.child:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child only waits
                time.sleep(60)
                os._exit(0)
            self.child = pid
            print(pid, flush=True)
        return fd

    def rename(self, src: str, dst: str) -> None:
        if self.armed:
            print("renaming", flush=True)
            time.sleep(60)
        super().rename(src, dst)


def test_a_compaction_killed_in_its_fence_does_not_leave_it_to_a_child_forked_before(tmp_path: Path) -> None:
    url = f"zstd:{tmp_path / 'store'}"
    with sessionlog.open_store(url) as store:
        store.create("s")
        for i in range(3):
            store.append("s", note(i))
    assert kill_parent_then_append(url, _COMPACTING, [url, str(Path(__file__).parent)], "renaming") == 5


_COMPACTING = """
import sys
sys.path.insert(0, sys.argv[2])
import sessionlog
from test_ownership import _ForkOnTempOpen
fs = _ForkOnTempOpen()
store = sessionlog.open_store(sys.argv[1], fs=fs)
fs.armed = True
store.compact("s", frame_bytes=1 << 20)
"""


def test_a_forked_child_closes_a_handle_whose_append_was_in_flight(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _CLOSING_CHILD, f"jsonl:{tmp_path / 'store'}"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["closed"], (out.stdout, out.stderr)


_CLOSING_CHILD = """
import os, sys, threading, time
import sessionlog
from sessionlog.durable import FileSystem

class SlowSync(FileSystem):
    armed = threading.Event()
    def fdatasync(self, fd):
        if SlowSync.armed.is_set():
            time.sleep(2)
        return super().fdatasync(fd)

store = sessionlog.open_store(sys.argv[1], fs=SlowSync())
store.create("s")
handle = store.session("s")
SlowSync.armed.set()
threading.Thread(target=handle.append, args=([{"type": "note/x"}],)).start()
time.sleep(0.5)  # the append holds the handle's mutex, syncing
pid = os.fork()
if pid == 0:
    handle.close()  # must not wait for the parent's append, which the child never sees end
    print("closed", flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
"""
