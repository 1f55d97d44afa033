"""Codex rollouts whose ``compacted`` line's replacement history holds tool calls: Codex
resumes that history as it is written, so a call in it is answered, and an output in it
placed, inside it (right after the call's response, before the message that follows it
there). scan, repair and ``show --check`` agree: after a repair the file scans clean, every
view passes its check, and a second repair changes no byte."""

from __future__ import annotations

import json
import os

import pytest

from cli_runs import run, scan

VIEWS = ("anthropic", "openai", "responses")
META = {"timestamp": "2026-11-30T10:00:00.000Z", "type": "session_meta",
        "payload": {"id": "019a2d7a-41c4-78b1-b7cc-a45d62a89cd5", "timestamp": "2026-11-30T10:00:00.000Z",
                    "cwd": "/p", "originator": "codex_cli_rs", "cli_version": "0.64.0"}}
USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "résumé"}]}
CALL = {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}", "call_id": "call_1"}
REPLY = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "résumé"}]}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}


def line(obj: dict, ordinal: int | None = None) -> bytes:
    if ordinal is not None:
        obj = {**obj, "ordinal": ordinal}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def compacted(history: list[dict]) -> dict:
    return {"timestamp": "2026-11-30T10:00:01.000Z", "type": "compacted",
            "payload": {"message": "", "replacement_history": history}}


def live(item: dict, second: int) -> dict:
    return {"timestamp": f"2026-11-30T10:00:{second:02d}.000Z", "type": "response_item", "payload": item}


def show_checks(path) -> dict[str, int]:
    return {view: run("show", str(path), "--format", view, "--check")[0] for view in VIEWS}


def listing(directory) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def history_of(raw: bytes) -> list[dict]:
    return json.loads(raw)["payload"]["replacement_history"]


def repair_holds_its_promise(path, data: bytes, capsys) -> dict:
    """Repair the file: it was repairable; afterwards it scans clean, every view passes
    ``show --check``, the original is kept beside it, and a second repair changes no byte.
    The repair row."""
    code, row = scan(path)
    assert (code, row["status"]) == (1, "repairable"), row
    assert show_checks(path) == dict.fromkeys(VIEWS, 0)
    assert "`sessionlog repair` fixes it" in capsys.readouterr().err
    code, out = run("repair", str(path), "--json")
    [repaired] = [json.loads(r) for r in out.splitlines() if r.strip()]
    assert (code, repaired["status"]) == (0, "repaired"), repaired
    origs = [n for n in os.listdir(path.parent) if n.endswith(".orig")]
    assert len(origs) == 1 and (path.parent / origs[0]).read_bytes() == data
    code, row = scan(path)
    assert (code, row["status"], row["findings"]) == (0, "clean", []), row
    assert show_checks(path) == dict.fromkeys(VIEWS, 0)
    before = listing(path.parent)
    code, out = run("repair", str(path), "--json")
    assert code == 0 and json.loads(out)["status"] == "clean"
    assert listing(path.parent) == before
    return repaired


@pytest.mark.parametrize("evidence", [False, True])
def test_a_call_of_the_history_without_output_is_answered_inside_the_history(tmp_path, evidence, capsys):
    """A1: a call in the history with a message after it there and no output: the answer goes
    into the history right after the call (before the message); appending it after the
    compacted line left the message between the call and its answer, which every view rejects.
    The code is TOOL_OUTCOME_UNKNOWN when an event names the call, else TOOL_NOT_STARTED."""
    lines = [line(META), line(compacted([USER, CALL, REPLY]))]
    if evidence:
        lines.append(line({"timestamp": "2026-11-30T10:00:02.000Z", "type": "event_msg",
                           "payload": {"type": "exec_command_begin", "call_id": "call_1", "command": ["ls"]}}))
    lines.append(line(live(USER, 3)))
    data = b"".join(lines)
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(data)
    code, row = scan(path)
    [finding] = row["findings"]
    assert (finding["kind"], finding["line"], finding["call_id"]) == ("unanswered-call", 2, "call_1")
    want = "TOOL_OUTCOME_UNKNOWN" if evidence else "TOOL_NOT_STARTED"
    assert finding["code"] == want
    repaired = repair_holds_its_promise(path, data, capsys)
    assert [(a["call_id"], a["code"]) for a in repaired["appended"]] == [("call_1", want)]
    after = path.read_bytes().splitlines(keepends=True)
    assert len(after) == len(lines)
    assert [after[i] for i in range(len(lines)) if i != 1] == [lines[i] for i in range(len(lines)) if i != 1]
    history = history_of(after[1])
    assert history[:2] == [USER, CALL] and history[3:] == [REPLY]
    answer = history[2]
    assert (answer["type"], answer["call_id"]) == ("function_call_output", "call_1")
    assert answer["output"].startswith(want + ":")
    # Only the history changed: the line's other members are as they were, in order.
    was, now = json.loads(lines[1]), json.loads(after[1])
    assert list(was) == list(now) and {**was, "payload": None} == {**now, "payload": None}


def test_an_output_of_the_history_after_a_message_moves_before_it(tmp_path, capsys):
    """A2: the history holds the output after a message that follows its call there: scan
    reports it (``misplaced-output``) and repair moves the item, unchanged, before that
    message in the history; scan called the file clean and repair left it failing."""
    lines = [line(META), line(compacted([USER, CALL, REPLY, OUTPUT])), line(live(USER, 3))]
    data = b"".join(lines)
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(data)
    code, row = scan(path)
    [finding] = row["findings"]
    assert (finding["kind"], finding["line"], finding["call_id"]) == ("misplaced-output", 2, "call_1")
    repaired = repair_holds_its_promise(path, data, capsys)
    assert repaired["appended"] == [] and repaired["changed_lines"] == [2]
    after = path.read_bytes().splitlines(keepends=True)
    assert history_of(after[1]) == [USER, CALL, OUTPUT, REPLY]
    assert [after[0], after[2]] == [lines[0], lines[2]]


def test_an_output_line_answering_a_call_of_the_history_moves_into_it(tmp_path, capsys):
    """An output line after the compacted line whose call the history holds with a message
    after it there: the message comes between the call and the output in every view, so the
    output goes into the history before that message; the line goes to the quarantine file."""
    lines = [line(META), line(compacted([USER, CALL, REPLY])), line(live(OUTPUT, 2)), line(live(USER, 3))]
    data = b"".join(lines)
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(data)
    code, row = scan(path)
    [finding] = row["findings"]
    assert (finding["kind"], finding["line"], finding["call_id"]) == ("misplaced-output", 3, "call_1")
    repaired = repair_holds_its_promise(path, data, capsys)
    assert repaired["appended"] == [] and repaired["changed_lines"] == [2, 3]
    after = path.read_bytes().splitlines(keepends=True)
    assert [after[0], after[2]] == [lines[0], lines[3]] and len(after) == 3
    assert history_of(after[1]) == [USER, CALL, OUTPUT, REPLY]
    [quarantine] = [n for n in os.listdir(tmp_path) if n.endswith(".quarantine")]
    assert (tmp_path / quarantine).read_bytes() == lines[2]


def test_with_ordinals_the_history_is_not_rewritten_and_scan_says_so(tmp_path, capsys):
    """A rollout whose lines carry ordinals is one Codex keeps byte offsets into: the answer
    belongs inside the compacted line, which repair does not rewrite there. scan promised a
    repair (an answer appended after the compacted line, which left the view failing); now
    scan calls it needs-force with the reason, repair refuses it (exit 3, nothing written,
    --force included), and show gives the repaired view, passing its checks, saying repair
    refuses to change the file."""
    data = line(META, 0) + line(compacted([USER, CALL, REPLY]), 1)
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(data)
    code, row = scan(path)
    assert (code, row["status"]) == (3, "needs-force"), row
    assert "from line 2" in row["reason"] and "in the compacted history" in row["reason"]
    [finding] = row["findings"]
    assert (finding["kind"], finding["line"]) == ("unanswered-call", 2)
    capsys.readouterr()
    assert show_checks(path) == dict.fromkeys(VIEWS, 0)
    assert "`sessionlog repair` refuses to change it" in capsys.readouterr().err
    for force in ((), ("--force",)):
        code, out = run("repair", str(path), "--json", *force)
        assert (code, json.loads(out)["status"]) == (3, "refused")
        assert listing(tmp_path) == {"rollout.jsonl": data}
