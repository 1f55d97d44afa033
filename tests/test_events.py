"""Record encoding: whatever append accepts, every backend's scan accepts byte for byte;
whatever it refuses is InvalidEvent, never another exception."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from contract.conftest import BACKENDS

import sessionlog
from sessionlog import InvalidEvent
from sessionlog.events import MAX_DEPTH, Record, RecordError, encode_record, encode_records
from sessionlog.scan import scan_bytes

Raw = msgspec.Raw


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionlog.EventStore]:
    gen = BACKENDS[request.param](tmp_path)
    with sessionlog.open_store(next(gen)) as st:
        yield st
    gen.close()


def nested(depth: int, leaf: object = 1) -> object:
    """A value ``depth`` containers deep (alternating dicts and lists), built without recursion."""
    value = leaf
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


REFUSED = [
    pytest.param({"type": "x", "r": Raw(b'{"a":\n1}')}, id="raw-newline"),
    pytest.param({"type": "x", "r": Raw(b'{"a":\r1}')}, id="raw-cr"),
    pytest.param({"type": "x", "r": Raw(b'{"a":1}\n{"type":"injected"}')}, id="raw-two-lines"),
    pytest.param({"type": "x", "r": Raw(b'1,"seq":3')}, id="raw-injects-seq"),
    pytest.param({"type": "x", "r": Raw(b'1,"r":3')}, id="raw-repeats-a-key"),
    pytest.param({"type": "x", "r": Raw(b"{bad")}, id="raw-not-json"),
    pytest.param({"type": "x", "r": [Raw(b'"\xff"')]}, id="raw-invalid-utf8"),
    pytest.param({"type": "x", "r": Raw(b'"a\x00b"')}, id="raw-nul-in-string"),
    pytest.param({"type": "x", "r": Raw(b"")}, id="raw-empty"),
    pytest.param({"type": "x", "v": nested(MAX_DEPTH)}, id="depth-129"),
    pytest.param({"type": "x", "v": nested(1000)}, id="depth-1001"),
    pytest.param({"type": "x", "v": nested(5000)}, id="depth-5001"),
    pytest.param({"type": "x", "ts": 5, "v": nested(5000)}, id="depth-5001-general-path"),
    pytest.param({"type": "x", "v": [Raw(b"[" * 200 + b"]" * 200)]}, id="raw-deep"),
]


@pytest.mark.parametrize("event", REFUSED)
def test_refused_events_raise_invalid_event_and_write_nothing(store, event):
    store.create("s")
    with pytest.raises(InvalidEvent):
        store.append("s", [{"type": "ok"}, event])
    with store.session("s") as handle, pytest.raises(InvalidEvent):
        handle.append([event, {"type": "ok"}])
    assert store.append("s", [{"type": "after"}]) == 2
    scan = store.scan("s")
    assert scan.status == "clean" and scan.damage is None and scan.last_seq == 2


# The same 1,000-byte batch, split after event 0, 1 or 2: a per-batch proof of the
# joined lines would see one valid JSON list of three objects.
SMUGGLED = [{"type": "x", "r": Raw(b'1},{"z":2')}, {"type": "x", "r": Raw(b'"')}, {"type": "x", "r": Raw(b'"')}]


def test_a_raw_value_cannot_spread_one_record_over_its_neighbours(store):
    store.create("s")
    with pytest.raises(InvalidEvent):
        store.append("s", SMUGGLED)
    assert store.scan("s").last_seq == 1


ACCEPTED = [
    pytest.param({"type": "x", "r": Raw(b'{"a": 1,\t"b" : [ 2 ] }')}, id="raw-spaced"),
    pytest.param({"type": "x", "r": Raw(b'{"a":1,"a":2}')}, id="raw-nested-repeated-key"),
    pytest.param({"type": "x", "r": Raw('"é\\n"'.encode())}, id="raw-utf8-escape"),
    pytest.param({"type": "x", "v": nested(MAX_DEPTH - 1)}, id="depth-128"),
    pytest.param({"type": "x", "v": [Raw(b"[" * 126 + b"]" * 126)]}, id="raw-depth-128"),
    pytest.param({"type": "x", "s": "{[" * 300}, id="brackets-in-a-string"),
]


@pytest.mark.parametrize("event", ACCEPTED)
def test_accepted_events_scan_clean_byte_for_byte(store, event):
    store.create("s")
    seq = store.append("s", [event, {"type": "ok"}])
    with store.session("s") as handle:
        handle.append([{"type": "ok"}, event])
    records = list(store.read("s"))
    scan = store.scan("s")
    assert scan.status == "clean" and scan.last_seq == seq + 2 == len(records)
    for record in records:
        assert Record.from_line(record.raw).raw == record.raw
    body = records[1].raw.partition(b',"type":')[2]
    assert body == records[4].raw.partition(b',"type":')[2] and body.endswith(msgspec.json.encode(event)[9:])


def test_encode_record_refuses_deep_nesting_without_recursion_error():
    with pytest.raises(RecordError, match="deeper"):
        encode_record({"type": "x", "v": nested(5000)}, 2, 1.0)
    with pytest.raises(RecordError, match="event 1"):
        encode_records([{"type": "ok"}, {"type": "x", "v": nested(5000)}], 2, record_limit=1 << 20)


def test_a_deep_caller_stack_does_not_make_a_valid_record_corrupt():
    line = encode_record({"type": "x", "v": nested(MAX_DEPTH - 1)}, 2, 1.0)

    def at_depth(n: int):
        if n:
            return at_depth(n - 1)
        return Record.from_line(line), encode_record({"type": "x", "v": nested(MAX_DEPTH - 1)}, 2, 1.0)

    limit = sys.getrecursionlimit()
    record, again = at_depth(limit - 60)
    assert record.raw == line == again
    assert sys.getrecursionlimit() == limit


def test_a_bare_cr_is_json_whitespace_on_every_backend(store, tmp_path):
    """A JSONL line holding a bare CR between tokens is a record (JSON whitespace): it scans
    clean as JSONL and converts byte for byte into every backend."""
    lines = [b'{"seq":1,"ts":1.0,"type":"session/start","session":"s","format":"sessionlog/1"}',
             b'{"seq":2,\r"ts":2.0,"type":"x"}\r',
             b'{"seq":3,"ts":3.0,"type":"y","v":[1,\r2]}']
    records, _, damage = scan_bytes(b"\n".join(lines) + b"\n", session_id="s")
    assert damage is None and [r.raw for r in records] == lines
    store.import_session("s", records)
    assert [r.raw for r in store.read("s")] == lines
    assert store.scan("s").status == "clean"


def test_a_line_break_inside_a_record_never_decodes():
    for line in (b'{"seq":2,\n"ts":2.0,"type":"x"}', b'{"seq":2,"ts":2.0,"type":"x"}\n'):
        with pytest.raises(RecordError, match="line break"):
            Record.from_line(line)


@pytest.mark.parametrize("dst", ["sqlite", "postgresql", "zstd", "memory"])
def test_convert_copies_a_jsonl_record_with_a_bare_cr(tmp_path, dst):
    import io

    from sessionlog.cli import main

    src = tmp_path / "src"
    src.mkdir(mode=0o700)
    lines = [b'{"seq":1,"ts":1.0,"type":"session/start","session":"s","format":"sessionlog/1"}',
             b'{"seq":2,"ts":2.0,\r"type":"x"}']
    (src / "s.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    gen = BACKENDS[dst](tmp_path)
    url = next(gen)
    if dst == "memory":
        with sessionlog.open_store(url) as st:
            st.import_session("s", scan_bytes((src / "s.jsonl").read_bytes(), session_id="s")[0])
            assert [r.raw for r in st.read("s")] == lines
    else:
        assert main(["convert", f"jsonl:{src}", url], out=io.StringIO()) == 0
        with sessionlog.open_store(url) as st:
            assert [r.raw for r in st.read("s")] == lines and st.scan("s").status == "clean"
    gen.close()


def test_nested_repeated_keys_are_judged_alike_compact_or_spaced():
    """Only top-level keys must be unique, on the fast path and the exact path alike."""
    header = b'{"seq":1,"ts":1.0,"type":"session/start","session":"s","format":"sessionlog/1"}'
    for line, kept in ((b'{"seq":2,"ts":2.0,"type":"x","v":{"a":1,"a":2}}', True),
                       (b'{"seq":2, "ts":2.0,"type":"x","v":{"a":1, "a":2}}', True),
                       (b'{"seq":2, "ts":2.0,"type":"x","v":{"a":1},"v":2}', False)):
        records, _, damage = scan_bytes(header + b"\n" + line + b"\n", session_id="s")
        assert (damage is None) is kept and len(records) == 1 + kept


def test_a_region_line_one_level_too_deep_is_refused_like_a_single_line():
    """129 opening brackets on one line and one on each other line: the region's bracket
    count alone must not let it through."""
    header = b'{"seq":1,"ts":1.0,"type":"session/start","session":"s","format":"sessionlog/1"}'
    body = [b'{"seq":%d,"ts":2.0,"type":"x"}' % seq for seq in range(2, 40)]
    body[10] = b'{"seq":12,"ts":2.0,"type":"x","v":' + b"[" * 128 + b"]" * 128 + b"}"
    records, _, damage = scan_bytes(b"\n".join([header, *body]) + b"\n", session_id="s")
    assert len(records) == 11 and damage is not None and damage.records_after == 27
