"""Single ownership on the SQL backend, under what breaks it in the field: a lock
connection that dies while an append waits, a second spelling of the same store, a
symlink to the SQLite file, a server that ends idle connections, a reopen after a lost
lock, a connection lost at COMMIT.

The invariant checked: a writer that opened a session saw every record committed before
its open returned, and no append of an earlier owner commits after it (the earlier
owner's append fails instead, writing nothing).

PostgreSQL tests need SESSIONLOG_TEST_POSTGRES_URL (a schema of their own per test)."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from postgres import postgres_base_url, postgres_schema_url
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

                def append_a() -> None:
                    try:
                        outcome["a"] = handle_a.append(note(2))
                    except BaseException as exc:
                        outcome["a"] = exc

                def open_b() -> None:
                    try:
                        outcome["b"] = store_b.session("s", timeout=30)
                    except BaseException as exc:
                        outcome["b"] = exc

                ta = threading.Thread(target=append_a)
                ta.start()
                wait_for(lambda: waiting_on_a_lock(app), "the append to wait for the row")
                server("SELECT pg_terminate_backend(:p)", p=holder)
                wait_for(lambda: not lock_holders(pg_url, "s"), "the server to release the lock")
                tb = threading.Thread(target=open_b)
                tb.start()
                time.sleep(0.5)  # the new owner's open runs (or waits) while the append waits
                conn.rollback()
            ta.join(30)
            tb.join(30)
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


def test_an_owner_whose_session_was_taken_over_writes_nothing(pg_url: str) -> None:
    """However a second owner came to be (here: its open is simulated by moving the
    session's owner epoch, as a new owner's open does), the first one's appends fail."""
    schema = schema_of(pg_url)
    with sessionlog.open_store(pg_url) as store:
        store.create("s")
        store.create("t")
        handle = store.session("s")
        other = store.session("t")
        handle.append(note(1))
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
        store.create("s")
        store.create("t")
        failed = store.session("s")
        unaware = store.session("t")
        failed.append(note(1))
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
