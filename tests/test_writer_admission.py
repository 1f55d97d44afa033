"""Write-behind admission: the writer takes what ``store.append`` takes and refuses, at
once and with the store's own error, what it refuses; a tool output the store cannot hold
is answered, not left "maybe ran"."""

from __future__ import annotations

import asyncio
import re

import pytest

import sessionlog
from sessionlog import InvalidEvent, InvalidSessionId, check_pairing, dispatch_tools, project
from sessionlog.events import encode_record
from sessionlog.recovery import TOOL_OUTPUT_NOT_RECORDED
from sessionlog.scan import encode_batch
from sessionlog.writer import WriteBehind

KINDS = ["jsonl", "zstd", "sqlite"]
TS = 1_764_000_000.25  # every event brings its own ts: a record's bytes do not depend on the clock


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    if request.param == "sqlite":
        store = sessionlog.open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    else:
        store = sessionlog.open_store(f"{request.param}:{tmp_path / 'logs'}")
    yield store
    store.close()


class Watched:
    """A real store, seen through: every batch the write-behind hands it, and every batch
    it refused (the writer's grouping must never build one the store refuses)."""

    def __init__(self, store):
        self.store, self.limits, self.refused = store, store.limits, []
        if hasattr(store, "append_group"):
            self.append_group = self._append_group

    def session(self, sid, **kw):
        return WatchedHandle(self.store.session(sid, **kw), self.refused)

    def read(self, sid, **kw):
        return self.store.read(sid, **kw)

    def _append_group(self, items):
        try:
            return self.store.append_group([(h.inner, e, x) for h, e, x in items])
        except InvalidEvent as exc:
            self.refused.append(exc)
            raise


class WatchedHandle:
    def __init__(self, inner, refused):
        self.inner, self.refused = inner, refused

    @property
    def last_seq(self):
        return self.inner.last_seq

    def append(self, events, *, expect_seq=None):
        try:
            return self.inner.append(events, expect_seq=expect_seq)
        except InvalidEvent as exc:
            self.refused.append(exc)
            raise

    def close(self):
        self.inner.close()


def padded(size_at_seq_1: int, **fields) -> dict:
    """An event whose record at seq 1 is ``size_at_seq_1`` bytes."""
    event = {"type": "tool/result", "ts": TS, **fields, "output": ""}
    event["output"] = "x" * (size_at_seq_1 - len(encode_record(event, 1)))
    assert len(encode_record(event, 1)) == size_at_seq_1
    return event


def taken_cases(limits):
    record, batch = limits.record_limit, limits.batch_limit
    many = [padded(10_300, i=i) for i in range(100)]  # over the writer's grouping bound, within one batch
    assert sum(len(line) + 1 for line in encode_batch(many, 100, limits)) < batch
    return {
        "one-million-byte-output": [{"type": "tool/result", "ts": TS, "output": "x" * 1_000_000}],
        # its line and newline 3 bytes short of the batch limit at seq 1: within it at any seq below 1,000
        "a-record-near-the-limit": [padded(min(record, batch - 1) - 3)],
        "many-events-together": many,
    }


@pytest.mark.parametrize("how", ["submit", "append"])
@pytest.mark.parametrize("case", ["one-million-byte-output", "a-record-near-the-limit", "many-events-together"])
def test_whatever_store_append_takes_the_writer_takes_and_writes_as_it_is(store, case, how):
    """Events ``store.append`` takes in one call are taken by ``submit`` and ``append``,
    written as they are (alone in their batch when they do not fit the writer's grouping
    bound), between other producers' events, in order; no batch the writer builds, alone
    or in a group commit of several sessions, is refused by the store."""
    events = taken_cases(store.limits)[case]
    sessions = ["w1", "w2", "w3"]
    for sid in ["direct", *sessions]:
        store.create(sid)
    store.append("direct", events)
    watched, errors = Watched(store), []

    async def main():
        async with WriteBehind(watched, on_error=lambda sid, exc: errors.append(exc)) as w:
            if how == "submit":
                for sid in sessions:
                    w.submit(sid, [{"type": "before", "ts": TS}])
                    w.submit(sid, events)
                    w.submit(sid, [{"type": "after", "ts": TS}])
                await w.flush()
            else:
                async def producer(sid):
                    await w.append(sid, [{"type": "before", "ts": TS}])
                    await asyncio.gather(w.append(sid, events), w.append(sid, [{"type": "after", "ts": TS}]))
                await asyncio.gather(*(producer(sid) for sid in sessions))

    asyncio.run(main())
    assert watched.refused == [] and errors == []
    expected = [{k: v for k, v in r.items() if k != "seq"} for r in store.read("direct")][1:]
    for sid in sessions:
        records = [{k: v for k, v in r.items() if k != "seq"} for r in store.read(sid)][1:]
        assert [r["type"] for r in records] == ["before", *(e["type"] for e in events), "after"]
        assert records[1:-1] == expected  # written as store.append writes them


def refused_cases(limits):
    record, batch = limits.record_limit, limits.batch_limit
    return {
        "over-the-record-limit": [{"type": "ok", "ts": TS}, padded(record + 1)],
        # each record fits; together they are over one append's batch limit
        "over-the-batch-limit-together": [padded(10_000, i=i) for i in range(batch // 10_000 + 2)],
        # the record is within the record limit; with its newline it is over the batch limit
        "a-record-and-newline-over-the-batch-limit": [padded(min(record, batch))],
    }


@pytest.mark.parametrize("how", ["submit", "append"])
@pytest.mark.parametrize("case", ["over-the-record-limit", "over-the-batch-limit-together",
                                  "a-record-and-newline-over-the-batch-limit"])
def test_whatever_store_append_refuses_the_writer_refuses_with_the_stores_error(store, case, how):
    """Events ``store.append`` refuses are refused to their producer with the store's own
    InvalidEvent: by ``submit`` at once (nothing queued; a size in it measured at seq 1), by
    ``append`` when written, word for word; nothing of them is written, and the other producers' events are."""
    events = refused_cases(store.limits)[case]
    for sid in ("direct", "s1"):
        store.create(sid, [{"type": "warm", "ts": TS}])  # the next seqs: 3 and on, in both
    with pytest.raises(InvalidEvent) as direct:
        store.append("direct", events)
    errors = []

    async def main():
        async with WriteBehind(store, on_error=lambda sid, exc: errors.append(exc)) as w:
            with pytest.raises(InvalidEvent) as refused:
                if how == "submit":
                    w.submit("s1", events)
                else:
                    await w.append("s1", events)
            good = w.submit("s1", [{"type": "good", "ts": TS}])
            await w.flush("s1")
            assert await good == 3
            return refused.value

    refused = asyncio.run(main())
    if how == "submit":  # measured at seq 1 (its real seq is not known yet): the sizes may differ
        assert re.sub(r"\d+ bytes", "N bytes", str(refused)) == re.sub(r"\d+ bytes", "N bytes", str(direct.value))
    else:
        assert str(refused) == str(direct.value)
    assert [r["type"] for r in store.read("s1")] == ["session/start", "warm", "good"]
    assert errors == []


@pytest.mark.parametrize("bad", ["bad id!", "..", "a..b", "", "-x", "a/b", "x" * 129, "caf\u00e9"])
def test_an_invalid_session_id_is_refused_at_once_and_nothing_is_queued(store, bad):
    """``submit`` and ``append`` refuse an id the store refuses, with its InvalidSessionId,
    before anything is queued: flush and close then succeed, and the writer's other
    sessions are written."""
    store.create("s1")
    with pytest.raises(InvalidSessionId) as direct:
        store.append(bad, [{"type": "x"}])
    errors = []

    async def main():
        w = WriteBehind(store, on_error=lambda sid, exc: errors.append(exc))
        with pytest.raises(InvalidSessionId) as submitted:
            w.submit(bad, [{"type": "x"}])
        with pytest.raises(InvalidSessionId) as appended:
            await w.append(bad, [{"type": "x"}])
        good = w.submit("s1", [{"type": "good"}])
        await w.flush()
        await w.flush(bad)
        await w.close()  # raises nothing: nothing of the bad id was queued
        assert await good == 2
        return str(submitted.value), str(appended.value)

    assert asyncio.run(main()) == (str(direct.value), str(direct.value))
    assert errors == []
    assert [r["type"] for r in store.read("s1")] == ["session/start", "good"]


ASKED = [{"id": "big", "name": "shot", "arguments": {"n": 1_000_000}},
         {"id": "huge", "name": "shot", "arguments": {"n": 2_000_000}},
         {"id": "small", "name": "shot", "arguments": {"n": 5}}]


@pytest.mark.parametrize("via", ["run_tool", "dispatch_tools"])
@pytest.mark.parametrize("errors", ["result", "raise"])
def test_a_tool_output_is_recorded_and_one_the_store_cannot_hold_is_an_error_result_naming_its_size(
        store, via, errors):
    """Through ``writer.step``: a 1 MB output (over the writer's grouping bound, within the
    record limit) is recorded as it is; a 2 MB one (over the record limit) is answered by
    an error result, ``TOOL_OUTPUT_NOT_RECORDED``, naming its size and the limit: the body
    ran, so the call is never left to recovery as "maybe ran". The step goes on."""
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    ran = []

    async def shot(arguments):
        ran.append(arguments["n"])
        return "y" * arguments["n"]

    async def main():
        async with store.writer() as w, w.step("s1", turn="t1") as step:
            await step.append_async([{"type": "step/start", "turn": "t1", "step": 1},
                                     {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
                                      "tool_calls": ASKED}])
            if via == "run_tool":
                outcomes = [await step.run_tool(call, shot, errors=errors) for call in ASKED]
            else:
                await dispatch_tools(step, ASKED, {"shot": shot}, errors=errors)
                outcomes = None
            await step.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                                     {"type": "turn/end", "turn": "t1", "status": "completed"}])
            return outcomes

    outcomes = asyncio.run(main())
    assert sorted(ran) == [5, 1_000_000, 2_000_000]  # every body ran once
    records = list(store.read("s1"))
    results = {r["call_id"]: r for r in records if r["type"] == "tool/result"}
    assert results["big"]["output"] == "y" * 1_000_000 and results["big"]["is_error"] is False
    assert results["small"]["output"] == "yyyyy"
    huge = results["huge"]
    assert huge["is_error"] is True and huge["code"] == TOOL_OUTPUT_NOT_RECORDED
    assert "2000000 bytes" in huge["output"] and f"record limit of {store.limits.record_limit}" in huge["output"]
    assert not huge.get("synthetic")  # the runtime's answer, not recovery's
    if outcomes is not None:  # run_tool returns what was recorded
        assert [o.output for o in outcomes] == [results[c["id"]]["output"] for c in ASKED]
    assert [r["type"] for r in records][-2:] == ["step/end", "turn/end"]
    assert records[-2]["status"] == "completed"
    scan = store.scan("s1")
    assert scan.damage is None and scan.unanswered_calls == [] and scan.open_turn is None
    assert check_pairing(project(records, "openai").items, "openai") is None
