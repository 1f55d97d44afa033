"""Hypothesis strategies for agent sessions: turns, steps, parallel tool calls, crashes."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

Event = dict[str, Any]


@st.composite
def turn_events(draw: st.DrawFn, turn: str) -> list[Event]:
    """One complete turn: user message, 1-3 steps, each with 0-4 parallel tool calls whose
    tool/call and tool/result records come in any order the runtime could produce."""
    events: list[Event] = [{"type": "turn/start", "turn": turn},
                           {"type": "user/message", "turn": turn, "content": draw(st.text(max_size=40))}]
    for step in range(1, draw(st.integers(1, 3)) + 1):
        events.append({"type": "step/start", "turn": turn, "step": step})
        if draw(st.booleans()):
            events.append({"type": "llm/request", "turn": turn, "step": step, "attempt": draw(st.integers(1, 3))})
        n_calls = draw(st.integers(0, 4))
        calls = [
            {"id": f"{turn}-s{step}-c{i}", "name": draw(st.sampled_from(["read", "write", "ls", "deploy"])),
             "arguments": {"arg": draw(st.text(max_size=12))}}
            for i in range(n_calls)
        ]
        events.append({"type": "assistant/message", "turn": turn, "step": step,
                       "content": draw(st.one_of(st.none(), st.text(max_size=30))), "tool_calls": calls})
        # Each call: tool/call then tool/result; interleave calls (parallel dispatch).
        pending = [[{"type": "tool/call", "turn": turn, "step": step, "call_id": c["id"], "name": c["name"]},
                    {"type": "tool/result", "turn": turn, "step": step, "call_id": c["id"],
                     "output": draw(st.text(max_size=60)), "is_error": draw(st.booleans())}]
                   for c in calls]
        while any(pending):
            lane = draw(st.sampled_from([p for p in pending if p]))
            events.append(lane.pop(0))
        events.append({"type": "step/end", "turn": turn, "step": step, "status": "completed"})
    events.append({"type": "turn/end", "turn": turn, "status": "completed"})
    return events


@st.composite
def crashed_sessions(draw: st.DrawFn, max_turns: int = 3) -> list[Event]:
    """The events of a session whose writer crashed after any event."""
    events: list[Event] = []
    for t in range(draw(st.integers(1, max_turns))):
        events.extend(draw(turn_events(f"t{t + 1}")))
    crash_at = draw(st.integers(0, len(events)))
    return events[:crash_at]


@st.composite
def batches(draw: st.DrawFn, events: list[Event]) -> list[list[Event]]:
    """``events`` split into append batches of 1-5 events."""
    out: list[list[Event]] = []
    i = 0
    while i < len(events):
        n = draw(st.integers(1, 5))
        out.append(events[i:i + n])
        i += n
    return out


def answered_exactly_once(records: list[Any]) -> list[str]:
    """Problems with call/result pairing in a log: every call an assistant message asked
    for must have exactly one tool/result after it, and every turn and step must close."""
    problems = []
    results: dict[str, int] = {}
    requested: list[str] = []
    open_turns: set[str] = set()
    open_steps: set[tuple[str, int]] = set()
    for r in records:
        t = r["type"]
        if t == "assistant/message":
            requested.extend(c["id"] for c in r.get("tool_calls") or [])
        elif t == "tool/result":
            results[r["call_id"]] = results.get(r["call_id"], 0) + 1
        elif t == "turn/start":
            open_turns.add(r["turn"])
        elif t == "turn/end":
            open_turns.discard(r["turn"])
        elif t == "step/start":
            open_steps.add((r["turn"], r["step"]))
        elif t == "step/end":
            open_steps.discard((r["turn"], r["step"]))
    for call in requested:
        if results.get(call, 0) != 1:
            problems.append(f"call {call} has {results.get(call, 0)} results")
    if open_turns:
        problems.append(f"open turns {sorted(open_turns)}")
    if open_steps:
        problems.append(f"open steps {sorted(open_steps)}")
    return problems
