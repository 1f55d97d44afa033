"""What differs between SQLite and PostgreSQL under the SQL backend (DESIGN.md section 4).

For each database engine: how a connection is made durable (or refused), how a write
transaction begins, who owns a session (a ``flock`` beside the SQLite file, a PostgreSQL
session-level advisory lock), which errors are worth retrying, and the append hot path.

The hot path runs at driver level on the session handle's own connection: SQLAlchemy
Core costs more per transaction than the whole of a small append, so an append is a few
prepared driver statements (statement caches: sqlite3's per connection, psycopg's
server-side prepare) and one multi-row insert, never one statement per event.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import count, repeat
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import event

from sessionlog.contract import (
    AppendFailed,
    CorruptLog,
    DurabilityRefused,
    IOFailure,
    SequenceConflict,
    SessionLocked,
    SessionNotFound,
)
from sessionlog.durable import DIR_MODE, OS, FileLock, lock_is_held

from .sql_schema import Schema

Encode = Callable[[int], list[bytes]]
"""Encodes the batch being appended with seqs from the given first seq."""


@dataclass(slots=True)
class GroupBatch:
    """One session's batch in a group commit (:meth:`EngineKind.append_group_once`).

    ``lines`` were encoded for ``assumed_last + 1``; ``index`` is the batch's position in
    the caller's group (set as ``group_index`` on an error this batch caused); ``last``
    is the seq of its last record once the group is written."""

    session_id: str
    lines: list[bytes]
    assumed_last: int
    expect_seq: int | None
    encode: Encode
    index: int
    last: int = 0


def blame(exc: BaseException, index: int) -> BaseException:
    """Mark ``exc`` as caused by batch ``index`` of a group commit (``group_index``)."""
    exc.group_index = index  # type: ignore[attr-defined]
    return exc


def place_batch(batch: GroupBatch, tails: dict[str, int], where: str) -> list[bytes]:
    """Inside a group's transaction: check ``batch`` against its session's tail (read or
    advanced by an earlier batch of the group), give it its seqs and advance the tail.
    Returns its lines, re-encoded when the tail is not where they assumed. Raises
    SequenceConflict (blamed on the batch)."""
    last = tails[batch.session_id]
    if batch.expect_seq is not None and last != batch.expect_seq:
        raise blame(SequenceConflict(
            f"{where}: session {batch.session_id!r}: expected last seq {batch.expect_seq}, found {last}",
            expected=batch.expect_seq, found=last,
        ), batch.index)
    lines = batch.lines if last == batch.assumed_last else batch.encode(last + 1)
    batch.last = tails[batch.session_id] = last + len(lines)
    return lines


class Ownership(Protocol):
    """The lock that makes a process the single writer of one session."""

    def acquire(self, timeout: float) -> None:
        """Take it, waiting up to ``timeout`` seconds; SessionLocked if it stays held."""
        ...

    def release(self) -> None: ...


# --- errors ----------------------------------------------------------------------------


def driver_error(exc: BaseException) -> BaseException:
    """The driver's exception under a SQLAlchemy wrapper (or ``exc`` itself)."""
    orig = getattr(exc, "orig", None)
    return orig if isinstance(orig, BaseException) else exc


def sqlstate(exc: BaseException) -> str | None:
    """PostgreSQL's SQLSTATE of a (possibly wrapped) psycopg error."""
    return getattr(driver_error(exc), "sqlstate", None)


# SQLite result codes (sqlite3.h): primary codes and the extended constraint codes.
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_CONSTRAINT_PRIMARYKEY = 1555
_SQLITE_CONSTRAINT_UNIQUE = 2067

# PostgreSQL SQLSTATEs.
SERIALIZATION_FAILURE = "40001"
DEADLOCK_DETECTED = "40P01"
UNIQUE_VIOLATION = "23505"
LOCK_NOT_AVAILABLE = "55P03"


def advisory_key(namespace: str, session_id: str) -> int:
    """The signed 64-bit PostgreSQL advisory lock key of a session in a schema."""
    digest = hashlib.blake2b(f"sessionlog\0{namespace}\0{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


SCHEMA_LOCK_KEY = advisory_key("", "\0schema")
"""Held (transaction-scoped) while a PostgreSQL store creates its tables."""


class EngineKind:
    """Behaviour shared by both engines; subclasses fill in the differences."""

    name: str
    engine: sa.Engine
    schema: Schema

    # -- driver SQL used by the hot path and handle checks ------------------------------

    def _prepare_sql(self, p: str) -> None:
        records = self.schema.qualified(self.schema.records)
        self.sql_tail = f"SELECT seq FROM {records} WHERE session_id = {p} ORDER BY seq DESC LIMIT 1"

    def retryable(self, exc: BaseException) -> bool:
        """True for the errors an append retries: serialization, deadlock, busy, unique."""
        raise NotImplementedError

    def owned(self, session_id: str) -> bool:
        """True when some writer holds the session's ownership lock. Never writes."""
        raise NotImplementedError

    def ownership(self, session_id: str, conn: sa.Connection) -> Ownership:
        """The ownership lock of ``session_id``; on PostgreSQL it lives on ``conn``."""
        raise NotImplementedError

    def lock_row(self, conn: sa.Connection, session_id: str) -> bool:
        """Inside a write transaction: lock the session's row; False when there is none."""
        raise NotImplementedError

    def append_once(
        self, cur: Any, session_id: str, lines: list[bytes], assumed_last: int,
        expect_seq: int | None, encode: Encode,
    ) -> int:
        """One append transaction on the handle's driver cursor; returns the last seq.

        ``lines`` were encoded for ``assumed_last + 1``; when the tail turns out to be
        elsewhere they are re-encoded with ``encode``. Raises SequenceConflict when
        ``expect_seq`` is not the tail, SessionNotFound, AppendFailed(outcome_unknown=True)
        for an error during COMMIT, and the driver's own error for anything before COMMIT
        (the transaction was rolled back)."""
        raise NotImplementedError

    def append_group_once(self, cur: Any, batches: list[GroupBatch]) -> None:
        """One transaction (one commit) appending every batch of ``batches``, in order;
        sets each batch's ``last``. Nothing is committed unless every batch fits its
        session's tail. Raises as :meth:`append_once`; an error caused by one batch
        (SequenceConflict, SessionNotFound) carries its ``group_index``."""
        raise NotImplementedError

    def read_tail(self, cur: Any, session_id: str) -> int:
        """The session's last seq, read in its own short transaction."""
        raise NotImplementedError

    def prepare_pooled(self, dbapi: Any) -> None:
        """Set a pooled driver connection up for a driver-level write transaction."""

    def prepare_handle(self, dbapi: Any) -> tuple[Any, Callable[[], None]]:
        """Set a handle's driver connection up for the hot path: the cursor its appends
        run on, and the undo for when the handle closes."""
        cur = dbapi.cursor()
        return cur, cur.close


# --- SQLite ------------------------------------------------------------------------------


_SYNC_LEVELS = {"0": 0, "OFF": 0, "1": 1, "NORMAL": 1, "2": 2, "FULL": 2, "3": 3, "EXTRA": 3}


class SqliteKind(EngineKind):
    """SQLite: WAL, ``synchronous=FULL`` and a busy timeout on every connection; writes in
    ``BEGIN IMMEDIATE``; ownership is the ``flock`` protocol on a lock file per session in
    a ``.<db file>.locks/`` directory beside the database.

    ``read_only``: the file must exist and is opened ``mode=ro`` (plus ``query_only``);
    no file is created and no PRAGMA that persists in the database runs (the journal mode
    stays whatever it is); the durability settings are not checked, since nothing is
    committed."""

    name = "sqlite"

    def __init__(
        self, url: sa.URL, schema: Schema, *, where: str, busy_timeout: float, synchronous: str,
        engine_options: Mapping[str, Any], read_only: bool = False,
    ) -> None:
        self.schema = schema
        self.where = where
        self.read_only = read_only
        query = dict(url.query)
        sync = str(query.pop("synchronous", synchronous)).upper()
        journal = str(query.pop("journal_mode", "WAL")).upper()
        level = _SYNC_LEVELS.get(sync)
        database = url.database
        in_memory = not database or database == ":memory:" or query.get("mode") == "memory"
        if read_only:
            if in_memory:
                raise CorruptLog(f"{where}: not a sessionlog store (a new in-memory database is empty)", path=where)
        else:
            if level is None or level < 2:
                raise DurabilityRefused(
                    f"{where}: synchronous={sync} would lose acknowledged appends on power loss; "
                    "the SQL backend runs SQLite with synchronous=FULL (or EXTRA)"
                )
            if journal != "WAL":
                raise DurabilityRefused(
                    f"{where}: journal_mode={journal} is not supported; the SQL backend uses WAL"
                )
            if in_memory:
                raise DurabilityRefused(
                    f"{where}: an in-memory SQLite database is not durable; use a file "
                    "(sqlite:///FILE) or the memory: backend"
                )
        assert database is not None
        self.path = os.path.abspath(database)
        self.lock_dir = os.path.join(os.path.dirname(self.path), f".{os.path.basename(self.path)}.locks")
        if not read_only:
            _create_private(self.path)
        self._sync = "EXTRA" if level == 3 else "FULL"
        self._busy_ms = max(0, int(busy_timeout * 1000))
        options: dict[str, Any] = {"pool_size": 8, "max_overflow": -1}
        options.update(engine_options)
        connect_args = dict(options.pop("connect_args", {}))
        connect_args.setdefault("check_same_thread", False)
        connect_args.setdefault("timeout", busy_timeout)
        if read_only:
            # mode=ro: SQLite neither creates the file nor writes to it. A reader of a WAL
            # database still gets the -wal/-shm files SQLite needs to read it, but never
            # checkpoints into the database or truncates the WAL.
            uri = f"file:{urllib.parse.quote(self.path)}?mode=ro"
            connect_args.pop("uri", None)
            options["creator"] = lambda: sqlite3.connect(uri, uri=True, **connect_args)
            self.engine = sa.create_engine(url.set(query=query), **options)
        else:
            self.engine = sa.create_engine(url.set(query=query), connect_args=connect_args, **options)
        event.listen(self.engine, "connect", self._on_connect)
        event.listen(self.engine, "begin", self._on_begin)
        self._prepare_sql("?")
        records = schema.qualified(schema.records)
        self.sql_insert = f"INSERT INTO {records} (session_id, seq, record) VALUES (?, ?, ?)"

    def _on_connect(self, dbapi: sqlite3.Connection, record: object) -> None:
        # The driver's implicit transactions are off: every transaction is an explicit
        # BEGIN (reads) or BEGIN IMMEDIATE (writes), so a write never upgrades a read lock.
        dbapi.isolation_level = None
        dbapi.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
        if self.read_only:
            # Connection-level only: the database file is not touched.
            dbapi.execute("PRAGMA query_only = ON")
            return
        mode = dbapi.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        # FULL in WAL mode: the WAL is synced at every commit, so a commit that returned
        # survives power loss.
        dbapi.execute(f"PRAGMA synchronous = {self._sync}")
        if sys.platform == "darwin":  # pragma: no cover - fsync is not a barrier on macOS
            dbapi.execute("PRAGMA fullfsync = ON")
            dbapi.execute("PRAGMA checkpoint_fullfsync = ON")
        level = dbapi.execute("PRAGMA synchronous").fetchone()[0]
        if str(mode).lower() != "wal" or level < 2:
            dbapi.close()
            raise DurabilityRefused(
                f"{self.where}: the connection runs journal_mode={mode}, synchronous={level}; "
                "refusing: appends would not be durable at commit"
            )

    @staticmethod
    def _on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get("sessionlog_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    def retryable(self, exc: BaseException) -> bool:
        code = getattr(driver_error(exc), "sqlite_errorcode", None)
        if code is None:
            return False
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED) or code in (
            _SQLITE_CONSTRAINT_PRIMARYKEY, _SQLITE_CONSTRAINT_UNIQUE,
        )

    def lock_path(self, session_id: str) -> str:
        return os.path.join(self.lock_dir, f"{session_id}.lock")

    def owned(self, session_id: str) -> bool:
        try:
            return lock_is_held(OS, self.lock_path(session_id))
        except OSError as exc:
            raise IOFailure(f"{self.lock_path(session_id)}: cannot check the lock: {exc.strerror or exc}") from exc

    def ownership(self, session_id: str, conn: sa.Connection) -> Ownership:
        return FileOwnership(self.lock_dir, self.lock_path(session_id))

    def lock_row(self, conn: sa.Connection, session_id: str) -> bool:
        # BEGIN IMMEDIATE already holds the database's write lock.
        sessions = self.schema.sessions
        return conn.execute(sa.select(sessions.c.session_id).where(sessions.c.session_id == session_id)).first() is not None

    def append_once(
        self, cur: sqlite3.Cursor, session_id: str, lines: list[bytes], assumed_last: int,
        expect_seq: int | None, encode: Encode,
    ) -> int:
        cur.execute("BEGIN IMMEDIATE")
        try:
            row = cur.execute(self.sql_tail, (session_id,)).fetchone()
            if row is None:
                raise SessionNotFound(f"{self.where}: session {session_id!r} was deleted")
            last = row[0]
            if expect_seq is not None and last != expect_seq:
                raise SequenceConflict(
                    f"{self.where}: session {session_id!r}: expected last seq {expect_seq}, found {last}",
                    expected=expect_seq, found=last,
                )
            if last != assumed_last:
                lines = encode(last + 1)
            if len(lines) == 1:
                cur.execute(self.sql_insert, (session_id, last + 1, lines[0]))
            else:
                cur.executemany(self.sql_insert, zip(repeat(session_id), count(last + 1), lines))
        except BaseException:
            _quiet(cur.connection.rollback)
            raise
        try:
            # After this returns the batch is in the synced WAL: it survives power loss.
            cur.execute("COMMIT")
        except BaseException as exc:
            _quiet(cur.connection.rollback)
            raise _commit_failed(self.where, session_id, exc) from exc
        return last + len(lines)

    def append_group_once(self, cur: sqlite3.Cursor, batches: list[GroupBatch]) -> None:
        cur.execute("BEGIN IMMEDIATE")
        try:
            tails: dict[str, int] = {}
            rows: list[tuple[str, int, bytes]] = []
            for batch in batches:
                sid = batch.session_id
                if sid not in tails:
                    row = cur.execute(self.sql_tail, (sid,)).fetchone()
                    if row is None:
                        raise blame(SessionNotFound(f"{self.where}: session {sid!r} was deleted"), batch.index)
                    tails[sid] = row[0]
                first = tails[sid] + 1
                rows.extend(zip(repeat(sid), count(first), place_batch(batch, tails, self.where)))
            cur.executemany(self.sql_insert, rows)
        except BaseException:
            _quiet(cur.connection.rollback)
            raise
        try:
            # After this returns every batch of the group is in the synced WAL.
            cur.execute("COMMIT")
        except BaseException as exc:
            _quiet(cur.connection.rollback)
            raise _group_commit_failed(self.where, batches, exc) from exc

    def read_tail(self, cur: sqlite3.Cursor, session_id: str) -> int:
        row = cur.execute(self.sql_tail, (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(f"{self.where}: no such session {session_id!r}")
        return int(row[0])


def _create_private(path: str) -> None:
    """Create the database file 0600 (transcripts hold secrets) unless it exists; SQLite
    gives its -wal and -shm files the database file's permissions."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise IOFailure(f"{path}: cannot create the database: {exc.strerror or exc}") from exc
    os.close(fd)


class FileOwnership:
    """The file backends' ownership protocol for one SQLite session: an exclusive flock
    on ``<lock dir>/<id>.lock`` (created 0600, never unlinked)."""

    def __init__(self, lock_dir: str, path: str) -> None:
        self.lock_dir = lock_dir
        self._lock = FileLock(OS, path)

    def acquire(self, timeout: float) -> None:
        try:
            try:
                os.mkdir(self.lock_dir, DIR_MODE)
            except FileExistsError:
                pass
            self._lock.acquire(timeout)
        except OSError as exc:
            raise IOFailure(f"{self._lock.path}: taking the lock failed: {exc.strerror or exc}") from exc

    def release(self) -> None:
        self._lock.release()


# --- PostgreSQL --------------------------------------------------------------------------


class PostgresKind(EngineKind):
    """PostgreSQL through psycopg 3: connections with ``synchronous_commit=off`` (or a
    server with ``fsync=off``) are refused; an append locks the session's row, reads the
    tail and inserts; ownership is a session-level advisory lock keyed by the session id.

    ``read_only``: every connection runs ``default_transaction_read_only = on``, so the
    server refuses any write; the durability settings are not checked."""

    name = "postgresql"

    def __init__(
        self, url: sa.URL, schema: Schema, *, where: str, namespace: str, engine_options: Mapping[str, Any],
        read_only: bool = False,
    ) -> None:
        self.schema = schema
        self.where = where
        self.namespace = namespace
        self.read_only = read_only
        options: dict[str, Any] = {"pool_size": 5, "max_overflow": -1}
        options.update(engine_options)
        self.engine = sa.create_engine(url, **options)
        event.listen(self.engine, "connect", self._on_connect)
        self._prepare_sql("%s")
        records = schema.qualified(schema.records)
        sessions = schema.qualified(schema.sessions)
        self.sql_lock_row = f"SELECT 1 FROM {sessions} WHERE session_id = %s FOR UPDATE"
        # One statement, one round trip for the whole batch; it inserts nothing unless the
        # tail is still where the rows' seqs (and the bytes inside them) assume it is.
        self.sql_insert_at = (
            f"INSERT INTO {records} (session_id, seq, record) "
            f"SELECT %s, u.s, u.r FROM unnest(%s::bigint[], %b::bytea[]) AS u(s, r) "
            f"WHERE (SELECT max(seq) FROM {records} WHERE session_id = %s) = %s"
        )
        # A group commit: lock the sessions' rows in one order (no deadlock between two
        # groups), then read their tails in a statement that sees what committed before.
        self.sql_lock_rows = (
            f"SELECT session_id FROM {sessions} WHERE session_id = ANY(%s) ORDER BY session_id FOR UPDATE"
        )
        self.sql_tails = (
            f"SELECT u.s, (SELECT max(seq) FROM {records} WHERE session_id = u.s) FROM unnest(%s::text[]) AS u(s)"
        )
        self.sql_insert_rows = (
            f"INSERT INTO {records} (session_id, seq, record) "
            f"SELECT * FROM unnest(%s::text[], %s::bigint[], %b::bytea[])"
        )

    def _on_connect(self, dbapi: Any, record: object) -> None:
        if self.read_only:
            with dbapi.cursor() as cur:
                cur.execute("SET default_transaction_read_only = on")
            dbapi.commit()  # a SET inside a rolled-back transaction would not stick
            return
        with dbapi.cursor() as cur:
            cur.execute("SELECT current_setting('synchronous_commit'), current_setting('fsync')")
            sync_commit, fsync = cur.fetchone()
        dbapi.rollback()
        if sync_commit == "off" or fsync == "off":
            dbapi.close()
            raise DurabilityRefused(
                f"{self.where}: the connection runs synchronous_commit={sync_commit}, fsync={fsync}; "
                "refusing: a commit would return before the batch is durable"
            )

    def retryable(self, exc: BaseException) -> bool:
        return sqlstate(exc) in (SERIALIZATION_FAILURE, DEADLOCK_DETECTED, UNIQUE_VIOLATION)

    def owned(self, session_id: str) -> bool:
        key = advisory_key(self.namespace, session_id)
        with self.engine.connect() as conn:
            return bool(conn.execute(
                sa.text(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
                    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1)"
                ),
                {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
            ).scalar())

    def ownership(self, session_id: str, conn: sa.Connection) -> Ownership:
        return AdvisoryOwnership(conn, advisory_key(self.namespace, session_id), f"{self.where} session {session_id!r}")

    def lock_row(self, conn: sa.Connection, session_id: str) -> bool:
        sessions = self.schema.sessions
        stmt = sa.select(sessions.c.session_id).where(sessions.c.session_id == session_id).with_for_update()
        return conn.execute(stmt).first() is not None

    def append_once(
        self, cur: Any, session_id: str, lines: list[bytes], assumed_last: int,
        expect_seq: int | None, encode: Encode,
    ) -> int:
        dbapi = cur.connection
        try:
            # The row lock serializes appends to this session; the statements after it
            # see everything committed before it was granted.
            cur.execute(self.sql_lock_row, (session_id,))
            if cur.fetchone() is None:
                raise SessionNotFound(f"{self.where}: session {session_id!r} was deleted")
            last = assumed_last if expect_seq is None else expect_seq
            if last != assumed_last:
                lines = encode(last + 1)
            n = len(lines)
            cur.execute(self.sql_insert_at, (session_id, list(range(last + 1, last + 1 + n)), lines, session_id, last))
            if cur.rowcount != n:
                cur.execute(self.sql_tail, (session_id,))
                row = cur.fetchone()
                found = int(row[0]) if row else 0
                if expect_seq is not None:
                    raise SequenceConflict(
                        f"{self.where}: session {session_id!r}: expected last seq {expect_seq}, found {found}",
                        expected=expect_seq, found=found,
                    )
                last = found
                lines = encode(last + 1)
                cur.execute(
                    self.sql_insert_at, (session_id, list(range(last + 1, last + 1 + n)), lines, session_id, last)
                )
                if cur.rowcount != n:  # pragma: no cover - the row lock excludes this
                    raise AppendFailed(f"{self.where}: session {session_id!r}: the tail moved under the row lock")
        except BaseException:
            _quiet(dbapi.rollback)
            raise
        try:
            # After this returns the batch is in the synced WAL of the server.
            dbapi.commit()
        except BaseException as exc:
            _quiet(dbapi.rollback)
            raise _commit_failed(self.where, session_id, exc) from exc
        return last + n

    def append_group_once(self, cur: Any, batches: list[GroupBatch]) -> None:
        dbapi = cur.connection
        sids = sorted({b.session_id for b in batches})
        try:
            cur.execute(self.sql_lock_rows, (sids,))
            locked = {row[0] for row in cur.fetchall()}
            for batch in batches:
                if batch.session_id not in locked:
                    raise blame(
                        SessionNotFound(f"{self.where}: session {batch.session_id!r} was deleted"), batch.index
                    )
            cur.execute(self.sql_tails, (sids,))
            tails = {sid: int(last or 0) for sid, last in cur.fetchall()}
            col_sid: list[str] = []
            col_seq: list[int] = []
            col_rec: list[bytes] = []
            for batch in batches:
                first = tails[batch.session_id] + 1
                lines = place_batch(batch, tails, self.where)
                col_sid.extend(repeat(batch.session_id, len(lines)))
                col_seq.extend(range(first, first + len(lines)))
                col_rec.extend(lines)
            if col_rec:
                cur.execute(self.sql_insert_rows, (col_sid, col_seq, col_rec))
        except BaseException:
            _quiet(dbapi.rollback)
            raise
        try:
            # After this returns every batch of the group is in the synced WAL of the server.
            dbapi.commit()
        except BaseException as exc:
            _quiet(dbapi.rollback)
            raise _group_commit_failed(self.where, batches, exc) from exc

    def prepare_pooled(self, dbapi: Any) -> None:
        # As for a handle: each statement sees what committed before it.
        import psycopg

        if dbapi.isolation_level != psycopg.IsolationLevel.READ_COMMITTED:
            dbapi.rollback()
            dbapi.isolation_level = psycopg.IsolationLevel.READ_COMMITTED

    def prepare_handle(self, dbapi: Any) -> tuple[Any, Callable[[], None]]:
        # The append protocol needs each statement to see what committed before it (the
        # tail read after the row lock was granted): READ COMMITTED, whatever the
        # server's or the URL's default isolation is.
        import psycopg

        before = dbapi.isolation_level
        dbapi.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        cur = dbapi.cursor()

        def restore() -> None:
            _quiet(cur.close)
            _quiet(dbapi.rollback)
            dbapi.isolation_level = before

        return cur, restore

    def read_tail(self, cur: Any, session_id: str) -> int:
        try:
            cur.execute(self.sql_tail, (session_id,))
            row = cur.fetchone()
        finally:
            _quiet(cur.connection.rollback)
        if row is None:
            raise SessionNotFound(f"{self.where}: no such session {session_id!r}")
        return int(row[0])


class AdvisoryOwnership:
    """A PostgreSQL session-level advisory lock held on one connection. The server drops
    it when the connection ends, so a killed writer never leaves its session owned."""

    def __init__(self, conn: sa.Connection, key: int, where: str) -> None:
        self.conn = conn
        self.key = key
        self.where = where
        self.held = False

    def acquire(self, timeout: float) -> None:
        conn = self.conn
        try:
            if timeout <= 0:
                ok = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
                conn.commit()
                if not ok:
                    raise SessionLocked(f"{self.where}: another writer owns this session")
            else:
                # Wait in the server's lock queue (woken on release), bounded by lock_timeout.
                conn.execute(sa.text("SELECT set_config('lock_timeout', :t, true)"), {"t": f"{max(1, int(timeout * 1000))}ms"})
                conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": self.key})
                conn.commit()
        except sa.exc.DBAPIError as exc:
            _quiet(conn.rollback)
            if sqlstate(exc) == LOCK_NOT_AVAILABLE:
                raise SessionLocked(f"{self.where}: another writer owns this session") from None
            raise IOFailure(f"{self.where}: taking the session lock failed: {driver_error(exc)}") from exc
        self.held = True

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            self.conn.rollback()
            self.conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
            self.conn.commit()
        except Exception:
            # Closing the connection releases the lock on the server.
            _quiet(self.conn.invalidate)


# --- shared ------------------------------------------------------------------------------


def _quiet(fn: Callable[[], object]) -> None:
    """Run a cleanup step whose own failure must not mask the error being handled."""
    try:
        fn()
    except Exception:
        pass


def _commit_failed(where: str, session_id: str, exc: BaseException) -> AppendFailed:
    return AppendFailed(
        f"{where}: session {session_id!r}: the commit failed ({driver_error(exc)!r}); the batch may "
        "or may not be durable: read the session's tail before appending it again",
        outcome_unknown=True,
    )


def _group_commit_failed(where: str, batches: list[GroupBatch], exc: BaseException) -> AppendFailed:
    sids = sorted({b.session_id for b in batches})
    shown = ", ".join(map(repr, sids[:5])) + (f" and {len(sids) - 5} more" if len(sids) > 5 else "")
    return AppendFailed(
        f"{where}: the commit of a group of {len(batches)} batches (sessions {shown}) failed "
        f"({driver_error(exc)!r}); each batch may or may not be durable: read the sessions' tails "
        "before appending them again",
        outcome_unknown=True,
    )
