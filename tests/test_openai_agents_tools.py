"""Tools other than function tools: the Runner calls ``on_tool_start`` for a local shell
(also computer, shell, apply-patch) tool with the run context and the tool, not with the
call. The hooks still make the call durable before the tool's body runs: the log as the
body sees it (what a SIGKILL at that moment leaves) holds its ``tool/call``, and a session
opened on that log answers the call TOOL_OUTCOME_UNKNOWN with the output type it asks for."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, LocalShellTool, Runner, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses.response_output_item import LocalShellCall  # noqa: E402
from test_openai_agents import deploy  # noqa: E402

from sessionlog.integrations.openai_agents import SessionLogSession  # noqa: E402

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
