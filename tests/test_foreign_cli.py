"""``sessionlog scan|repair|show`` on Claude Code transcripts and Codex rollouts: exit
codes, what is written (and what never is), in-use refusal, directories."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

from sessionlog import foreign
from sessionlog.cli import main
from sessionlog.contract import IOFailure
from sessionlog.durable import FileSystem
from sessionlog.foreign import files

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
CODEX = os.path.join(FIXTURES, "codex")


def run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(args), out)
    return code, out.getvalue()


def rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def snapshot(root) -> dict:
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = (f.read(), os.stat(path).st_mtime_ns)
    return found


@pytest.fixture
def claude_dir(tmp_path):
    """A ~/.claude look-alike: projects/<slug>/<session>.jsonl for each fixture."""
    project = tmp_path / ".claude" / "projects" / "-home-dana-projets-deploiement"
    shutil.copytree(os.path.join(FIXTURES, "claude-code"), project)
    return project


@pytest.fixture
def codex_dir(tmp_path):
    """A ~/.codex/sessions look-alike, dated directories included."""
    day = tmp_path / ".codex" / "sessions" / "2026" / "11" / "30"
    day.mkdir(parents=True)
    for name in os.listdir(os.path.join(FIXTURES, "codex")):
        shutil.copy(os.path.join(FIXTURES, "codex", name),
                    day / f"rollout-2026-11-30T10-00-00-{name[:-6]}.jsonl")
    return tmp_path / ".codex" / "sessions"


SCAN = {
    "healthy.jsonl": ("clean", 0),
    "dangling-call.jsonl": ("repairable", 1),
    "interrupted-parallel.jsonl": ("repairable", 1),
    "orphan-result.jsonl": ("repairable", 1),
    "torn.jsonl": ("repairable", 1),
}


@pytest.mark.parametrize("name", sorted(SCAN))
def test_scan_each_claude_fixture(claude_dir, name):
    status, code = SCAN[name]
    before = snapshot(claude_dir.parent.parent)
    got, out = run("scan", str(claude_dir / name), "--json")
    [row] = rows(out)
    assert (row["status"], got) == (status, code)
    assert row["format"] == "claude-code"
    assert snapshot(claude_dir.parent.parent) == before  # scan writes nothing


def test_scan_directory_recursively_reports_the_worst(codex_dir, claude_dir):
    code, out = run("scan", str(codex_dir), "--json")
    found = {r["file"]: r["status"] for r in rows(out)}
    assert code == 1
    assert found["2026/11/30/rollout-2026-11-30T10-00-00-healthy.jsonl"] == "clean"
    assert found["2026/11/30/rollout-2026-11-30T10-00-00-dangling-call.jsonl"] == "repairable"
    assert len(found) == 5
    code, out = run("scan", str(claude_dir))
    assert code == 1 and "toolu_05Edit" in out and "interrupted-parallel.jsonl" in out


def test_mid_log_damage_exits_3_and_repair_refuses_without_force(claude_dir):
    path = claude_dir / "healthy.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(5, b'{"parentUuid":"00000004-5a1c-4e7b-9d2f-0c6a3b8e1f04","ty\xff\n')
    path.write_bytes(b"".join(lines))
    before = snapshot(claude_dir)
    code, out = run("scan", str(path), "--json")
    assert code == 3 and rows(out)[0]["status"] == "needs-force"
    assert rows(out)[0]["damage"]["kind"] == "mid-log"
    code, out = run("repair", str(path), "--json")
    assert code == 3 and rows(out)[0]["status"] == "refused"
    assert snapshot(claude_dir) == before
    code, out = run("repair", str(path), "--force", "--json")
    [rep] = rows(out)
    assert code == 0 and rep["status"] == "repaired"
    with open(rep["quarantine"], "rb") as q:
        assert q.read() == lines[5]
    assert path.read_bytes() == b"".join(lines[:5] + lines[6:])


def test_repair_keeps_the_original_and_a_second_repair_changes_nothing(claude_dir):
    path = claude_dir / "dangling-call.jsonl"
    original = path.read_bytes()
    mode = stat.S_IMODE(os.stat(path).st_mode)
    code, out = run("repair", str(path), "--json")
    [rep] = rows(out)
    assert code == 0 and rep["status"] == "repaired"
    assert [a["call_id"] for a in rep["appended"]] == ["toolu_05Edit"]
    with open(rep["backup"], "rb") as f:
        assert f.read() == original
    assert os.path.dirname(rep["backup"]) == str(claude_dir) and rep["backup"].endswith(".orig")
    assert stat.S_IMODE(os.stat(path).st_mode) == mode  # published in place with its mode
    repaired = path.read_bytes()
    assert len(repaired.splitlines()) == len(original.splitlines()) + 1
    before = snapshot(claude_dir)
    code, out = run("repair", str(path), "--json")
    assert code == 0 and rows(out)[0]["status"] == "clean"
    assert snapshot(claude_dir) == before  # nothing written, no second backup
    code, out = run("scan", str(path), "--json")
    assert code == 0 and rows(out)[0]["status"] == "clean"


def test_codex_repair_is_a_durable_append_at_the_same_path(codex_dir):
    [path] = [p for p in codex_dir.rglob("*dangling-call.jsonl")]
    original = path.read_bytes()
    inode = os.stat(path).st_ino
    code, out = run("repair", str(path), "--json")
    [rep] = rows(out)
    assert code == 0 and rep["quarantine"] is None and rep["changed_lines"] == []
    assert os.stat(path).st_ino == inode  # the same file: Codex's index still names it
    assert path.read_bytes().startswith(original)
    assert [a["code"] for a in rep["appended"]] == ["TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED"]


def test_torn_tail_is_quarantined_never_dropped_silently(codex_dir):
    [path] = [p for p in codex_dir.rglob("*torn.jsonl")]
    original = path.read_bytes()
    code, out = run("repair", str(path), "--json")
    [rep] = rows(out)
    assert code == 0 and rep["truncated_bytes"] == 40
    with open(rep["quarantine"], "rb") as q:
        assert path.read_bytes() + q.read() == original
    assert ".torn." in os.path.basename(rep["quarantine"])


def test_dry_run_and_show_write_nothing(claude_dir, codex_dir):
    roots = [claude_dir, codex_dir]
    before = [snapshot(r) for r in roots]
    code, out = run("repair", str(claude_dir), "--dry-run", "--json")
    assert code == 0
    assert {r["file"]: r["status"] for r in rows(out)}["dangling-call.jsonl"] == "repaired"
    assert all(r["dry_run"] and r["backup"] is None for r in rows(out))
    for fmt in ("events", "openai", "anthropic", "responses"):
        code, _ = run("show", str(claude_dir / "dangling-call.jsonl"), "--format", fmt)
        assert code == 0
    assert [snapshot(r) for r in roots] == before


@pytest.mark.parametrize("view", ["openai", "anthropic", "responses"])
def test_show_check_passes_on_the_repaired_view(claude_dir, codex_dir, view, capsys):
    for path in [claude_dir / "interrupted-parallel.jsonl", *codex_dir.rglob("*dangling-call.jsonl")]:
        code, out = run("show", str(path), "--format", view, "--check")
        assert code == 0
        body = json.loads(out)
        items = body["input" if view == "responses" else "messages"]
        assert "TOOL_NOT_STARTED" in json.dumps(items)
    assert "fails the" in capsys.readouterr().err  # the file as it is would be rejected


def test_input_format_forces_the_reader(tmp_path):
    # A transcript whose first lines are metadata only: not recognized by content...
    path = tmp_path / "odd.jsonl"
    with open(os.path.join(FIXTURES, "claude-code", "dangling-call.jsonl"), "rb") as f:
        body = f.read()
    path.write_bytes(b'{"type":"ai-title","title":"x"}\n' + body)
    code, out = run("scan", str(path), "--input-format", "claude-code", "--json")
    assert code == 1 and rows(out)[0]["unanswered_calls"] == ["toolu_05Edit"]
    # ...and a file that is not that format at all is an error (exit 4), never repaired.
    other = tmp_path / "notes.jsonl"
    other.write_bytes(b"hello\n")
    code, out = run("repair", str(other), "--input-format", "codex", "--json")
    assert code == 4 and other.read_bytes() == b"hello\n"
    code, _ = run("scan", str(tmp_path / "missing.jsonl"), "--input-format", "codex")
    assert code == 2


def test_sessionlog_fixtures_are_not_claimed():
    assert foreign.command.claim(FIXTURES) is None
    assert foreign.command.claim(os.path.join(FIXTURES, "torn.jsonl")) is None


def test_a_file_held_open_by_a_live_process_is_refused_unless_forced(claude_dir):
    path = claude_dir / "dangling-call.jsonl"
    child = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1],'ab'); "
                              "print('ok', flush=True); time.sleep(60)", str(path)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ok"
        before = path.read_bytes()
        code, out = run("scan", str(path), "--json")
        assert code == 0 and rows(out)[0]["status"] == "open"
        assert f"process {child.pid}" in rows(out)[0]["in_use"][0]
        code, out = run("repair", str(path), "--json")
        assert code == 5 and "in use" in rows(out)[0]["reason"]
        assert path.read_bytes() == before
        code, out = run("repair", str(path), "--force", "--json")
        assert code == 0 and rows(out)[0]["status"] == "repaired"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_claude_session_record_of_a_live_process_refuses(claude_dir):
    path = claude_dir / "dangling-call.jsonl"
    sessions = claude_dir.parent.parent / "sessions"
    sessions.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (sessions / f"{child.pid}.json").write_text(json.dumps(
            {"pid": child.pid, "sessionId": "dangling-call", "cwd": "/x", "startedAt": 1}))
        code, out = run("repair", str(path), "--json")
        assert code == 5 and f"Claude Code process {child.pid}" in rows(out)[0]["reason"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    for _ in range(100):  # a dead process's record no longer refuses
        code, out = run("repair", str(path), "--json")
        if code == 0:
            break
        time.sleep(0.01)
    assert code == 0 and rows(out)[0]["status"] == "repaired"


class FailingSync(FileSystem):
    """Fails the fsync of the temp that would replace the transcript."""

    def __init__(self) -> None:
        self.calls = 0

    def fsync(self, fd: int) -> None:
        self.calls += 1
        if self.calls == 2:  # 1: the backup's temp; 2: the new transcript's temp
            raise OSError(5, "Input/output error")
        super().fsync(fd)


def test_a_failed_sync_leaves_the_file_as_it_was(claude_dir):
    path = str(claude_dir / "orphan-result.jsonl")
    original = open(path, "rb").read()
    snap = files.read(path)
    exam = foreign.examine(snap.data, foreign.get("claude-code"))
    with pytest.raises(IOFailure) as info:
        files.write_repair(snap, exam, FailingSync())
    assert isinstance(info.value.__cause__, OSError)
    assert open(path, "rb").read() == original
    assert not [n for n in os.listdir(claude_dir) if n.endswith(".tmp")]


def test_a_file_changed_after_it_was_read_is_not_replaced(claude_dir):
    path = str(claude_dir / "orphan-result.jsonl")
    snap = files.read(path)
    exam = foreign.examine(snap.data, foreign.get("claude-code"))
    with open(path, "ab") as f:
        f.write(b'{"type":"last-prompt","lastPrompt":"x"}\n')
    changed = open(path, "rb").read()
    with pytest.raises(IOFailure):
        files.write_repair(snap, exam)
    assert open(path, "rb").read() == changed


def test_console_script(claude_dir):
    exe = os.path.join(os.path.dirname(sys.executable), "sessionlog")
    r = subprocess.run([exe, "scan", str(claude_dir / "torn.jsonl")], capture_output=True, text=True)
    assert r.returncode == 1 and "torn" in r.stdout
    r = subprocess.run([exe, "repair", str(claude_dir / "torn.jsonl")], capture_output=True, text=True)
    assert r.returncode == 0 and "repaired" in r.stdout


def test_a_fifo_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "rollout.jsonl"
    os.mkfifo(fifo, 0o600)
    code, out = run("scan", str(fifo), "--input-format", "codex", "--json")
    assert code == 4 and "not a regular file" in rows(out)[0]["error"]


def test_a_forced_input_format_that_the_content_contradicts_is_a_usage_error(capsys):
    claude = os.path.join(FIXTURES, "claude-code", "dangling-call.jsonl")
    for path, forced in ((claude, "codex"), (os.path.join(FIXTURES, "healthy.jsonl"), "claude-code")):
        before = open(path, "rb").read()
        code = main(["scan", "--input-format", forced, path, "--json"], io.StringIO())
        assert code == 2 and f"--input-format {forced}, but its content is" in capsys.readouterr().err
        assert open(path, "rb").read() == before
    assert main(["scan", "--input-format", "claude-code", claude], io.StringIO()) == 1  # what it is: read


@pytest.mark.parametrize("tool", ["claude-code", "codex"])
def test_show_of_a_torn_file_warns_that_the_view_leaves_its_last_line_out(tool, capsys):
    path = os.path.join(FIXTURES, tool, "torn.jsonl")
    code, _ = run("show", path, "--format", "events")
    err = capsys.readouterr().err
    assert code == 0 and f"warning: {path}: torn at offset" in err and "damaged last line" in err
    code, _ = run("show", os.path.join(FIXTURES, tool, "healthy.jsonl"), "--format", "events")
    assert code == 0 and "warning" not in capsys.readouterr().err


def test_a_tree_mixing_sessionlog_logs_and_foreign_files_says_which_is_which(tmp_path, capsys):
    """Scanning a parent of both: the foreign files are scanned, and the note names the
    sessionlog logs' directory (not 'neither a Claude Code transcript nor a Codex
    rollout'); in a store directory, a Claude Code transcript's error says what it is."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "cc").mkdir()
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), tmp_path / "logs" / "torn.jsonl")
    shutil.copy(os.path.join(FIXTURES, "claude-code", "healthy.jsonl"), tmp_path / "cc" / "healthy.jsonl")
    code, out = run("scan", str(tmp_path), "--json")
    assert code == 0 and [r["file"] for r in rows(out)] == [os.path.join("cc", "healthy.jsonl")]
    err = capsys.readouterr().err
    assert "1 sessionlog log(s)" in err and str(tmp_path / "logs") in err and "neither" not in err
    shutil.copy(os.path.join(FIXTURES, "claude-code", "dangling-call.jsonl"), tmp_path / "logs" / "cc.jsonl")
    code, out = run("scan", str(tmp_path / "logs"), "--json")
    by = {r["session"]: r for r in rows(out)}
    assert code == 4 and by["cc"]["status"] == "error"
    assert "it is a Claude Code transcript: name the file" in by["cc"]["error"]


ORDINALS = os.path.join(CODEX, "healthy-ordinals.jsonl")
ROLLOUT = "rollout-2026-01-01T00-00-00-0199a000-0000-7000-8000-000000000001.jsonl"


def ordinal_lines() -> list[bytes]:
    """The rollout whose lines carry ordinals, as Codex writes them: ``timestamp``,
    ``ordinal`` (from 0), ``type``, ``payload``."""
    with open(ORDINALS, "rb") as f:
        return f.read().splitlines(keepends=True)


def _orphan(lines: list[bytes]) -> list[bytes]:
    extra = json.loads(lines[21])
    extra["payload"]["call_id"] = "call_Z9gone"
    return lines[:22] + [json.dumps(extra, separators=(",", ":")).encode() + b"\n"] + lines[22:]


def _glued(lines: list[bytes]) -> list[bytes]:
    return lines[:10] + [lines[10][:40] + lines[11]] + lines[12:]


ORDINAL_REFUSALS = {
    # what the damage is: (the lines, the 1-based line the refusal names)
    "an answer before a later message": (lambda lines: lines[:9] + lines[10:], 13),
    "a misplaced output": (lambda lines: lines[:20] + [lines[23], lines[20]] + lines[21:23] + lines[24:], 21),
    "an orphan output": (_orphan, 23),
    "a duplicate call": (lambda lines: lines[:20] + [lines[19]] + lines[20:], 21),
    "a glued line": (_glued, 11),
    "an undecodable line before the end": (lambda lines: lines[:5] + [b'{"timestamp":"2026-\x00\x00\n'] + lines[5:], 6),
    "a complete undecodable last line": (lambda lines: lines[:20] + [b'{"timestamp":"2026-11-30T10:0\x00\x00\n'], 21),
    # call_C3ruff's output lost, the last line (a message) lacks its newline: the answer
    # would go before it, where it could carry no ordinal.
    "an answer before a last line without newline": (lambda lines: lines[:20] + lines[21:23] + [lines[23][:-1]], 23),
}


@pytest.mark.parametrize("damage", sorted(ORDINAL_REFUSALS))
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_a_codex_rollout_with_ordinals_is_never_changed_before_its_end(tmp_path, damage, force):
    """Codex keeps byte offsets into a rollout whose lines carry ordinals (its history
    projection resumes at a stored offset; forks keep the offset they branched at): a
    repair that would change or shift any byte up to the last newline (an answer before
    the end, a moved, quarantined or rewritten line, an undecodable line removed, even a
    complete one at the end, which Codex has read past) is refused, --force included:
    exit 3, nothing written, the reason names the file, the line and its offset."""
    make, line = ORDINAL_REFUSALS[damage]
    data = b"".join(make(ordinal_lines()))
    path = tmp_path / ROLLOUT
    path.write_bytes(data)
    offset = sum(map(len, data.splitlines(keepends=True)[: line - 1]))
    code, text = run("repair", str(path), "--json", *(["--force"] if force else []))
    row = rows(text)[0]
    assert (code, row["status"]) == (3, "refused"), row
    assert row["reason"].startswith(f"{path}: its lines carry `ordinal`s")
    assert f"from line {line} (offset {offset}) on" in row["reason"] and "--force included" in row["reason"]
    assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no backup, no quarantine
    scanned = rows(run("scan", str(path), "--json")[1])[0]
    assert scanned["status"] == "needs-force" and f"from line {line} (offset {offset})" in scanned["reason"]
    assert run("scan", str(path))[0] == 3
    code, shown = run("show", str(path), "--format", "responses", "--check")
    assert code == 0 and path.read_bytes() == data  # the repaired history, read only


def test_a_codex_rollout_with_ordinals_gets_its_answers_appended_with_the_next_ordinals(tmp_path):
    """Calls at the end of the rollout: their answers are a durable append, each line in
    Codex's shape (timestamp, ordinal, type, payload) with the next ordinal; every byte
    before stays where it was."""
    lines = ordinal_lines()
    data = b"".join(lines[:20])  # ends with two parallel calls, no outputs
    path = tmp_path / ROLLOUT
    path.write_bytes(data)
    inode = os.stat(path).st_ino
    code, text = run("repair", str(path), "--json")
    assert code == 0 and rows(text)[0]["status"] == "repaired" and rows(text)[0]["quarantine"] is None
    after = path.read_bytes()
    assert after.startswith(data) and os.stat(path).st_ino == inode  # appended in place
    new = [json.loads(x) for x in after[len(data):].splitlines()]
    assert [list(n) for n in new] == [["timestamp", "ordinal", "type", "payload"]] * 2
    assert [n["ordinal"] for n in new] == [20, 21]  # the lines there carry 0..19
    assert [n["payload"]["call_id"] for n in new] == ["call_C3ruff", "call_D4mypy"]
    assert run("scan", str(path))[0] == 0


def test_a_codex_rollout_with_ordinals_loses_its_torn_last_line_and_gets_the_answers(tmp_path):
    """A torn last line (no newline: no reader took it in) is cut and quarantined, and the
    answers take its place with the ordinals that follow the last complete line."""
    lines = ordinal_lines()
    prefix = b"".join(lines[:20])
    torn = lines[20][:57]
    path = tmp_path / ROLLOUT
    path.write_bytes(prefix + torn)
    code, text = run("repair", str(path), "--json")
    row = rows(text)[0]
    assert code == 0 and row["status"] == "repaired" and row["truncated_bytes"] == len(torn)
    after = path.read_bytes()
    assert after.startswith(prefix)
    assert [json.loads(x)["ordinal"] for x in after[len(prefix):].splitlines()] == [20, 21]
    with open(row["quarantine"], "rb") as f:
        assert f.read() == torn
    assert run("scan", str(path))[0] == 0


def test_a_codex_tool_search_answer_on_disk_carries_its_code_and_shows_it(tmp_path):
    """The appended tool_search_output claims no completed search (status incomplete, no
    tools), keeps the code and text for people and tools, and `show` gives them back as
    the call's answer."""
    with open(os.path.join(CODEX, "healthy.jsonl"), "rb") as f:
        data = f.read()
    data += (b'{"timestamp":"2026-11-30T10:01:00.000Z","type":"response_item","payload":{"type":"tool_search_call",'
             b'"call_id":"ts_1","execution":"client","arguments":{"query":"deploy"}}}\n')
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(data)
    code, text = run("repair", str(path), "--json")
    assert code == 0 and rows(text)[0]["appended"][0]["code"] == "TOOL_NOT_STARTED"
    after = path.read_bytes()
    assert after.startswith(data)
    [line] = rows(after[len(data):].decode())
    assert line["payload"]["status"] == "incomplete" and line["payload"]["tools"] == []
    assert line["payload"]["sessionlog_recovery"]["code"] == "TOOL_NOT_STARTED"
    code, shown = run("show", str(path), "--format", "openai", "--check")
    assert code == 0
    [answer] = [m for m in json.loads(shown)["messages"] if m.get("tool_call_id") == "ts_1"]
    assert answer["content"].startswith("TOOL_NOT_STARTED: ")


def test_claude_repair_leaves_results_before_text_and_scan_finds_results_after_text(tmp_path):
    """A results entry that ends in text ("[Request interrupted by user for tool use]"):
    repair chains the missing answers before it, and `show --check` passes; the same
    file with those answers chained after the text (as an earlier repair wrote them) is a
    user message whose text precedes a tool_result: scan says so (exit 1), `show` notes
    it and shows the view repair would leave, and repair chains the answers first."""
    with open(os.path.join(FIXTURES, "claude-code", "interrupted-parallel.jsonl"), "rb") as f:
        lines = f.read().splitlines(keepends=True)
    at = lines[8].index(b"]},")
    lines[8] = lines[8][:at] + b',{"type":"text","text":"[Request interrupted by user for tool use]"}' + lines[8][at:]
    data = b"".join(lines)
    path = tmp_path / "7c1e9a52-3f0b-4d8e-9a61-2b5f0c4d9e13.jsonl"
    path.write_bytes(data)
    code, text = run("repair", str(path), "--json")
    assert code == 0 and rows(text)[0]["status"] == "repaired"
    written = path.read_bytes().splitlines(keepends=True)
    answer, results = json.loads(written[8]), json.loads(written[9])
    assert answer["toolDenialKind"] == "interrupted" and results["parentUuid"] == answer["uuid"]
    assert run("show", str(path), "--format", "anthropic", "--check")[0] == 0

    late = dict(answer, parentUuid=json.loads(lines[8])["uuid"])  # the answer after the text
    after_text = lines[:9] + [json.dumps(late, ensure_ascii=False).encode() + b"\n"] + lines[9:]
    path.write_bytes(b"".join(after_text))
    code, text = run("scan", str(path), "--json")
    found = {f["kind"]: f for f in rows(text)[0]["findings"]}
    assert code == 1 and found["result-after-text"]["call_id"] == "toolu_01Deploy"
    assert run("show", str(path), "--format", "anthropic", "--check")[0] == 0
    assert run("repair", str(path))[0] == 0
    assert run("scan", str(path))[0] == 0 and run("show", str(path), "--format", "anthropic", "--check")[0] == 0
    items = foreign.get("claude-code").native_items(foreign.examine(path.read_bytes(), foreign.get("claude-code")).lines)
    user = next(m for m in items if m["role"] == "user" and m["content"][0].get("type") == "tool_result")
    assert [b["type"] for b in user["content"]] == ["tool_result"] * 3 + ["text"]


def test_claude_scan_and_show_check_agree_on_a_result_after_text(tmp_path, capsys):
    """A user entry [tool_result, text] and, chained after it, a user entry [tool_result]
    answering the same assistant message: Claude Code joins them into one user message
    whose text comes before a tool_result. Scan used to call the file clean while `show
    --check` rejected it; now scan finds it (exit 1), repair chains the results first,
    and both then pass, in every view."""
    def entry(n: int, parent: int | None, kind: str, content) -> str:
        uid = "00000000-0000-4000-8000-0000000000{:02d}".format
        message = {"role": kind, "content": content}
        if kind == "assistant":
            message = {"id": f"msg_{n}", "type": "message", **message, "model": "claude"}
        return json.dumps({"parentUuid": uid(parent) if parent else None, "isSidechain": False, "type": kind,
                           "message": message, "uuid": uid(n), "sessionId": "s",
                           "timestamp": f"2026-11-30T09:00:{n:02d}.000Z"}, separators=(",", ":")) + "\n"

    uses = [{"type": "tool_use", "id": c, "name": "Bash", "input": {"command": "ls"}} for c in ("toolu_A", "toolu_B")]
    path = tmp_path / "s.jsonl"
    path.write_text("".join([
        entry(1, None, "user", "go"), entry(2, 1, "assistant", uses),
        entry(3, 2, "user", [{"type": "tool_result", "tool_use_id": "toolu_A", "content": "a"},
                             {"type": "text", "text": "[Request interrupted by user for tool use]"}]),
        entry(4, 3, "user", [{"type": "tool_result", "tool_use_id": "toolu_B", "content": "b"}]),
        entry(5, 4, "assistant", [{"type": "text", "text": "done"}]),
    ]))
    code, text = run("scan", str(path), "--json")
    [row] = rows(text)
    assert (code, row["status"]) == (1, "repairable")
    [finding] = row["findings"]
    assert (finding["kind"], finding["line"], finding["call_id"]) == ("result-after-text", 4, "toolu_B")
    for view in ("anthropic", "openai", "responses"):
        assert run("show", str(path), "--format", view, "--check")[0] == 0  # the view repair leaves
    assert "as it is fails the anthropic pairing check" in capsys.readouterr().err
    assert run("repair", str(path))[0] == 0
    assert run("scan", str(path))[0] == 0
    for view in ("anthropic", "openai", "responses"):
        assert run("show", str(path), "--format", view, "--check")[0] == 0
    assert "fails" not in capsys.readouterr().err


REPEATED_ORDINALS = {
    # openai/codex #41566, #44609: a record after a token_count reuses its ordinal; the
    # lines after it go on from there.
    "a record reusing the ordinal before it": (
        lambda lines: lines[:15] + [b'{"timestamp":"2026-11-30T10:00:15.900Z","ordinal":14,"type":"event_msg",'
                                    b'"payload":{"type":"thread_settings_applied"}}\n'] + lines[15:],
        16, 14, 15, "a different record: event_msg thread_settings_applied, where line 15 holds event_msg token_count"),
    # openai/codex #41079: a run of lines written twice, calls and outputs included.
    "a run of calls and outputs written twice": (
        lambda lines: lines[:22] + lines[18:22] + lines[22:],
        23, 18, 19, "a byte-for-byte copy of that line"),
    # the calls written twice, their outputs once
    "calls written twice before their outputs": (
        lambda lines: lines[:20] + lines[18:20] + lines[20:],
        21, 18, 19, "a byte-for-byte copy of that line"),
}


@pytest.mark.parametrize("case", sorted(REPEATED_ORDINALS))
def test_a_codex_rollout_whose_ordinals_repeat_is_reported_and_never_rewritten(tmp_path, case, capsys):
    """Codex's writer can reuse an ordinal (after an unfinished turn), and its history
    projection then stops for good at that line ("expected ordinal N, got M"). Scan says
    so: the line, its offset, the ordinal and the line that had it first, and what the
    repeat is (exit 3, needs-force); repair refuses, --force included (renumbering would
    rewrite every line after it), and writes nothing; show gives the history with every
    call answered exactly once (a repeated call or output is not paired twice) and notes
    what it left out."""
    make, line, ordinal, first, what = REPEATED_ORDINALS[case]
    data = b"".join(make(ordinal_lines()))
    path = tmp_path / ROLLOUT
    path.write_bytes(data)
    offset = sum(map(len, data.splitlines(keepends=True)[: line - 1]))
    code, text = run("scan", str(path), "--json")
    [row] = rows(text)
    assert (code, row["status"]) == (3, "needs-force")
    found = next(f for f in row["findings"] if f["kind"] == "duplicate-ordinal")
    assert (found["line"], found["repairable"]) == (line, False)
    assert found["detail"].startswith(f"ordinal {ordinal} at offset {offset} repeats line {first}'s ")
    assert what in found["detail"] and "history projection stops reading here" in found["detail"]
    assert f"from line {line} (offset {offset}) on" in row["reason"]
    assert f"{ROLLOUT}:{line}: ordinal {ordinal} at offset {offset}" in run("scan", str(path))[1]
    for force in ([], ["--force"]):
        code, text = run("repair", str(path), "--json", *force)
        assert (code, rows(text)[0]["status"]) == (3, "refused")
    assert path.read_bytes() == data and [p.name for p in tmp_path.iterdir()] == [path.name]
    capsys.readouterr()
    code, shown = run("show", str(path), "--format", "responses", "--check")
    assert code == 0
    items = json.loads(shown)["input"]
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert sorted(calls) == sorted(outputs) and len(set(calls)) == len(calls)
    assert f"{path}:{line}: ordinal {ordinal}" in capsys.readouterr().err


def test_a_codex_call_id_reused_by_another_call_is_reported_and_its_output_quarantined(tmp_path, capsys):
    """A later call reusing a call_id with other arguments, and its own output: one call
    has one output, so repair keeps the first pair and moves the second call and its
    output to the quarantine file; scan and show say which line is which (a different
    call, a different output), the quarantine holds their bytes, and no output is
    paired with two calls."""
    with open(os.path.join(CODEX, "healthy.jsonl"), "rb") as f:
        data = f.read()

    def line(payload: dict) -> bytes:
        return json.dumps({"timestamp": "2026-11-30T10:01:00.000Z", "type": "response_item", "payload": payload},
                          separators=(",", ":")).encode() + b"\n"

    again = line({"type": "function_call", "name": "shell", "arguments": '{"command":["ruff","format"]}',
                  "call_id": "call_C3ruff"})
    output = line({"type": "function_call_output", "call_id": "call_C3ruff", "output": "2 files reformatted"})
    data += line({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "formate"}]})
    data += again + output
    path = tmp_path / ROLLOUT
    path.write_bytes(data)
    code, text = run("scan", str(path), "--json")
    found = {f["kind"]: f for f in rows(text)[0]["findings"]}
    assert code == 1
    assert found["duplicate-call"]["line"] == 26 and "reuses the call_id of another call (line 19" in \
        found["duplicate-call"]["detail"]
    assert found["duplicate-result"]["line"] == 27 and "different from its first" in found["duplicate-result"]["detail"]
    capsys.readouterr()
    code, shown = run("show", str(path), "--format", "responses", "--check")
    err = capsys.readouterr().err
    assert code == 0 and f"{path}:27: function_call_output" in err and "different from its first" in err
    assert [i["output"] for i in json.loads(shown)["input"] if i.get("call_id") == "call_C3ruff"
            and i["type"] == "function_call_output"] == ["All checks passed!"]
    code, text = run("repair", str(path), "--json")
    [row] = rows(text)
    assert code == 0 and row["changed_lines"] == [26, 27]
    with open(row["quarantine"], "rb") as f:
        assert f.read() == again + output


def test_claude_a_reused_tool_use_id_is_refused_by_repair_and_not_clean_to_scan(claude_dir):
    """A tool_use id used by two responses of the resumed conversation: scan used to call the
    file clean and repair changed nothing while show --check failed; now scan and repair
    both refuse it, naming the id, and nothing is written."""
    def entry(n, parent, kind, content, mid=None):
        message = {"role": kind, "content": content} | ({"id": mid, "type": "message"} if mid else {})
        return json.dumps({"parentUuid": f"u{parent}" if parent else None, "isSidechain": False, "type": kind,
                           "message": message, "uuid": f"u{n}", "sessionId": "s",
                           "timestamp": f"2026-11-30T09:00:0{n}.000Z"}).encode() + b"\n"
    use = [{"type": "tool_use", "id": "toolu_A", "name": "Bash", "input": {}}]
    result = [{"type": "tool_result", "tool_use_id": "toolu_A", "content": "ran"}]
    path = claude_dir / "reused.jsonl"
    path.write_bytes(b"".join([entry(1, None, "user", "go"), entry(2, 1, "assistant", use, "m1"),
                               entry(3, 2, "user", result), entry(4, 3, "assistant", use, "m2"),
                               entry(5, 4, "user", result), entry(6, 5, "assistant", [{"type": "text", "text": "ok"}], "m3")]))
    before = path.read_bytes()
    code, out = run("scan", str(path), "--json")
    assert code != 0 and rows(out)[0]["status"] != "clean"
    code, out = run("repair", str(path), "--json")
    assert code != 0 and rows(out)[0]["status"] == "refused" and "toolu_A" in rows(out)[0]["reason"]
    assert path.read_bytes() == before


@pytest.mark.parametrize("tool", ["claude-code", "codex"])
@pytest.mark.parametrize("view", ["openai", "anthropic", "responses"])
def test_show_json_of_a_foreign_file_is_one_item_per_line(tool, view):
    """cli.md: ``--json`` is one message or input item per line, for a foreign file as for a
    sessionlog log: the items of the document ``show`` prints without it, in order."""
    path = os.path.join(FIXTURES, tool, "dangling-call.jsonl")
    code, pretty = run("show", path, "--format", view)
    assert code == 0
    document = json.loads(pretty)
    code, text = run("show", path, "--format", view, "--json")
    assert code == 0
    items = [json.loads(line) for line in text.splitlines()]
    expected = ([{"system": document["system"]}] if "system" in document else []) + document.get(
        "messages", document.get("input"))
    assert items == expected and len(items) > 2


@pytest.mark.parametrize("command", ["scan", "repair"])
def test_input_format_on_a_directory_of_sessionlog_logs_says_what_to_do(tmp_path, capsys, command):
    """--input-format on a directory holding only sessionlog logs: nothing on standard
    output (no empty table), and the note tells to drop --input-format (it told to name
    the very directory named)."""
    shutil.copy(os.path.join(FIXTURES, "healthy.jsonl"), tmp_path / "healthy.jsonl")
    code, out = run(command, str(tmp_path), "--input-format", "claude-code")
    err = capsys.readouterr().err
    assert code == 0 and out == ""
    assert "no Claude Code transcripts or Codex rollouts" in err and "without --input-format" in err


def test_a_foreign_file_on_standard_input_is_named_as_standard_input(tmp_path):
    """scan - and show - of a Codex rollout name it "-" in the table, the rows and the
    notes, never the private spool file (deleted when the command ends)."""
    data = open(os.path.join(CODEX, "dangling-call.jsonl"), "rb").read()
    for args in (["scan", "-"], ["scan", "-", "--json"], ["show", "-", "--format", "responses"]):
        proc = subprocess.run([sys.executable, "-m", "sessionlog", *args], input=data, capture_output=True)
        assert proc.returncode in (0, 1), proc.stderr
        text = (proc.stdout + proc.stderr).decode()
        assert "stdin" not in text
        if args[-1] == "--json":
            row = json.loads(proc.stdout)
            assert row["file"] == row["path"] == "-"
        else:
            assert "-:19:" in text, text
