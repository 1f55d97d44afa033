"""Write-behind under a storm, then SIGKILL: a real child process runs many producer tasks
over several sessions, each mixing ``await append()``, ``submit()`` with random
``flush()`` barriers, and bad events; the parent kills it mid-run. Every event whose
``append()`` or covering ``flush()`` returned must be in the log, each producer's events
in its order, nothing twice, no refused event anywhere."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sessionlog

pytestmark = pytest.mark.kill

SESSIONS = 4
PRODUCERS = 32
EVENTS = 250  # per producer: 8,000 submits in all

CHILD = textwrap.dedent(
    """
    import asyncio, random, sys
    import sessionlog
    from sessionlog.writer import WriteBehind

    url, seed, sessions, producers, events = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:6])
    store = sessionlog.open_store(url)
    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        store.create(sid)
    out = sys.stdout

    def ack(p, numbers):
        if numbers:
            out.write("".join(f"{p} {i}\\n" for i in numbers))
            out.flush()

    def deep(depth):
        v = []
        for _ in range(depth):
            v = [v]
        return v

    async def producer(w, p):
        rng = random.Random(seed * 1000 + p)
        sid = ids[p % sessions]
        submitted = []  # (i, future) accepted but not yet acknowledged
        for i in range(events):
            roll = rng.random()
            if roll < 0.03:  # a bad event: refused at once, or by the store
                try:
                    w.submit(sid, [{"type": "bad", "p": p, "v": deep(rng.choice([300, 100_000]))}])
                except sessionlog.InvalidEvent:
                    pass
                continue
            event = {"type": "ev", "p": p, "i": i, "pad": "x" * rng.randrange(0, 3000)}
            if roll < 0.5:
                await w.append(sid, [event])
                ack(p, [j for j, f in submitted if not f.exception()] + [i])  # earlier ones settled first
                submitted.clear()
            else:
                submitted.append((i, w.submit(sid, [event])))
                if rng.random() < 0.2:
                    await w.flush(sid)
                    ack(p, [j for j, f in submitted if not f.exception()])
                    submitted.clear()
            if rng.random() < 0.1:
                await asyncio.sleep(0)

    async def main():
        async with WriteBehind(store) as w:
            await asyncio.gather(*(producer(w, p) for p in range(producers)))
        out.write("done\\n")
        out.flush()

    asyncio.run(main())
    """
)


def _url(kind: str, tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'db.sqlite'}" if kind == "sqlite" else f"{kind}:{tmp_path / 'store'}"


@pytest.mark.parametrize("kind", ["jsonl", "zstd", "sqlite"])
def test_acknowledged_events_survive_a_kill_in_per_producer_order(kind: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("SESSIONLOG_STORM_SEED", random.randrange(1 << 30)))
    url = _url(kind, tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(seed), str(SESSIONS), str(PRODUCERS),
                              str(EVENTS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    kill_after = random.Random(seed).randrange(500, PRODUCERS * EVENTS // 2)
    acked: dict[int, set[int]] = {}
    count = 0
    finished = False
    try:
        for line in child.stdout:
            if line == "done\n":
                finished = True
                break
            p, i = map(int, line.split())
            acked.setdefault(p, set()).add(i)
            count += 1
            if count >= kill_after:
                os.kill(child.pid, signal.SIGKILL)
                break
        for line in child.stdout:  # acknowledged before the kill landed
            if line != "done\n":
                p, i = map(int, line.split())
                acked.setdefault(p, set()).add(i)
    finally:
        child.kill()
        _, err = child.communicate(timeout=60)
    assert finished or child.returncode == -signal.SIGKILL, err
    assert count >= min(kill_after, 1), f"seed {seed}: the child acknowledged nothing: {err}"

    store = sessionlog.open_store(url)
    logged: dict[int, list[int]] = {}
    for sid in store.sessions():
        store.repair(sid)  # a torn last batch is crash damage; nothing acknowledged is in it
        for record in store.read(sid):
            assert record["type"] != "bad", f"seed {seed}: a refused event was written"
            if record["type"] == "ev":
                assert int(sid[1:]) == record["p"] % SESSIONS
                logged.setdefault(record["p"], []).append(record["i"])
    for p, numbers in logged.items():
        assert numbers == sorted(set(numbers)), f"seed {seed}: producer {p} out of order or twice"
    for p, numbers in acked.items():
        missing = numbers - set(logged.get(p, []))
        assert not missing, f"seed {seed}: producer {p} lost acknowledged events {sorted(missing)[:10]}"
    store.close()
