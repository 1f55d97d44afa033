"""Write-behind: which path a write takes. A lone producer's append is written inline on
the loop (no thread, no task), after one yield that lets other producers join; what
arrives together is written together (one sync per session, one group per commit)."""

from __future__ import annotations

import asyncio
import selectors
import threading
from collections.abc import Mapping
from types import MappingProxyType

import pytest
from sessionlog.backends.jsonl import open_jsonl

import sessionlog
from sessionlog import AppendFailed, InvalidEvent, SequenceConflict
from sessionlog.writer import INLINE_SPAN, WriteBehind


class Seen:
    """A session handle seen through: the thread and size of every append."""

    def __init__(self, inner, log):
        self.inner, self.log = inner, log

    @property
    def last_seq(self):
        return self.inner.last_seq

    def append(self, events, *, expect_seq=None):
        self.log.append((threading.current_thread() is threading.main_thread(), len(events)))
        return self.inner.append(events, expect_seq=expect_seq)

    def close(self):
        self.inner.close()


class SeenStore:
    def __init__(self, store):
        self.store, self.log = store, []
        self.limits = store.limits

    def session(self, sid, **kw):
        return Seen(self.store.session(sid, **kw), self.log)


def _jsonl(tmp_path, *ids):
    store = open_jsonl(str(tmp_path))
    for sid in ids:
        store.create(sid)
    return store


def test_a_lone_producer_writes_inline_one_append_per_event(tmp_path):
    store = _jsonl(tmp_path, "s1")
    seen = SeenStore(store)

    async def main():
        async with WriteBehind(seen) as w:
            return [await w.append("s1", [{"type": "ev", "i": i}]) for i in range(30)]

    assert asyncio.run(main()) == list(range(2, 32))
    assert [r.get("i") for r in store.read("s1")] == [None, *range(30)]
    # The first write owns the session in a worker thread; every later one is inline.
    assert seen.log[0] == (False, 1)
    assert seen.log[1:] == [(True, 1)] * 29


class CountingSelector(selectors.DefaultSelector):
    """Counts the loop's turns (one select per turn: one epoll_wait on Linux)."""

    turns = 0

    def select(self, timeout=None):
        CountingSelector.turns += 1
        return super().select(timeout)


def test_a_lone_append_with_nothing_else_ready_turns_the_loop_at_most_once_a_millisecond(tmp_path):
    store = _jsonl(tmp_path, "s1")
    loop = asyncio.SelectorEventLoop(CountingSelector())
    tasks = []

    def factory(loop, coro, **kw):
        tasks.append(coro)
        return asyncio.Task(coro, loop=loop, **kw)

    async def main():
        w = WriteBehind(store)
        await w.append("s1", [{"type": "first"}])  # owns the session (in a thread)
        loop.set_task_factory(factory)
        turns = CountingSelector.turns
        start = loop.time()
        for i in range(50):
            await w.append("s1", [{"type": "ev", "i": i}])
        elapsed = loop.time() - start
        turns, CountingSelector.turns = CountingSelector.turns - turns, 0
        loop.set_task_factory(None)
        await w.close()
        return turns, elapsed

    try:
        turns, elapsed = loop.run_until_complete(main())
    finally:
        loop.close()
    # Nothing else is ready: appends are written inline, the loop turning at most once per
    # INLINE_SPAN (was: a drain task and two turns per append, then one turn per append).
    assert tasks == []
    assert 1 <= turns <= elapsed / INLINE_SPAN + 1
    assert len(list(store.read("s1"))) == 52


def test_a_tight_loop_of_lone_appends_still_runs_due_timers(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        loop = asyncio.get_running_loop()
        async with WriteBehind(store) as w:
            await w.append("s1", [{"type": "first"}])
            appended = [0]
            fired = []
            loop.call_later(0.002, lambda: fired.append(appended[0]))
            start = loop.time()
            while not fired and loop.time() - start < 10:
                await w.append("s1", [{"type": "ev"}])
                appended[0] += 1
            return fired, appended[0], loop.time() - start

    fired, appended, elapsed = asyncio.run(main())
    # The timer ran while the producer was still appending (it stops once it sees it).
    assert fired, f"the timer never ran in {elapsed:.1f} s of appends"
    assert appended in (fired[0], fired[0] + 1)
    assert elapsed < 2, f"a timer due after 2 ms ran after {elapsed:.1f} s of appends"


def test_a_lone_producer_still_lets_the_loop_run_other_tasks(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        ticks = []
        async with WriteBehind(store) as w:
            await w.append("s1", [{"type": "first"}])  # owns the session

            async def ticker():
                while True:
                    ticks.append(None)
                    await asyncio.sleep(0)

            t = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            before = len(ticks)
            for i in range(20):
                await w.append("s1", [{"type": "ev", "i": i}])
            during = len(ticks) - before
            t.cancel()
        return during

    assert asyncio.run(main()) >= 20  # one turn of the loop per append at least


def test_producers_arriving_together_are_written_together(tmp_path):
    store = _jsonl(tmp_path, "s1")
    seen = SeenStore(store)

    async def main():
        async with WriteBehind(seen) as w:
            await w.append("s1", [{"type": "first"}])

            async def producer(k):
                return [await w.append("s1", [{"type": "ev", "k": k, "i": i}]) for i in range(4)]

            return await asyncio.gather(*(producer(k) for k in range(8)))

    seqs = asyncio.run(main())
    assert sorted(s for per in seqs for s in per) == list(range(3, 35))
    # Not one inline append per event: each round of the 8 producers is one batch.
    assert [n for _, n in seen.log[1:]] == [8, 8, 8, 8]
    records = list(store.read("s1"))
    for k, per in enumerate(seqs):
        assert [records[s - 1]["i"] for s in per] == [0, 1, 2, 3]
        assert all(records[s - 1]["k"] == k for s in per)


def test_a_flush_during_the_lone_yield_waits_for_the_event(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        async with WriteBehind(store) as w:
            await w.append("s1", [{"type": "first"}])
            task = asyncio.create_task(w.append("s1", [{"type": "lone"}]))
            await asyncio.sleep(0)  # the append has queued its event and yields
            await w.flush("s1")
            assert [r["type"] for r in store.read("s1")][-1] == "lone"  # durable when flush returned
            return await task

    assert asyncio.run(main()) == 3


def test_an_append_cancelled_during_the_lone_yield_is_written_as_a_submit(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        async with WriteBehind(store) as w:
            await w.append("s1", [{"type": "first"}])
            task = asyncio.create_task(w.append("s1", [{"type": "cancelled"}]))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await w.flush("s1")
            assert await w.append("s1", [{"type": "after"}]) == 4

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "first", "cancelled", "after"]


def test_a_refusal_on_the_lone_path_fails_only_that_append(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        async with WriteBehind(store) as w:
            assert await w.append("s1", [{"type": "a"}]) == 2
            with pytest.raises(SequenceConflict):
                await w.append("s1", [{"type": "stale"}], expect_seq=1)
            # A value msgspec encodes but the store refuses (a Raw holding a newline).
            import msgspec

            with pytest.raises(InvalidEvent):
                await w.append("s1", [{"type": "bad", "v": msgspec.Raw(b'"x"\n')}])
            assert w.failure("s1") is None
            assert await w.append("s1", [{"type": "b"}], expect_seq=2) == 3

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "a", "b"]


def test_a_failed_lone_write_pauses_the_session_and_flush_retries(tmp_path):
    store = _jsonl(tmp_path, "s1")

    class FailOnce:
        def __init__(self, inner):
            self.inner, self.fail = inner, False

        @property
        def last_seq(self):
            return self.inner.last_seq

        def append(self, events, *, expect_seq=None):
            if self.fail:
                self.fail = False
                raise AppendFailed("rolled back")
            return self.inner.append(events, expect_seq=expect_seq)

        def close(self):
            self.inner.close()

    handles = []

    class Store:
        def session(self, sid, **kw):
            handles.append(FailOnce(store.session(sid, **kw)))
            return handles[-1]

    errors = []

    async def main():
        w = WriteBehind(Store(), on_error=lambda sid, exc: errors.append(exc))
        assert await w.append("s1", [{"type": "a"}]) == 2
        handles[-1].fail = True
        with pytest.raises(AppendFailed):
            await w.append("s1", [{"type": "lost"}])  # withdrawn: never written later
        assert isinstance(w.failure("s1"), AppendFailed) and errors
        with pytest.raises(AppendFailed):
            w.submit("s1", [{"type": "refused while paused"}])
        await w.flush("s1")  # nothing queued: the pause is lifted
        assert await w.append("s1", [{"type": "b"}]) == 3
        await w.close()

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "a", "b"]


# --- group commit across sessions: what is ready goes into the next commit ----------------


class Groups:
    """A real SQL store seen through: the size of every append_group and of every single
    append; ``gate`` (a threading.Event) holds the first group's commit until it is set."""

    def __init__(self, store, gate=None):
        self.store, self.groups, self.singles, self.gate = store, [], [], gate
        self.limits = store.limits

    def session(self, sid, **kw):
        return Seen(self.store.session(sid, **kw), self.singles)

    def append_group(self, items):
        self.groups.append(len(items))
        if self.gate is not None and len(self.groups) == 1:
            assert self.gate.wait(10)
        return self.store.append_group([(h.inner, e, x) for h, e, x in items])


@pytest.fixture
def sqlite_store(tmp_path):
    store = sessionlog.open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    yield store
    store.close()


def test_every_commit_carries_every_session_ready(sqlite_store):
    ids = [f"g{i:02d}" for i in range(20)]
    for sid in ids:
        sqlite_store.create(sid)
    spy = Groups(sqlite_store)

    async def main():
        async with WriteBehind(spy) as w:
            async def producer(sid):
                return [await w.append(sid, [{"type": "ev", "i": i}]) for i in range(5)]
            return await asyncio.gather(*(producer(sid) for sid in ids))

    assert asyncio.run(main()) == [[2, 3, 4, 5, 6]] * 20
    assert spy.groups == [20] * 5 and spy.singles == []  # one commit per round of the 20 producers
    for sid in ids:
        assert [r.get("i") for r in sqlite_store.read(sid)] == [None, 0, 1, 2, 3, 4]


def test_what_arrives_while_a_group_commits_goes_into_the_next_group(sqlite_store):
    ids = [f"g{i:02d}" for i in range(12)]
    for sid in ids:
        sqlite_store.create(sid)
    gate = threading.Event()
    spy = Groups(sqlite_store, gate)

    async def main():
        async with WriteBehind(spy) as w:
            first = [w.submit(sid, [{"type": "first"}]) for sid in ids[:4]]
            await asyncio.sleep(0.05)  # the first group (4 sessions) is in flight, held
            later = [w.submit(sid, [{"type": "later", "n": n}]) for sid in ids for n in range(2)]
            gate.set()
            await w.flush()
            return [f.result() for f in first], [f.result() for f in later]

    first, later = asyncio.run(main())
    assert first == [2] * 4
    assert later == [3, 4] * 4 + [2, 3] * 8
    # Everything that arrived meanwhile, from all 12 sessions, went into one commit.
    assert spy.groups == [4, 12] and spy.singles == []


class _Unreadable(Mapping):
    def __getitem__(self, key):
        raise RuntimeError("boom")

    def __iter__(self):
        return iter(["type"])

    def __len__(self):
        return 1


def test_any_mapping_is_an_event_and_one_that_fails_to_be_read_is_invalid_event(tmp_path):
    """What store.append takes, the writer takes (submit and append); an event whose own
    code fails when read is refused to its producer as InvalidEvent, never a bare error."""
    store = _jsonl(tmp_path, "s1")

    async def main():
        async with WriteBehind(store) as w:
            w.submit("s1", [MappingProxyType({"type": "submitted"})])
            assert await w.append("s1", [MappingProxyType({"type": "appended"})]) == 3
            with pytest.raises(InvalidEvent, match="event 1 of the batch: the event could not be read: RuntimeError"):
                w.submit("s1", [{"type": "fine"}, _Unreadable()])
            with pytest.raises(InvalidEvent, match="event 0 of the batch: the event could not be read: RuntimeError"):
                await w.append("s1", [_Unreadable()])

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "submitted", "appended"]
