"""The list-based pairing checkers as they were before the streaming checker replaced
them (sessionlog.projection.PairingCheck): the oracle the equivalence tests compare
``check_pairing`` with. Not used by the library."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from sessionlog.projection import Violation, _check_format, arguments_problem


def oracle_check_pairing(
    items: list[Mapping[str, Any]], fmt: str, *, server_calls: Collection[str] = ()
) -> Violation | None:
    """The first tool-pairing violation in ``items`` (``fmt`` one of :data:`FORMATS`), or
    None when every call has exactly one result where the provider requires it.

    At least as strict as each provider:

    - ``openai``: an assistant message's ``tool_calls`` (ids non-empty strings of at most
      40 characters, unique in the whole conversation; ``arguments`` a JSON object text) are
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
                why = arguments_problem(function["arguments"])  # the rule added since: a JSON object text
                if why is not None:
                    return Violation(call_id, i, f"message {i}: call {call_id!r} arguments are not a JSON object "
                                     f"text ({why}): {function['arguments']!r}")
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
