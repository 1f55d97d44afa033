"""The backends the contract suite runs against. A new backend joins with one entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import sessionlog


def _memory(tmp_path: Path) -> Iterator[str]:
    yield "memory:"


def _jsonl(tmp_path: Path) -> Iterator[str]:
    yield f"jsonl:{tmp_path / 'store'}"


def _zstd(tmp_path: Path) -> Iterator[str]:
    yield f"zstd:{tmp_path / 'store'}"


def _sqlite(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'store.db'}"


def _postgresql(tmp_path: Path) -> Iterator[str]:
    """A PostgreSQL schema of its own per test (dropped afterwards), so parallel runs on
    the shared server never collide. Skips without SESSIONLOG_TEST_POSTGRES_URL, fails
    instead when SESSIONLOG_REQUIRE_POSTGRES=1 (CI)."""
    import os
    import secrets

    import sqlalchemy as sa

    base = os.environ.get("SESSIONLOG_TEST_POSTGRES_URL")
    if not base:
        reason = "PostgreSQL backend: set SESSIONLOG_TEST_POSTGRES_URL (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)"
        if os.environ.get("SESSIONLOG_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"SESSIONLOG_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    schema = f"sl_test_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        yield f"{base}{'&' if '?' in base else '?'}schema={schema}"
    finally:
        engine = sa.create_engine(sa.make_url(base).set(drivername="postgresql+psycopg"))
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql("SET LOCAL lock_timeout = '30s'")
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            engine.dispose()


# name -> generator yielding a store URL for one test (and cleaning up after it)
BACKENDS = {
    "sqlite": _sqlite,
    "postgresql": _postgresql,
    "memory": _memory,
    "jsonl": _jsonl,
    "zstd": _zstd,
}


@pytest.fixture(params=sorted(BACKENDS))
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    gen = BACKENDS[request.param](tmp_path)
    url = next(gen)
    yield url
    gen.close()


@pytest.fixture
def store(store_url: str) -> Iterator[sessionlog.EventStore]:
    with sessionlog.open_store(store_url) as st:
        yield st
