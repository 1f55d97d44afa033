"""Acknowledged means readable: random events (msgspec.Raw values holding any bytes, deep
and wide nesting, batches up to past the batch limit) are appended to every backend;
every acknowledged record scans clean, byte for byte the same on every backend, and
every refused batch raised InvalidEvent and wrote nothing."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import msgspec
import pytest
from contract.conftest import BACKENDS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sessionlog
from sessionlog import InvalidEvent, Limits
from sessionlog.events import Record
from sessionlog.scan import scan_bytes

EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    400 if os.environ.get("SESSIONLOG_SLOW") else 40
)
LIMITS = Limits(record_limit=16 << 10, batch_limit=48 << 10)
TS = 1_735_689_600.5  # every event carries it: the same batch encodes alike on every backend

# JSON text a runtime might hand over pre-encoded: valid, spaced, multi-line, or not JSON.
raw_json = st.sampled_from([
    b"1", b'"x"', b"[1,2]", b'{"a":1}', b'{"a": [1, 2],\t"b" : null}', b'{"a":\n1}', b'{"a":\r1}',
    b'{"a":1,"a":2}', b"[" * 127 + b"]" * 127, b"[" * 129 + b"]" * 129, b'1,"seq":9', b'1},{"z":2',
    b'"', b"", b"nul\x00", b'"\xff"', "\"é\"".encode(), b'"\\u00e9"', b" 1 ", b"\r\n",
])
raws = st.one_of(raw_json, st.binary(max_size=24)).map(msgspec.Raw)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
                    st.text(max_size=30))
values = st.recursive(
    st.one_of(scalars, raws),
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=8), inner, max_size=6)),
    max_leaves=40,
)


@st.composite
def deep(draw: st.DrawFn) -> object:
    value = draw(st.one_of(scalars, raws))
    for i in range(draw(st.sampled_from([1, 60, 126, 127, 128, 129, 400, 3000]))):
        value = [value] if i % 2 else {"d": value}
    return value


member = st.one_of(values, values, deep(), st.text(min_size=2000, max_size=6000))
keys = st.text(min_size=1, max_size=10).filter(lambda k: k not in ("seq", "ts", "type"))


@st.composite
def event(draw: st.DrawFn) -> dict[str, object]:
    ev: dict[str, object] = {"type": draw(st.sampled_from(["x/a", "x/b", "llm/retry", "agent/note"]))}
    ev.update(draw(st.dictionaries(keys, member, max_size=draw(st.sampled_from([3, 40])))))
    ev["ts"] = TS
    return ev


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, sessionlog.EventStore]]:
    opened: dict[str, sessionlog.EventStore] = {}
    gens = []
    for name, make in sorted(BACKENDS.items()):
        gen = make(tmp_path_factory.mktemp(name))
        try:
            url = next(gen)
        except pytest.skip.Exception:
            continue
        gens.append(gen)
        opened[name] = sessionlog.open_store(url, limits=LIMITS)
    yield opened
    for store in opened.values():
        store.close()
    for gen in gens:
        gen.close()


_ids = itertools.count()


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(batch_list=st.lists(st.lists(event(), min_size=1, max_size=30), min_size=1, max_size=4),
       widen=st.integers(0, 300))
def test_every_acknowledged_record_scans_clean_on_every_backend(stores, batch_list, widen):
    if widen:  # a huge batch of small events, near or past the batch limit
        batch_list = [*batch_list, [{"type": "x/w", "i": i, "ts": TS} for i in range(widen * 2)]]
    sid = f"p{next(_ids)}"
    written: dict[str, list[bytes]] = {}
    outcomes: dict[str, list[bool]] = {}
    for name, store in stores.items():
        store.create(sid, [{"type": "x/first", "ts": TS}])
        acked = []
        for batch in batch_list:
            before = store.scan(sid).last_seq
            try:
                last = store.append(sid, batch)
            except InvalidEvent:
                acked.append(False)
                assert store.scan(sid).last_seq == before  # nothing was written
            else:
                acked.append(True)
                assert last == before + len(batch)
        scan = store.scan(sid)
        assert scan.damage is None and scan.status == "clean", (name, scan.damage)
        records = list(store.read(sid))
        assert len(records) == scan.last_seq == 2 + sum(len(b) for b, ok in zip(batch_list, acked, strict=True) if ok)
        for record in records:
            assert Record.from_line(record.raw).raw == record.raw
        written[name] = [r.raw for r in records[1:]]  # the header names the session only
        outcomes[name] = acked
    # Every backend accepted and refused the same batches, and wrote the same bytes.
    assert len({tuple(o) for o in outcomes.values()}) == 1
    assert len({tuple(w) for w in written.values()}) == 1
    # The JSONL bytes on disk scan clean with the scanner's fast and exact paths alike.
    if "jsonl" in stores:
        header = next(iter(stores["jsonl"].read(sid))).raw
        data = b"\n".join([header, *written["jsonl"]]) + b"\n"
        records, stable, damage = scan_bytes(data, session_id=sid)
        assert damage is None and stable == len(data) and len(records) == 1 + len(written["jsonl"])
