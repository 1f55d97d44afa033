"""`sessionlog convert` of Claude Code transcripts and Codex rollouts: each file becomes a
new sessionlog session in DST holding the conversation the tool resumes (repaired with
--repaired), SRC is never written, a rerun changes nothing."""

from __future__ import annotations

import datetime
import io
import json
import os
import shutil

import pytest

from sessionlog import open_store
from sessionlog.cli import main
from sessionlog.events import encode_record
from sessionlog.projection import check_pairing, project

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
STORES = ("jsonl", "zstd", "sqlite")


def run(*args: str) -> tuple[int, list[dict]]:
    out = io.StringIO()
    code = main([*args, "--json"], out)
    return code, [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def store_url(kind: str, root) -> str:
    return f"sqlite:///{root}/dst.db" if kind == "sqlite" else f"{kind}:{root}/dst"


def tree_bytes(root) -> dict[str, bytes]:
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


def entries(path) -> list[dict]:
    with open(path, "rb") as f:
        return [json.loads(line) for line in f.read().splitlines() if line.strip()]


def epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


@pytest.fixture
def src(tmp_path):
    """Copies of the Claude Code and Codex fixtures (each Codex rollout with a session id
    of its own, as real rollouts have)."""
    root = tmp_path / "src"
    shutil.copytree(os.path.join(FIXTURES, "claude-code"), root / "claude")
    (root / "codex").mkdir()
    for k, name in enumerate(sorted(os.listdir(os.path.join(FIXTURES, "codex")))):
        data = open(os.path.join(FIXTURES, "codex", name), "rb").read()
        first = json.loads(data.splitlines()[0])
        old = first["payload"]["id"]
        (root / "codex" / name).write_bytes(data.replace(old.encode(), f"{old[:-4]}{k:04d}".encode()))
    return root


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tool,view", [("claude", "anthropic"), ("codex", "responses")])
def test_a_healthy_file_becomes_a_session_holding_its_conversation(src, tmp_path, kind, tool, view):
    path = src / tool / "healthy.jsonl"
    before = tree_bytes(src)
    code, [row] = run("convert", str(path), store_url(kind, tmp_path))
    assert code == 0 and row["status"] == "converted"
    assert tree_bytes(src) == before  # SRC never written
    with open_store(store_url(kind, tmp_path)) as store:
        assert store.sessions() == [row["session"]]
        scan = store.scan(row["session"])
        assert scan.damage is None and not scan.transcript_open
        records = list(store.read(row["session"]))
    assert row["records"] == len(records)
    header = records[0]
    assert header.type == "session/start" and header["session"] == row["session"]
    assert header["source"] == {"format": "claude-code" if tool == "claude" else "codex", "path": str(path)}
    # The conversation `show --format events` gives, record for record (seqs from 2).
    out = io.StringIO()
    assert main(["show", str(path), "--format", "events"], out) == 0
    shown = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r.to_dict() | {"seq": r.seq - 1} for r in records[1:]] == shown
    assert check_pairing(project(records, view).items, view) is None
    # Each event carries the time of the entry it comes from, not 0.
    stamps = {epoch(e["timestamp"]) for e in entries(path) if isinstance(e.get("timestamp"), str)}
    assert all(r.ts in stamps for r in records)
    assert [r.ts for r in records] == sorted(r.ts for r in records)


def test_a_file_that_needs_repair_is_refused_and_creates_nothing(src, tmp_path):
    code, [row] = run("convert", str(src / "claude" / "dangling-call.jsonl"), f"jsonl:{tmp_path}/dst")
    assert code == 1 and row["status"] == "refused"
    assert "toolu_05Edit" in row["reason"] and "--repaired" in row["reason"]
    assert not os.path.exists(tmp_path / "dst")


@pytest.mark.parametrize("tool,name,code_text", [
    ("claude", "dangling-call.jsonl", "TOOL_NOT_STARTED"),
    ("codex", "dangling-call.jsonl", "TOOL_OUTCOME_UNKNOWN"),
])
def test_repaired_imports_the_conversation_repair_would_leave(src, tmp_path, tool, name, code_text):
    path = src / tool / name
    before = tree_bytes(src)
    code, [row] = run("convert", "--repaired", str(path), f"jsonl:{tmp_path}/dst")
    assert code == 0 and row["status"] == "converted"
    assert tree_bytes(src) == before
    with open_store(f"jsonl:{tmp_path}/dst") as store:
        records = list(store.read(row["session"]))
        assert store.scan(row["session"]).damage is None
    view = "anthropic" if tool == "claude" else "responses"
    assert check_pairing(project(records, view).items, view) is None
    answers = [r for r in records if r.type == "tool/result" and code_text in r["output"]]
    assert len(answers) == 1
    # The answers repair wrote are sessionlog's own: an error with its code, synthetic
    # (format.md); the tool's own results are not.
    for r in records:
        if r.type == "tool/result":
            mine = r["output"].startswith(("TOOL_NOT_STARTED", "TOOL_OUTCOME_UNKNOWN"))
            assert (r.get("synthetic"), r.get("code")) == ((True, r["output"].partition(":")[0]) if mine else (None, None))
            assert r["is_error"] is True or not mine
    assert answers[0]["code"] == code_text
    # show --format events prints these records as record lines (seq and ts first, compact).
    out = io.StringIO()
    assert main(["show", str(path), "--format", "events"], out) == 0
    assert out.getvalue().encode() == b"".join(
        encode_record({k: v for k, v in r.to_dict().items() if k != "seq"}, r.seq - 1) + b"\n"
        for r in records[1:])
    # Idempotent: a second run finds DST holding exactly these records.
    code, [again] = run("convert", "--repaired", str(path), f"jsonl:{tmp_path}/dst")
    assert code == 0 and again["status"] == "skipped" and again["records"] == row["records"]


def test_a_directory_of_files_becomes_one_session_each(src, tmp_path):
    code, rows = run("convert", "--repaired", str(src / "claude"), f"sqlite:///{tmp_path}/all.db")
    assert code == 0 and len(rows) == 5 and {r["status"] for r in rows} == {"converted"}
    with open_store(f"sqlite:///{tmp_path}/all.db") as store:
        assert sorted(store.sessions()) == sorted(r["session"] for r in rows)
    code, rows = run("convert", str(src / "codex"), f"jsonl:{tmp_path}/codex")
    by_status = sorted(r["status"] for r in rows)
    assert code == 1 and by_status.count("converted") == 2 and by_status.count("refused") == 3


def test_mid_log_damage_needs_repaired_and_force(src, tmp_path):
    path = src / "claude" / "healthy.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(5, b'{"parentUuid":"00000004-5a1c-4e7b-9d2f-0c6a3b8e1f04","ty\xff\n')
    path.write_bytes(b"".join(lines))
    for extra in ((), ("--repaired",)):
        code, [row] = run("convert", *extra, str(path), f"jsonl:{tmp_path}/dst")
        assert code == 3 and row["status"] == "refused" and "mid-log" in row["reason"]
    code, [row] = run("convert", "--repaired", "--force", str(path), f"jsonl:{tmp_path}/dst")
    assert code == 0 and row["status"] == "converted"
    assert path.read_bytes() == b"".join(lines)


def test_dst_file_names_the_session_and_input_format_forces_the_reader(src, tmp_path):
    path = tmp_path / "transcript.log"
    shutil.copy(src / "claude" / "healthy.jsonl", path)
    code, [row] = run("convert", "--input-format", "claude-code", str(path), str(tmp_path / "out" / "my-chat.jsonl"))
    assert code == 0 and row["session"] == "my-chat" and row["status"] == "converted"
    with open_store(f"jsonl:{tmp_path}/out") as store:
        assert store.sessions() == ["my-chat"]


def test_a_different_session_of_that_id_is_never_overwritten(src, tmp_path):
    dst = f"jsonl:{tmp_path}/dst"
    code, [row] = run("convert", str(src / "claude" / "healthy.jsonl"), str(tmp_path / "dst" / "chat.jsonl"))
    assert code == 0
    before = tree_bytes(tmp_path / "dst")
    code, [row] = run("convert", "--repaired", str(src / "claude" / "torn.jsonl"), str(tmp_path / "dst" / "chat.jsonl"))
    assert code == 4 and row["status"] == "exists"
    assert tree_bytes(tmp_path / "dst") == before
    with open_store(dst) as store:
        assert store.sessions() == ["chat"]


def test_session_does_not_apply_to_a_foreign_file(src, tmp_path):
    out = io.StringIO()
    assert main(["convert", str(src / "claude" / "healthy.jsonl"), f"jsonl:{tmp_path}/dst", "--session", "x"],
                out) == 2
    assert not os.path.exists(tmp_path / "dst")


def test_a_file_a_live_process_holds_open_is_locked(src, tmp_path):
    import subprocess
    import sys

    path = src / "codex" / "healthy.jsonl"
    child = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1],'ab'); "
                              "print('ok', flush=True); time.sleep(60)", str(path)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ok\n"
        code, [row] = run("convert", str(path), f"jsonl:{tmp_path}/dst")
        assert code == 5 and row["status"] == "locked" and f"process {child.pid}" in row["reason"]
        assert not os.path.exists(tmp_path / "dst")
    finally:
        child.kill()
        child.wait()
    code, [row] = run("convert", str(path), f"jsonl:{tmp_path}/dst")
    assert code == 0 and row["status"] == "converted"


def test_two_files_naming_one_session_say_which_and_how_to_import_the_second(tmp_path):
    """The checked-in Codex rollouts share one session id (variants of one session): the
    first is imported, each later one is 'exists' (exit 4, nothing overwritten) with a
    reason naming the file imported under that id and the command that imports it."""
    code, rows = run("convert", "--repaired", os.path.join(FIXTURES, "codex"), f"jsonl:{tmp_path}/dst")
    assert code == 4
    [first, *later] = rows
    assert first["status"] == "converted" and later and {r["status"] for r in later} == {"exists"}
    names = sorted(n for n in os.listdir(os.path.join(FIXTURES, "codex")))
    for name, row in zip(names[1:], later, strict=True):
        assert f"which {os.path.join(FIXTURES, 'codex', names[0])} also names" in row["reason"]
        assert f"convert {os.path.join(FIXTURES, 'codex', name)} DIR/<id>.jsonl" in row["reason"]
    with open_store(f"jsonl:{tmp_path}/dst") as store:
        assert store.sessions() == [first["session"]]
    # The command it names imports the file under the new id.
    code, [row] = run("convert", "--repaired", os.path.join(FIXTURES, "codex", names[1]), f"{tmp_path}/dst/second.jsonl")
    assert code == 0 and row["status"] == "converted" and row["session"] == "second"


def test_a_codex_output_recorded_as_failed_is_an_error_result(src, tmp_path):
    """An output object with ``success: false`` is imported as ``is_error: true``; one with
    ``success: true``, or a plain string, is not."""
    path = src / "codex" / "healthy.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    outputs = [k for k, line in enumerate(lines) if b'"function_call_output"' in line]
    shapes = [{"content": "exit 1: tests failed", "success": False}, {"content": "fine", "success": True}]
    for k, output in zip(outputs[-2:], shapes):  # two outputs of the resumed conversation
        entry = json.loads(lines[k])
        entry["payload"]["output"] = output
        lines[k] = json.dumps(entry).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    code, [row] = run("convert", str(path), f"jsonl:{tmp_path}/dst")
    assert code == 0 and row["status"] == "converted"
    with open_store(f"jsonl:{tmp_path}/dst") as store:
        results = [r for r in store.read(row["session"]) if r.type == "tool/result"]
    flags = {r["output"]: r["is_error"] for r in results}
    assert flags["exit 1: tests failed"] is True
    assert flags["fine"] is False
    assert all(flag is False for text, flag in flags.items() if text != "exit 1: tests failed")
