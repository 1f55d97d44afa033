"""The prefix scanner's decode rules, on both of its paths (whole regions and single lines)."""

from __future__ import annotations

import json

import pytest

from sessionlog import CorruptLog, DamageKind, Limits
from sessionlog.events import Record, RecordError, decode_region
from sessionlog.scan import scan_bytes


def log(n: int = 400) -> list[bytes]:
    lines = [b'{"seq":1,"ts":1.5,"type":"session/start","session":"s","format":"sessionlog/1"}']
    for seq in range(2, n + 1):
        lines.append(json.dumps({"seq": seq, "ts": 2.0, "type": "tool/result", "call_id": f"c{seq}",
                                 "output": "x" * (seq % 50), "nested": {"a": [1, {"b": None}]}},
                                separators=(",", ":")).encode())
    return lines


def deep(depth: int) -> bytes:
    return b'{"seq":SEQ,"ts":1,"type":"x","v":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize(
    ("replacement", "kept"),
    [
        (b'{"seq":SEQ, "ts": 2.0, "type": "spaced"}', True),  # not compact, still a record
        (b'{"seq":SEQ,"ts":2.0,"type":"t\\u00e9"}', True),  # an escape: still a record
        ('{"seq":SEQ,"ts":2.0,"type":"é"}'.encode(), True),  # UTF-8
        (b'{"seq":SEQ,"ts":2.0,"type":"x","k":1,"k":2}', False),  # a repeated key
        (b'{"seq":SEQ,"seq":SEQ,"ts":2.0,"type":"x"}', False),
        (deep(128), True),
        (deep(129), False),
        (b'{"seq":SEQ,"ts":2.0,"type":""}', False),
        (b'{"seq":SEQ,"ts":2.0,"type":"a"},{"seq":SEQ,"ts":1,"type":"b"}', False),  # two objects
        (b'{"seq":SEQ,"ts":2.0,"type":"x","s":"\xff"}', False),  # not UTF-8
        (b'{"seq":SEQ,"ts":"2","type":"x"}', False),
        (b"", False),
    ],
)
def test_a_line_in_the_middle_of_a_region(replacement, kept):
    lines = log()
    at = 250
    lines[at] = replacement.replace(b"SEQ", str(at + 1).encode())
    data = b"\n".join(lines) + b"\n"
    records, stable, damage = scan_bytes(data, session_id="s")
    if kept:
        assert damage is None and len(records) == len(lines)
        assert records[at].raw == lines[at]
    else:
        assert len(records) == at
        assert damage.kind is DamageKind.MID_LOG
        assert damage.offset == sum(len(x) + 1 for x in lines[:at])
    # the fast path and the line-by-line rules agree on every line
    for line in lines[1:]:
        try:
            Record.from_line(line)
            single = True
        except RecordError:
            single = False
        region = decode_region(line + b"\n", json.loads(line)["seq"] if single else 0)
        assert bool(region) <= single  # the fast path never accepts what the exact rules refuse


def test_regions_and_lines_agree_on_seq_breaks():
    lines = log()
    lines[300] = lines[299]
    records, _, damage = scan_bytes(b"\n".join(lines) + b"\n", session_id="s")
    assert len(records) == 300 and damage.kind is DamageKind.SEQ_BREAK


def test_a_record_over_the_limit_in_the_prefix_is_an_error():
    lines = log(50)
    lines[20] = lines[20][:-1] + b',"pad":"' + b"p" * 3000 + b'"}'
    with pytest.raises(CorruptLog):
        scan_bytes(b"\n".join(lines) + b"\n", session_id="s", limits=Limits(record_limit=2048))


def test_one_odd_line_does_not_slow_down_its_region():
    """A record written with spaces (valid, not compact) is proven with its region; a line
    with a repeated key stops the region just before it."""
    lines = log(2000)
    lines[700] = lines[700].replace(b'"ts":', b'"ts": ')
    records, stable, damage = scan_bytes(b"\n".join(lines) + b"\n", session_id="s")
    assert damage is None and [r.raw for r in records] == lines
    assert len(decode_region(b"\n".join(lines[1:]) + b"\n", 2)) == 1999
    lines[700] = lines[700][:-1] + b', "call_id": "again"}'
    assert decode_region(b"\n".join(lines[1:]) + b"\n", 2)[-1].seq == 700  # stops just before it


def test_damage_in_a_log_larger_than_one_read(tmp_path):
    lines = log(12000)
    lines[5000] = b"garbage"
    data = b"\n".join(lines) + b"\n"
    assert len(data) > 1 << 20
    records, _, damage = scan_bytes(data, session_id="s")
    assert len(records) == 5000 and damage.kind is DamageKind.MID_LOG and damage.records_after == 6999


def test_a_bad_line_costs_a_few_region_decodes_not_one_per_line(monkeypatch):
    from sessionlog import events

    calls = []
    real = events._decode_lines
    monkeypatch.setattr(events, "_decode_lines", lambda lines: calls.append(len(lines)) or real(lines))
    lines = log(4000)
    lines[3990] = b"\0\0\0"
    records, _, damage = scan_bytes(b"\n".join(lines) + b"\n", session_id="s")
    assert len(records) == 3990 and damage is not None
    assert len(calls) < 60


def test_the_tail_count_does_not_depend_on_how_the_file_is_read():
    from sessionlog.scan import LineScan

    lines = log(300)
    lines[100] = b"not json"
    lines[200] = lines[200][:-1] + b',"pad":"' + b"p" * 3000 + b'"}'  # decodes, over the limit
    data = b"\n".join(lines[:201]) + b"\n"
    kinds = set()
    for chunk in (7, 1000, 1 << 20):
        pos = 0

        def read(n, chunk=chunk):
            nonlocal pos
            piece = data[pos:pos + min(n, chunk)]
            pos += len(piece)
            return piece

        scan = LineScan(read, session_id="s", where="<mem>", limits=Limits(record_limit=2048))
        list(scan)
        kinds.add((scan.damage.kind, scan.damage.records_after))
    assert kinds == {(DamageKind.MID_LOG, 99)}


def test_a_deep_spaced_line_is_refused_not_raised():
    line = b'{"seq":2, "ts":1,"type":"x","v":' + b"[" * 990 + b"]" * 990 + b"}"
    with pytest.raises(RecordError):
        Record.from_line(line)


def test_append_never_writes_what_scan_refuses():
    import msgspec

    from sessionlog.events import encode_records

    for bad in ({"type": "x", "r": msgspec.Raw(b'{"a":1}\n{"type":"injected"}')},
                {"type": "x", "r": msgspec.Raw(b"{bad")},
                {"type": "x", "r": [msgspec.Raw(b'"\xff"')]}):
        with pytest.raises(RecordError):
            encode_records([{"type": "ok"}, bad], 2, record_limit=10_000)
    assert encode_records([{"type": "x", "r": msgspec.Raw(b"[1,2]")}], 2, record_limit=100)


def test_the_benchmark_shapes_are_what_they_claim():
    """``sessionlog bench`` times these shapes against the compact log; each must be the
    valid or damaged log its label says."""
    from benchmarks.scans import SHAPES, make_corpus, shaped_log

    corpus = make_corpus(300, 0)
    for shape in SHAPES:
        data = shaped_log(corpus, shape, max_bytes=64 << 10)
        records, _, damage = scan_bytes(data, session_id="shape")
        if shape == "blank-lines":
            assert len(records) == 1 and damage.kind is DamageKind.CORRUPT
        elif shape.endswith("mid-log"):
            kept = 2 if shape.startswith("nul-run") else 1  # the NULs come after record 2
            assert len(records) == kept and damage.kind is DamageKind.MID_LOG and damage.records_after > 50, shape
        else:
            assert damage is None and len(records) == data.count(b"\n") > 50, shape


def test_a_region_run_is_its_records_in_parallel_lists():
    """What a scan hands its consumer for a region: the lines' bytes and the records'
    envelopes and members, as the exact rules read each line; ``head`` keeps a prefix."""
    from sessionlog.events import RecordRun, region_run

    lines = log(300)[1:]
    # A shallow line that opens more than MAX_DEPTH brackets: measured, and kept.
    lines[40] = lines[40][:-1] + b',"l":[' + b",".join([b"{}"] * 300) + b"]}"
    region = b"".join(line + b"\n" for line in lines)
    run, whole = region_run(region, 2)
    exact = [Record.from_line(line) for line in lines]
    assert whole and run.data == region and run.lines() == lines and len(run) == len(lines)
    assert run.seqs == [r.seq for r in exact] and run.tss == [r.ts for r in exact]
    assert run.types == [r.type for r in exact] and run.last_raw() == lines[-1]
    assert run.records() == exact and [r.raw_member("call_id") for r in run.records()] == [
        r.raw_member("call_id") for r in exact]
    head = run.head(41)
    assert head.data == b"".join(line + b"\n" for line in lines[:41]) and head.lines() == lines[:41]
    assert (head.seqs, head.tss, head.types) == (run.seqs[:41], run.tss[:41], run.types[:41])
    assert head.records() == exact[:41] and run.head(len(run)) is run
    again = RecordRun.of(exact[:3])
    assert again.records() is not None and again.data == region[: len(again.data)] and again.seqs == [2, 3, 4]


@pytest.mark.parametrize("depth", [128, 129])
@pytest.mark.parametrize("where", [2, 150, 300, 599])
def test_one_deep_line_among_flat_lines_is_judged_wherever_it_lies(depth, where):
    """Flat lines open one bracket each, so a line 129 deep is the only excess in its
    bracket count: wherever it lies (first or last line of a counted window, or across
    windows), 128 deep is a record and 129 deep ends the prefix there."""
    lines = [b'{"seq":1,"ts":1.5,"type":"session/start","session":"s","format":"sessionlog/1"}']
    for seq in range(2, 601):
        line = deep(depth) if seq == where else b'{"seq":SEQ,"ts":2.0,"type":"flat","pad":"' + b"p" * 90 + b'"}'
        lines.append(line.replace(b"SEQ", str(seq).encode()))
    records, stable, damage = scan_bytes(b"\n".join(lines) + b"\n", session_id="s")
    if depth == 128:
        assert damage is None and len(records) == 600
    else:
        assert len(records) == where - 1 and damage is not None
