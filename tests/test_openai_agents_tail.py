"""SessionLogSession on a JSONL store reads only the latest records it needs: the file is
read backwards from its end (through the store's I/O seam), each record validated, and a
tail that does not validate falls back to the whole read. Bytes read are counted, not
timed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_openai_agents import converse  # noqa: E402

import sessionlog  # noqa: E402
from sessionlog.backends.jsonl import open_jsonl  # noqa: E402
from sessionlog.durable import FileSystem  # noqa: E402
from sessionlog.integrations import openai_agents  # noqa: E402
from sessionlog.integrations.openai_agents import SessionLogSession  # noqa: E402

SLOW = bool(os.environ.get("SESSIONLOG_SLOW"))


class Counting(FileSystem):
    """The real file system, counting the bytes read through it."""

    def __init__(self) -> None:
        self.bytes_read = 0

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        data = super().pread(fd, n, offset)
        self.bytes_read += len(data)
        return data


def turn(n: int, text: str) -> list[dict[str, Any]]:
    a, b = f"call_{n}_a", f"call_{n}_b"
    return [
        {"role": "user", "content": f"question {n}: {text}"},
        {"type": "function_call", "id": f"fc_{n}_a", "call_id": a, "name": "deploy", "arguments": '{"v": 1}'},
        {"type": "function_call", "id": f"fc_{n}_b", "call_id": b, "name": "notify", "arguments": "{}"},
        {"type": "function_call_output", "call_id": a, "output": f"deployed {n}: {text}"},
        {"type": "function_call_output", "call_id": b, "output": f"notified {n}"},
        {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": f"answer {n}", "annotations": []}]},
    ]


def items_of(directory: Path, sid: str, limit: int | None) -> tuple[list[Any], int]:
    """``get_items(limit)`` from a fresh store and session; and the bytes read for it."""
    fs = Counting()
    store = open_jsonl(str(directory), fs=fs)

    async def go() -> list[Any]:
        async with SessionLogSession(sid, store=store) as session:
            return await session.get_items(limit)

    try:
        return asyncio.run(go()), fs.bytes_read
    finally:
        store.close()


def test_a_limit_on_a_big_jsonl_log_reads_a_bounded_number_of_bytes(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    text = "x" * 40_000  # a turn is ~80 KB (an output's text is written once): 200 turns make ~16 MB

    async def build() -> None:
        async with SessionLogSession("big", store=f"jsonl:{directory}") as session:
            for n in range(200):
                await session.add_items(turn(n, text))
            await session.add_items([{"role": "user", "content": "last question"}])
            await session.pop_item()  # the latest item is taken back: honoured by the tail
            await session.add_items([{"role": "user", "content": "the real last question"}])

    asyncio.run(build())
    size = (directory / "big.jsonl").stat().st_size
    assert size > 15_000_000

    everything, whole_bytes = items_of(directory, "big", None)
    assert whole_bytes >= size  # the whole conversation is the whole log
    assert everything[-1] == {"role": "user", "content": "the real last question"}
    assert {"role": "user", "content": "last question"} not in everything

    per_turn = size // 200
    opening = 2 * (1 << 20)  # the core validates the header and one append's reach (1 MiB each)
    for limit, turns_back in ((1, 1), (5, 1), (40, 7)):
        latest, read = items_of(directory, "big", limit)
        assert latest == everything[-limit:]
        # The tail read spans the turns the items are in (and one more, back to an
        # assistant message), overshooting by at most the window's and the chunk's growth.
        assert read < opening + 8 * (turns_back + 1) * per_turn, (limit, read)
        assert read < size // 3


def test_the_tail_honours_clear_and_pops_across_the_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small window, so that the latest records are read in several steps and in chunks
    that split records: pops that reach before the window and a clear give the whole
    read's items."""
    monkeypatch.setattr(openai_agents, "_WINDOW", 3)
    monkeypatch.setattr(openai_agents._JsonlTail, "_CHUNK", 50)
    directory = tmp_path / "store"

    async def build() -> None:
        async with SessionLogSession("s", store=f"jsonl:{directory}") as session:
            for n in range(6):
                await session.add_items(turn(n, "t" * n))
            for _ in range(8):  # back past the latest turn's user message
                await session.pop_item()
            await session.clear_session()
            await session.add_items(turn(7, "after the clear"))
            await session.add_items(turn(8, "and again"))
            for _ in range(3):
                await session.pop_item()

    asyncio.run(build())
    everything, _ = items_of(directory, "s", None)
    assert len(everything) == 9
    for limit in range(0, 12):
        latest, _ = items_of(directory, "s", limit)
        assert latest == (everything[-limit:] if limit else [])


def test_a_tail_that_does_not_validate_is_not_used(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = sessionlog.open_store(f"jsonl:{directory}")
    store.create("s", [{"type": "note", "n": n} for n in range(20)])
    store.close()
    path = directory / "s.jsonl"
    lines = path.read_bytes().split(b"\n")
    fs = Counting()
    store = open_jsonl(str(directory), fs=fs)
    try:
        end = path.stat().st_size
        good = openai_agents._JsonlTail(store, "s", end, 21)
        got = good.latest(5)
        assert got is not None and [r.seq for r in got] == [17, 18, 19, 20, 21]
        assert [r.seq for r in good.latest(50)] == list(range(1, 22))  # all of them, header first
        # A seq that does not run on to the known last seq, a record that does not decode:
        assert openai_agents._JsonlTail(store, "s", end, 22).latest(5) is None
        lines[-4] = lines[-4].replace(b'"n":', b'"n" ')
        path.write_bytes(b"\n".join(lines))
        assert openai_agents._JsonlTail(store, "s", end, 21).latest(2) is not None
        assert openai_agents._JsonlTail(store, "s", end, 21).latest(5) is None
        # Bytes past the known end are not the log's (an append in flight elsewhere).
        assert openai_agents._JsonlTail(store, "s", end - 1, 21).latest(1) is None
    finally:
        store.close()


def test_a_crash_inside_a_step_is_repaired_once_from_the_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log of a run killed inside a tool body (its call durable, no result) read from
    the tail: the call is answered TOOL_OUTCOME_UNKNOWN, once, as a whole read answers it."""
    monkeypatch.setattr(openai_agents, "_WINDOW", 4)
    directory = tmp_path / "store"

    async def build() -> None:
        async with SessionLogSession("s", store=f"jsonl:{directory}") as session:
            for n in range(5):
                await session.add_items(turn(n, "ok"))
            await session.add_items([{"role": "user", "content": "deploy"}])
            # What the run hooks write before a tool body runs; then the process is gone.
            call = {"type": "function_call", "id": "fc", "call_id": "killed", "name": "deploy", "arguments": "{}"}
            conversation = session._conversation
            await session._run(lambda: session._append(conversation.plan_response([call])))
            await session._run(lambda: session._append(conversation.plan_tool_start("killed", "deploy", call)))

    asyncio.run(build())
    before = (directory / "s.jsonl").read_bytes()
    tail_items, _ = items_of(directory, "s", 3)
    after = (directory / "s.jsonl").read_bytes()
    assert after.startswith(before) and len(after) > len(before)  # repaired, durably
    out = tail_items[-1]
    assert out["call_id"] == "killed" and "TOOL_OUTCOME_UNKNOWN" in out["output"]
    everything, _ = items_of(directory, "s", None)
    assert everything[-3:] == tail_items
    assert sum(1 for i in everything if i.get("call_id") == "killed" and "output" in i) == 1
    assert (directory / "s.jsonl").read_bytes() == after  # the repair happened once


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.integers(0, 3)),
        st.tuples(st.just("turn"), st.integers(0, 3)),
        st.tuples(st.just("pop"), st.integers(1, 4)),
        st.tuples(st.just("clear"), st.just(0)),
        st.tuples(st.just("run"), st.just(0)),
    ),
    min_size=1, max_size=8,
)


@settings(max_examples=60 if SLOW else 12, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, window=st.integers(1, 6), chunk=st.sampled_from([16, 100, 4096]))
def test_any_limit_from_the_tail_equals_the_whole_read(tmp_path_factory: pytest.TempPathFactory, ops: list[Any],
                                                       window: int, chunk: int) -> None:
    """Whatever the operations (adds, pops, clears, runs with hooks), ``get_items(limit)``
    from the tail of a JSONL log equals the latest ``limit`` of the whole read."""
    directory = tmp_path_factory.mktemp("tail") / "store"

    async def build() -> None:
        async with SessionLogSession("s", store=f"jsonl:{directory}") as session:
            for n, (op, k) in enumerate(ops):
                if op == "user":
                    await session.add_items([{"role": "user", "content": f"u{n}"}] * (k + 1))
                elif op == "turn":
                    await session.add_items(turn(n, "y" * k))
                elif op == "pop":
                    for _ in range(k):
                        await session.pop_item()
                elif op == "clear":
                    await session.clear_session()
                else:
                    await converse("run", session, session.run_hooks(), turns=["go"])

    asyncio.run(build())
    everything, _ = items_of(directory, "s", None)
    mp = pytest.MonkeyPatch()
    mp.setattr(openai_agents, "_WINDOW", window)
    mp.setattr(openai_agents._JsonlTail, "_CHUNK", chunk)
    try:
        for limit in range(0, len(everything) + 2):
            latest, _ = items_of(directory, "s", limit)
            assert latest == (everything[-limit:] if limit else []), limit
    finally:
        mp.undo()
