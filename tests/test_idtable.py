"""IdTable, the compact str -> int table the streamed view and the pairing checker keep
call ids in, against a dict: the same answers after any sequence of sets and lookups,
keys of any text (empty, non-ASCII, lone surrogates), through every growth."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_transcript import SLOW

from sessionlog.projection import IdTable

KEYS = st.one_of(st.sampled_from(["", "a", "b", "call_1", "é", "\ud800", "\ud83d\ude00", "😀"]),
                 st.text(max_size=12), st.text(alphabet="ab", max_size=4))
OPS = st.lists(st.tuples(st.sampled_from(["set", "get", "in"]), KEYS, st.integers(0, 2**62)), max_size=300)


@settings(max_examples=1000 if SLOW else 200, deadline=None)
@given(OPS, st.sampled_from([1, 2, 8, 1024]))
def test_idtable_answers_as_a_dict(ops: list[tuple[str, str, int]], size: int) -> None:
    table, model = IdTable(size), {}
    for op, key, value in ops:
        if op == "set":
            table[key] = value
            model[key] = value
        elif op == "get":
            assert table.get(key) == model.get(key)
            assert table.get(key, -5) == model.get(key, -5)
        else:
            assert (key in table) == (key in model)
        assert len(table) == len(model)
    for key, value in model.items():
        assert table[key] == value


def test_idtable_refuses_what_it_does_not_hold() -> None:
    table = IdTable()
    with pytest.raises(KeyError):
        table["x"]
    assert 7 not in table and None not in table
    table["x"] = 3
    assert table["x"] == 3 and "x" in table


def test_idtable_is_smaller_than_a_dict() -> None:
    keys = [f"call_{i:024d}" for i in range(100_000)]
    table: Any = IdTable()
    for i, key in enumerate(keys):
        table[key] = i << 2
    held = sys.getsizeof(table._keys) + sys.getsizeof(table._index)
    as_dict = {k: i << 2 for i, k in enumerate(keys)}
    in_dict = sys.getsizeof(as_dict) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in as_dict.items())
    assert held * 2 < in_dict
    assert all(table[keys[i]] == i << 2 for i in range(0, len(keys), 997))
