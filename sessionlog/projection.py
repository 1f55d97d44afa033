"""Provider views of a session: the input of the next model request, always paired.

Pure functions over records, no I/O. :func:`project` builds the request input for

- ``openai`` — OpenAI Chat Completions ``messages``: an assistant message carries
  ``tool_calls`` (``arguments`` as a JSON string), followed right away by one ``tool``
  message per call;
- ``responses`` — OpenAI Responses ``input`` items: ``message``, ``function_call``,
  ``function_call_output``;
- ``anthropic`` — Anthropic Messages ``messages``: ``tool_use`` blocks in the assistant
  message, then one ``user`` message whose content starts with every ``tool_result``
  block (``is_error`` kept);

from the one call/result pairing in :func:`sessionlog.transcript.pair_calls`: results
follow their calls in the assistant's call order (a result repair wrote at the end of the
log included), a call without a logged result gets a view-time result carrying its
recovery code (``TOOL_AWAITING_APPROVAL`` while a human decides), orphan and duplicate
results are left out, and all of them are reported in :attr:`Projection.issues`.

Call ids in a view: a call keeps its own id when it is 1 to 40 characters of
``[A-Za-z0-9_-]`` and no earlier call of the session used it; otherwise (an empty id, a
provider's other alphabet, an id reused in a later turn) the view calls it
``call_<seq>_<n>`` (its assistant message's seq and the call's position), which every
provider accepts. Earlier calls never change name when the log grows.

A ``system/message`` is where each provider expects system text: a ``system`` message
(``openai``) or a system ``message`` item (``responses``) at its place in the log, and
Anthropic's top-level ``system`` (:attr:`Projection.system`: the latest one, the
instructions in force). :func:`check_pairing` names the first pairing violation in a
list of items of any of the three formats.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .events import SessionLogError
from .transcript import Exchange, PairedCall, Pairing, SystemEntry, UserEntry, pair_calls

FORMATS: Final = ("openai", "responses", "anthropic")
"""The provider formats :func:`project` and :func:`check_pairing` know."""


class UnknownFormat(SessionLogError, ValueError):
    """A format name outside :data:`FORMATS`."""


VIEW_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""What a call id in a view looks like: what OpenAI Chat (at most 40 characters) and
Anthropic (``^[a-zA-Z0-9_-]+$``) both accept."""


@dataclass(slots=True)
class Projection:
    """A provider view of a session.

    ``items`` are JSON-able dicts: chat messages (``openai``), input items
    (``responses``) or Anthropic messages (``anthropic``). ``issues`` lists, one sentence
    each, what the view left out (orphan and duplicate results, repeated call ids),
    renamed (call ids) or made up (view-time results). ``call_ids`` are the requested
    calls' ids in the log, in view order, and ``view_ids`` the ids the view gives them
    (the same unless renamed). ``system`` is Anthropic's top-level system text (None
    for the other formats, which carry system messages among their items)."""

    format: str
    items: list[dict[str, Any]]
    issues: list[str] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    view_ids: list[str] = field(default_factory=list)
    system: Any = None

    def to_json(self) -> dict[str, Any]:
        """The request fragment: ``{"messages": [...]}`` for ``openai`` and ``anthropic``
        (with ``"system"`` first when the session has a system message), ``{"input":
        [...]}`` for ``responses``."""
        if self.format == "responses":
            return {"input": self.items}
        if self.system is not None:
            return {"system": self.system, "messages": self.items}
        return {"messages": self.items}


@dataclass(frozen=True, slots=True)
class Violation:
    """The first place a request would be rejected for its tool pairing: ``call_id`` (None
    when the violation is not about one call), ``index`` of the offending item, and a
    sentence naming both."""

    call_id: str | None
    index: int
    message: str

    def __str__(self) -> str:
        return self.message


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UnknownFormat(f"unknown view format {fmt!r}; known: {', '.join(FORMATS)}")


# --- rendering pieces ------------------------------------------------------------------


def arguments_json(arguments: Any) -> str:
    """A call's arguments as the JSON string OpenAI formats carry (a string is kept)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps({} if arguments is None else arguments, ensure_ascii=False, separators=(",", ":"))


def arguments_object(arguments: Any) -> dict[str, Any]:
    """A call's arguments as the JSON object Anthropic's ``tool_use.input`` requires."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return {"arguments": arguments}
        if isinstance(decoded, dict):
            return decoded
        return {"arguments": decoded}
    if arguments is None:
        return {}
    return {"arguments": arguments}


def result_text(result: Mapping[str, Any]) -> str:
    """A result's output as text. A result with a recovery ``code`` keeps the code in the
    text (the model reads only the text)."""
    output = result.get("output")
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    code = result.get("code")
    if isinstance(code, str) and code and code not in text:
        text = f"{code}: {text}"
    return text


def result_is_error(result: Mapping[str, Any]) -> bool:
    return result.get("is_error") is True


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [dict(b) if isinstance(b, Mapping) else {"type": "text", "text": str(b)} for b in content]
    return [{"type": "text", "text": json.dumps(content, ensure_ascii=False)}]


def _empty(content: Any) -> bool:
    return content is None or content == "" or content == []


def tool_message(call: PairedCall, view_id: str | None = None) -> dict[str, Any]:
    """The Chat Completions ``tool`` message for a paired call (``view_id``: its id in the view)."""
    assert call.result is not None
    return {"role": "tool", "tool_call_id": view_id or call.call_id, "content": result_text(call.result)}


def function_call_output(call: PairedCall, view_id: str | None = None) -> dict[str, Any]:
    """The Responses ``function_call_output`` item for a paired call."""
    assert call.result is not None
    return {"type": "function_call_output", "call_id": view_id or call.call_id,
            "output": result_text(call.result)}


def tool_result_block(call: PairedCall, view_id: str | None = None) -> dict[str, Any]:
    """The Anthropic ``tool_result`` block for a paired call (``is_error`` kept)."""
    assert call.result is not None
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": view_id or call.call_id,
        "content": result_text(call.result),
    }
    if result_is_error(call.result):
        block["is_error"] = True
    return block


def _system_text(content: Any) -> Any:
    if isinstance(content, (str, list)):
        return content
    return "" if content is None else json.dumps(content, ensure_ascii=False)


Entries = list[UserEntry | SystemEntry | Exchange]
ViewIds = dict[int, str]  # id(PairedCall) -> the call's id in the view


def view_ids(pairing: Pairing) -> tuple[ViewIds, list[str]]:
    """Each call's id in the views (see the module docstring) and one sentence per rename."""
    ids: ViewIds = {}
    used: set[str] = set()
    issues: list[str] = []
    for exchange in pairing.exchanges:
        for n, call in enumerate(exchange.calls):
            view_id = call.call_id
            if not VIEW_ID.fullmatch(view_id) or view_id in used:
                if not view_id:
                    why = "is empty"
                elif view_id in used:
                    why = "was used by an earlier call of this session"
                else:
                    why = "is not 1 to 40 characters of [A-Za-z0-9_-]"
                view_id = base = f"call_{exchange.seq}_{n}"
                again = 1
                while view_id in used:
                    again += 1
                    view_id = f"{base}_{again}"
                issues.append(f"call id {call.call_id!r} of assistant message seq {exchange.seq} {why}; "
                              f"the view calls it {view_id!r}")
            used.add(view_id)
            ids[id(call)] = view_id
    return ids, issues


def _openai(entries: Entries, ids: ViewIds) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for entry in entries:
        if isinstance(entry, UserEntry):
            items.append({"role": "user", "content": entry.content if entry.content is not None else ""})
            continue
        if isinstance(entry, SystemEntry):
            items.append({"role": "system", "content": _system_text(entry.content)})
            continue
        if not entry.calls:
            if not _empty(entry.content):
                items.append({"role": "assistant", "content": entry.content})
            continue
        items.append({
            "role": "assistant",
            "content": None if _empty(entry.content) else entry.content,
            "tool_calls": [
                {"id": ids[id(c)], "type": "function",
                 "function": {"name": c.name, "arguments": arguments_json(c.arguments)}}
                for c in entry.calls
            ],
        })
        items.extend(tool_message(c, ids[id(c)]) for c in entry.calls)
    return items


def _responses(entries: Entries, ids: ViewIds) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for entry in entries:
        if isinstance(entry, UserEntry):
            items.append({"type": "message", "role": "user",
                          "content": entry.content if entry.content is not None else ""})
            continue
        if isinstance(entry, SystemEntry):
            items.append({"type": "message", "role": "system", "content": _system_text(entry.content)})
            continue
        if not _empty(entry.content):
            items.append({"type": "message", "role": "assistant", "content": entry.content})
        items.extend(
            {"type": "function_call", "call_id": ids[id(c)], "name": c.name,
             "arguments": arguments_json(c.arguments)}
            for c in entry.calls
        )
        items.extend(function_call_output(c, ids[id(c)]) for c in entry.calls)
    return items


def _anthropic(entries: Entries, ids: ViewIds) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        # Consecutive messages of one role become one message: the user text that follows
        # a tool round goes after its tool_result blocks, which stay first.
        if not blocks:
            return
        if items and items[-1]["role"] == role:
            items[-1]["content"].extend(blocks)
        else:
            items.append({"role": role, "content": blocks})

    for entry in entries:
        if isinstance(entry, SystemEntry):
            continue  # the top-level system text: Projection.system
        if isinstance(entry, UserEntry):
            add("user", _text_blocks(entry.content))
            continue
        blocks = _text_blocks(entry.content)
        blocks.extend(
            {"type": "tool_use", "id": ids[id(c)], "name": c.name, "input": arguments_object(c.arguments)}
            for c in entry.calls
        )
        if entry.calls:
            # A new message, never merged into an earlier assistant message's end: the
            # tool_result blocks must open the very next user message.
            if items and items[-1]["role"] == "assistant":
                items[-1]["content"].extend(blocks)
            else:
                items.append({"role": "assistant", "content": blocks})
            items.append({"role": "user", "content": [tool_result_block(c, ids[id(c)]) for c in entry.calls]})
        else:
            add("assistant", blocks)
    return items


_RENDER = {"openai": _openai, "responses": _responses, "anthropic": _anthropic}


def project(records: Iterable[Mapping[str, Any]], fmt: str) -> Projection:
    """The ``fmt`` view (one of :data:`FORMATS`) of a session's records, paired.

    Guarantee: the items pass :func:`check_pairing` for ``fmt``; every call an
    ``assistant/message`` asked for appears exactly once, under an id unique in the view,
    with exactly one result, placed where the provider requires it, in the assistant's
    call order. Nothing is written. Raises :class:`UnknownFormat` for an unknown ``fmt``."""
    _check_format(fmt)
    pairing = pair_calls(records)
    ids, renamed = view_ids(pairing)
    items = _RENDER[fmt](pairing.entries, ids)
    calls = [c for ex in pairing.exchanges for c in ex.calls]
    issues = list(pairing.issues) + renamed
    system = None
    if fmt == "anthropic":
        prompts = [e for e in pairing.entries if isinstance(e, SystemEntry)]
        if prompts:
            system = _system_text(prompts[-1].content)
            issues.extend(f"system message seq {e.seq} is replaced by the later one at seq {prompts[-1].seq} "
                          "(Anthropic takes one top-level system)" for e in prompts[:-1])
    return Projection(fmt, items, issues, [c.call_id for c in calls], [ids[id(c)] for c in calls], system)


# --- pairing checkers ------------------------------------------------------------------


def check_pairing(
    items: list[Mapping[str, Any]], fmt: str, *, server_calls: Collection[str] = ()
) -> Violation | None:
    """The first tool-pairing violation in ``items`` (``fmt`` one of :data:`FORMATS`), or
    None when every call has exactly one result where the provider requires it.

    At least as strict as each provider:

    - ``openai``: an assistant message's ``tool_calls`` (ids non-empty strings of at most
      40 characters, unique in the whole conversation; ``arguments`` a JSON string) are
      followed right away by one ``tool`` message per call; a ``tool`` message anywhere
      else is a violation.
    - ``responses``: every ``function_call`` has a non-empty ``call_id`` unique in the
      input; every ``function_call_output`` answers an earlier, still unanswered
      ``function_call``; no ``message`` item comes between a ``function_call`` and its
      output; every ``function_call`` is answered once. ``server_calls`` are call ids a
      server-side conversation already holds (a request continuing
      ``previous_response_id`` or a ``conversation`` sends only their outputs).
    - ``anthropic``: ``tool_use`` ids match ``^[a-zA-Z0-9_-]+$`` and are unique in the
      whole conversation, and the next message is a ``user`` message whose content
      starts with one ``tool_result`` per ``tool_use`` and holds no other; a
      ``tool_result`` anywhere else is a violation.

    An item that is not a JSON object is a violation in every format.

    Raises :class:`UnknownFormat` for an unknown ``fmt``."""
    _check_format(fmt)
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            return Violation(None, index, f"item {index} is not an object ({type(item).__name__})")
    if fmt == "openai":
        return _check_openai(items)
    if fmt == "responses":
        return _check_responses(items, server_calls)
    return _check_anthropic(items)


def _check_openai(items: list[Mapping[str, Any]]) -> Violation | None:
    expected: list[str] = []  # call ids of the last assistant message still owed a tool message
    owner = -1
    used: dict[str, int] = {}  # call id -> the assistant message that asked for it
    for i, item in enumerate(items):
        role = item.get("role") if isinstance(item, Mapping) else None
        if role == "tool":
            call_id = item.get("tool_call_id")
            if call_id not in expected:
                why = "duplicate or unrequested" if owner >= 0 else "no assistant message right before asked for it"
                return Violation(call_id, i, f"message {i}: tool message for call {call_id!r} is {why}"
                                 + (f" (assistant message {owner})" if owner >= 0 else ""))
            expected.remove(call_id)
            if not isinstance(item.get("content"), (str, list)):
                return Violation(call_id, i, f"message {i}: tool message for call {call_id!r} has no content")
            continue
        if expected:
            return Violation(expected[0], i, f"message {i}: call {expected[0]!r} of assistant message {owner} "
                             "has no tool message before it")
        owner = -1
        if role == "assistant" and item.get("tool_calls"):
            calls = item["tool_calls"]
            seen: set[str] = set()
            for call in calls:
                call_id = call.get("id") if isinstance(call, Mapping) else None
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(call_id, str) or not call_id:
                    return Violation(None, i, f"message {i}: a tool call without an id")
                if len(call_id) > 40:
                    return Violation(call_id, i, f"message {i}: call id {call_id!r} is longer than 40 characters")
                if call_id in seen:
                    return Violation(call_id, i, f"message {i}: call id {call_id!r} repeated")
                if call_id in used:
                    return Violation(call_id, i, f"message {i}: call id {call_id!r} repeated "
                                     f"(assistant message {used[call_id]} used it)")
                if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
                    return Violation(call_id, i, f"message {i}: call {call_id!r} arguments are not a JSON string")
                seen.add(call_id)
                expected.append(call_id)
            for call_id in seen:
                used[call_id] = i
            owner = i
    if expected:
        return Violation(expected[0], len(items), f"end of messages: call {expected[0]!r} of assistant message "
                         f"{owner} has no tool message")
    return None


def _check_responses(items: list[Mapping[str, Any]], server_calls: Collection[str]) -> Violation | None:
    open_calls: dict[str, int] = {}  # call id -> index of its unanswered function_call
    answered: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                return Violation(None, i, f"item {i}: function_call without a call_id")
            if call_id in open_calls or call_id in answered or call_id in server_calls:
                return Violation(call_id, i, f"item {i}: function_call {call_id!r} repeated")
            if not isinstance(item.get("arguments"), str):
                return Violation(call_id, i, f"item {i}: function_call {call_id!r} arguments are not a JSON string")
            open_calls[call_id] = i
        elif kind == "message" and open_calls:
            call_id, index = next(iter(open_calls.items()))
            return Violation(call_id, i, f"item {i}: a message comes before the output of function_call "
                             f"{call_id!r} (item {index})")
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id in open_calls:
                del open_calls[call_id]
                answered.add(call_id)
            elif call_id in server_calls and call_id not in answered:
                answered.add(call_id)
            else:
                why = "a second output" if call_id in answered else "no function_call before it"
                return Violation(call_id, i, f"item {i}: function_call_output for {call_id!r} has {why}")
    if open_calls:
        call_id, index = next(iter(open_calls.items()))
        return Violation(call_id, index, f"item {index}: function_call {call_id!r} has no function_call_output")
    return None


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


_ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")


def _check_anthropic(items: list[Mapping[str, Any]]) -> Violation | None:
    used: dict[Any, int] = {}  # tool_use id -> the message that holds it
    for i, message in enumerate(items):
        role = message.get("role") if isinstance(message, Mapping) else None
        blocks = _blocks(message) if isinstance(message, Mapping) else []
        if role == "assistant":
            uses = [b.get("id") for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_use"]
            if not uses:
                continue
            for use in uses:
                if not isinstance(use, str) or not _ANTHROPIC_ID.fullmatch(use):
                    return Violation(use if isinstance(use, str) else None, i,
                                     f"message {i}: tool_use id {use!r} does not match ^[a-zA-Z0-9_-]+$")
            if len(set(uses)) != len(uses):
                dup = next(u for u in uses if uses.count(u) > 1)
                return Violation(dup, i, f"message {i}: tool_use id {dup!r} repeated")
            for use in uses:
                if use in used:
                    return Violation(use, i, f"message {i}: tool_use id {use!r} repeated "
                                     f"(message {used[use]} used it)")
                used[use] = i
            nxt = items[i + 1] if i + 1 < len(items) else None
            if nxt is None or nxt.get("role") != "user":
                return Violation(uses[0], i, f"message {i}: tool_use {uses[0]!r} is not followed by a user "
                                 "message with its tool_result")
            following = _blocks(nxt)
            lead = []
            for b in following:
                if not (isinstance(b, Mapping) and b.get("type") == "tool_result"):
                    break
                lead.append(b.get("tool_use_id"))
            rest = [b.get("tool_use_id") for b in following[len(lead):]
                    if isinstance(b, Mapping) and b.get("type") == "tool_result"]
            if rest:
                return Violation(rest[0], i + 1, f"message {i + 1}: tool_result for {rest[0]!r} does not come "
                                 "before the other content")
            for use in uses:
                if use not in lead:
                    return Violation(use, i + 1, f"message {i + 1}: no tool_result for tool_use {use!r} of "
                                     f"message {i}")
            for res in lead:
                if lead.count(res) > 1:
                    return Violation(res, i + 1, f"message {i + 1}: tool_result for {res!r} repeated")
                if res not in uses:
                    return Violation(res, i + 1, f"message {i + 1}: tool_result for {res!r}, which message {i} "
                                     "did not ask for")
        elif role == "user":
            prev = items[i - 1] if i > 0 else None
            asked = {b.get("id") for b in (_blocks(prev) if isinstance(prev, Mapping) and prev.get("role") == "assistant"
                                            else []) if isinstance(b, Mapping) and b.get("type") == "tool_use"}
            for b in blocks:
                if isinstance(b, Mapping) and b.get("type") == "tool_result" and b.get("tool_use_id") not in asked:
                    rid = b.get("tool_use_id")
                    return Violation(rid, i, f"message {i}: tool_result for {rid!r} answers no tool_use "
                                     "in the message before it")
    return None
