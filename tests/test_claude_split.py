"""Claude Code responses split across entries (sharing ``message.id``) with what lies
between them: scan, ``show --check`` and repair agree, and repair leaves a file they all
call clean (found by fuzzing transcripts against the three)."""

from __future__ import annotations

import glob
import json
import os

from cli_runs import run, scan

BASE = {"isSidechain": False, "userType": "external", "cwd": "/p", "sessionId": "s1", "version": "2.1.119"}
VIEWS = ("anthropic", "openai", "responses")


def entry(uuid: str, parent: str | None, kind: str, content, mid: str | None = None) -> dict:
    message = {"role": kind, "content": content}
    if mid is not None:
        message = {"id": mid, "type": "message", "role": "assistant", "model": "m", "content": content,
                   "stop_reason": None}
    return {"parentUuid": parent, **BASE, "type": kind, "message": message, "uuid": uuid,
            "timestamp": "2026-11-30T09:00:00.000Z"}


def use(cid: str) -> dict:
    return {"type": "tool_use", "id": cid, "name": "Bash", "input": {"command": "ls"}}


def result(cid: str) -> dict:
    return {"tool_use_id": cid, "type": "tool_result", "content": "ok"}


def write(tmp_path, entries: list[dict], name: str = "s1.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in entries))
    return path


def checks(path) -> list[int]:
    return [run("show", str(path), "--format", view, "--check")[0] for view in VIEWS]


def results_of(data: bytes) -> list[str]:
    """The tool_use_id of every tool_result block of the file, in order."""
    found = []
    for line in data.splitlines():
        message = json.loads(line).get("message") or {}
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_result":
                found.append(block["tool_use_id"])
    return found


def assert_repairs_clean(path) -> bytes:
    """repair exits 0 and keeps the original beside the file; scan then calls the file
    clean, every view checks, a second repair changes no byte. The repaired bytes."""
    before = path.read_bytes()
    code, _ = scan(path)
    assert code == 1
    code, out = run("repair", str(path), "--json")
    row = json.loads(out)
    assert code == 0 and row["status"] == "repaired", row
    assert open(row["backup"], "rb").read() == before
    code, row = scan(path)
    assert code == 0 and row["status"] == "clean" and row["findings"] == [], row
    assert checks(path) == [0, 0, 0]
    after = path.read_bytes()
    assert run("repair", str(path), "--json")[0] == 0
    assert path.read_bytes() == after
    return after


def test_orphan_between_entries_of_one_response(tmp_path):
    """assistant(msg_1, A) -> user[tool_result for a call that is not there] ->
    assistant(msg_1, B): repair answered A and B below B, after the orphan's text (a
    tool_result after text: the API rejects it) and could neither move the answer up (it
    would lose B) nor the text down: it exited 4. The response's entries are chained
    first, the results below them."""
    path = write(tmp_path, [
        entry("u1", None, "user", "go"),
        entry("a1", "u1", "assistant", [use("toolu_A")], "msg_1"),
        entry("r1", "a1", "user", [result("toolu_gone")]),
        entry("a2", "r1", "assistant", [use("toolu_B")], "msg_1"),
    ])
    original = path.read_bytes().splitlines(keepends=True)
    after = assert_repairs_clean(path)
    lines = after.splitlines(keepends=True)
    assert lines[:2] == original[:2]  # the user's prompt and the first entry keep their bytes
    assert results_of(after) == ["toolu_A", "toolu_B"]  # each call answered once, the orphan kept as text
    assert b"toolu_gone" in lines[2]
    assert [json.loads(line)["uuid"] for line in lines[:4]] == ["u1", "a1", "r1", "a2"]  # nothing moved


def test_result_and_orphan_between_entries_of_one_response(tmp_path):
    """The same with a call's own result written between the entries too (as streaming
    tool use writes it) and the conversation going on after the response."""
    path = write(tmp_path, [
        entry("u1", None, "user", "go"),
        entry("a1", "u1", "assistant", [use("toolu_A")], "msg_1"),
        entry("r1", "a1", "user", [result("toolu_A")]),
        entry("a2", "r1", "assistant", [use("toolu_B")], "msg_1"),
        entry("r2", "a2", "user", [result("toolu_gone")]),
        entry("a3", "r2", "assistant", [use("toolu_C")], "msg_1"),
    ])
    after = assert_repairs_clean(path)
    assert sorted(results_of(after)) == ["toolu_A", "toolu_B", "toolu_C"]
    answered = [json.loads(line) for line in after.splitlines() if b"sessionlogRecovery" in line]
    assert [r["tool_use_id"] for a in answered for r in a["sessionlogRecovery"]] == ["toolu_B", "toolu_C"]


def test_same_call_id_twice_in_one_response(tmp_path, capsys):
    """Two entries of one response both carrying toolu_A: the assistant message names the
    call twice, which the API rejects. scan called it clean while show --check failed
    and said repair fixes it; now scan reports reused-call-id (not repairable), repair
    refuses, --force included, and show says so."""
    path = write(tmp_path, [
        entry("u1", None, "user", "go"),
        entry("a1", "u1", "assistant", [use("toolu_A")], "msg_1"),
        entry("a2", "a1", "assistant", [use("toolu_A")], "msg_1"),
        entry("r1", "a2", "user", [result("toolu_A")]),
        entry("a3", "r1", "assistant", [{"type": "text", "text": "done"}], "msg_2"),
    ])
    before = path.read_bytes()
    code, row = scan(path)
    assert code == 3 and row["status"] == "needs-force"
    assert [(f["kind"], f["line"], f.get("repairable")) for f in row["findings"]] == [("reused-call-id", 3, False)]
    assert "same response" in row["reason"]
    for force in ((), ("--force",)):
        code, out = run("repair", str(path), "--json", *force)
        assert code == 3 and json.loads(out)["status"] == "refused"
    assert path.read_bytes() == before
    assert glob.glob(str(path) + ".*") == []
    capsys.readouterr()
    assert checks(path) == [1, 1, 1]
    err = capsys.readouterr().err
    assert "refuses to change it" in err and "`sessionlog repair` fixes it" not in err


def test_line_repeated_with_its_uuid_is_repaired_like_its_first_copy(tmp_path):
    """A results line written twice, byte for byte (same uuid), repeating an answer: repair
    kept only the first copy's result as text, leaving the second (the same entry to the
    tool) a second answer to the call."""
    r1 = entry("r1", "r0", "user", [result("toolu_A")])
    path = write(tmp_path, [
        entry("u1", None, "user", "go"),
        entry("a1", "u1", "assistant", [use("toolu_A")], "msg_1"),
        entry("r0", "a1", "user", [result("toolu_A")]),
        r1,
        r1,
    ])
    original = path.read_bytes().splitlines(keepends=True)
    after = assert_repairs_clean(path)
    lines = after.splitlines(keepends=True)
    assert lines[:3] == original[:3]
    assert lines[3] == lines[4] != original[3]
    assert results_of(after) == ["toolu_A"]


def test_same_call_id_twice_in_one_entry(tmp_path):
    """One entry naming a call twice, unanswered: repair answered it once and then found
    the file still failing (exit 4); it is the same repeated id, refused, nothing written
    beside the file."""
    path = write(tmp_path, [
        entry("u1", None, "user", "go"),
        entry("a1", "u1", "assistant", [use("toolu_A"), use("toolu_A")], "msg_1"),
    ])
    code, row = scan(path)
    assert code == 3 and [f["kind"] for f in row["findings"]] == ["unanswered-call", "reused-call-id"]
    assert run("repair", str(path))[0] == 3
    assert sorted(os.listdir(tmp_path)) == ["s1.jsonl"]
