"""Fleet scale on the SQL backend: many open session handles on few database connections,
with ownership kept (one owner per session, a lost lock connection fails its handles).

PostgreSQL tests need SESSIONLOG_TEST_POSTGRES_URL (a schema of their own per test)."""

from __future__ import annotations

import logging
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from postgres import postgres_base_url, postgres_schema_url
from sessionlog.backends.sql import SqlStore
from sessionlog.backends.sql_engines import advisory_key

import sessionlog
from sessionlog import AppendFailed, SessionLocked, Status, StoreClosed


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_schema_url()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_url")


def server(sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Ask the PostgreSQL server through a connection of its own (what a DBA would run)."""
    engine = sa.create_engine(sa.make_url(postgres_base_url()).set(drivername="postgresql+psycopg"))
    try:
        with engine.begin() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params).all()]
    finally:
        engine.dispose()


def connections_named(app: str) -> int:
    return int(server("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a", a=app)[0][0])


def lock_holders(url: str, session_id: str) -> list[int]:
    """The server backends holding the session's advisory (ownership) lock."""
    namespace = sa.make_url(url).query.get("schema") or "public"
    key = advisory_key(namespace, session_id)
    return [int(pid) for (pid,) in server(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND classid::bigint = :hi AND objid::bigint = :lo",
        hi=(key >> 32) & 0xFFFFFFFF, lo=key & 0xFFFFFFFF,
    )]


def note(i: int) -> list[dict[str, Any]]:
    return [{"type": "note/x", "i": i}]


def test_a_thousand_open_sessions_within_ten_connections(pg_url: str) -> None:
    app = f"sl_fleet_{secrets.token_hex(4)}"
    url = f"{pg_url}&application_name={app}"
    n = 1000
    with sessionlog.open_store(url) as store:
        sids = [f"s{k}" for k in range(n)]
        for sid in sids:
            store.create(sid)
        handles = [store.session(sid) for sid in sids]
        peak = connections_named(app)
        errors: list[BaseException] = []

        def work(part: list[Any]) -> None:
            try:
                for h in part:
                    h.append(note(1))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(handles[k::16],)) for k in range(16)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak = max(peak, connections_named(app))
            time.sleep(0.01)
        assert not errors
        assert store.append_group([(h, note(2)) for h in handles]) == [3] * n
        peak = max(peak, connections_named(app))
        assert peak <= 10, f"{peak} server connections for {n} open sessions"
        # Every session is owned: a second store (its own connections) is refused each one.
        with sessionlog.open_store(url) as other:
            for sid in (sids[0], sids[n // 2], sids[-1]):
                assert other.scan(sid).owned
                with pytest.raises(SessionLocked):
                    other.session(sid)
        for h in handles:
            h.close()
        assert not store.scan(sids[-1]).owned
        assert [r["i"] for r in store.read(sids[7], 1)] == [1, 2]


def test_second_handle_in_the_same_process_is_locked(sql_url: str) -> None:
    with sessionlog.open_store(sql_url) as store, sessionlog.open_store(sql_url) as twin:
        store.create("s1")
        with store.session("s1") as handle:
            with pytest.raises(SessionLocked):
                store.session("s1")
            with pytest.raises(SessionLocked):
                store.session("s1", timeout=0.2)
            with pytest.raises(SessionLocked):
                twin.session("s1")
            handle.append(note(1))
        with store.session("s1") as handle:  # released on close: owned again at once
            assert handle.append(note(2)) == 3
        with twin.session("s1") as handle:
            assert handle.append(note(3)) == 4


def test_a_lock_wait_ends_when_the_owner_closes(sql_url: str) -> None:
    with sessionlog.open_store(sql_url) as store:
        store.create("s1")
        handle = store.session("s1")
        threading.Timer(0.3, handle.close).start()
        started = time.monotonic()
        with store.session("s1", timeout=10) as second:
            assert second.append(note(1)) == 2
        assert time.monotonic() - started < 5


def test_lost_lock_connection_fails_its_handles_safely(pg_url: str) -> None:
    with sessionlog.open_store(pg_url) as store:
        for sid in ("a", "b", "c"):
            store.create(sid)
        a, b, c = store.session("a"), store.session("b"), store.session("c")
        a.append(note(1))
        holders = lock_holders(pg_url, "a")
        assert len(holders) == 1 and lock_holders(pg_url, "b") == holders
        server("SELECT pg_terminate_backend(:p)", p=holders[0])
        deadline = time.monotonic() + 10
        while lock_holders(pg_url, "a") and time.monotonic() < deadline:
            time.sleep(0.02)
        # The server released the locks with the connection: never append without them.
        for h in (a, b):
            with pytest.raises(AppendFailed) as info:
                h.append(note(2))
            assert not info.value.outcome_unknown and "lock" in str(info.value)
            with pytest.raises(StoreClosed):
                h.append(note(3))
        with pytest.raises(AppendFailed) as info:
            store.append_group([(c, note(2))])
        assert info.value.group_index == 0 and not info.value.outcome_unknown
        assert [r.seq for r in store.read("a")] == [1, 2]
        assert [r.seq for r in store.read("b")] == [1] and [r.seq for r in store.read("c")] == [1]
        # Someone else may own the sessions now; closing the dead handles releases nothing of theirs.
        with sessionlog.open_store(pg_url) as other:
            theirs = other.session("a")
            for h in (a, b, c):
                h.close()
            assert other.scan("a").owned
            with pytest.raises(SessionLocked):
                store.session("a")
            theirs.close()
        with store.session("a") as again:  # the store takes new locks on a new connection
            assert again.append(note(4)) == 3
            assert lock_holders(pg_url, "a") and lock_holders(pg_url, "a") != holders


HOLDER = r"""
import sys, time
import sessionlog
url, sid = sys.argv[1:]
store = sessionlog.open_store(url)
try:
    store.session(sid)
    print("owned", flush=True)
except sessionlog.SessionLocked:
    print("locked", flush=True)
"""


def test_a_handle_in_another_process_is_locked_out(sql_url: str) -> None:
    with sessionlog.open_store(sql_url) as store:
        store.create("s1")
        with store.session("s1"):
            out = subprocess.run([sys.executable, "-c", HOLDER, sql_url, "s1"], capture_output=True,
                                 text=True, timeout=120)
            assert out.stdout.strip() == "locked", out.stderr
        out = subprocess.run([sys.executable, "-c", HOLDER, sql_url, "s1"], capture_output=True,
                             text=True, timeout=120)
        assert out.stdout.strip() == "owned", out.stderr
        assert store.scan("s1").status is Status.CLEAN


def test_sqlite_handles_hold_no_connection(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    def open_on_database() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if _target(fd) == str(path))

    with sessionlog.open_store(f"sqlite:///{path}") as store:
        for k in range(200):
            store.create(f"s{k}")
        handles = [store.session(f"s{k}") for k in range(200)]
        for h in handles:
            h.append(note(1))
        assert open_on_database() <= 10  # a small pool, not one connection per handle
        for h in handles:
            h.close()


def _target(fd: Path) -> str | None:
    try:
        return str(fd.readlink())
    except OSError:
        return None


def test_a_store_outlives_its_server_connections(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A server restart, a failover or an idle timeout ends every connection a long-lived
    store pooled. The next calls are served on new connections: no read, scan, session or
    append fails because a pooled connection died while it sat idle, and nothing is
    logged as an error on the way (closing a dead connection is not an error)."""
    app = f"sl_gone_{secrets.token_hex(4)}"
    url = f"{pg_url}&application_name={app}"

    def end_every_connection() -> None:
        ended = server("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = :a", a=app)
        assert ended
        deadline = time.monotonic() + 10
        while connections_named(app) and time.monotonic() < deadline:
            time.sleep(0.02)

    with sessionlog.open_store(url) as store:
        store.create("s1")
        with store.session("s1") as handle:
            handle.append(note(1))
        assert [r.seq for r in store.read("s1")] == [1, 2]
        end_every_connection()
        assert [r.seq for r in store.read("s1")] == [1, 2]
        end_every_connection()
        assert store.scan("s1").record_count == 2
        end_every_connection()
        with store.session("s1") as handle:  # a new lock connection, a pooled one for the append
            assert handle.append(note(2)) == 3
            end_every_connection()  # the lock went with its connection: this handle must fail
            with pytest.raises(AppendFailed) as info:
                handle.append(note(3))
            assert not info.value.outcome_unknown
        end_every_connection()
        store.create("s2")
        assert store.append("s2", note(4)) == 2
        assert [r["i"] for r in store.read("s1", 1)] == [1, 2]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
