"""Real child processes: SIGKILL mid-append, and several processes appending to one session."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sessions import answered_exactly_once

import sessionlog

pytestmark = pytest.mark.kill

WRITER = textwrap.dedent(
    """
    import sys, sessionlog
    store = sessionlog.open_store(sys.argv[1])
    with store.session("s", create=True) as s:
        n = 0
        while True:
            n += 1
            t = f"t{n}"
            calls = [{"id": f"{t}-c{i}", "name": "tool", "arguments": {"i": i}} for i in range(3)]
            s.append([{"type": "turn/start", "turn": t}, {"type": "step/start", "turn": t, "step": 1},
                      {"type": "assistant/message", "turn": t, "step": 1, "content": None, "tool_calls": calls}])
            for c in calls:
                seq = s.append([{"type": "tool/call", "turn": t, "step": 1, "call_id": c["id"], "name": "tool"}])
                print(seq, flush=True)
                last = s.append([{"type": "tool/result", "turn": t, "step": 1, "call_id": c["id"],
                                  "output": "x" * (n * 37 % 3000), "is_error": False}])
                print(last, flush=True)
            print(s.append([{"type": "step/end", "turn": t, "step": 1, "status": "completed"},
                            {"type": "turn/end", "turn": t, "status": "completed"}]), flush=True)
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.parametrize("round_", range(int(os.environ.get("SESSIONLOG_KILL_ROUNDS", "4"))))
def test_sigkill_mid_tool_call_keeps_every_acknowledged_append(tmp_path, round_):
    url = f"jsonl:{tmp_path / 'st'}"
    child = subprocess.Popen([sys.executable, "-c", WRITER, url], stdout=subprocess.PIPE, env=_env(), text=True)
    acked = []
    deadline = time.monotonic() + random.uniform(0.2, 1.0)
    assert child.stdout is not None
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        acked.append(int(line))
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert acked, "the writer acknowledged nothing"
    store = sessionlog.open_store(url)
    res = store.scan("s")
    assert res.status in ("clean", "repairable")  # the lock died with the process
    assert res.last_seq >= max(acked)  # every acknowledged append is there
    rep = store.repair("s")
    assert rep.status in ("repaired", "clean")
    records = list(store.read("s"))
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert answered_exactly_once(records) == []
    assert store.scan("s").status == "clean"


APPENDER = textwrap.dedent(
    """
    import sys, sessionlog
    from sessionlog import SequenceConflict
    store = sessionlog.open_store(sys.argv[1], lock_timeout=30)
    me, n, mode = sys.argv[2], int(sys.argv[3]), sys.argv[4]
    for i in range(n):
        batch = [{"type": "w", "who": me, "i": i, "part": p} for p in range(3)]
        if mode == "cas":
            while True:
                last = store.scan("s").last_seq
                try:
                    seq = store.append("s", batch, expect_seq=last)
                    break
                except SequenceConflict:
                    print("conflict", flush=True)
        else:
            seq = store.append("s", batch)
        print(seq, flush=True)
    """
)


@pytest.mark.parametrize("mode", ["plain", "cas"])
def test_processes_racing_appends_serialize(tmp_path, mode):
    url = f"jsonl:{tmp_path / 'st'}"
    sessionlog.open_store(url).create("s")
    procs = [
        subprocess.Popen([sys.executable, "-c", APPENDER, url, f"p{k}", "15", mode],
                         stdout=subprocess.PIPE, env=_env(), text=True)
        for k in range(4)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    acked = [int(x) for out in outs for x in out.split() if x.isdigit()]
    assert len(acked) == 60 and len(set(acked)) == 60
    records = list(sessionlog.open_store(url).read("s"))
    assert [r["seq"] for r in records] == list(range(1, 182))
    # every batch whole and contiguous
    body = records[1:]
    for k in range(0, len(body), 3):
        batch = body[k:k + 3]
        assert {(r["who"], r["i"]) for r in batch} == {(batch[0]["who"], batch[0]["i"])}
        assert [r["part"] for r in batch] == [0, 1, 2]


REPAIRER = textwrap.dedent(
    """
    import os, signal, sys, sessionlog
    from sessionlog.durable import FileSystem

    class KilledBetweenBatches(FileSystem):
        syncs = 0

        def fdatasync(self, fd):
            super().fdatasync(fd)  # this batch of the repair is durable
            KilledBetweenBatches.syncs += 1
            if KilledBetweenBatches.syncs == int(sys.argv[2]):
                os.kill(os.getpid(), signal.SIGKILL)

    sessionlog.open_store(sys.argv[1], fs=KilledBetweenBatches()).repair("s")
    """
)


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
@pytest.mark.parametrize("killed_after", [1, 2])
def test_sigkill_between_the_batches_of_a_large_repair(tmp_path, scheme, killed_after):
    url = f"{scheme}:{tmp_path / 'st'}"
    store = sessionlog.open_store(url)
    calls = [{"id": f"call_{i:05d}", "name": "probe", "arguments": {}} for i in range(6000)]
    store.create("s", [{"type": "turn/start", "turn": "t1"}, {"type": "step/start", "turn": "t1", "step": 1},
                       {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
                        "tool_calls": calls}])
    with open(store.path_of("s"), "ab") as f:
        f.write(b'{"seq":99,"ts":1,"type":"tool/res')  # a torn tail: the repair writes a marker first
    plan = store.repair("s", dry_run=True).appended
    assert sum(len(r.raw) + 1 for r in plan) > 2 << 20  # three batches
    child = subprocess.run([sys.executable, "-c", REPAIRER, url, str(killed_after)], env=_env(), timeout=120)
    assert child.returncode == -signal.SIGKILL
    res = store.scan("s")
    assert res.damage is None and res.status == "repairable"  # a clean prefix, calls still open
    assert 0 < len(res.unanswered_calls) < 6000
    store.repair("s")
    records = list(store.read("s"))
    assert answered_exactly_once(records) == []
    assert [r["type"] for r in records].count("log/truncated") == 1
    assert store.scan("s").status == "clean"


CUT_THEN_KILLED = textwrap.dedent(
    """
    import os, signal, sys, sessionlog
    from sessionlog.durable import FileSystem

    class KilledAfterTheCut(FileSystem):
        cut = False

        def ftruncate(self, fd, size):
            super().ftruncate(fd, size)
            KilledAfterTheCut.cut = True

        def write(self, fd, data):
            if KilledAfterTheCut.cut:  # the cut is durable; the marker never lands
                os.kill(os.getpid(), signal.SIGKILL)
            return super().write(fd, data)

    sessionlog.open_store(sys.argv[1], fs=KilledAfterTheCut()).repair("s", force=True)
    """
)


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_sigkill_after_a_forced_cut_keeps_the_dropped_seqs(tmp_path, scheme):
    url = f"{scheme}:{tmp_path / 'st'}"
    store = sessionlog.open_store(url)
    store.create("s", [{"type": "turn/start", "turn": "t1"}])
    for i in range(6):
        store.append("s", [{"type": "note", "i": i, "text": "q" * 300}])
    path = store.path_of("s")
    with open(path, "rb") as f:
        original = f.read()
    # A byte flipped in the middle. In a Zstd frame a few bits are ones the decoder never
    # reads (the records, and the scan, stay as they were): the next byte then.
    flip = original.find(b'"i":2') if scheme == "jsonl" else len(original) // 2
    damage = None
    while damage is None:
        data = bytearray(original)
        data[flip] ^= 0x20
        with open(path, "wb") as f:
            f.write(data)
        damage = store.scan("s").damage
        flip += 1
    assert damage.kind == "mid-log" and damage.dropped_seqs is not None
    child = subprocess.run([sys.executable, "-c", CUT_THEN_KILLED, url], env=_env(), timeout=120)
    assert child.returncode == -signal.SIGKILL
    res = store.scan("s")
    assert res.damage is None and len(res.unmarked_quarantines) == 1
    rep = store.repair("s")
    [marker] = [r for r in rep.appended if r["type"] == "log/truncated"]
    assert tuple(marker["dropped_seqs"]) == damage.dropped_seqs
    assert marker["offset"] == damage.offset and marker["dropped_bytes"] == damage.length
    assert store.repair("s").status == "clean"
