"""Write-behind: accepted now, durable in batches, group commit, failures requeued in order."""

from __future__ import annotations

import asyncio
import errno
import re

import pytest
from sessionlog.backends.jsonl import open_jsonl

import sessionlog
from sessionlog import AppendFailed, StoreClosed
from sessionlog.durable import FileSystem
from sessionlog.writer import WriteBehind


class CountingFS(FileSystem):
    def __init__(self) -> None:
        self.syncs = 0
        self.fail_syncs = 0

    def fdatasync(self, fd):
        if self.fail_syncs:
            self.fail_syncs -= 1
            raise OSError(errno.EIO, "injected")
        self.syncs += 1
        super().fdatasync(fd)


def test_concurrent_producers_share_syncs(tmp_path):
    fs = CountingFS()
    store = open_jsonl(str(tmp_path), fs=fs)
    store.create("s1")

    async def main():
        async with WriteBehind(store) as w:
            async def producer(k):
                return [await w.append("s1", [{"type": "ev", "k": k, "i": i}]) for i in range(20)]
            return await asyncio.gather(*(producer(k) for k in range(16)))

    seqs = asyncio.run(main())
    flat = sorted(s for per in seqs for s in per)
    assert flat == list(range(2, 2 + 320))  # every producer got its own durable seq
    records = list(store.read("s1"))
    assert len(records) == 321
    for k, per in enumerate(seqs):
        # each producer's events are in its order, at the seqs it was told
        assert [records[s - 1]["i"] for s in per] == list(range(20))
        assert all(records[s - 1]["k"] == k for s in per)
    assert fs.syncs < 320  # group commit: fewer syncs than events


def test_submit_then_flush_is_a_checkpoint(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")

    async def main():
        w = WriteBehind(store, max_delay=0.01)
        futures = [w.submit("s1", [{"type": "chunk", "i": i}]) for i in range(50)]
        await w.flush("s1")
        assert all(f.done() for f in futures)
        assert len(list(store.read("s1"))) == 51  # durable before flush returned
        await w.close()

    asyncio.run(main())


def test_failed_batch_requeued_in_order_and_flush_raises_then_recovers(tmp_path):
    fs = CountingFS()
    store = open_jsonl(str(tmp_path), fs=fs)
    store.create("s1")
    errors = []

    async def main():
        w = WriteBehind(store, on_error=lambda sid, exc: errors.append((sid, exc)))
        fs.fail_syncs = 2
        f1 = w.submit("s1", [{"type": "a"}])
        f2 = w.submit("s1", [{"type": "b"}])
        await asyncio.sleep(0.1)
        assert errors and errors[0][0] == "s1"  # the background failure is reported
        assert not f1.done() and not f2.done()  # queued again, in order, not lost
        # The automatic path is paused; an explicit flush retries (fails once more) and raises.
        with pytest.raises(AppendFailed):
            await w.flush("s1")
        assert [r["type"] for r in store.read("s1")] == ["session/start"]
        await w.flush("s1")  # the disk is back: the queue drains, in order
        assert (await f1, await f2) == (2, 3)
        await w.close()

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "a", "b"]


def test_close_stops_admission(tmp_path):
    store = sessionlog.open_store("memory:")
    store.create("s1")

    async def main():
        w = WriteBehind(store)
        w.submit("s1", [{"type": "x"}])
        await w.close()
        with pytest.raises(StoreClosed):
            w.submit("s1", [{"type": "y"}])

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "x"]


def test_writer_owns_its_sessions_until_closed(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")

    async def main():
        async with WriteBehind(store) as w:
            await w.append("s1", [{"type": "x"}])
            assert store.scan("s1").status == "open"
        assert store.scan("s1").status == "clean"

    asyncio.run(main())


REFUSED = [
    pytest.param([{"no": "type"}], id="no-type"),
    pytest.param([{"type": ""}], id="empty-type"),
    pytest.param([{"type": "ok", "seq": 7}], id="own-seq"),
    pytest.param([{"type": "ok", "ts": "noon"}], id="ts-not-a-number"),
    pytest.param([{"type": "ok", 1: "int key"}], id="non-str-key"),
    pytest.param([{"type": "ok", "v": object()}], id="not-serializable"),
    pytest.param([{"type": "ok", "v": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
        ]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}], id="nested-too-deep"),
    pytest.param([{"type": "ok"}, "not a mapping"], id="not-a-mapping"),
    pytest.param([{"type": "ok", "pad": "x" * 5000}], id="over-the-record-limit"),
]


@pytest.mark.parametrize("events", REFUSED)
@pytest.mark.parametrize("how", ["submit", "append"])
def test_events_the_store_would_refuse_are_refused_to_their_producer(tmp_path, events, how):
    """Whatever ``store.append`` refuses, the write-behind refuses to its producer, naming
    the event, and writes nothing of the batch: ``submit`` at once (a producer that
    submits and moves on never loses events silently), ``append`` when it is written."""
    from sessionlog.scan import Limits

    store = open_jsonl(str(tmp_path), limits=Limits(record_limit=4096))
    store.create("s1")
    with pytest.raises(sessionlog.InvalidEvent) as direct:
        store.append("s1", events)
    errors = []

    async def main():
        async with WriteBehind(store, max_delay=0.01, on_error=lambda sid, exc: errors.append(exc)) as w:
            good = w.submit("s1", [{"type": "ok", "i": 1}])
            with pytest.raises(sessionlog.InvalidEvent) as refused:
                if how == "submit":
                    w.submit("s1", events)
                else:
                    await w.append("s1", events)
            good2 = w.submit("s1", [{"type": "ok", "i": 2}])
            await w.flush("s1")
            assert (await good, await good2) == (2, 3)
            return refused.value

    refused = asyncio.run(main())
    if how == "submit":  # the store's own words, naming the event (a size is measured at seq 1)
        assert re.sub(r"\d+ bytes", "N bytes", str(refused)) == re.sub(r"\d+ bytes", "N bytes", str(direct.value))
    assert [r.get("i") for r in store.read("s1")] == [None, 1, 2]
    assert errors == []


def test_a_record_pushed_over_the_limit_by_its_seq_fails_only_its_producer(tmp_path):
    """The one refusal left for the write itself: a record that fits the record limit at
    seq 1 (where it was checked) and not at its real seq. Its future fails, ``on_error``
    hears of it (its producer may have moved on), the others are written in order."""
    from sessionlog.events import encode_record
    from sessionlog.scan import Limits

    event = {"type": "ok", "ts": 1_764_000_000.25, "pad": "x" * 200}  # its own ts: a known length
    at_one = len(encode_record(event, 1))
    store = open_jsonl(str(tmp_path), limits=Limits(record_limit=at_one))
    store.create("s1", [{"type": "x"}] * 8)  # the next seq is 10: one digit more
    errors = []

    async def main():
        async with WriteBehind(store, max_delay=0.01, on_error=lambda sid, exc: errors.append(exc)) as w:
            good = w.submit("s1", [{"type": "ok", "i": 1}])
            bad = w.submit("s1", [event])
            good2 = w.submit("s1", [{"type": "ok", "i": 2}])
            await w.flush("s1")  # a producer's own refusal is not the session's failure
            assert await good == 10
            with pytest.raises(sessionlog.InvalidEvent, match="record limit"):
                await bad
            assert await good2 == 11
            return bad.exception()

    refused = asyncio.run(main())
    assert errors == [refused]
    assert [r.get("i") for r in store.read("s1")][-2:] == [1, 2]


class Handle:
    """A real session handle whose next appends fail as told (the engine's own errors)."""

    def __init__(self, inner, failures):
        self.inner, self.failures = inner, failures  # shared: each failure happens once

    @property
    def last_seq(self):
        return self.inner.last_seq

    def append(self, events, *, expect_seq=None):
        if self.failures:
            exc = self.failures.pop(0)
            if exc is not None:
                if getattr(exc, "outcome_unknown", False):
                    self.inner.append(events)  # the commit happened; its reply was lost
                raise exc
        return self.inner.append(events, expect_seq=expect_seq)

    def close(self):
        self.inner.close()


class ScriptedStore:
    def __init__(self, store, failures):
        self.store, self.failures = store, failures

    def session(self, sid, **kw):
        return Handle(self.store.session(sid, **kw), self.failures)


def test_unknown_outcome_is_never_written_again(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")
    unknown = AppendFailed("commit reply lost", outcome_unknown=True)
    scripted = ScriptedStore(store, [unknown])

    async def main():
        w = WriteBehind(scripted)
        with pytest.raises(AppendFailed) as info:
            await w.append("s1", [{"type": "tool/call", "call_id": "c1"}])
        assert info.value.outcome_unknown
        with pytest.raises(AppendFailed):
            w.submit("s1", [{"type": "later"}])
        with pytest.raises(AppendFailed):
            await w.flush("s1")
        with pytest.raises(AppendFailed):
            await w.close()

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "tool/call"]  # once


def test_paused_session_refuses_new_events_at_once(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")
    failed = AppendFailed("rolled back")
    scripted = ScriptedStore(store, [failed])

    async def main():
        w = WriteBehind(scripted)
        first = w.submit("s1", [{"type": "a"}])
        await asyncio.sleep(0.1)
        assert w.failure("s1") is failed
        with pytest.raises(AppendFailed):
            await asyncio.wait_for(w.append("s1", [{"type": "tool/call"}]), 1.0)  # no hang
        assert not first.done()  # not told it failed: it is still queued
        await w.flush("s1")
        assert await first == 2
        await w.close()

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "a"]


def test_close_fails_and_drops_what_cannot_be_written(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")
    scripted = ScriptedStore(store, [AppendFailed("1"), AppendFailed("2"), AppendFailed("3")])

    async def main():
        w = WriteBehind(scripted)
        f = w.submit("s1", [{"type": "a"}])
        await asyncio.sleep(0.1)
        with pytest.raises(AppendFailed):
            await w.close()
        with pytest.raises(AppendFailed):
            await f

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start"]


def test_an_error_while_isolating_an_invalid_event_keeps_the_rest_queued(tmp_path):
    from sessionlog.scan import Limits

    store = open_jsonl(str(tmp_path), limits=Limits(record_limit=4096))
    store.create("s1")
    # the grouped batch is refused (a record over the store's limit: the scripted store
    # does not say its limits, so submit checked the default ones), then the first
    # single write fails
    scripted = ScriptedStore(store, [None, AppendFailed("disk hiccup")])

    async def main():
        w = WriteBehind(scripted, max_delay=0.02)
        good = w.submit("s1", [{"type": "ok", "i": 1}])
        bad = w.submit("s1", [{"type": "big", "pad": "x" * 5000}])
        good2 = w.submit("s1", [{"type": "ok", "i": 2}])
        await asyncio.sleep(0.2)
        assert not good.done() and not good2.done()
        await w.flush("s1")
        assert (await good, await good2) == (2, 3)
        with pytest.raises(sessionlog.InvalidEvent):
            await bad
        await w.close()

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "ok", "ok"]


def test_close_cancelled_mid_write_waits_for_the_write_and_keeps_the_cancellation(tmp_path):
    import threading

    store = open_jsonl(str(tmp_path))
    store.create("s1")
    gate = threading.Event()

    class SlowFS(FileSystem):
        def fdatasync(self, fd):
            gate.wait(5)
            super().fdatasync(fd)

    slow = open_jsonl(str(tmp_path), fs=SlowFS())

    async def main():
        w = WriteBehind(slow)
        f = w.submit("s1", [{"type": "a"}])
        await asyncio.sleep(0.05)  # the write is in its thread, waiting on the sync
        closing = asyncio.ensure_future(w.close())
        await asyncio.sleep(0.05)
        closing.cancel()
        await asyncio.sleep(0.05)
        assert store.scan("s1").status == "open"  # the writer still owns the session
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await closing
        assert await f == 2  # the write landed and its producer was told so

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "a"]
    assert store.scan("s1").status == "clean"


# --- issue 10: write-behind that never starves or hangs ----------------------------------


class SlowSyncFS(FileSystem):
    """Every sync takes a little while, so a busy session always has a queue."""

    def __init__(self, delay: float = 0.002) -> None:
        self.delay = delay
        self.syncs = 0
        self.largest_write = 0

    def write(self, fd, data):
        self.largest_write = max(self.largest_write, len(data))
        return super().write(fd, data)

    def fdatasync(self, fd):
        import time

        time.sleep(self.delay)
        self.syncs += 1
        super().fdatasync(fd)


def test_flush_is_a_barrier_on_what_was_accepted_before_it_however_busy(tmp_path):
    store = open_jsonl(str(tmp_path), fs=SlowSyncFS())
    store.create("s1")

    async def main():
        async with WriteBehind(store) as w:
            stop = asyncio.Event()
            outstanding = [0]  # chatter accepted and not yet written

            def written(_):
                outstanding[0] -= 1

            async def busy(k):
                i = 0
                while not stop.is_set():
                    # The queue never empties, and never grows without bound either: an
                    # unbounded one makes this a test of the garbage collector's patience.
                    if outstanding[0] < 4096:
                        outstanding[0] += 1
                        w.submit("s1", [{"type": "chatter", "k": k, "i": i}]).add_done_callback(written)
                        i += 1
                    await asyncio.sleep(0)

            chatter = [asyncio.create_task(busy(k)) for k in range(4)]
            # More than a batch waits behind the write in flight (waited for, not slept
            # for: a loaded machine submits fewer in a given time).
            deadline = asyncio.get_running_loop().time() + 30
            while outstanding[0] <= 1024:
                assert asyncio.get_running_loop().time() < deadline, outstanding[0]
                await asyncio.sleep(0.005)
            marker = w.submit("s1", [{"type": "marker"}])
            await asyncio.wait_for(w.flush("s1"), 30)  # returns although the queue never empties
            assert outstanding[0] > 0
            seq = marker.result()
            assert [r["type"] for r in store.read("s1", after_seq=seq - 1)][:1] == ["marker"]  # durable
            stop.set()
            await asyncio.gather(*chatter)
            return seq

    seq = asyncio.run(main())
    assert store.scan("s1").last_seq >= seq
    assert [r for r in store.read("s1", after_seq=seq - 1)][0]["type"] == "marker"


def test_submit_and_flush_per_producer_groups_like_append(tmp_path):
    fs = CountingFS()
    store = open_jsonl(str(tmp_path), fs=fs)
    store.create("s1")

    async def main():
        async with WriteBehind(store) as w:
            async def producer(k):
                for i in range(10):
                    w.submit("s1", [{"type": "ev", "k": k, "i": i}])
                    await w.flush("s1")
            await asyncio.gather(*(producer(k) for k in range(32)))

    asyncio.run(main())
    records = list(store.read("s1"))
    assert len(records) == 321
    assert fs.syncs < 320 // 4  # producers share syncs: a flush does not wait for the others' later events
    for k in range(32):
        assert [r["i"] for r in records if r.get("k") == k] == list(range(10))


def test_append_to_a_session_another_handle_owns_raises_session_locked_promptly(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")
    owner = store.session("s1")

    async def main():
        async with WriteBehind(store) as w:
            with pytest.raises(sessionlog.SessionLocked):
                await asyncio.wait_for(w.append("s1", [{"type": "a"}]), 5)
            queued = w.submit("s1", [{"type": "b"}])
            with pytest.raises(sessionlog.SessionLocked):
                await asyncio.wait_for(w.flush("s1"), 5)
            with pytest.raises(sessionlog.SessionLocked):
                await queued
            owner.close()  # the owner lets go: the next event owns the session
            assert await w.append("s1", [{"type": "c"}]) == 2

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "c"]


def test_lock_wait_waits_for_the_owner_to_let_go(tmp_path):
    import threading

    store = open_jsonl(str(tmp_path))
    store.create("s1")
    owner = store.session("s1")
    threading.Timer(0.2, owner.close).start()

    async def main():
        async with WriteBehind(store, lock_wait=10) as w:
            return await asyncio.wait_for(w.append("s1", [{"type": "a"}]), 10)

    assert asyncio.run(main()) == 2


def _nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_deeply_nested_event_fails_only_its_producer(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")

    async def main():
        async with WriteBehind(store, max_delay=0.01) as w:
            goods = [w.submit("s1", [{"type": "ok", "i": i}]) for i in range(3)]
            with pytest.raises(sessionlog.InvalidEvent):  # cannot even be encoded: refused at once
                w.submit("s1", [{"type": "deep", "v": _nested(100_000)}])
            with pytest.raises(sessionlog.InvalidEvent, match="deeper than 128"):  # encodes; the store would refuse it
                w.submit("s1", [{"type": "deep", "v": _nested(300)}])
            goods += [w.submit("s1", [{"type": "ok", "i": i}]) for i in range(3, 6)]
            await w.flush("s1")
            return [await g for g in goods]

    assert asyncio.run(main()) == [2, 3, 4, 5, 6, 7]
    assert [r.get("i") for r in store.read("s1")][1:] == [0, 1, 2, 3, 4, 5]


def test_a_store_error_that_is_not_a_session_log_error_is_an_invalid_event_of_one_producer(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")

    class Picky:
        def __init__(self, inner):
            self.inner = inner

        @property
        def last_seq(self):
            return self.inner.last_seq

        def append(self, events, *, expect_seq=None):
            if any(e.get("poison") for e in events):
                raise RecursionError("maximum recursion depth exceeded while serializing an object")
            return self.inner.append(events, expect_seq=expect_seq)

        def close(self):
            self.inner.close()

    class PickyStore:
        def session(self, sid, **kw):
            return Picky(store.session(sid, **kw))

    async def main():
        w = WriteBehind(PickyStore(), max_delay=0.01)
        futures = [w.submit("s1", [{"type": "ok", "i": i, "poison": i == 5}]) for i in range(12)]
        await w.flush("s1")
        await w.close()  # nothing but the one producer failed
        out = []
        for f in futures:
            try:
                out.append(await f)
            except sessionlog.InvalidEvent as exc:
                assert isinstance(exc.__cause__, RecursionError)
                out.append("refused")
        return out

    out = asyncio.run(main())
    assert out == [2, 3, 4, 5, 6, "refused", 7, 8, 9, 10, 11, 12]
    assert [r.get("i") for r in store.read("s1")][1:] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]


def test_batches_are_bounded_by_bytes_no_cliff_into_one_sync_per_event(tmp_path):
    fs = SlowSyncFS(delay=0.0)
    store = open_jsonl(str(tmp_path), fs=fs)
    store.create("s1")
    text = "x" * 2100

    async def main():
        async with WriteBehind(store, max_delay=0.01) as w:
            await asyncio.gather(*(w.append("s1", [{"type": "big", "k": k, "t": text}]) for k in range(512)))

    asyncio.run(main())
    assert len(list(store.read("s1"))) == 513
    assert fs.syncs <= 6  # about 1.1 MB in ~1 MiB batches, not 512 syncs
    assert fs.largest_write <= store.limits.batch_limit


def test_an_awaiting_producer_is_told_at_once_when_the_session_pauses(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")
    scripted = ScriptedStore(store, [AppendFailed("rolled back")])

    async def main():
        w = WriteBehind(scripted, max_delay=0.01)
        submitted = w.submit("s1", [{"type": "submitted"}])
        with pytest.raises(AppendFailed):
            await asyncio.wait_for(w.append("s1", [{"type": "awaited"}]), 5)
        await w.flush("s1")  # retried: the submitted event is written, the awaited one was withdrawn
        assert await submitted == 2
        await w.close()

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "submitted"]


# --- group commit across sessions (stores with append_group: SQL) -----------------------


class GroupSpy:
    """A real SQL store, seen through: records the size of every append_group call and
    can make one group's commit reply go missing (after it committed)."""

    def __init__(self, store, lose_reply_of_group=None, limits=None):
        self.store, self.groups, self.lose = store, [], lose_reply_of_group
        self.limits = limits or store.limits  # what it tells the write-behind to check at submit

    def session(self, sid, **kw):
        return self.store.session(sid, **kw)

    def append_group(self, items):
        self.groups.append(len(items))
        lasts = self.store.append_group(items)
        if self.lose is not None and len(self.groups) == self.lose:
            raise AppendFailed("the commit's reply was lost", outcome_unknown=True)
        return lasts


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_store(request, tmp_path):
    if request.param == "sqlite":
        store = sessionlog.open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
        yield store
        store.close()
    else:
        from postgres import postgres_schema_url  # tests/postgres.py

        urls = postgres_schema_url()
        store = sessionlog.open_store(next(urls))
        yield store
        store.close()
        next(urls, None)  # drops the schema


def test_ready_batches_of_many_sessions_share_one_group_commit(sql_store):
    ids = [f"g{i:02d}" for i in range(20)]
    for sid in ids:
        sql_store.create(sid)
    spy = GroupSpy(sql_store)

    async def main():
        async with WriteBehind(spy) as w:
            async def producer(sid):
                return [await w.append(sid, [{"type": "ev", "i": i}]) for i in range(5)]
            return await asyncio.gather(*(producer(sid) for sid in ids))

    seqs = asyncio.run(main())
    assert seqs == [[2, 3, 4, 5, 6]] * 20
    for sid in ids:
        assert [r.get("i") for r in sql_store.read(sid)] == [None, 0, 1, 2, 3, 4]
    assert max(spy.groups) > 1 and sum(spy.groups) > len(spy.groups) * 2  # sessions shared transactions


def test_a_refused_batch_in_a_group_fails_only_its_producer(sql_store):
    ids = [f"b{i}" for i in range(6)]
    for sid in ids:
        sql_store.create(sid)
    from sessionlog.scan import Limits

    # The spy says it takes records of up to 2 MiB; the store behind it refuses them
    # over 1 MiB, when the group is written.
    spy = GroupSpy(sql_store, limits=Limits(record_limit=2 << 20, batch_limit=2 << 20))

    async def main():
        async with WriteBehind(spy, max_delay=0.02) as w:
            await asyncio.gather(*(w.append(sid, [{"type": "warm"}]) for sid in ids))  # own every session
            futures = {sid: w.submit(sid, [{"type": "ok"}]) for sid in ids}
            bad = w.submit("b3", [{"type": "big", "pad": "x" * (1200 << 10)}])  # the store refuses it
            after = w.submit("b3", [{"type": "after"}])
            await w.flush()
            with pytest.raises(sessionlog.InvalidEvent):
                await bad
            return {sid: await f for sid, f in futures.items()}, await after

    seqs, after = asyncio.run(main())
    assert seqs == {sid: 3 for sid in ids} and after == 4
    assert [r["type"] for r in sql_store.read("b3")] == ["session/start", "warm", "ok", "after"]
    assert any(n > 1 for n in spy.groups)


def test_a_group_whose_outcome_is_unknown_is_never_written_again(sql_store):
    ids = [f"u{i}" for i in range(4)]
    for sid in ids:
        sql_store.create(sid)
    spy = GroupSpy(sql_store, lose_reply_of_group=2)

    async def main():
        w = WriteBehind(spy, max_delay=0.02)
        await asyncio.gather(*(w.append(sid, [{"type": "warm"}]) for sid in ids))  # group 1
        results = await asyncio.gather(*(w.append(sid, [{"type": "maybe"}]) for sid in ids),
                                       return_exceptions=True)  # group 2: reply lost
        assert all(isinstance(r, AppendFailed) and r.outcome_unknown for r in results)
        with pytest.raises(AppendFailed):
            w.submit(ids[0], [{"type": "later"}])  # the session refuses new events
        with pytest.raises(AppendFailed):
            await w.close()

    asyncio.run(main())
    assert spy.groups[:2] == [4, 4]
    for sid in ids:  # committed once, never appended again
        assert [r["type"] for r in sql_store.read(sid)] == ["session/start", "warm", "maybe"]


def test_a_session_owned_elsewhere_fails_alone_in_a_group(sql_store):
    ids = [f"o{i}" for i in range(4)]
    for sid in ids:
        sql_store.create(sid)
    owner = sql_store.session("o2")
    spy = GroupSpy(sql_store)

    async def main():
        async with WriteBehind(spy) as w:
            return await asyncio.gather(*(w.append(sid, [{"type": "ev"}]) for sid in ids), return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        owner.close()
    assert isinstance(results[2], sessionlog.SessionLocked)
    assert [results[i] for i in (0, 1, 3)] == [2, 2, 2]
    assert [r["type"] for r in sql_store.read("o2")] == ["session/start"]


def test_flush_and_close_raise_only_session_log_errors(tmp_path):
    store = open_jsonl(str(tmp_path))
    store.create("s1")

    class Broken:
        def session(self, sid, **kw):
            raise RuntimeError("driver exploded")  # not the engine's own error

    async def main():
        w = WriteBehind(Broken())
        queued = w.submit("s1", [{"type": "a"}])
        with pytest.raises(sessionlog.SessionLogError) as info:
            await asyncio.wait_for(w.flush("s1"), 5)
        assert isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(sessionlog.SessionLogError):
            await w.close()
        with pytest.raises(sessionlog.SessionLogError):
            await queued

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start"]


@pytest.mark.parametrize("own_ts", [False, True])
def test_submitted_events_are_written_as_they_were_when_submitted(tmp_path, own_ts):
    """A producer that reuses or changes its dicts after submit() (a buffer it refills,
    a message it goes on editing) still gets what it submitted written; an event it
    makes invalid afterwards is not dropped."""
    store = open_jsonl(str(tmp_path))
    store.create("s1")

    async def main():
        async with WriteBehind(store, max_delay=0.05) as w:
            event = {"type": "note", "text": "first", "tags": ["a"], "meta": {"n": 1}}
            if own_ts:
                event["ts"] = 1700000000.5
            futures = [w.submit("s1", [event])]
            event["text"] = "second"
            event["tags"].append("b")
            event["meta"]["n"] = 2
            futures.append(w.submit("s1", [event]))
            event["tags"].append(object())  # no longer serializable, after it was submitted
            del event["type"]
            await w.flush("s1")
            return [f.result() for f in futures]

    assert asyncio.run(main()) == [2, 3]
    records = list(store.read("s1"))[1:]
    assert [(r["text"], r["tags"], r["meta"]) for r in records] == [("first", ["a"], {"n": 1}),
                                                                     ("second", ["a", "b"], {"n": 2})]
    if own_ts:
        assert [r.ts for r in records] == [1700000000.5, 1700000000.5]


def test_submitted_events_lost_to_another_owner_are_raised_by_the_next_flush_and_close(tmp_path):
    """Submitted events that fail because another handle owns the session, while no
    flush waits, are not lost silently: the next flush raises why, and so does close."""
    store = open_jsonl(str(tmp_path))
    store.create("s1")
    store.create("s2")
    owner = store.session("s1")

    async def main():
        w = WriteBehind(store)
        queued = w.submit("s1", [{"type": "b"}])
        with pytest.raises(sessionlog.SessionLocked):
            await asyncio.wait_for(asyncio.shield(queued), 5)
        await asyncio.sleep(0.01)
        with pytest.raises(sessionlog.SessionLocked):
            await w.flush("s1")
        await w.flush("s1")  # raised once: nothing more was lost since
        w.submit("s1", [{"type": "c"}])
        await asyncio.sleep(0.05)
        w.submit("s2", [{"type": "d"}])
        with pytest.raises(sessionlog.SessionLocked):
            await w.close()

    asyncio.run(main())
    owner.close()
    assert [r["type"] for r in store.read("s1")] == ["session/start"]
    assert [r["type"] for r in store.read("s2")] == ["session/start", "d"]


def test_submitted_raw_values_are_written_byte_for_byte(tmp_path):
    """A msgspec.Raw member is written as given through submit() too (not parsed and
    spelled again), and one the store takes is never refused by submit."""
    import msgspec

    raws = [b"[1, 2]", b"1e2", b"1.50", b'"\\u00e9"', b'{"b":1, "a":2}', b'{"a":1,"a":2}', b"1e400"]
    direct = open_jsonl(str(tmp_path / "direct"))
    direct.create("s1")
    via = open_jsonl(str(tmp_path / "via"))
    via.create("s1")
    events = [{"type": "x", "v": msgspec.Raw(raw), "ts": 1700000000.25} for raw in raws]
    direct.append("s1", events)

    async def main():
        async with WriteBehind(via) as w:
            w.submit("s1", events)

    asyncio.run(main())
    assert [r.raw for r in via.read("s1")][1:] == [r.raw for r in direct.read("s1")][1:]
