"""The batch fast path of append (``encode_records``/``encode_block``) against the exact
path (``_encode_each``: one event at a time, each nested line read back alone).

For any batch, adversarial ones included, both accept with the same bytes, or both refuse
naming the same event; nothing but RecordError escapes; every accepted line decodes as a
record with its seq and ts."""

from __future__ import annotations

import enum
import math
import os
import re
import sys
from collections import UserDict
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sessionlog.events import (
    MAX_DEPTH,
    Record,
    RecordError,
    _BLOCK,
    _LINES,
    _encode_each,
    _encode_fast,
    encode_block,
    encode_records,
    encode_records_at,
    plain_size,
)
from sessionlog.scan import Limits, encode_batch, encode_batches
from sessionlog.contract import InvalidEvent

EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    2000 if os.environ.get("SESSIONLOG_SLOW") else 150
)
NOW = 1_735_689_600.25


class Text(str):
    pass


class Number(int):
    pass


class Real(float):
    pass


class Color(enum.IntEnum):
    RED = 1


class Name(enum.Enum):
    A = "a"


raw_json = st.sampled_from([
    b"1", b'"x"', b"[1,2]", b'{"a":1}', b'{"a": [1, 2],\t"b" : null}', b'{"a":\n1}', b'{"a":\r1}',
    b'{"a":1,"a":2}', b"[" * 126 + b"]" * 126, b"[" * 127 + b"]" * 127, b"[" * 129 + b"]" * 129,
    b'1,"seq":9', b'1},{"z":2', b'"', b"", b"nul\x00", b'"\xff"', '"é"'.encode(), b'"\\u00e9"', b" 1 ",
    b"\r\n", b"NaN", b"1e999", b'"\\ud800"', b'{"seq":1}', b"{}", b"[]", b"true", b"null", b"-0", b"01",
])
raws = st.one_of(raw_json, st.binary(max_size=16)).map(msgspec.Raw)
texts = st.text(max_size=12)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), texts,
    texts.map(Text), st.integers(-5, 5).map(Number), st.floats(allow_nan=False).map(Real),
    st.just(Color.RED), st.just(Name.A), st.just("\ud800"), st.just("a\nb\r\"\\{[}]"),
)
keys = st.one_of(texts, texts.map(Text), st.integers(-3, 3), st.booleans(), st.none(), st.floats(0, 2))
values = st.recursive(
    st.one_of(scalars, raws),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=5),
        st.frozensets(st.integers(0, 3), max_size=2),
    ),
    max_leaves=30,
)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    value = draw(st.one_of(scalars, raws, st.just([]), st.just({})))
    for i in range(draw(st.sampled_from([1, 2, 124, 125, 126, 127, 128, 129, 300, 3000]))):
        kind = draw(st.sampled_from(["list", "dict", "tuple"])) if i < 3 else ("list" if i % 2 else "dict")
        value = [value] if kind == "list" else (value,) if kind == "tuple" else {"d": value}
    return value


member = st.one_of(values, values, values, deep())
top_keys = st.one_of(
    st.sampled_from(["content", "turn", "x", "type", "ts", "seq", "ts", "é", ""]), texts,
    texts.map(Text), st.integers(0, 2),
)
type_values = st.one_of(
    st.sampled_from(["user/message", "tool/result", "x"]), st.just(""), st.just(None), st.just(1),
    st.just(Text("x")), st.just(b"x"),
)
ts_values = st.one_of(
    st.floats(), st.integers(-(2**70), 2**1100), st.none(), st.booleans(), st.just(Real(1.5)),
    st.just(Number(7)), st.just(Color.RED), st.just("1.5"), st.just(float("nan")),
)


@st.composite
def event(draw: st.DrawFn) -> Any:
    ev: dict[Any, Any] = {}
    if draw(st.integers(0, 9)):  # mostly a type, mostly first
        ev["type"] = draw(type_values) if draw(st.integers(0, 4)) == 0 else "x/a"
    ev.update(draw(st.dictionaries(top_keys, member, max_size=draw(st.sampled_from([2, 6])))))
    if "type" not in ev and draw(st.booleans()):
        ev["type"] = "late"
    if draw(st.integers(0, 2)) == 0:
        ev["ts"] = draw(ts_values)
    shape = draw(st.integers(0, 20))
    if shape == 0:
        return UserDict(ev)
    if shape == 1:
        return type("Sub", (dict,), {})(ev)
    if shape == 2:
        return draw(st.sampled_from([None, 5, "x", [("type", "x")]]))
    return ev


batches = st.lists(event(), max_size=12)


def outcome(encode: Any) -> tuple[str, Any]:
    try:
        return "ok", encode()
    except RecordError as exc:
        found = re.match(r"event (\d+) of the batch", exc.reason)
        assert found, exc.reason
        return "refused", int(found.group(1))


def check(batch: list[Any], record_limit: int = 1 << 16) -> None:
    seqs = range(7, 7 + len(batch))
    exact = outcome(lambda: _encode_each(batch, seqs, NOW, record_limit))
    fast = outcome(lambda: encode_records(batch, 7, record_limit=record_limit, now=NOW))
    assert fast == exact
    block = outcome(lambda: encode_block(batch, 7, record_limit=record_limit, now=NOW))
    if exact[0] == "ok":
        lines = exact[1]
        assert block == ("ok", (b"".join(line + b"\n" for line in lines), len(lines), block[1][2]))
        for i, line in enumerate(lines):
            record = Record.from_line(line)
            assert record.seq == 7 + i
            assert line.startswith(b'{"seq":%d,"ts":' % (7 + i))
        if lines:
            assert block[1][2] == Record.from_line(lines[-1]).ts
            assert type(block[1][2]) is float
    else:
        assert block == exact
    # The fast path alone: it declines, or gives the exact bytes, or refuses as the exact path.
    # (lines, then one block; the splice of events whose type comes first and the dict
    # per event of the others give the same bytes).
    # _encode_fast leaves the record limit to its callers.
    unlimited = outcome(lambda: _encode_each(batch, seqs, NOW, 1 << 40))
    for encode in (_LINES, _BLOCK):
        direct = outcome(lambda: _encode_fast(batch, seqs, NOW, encode))
        if direct[0] == "ok" and direct[1] is not None:
            assert unlimited[0] == "ok"
            want = unlimited[1] if encode is _LINES else b"".join(line + b"\n" for line in unlimited[1])
            assert direct[1] == want
        elif direct[0] == "refused":
            assert direct == unlimited


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch=batches)
@example(batch=[{"type": "x", "ts": float("nan")}])
@example(batch=[{"type": "user/message", "ts": "\ud800"}])  # msgspec.convert raised UnicodeEncodeError
@example(batch=[{"type": "x", "v": float("nan")}])
@example(batch=[{"type": "x"}, {"type": "x", "v": [{"a": (1.0, float("-inf"))}]}])
@example(batch=[{"type": "x", "v": Real(float("inf"))}])
@example(batch=[{"type": "x", "v": [1e308, 1e308]}])  # their sum overflows; each is finite
@example(batch=[{"type": "x", "ts": 10**400}])
@example(batch=[{"x": 1, "type": "late", "ts": 5}])
@example(batch=[{"type": Text("x"), "v": [1]}])
@example(batch=[{"type": "x", "v": Text("y")}, {"type": "x", "v": [[[1]]]}])
@example(batch=[{"type": "x", "r": msgspec.Raw(b'1,"seq":9')}])
@example(batch=[{"type": "x", "r": [msgspec.Raw(b"[" * 127 + b"]" * 127)]}])
@example(batch=[{"type": "x", "v": ({1: msgspec.Raw(b'1,"seq":9')},)}])  # a Raw under a non-str key
@example(batch=[{"type": "x", "v": {Text("k"): [msgspec.Raw(b"[" * 129 + b"]" * 129)]}}])
def test_fast_path_is_the_exact_path(batch: list[Any]) -> None:
    check(batch)


@settings(max_examples=max(20, EXAMPLES // 5), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=batches, limit=st.integers(40, 400))
def test_fast_path_is_the_exact_path_near_the_record_limit(batch: list[Any], limit: int) -> None:
    check(batch, limit)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(one=event(), limit=st.sampled_from([40, 300, 1 << 16]))
@example(one={"type": "x", "ts": None}, limit=1 << 16)
@example(one={"type": "x", "seq": 1}, limit=1 << 16)
@example(one={Text("type"): "x"}, limit=1 << 16)
@example(one={"type": "x", Text("k"): 1}, limit=1 << 16)
@example(one={"type": "x", 1: "a", "1": "b"}, limit=1 << 16)
@example(one={"v": 1, "type": "x"}, limit=1 << 16)
@example(one={"type": Text("x")}, limit=1 << 16)
@example(one={"type": ""}, limit=1 << 16)
@example(one={"type": "x", "v": float("nan"), "w": float("-inf"), "b": True, "n": None}, limit=1 << 16)
@example(one={"type": "x", "v": 2**70}, limit=1 << 16)
@example(one={"type": "x", "v": "\ud800"}, limit=1 << 16)
@example(one={"type": "x", "v": "a\nb\r"}, limit=1 << 16)
@example(one={"type": "x", "v": Number(3), "w": Real(1.5), "t": Text("y")}, limit=1 << 16)
@example(one={"type": "x", "r": msgspec.Raw(b'1,"seq":9')}, limit=1 << 16)
@example(one={"type": "x", "v": "y" * 30}, limit=40)
@example(one=type("Sub", (dict,), {})({"type": "x"}), limit=1 << 16)
@example(one=UserDict({"type": "x"}), limit=1 << 16)
@example(one={"type": "x", "v": "y" * 70_000}, limit=1 << 16)
@example(one={"type": "x", "v": (1, "a", None), "w": [True, 1, 1.0], "d": {"k": (False,)}}, limit=1 << 16)
@example(one={"type": "x", "v": [{1: "a", "1": "b"}]}, limit=1 << 16)
@example(one={"type": "x", "v": [msgspec.Raw(b"[1]")]}, limit=1 << 16)
@example(one={"type": "x", "v": [Text("y")], "w": {"k": Number(2)}}, limit=1 << 16)
@example(one={"type": "x", "v": [frozenset({1})]}, limit=1 << 16)
def test_one_event_batch_is_the_exact_path(one: Any, limit: int) -> None:
    # A batch of one event (the most common append) has a path of its own in encode_block.
    check([one], limit)


@pytest.mark.parametrize("depth", [MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, 5000])
def test_one_event_batch_nested_from_a_deep_caller_stack(depth: int) -> None:
    # A one-event batch with containers takes its own path too; from a caller stack near
    # the recursion limit it still gives the exact path's bytes, or its refusal.
    batch = [{"type": "x", "v": nest(depth), "w": [1, {"k": (2, None)}]}]

    def at_depth(n: int) -> Any:
        if n:
            return at_depth(n - 1)
        return outcome(lambda: encode_block(batch, 7, record_limit=1 << 20, now=NOW))

    exact = outcome(lambda: _encode_each(batch, range(7, 8), NOW, 1 << 20))
    block = at_depth(sys.getrecursionlimit() - 80)
    if exact[0] == "ok":
        assert block == ("ok", (exact[1][0] + b"\n", 1, NOW))
    else:
        assert block == exact
    check(batch)


def test_a_ts_on_any_event_of_a_batch() -> None:
    # The batch's first event decides which check runs first; a ts anywhere is found.
    plain = {"type": "t", "v": 1}
    own = {"type": "t", "v": 2, "ts": 5}
    for batch in ([plain, own], [own, plain], [plain, plain, own], [own, own],
                  [plain, {"type": "t", "ts": None}], [plain, {"type": "t", "ts": float("nan")}],
                  [own, {"type": "t", "seq": 3}], [plain, {"type": "t", "ts": True}]):
        check(batch)


def test_one_event_batch_at_the_record_limit() -> None:
    event = {"type": "x", "v": "y" * 20}
    line, = encode_records([event], 3, record_limit=1 << 16, now=NOW)
    block, n, last_ts = encode_block([event], 3, record_limit=len(line), now=NOW)
    assert (block, n, last_ts) == (line + b"\n", 1, NOW)
    with pytest.raises(RecordError, match=f"event 0 of the batch is {len(line)} bytes"):
        encode_block([event], 3, record_limit=len(line) - 1, now=NOW)
    block, _, last_ts = encode_block([event], 3, record_limit=1 << 16, now=5)
    assert block.startswith(b'{"seq":3,"ts":5,"type":"x"') and type(last_ts) is float


def nest(depth: int, kinds: str = "ld") -> Any:
    value: Any = 0
    for i in range(depth):
        kind = kinds[i % len(kinds)]
        value = [value] if kind == "l" else (value,) if kind == "t" else {"k": value}
    return value


@pytest.mark.parametrize("kinds", ["l", "d", "t", "ld", "dt"])
@pytest.mark.parametrize("depth", [MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 5000])
def test_depth_edge(depth: int, kinds: str) -> None:
    # A member's own depth d makes the record d + 1 deep (the record is depth 1).
    batch = [{"type": "ok"}, {"type": "x", "v": nest(depth, kinds)}, {"type": "ok", "w": [[]]}]
    check(batch)
    ok = depth + 1 <= MAX_DEPTH
    if ok:
        assert len(encode_records(batch, 1, record_limit=1 << 20, now=NOW)) == 3
    else:
        with pytest.raises(RecordError, match="event 1 of the batch"):
            encode_records(batch, 1, record_limit=1 << 20, now=NOW)


def test_wide_batch_of_every_shape() -> None:
    batch = [{"type": "t", "i": i, "v": [i, {"k": (i, None)}] if i % 3 else "s", "ts": float(i) + 0.5}
             for i in range(3000)]
    check(batch)
    block, n, last_ts = encode_block(batch, 1, record_limit=1 << 20, now=NOW)
    assert n == 3000 and last_ts == 2999.5 and block.count(b"\n") == 3000
    assert block.startswith(b'{"seq":1,"ts":0.5,"type":"t","i":0,"v":"s"}\n')


def test_own_ts_keeps_envelope_order() -> None:
    line, = encode_records([{"b": 1, "ts": 2, "type": "x"}], 4, record_limit=100, now=NOW)
    assert line == b'{"seq":4,"ts":2,"type":"x","b":1}'
    assert math.isfinite(Record.from_line(line).ts)


@pytest.mark.parametrize("n", [1, 2, 64, 1025])
def test_splice_and_dict_paths_agree(n: int) -> None:
    # type first, no ts: spliced; the same events with type elsewhere or a ts: a dict each.
    first = [{"type": "t", "i": i, "s": "x" * (i % 7), "n": None} for i in range(n)]
    later = [{"i": i, "type": "t", "s": "x" * (i % 7), "n": None} for i in range(n)]
    own = [{**e, "ts": NOW} for e in first]
    for batch in (first, later, own, first[:-1] + later[-1:], [*first, {"type": "t", "r": msgspec.Raw(b"1")}]):
        check(batch)
    a = encode_records(first, 3, record_limit=1 << 20, now=NOW)
    assert a == encode_records(later, 3, record_limit=1 << 20, now=NOW)
    assert a == encode_records(own, 3, record_limit=1 << 20, now=NOW)
    assert a[0] == b'{"seq":3,"ts":1735689600.25,"type":"t","i":0,"s":"","n":null}'


@settings(max_examples=max(20, EXAMPLES // 3), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(group=st.lists(st.tuples(batches, st.integers(1, 2**40)), max_size=6),
       record_limit=st.sampled_from([60, 400, 1 << 16]), batch_limit=st.sampled_from([200, 2000, 1 << 20]))
@example(group=[([{"type": "b"}], 10), ([{"type": "a", "v": "x" * 50}] * 5, 3)], record_limit=400, batch_limit=200)
@example(group=[([{"type": "b"}], 10), ([{"type": "a", "v": "x" * 50}], 3)], record_limit=60, batch_limit=2000)
@example(group=[([{"type": "b", "n": 1}, {"type": "c", "r": msgspec.Raw(b"[1]")}], 2**40), ([], 5),
                ([{"type": "d"}], 1)], record_limit=400, batch_limit=2000)
def test_a_group_encoded_in_one_pass_is_each_batch_encoded_alone(
    group: list[tuple[list[Any], int]], record_limit: int, batch_limit: int
) -> None:
    """A SQL group commit encodes its batches (each with its own first seq) in one pass:
    it gives each batch exactly the lines encode_batch gives it, or declines (None); it
    always declines when some batch would be refused on its own."""
    limits = Limits(record_limit=record_limit, batch_limit=batch_limit)
    batches_, firsts = [b for b, _ in group], [f for _, f in group]

    def alone(events: list[Any], first: int) -> Any:
        try:
            return encode_batch(events, first, limits, now=NOW)
        except InvalidEvent:
            return None

    together = encode_batches(batches_, firsts, limits, now=NOW)
    each = [alone(b, f) for b, f in zip(batches_, firsts)]
    if any(lines is None for lines in each):
        assert together is None
    elif together is not None:  # None: some batch needs the exact path (encoded alone, as above)
        assert together == each


def test_seqs_given_one_per_event_must_be_ints_from_one() -> None:
    events = [{"type": "a"}, {"type": "b"}]
    assert encode_records_at(events, [9, 3], record_limit=1 << 16, now=NOW) == [
        b'{"seq":9,"ts":%s,"type":"a"}' % str(NOW).encode(), b'{"seq":3,"ts":%s,"type":"b"}' % str(NOW).encode()]
    for bad in ([True, 2], [1.5, 2], [0, 1], [-1, 2], [1]):
        with pytest.raises(ValueError):
            encode_records_at(events, bad, record_limit=1 << 16, now=NOW)


def test_a_group_with_one_event_off_the_fast_path_is_encoded_batch_by_batch() -> None:
    """One batch needing the exact path (a read-only mapping) sends the group back to the
    caller (None), which encodes each batch alone: the others keep their fast path."""
    from types import MappingProxyType

    plain = [{"type": "a", "n": i} for i in range(3)]
    assert encode_batches([plain, plain], [2, 10], Limits(), now=NOW) is not None
    assert encode_batches([plain, [MappingProxyType({"type": "b"})]], [2, 10], Limits(), now=NOW) is None
    assert encode_batches([plain, [{"type": "b", "x": object()}]], [2, 10], Limits(), now=NOW) is None


# --- events as agent runtimes write them: type first, their own ts last -----------------
# The batch fast path's common case; the members hold what could be mistaken for the
# envelope: nested objects with a "ts" (or "seq", "type") key of their own, strings that
# hold the text of a ts member, a Raw that spells one.

envelope_text = st.sampled_from([
    ',"ts":', ',"ts":1}', '{"ts":2,"type":"x"}', '"seq":1,', '\\",\\"ts\\":', ',"ts":1.5}\n{"type":"y"', "ts",
])
lookalike = st.one_of(
    envelope_text, envelope_text.map(Text),
    st.fixed_dictionaries({"ts": st.one_of(st.floats(), st.integers(), envelope_text)}),
    st.fixed_dictionaries({"type": envelope_text, "ts": st.integers(0, 9), "seq": st.integers(0, 9)}),
    st.lists(st.fixed_dictionaries({"ts": st.integers(0, 9)}), max_size=3),
    st.just(msgspec.Raw(b'{"ts":1}')), st.just(msgspec.Raw(b'1,"ts":2')),
)
valid_ts = st.one_of(st.floats(0, 2e9), st.integers(0, 2**40))
runtime_ts = st.one_of(
    valid_ts, valid_ts, valid_ts, valid_ts, valid_ts, valid_ts, valid_ts, valid_ts, valid_ts,
    st.sampled_from([float("nan"), float("inf"), 10**400, 2**70, True, False, None, "1.5", Real(1.5), Number(7),
                     Color.RED]),
    st.floats(),
)
plain_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=3).map(tuple),
                            st.dictionaries(texts, inner, max_size=4)),
    max_leaves=20,
)


@st.composite
def runtime_event(draw: st.DrawFn) -> Any:
    ev: dict[Any, Any] = {"type": draw(st.sampled_from(["tool/result", "assistant/message", "x"]))}
    for i in range(draw(st.integers(0, 4))):
        ev[draw(st.sampled_from(["turn", "step", "content", "args", f"k{i}"]))] = draw(st.one_of(lookalike, plain_values, plain_values, member))
    where = draw(st.integers(0, 9))  # mostly last, as runtimes add it; sometimes elsewhere or missing
    if where < 7:
        ev["ts"] = draw(runtime_ts)
    elif where == 7:
        ev = {"ts": draw(runtime_ts), **ev}
    elif where == 8:
        ev = {"type": ev.pop("type"), "ts": draw(runtime_ts), **ev}
    return ev


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch=st.lists(runtime_event(), max_size=12))
@example(batch=[{"type": "x", "v": {"ts": 1}, "ts": 2.5}, {"type": "x", "s": ',"ts":3}', "ts": 4}])
@example(batch=[{"type": "x", "ts": 5}, {"type": "x", "ts": 10**400}])
@example(batch=[{"type": "x", "ts": 5}, {"type": "x", "ts": True}])
@example(batch=[{"type": "x", "ts": 5}, {"type": "x", "ts": float("nan")}])
@example(batch=[{"type": "x", "ts": 5}, {"type": "x", "ts": Real(2.5)}])
@example(batch=[{"type": "x", "ts": 5}, {"type": "x", "r": msgspec.Raw(b'1,"ts":2'), "ts": 6}])
@example(batch=[{"type": "x", "ts": 5}, {"ts": 6, "type": "x"}, {"type": "x"}])
def test_runtime_events_fast_path_is_the_exact_path(batch: list[Any]) -> None:
    check(batch)


# --- the proof that values are plain JSON ------------------------------------------------

def plain_reference(events: list[dict[Any, Any]]) -> bool:
    """What _plain decides, one value at a time: every member, and every key and value
    inside it, an exact JSON scalar or an exact dict, list or tuple, no container deeper
    than MAX_DEPTH in its record (the record is depth 1, its members depth 2)."""
    todo = [(x, 2) for event in events for pair in event.items() for x in pair]
    while todo:
        value, depth = todo.pop()
        kind = type(value)
        if kind in (str, int, float, bool, type(None)):
            continue
        if kind not in (dict, list, tuple) or depth > MAX_DEPTH:
            return False
        items = [x for pair in value.items() for x in pair] if kind is dict else list(value)
        todo.extend((x, depth + 1) for x in items)
    return True


plain_member = st.one_of(member, plain_values, plain_values, deep(), st.builds(nest, st.sampled_from([MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH]),
                                                     st.sampled_from(["l", "d", "t", "ld"])))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch=st.lists(st.dictionaries(top_keys, plain_member, max_size=3), max_size=4))
@example(batch=[{"v": nest(MAX_DEPTH - 1)}])  # container depths MAX_DEPTH: plain
@example(batch=[{"v": nest(MAX_DEPTH)}])  # MAX_DEPTH + 1: not
@example(batch=[{"v": [[]]}, {"w": nest(MAX_DEPTH - 2, "l")}])
@example(batch=[{"v": {Text("k"): 1}}])  # a str subclass as a key
@example(batch=[{"v": {1: "a", "1": "b"}}])  # non-str keys are scalars (the encoder writes them as strings)
@example(batch=[{"v": {(1, (2,)): 3}}])
@example(batch=[{1: "x", "v": [Number(1)]}])
def test_plain_is_the_value_by_value_rule(batch: list[dict[Any, Any]]) -> None:
    from sessionlog.events import _plain

    assert _plain(batch) == plain_reference(batch)


def test_plain_of_a_cycle_is_false() -> None:
    from sessionlog.events import _plain

    loop: list[Any] = []
    loop.append(loop)
    assert not _plain([{"v": loop}])
    d: dict[str, Any] = {}
    d["d"] = d
    assert not _plain([{"v": d}])


# --- the batch's size, measured once ----------------------------------------------------

@pytest.mark.parametrize("record_limit", [30, 45, 1 << 16])
def test_sized_lines_are_the_lines_and_their_batch_size(record_limit: int) -> None:
    from sessionlog.events import encode_records_sized

    for batch in ([], [{"type": "x"}], [{"type": "x", "v": "y" * i} for i in range(12)],
                  [{"type": "x", "v": [i]} for i in range(3)], [{"type": "x", "r": msgspec.Raw(b"[1]")}] * 2):
        want = outcome(lambda: _encode_each(batch, range(3, 3 + len(batch)), NOW, record_limit))
        got = outcome(lambda: encode_records_sized(batch, 3, record_limit=record_limit, now=NOW))
        if want[0] == "ok":
            assert got == ("ok", (want[1], sum(map(len, want[1])) + len(want[1])))
        else:
            assert got == want


def test_batch_limit_counts_each_line_and_its_newline() -> None:
    batch = [{"type": "x", "v": "y" * i} for i in range(5)]
    lines = encode_batch(batch, 2, Limits(), now=NOW)
    size = sum(map(len, lines)) + len(lines)
    assert encode_batch(batch, 2, Limits(batch_limit=size), now=NOW) == lines
    with pytest.raises(InvalidEvent, match=f"batch of {size} bytes exceeds the batch limit of {size - 1} bytes"):
        encode_batch(batch, 2, Limits(batch_limit=size - 1), now=NOW)


@given(batch=batches, first=st.sampled_from([1, 2, 10**6, 2**53]))
@example(batch=[{"type": "x", 1: "int key"}], first=1)
@example(batch=[{"type": "x", "v": [[[[1]]]]}] * 5, first=1)
@example(batch=[{"type": "x", "ts": 1.5}], first=1)
def test_plain_size_says_records_by_construction_only_of_records(batch: list[Any], first: int) -> None:
    """What the write-behind's ``submit`` takes without encoding the records: a batch
    ``plain_size`` sizes is one ``encode_batch`` takes at any seq (given room), and each
    record is at most its event's share of that size plus the envelope."""
    size = plain_size(batch)
    if size is None:
        return
    lines = encode_batch(batch, first, Limits(record_limit=1 << 30, batch_limit=1 << 30))
    assert len(lines) == len(batch) and size == len(msgspec.json.encode(batch))
    assert all(len(line) <= len(msgspec.json.encode(event)) + 64 for line, event in zip(lines, batch))
