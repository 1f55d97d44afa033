"""The text a synthetic answer to an unanswered foreign tool call carries.

Written for the model that reads it next, like sessionlog's own recovery results: what is
known, what is not, what is safe to do. The recovery code opens the text, since the model
reads only the text. Other tools write no durable "started" record before every tool body,
so the codes rest on evidence in the file (each format module says what counts):

- ``TOOL_OUTCOME_UNKNOWN``: the file shows the call started (``evidence`` names where);
  it may have run, side effects included.
- ``TOOL_NOT_STARTED``: the file shows no sign it started; it most likely did not run, but
  nothing guarantees it, so the text still says to check before redoing side effects.
"""

from __future__ import annotations

from typing import Any

from ..events import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN

TOOL: str = "sessionlog repair"


def answer_code(evidence: str | None) -> str:
    return TOOL_OUTCOME_UNKNOWN if evidence else TOOL_NOT_STARTED


def answer_text(name: str, call_id: str, evidence: str | None) -> str:
    """The output of the synthetic result for call ``call_id`` of tool ``name``."""
    if evidence:
        return (
            f"{TOOL_OUTCOME_UNKNOWN}: the call to tool {name!r} (id {call_id}) started ({evidence}), "
            "but its result was never recorded: the session was interrupted. The tool may or may not "
            "have run to completion, and any side effects may have happened. Do not blindly retry an "
            "operation with side effects: check the current state first; retry only read-only or "
            f"idempotent work. (Answer written by {TOOL}.)"
        )
    return (
        f"{TOOL_NOT_STARTED}: the call to tool {name!r} (id {call_id}) was requested, but the session "
        "was interrupted and the transcript shows no sign that it started (no progress, event or result "
        "was recorded for it). It most likely did not run. If it has side effects, check the current "
        f"state before calling it again. (Answer written by {TOOL}.)"
    )


def answered_code(text: str) -> str | None:
    """The recovery code of an answer :func:`answer_text` wrote (read back from a file
    sessionlog repaired, or from a repaired view), None for any other output: the
    conversation's events mark such a result as sessionlog's own (``code``,
    ``synthetic``), as sessionlog marks the results it writes in its own logs."""
    for code in (TOOL_OUTCOME_UNKNOWN, TOOL_NOT_STARTED):
        if text.startswith(f"{code}: the call to tool ") and text.endswith(f"(Answer written by {TOOL}.)"):
            return code
    return None


def result_event(call_id: str | None, output: str, is_error: bool) -> dict[str, Any]:
    """The ``tool/result`` event of a foreign tool result; an answer sessionlog wrote is an
    error with its recovery ``code`` and ``"synthetic": true``."""
    event: dict[str, Any] = {"type": "tool/result", "call_id": call_id, "output": output, "is_error": is_error}
    code = answered_code(output)
    if code is not None:
        event.update(is_error=True, code=code, synthetic=True)
    return event


ORPHAN_NOTE = f"[{TOOL}: the following is a tool result for call "


def orphan_text(call_id: str) -> str:
    """The note that replaces a result whose call is missing, kept as plain text."""
    return (
        f"{ORPHAN_NOTE}{call_id}, whose tool call is not in the "
        "message before it; it is kept here as text so that the conversation stays valid.]"
    )
