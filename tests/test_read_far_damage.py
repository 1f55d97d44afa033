"""Damage far back in a long log, beyond what opening a session checks (its tail): a
reader of the history is told, never handed the part before the damage as if it were
all of it (an agent loop would feed a model the first few messages and go on appending).
The offline tools still show, convert and restore the prefix, and say so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import sessionlog
from sessionlog import CorruptLog
from sessionlog.contract import read_prefix

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _long_session(tmp_path: Path, backend: str) -> tuple[sessionlog.EventStore, Path]:
    store = sessionlog.open_store(f"{backend}:{tmp_path}")
    store.create("s1")
    for i in range(300):  # ~1.5 MB: the damage below lies well beyond one append's reach of the end
        store.append("s1", [{"type": "user/message", "turn": f"t{i}", "content": f"m{i} " + "x" * 5000}])
    [path] = [p for p in tmp_path.iterdir() if p.name.startswith("s1.")]
    return store, path


def _damage_early(path: Path, backend: str) -> None:
    data = bytearray(path.read_bytes())
    if backend == "jsonl":
        data[data.index(b'"m3 ') + 1] = 0xFF  # invalid UTF-8 in record 5
    else:
        frames = [i for i in range(len(data) - 3) if data[i:i + 4] == ZSTD_MAGIC]
        data[(frames[5] + frames[6]) // 2] ^= 1  # frame 6 fails to decompress or its checksum
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("backend", ["jsonl", "zstd"])
def test_read_raises_at_damage_with_records_after_it(tmp_path: Path, backend: str) -> None:
    store, path = _long_session(tmp_path, backend)
    _damage_early(path, backend)
    before = path.read_bytes()
    scan = store.scan("s1")
    assert scan.damage is not None and str(scan.damage.kind) == "mid-log"

    given = []
    with pytest.raises(CorruptLog) as raised:
        for record in store.read("s1"):
            given.append(record.seq)
    assert given == list(range(1, scan.last_seq + 1))  # the prefix streamed, then the error
    err = raised.value
    assert err.kind == "mid-log" and err.offset == scan.damage.offset and err.path == str(path)
    assert f"offset {scan.damage.offset}" in str(err) and f"{scan.damage.records_after} decodable" in str(err)
    with pytest.raises(CorruptLog):
        sessionlog.project(store.read("s1"), "openai")

    # The tools that work on damaged logs read the prefix on purpose.
    assert [r.seq for r in read_prefix(store, "s1")] == given
    assert [r.seq for r in scan.records] == given
    assert path.read_bytes() == before  # nothing written by any of it

    # Once repaired with force, the log reads whole again.
    assert store.repair("s1", force=True).status == "repaired"
    assert [r.seq for r in store.read("s1")][: len(given)] == given


@pytest.mark.parametrize("backend", ["jsonl", "zstd"])
def test_a_torn_tail_still_reads_as_its_prefix(tmp_path: Path, backend: str) -> None:
    store, path = _long_session(tmp_path, backend)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 7)  # a crash in the last append: not history
    records = list(store.read("s1"))
    assert records[-1].seq == store.scan("s1").last_seq == 300


def test_agents_session_raises_instead_of_serving_part_of_the_history(tmp_path: Path) -> None:
    pytest.importorskip("agents")  # the [agents] extra; the README's test command installs [test] only
    from sessionlog.integrations.openai_agents import SessionLogSession

    async def run() -> None:
        session = SessionLogSession("conv", store=f"jsonl:{tmp_path}")
        for i in range(300):
            await session.add_items([{"role": "user", "content": f"q{i} " + "y" * 5000}])
        session.close()
        path = tmp_path / "conv.jsonl"
        data = bytearray(path.read_bytes())
        data[data.index(b'"q3 ') + 1] = 0xFF
        path.write_bytes(bytes(data))
        session = SessionLogSession("conv", store=f"jsonl:{tmp_path}")
        try:
            with pytest.raises(CorruptLog):
                await session.get_items()
            with pytest.raises(CorruptLog):
                await session.get_items(3)
        finally:
            session.close()

    asyncio.run(run())
