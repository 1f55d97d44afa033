"""The SQL backend's tables and their schema version (docs/backends.md).

Pinned by the design: tables prefixed ``sessionlog_``; one row per record holding its
exact bytes; primary key ``(session_id, seq)``. The rest is this backend's own:

``sessionlog_meta``        key/value; ``schema_version`` says which layout the database has.
``sessionlog_sessions``    one row per session: what ``sessions()`` lists and what an append
                           locks (``SELECT ... FOR UPDATE``) on PostgreSQL; ``owner_epoch``
                           counts the owners a PostgreSQL session has had (the fencing
                           token: an append commits only under its owner's epoch).
``sessionlog_records``     ``(session_id, seq, record)``: the record's bytes, verbatim.
``sessionlog_quarantine``  rows that a forced repair moved out of a session, under the name
                           its ``log/truncated`` marker gives; never deleted by repair.

A writing store creates the tables on first use, under a lock (SQLite's write lock, a
PostgreSQL advisory lock) so that many processes opening a new database at once do not
race, and brings an older layout up to date there (:func:`check_version`). A read-only
store creates nothing and migrates nothing: :func:`check_store` only looks.

Versions: 1, the first layout; 2 adds ``sessionlog_sessions.owner_epoch`` (a version-1
database is migrated in place by the first writing store of this version: one
``ALTER TABLE ... ADD COLUMN``; earlier versions of sessionlog then refuse the database,
as they would not honour the epoch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import sqlalchemy as sa

from sessionlog.contract import CorruptLog, UnsupportedFormat

SCHEMA_VERSION: Final = 2
"""The table layout this version writes. A database with a higher version is refused
(:class:`UnsupportedFormat`); a lower one is migrated by a writing store
(:func:`check_version`) and read as it is by a read-only one."""

PREFIX: Final = "sessionlog_"

SESSION_ID_LENGTH: Final = 128


@dataclass(frozen=True, slots=True)
class Schema:
    """The tables of one store, optionally inside a PostgreSQL schema (namespace)."""

    namespace: str | None
    metadata: sa.MetaData
    meta: sa.Table
    sessions: sa.Table
    records: sa.Table
    quarantine: sa.Table

    def qualified(self, table: sa.Table) -> str:
        """The table's name for hand-written (driver-level) SQL, quoted where needed."""
        if self.namespace is None:
            return table.name
        return f'"{self.namespace}".{table.name}'


def build_schema(namespace: str | None = None) -> Schema:
    """The table definitions, in ``namespace`` (a PostgreSQL schema) when given."""
    md = sa.MetaData(schema=namespace)
    meta = sa.Table(
        PREFIX + "meta",
        md,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    sessions = sa.Table(
        PREFIX + "sessions",
        md,
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("owner_epoch", sa.BigInteger, nullable=False, server_default="0"),
    )
    records = sa.Table(
        PREFIX + "records",
        md,
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("record", sa.LargeBinary, nullable=False),
        # SQLite: a rowid table (as PostgreSQL's heap), so new rows go where the last
        # ones went and the primary key is an index of short entries. Clustered on the key
        # (WITHOUT ROWID, which databases made by earlier versions have; they still read
        # and write), a commit of 100 sessions' events dirtied a page per session: group
        # commit gained half as much. Reading one session among interleaved ones costs
        # about 8% more this way.
    )
    quarantine = sa.Table(
        PREFIX + "quarantine",
        md,
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("session_id", sa.String(SESSION_ID_LENGTH), nullable=False, index=True),
        sa.Column("record", sa.LargeBinary, nullable=False),
        sa.Column("moved_at", sa.Float, nullable=False),
    )
    return Schema(namespace, md, meta, sessions, records, quarantine)


def check_version(conn: sa.Connection, schema: Schema, where: str) -> None:
    """Record the schema version in a new database; migrate an older one; refuse a newer
    one.

    Runs inside the caller's write transaction (under the schema lock), after the tables
    exist."""
    meta = schema.meta
    found = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    if found is None:
        conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
        return
    version = _check_version_text(found, where)
    if version < 2:
        # Version 1 had no owner epoch: every session starts at epoch 0 (no owner yet).
        sessions = schema.qualified(schema.sessions)
        conn.exec_driver_sql(f"ALTER TABLE {sessions} ADD COLUMN owner_epoch BIGINT NOT NULL DEFAULT 0")
    if version < SCHEMA_VERSION:
        conn.execute(meta.update().where(meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))


def check_store(conn: sa.Connection, schema: Schema, where: str) -> None:
    """Check, reading only, that the database holds a sessionlog store this version reads.

    Raises CorruptLog ("not a sessionlog store") when a table or the schema version is
    missing (an unrelated database, a mistyped URL or ``?schema=``), UnsupportedFormat
    for a newer schema version."""
    inspector = sa.inspect(conn)
    tables = (schema.meta, schema.sessions, schema.records, schema.quarantine)
    missing = [t.name for t in tables if not inspector.has_table(t.name, schema=schema.namespace)]
    if missing:
        raise CorruptLog(f"{where}: not a sessionlog store (no table {', '.join(missing)})", path=where)
    meta = schema.meta
    found = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    if found is None:
        raise CorruptLog(f"{where}: not a sessionlog store (no schema_version in {meta.name})", path=where)
    _check_version_text(found, where)


def _check_version_text(found: str, where: str) -> int:
    try:
        version = int(found)
    except ValueError:
        raise UnsupportedFormat(f"{where}: schema version {found!r} is not a number") from None
    if version > SCHEMA_VERSION:
        raise UnsupportedFormat(
            f"{where}: the database has schema version {version}; this version of sessionlog "
            f"reads version {SCHEMA_VERSION} (upgrade sessionlog)"
        )
    if version < 1:
        raise UnsupportedFormat(f"{where}: schema version {version} was never written by sessionlog")
    return version
