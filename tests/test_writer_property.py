"""Write-behind under any interleaving of appends, submits, cancellations and flushes.

Whatever the order, and wherever a producer's wait is cancelled: every flush returns; an
event accepted before a flush is durable when it returns; every accepted event is
written exactly once, in the order it was accepted; an append that returned a seq finds
its event at that seq."""

from __future__ import annotations

import asyncio
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionlog.backends.jsonl import open_jsonl

from sessionlog.writer import WriteBehind

EXAMPLES = 400 if os.environ.get("SESSIONLOG_SLOW") else 40

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3)),
        st.tuples(st.just("submit"), st.integers(1, 3)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("turn"), st.integers(0, 3)),
        st.tuples(st.just("flush"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, inline=st.booleans(), max_delay=st.sampled_from([0.0, 0.001]))
def test_any_interleaving_with_cancellations_writes_each_accepted_event_once_in_order(
        tmp_path_factory, ops, inline, max_delay):
    store = open_jsonl(str(tmp_path_factory.mktemp("wb")))
    store.create("s1")
    accepted: list[str] = []  # event ids, in the order the writer accepted them
    returned: dict[str, int] = {}  # an append's last event id -> the seq it returned

    def written() -> list[str]:
        return [r["id"] for r in store.read("s1") if r["type"] == "ev"]

    async def producer(ids: list[str]) -> None:
        accepted.extend(ids)  # no await between this and the writer accepting them
        returned[ids[-1]] = await w.append("s1", [{"type": "ev", "id": i} for i in ids])

    async def main() -> None:
        nonlocal w
        w = WriteBehind(store, inline=inline, max_delay=max_delay)
        tasks: list[asyncio.Task[None]] = []
        n = 0
        for op, arg in ops:
            if op in ("append", "submit"):
                ids = [f"e{n + k}" for k in range(arg)]
                n += arg
                if op == "submit":
                    w.submit("s1", [{"type": "ev", "id": i} for i in ids])
                    accepted.extend(ids)
                else:
                    tasks.append(asyncio.create_task(producer(ids)))
            elif op == "cancel":
                if tasks:
                    tasks[arg % len(tasks)].cancel()
            elif op == "turn":
                for _ in range(arg):
                    await asyncio.sleep(0)
            else:
                before = list(accepted)
                await asyncio.wait_for(w.flush("s1"), 10)  # a hang fails here
                assert written()[:len(before)] == before  # durable when flush returned
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.wait_for(w.close(), 10)

    w: WriteBehind | None = None
    asyncio.run(main())
    seqs = {r["id"]: r.seq for r in store.read("s1") if r["type"] == "ev"}
    assert written() == accepted  # each accepted event once, in acceptance order
    for last_id, seq in returned.items():
        assert seqs[last_id] == seq
