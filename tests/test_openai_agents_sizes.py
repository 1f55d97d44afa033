"""SessionLogSession and large items: what the SDK's SQLiteSession stores, up to the store's
record limit, comes back byte-identical; what is over the record or batch limit is refused
with an error naming the item, its size and the limit, and nothing is written; logs of the
earlier record formats read back as they did."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

agents = pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from postgres import postgres_schema_url  # noqa: E402

import sessionlog  # noqa: E402
from sessionlog.integrations.openai_agents import Conversation, SessionLogSession, _AddPlan, _copy_items  # noqa: E402

set_tracing_disabled(True)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "openai-agents"
LIMIT = sessionlog.Limits().record_limit  # 1 MiB: the record and the batch limit
KB = 1000


def _url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "postgresql":
        yield from postgres_schema_url()
    elif backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        yield f"{backend}:{tmp_path / 'store'}"


@pytest.fixture(params=["jsonl", "zstd", "sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    gen = _url(request.param, tmp_path)
    yield next(gen)
    gen.close()


def text(size: int, seed: str = "") -> str:
    """``size`` bytes of UTF-8 text with multi-byte characters, quotes and newlines (so JSON
    escapes them)."""
    unit = f'{seed}línea "✓" 0123\n'
    return (unit * (size // len(unit.encode()) + 1)).encode()[:size].decode("utf-8", "ignore")


def shapes(size: int) -> dict[str, list[list[Any]]]:
    """add_items calls (lists of batches) whose one large item is ``size`` bytes of text, in
    every place an SDK item holds text."""
    big = text(size)
    image = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUg" * (size // 22)
    user = [{"role": "user", "content": "go"}]

    def call(arguments: str) -> dict[str, Any]:
        return {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "write", "arguments": arguments,
                "status": "completed"}

    small_call = call("{}")
    return {
        "user message": [[{"role": "user", "content": big}]],
        "user message parts": [[{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": big[: size // 2]}, {"type": "input_image", "image_url": "https://x/y.png"},
            {"type": "input_text", "text": big[size // 2:]}]}]],
        "user image": [[{"role": "user", "content": [{"type": "input_image", "image_url": image}]}]],
        "assistant message": [user, [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                                      "content": [{"type": "output_text", "text": big, "annotations": [],
                                                   "logprobs": []}]}]],
        "assistant refusal": [user, [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                                      "content": [{"type": "refusal", "refusal": big}]}]],
        "reasoning": [user, [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": big}]},
                             {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                              "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]],
        "call arguments, compact": [user, [call(json.dumps({"path": "a", "body": big}, separators=(",", ":"),
                                                           ensure_ascii=False))]],
        "call arguments, json.dumps": [user, [call(json.dumps({"path": "a", "body": big}))]],
        "call arguments, not JSON": [user, [call('{"path": "a", "body": "' + big)]],  # cut short
        "call output": [user, [small_call], [{"type": "function_call_output", "call_id": "c1", "output": big}]],
        "call output parts": [user, [small_call], [{"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": big[: size // 3]}, {"type": "input_text", "text": big[size // 3:]}]}]],
        "computer screenshot": [user, [{"type": "computer_call", "id": "cc_1", "call_id": "c1",
                                        "action": {"type": "screenshot"}, "pending_safety_checks": [],
                                        "status": "completed"}],
                                [{"type": "computer_call_output", "call_id": "c1",
                                  "output": {"type": "computer_screenshot", "image_url": image}}]],
        "system message": [[{"role": "system", "content": big}]],
    }


async def write_and_read(url: str, batches: list[list[Any]]) -> tuple[list[Any], list[Any]]:
    """Add ``batches`` through one session, then read them back through a new one: all
    items, and the latest one alone (the partial replay)."""
    async with SessionLogSession("s", store=url) as session:
        for batch in batches:
            await session.add_items(batch)
    async with SessionLogSession("s", store=url) as again:
        latest = await again.get_items(limit=1)
        everything = await again.get_items()
    return everything, latest


async def sqlite_session(tmp_path: Path, batches: list[list[Any]]) -> list[Any]:
    reference = SQLiteSession("s", str(tmp_path / "reference.db"))
    try:
        for batch in batches:
            await reference.add_items(batch)
        return await reference.get_items()
    finally:
        reference.close()


def log_bytes(url: str) -> list[bytes]:
    with sessionlog.open_store(url) as store:
        return [r.raw for r in store.read("s")]


# --- what SQLiteSession stores is stored ----------------------------------------------------


@pytest.mark.parametrize("shape", list(shapes(1)))
def test_an_item_of_700_kb_reads_back_byte_identical_after_reopening(url: str, tmp_path: Path, shape: str) -> None:
    batches = shapes(700 * KB)[shape]
    added = [item for batch in batches for item in batch]
    everything, latest = asyncio.run(write_and_read(url, batches))
    assert json.dumps(everything, ensure_ascii=False) == json.dumps(added, ensure_ascii=False)  # members in order
    assert everything == asyncio.run(sqlite_session(tmp_path, batches))
    assert latest == added[-1:]
    # The text is in the log once, and sessionlog's own tools read the log (a call saved
    # without its output awaits approval: suspended).
    records = log_bytes(url)
    assert sum(map(len, records)) < 1.2 * sum(len(json.dumps(i, ensure_ascii=False).encode()) for i in added)
    with sessionlog.open_store(url) as store:
        assert store.scan("s").status in (sessionlog.Status.CLEAN, sessionlog.Status.SUSPENDED)


def json_size(value: Any) -> int:
    return len(msgspec.json.encode(value))


def near_limit(shape: str) -> list[list[Any]]:
    """The batches of ``shape`` whose large item's JSON is within 2-3 KB of the record limit."""
    def largest(size: int) -> int:
        return max(json_size(i) for batch in shapes(size)[shape] for i in batch)

    low, high = 1, LIMIT  # largest(low) <= LIMIT - 2000 < largest(high)
    while high - low > 200:
        middle = (low + high) // 2
        low, high = (middle, high) if largest(middle) <= LIMIT - 2000 else (low, middle)
    return shapes(low)[shape]


@pytest.mark.parametrize("shape", list(shapes(1)))
def test_an_item_up_to_the_record_limit_is_stored(tmp_path: Path, shape: str) -> None:
    """An item whose JSON is 2-3 KB under the 1 MiB record limit still fits: its record
    holds its text once."""
    url = f"jsonl:{tmp_path / 'store'}"
    batches = near_limit(shape)
    added = [item for batch in batches for item in batch]
    assert max(map(json_size, added)) > LIMIT - 3000
    everything, _ = asyncio.run(write_and_read(url, batches))
    assert json.dumps(everything, ensure_ascii=False) == json.dumps(added, ensure_ascii=False)
    assert max(map(len, log_bytes(url))) <= LIMIT


def test_a_turn_with_the_run_hooks_stores_a_700_kb_output_and_answer(url: str, tmp_path: Path) -> None:
    """The Runner with the run hooks: a tool output and a final answer of 700 KB each are
    recorded as they arrive and settled by the turn's add_items, as SQLiteSession keeps them."""
    output, answer = text(700 * KB, "out"), text(700 * KB, "answer")

    @function_tool
    def fetch(path: str) -> str:
        """Read a file."""
        return output

    async def turn(session: Any, hooks: Any) -> list[Any]:
        model = ScriptedModel([[function_call("fetch", {"path": "big.txt"}, call_id="c1")],
                               [assistant_message(answer, item_id="m1")]])
        agent = Agent(name="a", instructions="Be brief.", model=model, tools=[fetch])
        result = await Runner.run(agent, "read big.txt", session=session, hooks=hooks)
        assert result.final_output == answer
        return await session.get_items()

    reference = SQLiteSession("s", str(tmp_path / "reference.db"))
    want = asyncio.run(turn(reference, None))
    reference.close()

    async def scenario() -> tuple[list[Any], list[Any]]:
        async with SessionLogSession("s", store=url) as session:
            got = await turn(session, session.run_hooks())
        async with SessionLogSession("s", store=url) as again:
            return got, await again.get_items()

    got, reopened = asyncio.run(scenario())
    assert got == want and json.dumps(reopened) == json.dumps(want)
    with sessionlog.open_store(url) as store:
        assert store.scan("s").status == sessionlog.Status.CLEAN


def test_pop_of_an_item_whose_json_is_over_the_record_limit(tmp_path: Path) -> None:
    """A call whose arguments json.dumps wrote with escapes is over 1 MiB of JSON, yet its
    record (the arguments once, as an object) fits; pop_item of it works: the agents/pop
    record does not name it (it would not fit), and the pop holds after reopening."""
    url = f"jsonl:{tmp_path / 'store'}"
    [[first], [big]] = shapes(700 * KB)["call arguments, json.dumps"]
    assert json_size(big) > LIMIT

    async def scenario() -> list[Any]:
        async with SessionLogSession("s", store=url) as session:
            await session.add_items([first, big])
            assert await session.pop_item() == big
        async with SessionLogSession("s", store=url) as again:
            return await again.get_items()

    assert asyncio.run(scenario()) == [first]
    with sessionlog.open_store(url) as store:
        pop = [r for r in store.read("s") if r.type == "agents/pop"]
    assert len(pop) == 1 and "removed" not in pop[0]


# --- what does not fit is refused, and nothing is written -----------------------------------


@pytest.mark.parametrize("shape", ["user message", "assistant message", "call output parts", "call arguments, compact"])
def test_an_item_over_the_record_limit_is_refused_by_name_and_nothing_is_written(
        url: str, shape: str) -> None:
    batches = shapes(LIMIT + 10 * KB)[shape]
    *before, last = batches
    *_, big = last

    async def scenario() -> sessionlog.InvalidEvent:
        async with SessionLogSession("s", store=url) as session:
            for batch in before:
                await session.add_items(batch)
            await session.add_items([{"role": "user", "content": "kept"}])
        held = log_bytes(url)
        async with SessionLogSession("s", store=url) as session:
            with pytest.raises(sessionlog.InvalidEvent) as refused:
                await session.add_items([{"role": "user", "content": "with it"}, big])
            assert log_bytes(url) == held  # not a byte more
            assert (await session.get_items())[-1] == {"role": "user", "content": "kept"}
            await session.add_items([{"role": "user", "content": "after"}])  # still usable
            assert (await session.get_items())[-2:] == [{"role": "user", "content": "kept"},
                                                        {"role": "user", "content": "after"}]
        return refused.value

    error = asyncio.run(scenario())
    message = str(error)
    size = json_size(big)
    assert message.startswith("add_items: items[1] (")
    assert f"{size:,} bytes of JSON" in message
    assert f"record limit of {LIMIT:,} bytes" in message
    assert "Nothing of this add_items was written" in message
    assert isinstance(error.__cause__, sessionlog.InvalidEvent)  # the store's own refusal, chained


def test_an_add_items_over_the_batch_limit_is_refused_whole_and_not_split(url: str, tmp_path: Path) -> None:
    """Two outputs of 600 KB in one add_items: SQLiteSession takes them in one transaction;
    here the batch is over the store's batch limit, and an add_items is one atomic append:
    it is refused whole (a half-written add_items after a crash would be worse). One
    output per add_items is stored."""
    user = [{"role": "user", "content": "go"}]
    calls = [{"type": "function_call", "id": f"fc_{c}", "call_id": c, "name": "read", "arguments": "{}"}
             for c in ("c1", "c2")]
    outputs = [{"type": "function_call_output", "call_id": c, "output": text(600 * KB, c)} for c in ("c1", "c2")]
    assert asyncio.run(sqlite_session(tmp_path, [user, calls, outputs])) == user + calls + outputs

    async def scenario() -> sessionlog.InvalidEvent:
        async with SessionLogSession("s", store=url) as session:
            await session.add_items(user)
            await session.add_items(calls)
            held = log_bytes(url)
            with pytest.raises(sessionlog.InvalidEvent) as refused:
                await session.add_items(outputs)
            assert log_bytes(url) == held
            assert await session.get_items() == user + calls
            for output in outputs:
                await session.add_items([output])
        async with SessionLogSession("s", store=url) as again:
            assert await again.get_items() == user + calls + outputs
        return refused.value

    message = str(asyncio.run(scenario()))
    assert message.startswith("add_items: the records of its 2 items come to about ")
    assert f"batch limit of {LIMIT:,} bytes" in message and "not split" in message
    assert "Nothing of this add_items was written" in message
    assert "items[0] (function_call_output, call_id 'c1')" in message
    with sessionlog.open_store(url) as store:
        assert store.scan("s").status == sessionlog.Status.CLEAN


# --- logs of the earlier formats ------------------------------------------------------------


@pytest.mark.parametrize("name", ["before-item-text", "item-text-member"])
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_a_log_of_an_earlier_format_reads_back_as_it_did(tmp_path: Path, name: str, backend: str) -> None:
    """Logs written by earlier versions (fixtures/openai-agents/make_logs.py: each item's
    text twice; then a string ``item_text`` for string content and outputs) give the items
    they gave, byte for byte, whole and partially replayed; new items appended to them read
    back after them."""
    want = json.loads((FIXTURES / f"{name}.items.json").read_text(encoding="utf-8"))
    (tmp_path / "old").mkdir()
    shutil.copy(FIXTURES / f"{name}.jsonl", tmp_path / "old" / "conv.jsonl")
    url = f"jsonl:{tmp_path / 'old'}"
    if backend == "sqlite":
        from sessionlog.convert import convert

        url = f"sqlite:///{tmp_path / 'store.db'}"
        [result] = convert(f"jsonl:{tmp_path / 'old'}", url)
        assert result.status == "converted", result
    more = shapes(700 * KB)["assistant message"]

    async def scenario() -> None:
        for limit in (1, 3, 5, None):
            async with SessionLogSession("conv", store=url) as session:
                got = await session.get_items(limit=limit)
                assert json.dumps(got, ensure_ascii=False) == json.dumps(want[-limit if limit else 0:],
                                                                         ensure_ascii=False)
        async with SessionLogSession("conv", store=url) as session:
            for batch in more:
                await session.add_items(batch)
        async with SessionLogSession("conv", store=url) as session:
            assert await session.get_items() == want + [item for batch in more for item in batch]

    asyncio.run(scenario())


# --- the references themselves --------------------------------------------------------------

_PIECE = st.text(st.characters(codec="utf-8"), min_size=1, max_size=6).map(lambda t: t * 1200)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False,
                     allow_infinity=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=3), max_leaves=8)
_PART = st.one_of(
    _PIECE.map(lambda t: {"type": "input_text", "text": t}),
    _PIECE.map(lambda t: {"type": "refusal", "refusal": t}),
    st.tuples(_PIECE, _JSON).map(lambda a: {"type": "input_image", "image_url": a[0], "detail": a[1]}),
    _JSON,
)
_CONTENT = st.one_of(_PIECE, st.lists(_PART, max_size=4), _JSON.map(lambda v: {"data": v, "pad": "x" * 5000}))


def _arguments(value: Any, form: int) -> str:
    if form == 3:
        return json.dumps(value)[:-1]  # cut short: no JSON
    return json.dumps(value, separators=((",", ":"), (", ", ": "), (",", ": "))[form], ensure_ascii=form == 1)


_ITEM = st.one_of(
    _CONTENT.map(lambda c: {"role": "user", "content": c}),
    _CONTENT.map(lambda c: {"type": "message", "id": "m", "role": "assistant", "content": c}),
    st.tuples(st.sampled_from(["c1", "c2"]), _CONTENT).map(
        lambda a: {"type": "function_call_output", "call_id": a[0], "output": a[1]}),
    st.tuples(st.sampled_from(["c1", "c2"]), _JSON, _PIECE, st.integers(0, 3)).map(
        lambda a: {"type": "function_call", "call_id": a[0], "name": "f",
                   "arguments": _arguments({"v": a[1], "body": a[2]}, a[3])}),
    st.tuples(st.sampled_from(["c1", "c2"]), _PIECE).map(
        lambda a: {"type": "custom_tool_call", "call_id": a[0], "name": "g", "input": a[1]}),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add with hooks", "response"]),
                              st.lists(_ITEM, min_size=1, max_size=4)), min_size=1, max_size=3))
def test_records_give_back_the_items_they_were_made_from(ops: list[tuple[str, list[Any]]]) -> None:
    """Whatever holds the text (strings, text and refusal parts, content without text,
    arguments in any JSON spelling or none), the records of an add_items or of a response
    the run hooks saw, read back as a store returns them, give the items in their member
    order: the state they were planned from, and for adds the items added."""
    live, replayed = Conversation(), Conversation()
    added: list[Any] = []
    for op, items in ops:
        batch = _copy_items(items)
        if op == "response":
            events = live.plan_response(batch, "resp_1")
            for event in events:
                live.feed(event, live.last_seq + 1)
        else:
            plan = _AddPlan(live, batch, hooks=op == "add with hooks")
            events = plan.events
            live.settle(plan, live.last_seq + len(events))
            added += batch
        for event in events:
            replayed.feed(msgspec.json.decode(msgspec.json.encode(event)), replayed.last_seq + 1)
        assert json.dumps(replayed.items) == json.dumps(live.items)
    if all(op != "response" for op, _ in ops):
        assert json.dumps(live.items) == json.dumps(added)


def test_a_reference_a_log_edited_by_hand_breaks_leaves_its_null() -> None:
    """item_text entries that do not resolve are skipped, never an exception."""
    item = {"role": "user", "content": [{"type": "input_text", "text": None}]}
    for refs in ([{"at": ["content", 0, "text"], "text": ["content"], "start": 5, "end": 2}],
                 [{"at": ["content", 9, "text"], "text": ["content"]}],
                 [{"at": ["content", 0, "text"], "text": ["nothing"]}],
                 [{"at": ["content", 0, "text"], "parse": ["content"]}],
                 [{"at": ["content", 0, "text"], "json": ["content"], "separators": 3}],
                 [{"at": "content", "text": ["content"]}], ["content"], 7):
        conversation = Conversation()
        conversation.feed({"seq": 2, "type": "user/message", "turn": "t1", "content": "{not json",
                           "item": item, "item_text": refs})
        assert conversation.items == [item]
