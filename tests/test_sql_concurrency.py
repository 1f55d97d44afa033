"""The SQL backend under real OS processes: racing appends, SIGKILL mid-batch, ownership.

Every child is its own Python process with its own engine and connections (subprocess,
no fork), on a real SQLite file and a real PostgreSQL server (SESSIONLOG_TEST_POSTGRES_URL;
skipped without it unless SESSIONLOG_REQUIRE_POSTGRES=1).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres import postgres_schema_url

import sessionlog
from sessionlog import SessionLocked, Status


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    yield from postgres_schema_url()


def child(code: str, *args: Any, stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    """A fresh Python process running ``code`` with ``args`` as sys.argv[1:]."""
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True,
    )


RACER = r"""
import json, os, sys, time
import sessionlog
url, sid, worker, rounds, size, use_expect, go = sys.argv[1:]
rounds, size, use_expect = int(rounds), int(size), use_expect == "1"
store = sessionlog.open_store(url, lock_timeout=60)
while not os.path.exists(go):
    time.sleep(0.002)
last, conflicts, acks = 1, 0, []
for r in range(rounds):
    batch = [{"type": "race/x", "w": worker, "r": r, "i": i} for i in range(size)]
    while True:
        try:
            end = store.append(sid, batch, expect_seq=last) if use_expect else store.append(sid, batch)
            break
        except sessionlog.SequenceConflict as exc:
            conflicts += 1
            last = exc.found
    acks.append([end - size + 1, end])
    last = end
store.close()
print(json.dumps({"acks": acks, "conflicts": conflicts}))
"""


@pytest.mark.parametrize("use_expect", [False, True], ids=["serialize", "expect_seq"])
def test_racing_processes_append_whole_contiguous_batches(sql_url: str, tmp_path: Path, use_expect: bool) -> None:
    workers, rounds, size = 4, 12, 5
    with sessionlog.open_store(sql_url) as store:
        store.create("race")
    go = tmp_path / "go"
    procs = [child(RACER, sql_url, "race", w, rounds, size, int(use_expect), go) for w in range(workers)]
    time.sleep(0.3)
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        results.append(json.loads(out))

    with sessionlog.open_store(sql_url) as store:
        scan = store.scan("race")
        assert scan.status is Status.CLEAN and scan.damage is None
        records = list(store.read("race"))
    assert [r.seq for r in records] == list(range(1, 2 + workers * rounds * size))  # no gap, no duplicate
    by_seq = {r.seq: r for r in records}
    for w, result in enumerate(results):
        assert len(result["acks"]) == rounds
        for r, (first, last) in enumerate(result["acks"]):
            batch = [by_seq[s] for s in range(first, last + 1)]  # every acknowledged batch, whole
            assert [(b["w"], b["r"], b["i"]) for b in batch] == [(str(w), r, i) for i in range(size)]
    batches = {(r["w"], r["r"]) for r in records[1:]}
    assert len(batches) == workers * rounds
    if use_expect:
        # Everyone started expecting seq 1; one won, every other writer lost and retried.
        assert sum(r["conflicts"] for r in results) >= workers - 1


WRITER = r"""
import json, sys
import sessionlog
url, sid, first_batch, size = sys.argv[1:]
store = sessionlog.open_store(url)
with store.session(sid, timeout=30) as handle:
    b = int(first_batch)
    while True:
        end = handle.append([{"type": "kill/x", "b": b, "i": i, "pad": "p" * 200} for i in range(int(size))])
        print(json.dumps([b, end]), flush=True)
        b += 1
"""


@pytest.mark.kill
def test_sigkill_mid_batch_leaves_whole_batches(sql_url: str) -> None:
    size, kills = 400, 3
    with sessionlog.open_store(sql_url) as store:
        store.create("k1")
    acked: set[int] = set()
    for k in range(kills):
        # Each writer numbers its batches from its own base: a commit the killed writer
        # had sent may still land after the scan below (the server finishes a COMMIT it
        # received; its outcome was unknown to the writer), and must not look like the
        # next writer's batch.
        proc = child(WRITER, sql_url, "k1", k * 1_000_000, size)
        assert proc.stdout is not None
        seen = 0
        while seen < 3:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "writer died"
            acked.add(json.loads(line)[0])
            seen += 1
        time.sleep(random.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        acked.update(json.loads(line)[0] for line in out.splitlines() if line.strip())

        with sessionlog.open_store(sql_url) as store:
            scan = store.scan("k1")
            assert scan.damage is None and scan.status in (Status.CLEAN, Status.OPEN)
            records = scan.records[1:]
            groups: dict[int, list[int]] = {}
            for r in records:
                groups.setdefault(r["b"], []).append(r["i"])
            for b, items in groups.items():  # each batch wholly there...
                assert items == list(range(size)), f"batch {b} is partial"
            assert acked <= set(groups)  # ...and every acknowledged one is
            assert len(records) == size * len(groups)
    # The killed writers' ownership died with them: the session can be owned again.
    with sessionlog.open_store(sql_url) as store:
        with store.session("k1", timeout=10) as handle:
            last = handle.last_seq
        scan = store.scan("k1")
        assert scan.status is Status.CLEAN and scan.last_seq == last
        groups = {}
        for r in scan.records[1:]:
            groups.setdefault(r["b"], []).append(r["i"])
        assert all(items == list(range(size)) for items in groups.values())
        assert acked <= set(groups) and last == 1 + size * len(groups)


OWNER = r"""
import sys, time
import sessionlog
url, sid = sys.argv[1:]
store = sessionlog.open_store(url)
handle = store.session(sid)
handle.append([{"type": "turn/start", "turn": "t1"}])
print("owned", flush=True)
time.sleep(600)
"""


@pytest.mark.kill
def test_owner_in_another_process(sql_url: str) -> None:
    with sessionlog.open_store(sql_url, lock_timeout=0.2) as store:
        store.create("o1")
        proc = child(OWNER, sql_url, "o1")
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "owned"
            scan = store.scan("o1")
            assert scan.owned and scan.status is Status.OPEN and scan.open_turn == "t1"
            with pytest.raises(SessionLocked):
                store.repair("o1")
            with pytest.raises(SessionLocked):
                store.append("o1", [{"type": "x"}])
            with pytest.raises(SessionLocked):
                store.session("o1")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while store.scan("o1").owned and time.monotonic() < deadline:
            time.sleep(0.05)
        scan = store.scan("o1")
        assert not scan.owned and scan.status is Status.REPAIRABLE
        report = store.repair("o1")
        assert [r.type for r in report.appended] == ["turn/end"]


GROUPER = r"""
import json, os, sys, time
import sessionlog
url, worker, sessions, rounds, go = sys.argv[1:]
sessions, rounds = int(sessions), int(rounds)
store = sessionlog.open_store(url)
mine = [f"g{worker}-{k}" for k in range(sessions)]
handles = [store.session(sid, timeout=30) for sid in mine]
theirs = f"g{(int(worker) + 1) % 3}-0"
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
try:
    store.session(theirs, timeout=0.2)
    locked_out = False
except sessionlog.SessionLocked:
    locked_out = True
lasts = []
for r in range(rounds):
    lasts.append(store.append_group([(h, [{"type": "grp/x", "w": worker, "r": r}]) for h in handles]))
print(json.dumps({"locked_out": locked_out, "lasts": lasts}), flush=True)
time.sleep(0.5)  # keep owning until every worker has tried someone else's session
"""


def test_group_commits_from_racing_processes(sql_url: str, tmp_path: Path) -> None:
    workers, sessions, rounds = 3, 10, 15
    with sessionlog.open_store(sql_url) as store:
        for w in range(workers):
            for k in range(sessions):
                store.create(f"g{w}-{k}")
    go = tmp_path / "go"
    procs = [child(GROUPER, sql_url, w, sessions, rounds, go) for w in range(workers)]
    for p in procs:  # every worker owns its sessions before any tries another's
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert all(r["locked_out"] for r in results)  # a session has one owner across processes
    with sessionlog.open_store(sql_url) as store:
        for w, result in enumerate(results):
            assert result["lasts"] == [[2 + r] * sessions for r in range(rounds)]
            for k in range(sessions):
                records = list(store.read(f"g{w}-{k}"))
                assert [(r["w"], r["r"]) for r in records[1:]] == [(str(w), r) for r in range(rounds)]
                assert store.scan(f"g{w}-{k}").status is Status.CLEAN
