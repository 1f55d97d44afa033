"""The public pairing checker judges any JSON it is given: ``check_pairing`` and
``PairingCheck`` return None or a Violation for every list of items, whatever value sits
where an id, role, type or content belongs (a list id, a dict, a huge int, a long string),
and never raise. Where the list-based oracle (tests/pairing_oracle.py) does not itself
crash, both name the same first violation (same index; the same call id, None where the
oracle names a value that is not a string)."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pairing_oracle import oracle_check_pairing

from sessionlog.projection import FORMATS, PairingCheck, UnknownFormat, Violation, check_pairing

EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    1000 if os.environ.get("SESSIONLOG_SLOW") else 80
)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

MESSAGE_MAX = 400  # a message quotes at most two bounded values

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
"""Any JSON-like value (NaN and infinities included: a Python caller can pass them)."""

HOSTILE = st.one_of(
    JSON,
    st.sampled_from([["x"], ["c1"], {"id": "c1"}, [], {}, 0, 1, True, 1.5, "", "c1 ", "x" * 41,
                     "x" * 5000, 10**5000, [[["c1"]]]]),
)
"""What goes where an id or a role belongs: arbitrary JSON, and the values that used to
crash (unhashable, huge)."""


def _call(cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}


TEMPLATES: dict[str, list[dict[str, Any]]] = {
    "openai": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c1"), _call("c2")]},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "assistant", "content": None, "tool_calls": [_call("c3")]},
        {"role": "tool", "tool_call_id": "c3", "content": [{"type": "text", "text": "r3"}]},
        {"role": "assistant", "content": "done"},
    ],
    "responses": [
        {"type": "message", "role": "user", "content": "u"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "o1"},
        {"type": "function_call_output", "call_id": "c2", "output": "o2"},
        {"type": "function_call_output", "call_id": "s1", "output": "o3"},
        {"type": "message", "role": "assistant", "content": "done"},
    ],
    "anthropic": [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": [{"type": "text", "text": "t"},
                                          {"type": "tool_use", "id": "c1", "name": "f", "input": {}},
                                          {"type": "tool_use", "id": "c2", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "r1"},
                                     {"type": "tool_result", "tool_use_id": "c2", "content": "r2",
                                      "is_error": True},
                                     {"type": "text", "text": "go on"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c3", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c3", "content": "r3"}]},
        {"role": "assistant", "content": "done"},
    ],
}


def test_templates_are_valid() -> None:
    for fmt, items in TEMPLATES.items():
        assert check_pairing(items, fmt, server_calls=("s1",)) is None, fmt
        assert oracle_check_pairing(items, fmt, server_calls=("s1",)) is None, fmt


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside ``value`` a member sits (dict keys, list positions)."""
    found = [path] if path else []
    if isinstance(value, dict):
        for key, member in value.items():
            found += _paths(member, (*path, key))
    elif isinstance(value, list):
        for n, member in enumerate(value):
            found += _paths(member, (*path, n))
    return found


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    value = copy.deepcopy(value)
    holder = value
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = new
    return value


@st.composite
def mutated(draw: st.DrawFn, fmt: str) -> list[Any]:
    """A valid-looking conversation (a slice of the template) with one to three members
    (an id, a role, a type, a content, a whole block or item) replaced by any value."""
    items: Any = TEMPLATES[fmt]
    start = draw(st.integers(0, len(items) - 1))
    items = items[start:draw(st.integers(start + 1, len(items)))]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(items)))
        items = _replaced(items, path, draw(HOSTILE))
    return items


def _items(fmt: str) -> st.SearchStrategy[list[Any]]:
    return st.one_of(
        st.lists(JSON, max_size=6),  # anything at all, objects or not
        st.lists(st.dictionaries(st.sampled_from(["role", "type", "content", "tool_calls", "tool_call_id",
                                                  "call_id", "id", "tool_use_id", "arguments"]),
                                 HOSTILE, max_size=5), max_size=6),  # the right keys, any values
        mutated(fmt),
    )


SERVER_CALLS = st.sampled_from([(), ("s1",), ("s1", "c1")])


def _judged(items: list[Any], fmt: str, server_calls: Any) -> Violation | None:
    """check_pairing, with what every verdict must satisfy, and the same verdict fed one item at a time."""
    violation = check_pairing(iter(items), fmt, server_calls=server_calls)
    assert violation is None or isinstance(violation, Violation)
    if violation is not None:
        assert violation.call_id is None or isinstance(violation.call_id, str), violation
        assert isinstance(violation.index, int) and 0 <= violation.index <= len(items), violation
        assert isinstance(violation.message, str) and len(violation.message) <= MESSAGE_MAX, violation.message[:500]
    check = PairingCheck(fmt, server_calls=server_calls)
    for item in items:
        check.feed(item)
    assert check.result() == violation
    return violation


def _oracle(items: list[Any], fmt: str, server_calls: Any) -> tuple[bool, Any]:
    try:
        return True, oracle_check_pairing(items, fmt, server_calls=server_calls)
    except (TypeError, ValueError, RecursionError):  # the old checker hashed and quoted whatever it found
        return False, None


def _key(violation: Violation | None) -> Any:
    """What both checkers agree on: the item and the call (a value that is not a string
    names no call)."""
    if violation is None:
        return None
    return violation.index, violation.call_id if isinstance(violation.call_id, str) else None


@pytest.mark.parametrize("fmt", FORMATS)
@SETTINGS
@given(data=st.data())
def test_any_items_are_judged_never_raised_on(fmt: str, data: Any) -> None:
    items = data.draw(_items(fmt))
    server_calls = data.draw(SERVER_CALLS)
    violation = _judged(items, fmt, server_calls)
    judged, expected = _oracle(items, fmt, server_calls)
    if judged:
        assert _key(violation) == _key(expected), (items, violation, expected)


@pytest.mark.parametrize("fmt", FORMATS)
@SETTINGS
@given(items=st.lists(JSON, max_size=4), server_calls=st.lists(HOSTILE, max_size=3))
def test_server_calls_of_any_value_never_raise(fmt: str, items: list[Any], server_calls: list[Any]) -> None:
    _judged(items, fmt, server_calls)


# --- the cases that raised TypeError ------------------------------------------------------


def test_unhashable_tool_use_id_in_a_user_message() -> None:
    items = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ["x"]}]}]
    assert _judged(items, "anthropic", ()) == Violation(
        None, 0, "message 0: tool_result for ['x'] answers no tool_use in the message before it")


def test_unhashable_call_id_of_a_function_call_output() -> None:
    items = [{"type": "function_call_output", "call_id": ["x"], "output": "o"}]
    assert _judged(items, "responses", ()) == Violation(
        None, 0, "item 0: function_call_output for ['x'] has no function_call before it")
    # an answered call and a server call do not make a list id acceptable either
    items = [{"type": "function_call", "call_id": "x", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "x", "output": "o"}, *items]
    assert _judged(items, "responses", ("y",)) == Violation(
        None, 2, "item 2: function_call_output for ['x'] has no function_call before it")
    assert _judged(items[2:], "responses", [["x"], "x"]) == Violation(
        None, 0, "item 0: function_call_output for ['x'] has no function_call before it")


def test_unhashable_ids_after_a_valid_tool_use() -> None:
    ask = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}
    answer = {"type": "tool_result", "tool_use_id": "a"}
    for bad, why in ((["a"], ", which message 0 did not ask for"), ({"a": 1}, ", which message 0 did not ask for")):
        items = [ask, {"role": "user", "content": [answer, {"type": "tool_result", "tool_use_id": bad}]}]
        assert _judged(items, "anthropic", ()) == Violation(None, 1, f"message 1: tool_result for {bad!r}{why}")
    items = [ask, {"role": "user", "content": [answer, {"type": "tool_result", "tool_use_id": [1]},
                                               {"type": "tool_result", "tool_use_id": [1]}]}]
    assert _judged(items, "anthropic", ()) == Violation(None, 1, "message 1: tool_result for [1] repeated")
    items = [ask, {"role": "user", "content": [answer, {"type": "text", "text": "t"},
                                               {"type": "tool_result", "tool_use_id": {"k": []}}]}]
    assert _judged(items, "anthropic", ()) == Violation(
        None, 1, "message 1: tool_result for {'k': []} does not come before the other content")
    items = [{"role": "assistant", "content": [{"type": "tool_use", "id": ["a"]}]}]
    assert _judged(items, "anthropic", ()) == Violation(
        None, 0, "message 0: tool_use id ['a'] does not match ^[a-zA-Z0-9_-]+$")


def test_openai_ids_and_tool_calls_of_any_type() -> None:
    assert _judged([{"role": "assistant", "tool_calls": 5}], "openai", ()) == Violation(
        None, 0, "message 0: tool_calls is not a list (int)")
    assert _judged([{"role": "assistant", "tool_calls": [{"id": ["c"], "function": {"arguments": "{}"}}]}],
                   "openai", ()) == Violation(None, 0, "message 0: a tool call without an id")
    assert _judged([{"role": "tool", "tool_call_id": {"c": 1}, "content": "r"}], "openai", ()) == Violation(
        None, 0, "message 0: tool message for call {'c': 1} is no assistant message right before asked for it")


def test_huge_and_deep_values_make_short_messages() -> None:
    deep: Any = "c1"
    for _ in range(100_000):  # deeper than the interpreter's recursion limit
        deep = [deep]
    for value in ("x" * 1_000_000, 10**5000, list(range(100_000)), deep):
        for fmt, items in (
            ("openai", [{"role": "tool", "tool_call_id": value, "content": "r"}]),
            ("openai", [{"role": "assistant", "tool_calls": [_call("c1")]},
                        {"role": "tool", "tool_call_id": value, "content": "r"}]),
            ("responses", [{"type": "function_call_output", "call_id": value}]),
            ("responses", [{"type": "function_call", "call_id": value, "arguments": "{}"}]),
            ("anthropic", [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": value}]}]),
            ("anthropic", [{"role": "assistant", "content": [{"type": "tool_use", "id": value}]}]),
            ("anthropic", [{"role": "assistant", "content": [{"type": "tool_use", "id": "c1"}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1"},
                                                        {"type": "tool_result", "tool_use_id": value},
                                                        {"type": "tool_result", "tool_use_id": value}]}]),
        ):
            violation = _judged(items, fmt, ())
            assert violation is not None, (fmt, items)
            assert len(violation.message) <= MESSAGE_MAX, violation.message[:500]


def test_an_unknown_format_is_the_one_error() -> None:
    with pytest.raises(UnknownFormat):
        check_pairing([], "gemini")
    with pytest.raises(UnknownFormat):
        PairingCheck(["openai"])  # type: ignore[arg-type]
