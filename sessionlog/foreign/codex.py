"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-<timestamp>-<id>.jsonl``).

Lines are ``{"timestamp", "type", "payload"}`` (newer builds add ``ordinal``). What this
module relies on:

- Calls and outputs are ``response_item`` payloads paired by ``call_id``:
  ``function_call`` and ``local_shell_call`` are answered by ``function_call_output``,
  ``custom_tool_call`` by ``custom_tool_call_output``, ``tool_search_call`` by
  ``tool_search_output``. ``event_msg`` records mirror them for the UI and never pair.
- A ``compacted`` line replaces the history Codex resumes with its
  ``replacement_history``: pairing restarts there, with the calls and outputs it holds.
  Codex resumes that history as written, so a call in it followed there by a message is
  answered inside it, before that message, and an output of it (or a line after it)
  answering such a call after that message moves into it, before that message: the
  compacted line's payload is rewritten (refused in a rollout with ordinals, below).

Repair, in the shape Codex itself uses when it patches a prompt: for each call without an
output, an output item with the same ``call_id`` carrying sessionlog's recovery text and
code (its ``output`` opens with the code; a ``tool_search_output``, which has no text, is
``status: "incomplete"`` with no tools and the code and text in its ``sessionlog_recovery``
member), placed after the call and the items of the same response (before the next
``message`` or ``compacted`` line; at the end of the file when there is none, which makes the
repair a durable append). Its ``timestamp`` is that of the nearest line before it that has
one (a string, as Codex writes); at the end of a file whose lines carry ``ordinal`` it continues them, elsewhere it
carries none (renumbering the lines after it would rewrite them). A rollout whose lines carry
``ordinal`` is one Codex keeps byte offsets into (its history projection, forks): its
durable prefix (every line up to the last newline) is never changed or shifted. Answers at
its end are appended, each with the next ordinal in the member order its lines use, after
a torn last line is cut; a repair that would do anything else (an answer before the end, a
moved, quarantined or rewritten line, an undecodable line removed) is refused, ``--force``
included (:attr:`sessionlog.foreign.Examination.in_place_refusal`). An output whose call is
missing, or a second output for a call, is removed into the quarantine file, as Codex
drops them from the prompt it builds. The file stays at its path (Codex's SQLite index names
it).

Evidence that a call started (``TOOL_OUTCOME_UNKNOWN``): an ``event_msg`` naming its
``call_id`` (``exec_command_begin``/``end``, ``patch_apply_begin``, ``mcp_tool_call_begin``, ...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import Stamps, content_text, str_or_none
from .answers import answer_code, answer_text, result_event
from .lines import Line, encode_entry, with_members
from .plan import (DUPLICATE_CALL, DUPLICATE_ORDINAL, DUPLICATE_RESULT, MISPLACED_OUTPUT, ORPHAN_RESULT,
                   UNANSWERED_CALL, Analysis, Finding)

TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
ANSWER = {
    "function_call": "function_call_output",
    "local_shell_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "tool_search_call": "tool_search_output",
}
OUTPUTS = frozenset(ANSWER.values())


def _payload(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    payload = obj.get("payload")
    return payload if isinstance(payload, Mapping) else {}


def _kind(item: Mapping[str, Any]) -> str | None:
    """A line's or item's ``type``; None when it is not a string (names no type)."""
    return str_or_none(item.get("type"))


def _call_id(item: Mapping[str, Any]) -> str | None:
    """The call an item names; None (no call) when missing, empty or not a string."""
    cid = item.get("call_id")
    if not isinstance(cid, str) and item.get("type") == "local_shell_call":
        cid = item.get("id")
    return cid if isinstance(cid, str) and cid else None


def _arguments(item: Mapping[str, Any]) -> Any:
    """A call's arguments as a sessionlog ``tool_calls`` entry holds them: a
    ``function_call``'s ``arguments`` (the JSON string Codex keeps), a ``tool_search_call``'s
    ``arguments`` or a ``local_shell_call``'s ``action`` (JSON objects). A
    ``custom_tool_call``'s ``input`` is free text (an ``apply_patch`` patch), not JSON: it
    is the object ``{"input": <text>}``, so that every view's arguments are JSON."""
    if item.get("type") == "custom_tool_call":
        return {"input": item.get("input")}
    return item.get("arguments", item.get("input", item.get("action")))


def _tool_name(item: Mapping[str, Any]) -> str:
    name = item.get("name")
    return name if isinstance(name, str) else str(item.get("type"))


def _history(lines: list[Line]) -> list[tuple[int, Mapping[str, Any]]]:
    """The items Codex resumes with, as (line index, item): ``response_item`` payloads in
    order, restarted by each ``compacted`` line's ``replacement_history``."""
    history: list[tuple[int, Mapping[str, Any]]] = []
    for line in lines:
        obj = line.obj
        if obj is None:
            continue
        kind = obj.get("type")
        if kind == "compacted":
            replacement = _payload(obj).get("replacement_history")
            history = [(line.index, item) for item in replacement if isinstance(item, Mapping)] \
                if isinstance(replacement, list) else []
            message = _payload(obj).get("message")
            if not isinstance(replacement, list) and isinstance(message, str):
                history = [(line.index, {"type": "message", "role": "user",
                                         "content": [{"type": "input_text", "text": message}]})]
        elif kind == "response_item":
            history.append((line.index, _payload(obj)))
    return history


def _epochs(lines: list[Line]) -> list[list[tuple[int, Mapping[str, Any]]]]:
    """Every stretch pairing happens in: the lines before the first ``compacted``, then
    each ``compacted`` line's replacement history with the lines up to the next one."""
    return [[(index, item) for index, _, item in epoch] for epoch in _placed_epochs(lines)]


def _placed_epochs(lines: list[Line]) -> list[list[tuple[int, int | None, Mapping[str, Any]]]]:
    """:func:`_epochs` with each item's place: (line index, its position in the line's
    replacement history, or None for a ``response_item`` line, item)."""
    epochs: list[list[tuple[int, int | None, Mapping[str, Any]]]] = [[]]
    for line in lines:
        obj = line.obj
        if obj is None:
            continue
        if obj.get("type") == "compacted":
            replacement = _payload(obj).get("replacement_history")
            epochs.append([(line.index, pos, item) for pos, item in enumerate(replacement)
                           if isinstance(item, Mapping)] if isinstance(replacement, list) else [])
        elif obj.get("type") == "response_item":
            epochs[-1].append((line.index, None, _payload(obj)))
    return epochs


def _next_message(history: Sequence[Any], pos: int) -> int | None:
    """The position of the first ``message`` item after position ``pos`` of a replacement
    history, None when none follows."""
    return next((p for p in range(pos + 1, len(history))
                 if isinstance(history[p], Mapping) and history[p].get("type") == "message"), None)


class Codex:
    """The Codex rollout reader/repairer."""

    name = "codex"
    title = "Codex rollout"
    native_view = "responses"

    def sniff(self, objects: list[dict[str, Any]], head: bytes) -> bool:
        for obj in objects:
            return (_kind(obj) in TYPES and isinstance(obj.get("timestamp"), str)
                    and isinstance(obj.get("payload"), Mapping))
        return head.startswith(b'{"timestamp":"') and any(
            f'","type":"{t}"'.encode() in head[:80] for t in TYPES)

    def analyze(self, lines: list[Line], lost: Sequence[Line] = ()) -> Analysis:
        analysis = Analysis()
        plan = analysis.plan
        evidence: dict[str, str] = {}
        numbered = [obj for line in lines if (obj := line.obj) is not None and type(obj.get("ordinal")) is int]
        next_ordinal = max(obj["ordinal"] for obj in numbered) + 1 if numbered else None
        # The member order of the lines Codex numbers: its latest whole line's.
        shape = next((obj for obj in reversed(numbered) if {"timestamp", "type", "payload"} <= obj.keys()), None)
        if numbered:
            analysis.offsets_indexed = (
                "its lines carry `ordinal`s, and Codex keeps byte offsets into such a rollout (its history "
                "projection resumes reading at a stored offset and expects the next ordinal there; a fork "
                "keeps the offset it branched off at)")
            self._repeated_ordinals(lines, analysis)
        for line in lines:
            obj = line.obj
            if obj is not None and obj.get("type") == "session_meta":
                sid = _payload(obj).get("id")
                analysis.session = sid if isinstance(sid, str) and analysis.session is None else analysis.session
            if obj is not None and obj.get("type") == "event_msg":
                cid = _payload(obj).get("call_id")
                if isinstance(cid, str) and cid not in evidence:
                    evidence[cid] = f"line {line.number}: event_msg {_payload(obj).get('type')}"
        last = len(lines) - 1
        # Edits of compacted lines' replacement histories, by line index: the positions of
        # the items removed (or moved) from it, and the items put before a position (moved
        # outputs first, then answers).
        history_drops: dict[int, set[int]] = {}
        history_before: dict[int, dict[int, list[Mapping[str, Any]]]] = {}

        def history_of(index: int) -> list[Any]:
            obj = lines[index].obj
            assert obj is not None
            return _payload(obj)["replacement_history"]

        def put_in_history(index: int, before: int, item: Mapping[str, Any]) -> None:
            history_before.setdefault(index, {}).setdefault(before, []).append(item)

        for epoch in _placed_epochs(lines):
            calls: dict[str, tuple[int, int | None, Mapping[str, Any]]] = {}
            answered: dict[str, Mapping[str, Any]] = {}  # call id -> its output
            last_message = (-1, -1)  # (line, position in its history) of the latest message item
            for index, pos, item in epoch:
                kind = _kind(item)
                cid = _call_id(item)
                here = (index, -1 if pos is None else pos)
                if kind == "message":
                    last_message = here
                if kind in ANSWER and cid is not None:
                    if cid not in calls:
                        calls[cid] = (index, pos, item)
                        continue
                    first = lines[calls[cid][0]].number
                    what = (f"repeats the call of line {first}" if item == calls[cid][2] else
                            f"reuses the call_id of another call (line {first}; its output, if any, answers that one)")
                    if pos is None:
                        plan.drop[index] = DUPLICATE_CALL
                        analysis.findings.append(Finding(
                            DUPLICATE_CALL, lines[index].number,
                            f"{kind} {cid} {what}; repair moves the line to the quarantine file", call_id=cid))
                    else:  # an item of the compacted history on line ``index``
                        history_drops.setdefault(index, set()).add(pos)
                        analysis.findings.append(Finding(
                            DUPLICATE_CALL, lines[index].number,
                            f"{kind} {cid} in the compacted history {what}; repair removes the item from that "
                            "history (the backup keeps it)", call_id=cid))
                elif kind in OUTPUTS:
                    cid = cid or ""
                    bad = ORPHAN_RESULT if cid not in calls else DUPLICATE_RESULT if cid in answered else None
                    if bad is None:
                        answered[cid] = item
                        call_line, call_pos, _ = calls[cid]
                        call_here = (call_line, -1 if call_pos is None else call_pos)
                        message = None if call_pos is None else _next_message(history_of(call_line), call_pos)
                        if message is not None and here > (call_line, message):
                            # A message of the compacted history follows the call there: Codex
                            # resumes that history as it is, so the output goes into it, before
                            # that message.
                            put_in_history(call_line, message, item)
                            if pos is not None:
                                history_drops.setdefault(index, set()).add(pos)
                                analysis.findings.append(Finding(
                                    MISPLACED_OUTPUT, lines[index].number,
                                    f"{kind} for {cid} in the compacted history comes after a message that follows "
                                    "its call there; repair moves the item, unchanged, before that message in that "
                                    "history", call_id=cid))
                            else:
                                plan.drop[index] = MISPLACED_OUTPUT
                                analysis.findings.append(Finding(
                                    MISPLACED_OUTPUT, lines[index].number,
                                    f"{kind} for {cid} comes after a message that follows its call in the compacted "
                                    f"history of line {lines[call_line].number}; repair moves the item, unchanged, "
                                    "into that history before that message (the line goes to the quarantine file)",
                                    call_id=cid))
                        elif call_here < last_message < here and pos is None:
                            # A message between a call and its output is rejected: the output
                            # moves, byte for byte, to where an answer to the call goes.
                            plan.move[index] = self._answer_point(lines, call_line)
                            analysis.findings.append(Finding(
                                MISPLACED_OUTPUT, lines[index].number,
                                f"{kind} for {cid} comes after a message that follows its call (line "
                                f"{lines[call_line].number}); repair moves the line, unchanged, before that "
                                "message", call_id=cid))
                        continue
                    why = ("answers no call before it" if bad == ORPHAN_RESULT
                           else "is a second output for its call, the same as its first" if item == answered[cid]
                           else "is a second output for its call, different from its first (one call has one "
                           "output: the first answers it)")
                    analysis.orphans.append(cid)
                    if pos is None:
                        plan.drop[index] = bad
                        analysis.findings.append(Finding(
                            bad, lines[index].number,
                            f"{kind} for {cid!r} {why}; repair moves the line to the quarantine file (Codex drops "
                            "it too)", call_id=cid))
                    else:  # an item of the compacted history on line ``index``
                        history_drops.setdefault(index, set()).add(pos)
                        analysis.findings.append(Finding(
                            bad, lines[index].number,
                            f"{kind} for {cid!r} in the compacted history {why}; repair removes the item from that "
                            "history (the backup keeps it)", call_id=cid))
            for cid, (index, pos, item) in calls.items():
                if cid in answered:
                    continue
                ev = evidence.get(cid)
                code = answer_code(ev)
                text = answer_text(_tool_name(item), cid, ev)
                message = None if pos is None else _next_message(history_of(index), pos)
                if message is not None:
                    # In a compacted history, with a message after the call there: the answer
                    # goes into that history, before that message (Codex resumes it as it is).
                    put_in_history(index, message, _output_line({}, item, cid, code, text, None)["payload"])
                    plan.added.append({"type": ANSWER[str(_kind(item))], "call_id": cid, "code": code,
                                       "in_line": lines[index].number})
                    where = "inside that history, before the message that follows it there"
                else:
                    after = self._answer_point(lines, index)
                    template = next((obj for line in reversed(lines[: after + 1]) if (obj := line.obj) is not None
                                     and isinstance(obj.get("timestamp"), str)), lines[index].obj or {})
                    ordinal = None
                    if after == last and next_ordinal is not None:
                        ordinal, next_ordinal = next_ordinal, next_ordinal + 1
                    plan.insert(after, encode_entry(_output_line(template, item, cid, code, text, ordinal,
                                                                 shape if ordinal is not None else None)))
                    plan.added.append({"type": ANSWER[str(_kind(item))], "call_id": cid, "code": code,
                                       "after_line": lines[after].number})
                    where = None
                analysis.unanswered.append(cid)
                analysis.findings.append(Finding(
                    UNANSWERED_CALL, lines[index].number,
                    f"{item.get('type')} {cid} ({_tool_name(item)})" + (" in the compacted history" if pos is not None
                                                                       else "")
                    + f" has no output; repair answers it {code}" + (f" ({ev})" if ev else "")
                    + (f", {where}" if where else ""), call_id=cid, code=code))
        for index in sorted(set(history_drops) | set(history_before)):
            obj = lines[index].obj
            assert obj is not None
            payload = _payload(obj)
            drops, before = history_drops.get(index, set()), history_before.get(index, {})
            kept: list[Any] = []
            for pos, item in enumerate(payload["replacement_history"]):
                kept += before.get(pos, ())
                if pos not in drops:
                    kept.append(item)
            plan.replace[index] = with_members(lines[index], {"payload": {**payload, "replacement_history": kept}})
        return analysis

    @staticmethod
    def _repeated_ordinals(lines: list[Line], analysis: Analysis) -> None:
        """Report every line whose ``ordinal`` an earlier line carries (Codex's writer reuses
        one after an unfinished turn: openai/codex #41566, #44609, #41079): Codex's history
        projection reads lines in order expecting each ordinal to follow the one before,
        and stops for good at the first repeat ("expected ordinal N, got M"). Renumbering
        would rewrite every line after it, which a file Codex keeps byte offsets into never
        gets: the file is refused in place (:attr:`Analysis.unreadable_from`); the conversation
        itself is read as it is (the lines are not dropped: nothing of them is lost)."""
        seen: dict[int, Line] = {}
        previous: int | None = None
        for line in lines:
            obj = line.obj
            if obj is None or type(obj.get("ordinal")) is not int:
                continue
            ordinal = obj["ordinal"]
            first = seen.setdefault(ordinal, line)
            if first is not line:
                assert first.obj is not None
                same = ("a byte-for-byte copy of that line" if first.raw.rstrip(b"\n") == line.raw.rstrip(b"\n")
                        else "the same record written again" if first.obj == obj
                        else f"a different record: {_record(obj)}, where line {first.number} holds {_record(first.obj)}")
                expected = previous + 1 if previous is not None else ordinal + 1
                stops = (f"Codex's history projection stops reading here (it expects ordinal {expected}), so its "
                         "thread history never shows what follows; only renumbering every line from here on would "
                         "mend it" if analysis.unreadable_from is None
                         else "Codex's history projection stopped at an earlier repeat")
                finding = Finding(DUPLICATE_ORDINAL, line.number, f"ordinal {ordinal} at offset {line.offset} "
                                  f"repeats line {first.number}'s (offset {first.offset}), {same}; {stops}",
                                  repairable=False)
                analysis.findings.append(finding)
                if analysis.unreadable_from is None:
                    analysis.unreadable_from = finding
            previous = ordinal

    @staticmethod
    def _answer_point(lines: list[Line], index: int) -> int:
        """The line an answer to the call on line ``index`` goes after: the last line before
        the next ``message`` item or ``compacted`` line, else the last line."""
        for line in lines[index + 1:]:
            obj = line.obj
            if obj is None:
                continue
            if obj.get("type") == "compacted" or (
                    obj.get("type") == "response_item" and _payload(obj).get("type") == "message"):
                return line.index - 1
        return len(lines) - 1

    # --- views ---------------------------------------------------------------------------

    def native_items(self, lines: list[Line]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for _, item in _history(lines):
            kind = _kind(item)
            if kind in ANSWER and _call_id(item) is None:
                continue  # no call_id: Codex cannot read the item either
            if kind in ANSWER:
                args = _arguments(item)
                items.append({"type": "function_call", "call_id": _call_id(item), "name": _tool_name(item),
                              "arguments": args if isinstance(args, str) else json.dumps(args)})
            elif kind in OUTPUTS:
                items.append({"type": "function_call_output", "call_id": str_or_none(item.get("call_id")),
                              "output": _output_text(item)})
            elif kind == "message":
                items.append({"type": "message", "role": item.get("role"), "content": item.get("content")})
        return items

    def events(self, lines: list[Line]) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        open_message: dict[str, Any] | None = None
        entries = {line.index: line.obj for line in lines}
        stamps = Stamps()
        ts = 0.0

        def add(record: dict[str, Any]) -> dict[str, Any]:
            record.update(seq=len(records) + 1, ts=ts)
            records.append(record)
            return record

        for index, item in _history(lines):
            ts = stamps.of(entries.get(index))
            kind = _kind(item)
            if kind in ANSWER and _call_id(item) is None:
                continue
            if kind in ANSWER:
                if open_message is None:
                    open_message = add({"type": "assistant/message", "content": None, "tool_calls": []})
                open_message["tool_calls"].append({"id": _call_id(item), "name": _tool_name(item),
                                                   "arguments": _arguments(item)})
                continue
            if kind == "reasoning":
                continue
            open_message = None
            if kind in OUTPUTS:
                add(result_event(str_or_none(item.get("call_id")), _output_text(item), _failed(item)))
            elif kind == "message" and item.get("role") in ("user", "assistant"):
                text = content_text(item.get("content"))
                if item.get("role") == "user":
                    add({"type": "user/message", "content": text})
                else:
                    open_message = add({"type": "assistant/message", "content": text, "tool_calls": []})
        return records

    def live_records(self, path: str) -> list[str]:
        # Codex keeps its rollout open while a session runs: the open-descriptor check
        # in files.in_use finds it. It writes no per-process record naming the file.
        return []


RECOVERY = "sessionlog_recovery"
"""The payload member of a ``tool_search_output`` sessionlog wrote that holds its
recovery ``code`` and ``text``: that item has no text member the model reads (``call_id``,
``execution``, ``status``, ``tools``), so the answer says what it can there (``status``
``incomplete``, no tools) and keeps the code here. Codex ignores members it does not know
when it reads the line, and sends the model only the item's own."""


def _record(obj: Mapping[str, Any]) -> str:
    """A rollout line in a few words: its type, its payload's type and ``call_id``."""
    payload = _payload(obj)
    words = [str(obj.get("type")), str_or_none(payload.get("type")), _call_id(payload)]
    return " ".join(w for w in words if w)


def _failed(item: Mapping[str, Any]) -> bool:
    """True for an output Codex recorded as failed: an ``output`` object whose
    ``success`` is false (a plain string output says nothing either way), or a
    ``tool_search_output`` whose ``status`` is not ``completed``."""
    output = item.get("output")
    if item.get("type") == "tool_search_output":
        return item.get("status", "completed") != "completed"
    return isinstance(output, Mapping) and output.get("success") is False


def _output_text(item: Mapping[str, Any]) -> str:
    output = item.get("output")
    if isinstance(output, str):
        return output
    if isinstance(output, Mapping):
        return content_text(output.get("content"))
    if item.get("type") == "tool_search_output":
        recovery = item.get(RECOVERY)
        if isinstance(recovery, Mapping) and isinstance(recovery.get("text"), str):
            return recovery["text"]  # an answer sessionlog wrote: its text, which opens with its code
        return json.dumps(item.get("tools", []))
    return content_text(output)


def _output_line(template: Mapping[str, Any], call: Mapping[str, Any], cid: str, code: str, text: str,
                 ordinal: int | None, shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rollout line answering ``call`` with recovery ``code`` and ``text``: the ``timestamp`` of ``template`` (the
    nearest line before it that has one), members in the order of ``shape`` (a line
    carrying an ordinal, when the answer gets one), else of ``template``; members neither
    has in Codex's order: ``timestamp``, ``ordinal``, ``type``, ``payload``."""
    kind = ANSWER[str(_kind(call))]
    if kind == "tool_search_output":
        # No text the model reads: the search is "incomplete" (a status the Responses API
        # takes for this item; "completed" would say it ran and found nothing), loads no
        # tools, and the code and text go in a member Codex passes over (RECOVERY).
        execution = call.get("execution")
        payload: dict[str, Any] = {"type": kind, "call_id": cid, "status": "incomplete",
                                   "execution": execution if execution in ("client", "server") else "client",
                                   "tools": [], RECOVERY: {"code": code, "text": text}}
    else:
        payload = {"type": kind, "call_id": cid, "output": text}
    values = {"timestamp": str_or_none(template.get("timestamp")), "type": "response_item", "payload": payload}
    if ordinal is not None:
        values["ordinal"] = ordinal
    model = template if shape is None else shape
    order = [k for k in model if k in values] + [k for k in ("timestamp", "ordinal", "type", "payload")
                                                  if k not in model]
    return {k: values[k] for k in order if k in values and values[k] is not None}


FORMAT = Codex()
