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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

agents = pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, RunState, SQLiteSession, function_tool, set_tracing_disabled  # noqa: E402
from agents.memory import Session, SessionSettings  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402
from postgres import postgres_schema_url  # noqa: E402

import sessionlog  # noqa: E402
from sessionlog.delivery import delivery_state  # noqa: E402
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


def test_call_arguments_with_nan_or_infinity_round_trip(store: sessionlog.EventStore) -> None:
    # A model may write NaN, Infinity or 1e999 in a call's arguments (json.loads takes them);
    # a record cannot hold such a number, so the call's arguments stay the string it sent.
    items = [
        {"role": "user", "content": "compute"},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "calc",
         "arguments": "{\"x\": NaN, \"y\": -Infinity, \"z\": 1e999}"},
        {"type": "function_call_output", "call_id": "c1", "output": "nan"},
    ]

    async def scenario() -> None:
        session = SessionLogSession("conv-nan", store=store)
        await session.add_items(items)
        assert await session.get_items() == items
        session.close()

    asyncio.run(scenario())
    assert store.scan("conv-nan").status == sessionlog.Status.CLEAN
    (message,) = [r for r in records(store, "conv-nan") if r["type"] == "assistant/message"]
    assert message["tool_calls"][0]["arguments"] == {"arguments": items[1]["arguments"]}


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


def stored_item(record):
    """The SDK item a record keeps: its ``item``, with the text its ``item_text`` member
    names put back where the item holds null (the text is written once)."""
    item = record.get("item")
    member = record.get("item_text")
    if member is not None:
        assert item[member] is None and isinstance(record[member], str)
        item = {**item, member: record[member]}
    return item


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
    kept = [stored_item(r) for r in recs] + [i for r in recs for i in r.get("items", [])]
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


def test_a_batch_the_store_refuses_changes_nothing(tmp_path: Path) -> None:
    """An add_items the store refuses (a record over its limit) leaves the conversation
    as it was: the items, and the turn and step the next batch is recorded under."""
    from sessionlog.backends.jsonl import open_jsonl
    from sessionlog.scan import Limits

    def turn(text: str) -> list[Any]:
        return [{"role": "user", "content": "go"},
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "deploy", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": text}]

    async def scenario(store: Any) -> list[Any]:
        session = SessionLogSession("s", store=store)
        await session.add_items([{"role": "user", "content": "hi"}])
        with pytest.raises(sessionlog.InvalidEvent):
            await session.add_items(turn("x" * 5000))
        assert await session.get_items() == [{"role": "user", "content": "hi"}]
        await session.add_items(turn("ok"))
        items = await session.get_items()
        session.close()
        return items

    with open_jsonl(str(tmp_path / "small"), limits=Limits(record_limit=4096)) as store:
        items = asyncio.run(scenario(store))
        assert items == [{"role": "user", "content": "hi"}, *turn("ok")]
        recs = records(store, "s")
        assert [(r["type"], r.get("turn"), r.get("step")) for r in recs[2:]] == [
            ("user/message", "t2", None), ("step/start", "t2", 1), ("assistant/message", "t2", 1),
            ("tool/call", "t2", 1), ("tool/result", "t2", 1), ("step/end", "t2", 1)]
        assert store.scan("s").status == sessionlog.Status.CLEAN


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


# --- a run killed inside a tool body ------------------------------------------------------

CHILD_KILLED_IN_TOOL = """
import asyncio, os, sys, time
sys.path.insert(0, {tests!r})
import test_openai_agents as t
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.tool_guardrails import ToolGuardrailFunctionOutput, tool_input_guardrail
from sessionlog.integrations.openai_agents import SessionLogSession

set_tracing_disabled(True)

@function_tool
def deploy(version: str) -> str:
    \"\"\"Deploy a version.\"\"\"
    with open({effect!r}, "a") as f:  # the side effect happens...
        f.write("deployed " + version + "\\n")
        f.flush()
        os.fsync(f.fileno())
    open({ready!r}, "w").close()
    time.sleep(3600)  # ...and the process is killed before the tool returns
    return "deployed " + version

@tool_input_guardrail
async def hold(data):
    await asyncio.sleep(3600)  # notify never gets past its guardrail: it never starts
    return ToolGuardrailFunctionOutput.allow()

@function_tool(tool_input_guardrails=[hold])
def notify(who: str) -> str:
    \"\"\"Notify someone.\"\"\"
    return "notified " + who

async def main():
    session = SessionLogSession("conv", store={url!r})
    model = t.Scripted(t.script()[:2])
    agent = Agent(name="ops", instructions="Be brief.", model=model, tools=[deploy, notify])
    await Runner.run(agent, t.TURNS[0], session=session, hooks=session.run_hooks())

asyncio.run(main())
"""


def outputs_by_call(items: list[Any]) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for item in items:
        if item.get("type") == "function_call_output":
            found.setdefault(item["call_id"], []).append(item["output"])
    return found


@pytest.mark.kill
def test_a_run_killed_inside_a_tool_keeps_the_call_and_says_its_outcome_is_unknown(
        store_url: str, tmp_path: Path) -> None:
    effect, ready = tmp_path / "effect.txt", tmp_path / "ready"
    code = CHILD_KILLED_IN_TOOL.format(tests=str(TESTS), url=store_url, effect=str(effect), ready=str(ready))
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(1200):
            if ready.exists() or child.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), child.communicate()[1].decode()
    finally:
        child.kill()  # SIGKILL, inside the tool body
        child.wait()
    assert effect.read_text() == "deployed 1.2.3\n"  # the side effect happened

    with sessionlog.open_store(store_url) as store:
        scan = store.scan("conv")
        assert scan.status == sessionlog.Status.REPAIRABLE
        assert scan.unanswered_calls == ["c1", "c2"]

        async def resume() -> tuple[list[Any], list[Any]]:
            session = SessionLogSession("conv", store=store)
            items = await session.get_items()
            model = Scripted([[assistant_message("I will check the deploy before anything else", item_id="m9")]])
            await Runner.run(make_agent(model), "what happened?", session=session, hooks=session.run_hooks())
            session.close()
            return items, model.inputs

        items, inputs = asyncio.run(resume())
        assert [i.get("call_id") for i in items if i.get("type") == "function_call"] == ["c1", "c2"]
        outputs = outputs_by_call(items)
        assert sorted(outputs) == ["c1", "c2"] and all(len(v) == 1 for v in outputs.values())
        assert outputs["c1"][0].startswith(sessionlog.TOOL_OUTCOME_UNKNOWN)
        assert outputs["c2"][0].startswith(sessionlog.TOOL_NOT_STARTED)
        # Placed as the Responses API requires: every output after its call.
        position = {(i.get("type"), i.get("call_id")): n for n, i in enumerate(items)}
        for call_id in ("c1", "c2"):
            assert position[("function_call", call_id)] < position[("function_call_output", call_id)]
        # The next model request carries them (the SDK would drop an unpaired call).
        sent = outputs_by_call(inputs[0])
        assert sent["c1"][0].startswith(sessionlog.TOOL_OUTCOME_UNKNOWN)
        assert sent["c2"][0].startswith(sessionlog.TOOL_NOT_STARTED)

        # The repair was recorded once, durably: opening again writes nothing more.
        synthetic = [r for r in records(store, "conv") if r.get("synthetic")]
        assert [r["call_id"] for r in synthetic if r["type"] == "tool/result"] == ["c1", "c2"]

        async def reopen() -> list[Any]:
            session = SessionLogSession("conv", store=store)
            got = await session.get_items()
            session.close()
            return got

        before = store.scan("conv").last_seq
        again = asyncio.run(reopen())
        assert store.scan("conv").last_seq == before
        assert store.scan("conv").status == sessionlog.Status.CLEAN
        assert again[:len(items)] == items  # the repaired history stays as it was read


# --- human approvals: the scenario of openai-agents-python #4947 ----------------------------


def _gated_deploy(version: str) -> str:
    """Deploy a version (a human approves each call)."""
    return f"deployed {version}"


gated_deploy = function_tool(_gated_deploy, name_override="deploy", needs_approval=True)


def approval_script(staged: bool) -> list[Any]:
    """One response asks for a call that needs approval and one to a tool that does not
    exist (answered locally with an error); with ``staged`` the next response asks for a
    second approval before the final answer."""
    steps: list[Any] = [ModelStep(output=[function_call("deploy", {"version": "1.2.3"}, call_id="c1"),
                                          function_call("rollback_everything", {}, call_id="c2")],
                                  response_id="resp-1")]
    if staged:
        steps.append(ModelStep(output=[function_call("deploy", {"version": "1.2.4"}, call_id="c3")],
                               response_id="resp-2"))
    steps.append(ModelStep(output=[assistant_message("both deployed", item_id="m1")], response_id="resp-3"))
    return steps


async def approval_run(steps: list[Any], *, server_managed: bool, open_session: Any = None,
                       on_pause: Any = None) -> tuple[list[Any], Any]:
    """Run until the final answer, approving every interruption after serializing the run
    state to JSON and loading it back (with a fresh session object when there is one)."""
    model = Scripted(steps)
    agent = Agent(name="ops", instructions="Be brief.", model=model, tools=[gated_deploy])
    config = RunConfig(tool_not_found_behavior="return_error_to_model")
    session = open_session() if open_session is not None else None
    hooks = getattr(session, "run_hooks", lambda: None)()
    extra: dict[str, Any] = {"auto_previous_response_id": True} if server_managed else {"session": session}
    result = await Runner.run(agent, "deploy 1.2.3 and roll back", run_config=config, hooks=hooks, **extra)
    while result.interruptions:
        saved = result.to_state().to_json()
        if server_managed and session is not None:
            await session.record_pause(result)
        if session is not None:
            session.close()
        if on_pause is not None:
            await on_pause()
        state = await RunState.from_json(agent, saved)
        for item in state.get_interruptions():
            state.approve(item)
        session = open_session() if open_session is not None else None
        hooks = getattr(session, "run_hooks", lambda: None)()
        if not server_managed:
            extra = {"session": session}
        result = await Runner.run(agent, state, run_config=config, hooks=hooks, **extra)
    if session is not None:
        session.close()
    assert result.final_output == "both deployed"
    return model.inputs, model.calls


def sent_outputs(inputs: list[Any]) -> list[list[str]]:
    """Per request, the call ids of the outputs it carried."""
    return [[i["call_id"] for i in request if isinstance(i, dict) and i.get("type") == "function_call_output"]
            for request in inputs]


@pytest.mark.parametrize("staged", [False, True], ids=["one-approval", "two-staged-approvals"])
def test_approval_pause_and_resume_with_the_session(store: sessionlog.EventStore, tmp_path: Path,
                                                    staged: bool) -> None:
    calls = ["c1", "c2", "c3"] if staged else ["c1", "c2"]
    paused: list[list[dict[str, Any]]] = []

    async def on_pause() -> None:
        # What the log says while a human decides: the call awaits approval, the unknown
        # tool's error is there and owed to the model; opening the session repairs nothing.
        paused.append(records(store, "conv"))
        assert store.scan("conv").status == sessionlog.Status.SUSPENDED
        probe = SessionLogSession("conv", store=store)
        await probe.get_items()
        probe.close()
        assert records(store, "conv") == paused[-1]

    inputs, _ = asyncio.run(approval_run(approval_script(staged), server_managed=False,
                                         open_session=lambda: SessionLogSession("conv", store=store),
                                         on_pause=on_pause))
    assert len(paused) == (2 if staged else 1)
    first = paused[0]
    approvals = [(r["call_id"], r["state"]) for r in first if r["type"] == "tool/approval"]
    assert approvals == [("c1", "requested")]
    assert [r["call_id"] for r in first if r["type"] == "tool/result"] == ["c2"]
    assert not any(r.get("synthetic") for r in first)
    owed = delivery_state(first)
    assert [p.call_id for p in owed.pending] == ["c2"] and owed.awaiting == ["c1"]

    # Every output reaches the model, once in each request that carries history.
    per_request = sent_outputs(inputs)
    assert all(len(ids) == len(set(ids)) for ids in per_request)
    assert sorted(set(sum(per_request, []))) == calls
    # Exactly what the SDK's own SQLiteSession would have sent.
    db = str(tmp_path / "reference.db")
    want, _ = asyncio.run(approval_run(approval_script(staged), server_managed=False,
                                       open_session=lambda: SQLiteSession("reference", db)))
    assert inputs == want

    recs = records(store, "conv")
    assert store.scan("conv").status == sessionlog.Status.CLEAN
    assert sorted(r["call_id"] for r in recs if r["type"] == "tool/result") == calls
    states = [(r["call_id"], r["state"]) for r in recs if r["type"] == "tool/approval"]
    gated = ["c1", "c3"] if staged else ["c1"]
    assert states == [(c, s) for c in gated for s in ("requested", "approved")]
    for call_id in gated:  # approved, then the durable intent, then the result
        order = [r["type"] for r in recs if r.get("call_id") == call_id]
        assert order[-3:] == ["tool/approval", "tool/call", "tool/result"]
    # Each result was carried by a request the model answered: nothing is owed.
    assert all(r["type"] != "llm/request" or isinstance(r["results"], list) for r in recs)
    assert delivery_state(recs).pending == []


@pytest.mark.parametrize("staged", [False, True], ids=["one-approval", "two-staged-approvals"])
def test_approval_resume_with_server_managed_state_delivers_each_output_once(
        store: sessionlog.EventStore, staged: bool) -> None:
    calls = ["c1", "c2", "c3"] if staged else ["c1", "c2"]
    paused: list[list[dict[str, Any]]] = []

    async def on_pause() -> None:
        paused.append(records(store, "conv"))
        assert store.scan("conv").status == sessionlog.Status.SUSPENDED
        probe = SessionLogSession("conv", store=store)
        await probe.get_items()  # opening while a human decides repairs nothing
        probe.close()
        assert records(store, "conv") == paused[-1]

    # The SDK refuses a Session together with server-managed state: the run hooks (and
    # record_pause) record the calls, their results and what each request carried.
    inputs, model_calls = asyncio.run(approval_run(
        approval_script(staged), server_managed=True,
        open_session=lambda: SessionLogSession("conv", store=store), on_pause=on_pause))
    owed = delivery_state(paused[0])
    assert [p.call_id for p in owed.pending] == ["c2"] and owed.awaiting == ["c1"]
    assert not any(r.get("synthetic") for r in paused[-1])
    assert [c.previous_response_id for c in model_calls][1:] == (
        ["resp-1", "resp-2"] if staged else ["resp-1"])
    # Every output reaches the model exactly once over the whole run.
    assert sorted(sum(sent_outputs(inputs), [])) == calls
    recs = records(store, "conv")
    carried = [c for r in recs if r["type"] == "llm/request" for c in r["results"]]
    assert sorted(carried) == calls
    results = {r["call_id"]: r["output"] for r in recs if r["type"] == "tool/result"}
    assert sorted(results) == calls and "not found" in results["c2"]
    assert delivery_state(recs).pending == []


# --- reading only the latest records -------------------------------------------------------


class CountingStore:
    """A real store that remembers where each read of the session started."""

    def __init__(self, store: sessionlog.EventStore) -> None:
        self._store = store
        self.url = store.url
        self.reads: list[int] = []

    def session(self, session_id: str, **options: Any) -> Any:
        handle = self._store.session(session_id, **options)
        reads = self.reads
        original = handle.records

        def records(after_seq: int = 0) -> Any:
            reads.append(after_seq)
            return original(after_seq)

        handle.records = records
        return handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def long_conversation(store: Any, turns: int) -> list[Any]:
    session = SessionLogSession("long", store=store)
    for n in range(turns):
        await session.add_items([{"role": "user", "content": f"question {n}"}])
        await session.add_items([
            {"type": "function_call", "id": f"fc{n}", "call_id": f"c{n}", "name": "status", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"status {n}"},
        ])
        await session.add_items([{"type": "message", "id": f"m{n}", "role": "assistant", "content": f"answer {n}"}])
    if turns % 3 == 0:
        await session.pop_item()
    items = await session.get_items()
    session.close()
    return items


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgresql"])
def test_a_limit_reads_only_the_latest_records_where_the_store_can(backend: str, tmp_path: Path) -> None:
    gen = _url(backend, tmp_path)
    with sessionlog.open_store(next(gen)) as store:
        everything = asyncio.run(long_conversation(store, 300))
        last = store.scan("long").last_seq
        counting = CountingStore(store)

        async def latest() -> tuple[list[Any], list[Any]]:
            session = SessionLogSession("long", store=counting, session_settings={"limit": 10})
            got = await session.get_items()
            await session.add_items([{"role": "user", "content": "one more"}])
            more = await session.get_items(limit=3)
            session.close()
            return got, more

        got, more = asyncio.run(latest())
        assert got == everything[-10:]
        assert more == everything[-2:] + [{"role": "user", "content": "one more"}]
        assert counting.reads and min(counting.reads) > last // 2  # never from the start
        # A whole read happens only when asked for everything.
        session = SessionLogSession("long", store=counting, session_settings={"limit": 10})
        assert asyncio.run(session.get_items(limit=-1)) == everything + [{"role": "user", "content": "one more"}]
        session.close()
        assert 0 in counting.reads
    gen.close()


def test_a_replay_of_the_latest_records_agrees_with_a_whole_replay(tmp_path: Path) -> None:
    """Every suffix of a log that a partial replay accepts gives the whole replay's state:
    the same latest items, turn, step and open calls."""
    from sessionlog.integrations.openai_agents import Conversation

    with sessionlog.open_store("memory:") as store:
        async def build() -> None:
            session = SessionLogSession("conv", store=store)
            hooks = session.run_hooks()
            await converse("run", session, hooks)
            await session.add_items([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}])
            await session.pop_item()
            await session.clear_session()
            await converse("run", session, None)
            session.close()

        asyncio.run(build())
        asyncio.run(approval_run(approval_script(True), server_managed=False,
                                 open_session=lambda: SessionLogSession("approvals", store=store)))
        accepted = 0
        for sid in ("conv", "approvals"):
            recs = list(store.read(sid))
            whole = Conversation()
            for record in recs:
                whole.feed(record)
            for start in range(len(recs)):
                part = Conversation(partial=True)
                for record in recs[start:]:
                    part.feed(record)
                if not part.sufficient:
                    continue
                accepted += 1
                assert part.items == whole.items[len(whole.items) - len(part.items):]
                assert (part.turns, part.step_number, part.request) == (whole.turns, whole.step_number, whole.request)
                assert (part.open_step is None) == (whole.open_step is None)
                assert part.latest_calls.keys() == whole.latest_calls.keys()
        assert accepted > 5


def _state(conv: Any) -> Any:
    """Everything a Conversation's next plans and ``get_items`` read."""
    def calls(c: dict[str, Any]) -> dict[str, Any]:
        return {k: (v.call_id, v.name, v.output_type, v.started, v.answered, v.awaiting) for k, v in c.items()}

    step = conv.open_step
    return (conv.items, conv.turns, conv.step_number, conv.last_seq, conv.request,
            None if step is None else (step.turn, step.step, step.first_index, calls(step.calls)),
            conv.provisional_from, conv.provisional_seq, calls(conv.latest_calls),
            step is not None and conv.latest_calls is step.calls, conv.sufficient)


_CALL_IDS = st.sampled_from(["c1", "c2", "c3"])
_ITEMS = st.one_of(
    st.just({"role": "user", "content": "hi"}),
    st.just({"type": "message", "role": "system", "content": "be brief"}),
    st.just({"type": "reasoning", "id": "rs", "summary": []}),
    st.sampled_from(["m1", "m2"]).map(lambda i: {"type": "message", "id": i, "role": "assistant",
                                                "content": [{"type": "output_text", "text": "ok"}]}),
    st.tuples(_CALL_IDS, st.sampled_from(["deploy", ""])).map(
        lambda a: {"type": "function_call", "id": "fc" + a[0], "call_id": a[0], "name": a[1], "arguments": "{}"}),
    _CALL_IDS.map(lambda c: {"type": "computer_call", "call_id": c, "action": {}}),
    _CALL_IDS.map(lambda c: {"type": "function_call_output", "call_id": c, "output": "done"}),
    _CALL_IDS.map(lambda c: {"type": "computer_call_output", "call_id": c, "output": {"type": "input_image"}}),
    st.just({"type": "web_search_call", "id": "ws", "status": "completed"}),
    st.just({"type": ["not", "a", "string"]}),
    st.just("not a dict"),
)
_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(_ITEMS, max_size=8), st.booleans()),
    st.tuples(st.just("response"), st.lists(_ITEMS, max_size=4), st.none()),
    st.tuples(st.sampled_from(["tool_start", "tool_end"]), _CALL_IDS, st.none()),
    st.tuples(st.just("request"), st.lists(_ITEMS, max_size=4), st.none()),
), max_size=12)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=_OPS, partial=st.booleans())
def test_an_add_leaves_the_state_a_replay_of_its_records_gives(ops: list[Any], partial: bool) -> None:
    """add_items works out the conversation's next state from its plan instead of feeding
    the records it appended: that state equals the one feeding the records gives, after
    any mix of adds (with and without hooks) and of what the run hooks record."""
    from sessionlog.integrations.openai_agents import Conversation, _AddPlan, _copy_items

    live, replayed = Conversation(partial=partial), Conversation(partial=partial)
    for op, arg, hooks in ops:
        if op == "add":
            plan = _AddPlan(live, _copy_items(arg), hooks=hooks)
            events = plan.events
            if events:
                live.settle(plan, live.last_seq + len(events))
        else:
            if op == "response":
                events = live.plan_response(_copy_items(arg), "resp_1")
            elif op == "tool_start":
                events = live.plan_tool_start(arg, "deploy", None)
            elif op == "tool_end":
                events = live.plan_tool_end(arg, "deploy", {"type": "function_call_output", "call_id": arg,
                                                            "output": "deployed"})
            else:
                events = live.plan_request(_copy_items(arg))
            for event in events:
                live.feed(event, live.last_seq + 1)
        for event in events:
            replayed.feed(json.loads(json.dumps(event)), replayed.last_seq + 1)
        assert _state(live) == _state(replayed)


@pytest.mark.parametrize("url_kind, offload, inline", [
    ("jsonl", None, True), ("memory", None, True), ("sqlite", None, False), ("jsonl", True, False),
])
def test_where_appends_run(url_kind: str, offload: bool | None, inline: bool, tmp_path: Path) -> None:
    """After the open (a worker thread), a local file or memory store appends on the event
    loop's thread; SQL stores, or offload=True, in a worker thread."""
    import threading

    gen = _url(url_kind, tmp_path)
    with sessionlog.open_store(next(gen)) as store:
        counting = CountingStore(store)
        threads: list[str] = []
        session_of = counting.session

        def session(session_id: str, **options: Any) -> Any:
            handle = session_of(session_id, **options)
            append = handle.append

            def recording(events: Any, **kw: Any) -> int:
                threads.append(threading.current_thread().name)
                return append(events, **kw)

            handle.append = recording
            return handle

        counting.session = session  # type: ignore[method-assign]

        async def scenario() -> str:
            s = SessionLogSession("s", store=counting, offload=offload)
            await s.get_items()
            await s.add_items([{"role": "user", "content": "hi"}])
            s.close()
            return threading.current_thread().name

        loop_thread = asyncio.run(scenario())
        assert (threads == [loop_thread]) is inline
    gen.close()


def test_run_hooks_call_the_users_own_hooks_after_recording() -> None:
    from agents import RunHooks

    seen: list[str] = []

    class Mine(RunHooks[Any]):
        async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, input_items: Any) -> None:
            seen.append("llm_start")

        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            seen.append("llm_end")

        async def on_agent_start(self, context: Any, agent: Any) -> None:
            seen.append("agent_start")

        async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
            seen.append("agent_end")

        async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
            # By now the call's intent is durable.
            recs = records(store, "s")
            assert any(r["type"] == "tool/call" and r["call_id"] == context.tool_call_id for r in recs)
            seen.append(f"tool_start {context.tool_call_id}")

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            seen.append(f"tool_end {context.tool_call_id}")

    with sessionlog.open_store("memory:") as store:
        async def scenario() -> None:
            session = SessionLogSession("s", store=store)
            await converse("run", session, session.run_hooks(Mine()), TURNS[:1], script()[:2])
            session.close()

        asyncio.run(scenario())
    assert seen[:3] == ["agent_start", "llm_start", "llm_end"]
    assert sorted(seen[3:7]) == ["tool_end c1", "tool_end c2", "tool_start c1", "tool_start c2"]
    assert seen[7:] == ["llm_start", "llm_end", "agent_end"]


def test_a_tool_that_raises_is_answered_once_with_the_sdks_error_text(tmp_path: Path) -> None:
    @function_tool
    def flaky(version: str) -> str:
        """Deploy, and fail."""
        raise RuntimeError("disk full")

    steps = [[function_call("flaky", {"version": "1"}, call_id="c1")], [assistant_message("it failed", item_id="m1")]]

    async def run(session: Any, hooks: Any) -> list[Any]:
        model = Scripted(steps)
        agent = Agent(name="ops", instructions="Be brief.", model=model, tools=[flaky])
        await Runner.run(agent, "deploy", session=session, hooks=hooks)
        return model.inputs

    sqlite = SQLiteSession("reference", str(tmp_path / "reference.db"))
    want = asyncio.run(run(sqlite, None))
    want_items = asyncio.run(sqlite.get_items())
    sqlite.close()
    with sessionlog.open_store(f"jsonl:{tmp_path / 'store'}") as store:
        async def scenario() -> tuple[list[Any], list[Any]]:
            session = SessionLogSession("s", store=store)
            inputs = await run(session, session.run_hooks())
            items = await session.get_items()
            session.close()
            return inputs, items

        inputs, items = asyncio.run(scenario())
        assert inputs == want and items == want_items
        recs = records(store, "s")
        assert [r["call_id"] for r in recs if r["type"] == "tool/result"] == ["c1"]
        assert store.scan("s").status == sessionlog.Status.CLEAN


CHILD_KILLS_ITSELF = """
import asyncio, os, signal, sys
sys.path.insert(0, {tests!r})
import test_openai_agents as t
from agents import RunHooks, set_tracing_disabled
from sessionlog.integrations.openai_agents import SessionLogSession

set_tracing_disabled(True)
ended = []

class Die(RunHooks):
    # Called after the session's own hooks made their records durable.
    async def on_llm_end(self, context, agent, response):
        if {point!r} == "after-response" and any(o.type == "function_call" for o in response.output):
            os.kill(os.getpid(), signal.SIGKILL)

    async def on_tool_end(self, context, agent, tool, result):
        ended.append(context.tool_call_id)
        if {point!r} == "after-tools" and len(ended) == 2:
            os.kill(os.getpid(), signal.SIGKILL)

async def main():
    session = SessionLogSession("conv", store={url!r})
    await t.converse("run", session, session.run_hooks(Die()), t.TURNS[:1], t.script()[:2])

asyncio.run(main())
"""


@pytest.mark.kill
@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
@pytest.mark.parametrize("point, want", [
    ("after-response", {"c1": sessionlog.TOOL_NOT_STARTED, "c2": sessionlog.TOOL_NOT_STARTED}),
    ("after-tools", {"c1": "deployed 1.2.3", "c2": "notified ops"}),
])
def test_what_survives_a_kill_at_each_point_of_a_turn(backend: str, point: str, want: dict[str, str],
                                                      tmp_path: Path) -> None:
    gen = _url(backend, tmp_path)
    url = next(gen)
    child = run_child(CHILD_KILLS_ITSELF.format(tests=str(TESTS), url=url, point=point))
    assert child.returncode == -9, child.stderr

    async def resume() -> list[Any]:
        session = SessionLogSession("conv", store=url)
        items = await session.get_items()
        session.close()
        return items

    items = asyncio.run(resume())
    assert items[0] == {"content": TURNS[0], "role": "user"}
    assert [i.get("call_id") for i in items if i.get("type") == "function_call"] == ["c1", "c2"]
    outputs = outputs_by_call(items)
    assert sorted(outputs) == ["c1", "c2"]
    for call_id, text in want.items():
        assert len(outputs[call_id]) == 1 and outputs[call_id][0].startswith(text)
    with sessionlog.open_store(url) as store:
        assert store.scan("conv").status == sessionlog.Status.CLEAN
    gen.close()


def test_an_output_or_message_of_700_kb_is_stored_as_sqlite_session_stores_it(tmp_path: Path) -> None:
    """A record holds an item's text once (the item's own member is written null and put
    back on read): an output or user message of 700 KB fits the 1 MiB record, and reads
    back equal, in its member order, after reopening."""
    big = "é" * 350_000  # 700 KB of UTF-8
    items = [
        {"role": "user", "content": big},
        {"type": "function_call", "call_id": "c1", "name": "dump", "arguments": "{}", "id": "fc1",
         "status": "completed"},
        {"type": "function_call_output", "call_id": "c1", "output": big},
    ]
    url = f"jsonl:{tmp_path}"

    async def scenario() -> list[Any]:
        reference = SQLiteSession("s", str(tmp_path / "ref.db"))
        for item in items:
            await reference.add_items([item])
        expected = await reference.get_items()
        async with SessionLogSession("s", store=url) as session:
            for item in items:
                await session.add_items([item])
        async with SessionLogSession("s", store=url) as again:
            got = await again.get_items()
        assert got == expected == items
        return got

    got = asyncio.run(scenario())
    assert [list(i) for i in got] == [list(i) for i in items]  # members in their order
    size = (tmp_path / "s.jsonl").stat().st_size
    assert size < 2 * 800_000  # each text once
    assert sessionlog.open_store(url).scan("s").damage is None
