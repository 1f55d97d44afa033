"""The SQL backend (SQLAlchemy 2 Core): SQLite by default, PostgreSQL for fleets.

URLs: ``sqlite:///FILE`` and ``postgresql+psycopg://USER@HOST/DB`` (``?schema=NAME`` puts
the tables in a PostgreSQL schema, created on first use by a writing store). Many sessions
live in one database; each record is one row holding its exact bytes, so ``convert``
between a file backend and SQL is byte-identical (tables in
:mod:`sessionlog.backends.sql_schema`).

Reading without writing: ``SqlStore(url, read_only=True)`` (what ``scan``, ``show``,
``repair --dry-run`` and ``convert``'s source open, through
``sessionlog.targets.open_source``) never writes to the database: it creates no table,
schema, file or lock directory, runs no PRAGMA that persists (an SQLite file keeps its
journal mode), opens SQLite ``mode=ro`` and runs PostgreSQL connections with
``default_transaction_read_only = on``, so a role with only SELECT rights can scan. A
database without the sessionlog tables is CorruptLog ("not a sessionlog store"); the
writing methods raise StoreClosed. SQLite gives every reader of a WAL database its
``-wal``/``-shm`` files (an empty WAL and a rebuildable index when the writer had closed
them); the database file's bytes stay as they were: a read-only connection never
checkpoints. A writing store (the default) creates the tables when they are missing.

Connections: a session handle holds its ownership lock, not a connection; each append
(and each read, scan or one-shot call) borrows one from the store's pool for one
transaction. On PostgreSQL the pool is bounded (``POOL_SIZE`` = 8 connections; callers
wait for a free one) and every ownership (advisory) lock of the store lives on ONE more
connection, the lock connection: a store uses at most 9 server connections however many
sessions it has open. Each owned session takes one entry of the server's shared lock
table (``max_locks_per_transaction`` x ``max_connections`` entries in all, 6,400 by
default): raise ``max_locks_per_transaction`` for tens of thousands of open sessions per
server. If the lock connection ends, the server releases its locks; the next append of
each affected handle sees that (every append checks, in its transaction, that the lock
connection is alive) and fails with AppendFailed, writing nothing. On SQLite the lock is a
``flock`` (one descriptor per open handle) and the pool grows as threads need it. A
connection that cannot be made (server down, too many clients, bad credentials) is
IOFailure naming the URL with its password hidden.

Guarantees (docs/backends.md):

- An append is one transaction: lock the session (SQLite ``BEGIN IMMEDIATE``, PostgreSQL
  ``SELECT ... FOR UPDATE`` on its row), read the tail, check ``expect_seq``, insert every
  row of the batch in one statement, commit. A batch is whole or absent after a crash
  (``atomic_batches = True``). Serialization, deadlock, busy and unique-violation errors
  are retried inside the store; an error during COMMIT is ``AppendFailed`` with
  ``outcome_unknown=True`` and is never retried.
- Group commit across sessions: :meth:`SqlStore.append_group` appends batches of several
  owned sessions in one transaction (one commit, one WAL sync), all or nothing; an error
  caused by one batch names it (``group_index``).
- Connections that would weaken durability are refused (:class:`DurabilityRefused`).
- A writer owns a session through ``store.session()``: on PostgreSQL a session-level
  advisory lock keyed by the schema and the session id (on the store's lock connection),
  fenced by the session row's ``owner_epoch`` (a new owner moves it before reading the
  tail; an append commits only under its owner's epoch: see
  :class:`~sessionlog.backends.sql_engines.PostgresKind`); on SQLite the file backends'
  ``flock`` on ``.<db file>.locks/<id>.lock`` beside the database file (symlinks
  resolved). An owned session scans as ``open`` and ``repair`` refuses it (SessionLocked).
- ``scan`` validates every stored record as the file backends do (envelope, one line,
  contiguity, header). Damage positions are in row terms: ``Damage.offset`` and
  ``ScanResult.stable_offset`` are the number of rows in the valid prefix (the 0-based
  position of the first bad row, which is also the prefix's last seq), ``Damage.length``
  is the number of bytes stored in the rows after it. An undecodable row followed by
  rows that decode is ``mid-log``; undecodable rows at the end are ``corrupt``; a row
  whose seq is not the next one (a gap, or a seq column that disagrees with its record)
  is ``seq-break``. Opening a session for append (``session()``, a one-shot ``append``)
  checks the header, the last row and the row count: a damaged last row or a gap is
  CorruptLog there; an undecodable row in the middle is found by ``scan`` (as on the file
  backends, which validate only the tail when opening).
- ``repair`` writes in one transaction, conditional on the rows it scanned: rows after a
  break move to ``sessionlog_quarantine`` (with ``force``; never deleted), then the
  ``log/truncated`` marker, synthetic results and closers are appended.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from sessionlog.contract import (
    AppendFailed,
    CorruptLog,
    Damage,
    Failure,
    ImportCheck,
    InvalidEvent,
    InvalidSessionId,
    IOFailure,
    OwnershipLost,
    RepairReport,
    ScanResult,
    SequenceConflict,
    SessionExists,
    SessionLogError,
    SessionNotFound,
    StoreClosed,
    classify_damage,
    events_list,
    read_start,
    repair_reason,
    synthetic_lines,
)
from sessionlog.durable import parse_quarantine_name, quarantine_name
from sessionlog.extras import require
from sessionlog.events import (
    LOG_TRUNCATED,
    Record,
    RecordError,
    header_event,
    valid_session_id,
)
from sessionlog.scan import DEFAULT_LIMITS, Limits, check_header, encode_batch, encode_batches
from sessionlog.transcript import PendingCalls, crash_plan, truncation_marker
from sessionlog.writer import WriteBehind

from .sql_engines import (
    SCHEMA_LOCK_KEY,
    DurabilityRefused,
    EngineKind,
    GroupBatch,
    Ownership,
    PostgresKind,
    SqliteKind,
    _is_connection_error,
    _quiet,
    _too_many_hint,
    blame,
    driver_error,
)
from .sql_schema import build_schema, check_store, check_version

__all__ = ["DurabilityRefused", "RowScan", "SqlSession", "SqlStore", "open_url"]

READ_CHUNK = 1000
"""Rows per round trip when streaming a session (memory stays bounded)."""

_REREADS = 3
"""Times one read reads on after a damaged row it fetched was replaced under it (a repair
in another process); then it ends as the damage it met says."""

MAX_ATTEMPTS = 12
"""Tries of one append when it meets retryable errors (busy, deadlock, serialization)."""

_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")



# --- scanning rows (pure) ----------------------------------------------------------------


def row_bytes(stored: object) -> bytes:
    """A row's record column as bytes. SQLite keeps any value in any column, and a
    database edited by hand may hold a record as TEXT (or a number) where the engine wrote
    a BLOB: such a row does not hold the bytes the engine committed, and nothing guesses
    what they were (RecordError, which scans report as damage at that row)."""
    if type(stored) is bytes:
        return stored
    if isinstance(stored, (bytearray, memoryview)):
        return bytes(stored)
    kind = {str: "TEXT", int: "INTEGER", float: "REAL", type(None): "NULL"}.get(type(stored), type(stored).__name__)
    raise RecordError(f"the record column holds {kind}, not a BLOB")


def stored_bytes(stored: object) -> bytes:
    """A row's record column as the bytes it holds, whatever its SQL type: a BLOB's
    bytes; TEXT's as SQLite keeps them (UTF-8, any other byte given back as it was); a
    number's text; nothing for NULL. What a quarantine keeps and a tail's length counts."""
    if isinstance(stored, (bytes, bytearray, memoryview)):
        return bytes(stored)
    return b"" if stored is None else str(stored).encode("utf-8", "surrogateescape")


def decode_row(stored: object) -> Record:
    """A stored row's record as a record, by the same rules as one line of a JSONL log: it
    must be bytes (see :func:`row_bytes`), decode (docs/format.md) and hold no newline
    byte (a bare CR is JSON whitespace inside a line, as it is in a JSONL file). Raises
    RecordError."""
    raw = row_bytes(stored)
    if b"\n" in raw:
        raise RecordError("spans lines (holds a newline byte)")
    return Record.from_line(raw)


@dataclass(slots=True)
class _Tail:
    """What a scan saw beyond the prefix, for a repair conditional on it."""

    rows: int = 0
    max_seq: int = 0
    quarantines: dict[str, int] = field(default_factory=dict)  # name -> stored bytes


class RowScan:
    """The longest valid prefix of a session's rows, then the damage after it.

    Pure: ``rows`` yields ``(seq column, record column)`` in seq order. Iterate for the
    prefix's records; afterwards ``count``, ``last_seq``, ``last_ts`` and ``damage``
    describe it and ``rows``/``max_seq`` count every row seen. A first row that is not
    this session's header is CorruptLog (or UnsupportedFormat); a row over the record
    limit in the prefix is CorruptLog."""

    def __init__(
        self, rows: Iterable[tuple[int, object]], *, session_id: str, where: str, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self._rows = rows
        self.session_id = session_id
        self.where = where
        self.limits = limits
        self.count = 0
        self.last_seq = 0
        self.last_ts = 0.0
        self.rows = 0
        self.max_seq = 0
        self.damage: Damage | None = None

    def __iter__(self) -> Iterator[Record]:
        limit = self.limits.record_limit
        expected = 1
        it = iter(self._rows)
        for seq_col, stored in it:
            self.rows += 1
            self.max_seq = seq_col
            try:
                raw = row_bytes(stored)
            except RecordError as exc:
                self._fail(it, len(stored_bytes(stored)), None, f"row seq {seq_col} does not decode: {exc.reason}")
                return
            if len(raw) > limit:
                raise CorruptLog(
                    f"{self.where}: the record in row seq {seq_col} is {len(raw)} bytes, over the record "
                    f"limit of {limit} bytes",
                    path=self.where, offset=self.count,
                )
            try:
                record = decode_row(raw)
            except RecordError as exc:
                self._fail(it, len(raw), None, f"row seq {seq_col} does not decode: {exc.reason}")
                return
            if record.seq != expected or seq_col != expected:
                if seq_col != record.seq:
                    reason = f"row seq {seq_col} holds a record with seq {record.seq}"
                else:
                    reason = f"seq {record.seq} where {expected} was expected"
                self._fail(it, len(raw), record, reason)
                return
            if expected == 1:
                check_header(record, self.session_id, self.where)
            expected += 1
            self.count += 1
            self.last_seq = record.seq
            self.last_ts = record.ts
            yield record

    def _fail(self, it: Iterator[tuple[int, object]], length: int, first: Record | None, reason: str) -> None:
        """The damage at the current row (``length``: its size; ``first``: its record when
        it decoded with the wrong seq): every row after it is walked and counted."""
        if self.count == 0:
            raise CorruptLog(
                f"{self.where}: not a session log: its first row is not a session/start header ({reason})",
                path=self.where, offset=0,
            )
        decoded = [first.seq] if first is not None else []
        limit = self.limits.record_limit
        for seq_col, rest in it:
            self.rows += 1
            self.max_seq = seq_col
            size = len(stored_bytes(rest))
            length += size
            if size > limit:
                continue
            try:
                decoded.append(decode_row(rest).seq)
            except RecordError:
                pass
        kind = classify_damage(
            Failure.WRONG_SEQ if first is not None else Failure.UNDECODABLE,
            records_after=len(decoded), within_reach=False, owned=False,
        )
        self.damage = Damage(
            kind=kind,
            offset=self.count,
            length=length,
            records_after=len(decoded),
            reason=reason,
            dropped_seqs=(decoded[0], decoded[-1]) if decoded else None,
        )


# --- the session handle ------------------------------------------------------------------


class SqlSession:
    """The single writer of one session, for as long as it is open.

    Holds the session's ownership lock (SQLite: a ``flock``; PostgreSQL: an advisory lock
    on the store's lock connection) and no database connection: each append borrows one
    from the store's pool. After a failed append the handle is unusable (open a new
    one); a handle is unusable after ``fork``."""

    def __init__(self, store: SqlStore, session_id: str, *, timeout: float, repair: bool = False) -> None:
        self.store = store
        self.session_id = session_id
        self._kind = store.kind
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._failed: str | None = None
        self._closed = True
        owner = self._kind.ownership(session_id)
        store._acquire(session_id, owner, timeout)
        try:
            with store._connect() as conn:
                store._take(conn, session_id, owner)
                if repair:
                    report = store._repair_locked(conn, session_id, force=False, owner=owner)
                    if report.status == "refused":
                        damage = report.damage
                        raise CorruptLog(
                            f"{store._where(session_id)}: {report.reason}",
                            path=store._where(session_id),
                            offset=damage.offset if damage else None,
                            kind=str(damage.kind) if damage else None,
                        )
                self._last_seq = store._check_tail(conn, session_id)
        except BaseException:
            owner.release()
            raise
        self._owner = owner
        self._closed = False

    @property
    def last_seq(self) -> int:
        """The seq of the session's last durable record (as of this handle's last append)."""
        return self._last_seq

    def append(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> int:
        """Append ``events`` as one transaction; returns the last seq assigned.

        Durable on return (committed with the durability settings the store enforces).
        Raises SequenceConflict when ``expect_seq`` is not the session's last seq,
        InvalidEvent for an event over the limits (before anything is written),
        AppendFailed when the batch was not committed (``outcome_unknown=True`` when the
        error came during COMMIT: read the tail before appending it again); after an
        AppendFailed this handle is closed for appends."""
        batch = events if type(events) is list else events_list(events)
        with self._mutex:
            self._check_usable()
            kind, store, sid = self._kind, self.store, self.session_id
            if not batch:
                try:
                    with store._borrowed() as cur:
                        last = kind.read_tail(cur, sid)
                except SessionLogError:
                    raise
                except Exception as exc:
                    raise IOFailure(f"{store._where(sid)}: reading the tail failed: {driver_error(exc)}") from exc
                self._last_seq = last
                if expect_seq is not None and expect_seq != last:
                    raise SequenceConflict(
                        f"{store._where(sid)}: expected last seq {expect_seq}, found {last}",
                        expected=expect_seq, found=last,
                    )
                return last
            assumed = self._last_seq if expect_seq is None else expect_seq
            lines = store.encode_batch(batch, assumed + 1)

            def encode(first_seq: int) -> list[bytes]:
                return store.encode_batch(batch, first_seq)

            attempt = 0
            while True:
                try:
                    with store._borrowed() as cur:
                        last = kind.append_once(cur, sid, lines, assumed, expect_seq, encode, self._owner)
                    break
                except AppendFailed as exc:
                    self._failed = str(exc)
                    raise
                except (SequenceConflict, SessionNotFound, InvalidEvent, StoreClosed):
                    raise
                except IOFailure as exc:  # no pooled connection to be had: nothing was written
                    self._failed = str(exc)
                    raise AppendFailed(f"{store._where(sid)}: append failed: {exc}") from exc
                except BaseException as exc:
                    attempt += 1
                    if isinstance(exc, Exception) and attempt < MAX_ATTEMPTS and kind.retryable(exc):
                        time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
                        continue
                    self._failed = repr(driver_error(exc))
                    raise AppendFailed(
                        f"{store._where(sid)}: append failed and was rolled back "
                        f"(after {attempt} attempt(s)): {driver_error(exc)!r}"
                    ) from exc
            self._last_seq = last
            return last

    def _check_usable(self) -> None:
        if self._failed is not None:
            where = self.store._where(self.session_id)
            raise StoreClosed(f"{where}: this handle failed earlier ({self._failed}); open a new one")
        if self._closed or os.getpid() != self._pid:
            raise StoreClosed(f"{self.store._where(self.session_id)}: session handle is closed")

    def records(self, after_seq: int = 0) -> Iterator[Record]:
        """Stream the session's records with seq > ``after_seq``."""
        return self.store.read(self.session_id, after_seq)

    def close(self) -> None:
        """Release the ownership lock. Never raises over an exception already in flight;
        after ``fork`` the child leaves the parent's lock alone."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return
        _quiet(self._owner.release)

    def __enter__(self) -> SqlSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the store ---------------------------------------------------------------------------


class SqlStore:
    """Sessions in a SQL database (SQLite file or PostgreSQL); see the module docstring.

    Options: ``limits`` (record and batch limits), ``lock_timeout`` (seconds a one-shot
    append or a delete waits for the session's owner), ``busy_timeout`` (SQLite: seconds
    a transaction waits for the database's write lock), ``synchronous`` (SQLite: FULL or
    EXTRA; anything weaker is refused), ``engine_options`` (passed to
    ``sqlalchemy.create_engine``), ``read_only`` (never write to the database: see the
    module docstring; the database must already hold a sessionlog store). Raises
    DurabilityRefused (a writing store only), UnsupportedFormat (a newer schema),
    CorruptLog (read-only: not a sessionlog store), IOFailure (the database cannot be
    reached or opened)."""

    atomic_batches = True

    def __init__(
        self,
        url: str,
        *,
        limits: Limits = DEFAULT_LIMITS,
        lock_timeout: float = 10.0,
        busy_timeout: float = 5.0,
        synchronous: str = "FULL",
        engine_options: Mapping[str, Any] | None = None,
        read_only: bool = False,
    ) -> None:
        from sessionlog import InvalidStoreUrl

        self.url = url
        self.read_only = read_only
        self.limits = limits
        self.lock_timeout = lock_timeout
        self._closed = False
        self._pid = os.getpid()
        try:
            sa_url = sa.make_url(url)
            sa_url.port  # noqa: B018 - a port that is not a number fails here, not at connect
        except sa.exc.ArgumentError as exc:
            raise InvalidStoreUrl(f"{url!r}: not a database URL ({exc})") from None
        except ValueError:
            raise InvalidStoreUrl(f"{url!r}: not a database URL (its host or port does not parse)") from None
        self.display_url = sa_url.render_as_string(hide_password=True)
        # SQLAlchemy drops an option with no value (``?schema=``): the store would open
        # somewhere other than the URL says.
        blank = [k for k, v in urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True)
                 if not v]
        if blank:
            raise InvalidStoreUrl(f"{self.display_url}: option {blank[0]!r} has no value")
        backend, driver = sa_url.get_backend_name(), sa_url.get_driver_name()
        if backend == "sqlite" and sa_url.host:
            # sqlite://x.db parses as host "x.db" and no database: SQLite would open an
            # empty in-memory database, and the file meant is never read nor written.
            meant = sa_url.host + (f"/{sa_url.database}" if sa_url.database else "")
            raise InvalidStoreUrl(f"{url!r}: an SQLite URL names no host: its file follows three slashes "
                                  f"(sqlite:///{meant}; an absolute path takes four)")
        options = dict(engine_options or {})
        if backend == "sqlite" and driver in ("pysqlite", ""):
            self.schema = build_schema(None)
            self.kind: EngineKind = SqliteKind(
                sa_url, self.schema, where=self.display_url, busy_timeout=busy_timeout,
                synchronous=synchronous, engine_options=options, read_only=read_only,
            )
        elif backend == "postgresql" and driver in ("psycopg", "psycopg2", ""):
            require("psycopg", extra="postgres", purpose=f"a PostgreSQL store ({self.display_url})")
            if driver != "psycopg":
                sa_url = sa_url.set(drivername="postgresql+psycopg")
            namespace = sa_url.query.get("schema")
            if isinstance(namespace, tuple):
                namespace = namespace[-1]
            if namespace is not None and not _NAMESPACE.fullmatch(namespace):
                raise InvalidStoreUrl(f"{url!r}: schema {namespace!r} is not a plain SQL identifier")
            sa_url = sa_url.difference_update_query(["schema"])
            self.schema = build_schema(namespace)
            self.kind = PostgresKind(
                sa_url, self.schema, where=self.display_url, namespace=namespace,
                engine_options=options, read_only=read_only,
            )
        else:
            raise InvalidStoreUrl(
                f"{url!r}: the SQL backend takes sqlite:///FILE or postgresql+psycopg://... URLs"
            )
        self.engine = self.kind.engine
        try:
            if read_only:
                with self._errors("opening the store"), self._connect() as conn, self._reading(conn) as c:
                    check_store(c, self.schema, self.display_url)
            else:
                self._ensure_schema()
            if isinstance(self.kind, PostgresKind):
                with self._errors("opening the store"), self._connect() as conn:
                    resolved = self.kind.resolve_namespace(conn)
                    conn.rollback()
                if resolved is not None:
                    self.schema = build_schema(resolved)
                    self.kind.use_schema(self.schema)
        except BaseException:
            self.engine.dispose()
            raise
        tables = self.schema
        self._q_read = (
            sa.select(tables.records.c.seq, tables.records.c.record)
            .where(tables.records.c.session_id == sa.bindparam("sid"), tables.records.c.seq > sa.bindparam("after"))
            .order_by(tables.records.c.seq)
            .limit(READ_CHUNK)
        )

    # -- plumbing ------------------------------------------------------------------------

    def _where(self, session_id: str) -> str:
        return f"{self.display_url} session {session_id!r}"

    def _connect(self, *, raw: bool = False) -> Any:
        """A pooled connection (``raw``: the pool's DBAPI connection proxy, for driver-level
        work). IOFailure when none can be made."""
        if self._closed:
            raise StoreClosed(f"{self.display_url}: store is closed")
        if os.getpid() != self._pid:
            # A forked child must not share its parent's pooled connections.
            self.engine.dispose(close=False)
            self._pid = os.getpid()
        try:
            return self.engine.raw_connection() if raw else self.engine.connect()
        except SessionLogError:
            raise
        except Exception as exc:
            cause = driver_error(exc)
            if isinstance(cause, SessionLogError):
                raise cause from None
            if not isinstance(exc, sa.exc.SQLAlchemyError) and not _is_driver_error(exc):
                raise
            raise IOFailure(f"{self.display_url}: cannot connect: {cause}{_too_many_hint(exc)}") from exc

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Chain driver errors into IOFailure (SessionLogErrors pass through)."""
        try:
            yield
        except SessionLogError:
            raise
        except (sa.exc.SQLAlchemyError, OSError) as exc:
            cause = driver_error(exc)
            if isinstance(cause, SessionLogError):
                raise cause from None
            raise IOFailure(f"{self.display_url}: {what} failed: {cause}") from exc
        except Exception as exc:
            module = type(exc).__module__.partition(".")[0]
            if module in ("sqlite3", "psycopg", "_sqlite3"):
                raise IOFailure(f"{self.display_url}: {what} failed: {exc}") from exc
            raise

    @contextmanager
    def _write(self, conn: sa.Connection) -> Iterator[sa.Connection]:
        """A write transaction (SQLite: BEGIN IMMEDIATE). An error during COMMIT is
        AppendFailed with an unknown outcome."""
        conn.execution_options(sessionlog_write=True)
        try:
            trans = conn.begin()
        finally:
            conn.execution_options(sessionlog_write=False)
        try:
            yield conn
        except BaseException:
            try:
                trans.rollback()
            except Exception:
                pass
            raise
        try:
            trans.commit()  # after this the transaction survives power loss
        except BaseException as exc:
            raise AppendFailed(
                f"{self.display_url}: the commit failed ({driver_error(exc)!r}); the outcome is unknown: "
                "scan before writing again",
                outcome_unknown=True,
            ) from exc

    def _ensure_schema(self) -> None:
        with self._errors("creating the tables"), self._connect() as conn, self._write(conn):
            if isinstance(self.kind, PostgresKind):
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEMA_LOCK_KEY})
                if self.schema.namespace is not None:
                    conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{self.schema.namespace}"'))
            self.schema.metadata.create_all(conn)
            check_version(conn, self.schema, self.display_url)

    def _acquire(self, session_id: str, owner: Ownership, timeout: float) -> None:
        """Take ``owner``'s lock. A session with no row is SessionNotFound before a lock
        that would leave a trace is taken (SQLite's lock files are never removed, so one
        made for a misspelled id would stay)."""
        if owner.creates_on_acquire():
            s = self.schema.sessions
            with self._connect() as conn, conn.begin():
                found = conn.execute(sa.select(s.c.session_id).where(s.c.session_id == session_id)).first()
            if found is None:
                raise SessionNotFound(f"{self._where(session_id)}: no such session")
        owner.acquire(timeout)

    def _take(self, conn: sa.Connection, session_id: str, owner: Ownership) -> None:
        """Holding ``owner``'s lock, before reading anything of the session: on an engine
        whose lock can be lost (PostgreSQL), move the session's owner epoch, which waits
        for an append of a former owner holding the session's row and fences out every
        later one; ``owner.epoch`` is then this owner's. SessionNotFound without a row."""
        if not self.kind.fenced:
            return
        try:
            with self._write(conn):
                epoch = self.kind.take(conn, session_id, owner)
        except AppendFailed as exc:  # the commit failed: nothing of the session was read yet
            raise IOFailure(f"{self._where(session_id)}: taking the session failed: {driver_error(exc.__cause__ or exc)}") from exc
        if epoch is None:
            raise SessionNotFound(f"{self._where(session_id)}: no such session")
        owner.epoch = int(epoch)

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise StoreClosed(f"{self.display_url}: the store is open read-only; {what} needs a writing store")

    def _check_id(self, session_id: str) -> None:
        if not valid_session_id(session_id):
            raise InvalidSessionId(
                f"invalid session id {session_id!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}, no '..'"
            )
        if self._closed:
            raise StoreClosed(f"{self.display_url}: store is closed")

    def _insert_ignore(self, table: sa.Table) -> Any:
        dialect = pg_dialect if isinstance(self.kind, PostgresKind) else sqlite_dialect
        return dialect.insert(table).on_conflict_do_nothing()

    def encode_batch(self, events: Sequence[Mapping[str, Any]], first_seq: int) -> list[bytes]:
        """Record lines for ``events`` with seq from ``first_seq``; enforces the record and
        batch limits (InvalidEvent). Each line is proven to scan as one record (a
        ``msgspec.Raw`` value holding a newline is InvalidEvent): append never
        acknowledges what scan refuses."""
        return encode_batch(events, first_seq, self.limits)

    # -- creating and listing -------------------------------------------------------------

    def create(self, session_id: str, events: Sequence[Mapping[str, Any]] = ()) -> int:
        """Publish a new session: header (seq 1) and ``events`` in one transaction, durable
        on return. Raises SessionExists, InvalidSessionId, InvalidEvent."""
        self._check_id(session_id)
        self._check_writable("create")
        lines = self.encode_batch([header_event(session_id), *events_list(events)], 1)
        records = self.schema.records
        with self._errors("create"), self._connect() as conn, self._write(conn):
            self._insert_session(conn, session_id)
            conn.execute(records.insert(), [
                {"session_id": session_id, "seq": i, "record": line} for i, line in enumerate(lines, 1)
            ])
        return len(lines)

    def _insert_session(self, conn: sa.Connection, session_id: str) -> None:
        sessions = self.schema.sessions
        # A session's epochs start at random, so a handle of a deleted session of the same
        # id never holds an epoch its successor reaches.
        done = conn.execute(
            self._insert_ignore(sessions).values(session_id=session_id, created_at=time.time(),
                                                 owner_epoch=secrets.randbits(48))
            .returning(sessions.c.session_id)
        ).first()
        if done is None:
            raise SessionExists(f"{self._where(session_id)}: session {session_id!r} already exists")

    def import_session(self, session_id: str, records: Iterable[Record]) -> int:
        """Publish a new session of exactly ``records`` (bytes verbatim), all or nothing, in
        one transaction. Raises SessionExists, InvalidEvent (not this session's header, a
        gap, a record that does not decode or spans lines)."""
        self._check_id(session_id)
        self._check_writable("import")
        check = ImportCheck(session_id)
        table = self.schema.records
        with self._errors("import"), self._connect() as conn, self._write(conn):
            self._insert_session(conn, session_id)
            chunk: list[dict[str, Any]] = []
            for record in records:
                raw = bytes(record.raw)
                try:
                    decoded = decode_row(raw)
                except RecordError as exc:
                    raise InvalidEvent(f"import of {session_id!r}: record {check.last_seq + 1}: {exc.reason}") from None
                check(decoded)
                chunk.append({"session_id": session_id, "seq": decoded.seq, "record": raw})
                if len(chunk) >= READ_CHUNK:
                    conn.execute(table.insert(), chunk)
                    chunk = []
            if chunk:
                conn.execute(table.insert(), chunk)
            if check.last_seq == 0:
                raise InvalidEvent(f"import of {session_id!r}: no records")
        return check.last_seq

    def writer(self, **options: Any) -> WriteBehind:
        """Write-behind over this store (``async with store.writer() as w``): events are
        accepted at once and made durable in batches; see :class:`sessionlog.writer.WriteBehind`."""
        return WriteBehind(self, **options)

    def sessions(self) -> list[str]:
        """The ids of every session in the database, sorted."""
        if self._closed:
            raise StoreClosed(f"{self.display_url}: store is closed")
        sessions = self.schema.sessions
        with self._errors("listing sessions"), self._connect() as conn:
            ids = conn.execute(sa.select(sessions.c.session_id)).scalars().all()
        return sorted(ids)

    def delete(self, session_id: str) -> None:
        """Remove the session, its rows and its quarantined rows in one transaction
        (waits up to ``lock_timeout`` for its owner: SessionLocked). Raises SessionNotFound."""
        self._check_id(session_id)
        self._check_writable("delete")
        t = self.schema
        with self._errors("delete"):
            owner = self.kind.ownership(session_id)
            self._acquire(session_id, owner, self.lock_timeout)
            try:
                with self._connect() as conn, self._write(conn):
                    # Fenced as an owner's open is: an append of a former owner in flight
                    # lands first or not at all, and a lost lock deletes nothing.
                    if self.kind.fenced and self.kind.take(conn, session_id, owner) is None:
                        raise SessionNotFound(f"{self._where(session_id)}: no such session")
                    gone = conn.execute(
                        t.sessions.delete().where(t.sessions.c.session_id == session_id).returning(t.sessions.c.session_id)
                    ).first()
                    if gone is None:
                        raise SessionNotFound(f"{self._where(session_id)}: no such session")
                    conn.execute(t.records.delete().where(t.records.c.session_id == session_id))
                    conn.execute(t.quarantine.delete().where(t.quarantine.c.session_id == session_id))
            finally:
                owner.release()

    # -- writing --------------------------------------------------------------------------

    def session(
        self, session_id: str, *, repair: bool = False, create: bool = False, timeout: float = 0.0
    ) -> SqlSession:
        """Own the session until the handle is closed (SessionLocked if another writer
        does, after waiting up to ``timeout``).

        ``create=True`` creates the session first if it does not exist; ``repair=True``
        repairs a damaged tail and closes an open transcript first, holding the lock
        throughout (never with force: CorruptLog when the damage needs it). Without
        ``repair`` a damaged tail is CorruptLog."""
        self._check_id(session_id)
        self._check_writable("owning a session")
        if create:
            try:
                self.create(session_id)
            except SessionExists:
                pass
        with self._errors("opening the session"):
            return SqlSession(self, session_id, timeout=timeout, repair=repair)

    def append(
        self, session_id: str, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None
    ) -> int:
        """One-shot durable append: owns the session for this call (waiting up to
        ``lock_timeout``: SessionLocked), then appends as :meth:`SqlSession.append`."""
        self._check_id(session_id)
        self._check_writable("append")
        batch = events_list(events)
        with self.session(session_id, timeout=self.lock_timeout) as handle:
            return handle.append(batch, expect_seq=expect_seq)

    def append_group(self, items: Sequence[GroupItem]) -> list[int]:
        """Append the batches of several open session handles in ONE transaction (one
        commit, one WAL sync: group commit across sessions); returns each batch's last seq,
        in the order of ``items``.

        ``items`` are ``(handle, events)`` or ``(handle, events, expect_seq)`` with
        ``handle`` an open :class:`SqlSession` of this store; each session keeps its own
        seqs, its ownership and its ``expect_seq`` check. A handle may appear more than
        once (its batches follow each other in item order). Durable on return.

        All or nothing: if any batch is refused before the commit, nothing is written and
        the error names the batch with ``group_index`` (its position in ``items``), so the
        caller can append the others again without it: InvalidEvent (an event over the
        limits, or an item that is not an open handle of this store: checked before any
        write), StoreClosed (a closed or failed handle), SequenceConflict, SessionNotFound.
        AppendFailed when the group was rolled back (no ``group_index``; every handle of
        the group is then closed for appends) or, with ``outcome_unknown=True``, when the
        error came during COMMIT: then any of the batches may be durable, read the tails
        before appending them again."""
        self._check_writable("append_group")
        if self._closed:
            raise StoreClosed(f"{self.display_url}: store is closed")
        handles: list[SqlSession] = []
        batches: list[GroupBatch] = []
        group_events: list[list[Mapping[str, Any]]] = []
        for index, item in enumerate(items):
            handle, events, expect_seq = _group_item(item, index)
            if not isinstance(handle, SqlSession) or handle.store is not self:
                raise blame(InvalidEvent(
                    f"{self.display_url}: group item {index} is not a session handle of this store"
                ), index)
            handles.append(handle)
            group_events.append(events)
            batches.append(GroupBatch(handle.session_id, [], 0, expect_seq, _encoder(self, events, index), index))
        if not batches:
            return []
        owners = sorted({id(h): h for h in handles}.values(), key=id)
        with contextlib.ExitStack() as held:
            for handle in owners:  # in one order: two groups never wait on each other
                held.enter_context(handle._mutex)
            for batch, handle in zip(batches, handles, strict=True):
                try:
                    handle._check_usable()
                except SessionLogError as exc:
                    raise blame(exc, batch.index) from None
            assumed: dict[int, int] = {}
            for batch, handle, events in zip(batches, handles, group_events, strict=True):
                last = assumed.get(id(handle), handle._last_seq) if batch.expect_seq is None else batch.expect_seq
                batch.assumed_last = last
                assumed[id(handle)] = last + len(events)  # one record per event
            # The whole group in one encoder pass; if it refuses anything, batch by batch
            # (which names the batch and the event at fault).
            encoded = encode_batches(group_events, [b.assumed_last + 1 for b in batches], self.limits)
            for i, batch in enumerate(batches):
                batch.lines = batch.encode(batch.assumed_last + 1) if encoded is None else encoded[i]
            kind = self.kind
            attempt = 0
            while True:
                try:
                    with self._borrowed() as cur:
                        kind.append_group_once(cur, batches, [h._owner for h in handles])
                    break
                except AppendFailed as exc:
                    index = getattr(exc, "group_index", None)
                    for handle in owners if index is None else [handles[index]]:
                        handle._failed = str(exc)
                    raise
                except (SequenceConflict, SessionNotFound, InvalidEvent, StoreClosed):
                    raise
                except BaseException as exc:
                    attempt += 1
                    if isinstance(exc, IOFailure):
                        raise  # no connection to be had: nothing was written
                    if isinstance(exc, Exception) and attempt < MAX_ATTEMPTS and kind.retryable(exc):
                        time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
                        continue
                    failure = AppendFailed(
                        f"{self.display_url}: a group of {len(batches)} batches failed and was rolled back "
                        f"(after {attempt} attempt(s)): {driver_error(exc)!r}"
                    )
                    for handle in owners:
                        handle._failed = str(failure)
                    raise failure from exc
            for batch, handle in zip(batches, handles, strict=True):
                handle._last_seq = batch.last
        return [batch.last for batch in batches]

    @contextmanager
    def _borrowed(self) -> Iterator[Any]:
        """A driver cursor on a pooled connection, for one write transaction at driver
        level; the connection goes back to the pool afterwards (the pool's reset rolls
        back, and drops a connection that broke). Driver errors pass through raw."""
        raw = self._connect(raw=True)
        dbapi = raw.driver_connection
        try:
            self.kind.prepare_pooled(dbapi)
            cur = dbapi.cursor()
            try:
                yield cur
            finally:
                _quiet(cur.close)
        except BaseException as exc:
            if _is_connection_error(exc) or _is_connection_error(exc.__cause__) or _is_broken(dbapi):
                # The server ended it (an AppendFailed raised at COMMIT carries the driver's
                # error as its cause): drop it from the pool rather than have the pool's
                # reset try a rollback on it (and log that failure as an error).
                _quiet(raw.invalidate)
            raise
        finally:
            _quiet(raw.close)

    def _check_tail(self, conn: sa.Connection, session_id: str) -> int:
        """Under the ownership lock: the header, the last row and the row count agree;
        returns the last seq. A damaged session is CorruptLog (with the damage's kind)."""
        t = self.schema.records
        s = self.schema.sessions
        where = self._where(session_id)
        with conn.begin():
            if conn.execute(sa.select(s.c.session_id).where(s.c.session_id == session_id)).first() is None:
                raise SessionNotFound(f"{where}: no such session")
            header = conn.execute(
                sa.select(t.c.record).where(t.c.session_id == session_id, t.c.seq == 1)
            ).scalar()
            tail = conn.execute(
                sa.select(t.c.seq, t.c.record).where(t.c.session_id == session_id).order_by(t.c.seq.desc()).limit(1)
            ).first()
            rows = conn.execute(sa.select(sa.func.count()).where(t.c.session_id == session_id)).scalar()
        if header is not None and tail is not None:
            try:
                first = decode_row(header)
                check_header(first, session_id, where)
                last = decode_row(tail[1])
            except RecordError:
                pass
            else:
                if last.seq == tail[0] == rows and len(tail[1]) <= self.limits.record_limit:
                    return int(rows)
        # Something is off: the full scan says what (or raises for a non-session).
        scan, _ = self._scan(session_id, owned=False, conn=conn)
        damage = scan.damage
        if damage is None:
            return scan.last_seq
        raise CorruptLog(
            f"{where}: the log is damaged ({damage.kind} at row {damage.offset}: {damage.reason}); "
            "repair it first (store.repair, or session(..., repair=True))",
            path=where, offset=damage.offset, kind=str(damage.kind),
        )

    # -- reading --------------------------------------------------------------------------

    def scan(self, session_id: str) -> ScanResult:
        """Validate every record of the session (never writes, never creates a lock file).
        Raises SessionNotFound, CorruptLog (not a session log), UnsupportedFormat."""
        self._check_id(session_id)
        with self._errors("scan"):
            owned = self.kind.owned(session_id)
            return self._scan(session_id, owned=owned)[0]

    def _scan(self, session_id: str, *, owned: bool, conn: sa.Connection | None = None) -> tuple[ScanResult, _Tail]:
        t = self.schema
        where = self._where(session_id)
        tracker = PendingCalls()
        named: set[str] = set()
        tail = _Tail()
        with self._reading(conn) as c:
            if c.execute(sa.select(t.sessions.c.session_id).where(t.sessions.c.session_id == session_id)).first() is None:
                raise SessionNotFound(f"{where}: no such session")
            result = c.execute(
                sa.select(t.records.c.seq, t.records.c.record)
                .where(t.records.c.session_id == session_id)
                .order_by(t.records.c.seq)
                .execution_options(yield_per=READ_CHUNK)
            )
            rows = RowScan(result, session_id=session_id, where=where, limits=self.limits)
            try:
                for record in rows:
                    tracker.feed(record)
                    if record.type == LOG_TRUNCATED:
                        q = record.get("quarantine")
                        if isinstance(q, str):
                            named.add(q)
            finally:
                result.close()
            for name, size in c.execute(
                sa.select(t.quarantine.c.name, sa.func.sum(sa.func.length(t.quarantine.c.record)))
                .where(t.quarantine.c.session_id == session_id)
                .group_by(t.quarantine.c.name)
                .order_by(t.quarantine.c.name)
            ):
                tail.quarantines[name] = int(size or 0)
        tail.rows, tail.max_seq = rows.rows, rows.max_seq
        scan = ScanResult.of_prefix(
            session_id, None, rows, tracker, stable_offset=rows.count, owned=owned,
            unmarked_quarantines=[q for q in tail.quarantines if q not in named],
            load=lambda: self.read_prefix(session_id), last_raw=bytes(record.raw) if rows.count else None,
        )
        return scan, tail

    @contextmanager
    def _reading(self, conn: sa.Connection | None) -> Iterator[sa.Connection]:
        """One read transaction (a snapshot: SQLite BEGIN in WAL mode, PostgreSQL
        REPEATABLE READ) on ``conn`` or a pooled connection."""
        if conn is None:
            with self._connect() as own, self._reading(own) as c:
                yield c
            return
        with conn.begin():
            if isinstance(self.kind, PostgresKind):
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn

    def read(self, session_id: str, after_seq: int = 0) -> Iterator[Record]:
        """Stream the valid prefix's records with seq > ``after_seq``, a chunk of rows per
        round trip (memory stays bounded; no transaction is held between chunks).

        Each record is validated as it is read and the stream stops at the first damaged
        row: quietly when nothing that decodes follows it (a plain repair's damage), else
        with CorruptLog naming it (``mid-log``, ``seq-break``: the rows after it are
        history a caller must not take the prefix for; as the file backends do). A damaged
        row that a repair in another process replaced after the reader fetched it is not
        an end: the read reads on into the repaired rows (as the file backends re-read). Raises
        SequenceConflict when ``after_seq`` lies beyond the prefix's last record (the
        reader saw records that are no longer there), SessionNotFound, CorruptLog (not a
        session log). With ``after_seq > 0`` the rows up to it are trusted when the row at
        ``after_seq`` is intact (``scan`` checks them all)."""
        self._check_id(session_id)
        return self._read(session_id, read_start(after_seq), whole=True)

    def read_prefix(self, session_id: str, after_seq: int = 0) -> Iterator[Record]:
        """:meth:`read` that ends quietly at damage needing ``--force`` (see
        :func:`sessionlog.contract.read_prefix`)."""
        self._check_id(session_id)
        return self._read(session_id, read_start(after_seq), whole=False)

    def _stopped(self, session_id: str, last_seq: int, *, whole: bool) -> bool:
        """A read met a damaged row after seq ``last_seq``; what a scan finds now decides.
        True when the log is valid past ``last_seq`` now (a repair or a rewrite replaced
        the row since the reader fetched it: read on). Else, for :meth:`read` (``whole``),
        CorruptLog when the damage needs force (records decode after it); False otherwise
        (the read ends quietly at the damage)."""
        scan, _ = self._scan(session_id, owned=False)
        if scan.last_seq > last_seq:
            return True
        damage = scan.damage
        if whole and damage is not None and damage.kind.needs_force:
            where = self._where(session_id)
            raise CorruptLog(
                f"{where}: {damage.kind} at row {damage.offset}: read stopped at seq {last_seq}; "
                f"{damage.records_after} decodable records after the damage were not read ({damage.reason}); "
                "see `sessionlog scan`, then repair with force or salvage",
                path=where, offset=damage.offset, kind=str(damage.kind),
            )
        return False

    def _read(self, session_id: str, after_seq: int, *, whole: bool) -> Iterator[Record]:
        where = self._where(session_id)
        t = self.schema
        with self._errors("read"):
            if after_seq > 0:
                with self._connect() as conn:
                    raw = conn.execute(
                        sa.select(t.records.c.record).where(
                            t.records.c.session_id == session_id, t.records.c.seq == after_seq
                        )
                    ).scalar()
                    conn.commit()
                intact = False
                if raw is not None:
                    try:
                        intact = decode_row(raw).seq == after_seq
                    except RecordError:
                        intact = False
                if not intact:
                    scan, _ = self._scan(session_id, owned=False)
                    if after_seq > scan.last_seq:
                        raise SequenceConflict(
                            f"{where}: read after seq {after_seq}, but the log ends at seq {scan.last_seq}",
                            expected=after_seq, found=scan.last_seq,
                        )
            expected = after_seq + 1
            limit = self.limits.record_limit
            rereads = _REREADS
            while True:
                with self._connect() as conn:
                    chunk = conn.execute(self._q_read, {"sid": session_id, "after": expected - 1}).all()
                    conn.commit()
                if not chunk and expected == 1:
                    s = t.sessions
                    with self._connect() as conn:
                        found = conn.execute(sa.select(s.c.session_id).where(s.c.session_id == session_id)).first()
                    if found is None:
                        raise SessionNotFound(f"{where}: no such session")
                    raise CorruptLog(f"{where}: not a session log: it has no rows", path=where, offset=0)
                for seq_col, raw in chunk:
                    record: Record | None = None
                    try:
                        data = row_bytes(raw)  # a row that holds no bytes is damage, whatever its size
                    except RecordError:
                        pass
                    else:
                        if len(data) > limit:
                            raise CorruptLog(
                                f"{where}: the record in row seq {seq_col} is over the record limit of {limit} "
                                "bytes", path=where, offset=expected - 1,
                            )
                        try:
                            record = decode_row(data)
                        except RecordError:
                            pass
                    if record is None or record.seq != expected or seq_col != expected:
                        if expected == 1:
                            why = "does not decode" if record is None else f"is seq {seq_col}"
                            raise CorruptLog(f"{where}: not a session log: its first row {why}",
                                             path=where, offset=0)
                        if self._stopped(session_id, expected - 1, whole=whole) and rereads:
                            rereads -= 1
                            break  # the row changed since the chunk was read: read on from it
                        return
                    if expected == 1:
                        check_header(record, session_id, where)
                    expected += 1
                    yield record
                else:
                    if len(chunk) < READ_CHUNK:
                        return

    # -- repair ---------------------------------------------------------------------------

    def repair(
        self, session_id: str, *, force: bool = False, dry_run: bool = False, expire_approvals: bool = False
    ) -> RepairReport:
        """Quarantine rows after damage and close the open transcript, in one transaction
        conditional on the rows scanned, under the ownership lock (SessionLocked while a
        writer owns the session).

        ``mid-log`` and ``seq-break`` are refused (status "refused") unless ``force``;
        with ``force`` the rows after the break move to ``sessionlog_quarantine``. A
        second repair appends nothing. ``dry_run`` reports without writing or locking."""
        self._check_id(session_id)
        with self._errors("repair"):
            owner = None
            if not dry_run:
                self._check_writable("repair (without dry_run)")
                owner = self.kind.ownership(session_id)
            if owner is None or owner.creates_on_acquire():
                # A dry run takes no lock. While SQLite's lock file does not exist yet,
                # nobody owns the session and taking the lock would create it: a repair
                # with nothing to write answers from this scan and creates nothing.
                if owner is None and self.kind.owned(session_id):
                    return RepairReport(session_id, None, "refused", reason="a writer owns the session")
                scan, tail = self._scan(session_id, owned=False)
                report = self._repair_plan(scan, tail, force=force, expire_approvals=expire_approvals)
                if owner is None or report.status != "repaired":
                    return report
            assert owner is not None
            owner.acquire(0.0)
            try:
                with self._connect() as conn:
                    self._take(conn, session_id, owner)
                    return self._repair_locked(
                        conn, session_id, force=force, expire_approvals=expire_approvals, owner=owner
                    )
            finally:
                owner.release()

    def _repair_plan(
        self, scan: ScanResult, tail: _Tail, *, force: bool, expire_approvals: bool = False
    ) -> RepairReport:
        damage = scan.damage
        report = RepairReport(scan.session, None, "clean", damage=damage)
        if damage is not None and damage.kind.needs_force and not force:
            report.status = "refused"
            report.reason = damage.refusal("row")
            return report
        events: list[dict[str, Any]] = []
        for name in scan.unmarked_quarantines:
            # The quarantine table is keyed by session id; the name only tells offset and kind.
            parsed = parse_quarantine_name(scan.session, name)
            offset, reason = parsed if parsed is not None else (0, "unknown")
            events.append(truncation_marker(
                offset=offset, dropped_bytes=tail.quarantines.get(name, 0), reason=reason, quarantine=name,
                ts=scan.last_ts, dropped_seqs=self._quarantined_seqs(scan.session, name),
            ))
        if damage is not None:
            name = quarantine_name(scan.session, damage.offset, str(damage.kind))
            events.append(truncation_marker(
                offset=damage.offset, dropped_bytes=damage.length, reason=str(damage.kind),
                quarantine=name, ts=scan.last_ts, dropped_seqs=damage.dropped_seqs,
            ))
            report.truncated_bytes = damage.length
            report.quarantine = name
        markers = len(events)
        events.extend(crash_plan(scan.tracker, expire_approvals=expire_approvals))
        if not events:
            return report
        report.status = "repaired"
        report.reason = repair_reason(damage, unmarked=bool(scan.unmarked_quarantines),
                                      transcript=len(events) > markers)
        # Not bounded by the batch limit: one transaction holds any number of rows.
        lines = synthetic_lines(events, scan.last_seq + 1, record_limit=self.limits.record_limit)
        report.appended = [Record.from_line(line) for line in lines]
        return report

    def _repair_locked(
        self, conn: sa.Connection, session_id: str, *, force: bool, owner: Ownership,
        expire_approvals: bool = False,
    ) -> RepairReport:
        scan, tail = self._scan(session_id, owned=False, conn=conn)
        report = self._repair_plan(scan, tail, force=force, expire_approvals=expire_approvals)
        if report.status != "repaired":
            return report
        t = self.schema
        records = t.records
        mine = records.c.session_id == session_id
        with self._write(conn):
            epoch = self.kind.lock_row(conn, session_id)
            if epoch is None:
                raise SessionNotFound(f"{self._where(session_id)}: session was deleted")
            if self.kind.fenced and epoch != owner.epoch:
                raise OwnershipLost(
                    f"{self._where(session_id)}: another writer took the session during the repair "
                    f"(owner epoch {epoch}, the repair's {owner.epoch}); nothing was written"
                )
            rows, max_seq = conn.execute(sa.select(sa.func.count(), sa.func.max(records.c.seq)).where(mine)).one()
            if (rows, max_seq or 0) != (tail.rows, tail.max_seq):
                raise SequenceConflict(
                    f"{self._where(session_id)}: the session changed since it was scanned "
                    f"({tail.rows} rows to seq {tail.max_seq}, now {rows} rows to seq {max_seq}); repair again",
                    expected=tail.max_seq, found=int(max_seq or 0),
                )
            if scan.damage is not None:
                # The rows after the break move to the quarantine table, in the same
                # transaction as the marker that names them: never deleted outright.
                moved = sa.select(
                    sa.literal(report.quarantine, sa.String).label("name"), records.c.seq, records.c.session_id,
                    records.c.record, sa.literal(time.time(), sa.Float).label("moved_at"),
                ).where(mine, records.c.seq > scan.last_seq)
                conn.execute(t.quarantine.insert().from_select(
                    ["name", "seq", "session_id", "record", "moved_at"], moved
                ))
                conn.execute(records.delete().where(mine, records.c.seq > scan.last_seq))
            conn.execute(records.insert(), [
                {"session_id": session_id, "seq": r.seq, "record": r.raw} for r in report.appended
            ])
        return report

    def _quarantined_seqs(self, session_id: str, name: str) -> tuple[int, int] | None:
        """First and last seq of the quarantined rows ``name`` that decode: the
        ``dropped_seqs`` of a marker rebuilt from its quarantine."""
        seqs = []
        for _, _, raw in self.quarantined(session_id, name):
            try:
                seqs.append(decode_row(raw).seq)
            except RecordError:
                continue
        return (seqs[0], seqs[-1]) if seqs else None

    def quarantined(self, session_id: str, name: str | None = None) -> list[tuple[str, int, bytes]]:
        """The rows forced repairs moved out of the session: ``(quarantine name, seq column,
        bytes)``, oldest repair first."""
        self._check_id(session_id)
        q = self.schema.quarantine
        stmt = sa.select(q.c.name, q.c.seq, q.c.record).where(q.c.session_id == session_id)
        if name is not None:
            stmt = stmt.where(q.c.name == name)
        with self._errors("reading the quarantine"), self._connect() as conn:
            return [(n, int(s), stored_bytes(r))
                    for n, s, r in conn.execute(stmt.order_by(q.c.moved_at, q.c.name, q.c.seq))]

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store: its pooled connections are closed; later calls raise StoreClosed."""
        if not self._closed:
            self._closed = True
            if os.getpid() == self._pid:
                _quiet(self.kind.close)
                self.engine.dispose()

    def __enter__(self) -> SqlStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


GroupItem = tuple[SqlSession, Sequence[Mapping[str, Any]]] | tuple[SqlSession, Sequence[Mapping[str, Any]], int | None]
"""One batch of :meth:`SqlStore.append_group`: ``(handle, events)`` or ``(handle, events, expect_seq)``."""


def _group_item(item: Any, index: int) -> tuple[Any, list[Mapping[str, Any]], int | None]:
    try:
        if len(item) == 2:
            handle, events = item
            expect_seq = None
        else:
            handle, events, expect_seq = item
        batch = events if type(events) is list else events_list(events)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, SessionLogError):
            raise blame(exc, index) from None
        raise blame(InvalidEvent(
            f"group item {index}: expected (handle, events) or (handle, events, expect_seq)"
        ), index) from None
    if expect_seq is not None and type(expect_seq) is not int:
        raise blame(InvalidEvent(f"group item {index}: expect_seq must be an int or None"), index)
    return handle, batch, expect_seq


def _encoder(store: SqlStore, events: list[Mapping[str, Any]], index: int) -> Callable[[int], list[bytes]]:
    """Encodes one group batch from a first seq; InvalidEvent is blamed on the batch."""

    def encode(first_seq: int) -> list[bytes]:
        try:
            return store.encode_batch(events, first_seq)
        except InvalidEvent as exc:
            raise blame(exc, index) from None

    return encode


def _is_broken(dbapi: Any) -> bool:
    """True when the driver knows its connection is gone (psycopg: ``closed`` or
    ``broken``; sqlite3 connections have neither)."""
    return bool(getattr(dbapi, "closed", False) or getattr(dbapi, "broken", False))


def _is_driver_error(exc: BaseException) -> bool:
    """True for an error raised by a database driver itself (the pool's raw connections
    do not wrap them)."""
    return type(exc).__module__.partition(".")[0] in ("sqlite3", "psycopg", "_sqlite3")


def open_url(url: str, **options: Any) -> SqlStore:
    """``sqlite:///FILE`` or ``postgresql+psycopg://USER@HOST/DB[?schema=NAME]``; options as
    :class:`SqlStore` (``read_only=True`` to read without writing)."""
    return SqlStore(url, **options)
