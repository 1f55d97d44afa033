"""The SQL backend (backends/sql.py) on a real SQLite file and a real PostgreSQL server.

PostgreSQL tests need SESSIONLOG_TEST_POSTGRES_URL (each test gets a schema of its own,
dropped afterwards); they skip without it, and fail instead when
SESSIONLOG_REQUIRE_POSTGRES=1. Hand edits go through a separate connection, as a person
with a SQL shell would make them.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import sqlite3
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postgres import postgres_base_url, postgres_schema_url
from sessionlog.backends.sql import DurabilityRefused, RowScan, SqlStore

import sessionlog
from sessionlog import (
    AppendFailed,
    CorruptLog,
    DamageKind,
    InvalidEvent,
    SequenceConflict,
    SessionExists,
    SessionLocked,
    SessionNotFound,
    Status,
    StoreClosed,
    UnsupportedFormat,
    cli,
)
from sessionlog.contract import read_prefix
from sessionlog.events import Record, encode_record, header_event


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """A store URL in a fresh PostgreSQL schema, dropped after the test."""
    yield from postgres_schema_url()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture
def store(sql_url: str) -> Iterator[SqlStore]:
    with sessionlog.open_store(sql_url) as st_:
        assert isinstance(st_, SqlStore)
        yield st_


def db(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the store's database through a connection of its own (a hand edit)."""
    u = sa.make_url(url)
    schema = u.query.get("schema")
    engine = sa.create_engine(u.difference_update_query(["schema"]))
    try:
        with engine.begin() as conn:
            if schema:
                conn.exec_driver_sql(f'SET search_path TO "{schema}"')
            result = conn.execute(sa.text(sql), params)
            return [tuple(r) for r in result.all()] if result.returns_rows else []
    finally:
        engine.dispose()


def rows_of(url: str, sid: str) -> list[tuple[int, bytes]]:
    return [(int(s), bytes(r)) for s, r in db(
        url, "SELECT seq, record FROM sessionlog_records WHERE session_id = :sid ORDER BY seq", sid=sid
    )]


def plain(n: int, tag: str = "e") -> list[dict[str, Any]]:
    return [{"type": "note/x", "tag": tag, "i": i} for i in range(n)]


# --- layout ------------------------------------------------------------------------------


def test_one_row_per_record_holding_its_exact_bytes(store: SqlStore, sql_url: str) -> None:
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    store.append("s1", [{"type": "user/message", "turn": "t1", "content": "héllo \u2603 \"q\"\n"},
                        {"type": "runtime/own", "weird": {"nested": [1, 2.5, None]}}])
    records = list(store.read("s1"))
    assert rows_of(sql_url, "s1") == [(r.seq, r.raw) for r in records]
    assert [r.seq for r in records] == [1, 2, 3, 4]
    assert records[0].raw.startswith(b'{"seq":1,') and records[0]["format"] == "sessionlog/1"
    assert db(sql_url, "SELECT value FROM sessionlog_meta WHERE key = 'schema_version'") == [("2",)]
    with pytest.raises(sa.exc.IntegrityError):  # primary key (session_id, seq)
        db(sql_url, "INSERT INTO sessionlog_records (session_id, seq, record) VALUES ('s1', 2, :b)", b=b"{}")


def test_newer_schema_version_is_refused(sql_url: str) -> None:
    sessionlog.open_store(sql_url).close()
    db(sql_url, "UPDATE sessionlog_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(UnsupportedFormat, match="schema version 99"):
        sessionlog.open_store(sql_url)


V1_DUMP = Path(__file__).resolve().parent.parent / "fixtures" / "sql" / "v1-store.sql"
"""``sqlite3 .dump`` of a database written by the last version with schema version 1."""

OPEN_CALL = [
    {"type": "turn/start", "turn": 1},
    {"type": "step/start", "turn": 1, "step": 1},
    {"type": "assistant/message", "turn": 1, "step": 1, "content": None,
     "tool_calls": [{"id": "c1", "name": "ls", "arguments": "{}"}]},
    {"type": "tool/call", "turn": 1, "step": 1, "call_id": "c1", "name": "ls"},
]


def schema_version(url: str) -> str:
    return db(url, "SELECT value FROM sessionlog_meta WHERE key = 'schema_version'")[0][0]


def all_rows(url: str) -> list[tuple[Any, ...]]:
    return db(url, "SELECT session_id, seq, record FROM sessionlog_records ORDER BY session_id, seq")


def test_a_version_1_sqlite_database_is_read_as_it_is_and_migrated_by_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    con = sqlite3.connect(path)
    con.executescript(V1_DUMP.read_text())
    con.execute("PRAGMA journal_mode = WAL")
    con.close()
    url = f"sqlite:///{path}"
    rows = all_rows(url)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with sessionlog.open_store(url, read_only=True) as old:
        assert old.sessions() == ["healthy", "open-call"]
        assert old.scan("open-call").unanswered_calls == ["c1"]
        assert old.scan("healthy").status is Status.CLEAN
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before and schema_version(url) == "1"
    with sessionlog.open_store(url) as store:
        assert schema_version(url) == "2"
        assert all_rows(url) == rows
        with store.session("open-call", repair=True) as handle:
            assert handle.append([{"type": "turn/start", "turn": 2}]) == handle.last_seq
        assert [r["type"] for r in store.read("open-call")][5:] == [
            "tool/result", "step/end", "turn/end", "turn/start",
        ]
    with sessionlog.open_store(url) as again:  # migrated once
        assert again.scan("healthy").status is Status.CLEAN and schema_version(url) == "2"


def test_a_version_1_layout_is_migrated_by_the_first_writer(sql_url: str) -> None:
    with sessionlog.open_store(sql_url) as store:
        store.create("s", OPEN_CALL)
    db(sql_url, "ALTER TABLE sessionlog_sessions DROP COLUMN owner_epoch")
    db(sql_url, "UPDATE sessionlog_meta SET value = '1' WHERE key = 'schema_version'")
    rows = all_rows(sql_url)
    with sessionlog.open_store(sql_url, read_only=True) as old:
        assert old.scan("s").unanswered_calls == ["c1"]
        assert [r.raw for r in old.read("s")] == [bytes(r[2]) for r in rows]
    assert schema_version(sql_url) == "1"
    with sessionlog.open_store(sql_url) as store:
        assert schema_version(sql_url) == "2" and all_rows(sql_url) == rows
        with store.session("s") as handle:
            assert handle.append([{"type": "note/x"}]) == 6
        assert store.repair("s").status == "repaired"


def test_a_schema_version_below_1_is_refused(sql_url: str) -> None:
    sessionlog.open_store(sql_url).close()
    db(sql_url, "UPDATE sessionlog_meta SET value = '0' WHERE key = 'schema_version'")
    with pytest.raises(UnsupportedFormat, match="schema version 0"):
        sessionlog.open_store(sql_url)


def test_sessions_listing_and_delete(store: SqlStore, sql_url: str) -> None:
    for sid in ["b", "a", "c.1", "A"]:
        store.create(sid)
    assert store.sessions() == ["A", "a", "b", "c.1"]
    with pytest.raises(SessionExists):
        store.create("a")
    store.delete("b")
    assert store.sessions() == ["A", "a", "c.1"]
    assert rows_of(sql_url, "b") == []
    with pytest.raises(SessionNotFound):
        store.delete("b")
    with pytest.raises(SessionNotFound):
        store.scan("b")
    with pytest.raises(SessionNotFound):
        list(store.read("b"))


# --- durability settings -----------------------------------------------------------------


@pytest.mark.parametrize("query, options", [
    ("?synchronous=NORMAL", {}),
    ("?synchronous=off", {}),
    ("?synchronous=1", {}),
    ("", {"synchronous": "OFF"}),
    ("?journal_mode=DELETE", {}),
])
def test_sqlite_refuses_weak_durability(tmp_path: Path, query: str, options: dict[str, Any]) -> None:
    with pytest.raises(DurabilityRefused) as info:
        sessionlog.open_store(f"sqlite:///{tmp_path / 'x.db'}{query}", **options)
    assert isinstance(info.value, sessionlog.SessionLogError)


@pytest.mark.parametrize("url, reason", [
    ("postgresql+psycopg://postgres@127.0.0.1:notaport/test", "host or port does not parse"),
    ("postgresql+psycopg://postgres@[::1/test", "host or port does not parse"),
    ("postgresql+psycopg://postgres@127.0.0.1/test?schema=", "option 'schema' has no value"),
    ("sqlite:///{db}?foo=bar", "unknown option 'foo'"),
    ("sqlite:///{db}?synchronous=", "option 'synchronous' has no value"),
])
def test_a_url_that_does_not_say_what_it_means_is_refused(tmp_path: Path, url: str, reason: str) -> None:
    """A URL whose port does not parse, an option with no value (SQLAlchemy drops it: the
    store would open somewhere else), an option SQLite does not read: InvalidStoreUrl from
    the API and exit 2 from the command line, nothing created."""
    db = tmp_path / "x.db"
    sessionlog.open_store(f"sqlite:///{db}").close()
    before = sorted(os.listdir(tmp_path))
    url = url.format(db=db)
    with pytest.raises(sessionlog.InvalidStoreUrl, match=re.escape(reason)):
        sessionlog.open_store(url)
    for command in (["scan", url], ["convert", str(Path(__file__).resolve().parent.parent / "fixtures" / "healthy.jsonl"), url]):
        proc = subprocess.run([sys.executable, "-m", "sessionlog", *command], capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert reason in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://"])
def test_sqlite_in_memory_is_refused(url: str) -> None:
    with pytest.raises(DurabilityRefused, match="in-memory"):
        sessionlog.open_store(url)


def test_sqlite_connections_are_wal_full_and_private(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sessionlog.open_store(f"sqlite:///{path}", synchronous="EXTRA") as store:
        store.create("s1")
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 3
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
        with store.session("s1"):
            lock = tmp_path / ".store.db.locks" / "s1.lock"
            assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / ".store.db.locks").stat().st_mode) == 0o700
    with sessionlog.open_store(f"sqlite:///{path}") as store:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2


def test_sqlite_records_table_is_a_rowid_table_keyed_on_session_and_seq(tmp_path: Path) -> None:
    # Rows go where the last ones went (a group commit of many sessions dirties a few
    # pages, not one per session); the pinned key is a unique index beside them.
    path = tmp_path / "store.db"
    with sessionlog.open_store(f"sqlite:///{path}") as store:
        store.create("s1")
    conn = sqlite3.connect(path)
    try:
        (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'sessionlog_records'").fetchone()
        assert "WITHOUT ROWID" not in ddl.upper()
        pk = [name for _, name, unique, origin, _ in conn.execute("PRAGMA index_list(sessionlog_records)")
              if unique and origin == "pk"]
        assert len(pk) == 1
        assert [row[2] for row in conn.execute(f"PRAGMA index_info({pk[0]})")] == ["session_id", "seq"]
    finally:
        conn.close()


def test_sqlite_database_with_the_clustered_records_table_still_works(tmp_path: Path) -> None:
    # Databases made by earlier versions cluster records on (session_id, seq) (WITHOUT
    # ROWID): the same columns and key, read and appended to as before.
    path = tmp_path / "store.db"
    with sessionlog.open_store(f"sqlite:///{path}") as store:
        store.create("s1", [{"type": "user/message", "content": "before"}])
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(
        "BEGIN;"
        "CREATE TABLE old_records (session_id VARCHAR(128) NOT NULL, seq BIGINT NOT NULL, record BLOB NOT NULL,"
        " PRIMARY KEY (session_id, seq)) WITHOUT ROWID;"
        "INSERT INTO old_records SELECT session_id, seq, record FROM sessionlog_records;"
        "DROP TABLE sessionlog_records;"
        "ALTER TABLE old_records RENAME TO sessionlog_records;"
        "COMMIT;"
    )
    conn.close()
    with sessionlog.open_store(f"sqlite:///{path}") as store:
        with store.session("s1") as handle:
            assert handle.append([{"type": "user/message", "content": "after"}]) == 3
        store.append("s1", [{"type": "user/message", "content": "one-shot"}])
        assert [r.get("content") for r in store.read("s1")] == [None, "before", "after", "one-shot"]
        assert store.scan("s1").status == "clean"
    conn = sqlite3.connect(path)
    try:
        (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'sessionlog_records'").fetchone()
        assert "WITHOUT ROWID" in ddl.upper()  # the layout is left as it was
    finally:
        conn.close()


def test_postgres_refuses_synchronous_commit_off(pg_schema_url: str) -> None:
    with pytest.raises(DurabilityRefused, match="synchronous_commit=off"):
        sessionlog.open_store(pg_schema_url + "&options=-c%20synchronous_commit%3Doff")
    with sessionlog.open_store(pg_schema_url + "&options=-c%20synchronous_commit%3Dlocal") as store:
        assert store.create("s1") == 1  # local flush is durable on this server


def test_scan_never_creates_a_lock_file(tmp_path: Path) -> None:
    with sessionlog.open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        store.create("s1")
        store.scan("s1")
        store.repair("s1", dry_run=True)
        assert not (tmp_path / ".store.db.locks").exists()


# --- ownership ---------------------------------------------------------------------------


def test_owned_session_scans_open_and_repair_is_refused(store: SqlStore) -> None:
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    with store.session("s1") as handle:
        scan = store.scan("s1")
        assert scan.owned and scan.status is Status.OPEN
        with pytest.raises(SessionLocked):
            store.repair("s1")
        assert store.repair("s1", dry_run=True).status == "refused"
        with pytest.raises(SessionLocked):
            store.session("s1")
        assert handle.append([{"type": "user/message", "turn": "t1", "content": "x"}]) == 3
    scan = store.scan("s1")
    assert not scan.owned and scan.status is Status.REPAIRABLE
    report = store.repair("s1")
    assert report.status == "repaired" and [r.type for r in report.appended] == ["turn/end"]
    assert store.repair("s1").status == "clean"


def test_one_shot_append_and_delete_wait_for_the_owner(sql_url: str) -> None:
    with sessionlog.open_store(sql_url, lock_timeout=0.2) as store:
        store.create("s1")
        with store.session("s1"):
            t0 = time.monotonic()
            with pytest.raises(SessionLocked):
                store.append("s1", plain(1))
            assert time.monotonic() - t0 >= 0.15
            with pytest.raises(SessionLocked):
                store.delete("s1")
        assert store.append("s1", plain(1)) == 2


def test_stores_in_different_postgres_schemas_are_separate(pg_schema_url: str) -> None:
    other = pg_schema_url.replace("schema=", "schema=b")
    with sessionlog.open_store(pg_schema_url) as a, sessionlog.open_store(other) as b:
        try:
            a.create("s1")
            b.create("s1", plain(2))
            with a.session("s1"):
                assert a.scan("s1").owned and not b.scan("s1").owned
                with b.session("s1") as hb:
                    assert hb.last_seq == 3
            assert a.sessions() == b.sessions() == ["s1"]
        finally:
            b.close()
            schema = sa.make_url(other).query["schema"]
            db(postgres_base_url(), f'DROP SCHEMA "{schema}" CASCADE')


# --- appends -----------------------------------------------------------------------------


def test_handle_tracks_the_tail_and_expect_seq(store: SqlStore) -> None:
    store.create("s1")
    with store.session("s1") as handle:
        assert handle.last_seq == 1
        assert handle.append(plain(3)) == 4
        assert handle.append(plain(1), expect_seq=4) == 5
        with pytest.raises(SequenceConflict) as info:
            handle.append(plain(1), expect_seq=4)
        assert (info.value.expected, info.value.found) == (4, 5)
        assert handle.append([], expect_seq=5) == 5
        assert [r.seq for r in handle.records(3)] == [4, 5]
        with pytest.raises(InvalidEvent):
            handle.append([{"type": "x", "seq": 9}])
        assert handle.append(plain(1)) == 6  # a refused batch does not spoil the handle
    with pytest.raises(StoreClosed):
        handle.append(plain(1))


def test_batch_limit_is_enforced(sql_url: str) -> None:
    with sessionlog.open_store(sql_url, limits=sessionlog.Limits(record_limit=1000, batch_limit=4000)) as store:
        store.create("s1")
        with pytest.raises(InvalidEvent, match="record limit"):
            store.append("s1", [{"type": "x", "pad": "a" * 2000}])
        with pytest.raises(InvalidEvent, match="batch limit"):
            store.append("s1", [{"type": "x", "pad": "a" * 900}] * 5)
        assert store.scan("s1").last_seq == 1


def test_postgres_batch_is_one_insert_statement(pg_schema_url: str) -> None:
    import psycopg

    executed: list[str] = []

    class Counting(psycopg.Cursor):  # type: ignore[type-arg]
        def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            executed.append(str(query))
            return super().execute(query, params, **kw)

        def executemany(self, query: Any, params: Any, **kw: Any) -> Any:  # pragma: no cover
            executed.append("executemany " + str(query))
            return super().executemany(query, params, **kw)

    with sessionlog.open_store(pg_schema_url) as store:
        store.create("s1")
        with store.session("s1") as handle:
            # Every pooled connection counts what its cursors run.
            for dbapi in _pooled(store):
                dbapi.cursor_factory = Counting
            assert handle.append(plain(1000)) == 1001
        assert len(executed) == 2, executed  # lock the session's row, insert every row
        assert "FOR UPDATE" in executed[0] and "unnest" in executed[1]
        assert [r["i"] for r in store.read("s1", 1)] == list(range(1000))


def _pooled(store: SqlStore) -> list[Any]:
    """The driver connections of the store's pool, each checked out once."""
    held = [store.engine.raw_connection() for _ in range(store.engine.pool.size())]
    try:
        return [h.driver_connection for h in held]
    finally:
        for h in held:
            h.close()


def test_postgres_serializable_default_isolation_still_appends(pg_schema_url: str) -> None:
    url = pg_schema_url + "&options=-c%20default_transaction_isolation%3Dserializable"
    with sessionlog.open_store(url) as store:
        store.create("s1")
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(10):
                    store.append("s1", plain(3, f"{k}.{i}"))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        scan = store.scan("s1")
        assert scan.status is Status.CLEAN and scan.last_seq == 1 + 3 * 10 * 3


def test_sqlite_busy_is_retried(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sessionlog.open_store(f"sqlite:///{path}", busy_timeout=0.02) as store:
        store.create("s1")
        with store.session("s1") as handle:
            other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            other.execute("BEGIN IMMEDIATE")  # another writer holds the database's write lock
            timer = threading.Timer(0.15, other.execute, args=("ROLLBACK",))
            timer.start()
            try:
                assert handle.append(plain(2)) == 3
            finally:
                timer.join()
                other.close()
    assert [r.seq for r in sessionlog.open_store(f"sqlite:///{path}").read("s1")] == [1, 2, 3]


def test_sqlite_busy_for_too_long_fails_the_append(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with sessionlog.open_store(f"sqlite:///{path}", busy_timeout=0.005) as store:
        store.create("s1")
        other = sqlite3.connect(path, isolation_level=None)
        with store.session("s1") as handle:
            other.execute("BEGIN IMMEDIATE")
            try:
                with pytest.raises(AppendFailed) as info:
                    handle.append(plain(1))
                assert not info.value.outcome_unknown
                with pytest.raises(StoreClosed):
                    handle.append(plain(1))
            finally:
                other.execute("ROLLBACK")
                other.close()
        assert store.scan("s1").last_seq == 1


def test_postgres_commit_error_is_outcome_unknown(pg_schema_url: str) -> None:
    schema = sa.make_url(pg_schema_url).query["schema"]
    with sessionlog.open_store(pg_schema_url) as store:
        store.create("s1")
        # A deferred constraint trigger fails at COMMIT, after every statement succeeded.
        db(pg_schema_url, f"""
            CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
            CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON "{schema}".sessionlog_records
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse();
        """)
        with store.session("s1") as handle:
            with pytest.raises(AppendFailed) as info:
                handle.append(plain(2))
            assert info.value.outcome_unknown
            assert "commit" in str(info.value)
            with pytest.raises(StoreClosed):
                handle.append(plain(1))
        db(pg_schema_url, f'DROP TRIGGER refuse ON "{schema}".sessionlog_records')
        assert store.scan("s1").last_seq == 1  # here the commit did fail
        assert store.append("s1", plain(1)) == 2


# --- scanning a database edited by hand --------------------------------------------------


def _session_with(store: SqlStore, n: int) -> list[Record]:
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    store.append("s1", plain(n))
    return list(store.read("s1"))


def test_garbage_row_before_good_rows_is_mid_log(store: SqlStore, sql_url: str) -> None:
    before = _session_with(store, 6)  # seq 1..8
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq = 4", b=b"\x00garbage")
    tail = rows_of(sql_url, "s1")[3:]
    scan = store.scan("s1")
    assert scan.status is Status.NEEDS_FORCE
    assert scan.damage is not None and scan.damage.kind is DamageKind.MID_LOG
    assert (scan.damage.offset, scan.stable_offset, scan.last_seq) == (3, 3, 3)
    assert scan.damage.records_after == 4 and scan.damage.dropped_seqs == (5, 8)
    assert scan.damage.length == sum(len(r) for _, r in tail)
    assert [r.raw for r in scan.records] == [r.raw for r in before[:3]]
    # A reader is told, after the prefix: rows that decode follow the damage (as on files).
    given = []
    with pytest.raises(CorruptLog) as raised:
        for record in store.read("s1"):
            given.append(record.seq)
    assert given == [1, 2, 3] and raised.value.kind == "mid-log" and raised.value.offset == 3
    assert "4 decodable records after the damage" in str(raised.value)
    with pytest.raises(CorruptLog):
        sessionlog.project(store.read("s1"), "openai")
    assert [r.seq for r in read_prefix(store, "s1")] == [1, 2, 3]  # the tools that show a damaged log

    refused = store.repair("s1")
    assert refused.status == "refused" and "force" in (refused.reason or "")
    assert rows_of(sql_url, "s1")[3:] == tail  # nothing changed
    with pytest.raises(CorruptLog) as info:
        store.session("s1", repair=True)  # never implies force
    assert info.value.kind == "mid-log"

    report = store.repair("s1", force=True)
    assert report.status == "repaired" and report.quarantine is not None
    marker = report.appended[0]
    assert marker.seq == 4 and marker.type == "log/truncated"
    assert (marker["reason"], marker["quarantine"], marker["dropped_seqs"]) == ("mid-log", report.quarantine, [5, 8])
    assert marker["offset"] == 3 and marker["dropped_bytes"] == scan.damage.length
    assert [r.type for r in report.appended[1:]] == ["turn/end"]
    # The rows after the break moved, bytes intact, under the marker's name: never deleted.
    assert [(s, r) for _, s, r in store.quarantined("s1")] == tail
    assert {n for n, _, _ in store.quarantined("s1")} == {report.quarantine}
    after = store.scan("s1")
    assert after.status is Status.CLEAN and after.damage is None and after.last_seq == 5
    assert rows_of(sql_url, "s1") == [(r.seq, r.raw) for r in store.read("s1")]
    again = store.repair("s1", force=True)
    assert again.status == "clean" and again.appended == []
    assert store.scan("s1").last_seq == 5
    with pytest.raises(SequenceConflict):
        list(store.read("s1", after_seq=8))
    assert store.append("s1", plain(1)) == 6


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("CAST(record AS TEXT)", "TEXT"),  # the same JSON, as TEXT: not the bytes the engine committed
        ("CAST(x'ff7b7d' AS TEXT)", "TEXT"),  # TEXT that is not UTF-8: the driver cannot decode it as a str
        ("42", "INTEGER"),
        ("4.5", "REAL"),
        ("CAST(zeroblob(1100000) AS TEXT) || 'x'", "TEXT"),  # over the record limit too: still damage at its row
    ],
)
def test_a_row_whose_record_is_not_a_blob_is_damage_at_that_row(tmp_path: Path, value: str, kind: str) -> None:
    """SQLite keeps any value in any column: a record column edited by hand to TEXT or a
    number is damage named by its row, for scan, read, repair and the command line,
    never a TypeError or a driver error; a forced repair quarantines what it held."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = sessionlog.open_store(url)
    _session_with(store, 6)  # seq 1..8
    db(url, f"UPDATE sessionlog_records SET record = {value} WHERE session_id = 's1' AND seq = 4")
    held = sqlite3.connect(tmp_path / "store.db").execute(
        "SELECT CAST(record AS BLOB) FROM sessionlog_records WHERE seq = 4").fetchone()[0]
    scan = store.scan("s1")
    assert scan.damage is not None and scan.damage.kind is DamageKind.MID_LOG
    assert (scan.damage.offset, scan.damage.records_after, scan.damage.dropped_seqs) == (3, 4, (5, 8))
    assert f"row seq 4 does not decode: the record column holds {kind}, not a BLOB" == scan.damage.reason
    with pytest.raises(CorruptLog) as raised:
        list(store.read("s1"))
    assert raised.value.kind == "mid-log"
    assert [r.seq for r in read_prefix(store, "s1")] == [1, 2, 3]
    scanned = subprocess.run([sys.executable, "-m", "sessionlog", "scan", url], capture_output=True, text=True)
    assert scanned.returncode == 3 and "Traceback" not in scanned.stderr
    shown = subprocess.run([sys.executable, "-m", "sessionlog", "show", url], capture_output=True, text=True)
    assert shown.returncode == 0 and "mid-log" in shown.stderr and "Traceback" not in shown.stderr
    assert store.repair("s1").status == "refused"
    report = store.repair("s1", force=True)
    assert report.status == "repaired"
    assert [(s, r) for _, s, r in store.quarantined("s1")][0] == (4, held)
    assert store.scan("s1").status is Status.CLEAN
    db(url, f"UPDATE sessionlog_records SET record = {value} WHERE session_id = 's1' AND seq = 5")  # the last row
    with pytest.raises(CorruptLog) as refused:
        store.append("s1", plain(1))
    assert refused.value.kind == "corrupt" and kind in str(refused.value)


def test_garbage_last_rows_are_corrupt_and_repair_without_force(store: SqlStore, sql_url: str) -> None:
    _session_with(store, 4)  # seq 1..6
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq >= 5", b=b'{"seq":5')
    scan = store.scan("s1")
    assert scan.damage is not None and scan.damage.kind is DamageKind.CORRUPT
    assert (scan.damage.offset, scan.damage.records_after, scan.damage.dropped_seqs) == (4, 0, None)
    assert scan.status is Status.REPAIRABLE
    assert [r.seq for r in store.read("s1")] == [1, 2, 3, 4]  # nothing decodes after it: the prefix, quietly
    with store.session("s1", repair=True) as handle:
        assert handle.last_seq == 6  # marker 5, turn/end 6
        assert [r.type for r in handle.records(4)] == ["log/truncated", "turn/end"]
    assert [s for _, s, _ in store.quarantined("s1")] == [5, 6]
    assert store.repair("s1").status == "clean"


def test_deleted_row_is_a_seq_break(store: SqlStore, sql_url: str) -> None:
    _session_with(store, 5)  # seq 1..7
    db(sql_url, "DELETE FROM sessionlog_records WHERE session_id = 's1' AND seq = 3")
    scan = store.scan("s1")
    assert scan.damage is not None and scan.damage.kind is DamageKind.SEQ_BREAK
    assert (scan.damage.offset, scan.damage.records_after, scan.damage.dropped_seqs) == (2, 4, (4, 7))
    assert "seq 4 where 3 was expected" in scan.damage.reason
    with pytest.raises(CorruptLog) as raised:
        list(store.read("s1"))
    assert raised.value.kind == "seq-break" and raised.value.offset == 2
    assert [r.seq for r in read_prefix(store, "s1")] == [1, 2]
    with pytest.raises(CorruptLog) as info:  # the row count gives a gap away when the session is opened
        store.append("s1", plain(1))
    assert info.value.kind == "seq-break"
    assert store.repair("s1").status == "refused"
    report = store.repair("s1", force=True)
    assert report.appended[0]["reason"] == "seq-break"
    assert [s for _, s, _ in store.quarantined("s1")] == [4, 5, 6, 7]
    assert store.scan("s1").status is Status.CLEAN


def test_seq_column_disagreeing_with_its_record_is_a_seq_break(store: SqlStore, sql_url: str) -> None:
    _session_with(store, 3)  # seq 1..5
    db(sql_url, "UPDATE sessionlog_records SET seq = 9 WHERE session_id = 's1' AND seq = 5")
    scan = store.scan("s1")
    assert scan.damage is not None and scan.damage.kind is DamageKind.SEQ_BREAK
    assert "row seq 9 holds a record with seq 5" in scan.damage.reason


def test_record_spanning_lines_does_not_decode(store: SqlStore, sql_url: str) -> None:
    _session_with(store, 3)  # seq 1..5
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq = 3",
       b=b'{"seq":3,\n"ts":1.0,"type":"x"}')
    scan = store.scan("s1")
    assert scan.damage is not None and scan.damage.kind is DamageKind.MID_LOG
    assert "spans lines" in scan.damage.reason


def test_damaged_header_is_not_a_session_log(store: SqlStore, sql_url: str) -> None:
    _session_with(store, 2)
    before = rows_of(sql_url, "s1")
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq = 1", b=b"nope")
    for call in (lambda: store.scan("s1"), lambda: store.repair("s1", force=True),
                 lambda: list(store.read("s1")), lambda: store.append("s1", plain(1))):
        with pytest.raises(CorruptLog, match="not a session log"):
            call()
    header = encode_record({**header_event("s1"), "format": "sessionlog/9"}, 1)
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq = 1", b=header)
    with pytest.raises(UnsupportedFormat):
        store.scan("s1")
    with pytest.raises(UnsupportedFormat):
        store.repair("s1", force=True)
    assert rows_of(sql_url, "s1")[1:] == before[1:]
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq = 1",
       b=encode_record(header_event("other"), 1))
    with pytest.raises(CorruptLog, match="not the log of session"):
        store.scan("s1")


def test_repair_is_conditional_on_the_rows_it_scanned(store: SqlStore, sql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _session_with(store, 2)  # an open turn: repair would close it
    plan = store._repair_plan

    def plan_then_someone_writes(*args: Any, **kwargs: Any) -> Any:
        report = plan(*args, **kwargs)
        # A writer that ignores the ownership protocol slips a row in after the scan.
        db(sql_url, "INSERT INTO sessionlog_records (session_id, seq, record) VALUES ('s1', 5, :b)",
           b=encode_record({"type": "note/x"}, 5))
        return report

    monkeypatch.setattr(store, "_repair_plan", plan_then_someone_writes)
    with pytest.raises(SequenceConflict, match="changed since it was scanned"):
        store.repair("s1")
    monkeypatch.undo()
    assert [r.seq for r in store.read("s1")] == [1, 2, 3, 4, 5]
    assert store.repair("s1").appended[0].seq == 6


# --- reading, importing, converting ------------------------------------------------------


@pytest.mark.parametrize("reader", ["read", "read_prefix"])
def test_a_read_that_meets_damage_a_repair_removed_reads_on(store: SqlStore, sql_url: str, reader: str) -> None:
    """A reader fetched a chunk holding a damaged row; before it reached the row, another
    process repaired the session (the row quarantined, the marker and the closing records
    appended in its place). The reader reads on into the repaired rows, as the file
    backends re-read: it ends where a fresh read ends, never quietly at the old damage."""
    _session_with(store, 6)  # seq 1..8
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq = 4", b=b"\x00garbage")
    stream = iter(store.read("s1") if reader == "read" else read_prefix(store, "s1"))
    given = [next(stream).seq]  # the chunk with the damaged row is fetched
    with sessionlog.open_store(sql_url) as other:  # another process repairs, with force
        assert other.repair("s1", force=True).status == "repaired"
    given += [record.seq for record in stream]
    fresh = [record.seq for record in store.read("s1")]
    assert fresh[:3] == [1, 2, 3] and len(fresh) > 3
    assert given == fresh


def test_read_streams_across_chunks_and_stops_at_damage(store: SqlStore, sql_url: str) -> None:
    store.create("s1")
    for k in range(5):
        store.append("s1", plain(500, str(k)))  # seq 2..2501
    assert [r.seq for r in store.read("s1")] == list(range(1, 2502))
    assert [r.seq for r in store.read("s1", 1500)] == list(range(1501, 2502))
    assert list(store.read("s1", 2501)) == []
    db(sql_url, "UPDATE sessionlog_records SET record = :b WHERE session_id = 's1' AND seq = 2200", b=b"x")
    assert [r.seq for r in read_prefix(store, "s1")][-1] == 2199
    assert [r.seq for r in read_prefix(store, "s1", 2100)] == list(range(2101, 2200))
    given = []
    with pytest.raises(CorruptLog) as raised:  # rows decode after the damage: the reader is told
        for record in store.read("s1", 2100):
            given.append(record.seq)
    assert given == list(range(2101, 2200)) and raised.value.kind == "mid-log"
    with pytest.raises(SequenceConflict):
        list(store.read("s1", 2200))
    assert store.scan("s1").damage.records_after == 301  # type: ignore[union-attr]


def _odd_records(sid: str) -> list[Record]:
    lines = [
        encode_record(header_event(sid), 1),
        b'{"seq":2, "ts":1.50, "type":"turn/start","turn":"t1"}',
        b'{"seq":3,"ts":2e0,"type":"runtime/own","x":{"deep":[1,{"a":null}]},"u":"\\u00e9\xc3\xa9"}',
        b'{"type":"user/message","seq":4,"ts":3,"turn":"t1","content":"hi"}',
    ]
    return [Record.from_line(line) for line in lines]


def test_convert_between_jsonl_and_sql_is_byte_identical(store: SqlStore, sql_url: str, tmp_path: Path) -> None:
    src = sessionlog.open_store(f"jsonl:{tmp_path / 'src'}")
    src.import_session("s1", _odd_records("s1"))
    original = (tmp_path / "src" / "s1.jsonl").read_bytes()
    assert store.import_session("s1", src.read("s1")) == 4
    assert b"".join(r + b"\n" for _, r in rows_of(sql_url, "s1")) == original
    back = sessionlog.open_store(f"jsonl:{tmp_path / 'back'}")
    back.import_session("s1", store.read("s1"))
    assert (tmp_path / "back" / "s1.jsonl").read_bytes() == original
    assert store.scan("s1").open_turn == "t1"


def test_import_is_all_or_nothing(store: SqlStore, sql_url: str) -> None:
    good = [Record.from_line(encode_record(header_event("s1"), 1))] + [
        Record.from_line(encode_record({"type": "note/x", "i": i}, i)) for i in range(2, 1500)
    ]

    def with_gap() -> Iterator[Record]:
        yield from good[:1200]
        yield Record.from_line(encode_record({"type": "note/x"}, 1300))

    with pytest.raises(InvalidEvent, match="seq 1300"):
        store.import_session("s1", with_gap())
    assert store.sessions() == [] and rows_of(sql_url, "s1") == []
    with pytest.raises(InvalidEvent):
        store.import_session("s1", [])
    with pytest.raises(InvalidEvent, match="header"):
        store.import_session("s2", good)
    bad = [good[0], Record(b'{"seq":2,\n"ts":1,"type":"x"}', 2, 1.0, "x")]
    with pytest.raises(InvalidEvent, match="spans lines"):
        store.import_session("s1", bad)
    assert store.sessions() == []
    assert store.import_session("s1", good) == 1499
    with pytest.raises(SessionExists):
        store.import_session("s1", good)
    assert rows_of(sql_url, "s1") == [(r.seq, r.raw) for r in good]


def test_closed_store_refuses_work(sql_url: str) -> None:
    store = sessionlog.open_store(sql_url)
    store.create("s1")
    store.close()
    for call in (lambda: store.create("s2"), lambda: store.scan("s1"), lambda: store.sessions(),
                 lambda: store.append("s1", plain(1))):
        with pytest.raises(StoreClosed):
            call()


# --- the row scanner, any damage at any row (pure) ---------------------------------------


def _log_rows(n: int) -> list[tuple[int, bytes]]:
    rows = [(1, encode_record(header_event("s"), 1))]
    rows += [(i, encode_record({"type": "note/x", "i": i}, i)) for i in range(2, n + 1)]
    return rows


@settings(max_examples=300 if os.environ.get("SESSIONLOG_SLOW") else 60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 30), data=st.data())
def test_row_scan_classifies_any_single_damage(n: int, data: st.DataObject) -> None:
    rows = _log_rows(n)
    at = data.draw(st.integers(1, n - 1))  # 0-based row; the header stays intact
    how = data.draw(st.sampled_from(["garbage", "delete", "renumber"]))
    if how == "garbage":
        rows[at] = (rows[at][0], data.draw(st.sampled_from([b"", b"\x00\x00", b"{", b"[1]", b'{"seq":"x"}'])))
    elif how == "delete":
        del rows[at]
    else:
        rows[at] = (rows[at][0], encode_record({"type": "note/x"}, rows[at][0] + 7))
    scan = RowScan(rows, session_id="s", where="test")
    prefix = list(scan)
    assert [r.seq for r in prefix] == list(range(1, at + 1))
    tail = rows[at:]
    if not tail:  # deleted the last row: a shorter, clean log
        assert scan.damage is None
        return
    damage = scan.damage
    assert damage is not None and damage.offset == at == scan.count
    assert damage.length == sum(len(r) for _, r in tail)
    if how == "garbage":
        assert damage.kind is (DamageKind.MID_LOG if len(tail) > 1 else DamageKind.CORRUPT)
        assert damage.records_after == len(tail) - 1
    else:
        assert damage.kind is DamageKind.SEQ_BREAK and damage.records_after == len(tail)


# --- reading without writing (scan, show, repair --dry-run) ------------------------------


def _dir_listing(path: Path) -> dict[str, str]:
    """Every file beside the database (hidden ones too) with the sha256 of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(path.iterdir())}


def _sqlite_facts(path: Path) -> tuple[list[str], str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        return tables, conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


def test_scanning_an_unrelated_sqlite_file_changes_nothing_and_exits_4(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('keep me')")
    conn.commit()
    conn.close()
    before = _dir_listing(tmp_path), _sqlite_facts(path)
    assert before[1] == (["notes"], "delete")

    out = io.StringIO()
    assert cli.main(["scan", f"sqlite:///{path}", "--json"], out) == 4
    assert cli.main(["show", f"sqlite:///{path}", "--session", "s1"], io.StringIO()) == 4
    assert cli.main(["repair", f"sqlite:///{path}", "--dry-run"], io.StringIO()) == 4
    with pytest.raises(CorruptLog, match="not a sessionlog store"):
        SqlStore(f"sqlite:///{path}", read_only=True)
    assert (_dir_listing(tmp_path), _sqlite_facts(path)) == before


def test_scanning_a_sqlite_store_leaves_its_database_bytes_alone(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    with sessionlog.open_store(url) as store:
        store.create("s1", plain(3))
        store.create("s2", [{"type": "turn/start", "turn": "t1"}])
    before = _dir_listing(tmp_path)
    out = io.StringIO()
    assert cli.main(["scan", url, "--json"], out) == 1  # s2 has an open turn: repairable
    assert cli.main(["repair", url, "--dry-run"], io.StringIO()) == 0
    with SqlStore(url, read_only=True) as reader:
        assert reader.sessions() == ["s1", "s2"]
        assert [r.seq for r in reader.read("s1")] == [1, 2, 3, 4]
    after = _dir_listing(tmp_path)
    # SQLite gives any reader of a WAL database its -wal and -shm files (an empty WAL and
    # the rebuildable index): the database file, its tables and the lock directory stay
    # as they were.
    assert after[path.name] == before[path.name]
    assert set(after) - set(before) <= {"store.db-wal", "store.db-shm"}
    if "store.db-wal" in after:
        assert (tmp_path / "store.db-wal").stat().st_size == 0
    assert _sqlite_facts(path)[1] == "wal"
    assert not (tmp_path / ".store.db.locks").exists()


def test_reading_a_live_sqlite_store_never_checkpoints_it(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    with sessionlog.open_store(url) as store:
        store.create("s1", plain(3))
        with store.session("s1") as handle:
            handle.append(plain(50))
            before = _dir_listing(tmp_path)
            assert path.with_name("store.db-wal").stat().st_size > 0
            with SqlStore(url, read_only=True) as reader:
                assert reader.scan("s1").status is Status.OPEN
                assert len(list(reader.read("s1"))) == 54
            after = _dir_listing(tmp_path)
            assert after[path.name] == before[path.name]
            assert after["store.db-wal"] == before["store.db-wal"]


def test_read_only_sqlite_store_refuses_writes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with sessionlog.open_store(url) as store:
        store.create("s1")
    with SqlStore(url, read_only=True) as reader:
        for call in (lambda: reader.create("s2"), lambda: reader.append("s1", plain(1)),
                     lambda: reader.session("s1"), lambda: reader.delete("s1"),
                     lambda: reader.repair("s1"), lambda: reader.import_session("s3", [])):
            with pytest.raises(StoreClosed, match="read-only"):
                call()
        assert reader.repair("s1", dry_run=True).status == "clean"
    assert [r.seq for r in sessionlog.open_store(url).read("s1")] == [1]


def test_read_only_sqlite_store_needs_the_file(tmp_path: Path) -> None:
    with pytest.raises(sessionlog.IOFailure):
        SqlStore(f"sqlite:///{tmp_path / 'missing.db'}", read_only=True)
    assert list(tmp_path.iterdir()) == []


def test_read_only_store_ignores_the_writer_durability_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    sessionlog.open_store(url).close()
    with SqlStore(url + "?synchronous=OFF", read_only=True) as reader:
        assert reader.sessions() == []


def _pg_tables(base: str, schema: str) -> int:
    return db(base, "SELECT count(*) FROM information_schema.tables WHERE table_schema = :s", s=schema)[0][0]


def _pg_schemas(base: str, schema: str) -> int:
    return db(base, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = :s", s=schema)[0][0]


def test_scanning_a_fresh_postgres_schema_creates_nothing(pg_schema_url: str) -> None:
    base = postgres_base_url()
    schema = sa.make_url(pg_schema_url).query["schema"]
    assert (_pg_schemas(base, schema), _pg_tables(base, schema)) == (0, 0)
    assert cli.main(["scan", pg_schema_url, "--json"], io.StringIO()) == 4
    assert cli.main(["repair", pg_schema_url, "--dry-run"], io.StringIO()) == 4
    with pytest.raises(CorruptLog, match="not a sessionlog store"):
        SqlStore(pg_schema_url, read_only=True)
    assert (_pg_schemas(base, schema), _pg_tables(base, schema)) == (0, 0)
    # An existing schema without the tables is not a store either.
    db(base, f'CREATE SCHEMA "{schema}"')
    assert cli.main(["scan", pg_schema_url, "--json"], io.StringIO()) == 4
    assert _pg_tables(base, schema) == 0


def test_read_only_postgres_store_reads_and_refuses_writes(pg_schema_url: str) -> None:
    with sessionlog.open_store(pg_schema_url) as store:
        store.create("s1", plain(2))
    with SqlStore(pg_schema_url, read_only=True) as reader:
        assert reader.sessions() == ["s1"]
        assert reader.scan("s1").status is Status.CLEAN
        with pytest.raises(StoreClosed, match="read-only"):
            reader.append("s1", plain(1))
        with reader.engine.connect() as conn:  # the connection itself refuses writes
            assert conn.exec_driver_sql("SHOW default_transaction_read_only").scalar() == "on"
    out = io.StringIO()
    assert cli.main(["scan", pg_schema_url, "--json"], out) == 0
    assert '"status": "clean"' in out.getvalue()


def test_scan_of_a_read_only_postgres_role_works(pg_schema_url: str) -> None:
    base = postgres_base_url()
    schema = sa.make_url(pg_schema_url).query["schema"]
    with sessionlog.open_store(pg_schema_url) as store:
        store.create("s1", plain(2))
    role = f"sl_reader_{secrets.token_hex(4)}"
    db(base, f'CREATE ROLE "{role}" LOGIN')
    try:
        db(base, f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        db(base, f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        u = sa.make_url(pg_schema_url).set(username=role)
        reader_url = u.render_as_string(hide_password=False)
        with SqlStore(reader_url, read_only=True) as reader:
            assert reader.scan("s1").record_count == 3
        with pytest.raises(sessionlog.IOFailure):  # a writing store needs CREATE rights
            SqlStore(reader_url).close()
    finally:
        db(base, f'DROP OWNED BY "{role}"')
        db(base, f'DROP ROLE "{role}"')


# --- connections -------------------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_unreachable_postgres_is_io_failure_without_the_password(read_only: bool) -> None:
    pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    url = "postgresql+psycopg://postgres:hunter2@127.0.0.1:1/test"
    with pytest.raises(sessionlog.IOFailure) as info:
        SqlStore(url, read_only=read_only)
    message = str(info.value)
    assert "hunter2" not in message and "127.0.0.1:1" in message and "***" in message


# --- quarantine names --------------------------------------------------------------------


def test_unmarked_quarantine_names_are_parsed_exactly(store: SqlStore, sql_url: str) -> None:
    store.create("a", plain(2))
    store.create("a.x", plain(2))
    stamp = "20260101T000000Z-0123abcd"
    # A row of session "a" under a name that is not "a.<offset>.<kind>.<stamp>.quarantine"
    # (it reads as session "a.x"'s), and one that is exactly session "a"'s.
    for name, seq in ((f"a.x.3.mid-log.{stamp}.quarantine", 3), (f"a.5.corrupt.{stamp}.quarantine", 5)):
        db(sql_url, "INSERT INTO sessionlog_quarantine (name, seq, session_id, record, moved_at) "
                    "VALUES (:n, :s, 'a', :r, 0)", n=name, s=seq, r=b"lost")
    report = store.repair("a")
    markers = {r["quarantine"]: (r["offset"], r["reason"]) for r in report.appended}
    assert markers == {f"a.x.3.mid-log.{stamp}.quarantine": (0, "unknown"),
                       f"a.5.corrupt.{stamp}.quarantine": (5, "corrupt")}
    assert store.scan("a.x").unmarked_quarantines == []


def test_postgres_too_many_connections_is_io_failure_with_a_hint(pg_schema_url: str) -> None:
    base = postgres_base_url()
    with sessionlog.open_store(pg_schema_url) as store:
        store.create("s1")
    role = f"sl_limited_{secrets.token_hex(4)}"
    db(base, f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
    try:
        limited = sa.make_url(pg_schema_url).set(username=role).render_as_string(hide_password=False)
        with pytest.raises(sessionlog.IOFailure, match="allows no more connections"):
            SqlStore(limited, read_only=True)
    finally:
        db(base, f'DROP ROLE "{role}"')


# --- one set of record rules: what append and the JSONL scan accept, SQL accepts ---------


_WHITESPACE = st.text(alphabet=" \t\r", max_size=3)


def _spaced_line(seq: int, value: Any, ws: list[str]) -> bytes:
    """A record line for ``value`` with JSON whitespace (space, tab, bare CR) around tokens."""
    import json

    ws_iter = iter(ws * 50)
    body = json.dumps({"seq": seq, "ts": 1.5, "type": "note/x", "v": value},
                      separators=(next(ws_iter, "") + ",", ":" + next(ws_iter, "")), ensure_ascii=False)
    return (next(ws_iter, "") + body + next(ws_iter, "")).encode()


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300 if os.environ.get("SESSIONLOG_SLOW") else 80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_json_values, min_size=1, max_size=5), ws=st.lists(_WHITESPACE, min_size=1, max_size=6),
       junk=st.binary(max_size=12))
def test_rows_accept_exactly_what_the_jsonl_scan_accepts(values: list[Any], ws: list[str], junk: bytes) -> None:
    from sessionlog.scan import scan_bytes

    lines = [encode_record(header_event("s"), 1)]
    lines += [_spaced_line(seq, v, ws) for seq, v in enumerate(values, 2)]
    lines.append(junk)  # anything at all as the last line: both scanners must agree on it
    records, _, _ = scan_bytes(b"".join(line + b"\n" for line in lines), session_id="s")
    rows = RowScan(list(enumerate(lines, 1)), session_id="s", where="test")
    assert [r.raw for r in rows] == [r.raw for r in records]


@pytest.mark.parametrize("value", [b'{"a":\r1}', b'[1,\r\t2]', b'\r"x"\r'])
def test_raw_value_with_a_carriage_return_is_refused_and_nothing_written(store: SqlStore, sql_url: str,
                                                                         value: bytes) -> None:
    """Append never writes a CR (README: a Raw with a line break is refused); rows that
    hold one (written by another tool, or converted from JSONL) scan clean."""
    import msgspec

    store.create("s1")
    with pytest.raises(InvalidEvent):
        store.append("s1", [{"type": "note/x", "v": msgspec.Raw(value)}])
    assert len(rows_of(sql_url, "s1")) == 1
    assert store.append("s1", plain(1)) == 2
    assert store.scan("s1").status is Status.CLEAN


def test_raw_value_with_a_newline_is_refused_or_scans_clean(store: SqlStore) -> None:
    import msgspec

    store.create("s1")
    try:
        store.append("s1", [{"type": "note/x", "v": msgspec.Raw(b'{"a":\n1}')}])
    except InvalidEvent:
        assert store.scan("s1").last_seq == 1
    scan = store.scan("s1")
    assert scan.status is Status.CLEAN and scan.damage is None


def test_convert_jsonl_with_a_bare_carriage_return_to_sql(sql_url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    lines = [encode_record(header_event("s1"), 1), b'{"seq":2,"ts":1.0,"type":"note/x",\r"v":[1,\r2]}',
             b'{"seq":3,\t"ts":2.0,"type":"note/x","v":"a\\r"}\r']
    original = b"".join(line + b"\n" for line in lines)
    (src / "s1.jsonl").write_bytes(original)
    assert cli.main(["scan", f"jsonl:{src}"]) == 0
    assert cli.main(["convert", f"jsonl:{src}", sql_url]) == 0
    assert [r for _, r in rows_of(sql_url, "s1")] == lines
    back = tmp_path / "back"
    assert cli.main(["convert", sql_url, f"jsonl:{back}"]) == 0
    assert (back / "s1.jsonl").read_bytes() == original


def test_a_directory_named_as_the_database_is_said_to_be_one(tmp_path: Path) -> None:
    """A sqlite:/// URL naming a directory: opening a writing store (and convert into it)
    says so, not that the file has hard links (a directory's link count)."""
    with pytest.raises(sessionlog.IOFailure, match="is a directory, not a SQLite database file"):
        sessionlog.open_store(f"sqlite:///{tmp_path}")
    converted = subprocess.run(
        [sys.executable, "-m", "sessionlog", "convert", str(Path(__file__).parent.parent / "fixtures" / "healthy.jsonl"),
         f"sqlite:///{tmp_path}"], capture_output=True, text=True)
    assert converted.returncode == 4 and "is a directory" in converted.stderr and "hard links" not in converted.stderr


def test_a_call_on_a_session_that_does_not_exist_leaves_no_lock_file(tmp_path: Path) -> None:
    """A misspelled id is SessionNotFound from every call that would own the session, and
    SQLite's lock directory gets no lock file for it (lock files are never removed)."""
    store = sessionlog.open_store(f"sqlite:///{tmp_path / 'store.db'}")
    store.create("s1")
    before = sorted(p.name for p in tmp_path.rglob("*.lock"))
    for call in (lambda: store.append("typo", plain(1)), lambda: store.session("typo"),
                 lambda: store.repair("typo"), lambda: store.delete("typo")):
        with pytest.raises(SessionNotFound):
            call()
    assert sorted(p.name for p in tmp_path.rglob("*.lock")) == before
    assert store.append("s1", plain(1)) == 2
