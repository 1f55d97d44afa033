"""Tools other than function tools: the Runner calls ``on_tool_start`` for a local shell
(also computer, shell, apply-patch) tool with the run context and the tool, not with the
call. The hooks still make the call durable before the tool's body runs: the log as the
body sees it (what a SIGKILL at that moment leaves) holds its ``tool/call``, and a session
opened on that log answers the call TOOL_OUTCOME_UNKNOWN with the output type it asks for.
Every kind's output (computer, local shell, shell, apply-patch, custom, function) is written
once, with or without the hooks, and a tool hook delivered after the Runner saved its call,
or twice, writes nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import (  # noqa: E402
    Agent,
    ApplyPatchTool,
    ComputerTool,
    CustomTool,
    LocalShellTool,
    RunHooks,
    Runner,
    RunState,
    ShellTool,
    SQLiteSession,
    set_tracing_disabled,
)
from agents.computer import Computer  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseApplyPatchToolCall,
    ResponseComputerToolCall,
    ResponseCustomToolCall,
    ResponseFunctionShellToolCall,
)
from openai.types.responses.response_output_item import LocalShellCall  # noqa: E402
from test_openai_agents import deploy  # noqa: E402

import sessionlog  # noqa: E402
from sessionlog.integrations.openai_agents import SessionLogRunHooks, SessionLogSession  # noqa: E402

set_tracing_disabled(True)


def shell_call(call_id: str, *command: str) -> LocalShellCall:
    return LocalShellCall(id=f"lsc_{call_id}", call_id=call_id, status="completed", type="local_shell_call",
                          action={"type": "exec", "command": list(command), "env": {}})


def started_calls(log: bytes) -> list[str]:
    return [r["call_id"] for r in map(json.loads, log.splitlines()) if r["type"] == "tool/call"]


def test_a_local_shell_call_is_durable_before_its_body_runs(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    seen: dict[str, bytes] = {}

    def executor(request: Any) -> str:
        call_id = request.data.call_id
        seen[call_id] = (store / "s.jsonl").read_bytes()  # what a kill right now leaves
        return f"ran {call_id}\n"

    model = ScriptedModel([
        [shell_call("sh1", "echo", "one"), shell_call("sh2", "echo", "two"),
         function_call("deploy", {"version": "1.2.3"}, call_id="f1")],
        [assistant_message("done", item_id="m1")],
    ])
    agent = Agent(name="ops", model=model, tools=[LocalShellTool(executor=executor), deploy])

    async def run() -> list[Any]:
        async with SessionLogSession("s", store=f"jsonl:{store}") as session:
            await Runner.run(agent, "run both", session=session, hooks=session.run_hooks())
            return await session.get_items()

    items = asyncio.run(run())
    assert set(seen) == {"sh1", "sh2"}
    for call_id, log in seen.items():
        assert call_id in started_calls(log)  # its intent was durable before it ran
    outputs = {i["call_id"]: i for i in items if i.get("type", "").endswith("_output")}
    assert outputs["sh1"] == {"type": "local_shell_call_output", "call_id": "sh1", "output": "ran sh1\n"}
    assert outputs["sh2"]["output"] == "ran sh2\n" and outputs["f1"]["output"] == "deployed 1.2.3"
    assert len(items) == 1 + 3 + 3 + 1  # nothing doubled by the hooks' records

    # A kill inside the first shell body: the session opened on that log pairs every call.
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "s.jsonl").write_bytes(seen["sh1"])

    async def resume() -> list[Any]:
        async with SessionLogSession("s", store=f"jsonl:{crashed}") as session:
            return await session.get_items()

    resumed = asyncio.run(resume())
    answers = {i["call_id"]: i for i in resumed if i.get("type", "").endswith("_output")}
    assert answers.keys() == {"sh1", "sh2", "f1"}
    assert answers["sh1"]["type"] == "local_shell_call_output"
    assert "TOOL_OUTCOME_UNKNOWN" in answers["sh1"]["output"]
    # The others were not started when the first body ran, unless the Runner had marked
    # them executed already (then they are honestly unknown too): never "not started"
    # for a call whose intent is in the log.
    for call_id in ("sh2", "f1"):
        want = "TOOL_OUTCOME_UNKNOWN" if call_id in started_calls(seen["sh1"]) else "TOOL_NOT_STARTED"
        assert want in answers[call_id]["output"], (call_id, answers[call_id])


# --- every kind of tool the module maps: each output exactly once -------------------------


class Screen(Computer):
    """A computer whose every action succeeds and whose screenshot is four bytes."""

    environment = "linux"
    dimensions = (800, 600)

    def screenshot(self) -> str:
        return "AAAA"

    def click(self, x: int, y: int, button: str) -> None:
        pass

    def double_click(self, x: int, y: int) -> None:
        pass

    def scroll(self, x: int, y: int, scroll_x: int, scroll_y: int) -> None:
        pass

    def type(self, text: str) -> None:
        pass

    def wait(self) -> None:
        pass

    def move(self, x: int, y: int) -> None:
        pass

    def keypress(self, keys: list[str]) -> None:
        pass

    def drag(self, path: list[tuple[int, int]]) -> None:
        pass


class Editor:
    def create_file(self, operation: Any) -> str:
        return f"created {operation.path}"

    def update_file(self, operation: Any) -> str:
        return f"updated {operation.path}"

    def delete_file(self, operation: Any) -> str:
        return f"deleted {operation.path}"


async def grep(context: Any, text: str) -> str:
    return f"found {text}"


def every_kind_of_call(n: int) -> list[Any]:
    """One response asking for one call of each tool kind the adapter maps (turn ``n``)."""
    return [
        ResponseComputerToolCall(id=f"cu_{n}", call_id=f"cu{n}", pending_safety_checks=[], status="completed",
                                 type="computer_call", action={"type": "click", "x": 1, "y": 2, "button": "left"}),
        shell_call(f"ls{n}", "echo", "one"),
        ResponseFunctionShellToolCall(id=f"shc_{n}", call_id=f"sh{n}", status="completed", type="shell_call",
                                      action={"commands": ["echo two"]}),
        ResponseApplyPatchToolCall(id=f"ap_{n}", call_id=f"ap{n}", status="completed", type="apply_patch_call",
                                   operation={"type": "create_file", "path": "a.txt", "diff": "+hi\n"}),
        ResponseCustomToolCall(id=f"ct_{n}", call_id=f"ct{n}", name="grep", input="needle", type="custom_tool_call"),
        function_call("deploy", {"version": "1.2.3"}, call_id=f"f{n}"),
    ]


KINDS = ["cu", "ls", "sh", "ap", "ct", "f"]


def every_kind_agent(model: ScriptedModel, *, approvals: bool = False) -> Agent[Any]:
    return Agent(name="ops", model=model, tools=[
        ComputerTool(computer=Screen()), LocalShellTool(executor=lambda request: "ran\n"),
        ShellTool(executor=lambda request: "ran", needs_approval=approvals),
        ApplyPatchTool(editor=Editor(), needs_approval=approvals),
        CustomTool(name="grep", description="Search.", on_invoke_tool=grep), deploy])


async def resume_every_kind(store: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """Open the session a crash left in ``store`` and run one more turn with every tool
    kind: the items the reopened session held, the input the model was sent, the items
    after the turn."""
    model = ScriptedModel([[assistant_message("checked", item_id="m9")]])
    async with SessionLogSession("s", store=store) as session:
        items = await session.get_items()
        await Runner.run(every_kind_agent(model), "what happened?", session=session, hooks=session.run_hooks())
        sent = json.loads(json.dumps(model.calls[0].input))
    async with SessionLogSession("s", store=store) as session:
        return items, sent, await session.get_items()


def two_turns() -> list[Any]:
    return [every_kind_of_call(1), [assistant_message("done", item_id="m1")],
            every_kind_of_call(2), [assistant_message("again", item_id="m2")]]


def output_ids(items: list[Any]) -> list[str]:
    return [i["call_id"] for i in items if isinstance(i, dict) and str(i.get("type", "")).endswith("_output")]


def assert_each_output_once(store: sessionlog.EventStore, items: list[Any], calls: list[str]) -> None:
    """What a user checks: every call has one output item and one ``tool/result`` record,
    the provider view pairs them, the log scans clean."""
    assert sorted(output_ids(items)) == sorted(calls)
    results = [r["call_id"] for r in map(dict, store.read("s")) if r["type"] == "tool/result"]
    assert sorted(results) == sorted(calls)
    view = sessionlog.project(store.read("s"), "responses")
    assert sessionlog.check_pairing(view.items, "responses") is None and not view.issues
    assert store.scan("s").status == sessionlog.Status.CLEAN


async def reference_run(tmp_path: Path) -> tuple[list[Any], list[Any]]:
    """What the SDK's own SQLiteSession sends the model and keeps over ``two_turns``."""
    sqlite = SQLiteSession("reference", str(tmp_path / "reference.db"))
    try:
        model = ScriptedModel(two_turns())
        agent = every_kind_agent(model)
        for text in ("go", "again"):
            await Runner.run(agent, text, session=sqlite)
        return [json.loads(json.dumps(c.input)) for c in model.calls], await sqlite.get_items()
    finally:
        sqlite.close()


@pytest.mark.parametrize("hooks", [False, True], ids=["session-only", "run-hooks"])
def test_every_tool_kind_is_written_once(hooks: bool, tmp_path: Path) -> None:
    want_inputs, want_items = asyncio.run(reference_run(tmp_path))
    with sessionlog.open_store(f"jsonl:{tmp_path / 'store'}") as store:
        async def run() -> tuple[list[Any], list[Any]]:
            model = ScriptedModel(two_turns())
            agent = every_kind_agent(model)
            async with SessionLogSession("s", store=store) as session:
                for text in ("go", "again"):
                    await Runner.run(agent, text, session=session, hooks=session.run_hooks() if hooks else None)
                return [json.loads(json.dumps(c.input)) for c in model.calls], await session.get_items()

        inputs, items = asyncio.run(run())
        assert inputs == want_inputs and items == want_items
        assert_each_output_once(store, items, [f"{kind}{n}" for n in (1, 2) for kind in KINDS])


class LateHooks(SessionLogSession):
    """Delivers every tool hook of a turn once more right after the Runner saved the turn:
    a hook that arrives after ``add_items``, or twice, must write nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delivered: list[tuple[str, tuple[Any, ...]]] = []

    def run_hooks(self, inner: Any = None) -> Any:
        session = self

        class Remember(RunHooks[Any]):
            async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
                session.delivered.append(("on_tool_start", (context, agent, tool)))

            async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
                session.delivered.append(("on_tool_end", (context, agent, tool, result)))

        return super().run_hooks(Remember())

    async def add_items(self, items: list[Any], **kwargs: Any) -> None:
        await super().add_items(items, **kwargs)
        late = SessionLogRunHooks(self)
        delivered, self.delivered = self.delivered, []
        for name, args in delivered:
            await getattr(late, name)(*args)


def test_a_tool_hook_after_the_turn_is_saved_writes_nothing(tmp_path: Path) -> None:
    _, want_items = asyncio.run(reference_run(tmp_path))
    with sessionlog.open_store(f"jsonl:{tmp_path / 'store'}") as store:
        async def run() -> list[Any]:
            model = ScriptedModel(two_turns())
            agent = every_kind_agent(model)
            async with LateHooks("s", store=store) as session:
                for text in ("go", "again"):
                    await Runner.run(agent, text, session=session, hooks=session.run_hooks())
                assert not session.delivered
                return await session.get_items()

        items = asyncio.run(run())
        assert items == want_items
        assert_each_output_once(store, items, [f"{kind}{n}" for n in (1, 2) for kind in KINDS])
        started = started_calls((tmp_path / "store" / "s.jsonl").read_bytes())
        assert sorted(started) == sorted(f"{kind}{n}" for n in (1, 2) for kind in KINDS)


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_shell_and_apply_patch_approvals_write_each_output_once(decision: str, tmp_path: Path) -> None:
    """Shell and apply-patch calls that pause the run for a human: the resumed run's
    outputs (the tools' or the rejections') are written once, beside the others'."""
    with sessionlog.open_store(f"jsonl:{tmp_path / 'store'}") as store:
        async def run() -> list[Any]:
            model = ScriptedModel([every_kind_of_call(1), [assistant_message("done", item_id="m1")]])
            agent = every_kind_agent(model, approvals=True)
            session = SessionLogSession("s", store=store)
            result = await Runner.run(agent, "go", session=session, hooks=session.run_hooks())
            assert sorted(_call_id_of(i) for i in result.interruptions) == ["ap1", "sh1"]
            saved = result.to_state().to_json()
            session.close()
            state = await RunState.from_json(agent, saved)
            for item in state.get_interruptions():
                getattr(state, decision)(item)
            async with SessionLogSession("s", store=store) as session:
                result = await Runner.run(agent, state, session=session, hooks=session.run_hooks())
                assert result.final_output == "done"
                return await session.get_items()

        items = asyncio.run(run())
        assert_each_output_once(store, items, [f"{kind}1" for kind in KINDS])
        recs = [dict(r) for r in store.read("s")]
        states = [(r["call_id"], r["state"]) for r in recs if r["type"] == "tool/approval"]
        decided = "approved" if decision == "approve" else "rejected"
        assert sorted(states) == [("ap1", decided), ("ap1", "requested"), ("sh1", decided), ("sh1", "requested")]
        # A rejected call never ran: no durable intent claims it did.
        assert ("sh1" in started_calls(b"\n".join(r.raw for r in store.read("s")))) == (decision == "approve")


def _call_id_of(interruption: Any) -> str:
    raw = interruption.raw_item
    return raw["call_id"] if isinstance(raw, dict) else raw.call_id


class SavedBeforeTurn(SessionLogSession):
    """Keeps the log as each ``add_items`` finds it: what a kill just before the Runner
    saves a turn (after every hook of its tools) leaves."""

    def __init__(self, *args: Any, log: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log = log
        self.before_add: list[bytes] = []

    async def add_items(self, items: list[Any], **kwargs: Any) -> None:
        self.before_add.append(self.log.read_bytes())
        await super().add_items(items, **kwargs)


def test_a_kill_between_the_hooks_and_the_saved_turn_answers_every_call_once(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()

    async def run() -> list[bytes]:
        model = ScriptedModel([every_kind_of_call(1), [assistant_message("done", item_id="m1")]])
        async with SavedBeforeTurn("s", store=f"jsonl:{store}", log=store / "s.jsonl") as session:
            await Runner.run(every_kind_agent(model), "go", session=session, hooks=session.run_hooks())
            return session.before_add

    # The Runner saves the user message, then the tool step once every tool returned.
    before_tools_saved = asyncio.run(run())[1]
    calls = [f"{kind}1" for kind in KINDS]
    assert sorted(started_calls(before_tools_saved)) == sorted(calls)  # every intent was durable
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "s.jsonl").write_bytes(before_tools_saved)

    with sessionlog.open_store(f"jsonl:{crashed}") as reopened:
        items, sent, after = asyncio.run(resume_every_kind(reopened))
        outputs = {i["call_id"]: i for i in items if str(i.get("type", "")).endswith("_output")}
        assert sorted(output_ids(items)) == sorted(calls)
        # The hooks made the function and custom tools' outputs durable: kept as they were.
        assert outputs["f1"]["output"] == "deployed 1.2.3" and outputs["ct1"]["output"] == "found needle"
        # The others' outputs were not: they may have run, said once, with the type each asks for
        # (its shape: test_openai_agents_shapes). A screenshot has no room for the text: a
        # developer message after the outputs says it.
        notes = [i["content"] for i in items if i.get("type") == "message" and i.get("role") == "developer"]
        for call_id, type_ in [("cu1", "computer_call_output"), ("ls1", "local_shell_call_output"),
                               ("sh1", "shell_call_output"), ("ap1", "apply_patch_call_output")]:
            assert outputs[call_id]["type"] == type_
            said = notes[0] if call_id == "cu1" else json.dumps(outputs[call_id]["output"])
            assert sessionlog.TOOL_OUTCOME_UNKNOWN in said and f"(id {call_id})" in said
        assert output_ids(sent) == output_ids(items)  # the next request carries each once
        assert_each_output_once(reopened, after, calls)
