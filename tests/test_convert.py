"""convert: any store to any store, records byte-identical; never overwrites DST, never
writes SRC; damage refused, or the repaired view with ``repaired=True``."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessionlog.backends.zstd import open_zstd
from sessions import batches, crashed_sessions

import sessionlog
from sessionlog import InvalidStoreUrl, SessionNotFound
from sessionlog.convert import (
    SkippableFramesDropped,
    convert,
    exit_code,
    resolve_target,
)
from sessionlog.targets import destination

EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    200 if os.environ.get("SESSIONLOG_SLOW") else 25
)

TURN = [
    {"type": "turn/start", "turn": "t1"},
    {"type": "user/message", "turn": "t1", "content": "héllo \u2028 \"quoted\""},
    {"type": "step/start", "turn": "t1", "step": 1},
    {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
     "tool_calls": [{"id": "c1", "name": "ls", "arguments": {"path": "."}}]},
    {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c1", "name": "ls"},
]
UNKNOWN = {"type": "vendor/thing", "ts": 12.5, "big": 10**30, "float": 1e-7, "nested": [[{"x": None}]]}


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime: what "never writes SRC" is checked against."""
    out = {}
    for name in sorted(os.listdir(directory)):
        p = directory / name
        out[name] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


def jsonl_store(path: Path, sessions: dict[str, list[list[dict]]]) -> None:
    store = sessionlog.open_store(f"jsonl:{path}")
    for sid, parts in sessions.items():
        store.create(sid)
        for batch in parts:
            store.append(sid, batch)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_jsonl_to_zstd_to_jsonl_is_byte_identical(data):
    events = data.draw(crashed_sessions())
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        jsonl_store(root / "a", {"s": [*data.draw(batches(events)), [UNKNOWN]], "t": []})
        results = convert(f"jsonl:{root / 'a'}", f"zstd:{root / 'z'}")
        assert [(r.session, r.status) for r in results] == [("s", "converted"), ("t", "converted")]
        results = convert(f"zstd:{root / 'z'}", f"jsonl:{root / 'b'}")
        assert exit_code(results) == 0
        for sid in ("s", "t"):
            assert (root / "b" / f"{sid}.jsonl").read_bytes() == (root / "a" / f"{sid}.jsonl").read_bytes()


def test_unknown_fields_and_types_survive_verbatim(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [[UNKNOWN], TURN]})
    convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}")
    src = [r.raw for r in sessionlog.open_store(f"jsonl:{tmp_path / 'a'}").read("s")]
    dst = [r.raw for r in sessionlog.open_store(f"zstd:{tmp_path / 'z'}").read("s")]
    assert dst == src
    assert b'"big":1000000000000000000000000000000' in dst[1]


def test_never_overwrites_a_dst_session(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN], "new": []})
    dst = open_zstd(str(tmp_path / "z"))
    dst.create("s", [{"type": "mine"}])
    before = (tmp_path / "z" / "s.jsonl.zst").read_bytes()
    results = {r.session: r for r in convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}")}
    assert results["s"].status == "exists" and results["new"].status == "converted"
    assert (tmp_path / "z" / "s.jsonl.zst").read_bytes() == before
    assert exit_code(results.values()) == 4


def test_never_writes_src(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN], "u": [TURN[:2]]})
    with open(tmp_path / "a" / "u.jsonl", "ab") as f:
        f.write(b'{"seq":4,"ts":1,"ty')  # a torn tail
    before = snapshot(tmp_path / "a")
    convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z1'}")
    convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z2'}", repaired=True)
    convert(f"{tmp_path / 'a'}", f"jsonl:{tmp_path / 'j'}", session="u", repaired=True)
    assert snapshot(tmp_path / "a") == before
    with pytest.raises(SessionNotFound):
        convert(f"jsonl:{tmp_path / 'missing'}", f"zstd:{tmp_path / 'z3'}")
    assert not (tmp_path / "missing").exists()


def test_damaged_src_is_refused_with_its_scan(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN]})
    with open(tmp_path / "a" / "s.jsonl", "ab") as f:
        f.write(b'{"seq":7,"ts":1,"ty')
    [result] = convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}")
    assert result.status == "refused" and result.exit_code == 1
    assert result.scan.damage.kind == "torn" and result.scan.damage.offset > 0
    assert "--repaired" in result.reason
    assert "s" not in open_zstd(str(tmp_path / "z")).sessions()


def test_repaired_writes_the_repaired_view(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN]})
    with open(tmp_path / "a" / "s.jsonl", "ab") as f:
        f.write(b"\0" * 300)
    src = sessionlog.open_store(f"jsonl:{tmp_path / 'a'}")
    plan = src.repair("s", dry_run=True)
    [result] = convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}", repaired=True)
    assert result.status == "converted" and result.exit_code == 0
    dst = open_zstd(str(tmp_path / "z"))
    records = [r.raw for r in dst.read("s")]
    prefix = [r.raw for r in src.read("s")]
    assert records[: len(prefix)] == prefix
    types = [sessionlog.Record.from_line(r).type for r in records[len(prefix):]]
    assert types == [r.type for r in plan.appended] == ["log/truncated", "tool/result", "step/end", "turn/end"]
    assert dst.scan("s").status == "clean"
    # SRC itself is still damaged: nothing was repaired in place.
    assert src.scan("s").damage.kind == "zero-fill"


def test_repaired_closes_an_open_transcript_too(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN]})
    [plain] = convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z1'}")
    assert plain.status == "converted"
    assert open_zstd(str(tmp_path / "z1")).scan("s").status == "repairable"  # copied as it is
    convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z2'}", repaired=True)
    assert open_zstd(str(tmp_path / "z2")).scan("s").status == "clean"


def test_mid_log_damage_is_refused_even_when_repaired(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN]})
    path = tmp_path / "a" / "s.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2]) + b"garbage\n" + b"".join(lines[3:]))
    [result] = convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}", repaired=True)
    assert result.status == "refused" and result.exit_code == 3


def test_an_owned_src_session_is_not_converted(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN]})
    with sessionlog.open_store(f"jsonl:{tmp_path / 'a'}").session("s"):
        [result] = convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}")
    assert result.status == "locked" and result.exit_code == 5


def test_not_a_session_log_is_an_error(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "s.jsonl").write_bytes(b'{"seq":1,"ts":1,"type":"session/start","session":"s","format":"v9"}\n')
    (tmp_path / "a" / "x.jsonl").write_bytes(b"hello\n")
    results = convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}")
    assert [r.status for r in results] == ["error", "error"]
    assert exit_code(results) == 4


def test_skippable_frames_are_dropped_with_a_warning(tmp_path):
    z = open_zstd(str(tmp_path / "z"))
    z.create("s", TURN)
    path = tmp_path / "z" / "s.jsonl.zst"
    path.write_bytes(path.read_bytes() + b"\x5f\x2a\x4d\x18\x02\x00\x00\x00hi")
    with pytest.warns(SkippableFramesDropped):
        [result] = convert(f"zstd:{tmp_path / 'z'}", f"jsonl:{tmp_path / 'j'}")
    assert result.status == "converted" and result.warnings
    assert (tmp_path / "j" / "s.jsonl").read_bytes().splitlines() == [r.raw for r in z.read("s")]


def test_progress_counts_every_record(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN] * 100, "t": []})
    seen: list[int] = []
    results = convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}", progress=seen.append)
    assert sum(seen) == sum(r.records for r in results) == 1 + 500 + 1


def test_plain_paths_resolve_to_stores_and_sessions(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN], "t": []})
    assert resolve_target(str(tmp_path / "a")) == (f"jsonl:{tmp_path / 'a'}", None)
    assert resolve_target(str(tmp_path / "a" / "s.jsonl")) == (f"jsonl:{tmp_path / 'a'}", "s")
    # A destination may be new: its backend is told by its name.
    assert destination(str(tmp_path / "z" / "s.jsonl.zst")) == (f"zstd:{tmp_path / 'z'}", "s")
    assert resolve_target("zstd:relative/dir") == ("zstd:relative/dir", None)
    assert destination(str(tmp_path / "x.sqlite")) == (f"sqlite:///{tmp_path / 'x.sqlite'}", None)
    with pytest.raises(InvalidStoreUrl):
        destination(str(tmp_path / "nowhere"))
    with pytest.raises(SessionNotFound):  # a source must exist
        resolve_target(str(tmp_path / "nowhere"))
    # A session file to a session file of the other backend: just that session.
    [result] = convert(str(tmp_path / "a" / "s.jsonl"), str(tmp_path / "z" / "s.jsonl.zst"))
    assert result.status == "converted"
    assert open_zstd(str(tmp_path / "z")).sessions() == ["s"]
    with pytest.raises(InvalidStoreUrl):
        convert(str(tmp_path / "a" / "s.jsonl"), str(tmp_path / "z" / "t.jsonl.zst"))
    assert resolve_target(str(tmp_path / "z")) == (f"zstd:{tmp_path / 'z'}", None)


@pytest.mark.skipif(importlib.util.find_spec("sessionlog.backends.sql") is None,
                    reason="the SQL backend does not exist yet")
def test_jsonl_to_sqlite_to_zstd_to_jsonl(tmp_path):
    jsonl_store(tmp_path / "a", {"s": [TURN, [UNKNOWN]]})
    db = f"sqlite:///{tmp_path / 'x.db'}"
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippableFramesDropped)
        assert exit_code(convert(f"jsonl:{tmp_path / 'a'}", db)) == 0
        assert exit_code(convert(db, f"zstd:{tmp_path / 'z'}")) == 0
        assert exit_code(convert(f"zstd:{tmp_path / 'z'}", f"jsonl:{tmp_path / 'b'}")) == 0
    assert (tmp_path / "b" / "s.jsonl").read_bytes() == (tmp_path / "a" / "s.jsonl").read_bytes()


def test_convert_into_zstd_writes_frames_of_at_most_one_mib(tmp_path):
    import zstandard

    store = sessionlog.open_store(f"jsonl:{tmp_path / 'a'}")
    store.create("big")
    for i in range(60):
        store.append("big", [{"type": "user/message", "turn": "t", "content": f"{i} " + "z" * 1000}] * 64)
    assert exit_code(convert(f"jsonl:{tmp_path / 'a'}", f"zstd:{tmp_path / 'z'}")) == 0
    data = (tmp_path / "z" / "big.jsonl.zst").read_bytes()
    sizes = []
    while data:
        obj = zstandard.ZstdDecompressor().decompressobj()
        sizes.append(len(obj.decompress(data)))
        data = obj.unused_data
    assert len(sizes) >= 4 and max(sizes) <= 1 << 20  # one bad frame never takes the whole session
    assert sum(sizes) == (tmp_path / "a" / "big.jsonl").stat().st_size


def _cli(*args: str) -> tuple[int, str]:
    import io

    from sessionlog.cli import main

    out = io.StringIO()
    return main(list(args), out), out.getvalue()


def test_convert_cli_rerun_skips_identical_refuses_different_and_forces_in_the_copy(tmp_path):
    import json
    import shutil

    fixtures = Path(__file__).resolve().parent.parent / "fixtures"
    src = tmp_path / "src"
    src.mkdir()
    for name in ("healthy", "torn", "mid-log"):
        shutil.copy(fixtures / f"{name}.jsonl", src / f"{name}.jsonl")
    before = snapshot(src)
    dst = f"zstd:{tmp_path / 'dst'}"
    code, out = _cli("convert", str(src), dst, "--json")
    rows = {r["session"]: r for r in map(json.loads, out.splitlines())}
    assert code == 3 and rows["healthy"]["status"] == "converted"
    assert rows["torn"]["status"] == "refused" and "--repaired" in rows["torn"]["reason"]
    assert rows["mid-log"]["status"] == "refused" and "--repaired --force" in rows["mid-log"]["reason"]
    # a rerun: what arrived identical is skipped, not an error
    code, out = _cli("convert", str(src), dst, "--json", "--repaired")
    rows = {r["session"]: r for r in map(json.loads, out.splitlines())}
    assert rows["healthy"]["status"] == "skipped" and rows["torn"]["status"] == "converted"
    assert rows["mid-log"]["status"] == "refused" and code == 3
    code, out = _cli("convert", str(src), dst, "--json", "--repaired", "--force")
    rows = {r["session"]: r for r in map(json.loads, out.splitlines())}
    assert code == 0 and {r["status"] for r in rows.values()} == {"skipped", "converted"}
    assert rows["mid-log"]["status"] == "converted"
    assert snapshot(src) == before  # SRC never written
    copied = list(sessionlog.open_store(dst).read("mid-log"))
    [marker] = [r for r in copied if r["type"] == "log/truncated"]
    assert marker["quarantine"] is None and marker["source"] == str(src / "mid-log.jsonl")
    assert sessionlog.open_store(dst).scan("mid-log").status == "clean"
    # a different session of that id in DST: left untouched, exit 4
    other = tmp_path / "other"
    other.mkdir()
    sessionlog.open_store(f"jsonl:{other}").create("healthy")
    code, out = _cli("convert", str(other), dst, "--json")
    row = json.loads(out)
    assert code == 4 and row["status"] == "exists"
    # ... and the reason says how they differ: DST's 22 records against this one's 1
    held = len(list(sessionlog.open_store(dst).read("healthy")))
    assert f"it holds {held} records, this convert writes 1; they differ from record 1 on" in row["reason"]
    # a table without --json
    code, out = _cli("convert", str(src / "healthy.jsonl"), dst)
    assert code == 0 and "skipped" in out and not out.lstrip().startswith("{")
