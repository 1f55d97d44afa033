"""The `sessionlog` command: exit codes, JSON lines, no write unless asked."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

import sessionlog
from sessionlog.cli import main

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")

# fixture -> (scan status, damage kind, scan exit, repair exit, repair status)
EXPECTED = {
    "healthy": ("clean", None, 0, 0, "clean"),
    "dangling-parallel": ("repairable", None, 1, 0, "repaired"),
    "torn": ("repairable", "torn", 1, 0, "repaired"),
    "zero-fill": ("repairable", "zero-fill", 1, 0, "repaired"),
    "corrupt-last": ("repairable", "corrupt", 1, 0, "repaired"),
    "mid-log": ("needs-force", "mid-log", 3, 3, "refused"),
    "seq-break": ("needs-force", "seq-break", 3, 3, "refused"),
}


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), out)
    return code, out.getvalue()


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def fixtures_copy(tmp_path):
    d = tmp_path / "fx"
    d.mkdir()
    for name in os.listdir(FIXTURES):
        if name.endswith(".jsonl"):
            shutil.copy(os.path.join(FIXTURES, name), d / name)
    return d


def snapshot(d):
    return {n: ((d / n).read_bytes(), os.stat(d / n).st_mtime_ns) for n in sorted(os.listdir(d))}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_scan_and_repair_each_fixture(fixtures_copy, name):
    status, kind, scan_exit, repair_exit, repair_status = EXPECTED[name]
    path = str(fixtures_copy / f"{name}.jsonl")
    code, out = run("scan", path, "--json")
    [row] = json_lines(out)
    assert code == scan_exit
    assert row["session"] == name and row["status"] == status
    assert (row["damage"] or {}).get("kind") == kind
    assert set(row) >= {"session", "path", "records", "status", "damage", "open_turn", "open_step", "unanswered_calls"}
    code, out = run("repair", path, "--json")
    [rep] = json_lines(out)
    assert code == repair_exit and rep["status"] == repair_status
    assert set(rep) >= {"session", "path", "status", "reason", "truncated_bytes", "quarantine", "appended"}
    if repair_status == "refused":
        code, out = run("repair", path, "--json", "--force")
        assert code == 0 and json_lines(out)[0]["status"] == "repaired"
    code, out = run("scan", path, "--json")
    assert code == 0 and json_lines(out)[0]["status"] == "clean"
    code, out = run("repair", path, "--json")
    assert code == 0 and json_lines(out)[0]["status"] == "clean"


def test_directory_target_reports_worst_exit(fixtures_copy):
    before = snapshot(fixtures_copy)
    code, out = run("scan", str(fixtures_copy), "--json")
    assert code == 3
    assert sorted(r["session"] for r in json_lines(out)) == sorted(EXPECTED)
    assert snapshot(fixtures_copy) == before  # scan wrote nothing, not even a lock file


def test_dry_run_writes_nothing(fixtures_copy):
    before = snapshot(fixtures_copy)
    code, out = run("repair", str(fixtures_copy), "--dry-run", "--json")
    assert code == 3
    rows = {r["session"]: r for r in json_lines(out)}
    assert rows["torn"]["status"] == "repaired" and rows["torn"]["dry_run"] is True
    assert [a["type"] for a in rows["torn"]["appended"]][0] == "log/truncated"
    assert snapshot(fixtures_copy) == before


def test_repair_directory_leaves_needs_force_sessions_unchanged(fixtures_copy):
    mid = (fixtures_copy / "mid-log.jsonl").read_bytes()
    code, _ = run("repair", str(fixtures_copy), "--json")
    assert code == 3
    assert (fixtures_copy / "mid-log.jsonl").read_bytes() == mid
    code, out = run("scan", str(fixtures_copy), "--json")
    assert {r["session"]: r["status"] for r in json_lines(out)} == {
        n: ("needs-force" if e[0] == "needs-force" else "clean") for n, e in EXPECTED.items()
    }


def test_quarantine_plus_prefix_is_the_original(fixtures_copy):
    original = (fixtures_copy / "zero-fill.jsonl").read_bytes()
    code, out = run("repair", str(fixtures_copy / "zero-fill.jsonl"), "--json")
    [rep] = json_lines(out)
    kept = (fixtures_copy / "zero-fill.jsonl").read_bytes()[: len(original) - rep["truncated_bytes"]]
    with open(rep["quarantine"], "rb") as q:
        assert kept + q.read() == original


def test_bad_files_exit_4(tmp_path):
    shutil.copytree(os.path.join(FIXTURES, "bad"), tmp_path / "bad")
    code, out = run("scan", str(tmp_path / "bad"), "--json")
    assert code == 4
    rows = {r["session"]: r for r in json_lines(out)}
    assert rows["future-format"]["status"] == "unsupported"
    assert rows["not-a-log"]["status"] == "error"
    assert "offset 0" in rows["not-a-log"]["error"]
    before = snapshot(tmp_path / "bad")
    code, _ = run("repair", str(tmp_path / "bad"), "--json")
    assert code == 4
    after = {n: v for n, v in snapshot(tmp_path / "bad").items() if not n.endswith(".lock")}
    assert after == before  # never "repaired" into a session log


def test_locked_session(tmp_path):
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    with store.session("s1"):
        code, out = run("scan", str(tmp_path), "--json")
        assert code == 0 and json_lines(out)[0]["status"] == "open"
        code, out = run("repair", str(tmp_path), "--json")
        assert code == 5 and json_lines(out)[0]["status"] == "refused"
    code, _ = run("repair", str(tmp_path), "--json")
    assert code == 0


def test_in_flight_tail_of_an_owned_session(tmp_path):
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s1")
    with store.session("s1"):
        with open(tmp_path / "s1.jsonl", "ab") as f:
            f.write(b'{"seq":2,"ts":1,"type":"turn/st')  # a write in flight
        code, out = run("scan", str(tmp_path), "--json")
        [row] = json_lines(out)
        assert code == 0 and row["status"] == "open" and row["damage"]["kind"] == "in-flight"


def test_show_events_is_the_repaired_view_without_writing(fixtures_copy):
    before = snapshot(fixtures_copy)
    code, out = run("show", str(fixtures_copy / "torn.jsonl"))
    assert code == 0
    lines = out.splitlines()
    records = [json.loads(x) for x in lines]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert records[-1]["type"] == "turn/end" and records[-1]["status"] == "interrupted"
    assert snapshot(fixtures_copy) == before
    # the same bytes repair then writes
    run("repair", str(fixtures_copy / "torn.jsonl"))
    assert (fixtures_copy / "torn.jsonl").read_text().splitlines()[:-5] == lines[:-5]
    assert len((fixtures_copy / "torn.jsonl").read_text().splitlines()) == len(lines)


def test_usage_errors_exit_2(tmp_path):
    assert run("scan", str(tmp_path / "missing"))[0] == 2
    assert run("scan", "nosuch://x")[0] == 2
    assert run("frobnicate")[0] == 2
    (tmp_path / "x.txt").write_text("hi")
    assert run("scan", str(tmp_path / "x.txt"))[0] == 2


def test_many_sessions_in_one_call(tmp_path):
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    for i in range(2000):
        store.create(f"s{i:04d}", [{"type": "turn/start", "turn": "t"}] if i % 500 == 0 else [])
    code, out = run("scan", str(tmp_path), "--json")
    rows = json_lines(out)
    assert code == 1 and len(rows) == 2000
    assert sum(r["status"] == "repairable" for r in rows) == 4
    code, out = run("repair", str(tmp_path), "--json")
    assert code == 0 and sum(r["status"] == "repaired" for r in json_lines(out)) == 4


def test_console_script_exit_codes(fixtures_copy):
    exe = shutil.which("sessionlog") or os.path.join(os.path.dirname(sys.executable), "sessionlog")
    r = subprocess.run([exe, "scan", str(fixtures_copy / "torn.jsonl")], capture_output=True, text=True)
    assert r.returncode == 1
    assert "torn" in r.stdout
    r = subprocess.run([exe, "scan", str(fixtures_copy / "nope.jsonl")], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_io_error_is_exit_4_without_traceback(tmp_path):
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("good")
    os.mkdir(tmp_path / "s1.jsonl")  # reading it fails with EISDIR
    code, out = run("scan", str(tmp_path), "--json")
    rows = {r["session"]: r for r in json_lines(out)}
    assert code == 4
    assert rows["s1"]["status"] == "error" and "s1.jsonl" in rows["s1"]["error"]
    assert rows["good"]["status"] == "clean"
