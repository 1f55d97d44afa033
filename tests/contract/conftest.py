"""The backends the contract suite runs against. A new backend joins with one entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres import postgres_schema_url

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
    yield from postgres_schema_url()


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
