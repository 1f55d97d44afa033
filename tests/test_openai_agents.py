"""SessionLogSession: the OpenAI Agents SDK Session protocol over every backend, driven by
the real Runner with a scripted model (no network) and compared with the SDK's own
SQLiteSession."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled  # noqa: E402
from agents.memory import Session, SessionSettings  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from postgres import postgres_schema_url  # noqa: E402

import sessionlog  # noqa: E402
from sessionlog.integrations.openai_agents import SessionLogSession  # noqa: E402

set_tracing_disabled(True)  # no network, not even for traces

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


# --- backends --------------------------------------------------------------------------


def _url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "postgresql":
        yield from postgres_schema_url()
    elif backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    elif backend == "memory":
        yield "memory:"
    else:
        yield f"{backend}:{tmp_path / 'store'}"


ALL_BACKENDS = ["jsonl", "zstd", "sqlite", "postgresql", "memory"]
DURABLE_BACKENDS = ["jsonl", "zstd", "sqlite", "postgresql"]


@pytest.fixture(params=ALL_BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionlog.EventStore]:
    gen = _url(request.param, tmp_path)
    with sessionlog.open_store(next(gen)) as st:
        yield st
    gen.close()


@pytest.fixture(params=DURABLE_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    gen = _url(request.param, tmp_path)
    yield next(gen)
    gen.close()


# --- a scripted model, tools and a conversation ------------------------------------------


class Scripted(ScriptedModel):
    """Replays canned responses and records every input the Runner sent it."""

    @property
    def inputs(self) -> list[Any]:
        return [json.loads(json.dumps(call.input)) for call in self.calls]


@function_tool
def deploy(version: str) -> str:
    """Deploy a version."""
    return f"deployed {version}"


@function_tool
def notify(who: str) -> str:
    """Notify someone."""
    return f"notified {who}"


@function_tool
def status() -> str:
    """Report status."""
    return "all green"


TURNS = ["deploy 1.2.3 and tell ops", "status?"]


def script() -> list[Any]:
    """Two turns: parallel calls, an answer; one call, an answer."""
    return [
        [function_call("deploy", {"version": "1.2.3"}, call_id="c1"),
         function_call("notify", {"who": "ops"}, call_id="c2")],
        [assistant_message("deployed 1.2.3, ops notified", item_id="m1")],
        [function_call("status", {}, call_id="c3")],
        [assistant_message("all green", item_id="m2")],
    ]


def make_agent(model: Scripted) -> Agent[Any]:
    return Agent(name="ops", instructions="Be brief.", model=model, tools=[deploy, notify, status])


async def run_turn(mode: str, agent: Agent[Any], text: str, session: Any, hooks: Any) -> Any:
    if mode == "run":
        return (await Runner.run(agent, text, session=session, hooks=hooks)).final_output
    if mode == "streamed":
        result = Runner.run_streamed(agent, text, session=session, hooks=hooks)
        async for _ in result.stream_events():
            pass
        return result.final_output
    # run_sync owns its event loop: call it from a thread without one.
    return await asyncio.to_thread(lambda: Runner.run_sync(agent, text, session=session, hooks=hooks).final_output)


async def converse(mode: str, session: Any, hooks: Any, turns: list[str] = TURNS,
                   steps: list[Any] | None = None) -> tuple[list[Any], list[Any]]:
    model = Scripted(steps if steps is not None else script())
    agent = make_agent(model)
    finals = [await run_turn(mode, agent, text, session, hooks) for text in turns]
    return model.inputs, finals


def reference(tmp_path: Path, turns: list[str] = TURNS, steps: list[Any] | None = None) -> tuple[list[Any], list[Any]]:
    """What the SDK's own file-backed SQLiteSession sends the model and keeps."""
    sqlite = SQLiteSession("reference", str(tmp_path / "reference.db"))
    try:
        inputs, _ = asyncio.run(converse("run", sqlite, None, turns, steps))
        return inputs, asyncio.run(sqlite.get_items())
    finally:
        sqlite.close()


def records(store: sessionlog.EventStore, sid: str) -> list[dict[str, Any]]:
    return [r.to_dict() for r in store.read(sid)]


# --- the protocol ----------------------------------------------------------------------


def test_implements_the_session_protocol_and_takes_the_runners_wrapper() -> None:
    session = SessionLogSession("s", store="memory:")
    assert isinstance(session, Session)
    assert session.session_id == "s"
    assert isinstance(session.session_settings, SessionSettings)
    for name in ("get_items", "add_items", "pop_item", "clear_session"):
        parameter = inspect.signature(getattr(session, name)).parameters.get("wrapper")
        assert parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
    session.close()


ITEMS: list[Any] = [
    {"role": "user", "content": "deploy 1.2.3"},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and tell ops"}]},
    {"type": "message", "role": "system", "content": "You are terse."},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "two calls"}]},
    {"type": "message", "id": "m0", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "on it", "annotations": [], "logprobs": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "deploy", "arguments": "{\"version\": \"1.2.3\"}"},
    {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "notify", "arguments": "{\"who\":\"ops\"}"},
    {"type": "function_call_output", "call_id": "c2", "output": "notified ops"},
    {"type": "function_call_output", "call_id": "c1",
     "output": [{"type": "input_text", "text": "deployed"}, {"type": "input_text", "text": " 1.2.3"}]},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}},
    {"type": "message", "role": "assistant", "content": "done", "extra": {"nested": [1, 2.5, None, True]}},
    {"type": "something_new", "payload": {"ünïcødé": "✓"}},
]


def test_items_round_trip_exactly_and_survive_reopening(store: sessionlog.EventStore) -> None:
    async def scenario() -> None:
        session = SessionLogSession("conv-1", store=store)
        await session.add_items(ITEMS[:5])
        await session.add_items(ITEMS[5:])
        assert await session.get_items() == ITEMS
        session.close()
        again = SessionLogSession("conv-1", store=store)
        assert await again.get_items() == ITEMS
        again.close()

    asyncio.run(scenario())
    # The transcript machinery sees the conversation: calls, results, a closed step.
    assert store.scan("conv-1").status == sessionlog.Status.CLEAN
    kinds = [r["type"] for r in records(store, "conv-1")]
    assert kinds.count("tool/result") == 2 and kinds.count("assistant/message") == 3
    view = sessionlog.project(store.read("conv-1"), "responses")
    assert sessionlog.check_pairing(view.items, "responses") is None


def test_returned_items_are_copies(store: sessionlog.EventStore) -> None:
    async def scenario() -> None:
        session = SessionLogSession("s", store=store)
        mine = [{"role": "user", "content": "hi"}]
        await session.add_items(mine)
        mine[0]["content"] = "changed after add"
        got = await session.get_items()
        got[0]["content"] = "changed after get"
        assert await session.get_items() == [{"role": "user", "content": "hi"}]
        session.close()

    asyncio.run(scenario())


def test_limit_is_the_latest_items_in_order(store: sessionlog.EventStore) -> None:
    items = [{"role": "user", "content": f"m{i}"} for i in range(7)]

    async def scenario() -> None:
        session = SessionLogSession("s", store=store)
        await session.add_items(items)
        assert await session.get_items(limit=3) == items[-3:]
        assert await session.get_items(limit=100) == items
        assert await session.get_items(limit=0) == []
        assert await session.get_items(limit=-1) == items  # SQLiteSession: negative = all
        session.close()
        limited = SessionLogSession("s", store=store, session_settings=SessionSettings(limit=2))
        assert await limited.get_items() == items[-2:]
        assert await limited.get_items(limit=4) == items[-4:]  # an explicit limit wins
        limited.close()
        as_dict = SessionLogSession("s", store=store, session_settings={"limit": 1})
        assert await as_dict.get_items() == items[-1:]
        as_dict.close()

    asyncio.run(scenario())


def test_pop_and_clear_append_records_and_never_delete_history(store: sessionlog.EventStore) -> None:
    async def scenario() -> None:
        session = SessionLogSession("s", store=store)
        assert await session.pop_item() is None
        await session.add_items(ITEMS[:3])
        assert await session.pop_item() == ITEMS[2]
        assert await session.get_items() == ITEMS[:2]
        await session.clear_session()
        assert await session.get_items() == []
        await session.add_items(ITEMS[3:5])
        session.close()
        again = SessionLogSession("s", store=store)
        assert await again.get_items() == ITEMS[3:5]
        again.close()

    asyncio.run(scenario())
    recs = records(store, "s")
    kinds = [r["type"] for r in recs]
    assert kinds.count("agents/pop") == 1 and kinds.count("agents/clear") == 1
    # Everything ever added is still in the log, verbatim.
    kept = [r.get("item") for r in recs] + [i for r in recs for i in r.get("items", [])]
    for item in ITEMS[:5]:
        assert item in kept


def test_a_second_owner_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    url = f"jsonl:{tmp_path}"

    async def scenario() -> None:
        first = SessionLogSession("s", store=url)
        await first.add_items([{"role": "user", "content": "hi"}])
        second = SessionLogSession("s", store=url)
        with pytest.raises(sessionlog.SessionLocked):
            await second.get_items()
        first.close()
        assert await second.get_items() == [{"role": "user", "content": "hi"}]
        second.close()
        with pytest.raises(sessionlog.StoreClosed):
            await second.get_items()

    asyncio.run(scenario())


def test_items_that_are_not_json_are_refused_before_anything_is_written() -> None:
    async def scenario() -> None:
        session = SessionLogSession("s", store="memory:")
        with pytest.raises(sessionlog.InvalidEvent):
            await session.add_items([{"role": "user", "content": object()}])
        assert await session.get_items() == []
        session.close()

    asyncio.run(scenario())


# --- the Runner ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["run", "run_sync", "streamed"])
@pytest.mark.parametrize("with_hooks", [True, False], ids=["hooks", "no-hooks"])
def test_runner_sends_what_sqlite_session_sends(store: sessionlog.EventStore, tmp_path: Path,
                                                mode: str, with_hooks: bool) -> None:
    want_inputs, want_items = reference(tmp_path)

    async def scenario() -> tuple[list[Any], list[Any], list[Any]]:
        session = SessionLogSession("conv", store=store)
        hooks = session.run_hooks() if with_hooks else None
        inputs, finals = await converse(mode, session, hooks)
        items = await session.get_items()
        session.close()
        return inputs, finals, items

    inputs, finals, items = asyncio.run(scenario())
    assert finals == ["deployed 1.2.3, ops notified", "all green"]
    assert inputs == want_inputs
    assert items == want_items
    assert store.scan("conv").status == sessionlog.Status.CLEAN
    recs = records(store, "conv")
    # Each call is asked for once and answered once in the transcript.
    results = [r["call_id"] for r in recs if r["type"] == "tool/result"]
    assert sorted(results) == ["c1", "c2", "c3"]
    calls = [c["id"] for r in recs if r["type"] == "assistant/message" for c in r["tool_calls"]]
    assert sorted(calls) == ["c1", "c2", "c3"]
    view = sessionlog.project(store.read("conv"), "responses")
    assert sessionlog.check_pairing(view.items, "responses") is None and not view.issues


CHILD_TURN = """
import asyncio, json, sys
sys.path.insert(0, {tests!r})
import test_openai_agents as t
from sessionlog.integrations.openai_agents import SessionLogSession

async def main():
    session = SessionLogSession("conv", store={url!r})
    inputs, finals = await t.converse({mode!r}, session, session.run_hooks(), t.TURNS[:1], t.script()[:2])
    session.close()
    print(json.dumps(inputs))

asyncio.run(main())
"""


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("mode", ["run", "streamed"])
def test_a_conversation_resumes_in_a_new_process(store_url: str, tmp_path: Path, mode: str) -> None:
    want_inputs, want_items = reference(tmp_path)
    child = run_child(CHILD_TURN.format(tests=str(TESTS), url=store_url, mode=mode))
    assert child.returncode == 0, child.stderr
    first_inputs = json.loads(child.stdout.strip().splitlines()[-1])

    async def second_turn() -> tuple[list[Any], list[Any]]:
        session = SessionLogSession("conv", store=store_url)
        inputs, _ = await converse(mode, session, session.run_hooks(), TURNS[1:], script()[2:])
        items = await session.get_items()
        session.close()
        return inputs, items

    later_inputs, items = asyncio.run(second_turn())
    assert first_inputs + later_inputs == want_inputs
    assert items == want_items
