"""A complete agent loop on sessionlog's runtime API, with a scripted model (no network).

Run it:  python examples/agent_loop.py [STORE_DIR]

What it shows, in the order a runtime does it:

- one write-behind writer (``store.writer()``) owns the session for the whole run;
- every step runs in a step scope (``writer.step``): if anything in it fails, the calls
  the assistant asked for are answered and the step and turn are closed before the
  exception propagates;
- a checkpoint before each model request (``step.model_request``): the ``llm/request``
  record is durable before the request is sent, ``llm/response`` follows it;
- the assistant's tool calls run through ``dispatch_tools``: each ``tool/call`` is
  durable before its body runs; a tool that raises becomes an error result the model
  reads (``TOOL_ERROR``), a tool the runtime does not have becomes ``TOOL_NOT_FOUND``,
  and the step goes on.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from typing import Any

import sessionlog
from sessionlog import ToolOutcome, dispatch_tools


# --- tools: take the call's arguments, return str or ToolOutcome, raise on failure -------


async def get_weather(arguments: dict[str, Any]) -> str:
    return f"sunny, 21 C in {arguments['city']}"


async def book_table(arguments: dict[str, Any]) -> ToolOutcome:
    if arguments["people"] > 8:
        return ToolOutcome("no table for more than 8 people", is_error=True)
    return ToolOutcome(f"booked a table for {arguments['people']} at {arguments['time']}")


async def send_invite(arguments: dict[str, Any]) -> str:
    raise ConnectionError("mail server refused the connection")


TOOLS = {"get_weather": get_weather, "book_table": book_table, "send_invite": send_invite}


# --- a scripted model: what a real one would answer, step by step -------------------------


class ScriptedModel:
    """Answers from a script; a real runtime calls a provider with ``view.items``."""

    def __init__(self) -> None:
        self.script = [
            {"content": None, "tool_calls": [
                {"id": "call_1", "name": "get_weather", "arguments": {"city": "Lisbon"}},
                {"id": "call_2", "name": "book_table", "arguments": {"people": 4, "time": "20:00"}},
                {"id": "call_3", "name": "send_invite", "arguments": {"to": "team"}},
                {"id": "call_4", "name": "order_flowers", "arguments": {}},
            ]},
            {"content": "final answer: sunny in Lisbon, table booked for 4 at 20:00; the invite could not "
                        "be sent (mail server down) and I cannot order flowers.", "tool_calls": []},
        ]
        self.calls = 0

    async def respond(self, items: list[Any]) -> dict[str, Any]:
        reply = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return {"id": f"resp_{self.calls}", **reply}


# --- the loop -----------------------------------------------------------------------------


async def run_turn(store: sessionlog.EventStore, writer: Any, sid: str, turn: str, text: str,
                   model: ScriptedModel) -> str:
    await writer.append(sid, [{"type": "turn/start", "turn": turn},
                              {"type": "user/message", "turn": turn, "content": text}])
    carried: list[str] = []  # the call ids whose results the next request carries
    for number in range(1, 10):
        async with writer.step(sid, turn=turn) as step:
            await step.append_async([{"type": "step/start", "turn": turn, "step": number}])
            async with step.model_request(f"{turn}.{number}", results=carried) as request:
                view = sessionlog.project(store.read(sid), "openai")  # what the provider is sent
                reply = await model.respond(view.items)
                request.response_id = reply["id"]
            await step.append_async([{"type": "assistant/message", "turn": turn, "step": number,
                                      "content": reply["content"], "tool_calls": reply["tool_calls"]}])
            await dispatch_tools(step, reply["tool_calls"], TOOLS)
            await step.append_async([{"type": "step/end", "turn": turn, "step": number, "status": "completed"}])
        carried = [call["id"] for call in reply["tool_calls"]]
        if not reply["tool_calls"]:
            await writer.append(sid, [{"type": "turn/end", "turn": turn, "status": "completed"}])
            return reply["content"]
    raise RuntimeError("the model kept calling tools")


async def main(directory: str) -> None:
    store = sessionlog.open_store(f"jsonl:{directory}")
    sid = "dinner-plans"
    store.create(sid)
    async with store.writer() as writer:
        answer = await run_turn(store, writer, sid, "t1", "Plan dinner in Lisbon tonight for 4.", ScriptedModel())
    print(answer)
    for record in store.read(sid):
        detail = record.get("call_id") or record.get("request") or record.get("status") or ""
        print(f"{record.seq:3} {record.type:18} {detail} {record.get('code') or ''}".rstrip())
    print("scan:", store.scan(sid).status)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="sessionlog-example-")))
