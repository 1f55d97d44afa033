"""PostgreSQL for tests: the server's URL from SESSIONLOG_TEST_POSTGRES_URL, and a store URL
in a schema of its own per test (dropped afterwards), so parallel runs never collide.

Without the variable the tests skip with the reason; with SESSIONLOG_REQUIRE_POSTGRES=1
(CI) they fail instead."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

PG_ENV = "SESSIONLOG_TEST_POSTGRES_URL"


def postgres_base_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        reason = f"PostgreSQL tests: set {PG_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)"
        if os.environ.get("SESSIONLOG_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"SESSIONLOG_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return url


def postgres_schema_url() -> Iterator[str]:
    """Yield a store URL in a fresh schema; drop the schema when resumed."""
    base = postgres_base_url()
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
