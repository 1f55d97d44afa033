"""Group commit across sessions on the SQL backend (SqlStore.append_group), on a real
SQLite file and a real PostgreSQL server (skipped without SESSIONLOG_TEST_POSTGRES_URL)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from postgres import postgres_schema_url
from sessionlog.backends.sql import SqlStore

import sessionlog
from sessionlog import AppendFailed, InvalidEvent, SequenceConflict, SessionNotFound, Status, StoreClosed


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    yield from postgres_schema_url()


@pytest.fixture
def store(sql_url: str) -> Iterator[SqlStore]:
    with sessionlog.open_store(sql_url) as st_:
        assert isinstance(st_, SqlStore)
        yield st_


def db(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` through a connection of its own (what a person with a SQL shell sees)."""
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


def notes(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"type": "note/x", "tag": tag, "i": i} for i in range(n)]


def tags(store: SqlStore, sid: str) -> list[tuple[int, str, int]]:
    return [(r.seq, r["tag"], r["i"]) for r in store.read(sid, 1)]


def test_group_appends_each_session_with_its_own_seqs(store: SqlStore) -> None:
    for sid in ("a", "b", "c"):
        store.create(sid, notes(1, "first"))  # seq 1 header, seq 2
    with store.session("a") as a, store.session("b") as b, store.session("c") as c:
        lasts = store.append_group([(a, notes(3, "a1")), (b, notes(1, "b1")), (a, notes(2, "a2")), (c, [])])
        assert lasts == [5, 3, 7, 2]
        assert (a.last_seq, b.last_seq, c.last_seq) == (7, 3, 2)
        assert a.append(notes(1, "a3")) == 8  # the handle goes on from the group's seqs
        assert store.append_group([(b, notes(1, "b2"), 3), (c, notes(1, "c1"), 2)]) == [4, 3]
    assert tags(store, "a") == [(2, "first", 0), (3, "a1", 0), (4, "a1", 1), (5, "a1", 2),
                                (6, "a2", 0), (7, "a2", 1), (8, "a3", 0)]
    assert tags(store, "b") == [(2, "first", 0), (3, "b1", 0), (4, "b2", 0)]
    assert tags(store, "c") == [(2, "first", 0), (3, "c1", 0)]
    for sid in ("a", "b", "c"):
        assert store.scan(sid).status is Status.CLEAN
    assert store.append_group([]) == []


def test_postgres_group_is_one_transaction(pg_url: str) -> None:
    with sessionlog.open_store(pg_url) as store:
        handles = []
        for k in range(20):
            store.create(f"s{k}")
            handles.append(store.session(f"s{k}"))
        try:
            assert store.append_group([(h, notes(3, "g")) for h in handles]) == [4] * 20
        finally:
            for h in handles:
                h.close()
    # Every row the group wrote carries the id of the one transaction that inserted it.
    xids = db(pg_url, "SELECT DISTINCT xmin::text FROM sessionlog_records WHERE seq > 1")
    assert len(xids) == 1


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_schema_url()


def test_a_refused_batch_writes_nothing_and_names_itself(store: SqlStore, sql_url: str) -> None:
    for sid in ("a", "b", "c"):
        store.create(sid)
    before = db(sql_url, "SELECT count(*) FROM sessionlog_records")
    with store.session("a") as a, store.session("b") as b, store.session("c") as c:
        with pytest.raises(InvalidEvent) as bad:
            store.append_group([(a, notes(2, "x")), (b, notes(2, "x")), (c, [{"no": "type"}])])
        assert bad.value.group_index == 2
        with pytest.raises(SequenceConflict) as conflict:
            store.append_group([(a, notes(2, "x")), (b, notes(2, "x"), 7), (c, notes(1, "x"))])
        assert conflict.value.group_index == 1 and (conflict.value.expected, conflict.value.found) == (7, 1)
        with pytest.raises(InvalidEvent) as alien:
            store.append_group([(a, notes(1, "x")), ("c", notes(1, "x"))])  # type: ignore[list-item]
        assert alien.value.group_index == 1
        c.close()
        with pytest.raises(StoreClosed) as closed:
            store.append_group([(a, notes(1, "x")), (b, notes(1, "x")), (c, notes(1, "x"))])
        assert closed.value.group_index == 2
        assert db(sql_url, "SELECT count(*) FROM sessionlog_records") == before
        # The caller isolates the bad batch and appends the others again: they still work.
        assert store.append_group([(a, notes(2, "ok")), (b, notes(2, "ok"))]) == [3, 3]
    assert tags(store, "a") == [(2, "ok", 0), (3, "ok", 1)]
    assert tags(store, "c") == []


def test_deleted_session_in_a_group_is_session_not_found(store: SqlStore) -> None:
    store.create("a")
    store.create("b")
    with store.session("a") as a, store.session("b") as b:
        # A hand edit removes b's rows and its session row behind the owner's back.
        t = store.schema
        with store.engine.begin() as conn:
            conn.execute(t.records.delete().where(t.records.c.session_id == "b"))
            conn.execute(t.sessions.delete().where(t.sessions.c.session_id == "b"))
        with pytest.raises(SessionNotFound) as gone:
            store.append_group([(a, notes(1, "x")), (b, notes(1, "x"))])
        assert gone.value.group_index == 1
        assert store.append_group([(a, notes(1, "x"))]) == [2]


def test_postgres_commit_error_in_a_group_is_outcome_unknown(pg_url: str) -> None:
    schema = sa.make_url(pg_url).query["schema"]
    with sessionlog.open_store(pg_url) as store:
        store.create("a")
        store.create("b")
        db(pg_url, f"""
            CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
            CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON "{schema}".sessionlog_records
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse();
        """)
        with store.session("a") as a, store.session("b") as b:
            with pytest.raises(AppendFailed) as info:
                store.append_group([(a, notes(1, "x")), (b, notes(1, "x"))])
            assert info.value.outcome_unknown and "commit" in str(info.value)
            assert not hasattr(info.value, "group_index")
            for h in (a, b):  # the outcome is unknown: neither handle appends blindly again
                with pytest.raises(StoreClosed):
                    h.append(notes(1, "y"))
        db(pg_url, f'DROP TRIGGER refuse ON "{schema}".sessionlog_records')
        assert store.append("a", notes(1, "z")) == 2


def test_concurrent_groups_over_shared_handles_stay_contiguous(store: SqlStore) -> None:
    sids = [f"s{k}" for k in range(8)]
    for sid in sids:
        store.create(sid)
    handles = [store.session(sid) for sid in sids]
    errors: list[BaseException] = []
    rounds = 15

    def work(worker: int) -> None:
        rng = random.Random(worker)
        try:
            for r in range(rounds):
                chosen = rng.sample(handles, 4)
                store.append_group([(h, notes(2, f"{worker}.{r}")) for h in chosen])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in handles:
        h.close()
    assert not errors
    total = 0
    for sid in sids:
        records = list(store.read(sid))
        assert [r.seq for r in records] == list(range(1, len(records) + 1))
        body = records[1:]
        for k in range(0, len(body), 2):  # every batch whole and in place
            assert body[k]["tag"] == body[k + 1]["tag"] and (body[k]["i"], body[k + 1]["i"]) == (0, 1)
        total += len(body)
        assert store.scan(sid).status is Status.CLEAN
    assert total == 4 * rounds * 4 * 2


def test_a_group_over_many_sessions_keeps_each_session_contiguous(store: SqlStore) -> None:
    """More sessions in one group than one statement reads the tails of (SQLite: 500);
    the last session is deleted behind its owner's back, and the error names it."""
    sids = [f"s{i:04d}" for i in range(1203)]
    for sid in sids:
        store.create(sid)
    handles = [store.session(sid) for sid in sids]
    try:
        lasts = store.append_group([(h, notes(1 + i % 3, h.session_id)) for i, h in enumerate(handles)])
        assert lasts == [1 + 1 + i % 3 for i in range(len(sids))]
        for i in (0, 499, 500, 501, 1000, 1202):
            assert tags(store, sids[i]) == [(2 + k, sids[i], k) for k in range(1 + i % 3)]
        t = store.schema
        with store.engine.begin() as conn:
            conn.execute(t.records.delete().where(t.records.c.session_id == sids[-1]))
            conn.execute(t.sessions.delete().where(t.sessions.c.session_id == sids[-1]))
        with pytest.raises(SessionNotFound) as gone:
            store.append_group([(h, notes(1, "y")) for h in handles])
        assert gone.value.group_index == len(sids) - 1
        assert [store.scan(sid).last_seq for sid in sids[:3]] == [2, 3, 4]  # nothing of it was written
    finally:
        for h in handles:
            h.close()
