"""Write-behind: a cancelled wait is not a cancelled write. An ``append()`` whose task is
cancelled (a ``wait_for`` timeout, a task group tearing down) leaves its events queued,
written once as a ``submit()``'s are; every flush and close still waits for them and
returns, and a failure to write them reaches the next flush as a submit's does."""

from __future__ import annotations

import asyncio

import pytest
from sessionlog.backends.jsonl import open_jsonl

from sessionlog import SessionLocked
from sessionlog.writer import WriteBehind


def _jsonl(tmp_path, *ids):
    store = open_jsonl(str(tmp_path))
    for sid in ids:
        store.create(sid)
    return store


def _types(store, sid="s1"):
    return [r["type"] for r in store.read(sid)]


async def _within(awaitable, seconds=5.0):
    """The awaitable's result; a hang fails the test instead of hanging it."""
    return await asyncio.wait_for(awaitable, seconds)


@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("max_delay", [0.0, 0.05])
def test_a_flush_waiting_on_a_cancelled_append_returns_once_it_is_written(tmp_path, inline, max_delay):
    store = _jsonl(tmp_path, "s1")

    async def main():
        w = WriteBehind(store, max_delay=max_delay, inline=inline)
        await w.append("s1", [{"type": "first"}])
        producer = asyncio.create_task(w.append("s1", [{"type": "x/a"}]))
        await asyncio.sleep(0)
        flushing = asyncio.create_task(w.flush("s1"))
        await asyncio.sleep(0)
        producer.cancel()
        outcome = (await asyncio.gather(producer, return_exceptions=True))[0]
        assert outcome == 3 or isinstance(outcome, asyncio.CancelledError)  # cancelled, unless already written
        await _within(flushing)  # used to wait forever
        assert _types(store)[-1] == "x/a"  # durable when the flush returned
        await _within(w.close())

    asyncio.run(main())
    assert _types(store) == ["session/start", "first", "x/a"]  # written once


@pytest.mark.parametrize("inline", [True, False])
def test_a_flush_after_a_cancelled_append_waits_for_everything_before_it(tmp_path, inline):
    store = _jsonl(tmp_path, "s1")

    async def main():
        async with WriteBehind(store, max_delay=0.05, inline=inline) as w:
            await w.append("s1", [{"type": "first"}])
            w.submit("s1", [{"type": "submitted"}])
            producer = asyncio.create_task(w.append("s1", [{"type": "cancelled"}]))
            await asyncio.sleep(0)
            producer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await producer
            await _within(w.flush("s1"))  # used to return at once, before anything was written
            assert _types(store) == ["session/start", "first", "submitted", "cancelled"]

    asyncio.run(main())


def test_an_append_that_times_out_is_written_once_and_a_flush_confirms_it(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        async with WriteBehind(store, max_delay=0.2) as w:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(w.append("s1", [{"type": "tool/call", "call_id": "c1"}]), 0.01)
            await _within(w.flush("s1"))
            # The documented way to learn the outcome: flush, then read; no retry needed.
            assert [r.get("call_id") for r in store.read("s1") if r["type"] == "tool/call"] == ["c1"]
            assert await w.append("s1", [{"type": "after"}]) == 3

    asyncio.run(main())
    assert _types(store) == ["session/start", "tool/call", "after"]


def test_close_waits_for_a_cancelled_append_instead_of_hanging(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        w = WriteBehind(store, max_delay=0.05)
        producer = asyncio.create_task(w.append("s1", [{"type": "x/a"}]))
        await asyncio.sleep(0)
        closing = asyncio.create_task(w.close())
        await asyncio.sleep(0)
        producer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await producer
        await _within(closing)

    asyncio.run(main())
    assert _types(store) == ["session/start", "x/a"]


def test_a_cancelled_append_that_cannot_be_written_is_raised_by_the_next_flush(tmp_path):
    """Once its producer stopped waiting, the failure is not lost: like a submit's, it is
    raised by the next flush (and heard by on_error)."""
    store = _jsonl(tmp_path, "s1")
    other = store.session("s1")  # another owner: the writer cannot own the session
    heard = []

    async def main():
        async with WriteBehind(store, max_delay=0.05, on_error=lambda sid, exc: heard.append(exc)) as w:
            producer = asyncio.create_task(w.append("s1", [{"type": "x/a"}]))
            await asyncio.sleep(0)
            producer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await producer
            with pytest.raises(SessionLocked):
                await _within(w.flush("s1"))
            await _within(w.flush("s1"))  # raised once

    try:
        asyncio.run(main())
    finally:
        other.close()
    assert any(isinstance(exc, SessionLocked) for exc in heard)
    assert _types(store) == ["session/start"]


def test_a_cancelled_submit_future_is_still_written_and_flushed(tmp_path):
    store = _jsonl(tmp_path, "s1")

    async def main():
        async with WriteBehind(store, max_delay=0.05) as w:
            future = w.submit("s1", [{"type": "x/a"}])
            flushing = asyncio.create_task(w.flush("s1"))
            await asyncio.sleep(0)
            future.cancel()
            await _within(flushing)
            assert _types(store) == ["session/start", "x/a"]

    asyncio.run(main())
