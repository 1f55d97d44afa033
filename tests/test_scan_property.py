"""Any byte offset, any crash point: the scanner keeps exactly the whole records, repair
closes the transcript, a second repair changes nothing."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sessions import answered_exactly_once, batches, crashed_sessions

import sessionlog
from sessionlog import CorruptLog, DamageKind, Limits
from sessionlog.contract import SECTOR
from sessionlog.scan import scan_bytes

EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    500 if os.environ.get("SESSIONLOG_SLOW") else 60
)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def write_session(directory: str, events, parts) -> bytes:
    store = sessionlog.open_store(f"jsonl:{directory}")
    store.create("s")
    for batch in parts:
        store.append("s", batch)
    with open(os.path.join(directory, "s.jsonl"), "rb") as f:
        return f.read()


def pick(data, lo: int, hi: int) -> int:
    """An integer in [lo, hi] drawn independently of lo and hi (log lengths vary with the
    clock, and hypothesis needs the same draws to replay a case)."""
    return lo + data.draw(st.integers(0, 1 << 30)) % (hi - lo + 1)


def complete_lines(data: bytes) -> list[bytes]:
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines()


@SETTINGS
@given(data=st.data())
def test_cut_at_any_offset_keeps_exactly_the_whole_records(data):
    events = data.draw(crashed_sessions())
    with tempfile.TemporaryDirectory() as d:
        log = write_session(d, events, data.draw(batches(events)))
    header_end = log.index(b"\n") + 1
    cut = pick(data, header_end, len(log))
    cut_bytes = log[:cut]
    records, stable, damage = scan_bytes(cut_bytes, session_id="s")
    assert [r.raw for r in records] == complete_lines(cut_bytes)
    assert stable == cut_bytes.rfind(b"\n") + 1
    if stable == cut:
        assert damage is None
    else:
        assert damage.kind is DamageKind.TORN
        assert (damage.offset, damage.length, damage.records_after) == (stable, cut - stable, 0)


@SETTINGS
@given(data=st.data())
def test_cut_inside_the_header_is_not_a_session_log(data):
    events = data.draw(crashed_sessions(max_turns=1))
    with tempfile.TemporaryDirectory() as d:
        log = write_session(d, events, [events] if events else [])
    cut = pick(data, 0, log.index(b"\n"))
    with pytest.raises(CorruptLog):
        scan_bytes(log[:cut], session_id="s")


@SETTINGS
@given(data=st.data())
def test_repair_after_any_crash_gives_a_valid_transcript(data):
    events = data.draw(crashed_sessions())
    with tempfile.TemporaryDirectory() as d:
        log = write_session(d, events, data.draw(batches(events)))
        header_end = log.index(b"\n") + 1
        cut = pick(data, header_end, len(log))
        path = os.path.join(d, "s.jsonl")
        os.truncate(path, cut)
        store = sessionlog.open_store(f"jsonl:{d}")
        rep = store.repair("s")
        stable = log[:cut].rfind(b"\n") + 1
        after = open(path, "rb").read()
        # The kept prefix is byte for byte the stable prefix; the tail is in quarantine.
        assert after[:stable] == log[:stable]
        if cut > stable:
            assert rep.truncated_bytes == cut - stable
            with open(rep.quarantine, "rb") as q:
                assert log[:stable] + q.read() == log[:cut]
        else:
            assert rep.quarantine is None
        records = list(store.read("s"))
        assert answered_exactly_once(records) == []
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
        res = store.scan("s")
        assert res.status == "clean" and res.damage is None
        again = store.repair("s")
        assert again.status == "clean" and again.appended == []
        assert open(path, "rb").read() == after


@SETTINGS
@given(data=st.data())
def test_zero_filled_tail(data):
    events = data.draw(crashed_sessions(max_turns=2))
    with tempfile.TemporaryDirectory() as d:
        log = write_session(d, events, data.draw(batches(events)))
    header_end = log.index(b"\n") + 1
    cut = pick(data, header_end, len(log))
    stable = log[:cut].rfind(b"\n") + 1
    # Power loss during the last write W: its first k bytes are NULs, its later pages
    # landed; the file may also have been extended with NULs past them. A sector is
    # written whole or not at all, so the NULs run to a sector's end (or W's).
    last_write = log[stable:]
    k = pick(data, 1, max(1, len(last_write)))
    k = min(max(1, len(last_write)), -(-(stable + k) // SECTOR) * SECTOR - stable)
    trailing = data.draw(st.integers(0, 64))
    damaged = log[:stable] + b"\0" * k + last_write[k:] + b"\0" * trailing
    limits = Limits(batch_limit=data.draw(st.sampled_from([256, 1024, 1 << 20])))
    records, offset, damage = scan_bytes(damaged, session_id="s", limits=limits)
    assert [r.raw for r in records] == complete_lines(log[:stable])
    assert offset == stable
    assert damage.offset == stable and damage.length == len(damaged) - stable
    # Records that still decode: whole lines of W whose preceding newline landed.
    starts = [i + 1 for i, byte in enumerate(last_write) if byte == 0x0A and i >= k]
    whole = [s for s in starts if last_write.find(b"\n", s) >= 0]
    assert damage.records_after == len(whole)
    if whole:
        last_end = last_write.rfind(b"\n") + 1
        within = last_end <= limits.batch_limit
    else:
        within = True
    assert damage.kind is (DamageKind.ZERO_FILL if within else DamageKind.MID_LOG)


@SETTINGS
@given(data=st.data())
def test_garbage_tail_is_classified_and_never_kept(data):
    events = data.draw(crashed_sessions(max_turns=2))
    with tempfile.TemporaryDirectory() as d:
        log = write_session(d, events, data.draw(batches(events)))
        header_end = log.index(b"\n") + 1
        cut = pick(data, header_end, len(log))
        stable = log[:cut].rfind(b"\n") + 1
        garbage = data.draw(st.binary(min_size=1, max_size=200).filter(lambda b: b[:1] != b"\0"))
        damaged = log[:stable] + garbage
        path = os.path.join(d, "s.jsonl")
        with open(path, "wb") as f:
            f.write(damaged)
        store = sessionlog.open_store(f"jsonl:{d}")
        res = store.scan("s")
        assert [r.raw for r in res.records] == complete_lines(log[:stable])
        assert res.damage is not None and res.damage.offset == stable
        assert res.damage.length == len(garbage)
        before = open(path, "rb").read()
        rep = store.repair("s", force=True)
        with open(rep.quarantine, "rb") as q:
            assert q.read() == garbage
        assert open(path, "rb").read()[:stable] == before[:stable]
        assert store.scan("s").status == "clean"
        assert answered_exactly_once(list(store.read("s"))) == []


# --- the fast path accepts exactly what the exact, line-by-line rules accept -------------

_HEADER = b'{"seq":1,"ts":1.0,"type":"session/start","session":"s","format":"sessionlog/1"}'


def _record(seq: int, spaced: bool) -> bytes:
    import json

    body = {"seq": seq, "ts": 2.5, "type": "tool/result", "call_id": f"c{seq}", "output": "o" * (seq % 40),
            "v": {"a": [1, {"b": None}], "s": "{[" * (seq % 3)}}
    return json.dumps(body, separators=None if spaced else (",", ":"), ensure_ascii=seq % 2 == 0).encode()


def _adversarial(seq: int, kind: str) -> bytes:
    line = _record(seq, False)
    return {
        "spaced": _record(seq, True),
        "crlf": line + b"\r",
        "cr-inside": line.replace(b',"ts"', b',\r"ts"'),
        "leading-blank": b" \t" + line,
        "nested-repeat": line[:-1] + b',"w":{"k":1,"k":2}}',
        "top-repeat": line[:-1] + b',"call_id":"x"}',
        "spaced-top-repeat": _record(seq, True)[:-1] + b', "call_id": "x"}',
        "depth-128": line[:-1] + b',"d":' + b"[" * 126 + b"]" * 126 + b"}",
        "depth-129": line[:-1] + b',"d":' + b"[" * 127 + b"]" * 127 + b"}",
        "deep": line[:-1] + b',"d":' + b"[" * 3000 + b"]" * 3000 + b"}",
        "multi-line": line.replace(b',"ts"', b',\n"ts"'),
        "two-objects": line + b'{"seq":0,"ts":1,"type":"x"}',
        "two-objects-comma": line + b',{"seq":0,"ts":1,"type":"x"}',
        "nul": line.replace(b'"output"', b'"out\x00put"'),
        "nul-run": b"\0" * 40,
        "invalid-utf8": line.replace(b'"tool/result"', b'"tool/r\xc3sult"'),
        "blank": b"",
        "garbage": b"not json",
        "seq-repeat": _record(seq - 1, False),
        "seq-gap": _record(seq + 1, False),
        "ts-string": line.replace(b'"ts":2.5', b'"ts":"2.5"'),
        "type-empty": line.replace(b'"type":"tool/result"', b'"type":""'),
        "type-number": line.replace(b'"type":"tool/result"', b'"type":7'),
        "type-missing": line.replace(b'"type":"tool/result",', b""),
        "seq-missing": line.replace(b'"seq":%d,' % seq, b""),
        "seq-float": line.replace(b'"seq":%d,' % seq, b'"seq":%d.0,' % seq),
        "seq-bool": line.replace(b'"seq":%d,' % seq, b'"seq":true,'),
        "ts-bool": line.replace(b'"ts":2.5', b'"ts":false'),
        "ts-int": line.replace(b'"ts":2.5', b'"ts":2'),
        "ts-overflow": line.replace(b'"ts":2.5', b'"ts":1e999'),
        "envelope-last": b'{"call_id":"c","seq":%d,"type":"x","ts":3}' % seq,
        "envelope-repeat": line[:-1] + b',"seq":%d}' % seq,
        # A newline inside a member's value: the members re-encode to the same bytes, but
        # the line is two lines.
        "newline-in-member": line.replace(b'"a":[1,', b'"a":[1,\n'),
        "newline-ends-member": line.replace(b'"a":[1,', b'"a":[1\n,'),
        # More than MAX_DEPTH brackets on a line that is not that deep (a long list of
        # lists), and that deep with the brackets spread out.
        "many-openers": line[:-1] + b',"l":[' + b",".join([b"[]"] * 200) + b"]}",
        "many-openers-deep": line[:-1] + b',"l":[' + b",".join([b"[]"] * 200) + b"]," + b'"d":'
        + b'{"k":[' * 64 + b"1" + b"]}" * 64 + b"}",
        "spread-depth-129": line[:-1] + b',"d":' + b'{"k":[' * 64 + b"1" + b"]}" * 64 + b"}",
        "spread-depth-128": line[:-1] + b',"d":' + b'{"k":[' * 63 + b'{"k":1}' + b"]}" * 63 + b"}",
        # Brackets inside a string are no nesting, whatever their number; beside a value
        # nested too deep they do not hide it.
        "brackets-in-string": line[:-1] + b',"o":"' + b"[{" * 200 + b'"}',
        "brackets-in-string-deep": line[:-1] + b',"o":"' + b"[{" * 200 + b'","d":' + b'{"k":[' * 64 + b"1"
        + b"]}" * 64 + b"}",
        "escaped-key": line.replace(b'"output"', b'"\\u006futput"'),
        "escaped-envelope-key": line.replace(b'"ts"', b'"t\\u0073"'),
        "non-ascii-key": line.replace(b'"output"', b'"\xc3\xb6utput"'),
        "nul-in-string": line.replace(b'"output":"', b'"output":"\x00'),
    }[kind]


ADVERSARIAL = ["spaced", "crlf", "cr-inside", "leading-blank", "nested-repeat", "top-repeat", "spaced-top-repeat",
               "depth-128", "depth-129", "deep", "multi-line", "two-objects", "two-objects-comma", "nul", "nul-run",
               "invalid-utf8", "blank", "garbage", "seq-repeat", "seq-gap", "ts-string", "type-empty",
               "type-number", "type-missing", "seq-missing", "seq-float", "seq-bool", "ts-bool", "ts-int",
               "ts-overflow", "envelope-last", "envelope-repeat", "newline-in-member", "newline-ends-member",
               "many-openers", "many-openers-deep", "spread-depth-129", "spread-depth-128", "brackets-in-string",
               "brackets-in-string-deep", "escaped-key",
               "escaped-envelope-key", "non-ascii-key", "nul-in-string"]


def runs_scanned(data: bytes) -> tuple[list[bytes], int, object]:
    """The prefix as a scan's consumer reads it run by run (no Record built): each run's
    parallel lists are its records' own, and the summary is up to date as it comes."""
    import io

    from sessionlog.events import Record
    from sessionlog.scan import LineScan

    scanner = LineScan(io.BytesIO(data).read, session_id="s", where="<bytes>")
    lines: list[bytes] = []
    for run in scanner.runs():
        run_lines = run.lines()
        assert run.data == b"".join(line + b"\n" for line in run_lines) and run.last_raw() == run_lines[-1]
        exact = [Record.from_line(line) for line in run_lines]
        assert run.seqs == [r.seq for r in exact] and run.tss == [r.ts for r in exact]
        assert run.types == [r.type for r in exact]
        assert [dict(m) for m in run.members] == [dict(r._members) for r in exact]
        lines.extend(run_lines)
        assert (scanner.count, scanner.last_seq, scanner.stable_offset) == (
            len(lines), len(lines), sum(len(line) + 1 for line in lines))
    return lines, scanner.stable_offset, scanner.damage


def exact_prefix(data: bytes) -> tuple[list[bytes], int]:
    """The reference: each line alone through Record.from_line, seqs from 1."""
    from sessionlog.events import Record, RecordError

    out: list[bytes] = []
    pos = 0
    while (nl := data.find(b"\n", pos)) >= 0:
        try:
            record = Record.from_line(data[pos:nl])
        except RecordError:
            break
        if record.seq != len(out) + 1:
            break
        out.append(data[pos:nl])
        pos = nl + 1
    return out, pos


@SETTINGS
@given(n=st.integers(2, 3000), all_spaced=st.booleans(),
       odd=st.lists(st.tuples(st.integers(2, 3000), st.sampled_from(ADVERSARIAL)), max_size=4))
# A record spread over two lines, then a line of two objects: as many objects as lines,
# not one per line (the fast path took the two halves of the first as two records).
@example(n=3, all_spaced=False, odd=[(2, "newline-in-member"), (3, "two-objects")])
def test_fast_path_accepts_exactly_what_the_exact_rules_accept(n, all_spaced, odd):
    lines = [_HEADER] + [_record(seq, all_spaced) for seq in range(2, n + 1)]
    for seq, kind in odd:
        if seq <= n:
            lines[seq - 1] = _adversarial(seq, kind)
    data = b"\n".join(lines) + b"\n"
    records, stable, damage = scan_bytes(data, session_id="s")
    expected, end = exact_prefix(data)
    assert [r.raw for r in records] == expected
    assert stable == end
    assert (damage is None) == (end == len(data))
    assert runs_scanned(data) == (expected, end, damage)
    for record in records:  # the envelope the fast path read is the line's own
        from sessionlog.events import Record

        exact = Record.from_line(record.raw)
        assert (record.seq, record.ts, record.type) == (exact.seq, exact.ts, exact.type)
    # one region attempt over the body: its records are a proven prefix, and it says
    # whether that prefix is every line of the region
    from sessionlog.events import region_records

    body = data[len(_HEADER) + 1:]
    taken, whole = region_records(body, 2)
    assert [r.raw for r in taken] == expected[1:len(taken) + 1]
    assert whole == (len(taken) == body.count(b"\n"))


def _adversarial_log(n: int, all_spaced: bool, odd: list[tuple[int, str]]) -> bytes:
    lines = [_HEADER] + [_record(seq, all_spaced) for seq in range(2, n + 1)]
    for seq, kind in odd:
        if seq <= n:
            lines[seq - 1] = _adversarial(seq, kind)
    return b"\n".join(lines) + b"\n"


@SETTINGS
@given(n=st.integers(2, 1500), all_spaced=st.booleans(),
       odd=st.lists(st.tuples(st.integers(2, 1500), st.sampled_from(ADVERSARIAL)), max_size=4),
       piece=st.sampled_from([1, 2, 7, 100, 777, 4096, 70_000]))
def test_the_prefix_does_not_depend_on_how_the_log_is_read(n, all_spaced, odd, piece):
    """Reads of any size: a line cut by a read is joined with its end alone and the rest
    of that read is decoded where it lies; the records, the stable offset and the damage
    are those of the exact rules."""
    from sessionlog.scan import LineScan

    data = _adversarial_log(n, all_spaced, odd)
    pos = 0

    def read(size: int) -> bytes:
        nonlocal pos
        chunk = data[pos:pos + min(size, piece)]
        pos += len(chunk)
        return chunk

    scanner = LineScan(read, session_id="s", where="<bytes>")
    lines = [line for run in scanner.runs() for line in run.lines()]
    expected, end = exact_prefix(data)
    assert lines == expected and scanner.stable_offset == end
    assert scanner.damage == scan_bytes(data, session_id="s")[2]


@SETTINGS
@given(n=st.integers(2, 600), all_spaced=st.booleans(),
       odd=st.lists(st.tuples(st.integers(2, 600), st.sampled_from(ADVERSARIAL)), max_size=4),
       data=st.data())
def test_a_region_decoded_in_place_is_the_region_decoded_alone(n, all_spaced, odd, data):
    """region_run_in(buf, start, end) (the members decoded where they lie in a read) gives
    what region_run gives for the region's own bytes: the same records, members and
    envelopes, and the same answer to "is that every line"."""
    from sessionlog.events import region_run, region_run_in

    log = _adversarial_log(n, all_spaced, odd)
    starts = [0] + [i + 1 for i in range(len(log)) if log[i] == 10]
    first = data.draw(st.integers(0, len(starts) - 2))
    last = data.draw(st.integers(first + 1, len(starts) - 1))
    start, end = starts[first], starts[last]
    buf = data.draw(st.sampled_from([b"", b"x", b'"}\n{'])) + log
    shift = len(buf) - len(log)
    seq = data.draw(st.sampled_from([first + 1, first + 2, 1]))
    run, whole = region_run_in(buf, start + shift, end + shift, seq)
    alone, alone_whole = region_run(log[start:end], seq)
    assert whole == alone_whole
    assert (run.data, run.lines(), run.seqs, run.tss, run.types) == (
        alone.data, alone.lines(), alone.seqs, alone.tss, alone.types)
    assert [{k: bytes(v) for k, v in m.items()} for m in run.members] == [
        {k: bytes(v) for k, v in m.items()} for m in alone.members]
    assert [r.raw for r in run.records()] == [r.raw for r in alone.records()]
