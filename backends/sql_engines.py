"""What differs between SQLite and PostgreSQL under the SQL backend (docs/backends.md).

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
import re
import select
import sqlite3
import stat
import sys
import threading
import time
import urllib.parse
import weakref
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
    OwnershipLost,
    SequenceConflict,
    SessionLocked,
    SessionLogError,
    SessionNotFound,
    StoreClosed,
)
from sessionlog.durable import DIR_MODE, OS, FileLock, ensure_store_dir, lock_is_held, point_at_devnull

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

    token: Any
    """What an append checks on the server to prove the lock is still held (PostgreSQL:
    the lock connection's backend; None where the lock cannot be lost, SQLite's flock)."""

    epoch: int | None
    """The session's owner epoch this owner set when it took the session (PostgreSQL: the
    fencing token every append checks under the row lock; None on SQLite)."""

    def acquire(self, timeout: float) -> None:
        """Take it, waiting up to ``timeout`` seconds; SessionLocked if it stays held."""
        ...

    def release(self) -> None: ...

    def lost(self) -> None:
        """An append found on the server that the lock is gone: forget it (a new owner may
        take the session in this process too before this owner's handle is closed)."""
        ...

    def check(self) -> None:
        """Before an append, holding the database's write lock: OwnershipLost when the lock
        is known here to be gone (SQLite: its lock file was removed or replaced). PostgreSQL
        checks on the server, in the append's own statements, instead."""
        ...

    def creates_on_acquire(self) -> bool:
        """True when taking the lock would create something (SQLite's lock file, the
        first time); False when it leaves no trace (PostgreSQL's advisory lock)."""
        ...


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
    fenced = False
    """True when a new owner moves the session's owner epoch and every append checks it
    (PostgreSQL, whose ownership lock can be lost while its holder runs on)."""

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

    def ownership(self, session_id: str) -> Ownership:
        """The ownership lock of ``session_id`` (not yet taken)."""
        raise NotImplementedError

    def lock_row(self, conn: sa.Connection, session_id: str) -> int | None:
        """Inside a write transaction: lock the session's row; its owner epoch, or None
        when there is no row."""
        raise NotImplementedError

    def take(self, conn: sa.Connection, session_id: str, owner: Ownership) -> int | None:
        """Inside a write transaction, holding ``owner``'s lock (taken just before), on a
        fenced engine: move the session's owner epoch and return it (None: no such
        session), after checking under the row lock that the lock is still held."""
        raise NotImplementedError

    def append_once(
        self, cur: Any, session_id: str, lines: list[bytes], assumed_last: int,
        expect_seq: int | None, encode: Encode, owner: Ownership,
    ) -> int:
        """One append transaction on a pooled connection's driver cursor; returns the last
        seq.

        ``lines`` were encoded for ``assumed_last + 1``; when the tail turns out to be
        elsewhere they are re-encoded with ``encode``. Raises SequenceConflict when
        ``expect_seq`` is not the tail, SessionNotFound, AppendFailed when ``owner``'s lock
        was lost (nothing written) or (``outcome_unknown=True``) for an error during
        COMMIT, and the driver's own error for anything before COMMIT (the transaction was
        rolled back)."""
        raise NotImplementedError

    def append_group_once(self, cur: Any, batches: list[GroupBatch], owners: list[Ownership]) -> None:
        """One transaction (one commit) appending every batch of ``batches``, in order;
        sets each batch's ``last``. Nothing is committed unless every batch fits its
        session's tail. ``owners[i]`` owns batch i's session. Raises as
        :meth:`append_once`; an error caused by one batch (SequenceConflict,
        SessionNotFound, a lost lock's AppendFailed) carries its ``group_index``."""
        raise NotImplementedError

    def read_tail(self, cur: Any, session_id: str) -> int:
        """The session's last seq, read in its own short transaction."""
        raise NotImplementedError

    def prepare_pooled(self, dbapi: Any) -> None:
        """Set a pooled driver connection up for a driver-level write transaction."""

    def close(self) -> None:
        """Release what the engine kind holds beyond the pool (PostgreSQL: the lock
        connection, and with it every ownership lock of the store)."""


# --- SQLite ------------------------------------------------------------------------------


TAILS_PER_STATEMENT = 500
"""Sessions whose tails one statement of a SQLite group commit reads (its placeholders
stay under SQLite's historical limit of 999 variables)."""

_SYNC_LEVELS = {"0": 0, "OFF": 0, "1": 1, "NORMAL": 1, "2": 2, "FULL": 2, "3": 3, "EXTRA": 3}


def _lenient_text(data: bytes) -> str:
    """SQLite TEXT as a str: UTF-8, with any byte that is not kept as a lone surrogate."""
    return data.decode("utf-8", "surrogateescape")


_SQLITE_OPTIONS = frozenset({"synchronous", "journal_mode", "mode"})
"""The URL options an SQLite store reads (``mode=memory`` only to refuse it): any other
would be handed to the driver unread, or dropped with a warning."""


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
        unknown = sorted(set(query) - _SQLITE_OPTIONS)
        if unknown:
            from sessionlog import InvalidStoreUrl

            raise InvalidStoreUrl(f"{where}: unknown option {unknown[0]!r} (an SQLite store takes "
                                  f"{', '.join(sorted(_SQLITE_OPTIONS - {'mode'}))})")
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
        # The file itself, not a symlink to it (or through a symlinked directory): the lock
        # directory sits beside it, so every name of one database file finds the same lock
        # files, and it is created where SQLite will open it.
        self.path = os.path.realpath(os.path.abspath(database))
        if not read_only:
            _create_private(self.path)
            _refuse_hard_links(self.path, where)
        self.lock_dir = os.path.join(os.path.dirname(self.path), f".{os.path.basename(self.path)}.locks")
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
        # A group's tails: "WITH ids(sid) AS (VALUES (?),(?)...) SELECT ..." (the head, the
        # placeholders, the tail), each the same index lookup as sql_tail.
        self.sql_tails_head = "WITH ids(sid) AS (VALUES "
        self.sql_tails_tail = (
            f") SELECT sid, (SELECT seq FROM {records} WHERE session_id = ids.sid ORDER BY seq DESC LIMIT 1) FROM ids"
        )

    def _on_connect(self, dbapi: sqlite3.Connection, record: object) -> None:
        # The driver's implicit transactions are off: every transaction is an explicit
        # BEGIN (reads) or BEGIN IMMEDIATE (writes), so a write never upgrades a read lock.
        dbapi.isolation_level = None
        # TEXT that is not UTF-8 (a record column edited by hand) reads as a str the scan
        # reports as damage at its row, not as a driver error that stops every reader.
        dbapi.text_factory = _lenient_text
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

    def ownership(self, session_id: str) -> Ownership:
        return FileOwnership(self.lock_dir, self.lock_path(session_id))

    def lock_row(self, conn: sa.Connection, session_id: str) -> int | None:
        # BEGIN IMMEDIATE already holds the database's write lock.
        sessions = self.schema.sessions
        return conn.execute(sa.select(sessions.c.owner_epoch).where(sessions.c.session_id == session_id)).scalar()

    def append_once(
        self, cur: sqlite3.Cursor, session_id: str, lines: list[bytes], assumed_last: int,
        expect_seq: int | None, encode: Encode, owner: Ownership,
    ) -> int:
        cur.execute("BEGIN IMMEDIATE")
        try:
            # The flock cannot be lost while the handle's descriptor is open, but its file
            # can be removed (a cleaner of old files): then another process could take a
            # new one. Checked holding the database's write lock: no commit comes between.
            owner.check()
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

    def append_group_once(self, cur: sqlite3.Cursor, batches: list[GroupBatch], owners: list[Ownership]) -> None:
        cur.execute("BEGIN IMMEDIATE")
        try:
            for batch, owner in zip(batches, owners, strict=True):
                try:
                    owner.check()
                except OwnershipLost as exc:
                    raise blame(exc, batch.index) from None
            tails = self._group_tails(cur, batches)
            rows: list[tuple[str, int, bytes]] = []
            for batch in batches:
                first = tails[batch.session_id] + 1
                rows.extend(zip(repeat(batch.session_id), count(first), place_batch(batch, tails, self.where)))
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

    def _group_tails(self, cur: sqlite3.Cursor, batches: list[GroupBatch]) -> dict[str, int]:
        """The last seq of each session of a group, read inside its transaction in one
        statement per :data:`TAILS_PER_STATEMENT` sessions (not one per session).
        Raises SessionNotFound, blamed on the first batch of a session with no records."""
        first_batch: dict[str, GroupBatch] = {}
        for batch in batches:
            first_batch.setdefault(batch.session_id, batch)
        sids = list(first_batch)
        tails: dict[str, int] = {}
        for start in range(0, len(sids), TAILS_PER_STATEMENT):
            chunk = sids[start:start + TAILS_PER_STATEMENT]
            values = ",".join(["(?)"] * len(chunk))
            tails.update(cur.execute(self.sql_tails_head + values + self.sql_tails_tail, chunk).fetchall())
        for sid, batch in first_batch.items():
            if tails.get(sid) is None:
                raise blame(SessionNotFound(f"{self.where}: session {sid!r} was deleted"), batch.index)
        return tails

    def read_tail(self, cur: sqlite3.Cursor, session_id: str) -> int:
        row = cur.execute(self.sql_tail, (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(f"{self.where}: no such session {session_id!r}")
        return int(row[0])


def _refuse_hard_links(path: str, where: str) -> None:
    """A database file with a second name (a hard link) is refused for writing: SQLite
    names its WAL after the name it opened, so a writer through one name does not see
    what was committed through the other, and a checkpoint through one discards the
    other's commits, acknowledged appends included; nor would the lock directories of
    the two names be one."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise IOFailure(f"{path}: cannot stat the database: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise IOFailure(f"{where}: {path} is {what}, not a SQLite database file")
    links = st.st_nlink
    if links > 1:
        raise DurabilityRefused(
            f"{where}: the database file has {links} names (hard links); SQLite keeps a WAL per name, so "
            "commits through one name are lost to the other: refusing to write (copy the file instead of "
            "linking it)"
        )


def _create_private(path: str) -> None:
    """Create the database file 0600 (transcripts hold secrets) unless it exists; SQLite
    gives its -wal and -shm files the database file's permissions. Missing parent
    directories are created first (0700, durably)."""
    try:
        ensure_store_dir(OS, os.path.dirname(os.path.abspath(path)))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise IOFailure(f"{path}: cannot create the database: {exc.strerror or exc}") from exc
    os.close(fd)


class FileOwnership:
    """The file backends' ownership protocol for one SQLite session: an exclusive flock
    on ``<lock dir>/<id>.lock`` (created 0600, never unlinked)."""

    token = None
    epoch = None

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

    def lost(self) -> None:  # pragma: no cover - a flock held by an open descriptor is never lost
        pass

    def check(self) -> None:
        """OwnershipLost when the lock file was removed or replaced (see FileLock.check)."""
        self._lock.check()

    def creates_on_acquire(self) -> bool:
        return not os.path.lexists(self._lock.path)


# --- PostgreSQL --------------------------------------------------------------------------


POOL_SIZE = 8
"""PostgreSQL connections a store pools for appends, reads and one-shot calls (never more:
callers wait for one). With the lock connection, a store uses at most POOL_SIZE + 1
server connections however many sessions it has open."""


class PostgresKind(EngineKind):
    """PostgreSQL through psycopg 3: connections with ``synchronous_commit=off`` (or a
    server with ``fsync=off``) are refused; an append locks the session's row, reads the
    tail and inserts; ownership is a session-level advisory lock keyed by the schema and
    the session id, held on the store's lock connection (:class:`AdvisoryLocks`).

    That lock can be lost while its holder runs on (the lock connection ends), so it is
    fenced: a new owner, holding the lock, moves the session's ``owner_epoch`` (an UPDATE
    of its row, which waits for an append holding that row) before it reads the tail, and
    every append checks, under the row lock, that the epoch is still its owner's. An
    append of a former owner therefore commits before the new owner's open reads the tail
    (which then sees it), or not at all. Each append also checks that the lock connection
    is alive, so a lost lock fails the next append even when nobody took the session.

    ``namespace``: the schema named by ``?schema=``, or None: then the schema the tables
    are in is asked of the server (:meth:`resolve_namespace`), so that every spelling of
    one store keys its locks alike.

    ``read_only``: every connection runs ``default_transaction_read_only = on``, so the
    server refuses any write; the durability settings are not checked."""

    name = "postgresql"
    fenced = True

    def __init__(
        self, url: sa.URL, schema: Schema, *, where: str, namespace: str | None,
        engine_options: Mapping[str, Any], read_only: bool = False,
    ) -> None:
        self.schema = schema
        self.where = where
        self.namespace = namespace
        self.read_only = read_only
        # READ COMMITTED whatever the server's default: creating or migrating the tables
        # under the schema lock, taking a session, a repair and a delete must see what
        # committed before their lock was granted (an explicit REPEATABLE READ is what
        # a scan's snapshot asks for, per transaction).
        options: dict[str, Any] = {"pool_size": POOL_SIZE, "max_overflow": 0, "isolation_level": "READ COMMITTED"}
        options.update(engine_options)
        self.engine = sa.create_engine(url, **options)
        event.listen(self.engine, "connect", self._on_connect)
        event.listen(self.engine, "checkout", _ended_while_idle)
        self.locks = AdvisoryLocks(self.engine, where)
        self.use_schema(schema)

    def use_schema(self, schema: Schema) -> None:
        """Write every statement with ``schema``'s tables (qualified when it names its
        namespace)."""
        self.schema = schema
        self._prepare_sql("%s")
        records = schema.qualified(schema.records)
        sessions = schema.qualified(schema.sessions)
        # The session's row, locked: its owner epoch as of the lock (a row that another
        # transaction updated is read again once that one ends), and whether the backend
        # holding the owner's advisory lock is alive (the server drops the lock with it).
        self.sql_lock_row = (
            f"SELECT owner_epoch, EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s AND backend_start = %s) "
            f"FROM {sessions} WHERE session_id = %s FOR UPDATE"
        )
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
            f"SELECT session_id, owner_epoch FROM {sessions} WHERE session_id = ANY(%s) "
            "ORDER BY session_id FOR UPDATE"
        )
        self.sql_alive = (
            "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = ANY(%s)"
        )
        # Taking a session: the next owner epoch, and whether the lock connection (pid)
        # still holds the session's advisory lock (key as its two 32-bit halves).
        self.sql_take = (
            f"UPDATE {sessions} SET owner_epoch = owner_epoch + 1 WHERE session_id = :sid "
            "RETURNING owner_epoch, EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid = :pid AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1)"
        )
        self.sql_tails = (
            f"SELECT u.s, (SELECT max(seq) FROM {records} WHERE session_id = u.s) FROM unnest(%s::text[]) AS u(s)"
        )
        self.sql_insert_rows = (
            f"INSERT INTO {records} (session_id, seq, record) "
            f"SELECT * FROM unnest(%s::text[], %s::bigint[], %b::bytea[])"
        )

    def _on_connect(self, dbapi: Any, record: object) -> None:
        _SERVER_CONNECTIONS.add(dbapi)
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

    def take(self, conn: sa.Connection, session_id: str, owner: Ownership) -> int | None:
        # The UPDATE waits for an append holding the row; once it has the row, the lock is
        # checked where the server keeps it (pg_locks is read live, not from a snapshot):
        # if it is gone, another writer may hold it, and this one must write nothing.
        assert isinstance(owner, AdvisoryOwnership) and owner.token is not None
        key = owner.key
        row = conn.execute(sa.text(self.sql_take), {
            "sid": session_id, "pid": owner.token[0], "hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF,
        }).first()
        if row is None:
            return None
        if not row[1]:
            owner.lost()
            raise IOFailure(
                f"{self.where}: session {session_id!r}: the ownership lock was lost while the session was being "
                "taken (its lock connection ended); nothing was written: try again"
            )
        return int(row[0])

    def resolve_namespace(self, conn: sa.Connection) -> str | None:
        """Without ``?schema=``: the schema the server resolves the tables to (the
        search_path's), by which the locks are keyed and every later statement names the
        tables, so that a table of the same name that appears earlier on the search_path
        later is never written instead. Returns it (None when ``?schema=`` named one)."""
        if self.namespace is not None:
            return None
        found = conn.execute(sa.text(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(:t)"
        ), {"t": self.schema.sessions.name}).scalar()
        self.namespace = found or "public"
        return self.namespace

    def owned(self, session_id: str) -> bool:
        assert self.namespace is not None
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

    def ownership(self, session_id: str) -> Ownership:
        assert self.namespace is not None
        return AdvisoryOwnership(self.locks, advisory_key(self.namespace, session_id), f"{self.where} session {session_id!r}")

    def close(self) -> None:
        self.locks.close()

    def lock_row(self, conn: sa.Connection, session_id: str) -> int | None:
        sessions = self.schema.sessions
        stmt = sa.select(sessions.c.owner_epoch).where(sessions.c.session_id == session_id).with_for_update()
        return conn.execute(stmt).scalar()

    def append_once(
        self, cur: Any, session_id: str, lines: list[bytes], assumed_last: int,
        expect_seq: int | None, encode: Encode, owner: Ownership,
    ) -> int:
        dbapi = cur.connection
        try:
            # The row lock serializes appends to this session; the statements after it
            # see everything committed before it was granted.
            pid, started = owner.token
            cur.execute(self.sql_lock_row, (pid, started, session_id))
            row = cur.fetchone()
            if row is None:
                raise SessionNotFound(f"{self.where}: session {session_id!r} was deleted")
            if row[0] != owner.epoch:
                raise _taken_over(self.where, session_id, owner.epoch, row[0])
            if not row[1]:
                owner.lost()
                raise _ownership_lost(self.where, session_id)
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

    def append_group_once(self, cur: Any, batches: list[GroupBatch], owners: list[Ownership]) -> None:
        dbapi = cur.connection
        sids = sorted({b.session_id for b in batches})
        try:
            cur.execute(self.sql_lock_rows, (sids,))
            epochs = dict(cur.fetchall())
            cur.execute(self.sql_alive, (sorted({o.token[0] for o in owners}),))
            alive = set(cur.fetchall())
            for batch, owner in zip(batches, owners, strict=True):
                if batch.session_id not in epochs:
                    raise blame(
                        SessionNotFound(f"{self.where}: session {batch.session_id!r} was deleted"), batch.index
                    )
                if epochs[batch.session_id] != owner.epoch:
                    raise blame(
                        _taken_over(self.where, batch.session_id, owner.epoch, epochs[batch.session_id]), batch.index
                    )
                if tuple(owner.token) not in alive:
                    owner.lost()
                    raise blame(_ownership_lost(self.where, batch.session_id), batch.index)
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

    def read_tail(self, cur: Any, session_id: str) -> int:
        try:
            cur.execute(self.sql_tail, (session_id,))
            row = cur.fetchone()
        finally:
            _quiet(cur.connection.rollback)
        if row is None:
            raise SessionNotFound(f"{self.where}: no such session {session_id!r}")
        return int(row[0])


_SERVER_CONNECTIONS: weakref.WeakSet[Any] = weakref.WeakSet()
"""Every PostgreSQL connection this process made (pooled ones and lock connections)."""


def _detach_server_connections_in_child() -> None:
    """After ``fork``, in the child: its copies of the parent's PostgreSQL sockets now
    refer to /dev/null. A socket belongs to the open file, shared by both processes: were
    the child to keep its copy, a parent killed later would stay connected for as long as
    the child lives, and the server would keep its advisory locks (its sessions owned)
    and any transaction it had open (the session rows it had locked). The child never
    uses the parent's connections (its stores make new ones), and a connection object of
    the parent that is collected in the child says goodbye to /dev/null, not to the
    server on the parent's behalf."""
    sockets = []
    for conn in list(_SERVER_CONNECTIONS):
        try:
            sockets.append(conn.pgconn.socket)
        except Exception:  # noqa: BLE001 - closed already: nothing is shared
            continue
    point_at_devnull(sockets)
    _SERVER_CONNECTIONS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_detach_server_connections_in_child)


def _ended_while_idle(dbapi: Any, record: object, proxy: object) -> None:
    """Pool checkout of a PostgreSQL connection: one the server ended while it sat in the
    pool (a restart, a failover, ``idle_session_timeout``, ``pg_terminate_backend``) is
    replaced there, instead of failing the call that took it.

    The server says so before it closes the socket, so such a connection has bytes
    waiting (or an end of file) where an idle one has none: one poll of the socket, no
    round trip (``pool_pre_ping`` would add one to every append). A connection with a
    stray notice waiting is replaced too, which costs a connect and nothing else."""
    if dbapi.closed or getattr(dbapi, "broken", False):
        raise sa.exc.DisconnectionError("the connection is closed")
    try:
        poller = select.poll()
        poller.register(dbapi.pgconn.socket, select.POLLIN)
        waiting = poller.poll(0)
    except Exception as exc:  # no socket: the driver knows it is gone
        raise sa.exc.DisconnectionError(f"the connection is gone: {exc}") from exc
    if waiting:
        raise sa.exc.DisconnectionError("the server ended the connection while it was idle")


class AdvisoryLocks:
    """The ownership locks of one PostgreSQL store, held on ONE dedicated connection (the
    lock connection), however many sessions the store owns.

    PostgreSQL session-level advisory locks belong to the connection that took them and
    are re-entrant on it, so this process's own holders are tracked here too: a second
    owner of a held session in this process is refused as it is from any other. Each
    held lock costs one entry of the server's shared lock table (``max_locks_per_transaction``
    x ``max_connections`` entries in all). When the lock connection ends (killed, network
    gone), the server releases every lock on it; the next append of each of those handles
    sees that on the server and fails (:func:`_ownership_lost`), and new owners get a new
    lock connection. Waiting for a held lock polls (``pg_try_advisory_lock``), so one
    waiter never blocks the lock connection for the others.

    The lock connection turns the server's idle limits off for itself
    (``idle_session_timeout``, ``idle_in_transaction_session_timeout``): it is idle by
    design, and ending it would end ownership. A session held by a handle here whose
    lock connection is gone is free to be taken again at once, by this store too: an
    append that finds the connection dead forgets its locks (:meth:`forget`), and a
    take of a key held here first asks whether the lock connection still answers."""

    def __init__(self, engine: sa.Engine, where: str) -> None:
        self.engine = engine
        self.where = where
        self._mutex = threading.Lock()
        self._conn: Any = None  # the pool's detached connection proxy
        self._dbapi: Any = None  # its psycopg connection
        self._token: tuple[int, Any] | None = None
        self._held: dict[int, tuple[int, Any]] = {}  # key -> token of the connection holding it
        self._pid = os.getpid()
        self._closed = False
        self._orphans: list[Any] = []

    def try_acquire(self, key: int) -> tuple[int, Any] | None:
        """Take ``key`` unless someone (here or elsewhere) holds it; the token of the lock
        connection holding it, or None. IOFailure when no lock connection can be had."""
        with self._mutex:
            self._check_process()
            if key in self._held and not self._ping_failed():
                return None
            for attempt in (1, 2):
                token = self._connected()
                try:
                    with self._dbapi.cursor() as cur:
                        cur.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                        ok = cur.fetchone()[0]
                except Exception as exc:
                    self._drop()  # its locks are gone with it; handles holding them fail
                    if attempt == 2 or not _is_connection_error(exc):
                        raise IOFailure(f"{self.where}: taking a session lock failed: {driver_error(exc)}") from exc
                    continue
                if not ok:
                    return None
                self._held[key] = token
                return token
        return None  # pragma: no cover - the loop returns or raises

    def forget(self, token: tuple[int, Any]) -> None:
        """The server says the lock connection ``token`` is gone: so are its locks."""
        with self._mutex:
            if os.getpid() == self._pid and self._token == token:
                self._drop()
            else:
                self._held = {k: t for k, t in self._held.items() if t != token}

    def _ping_failed(self) -> bool:
        """Ask the lock connection a trivial question; when it cannot answer, it is dropped
        (with the locks the server released with it) and True is returned."""
        if self._conn is None:  # pragma: no cover - _held is emptied with the connection
            return True
        try:
            with self._dbapi.cursor() as cur:
                cur.execute("SELECT 1")
        except Exception:
            self._drop()
            return True
        return False

    def release(self, key: int, token: tuple[int, Any]) -> None:
        """Release ``key`` if the connection that took it (``token``) still holds it."""
        with self._mutex:
            if os.getpid() != self._pid or self._held.get(key) != token or self._token != token:
                return  # that connection is gone (the server released its locks) or not ours
            del self._held[key]
            try:
                with self._dbapi.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except Exception:
                # Ending the lock connection releases the lock on the server (and the others
                # on it: their handles fail on their next append).
                self._drop()

    def close(self) -> None:
        """End the lock connection: the server releases every lock of this store."""
        with self._mutex:
            self._closed = True
            if os.getpid() == self._pid:
                self._drop()

    def _check_process(self) -> None:
        if self._closed:
            raise StoreClosed(f"{self.where}: store is closed")
        if os.getpid() != self._pid:
            # A forked child must never use (or end) its parent's lock connection: keep a
            # reference so that collecting it does not end it either.
            self._orphans.append(self._conn)
            self._conn, self._token, self._held = None, None, {}
            self._pid = os.getpid()

    def _connected(self) -> tuple[int, Any]:
        if self._conn is None:
            try:
                conn = self.engine.raw_connection()
                dbapi = conn.driver_connection
                conn.detach()  # outside the pool: it lives as long as the locks on it
                dbapi.autocommit = True
                with dbapi.cursor() as cur:
                    # Idle by design: a server limit on idle sessions must not end it (and
                    # with it every lock it holds). set_config on the settings the server
                    # has, so an older server without one of them is not an error.
                    cur.execute(
                        "SELECT set_config(name, '0', false) FROM pg_settings "
                        "WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')"
                    )
                    cur.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
                    pid, started = cur.fetchone()
            except SessionLogError:
                raise
            except Exception as exc:
                raise IOFailure(
                    f"{self.where}: cannot open the lock connection: {driver_error(exc)}"
                    + _too_many_hint(exc)
                ) from exc
            self._conn, self._dbapi, self._token = conn, dbapi, (int(pid), started)
        assert self._token is not None
        return self._token

    def _drop(self) -> None:
        conn, token = self._conn, self._token
        self._conn, self._token = None, None
        self._held = {k: t for k, t in self._held.items() if t != token}
        if conn is not None:
            # Ended without the pool's reset: the connection is outside the pool, holds no
            # transaction (autocommit), and is often dead already (a rollback on it would
            # fail and be logged as an error).
            _quiet(conn.invalidate)


class AdvisoryOwnership:
    """A session's PostgreSQL advisory lock, held on the store's lock connection. The
    server drops it when that connection ends, so a killed writer never leaves its session
    owned; ``token`` names the backend holding it, for the appends' liveness check."""

    def __init__(self, locks: AdvisoryLocks, key: int, where: str) -> None:
        self.locks = locks
        self.key = key
        self.where = where
        self.token: tuple[int, Any] | None = None
        self.epoch: int | None = None

    def acquire(self, timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        delay = 0.002
        while True:
            token = self.locks.try_acquire(self.key)
            if token is not None:
                self.token = token
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise SessionLocked(f"{self.where}: another writer owns this session")
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    def release(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            self.locks.release(self.key, token)

    def lost(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            self.locks.forget(token)

    def check(self) -> None:  # pragma: no cover - PostgreSQL appends check on the server
        pass

    def creates_on_acquire(self) -> bool:
        return False


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


def _taken_over(where: str, session_id: str, mine: int | None, found: int) -> OwnershipLost:
    return OwnershipLost(
        f"{where}: session {session_id!r}: another writer took the session (its owner epoch is {found}, "
        f"this handle's is {mine}: this handle's ownership lock was lost); nothing was written: "
        "close this handle, then open the session again"
    )


def _ownership_lost(where: str, session_id: str) -> OwnershipLost:
    return OwnershipLost(
        f"{where}: session {session_id!r}: the ownership lock was lost (its lock connection ended, "
        "and the server released the lock); nothing was written: close this handle, then open the session again"
    )


_TOO_MANY = re.compile(r"too many (clients|connections)")
TOO_MANY_CONNECTIONS = "53300"
"""PostgreSQL's SQLSTATE when the server (or a role or database limit) allows no more connections."""


def _too_many_hint(exc: BaseException) -> str:
    cause = driver_error(exc)
    # psycopg reports a refused connection without its SQLSTATE: match the text too.
    if getattr(cause, "sqlstate", None) == TOO_MANY_CONNECTIONS or _TOO_MANY.search(str(cause)):
        return (f" (the server allows no more connections: a store uses at most {POOL_SIZE + 1}; "
                "close stores you do not need or raise max_connections)")
    return ""


def _is_connection_error(exc: BaseException) -> bool:
    """True when the driver says the connection itself is gone (not a statement error)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - PostgreSQL needs it
        return False
    cause = driver_error(exc)
    return isinstance(cause, psycopg.OperationalError) or bool(getattr(cause, "closed", False))
