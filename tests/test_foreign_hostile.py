"""Hostile foreign files: any JSON value in any member of a Claude Code transcript or Codex
rollout (an id that is a list, a ``type`` that is an object, a ``content`` that is a
number). ``scan``, ``show`` (every view, ``--check``) and ``repair`` never raise and never
print a traceback; they exit with a documented code (docs/cli.md); ``scan`` and ``show``
never change a byte; a repair leaves a file a second scan calls clean and a second repair
leaves alone. A mistyped id names no call, like a missing one."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog import open_store
from sessionlog.cli import main
from sessionlog.projection import check_pairing, project

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
FOREIGN = sorted((fmt, name) for fmt in ("claude-code", "codex")
                 for name in os.listdir(os.path.join(FIXTURES, fmt)) if name.endswith(".jsonl"))
VIEWS = ("events", "openai", "anthropic", "responses")
EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    500 if os.environ.get("SESSIONLOG_SLOW") else 20
)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Exit codes per command (docs/cli.md, "Exit codes"); 2 (usage) never applies to one file.
SCAN_EXITS = {0, 1, 3, 4}
SHOW_EXITS = {0, 1, 4}
REPAIR_EXITS = {0, 3, 4, 5}
CONVERT_EXITS = {0, 1, 3, 4, 5}

# Words the formats give meaning to: a hostile value that is one of them (a "type" that
# becomes "tool_result", an id that becomes another call's id) reaches deeper code paths.
WORDS = ["user", "assistant", "system", "progress", "tool_use", "tool_result", "text", "message",
         "response_item", "event_msg", "compacted", "function_call", "function_call_output",
         "custom_tool_call", "local_shell_call", "toolu_05Edit", "toolu_01Bash", "call_D4mypy", ""]
# Members the formats read (half the replacements hit one of them, the others any member).
MEMBERS = {"type", "subtype", "id", "uuid", "parentUuid", "tool_use_id", "call_id", "toolUseID", "parentToolUseID",
           "message", "role", "content", "name", "input", "arguments", "output", "timestamp", "payload",
           "replacement_history", "ordinal", "isSidechain", "isMeta", "sessionId", "data", "hookEvent"}
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=6) | st.sampled_from(WORDS))
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) | st.sampled_from(
        ["type", "id", "tool_use_id", "call_id", "content", "role", "name", "uuid"]), inner, max_size=3),
    max_leaves=6)


def load(fmt: str, name: str) -> bytes:
    with open(os.path.join(FIXTURES, fmt, name), "rb") as f:
        return f.read()


def key_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path to every member of ``value``, at any depth (list positions included)."""
    if isinstance(value, dict):
        for key, member in value.items():
            yield prefix + (key,)
            yield from key_paths(member, prefix + (key,))
    elif isinstance(value, list):
        for i, member in enumerate(value):
            yield from key_paths(member, prefix + (i,))


def replaced(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``obj`` with the member at ``path`` set to ``value``."""
    obj = json.loads(json.dumps(obj))
    at = obj
    for step in path[:-1]:
        at = at[step]
    at[path[-1]] = value
    return obj


def encode(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def split(data: bytes) -> list[bytes]:
    return data.split(b"\n")


@st.composite
def hostile_files(draw: st.DrawFn) -> tuple[str, str, bytes]:
    """A foreign fixture with one to three members (any key at any depth of any line)
    holding an arbitrary JSON value instead."""
    fmt, name = draw(st.sampled_from(FOREIGN))
    lines = split(load(fmt, name))
    for _ in range(draw(st.integers(1, 3))):
        decodable = []
        for i, raw in enumerate(lines):
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            decodable.extend((i, path) for path in key_paths(obj))
        named = [(i, path) for i, path in decodable if path[-1] in MEMBERS]
        i, path = draw(st.sampled_from(named if named and draw(st.booleans()) else decodable))
        lines[i] = encode(replaced(json.loads(lines[i]), path, draw(JSON_VALUES)))
    return fmt, name, b"\n".join(lines)


def run(*args: str) -> tuple[int, str]:
    """The command in-process; its exit code and standard output. Standard error must
    hold no traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(args), out)
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return code, out.getvalue()


def one_row(text: str) -> dict[str, Any]:
    [row] = [json.loads(line) for line in text.splitlines() if line.strip()]
    return row


def listing(directory: str) -> dict[str, bytes]:
    found = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            found[name] = f.read()
    return found


def check_commands(fmt: str, data: bytes) -> None:
    """Every command on ``data`` read as ``fmt``: documented exits, no traceback, nothing
    written by scan and show, and a repair that leaves a clean file."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "session.jsonl")
        with open(path, "wb") as f:
            f.write(data)

        # scan and show: exit codes, and not a byte written anywhere.
        code, out = run("scan", path, "--input-format", fmt, "--json")
        assert code in SCAN_EXITS
        scanned = one_row(out)
        code_by_content, _ = run("scan", path, "--json")  # recognized by content, or not at all
        assert code_by_content in SCAN_EXITS
        for view in VIEWS:
            code, _ = run("show", path, "--input-format", fmt, "--format", view, "--check")
            assert code in SHOW_EXITS, view
        code, _ = run("show", path, "--input-format", fmt, "--json")
        assert code in SHOW_EXITS
        with tempfile.TemporaryDirectory() as elsewhere:  # convert imports the file, never writing it
            code, _ = run("convert", path, "jsonl:" + os.path.join(elsewhere, "dst"))
            assert code in CONVERT_EXITS
            dst = "jsonl:" + os.path.join(elsewhere, "repaired")
            code, out = run("convert", path, dst, "--input-format", fmt, "--repaired", "--force", "--json")
            imported = one_row(out)
            assert code in (0, 4), imported  # 4: an entry that cannot be a record, or nothing decodes
            if code == 0:
                with open_store(dst) as store:
                    result = store.scan(imported["session"])
                    assert result.damage is None and result.record_count == imported["records"]
                    records = list(store.read(imported["session"]))
                native = "anthropic" if fmt == "claude-code" else "responses"
                assert check_pairing(project(records, native).items, native) is None
            else:
                assert not os.path.exists(os.path.join(elsewhere, "repaired"))
        assert listing(directory) == {"session.jsonl": data}

        # repair: a documented exit; then a second scan calls the file clean and a second
        # repair changes nothing.
        code, out = run("repair", path, "--input-format", fmt, "--json")
        assert code in REPAIR_EXITS
        repaired = one_row(out)
        if code == 3:  # needs --force: left as it was
            assert scanned["status"] == "needs-force"
            assert listing(directory) == {"session.jsonl": data}
            code, out = run("repair", path, "--input-format", fmt, "--force", "--json")
            repaired = one_row(out)
        if code == 3:  # refused, --force included: a rollout Codex keeps byte offsets into
            assert "`ordinal`s" in repaired["reason"] and "--force included" in repaired["reason"], repaired
            assert listing(directory) == {"session.jsonl": data}
            return
        if code == 4:  # refused: only a file with no decodable line, and nothing written
            assert scanned["status"] == "error", repaired
            assert listing(directory) == {"session.jsonl": data}
            return
        assert code == 0, repaired
        assert repaired["status"] == ("clean" if scanned["status"] == "clean" else "repaired"), repaired
        with open(path, "rb") as f:
            after = f.read()
        code, out = run("scan", path, "--input-format", fmt, "--json")
        assert (code, one_row(out)["status"]) == (0, "clean"), one_row(out)
        before = listing(directory)
        code, out = run("repair", path, "--input-format", fmt, "--json")
        assert (code, one_row(out)["status"]) == (0, "clean")
        assert listing(directory) == before
        with open(path, "rb") as f:
            assert f.read() == after


@SETTINGS
@given(hostile_files())
def test_property_any_json_value_in_any_member_never_crashes_a_command(case):
    fmt, _, data = case
    check_commands(fmt, data)


# --- the cases that crashed, as plain tests ----------------------------------------------

HOSTILE_IDS = [["x"], {"a": 1}, 7]  # a list, an object, a number; the property test tries the rest


def every_member(obj: Any, key: str, value: Any) -> Any:
    """A copy of ``obj`` with every member called ``key``, at any depth, set to ``value``."""
    for path in reversed([p for p in key_paths(obj) if p[-1] == key]):  # inner ones first
        obj = replaced(obj, path, value)
    return obj


def every(data: bytes, key: str, value: Any) -> bytes:
    """``data`` with every member called ``key``, at any depth of any line, set to ``value``."""
    out = []
    for raw in split(data):
        try:
            obj = json.loads(raw)
        except ValueError:
            out.append(raw)
            continue
        out.append(encode(every_member(obj, key, value)))
    return b"\n".join(out)


@pytest.mark.parametrize("value", HOSTILE_IDS, ids=json.dumps)
@pytest.mark.parametrize("fmt,name,key", [
    ("claude-code", "healthy.jsonl", "tool_use_id"),
    ("claude-code", "interrupted-parallel.jsonl", "tool_use_id"),
    ("claude-code", "healthy.jsonl", "id"),
    ("claude-code", "healthy.jsonl", "type"),
    ("claude-code", "healthy.jsonl", "uuid"),
    ("claude-code", "healthy.jsonl", "parentUuid"),
    ("claude-code", "dangling-call.jsonl", "content"),
    ("codex", "healthy.jsonl", "call_id"),
    ("codex", "dangling-call.jsonl", "call_id"),
    ("codex", "healthy.jsonl", "type"),
    ("codex", "orphan-output.jsonl", "payload"),
    ("codex", "healthy.jsonl", "role"),
])
def test_a_mistyped_member_everywhere_never_crashes_a_command(fmt, name, key, value):
    check_commands(fmt, every(load(fmt, name), key, value))


@pytest.mark.parametrize("value", [["x"], {"a": 1}, 7], ids=json.dumps)
def test_claude_result_with_a_mistyped_tool_use_id_names_no_call(tmp_path, value):
    # Every tool_result's tool_use_id mistyped: each answers nothing (an orphan, kept as
    # text by repair), and every tool_use is left unanswered (repair answers it).
    data = every(load("claude-code", "healthy.jsonl"), "tool_use_id", value)
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    code, out = run("scan", str(path), "--input-format", "claude-code", "--json")
    row = one_row(out)
    assert code == 1 and row["status"] == "repairable"
    assert row["orphan_results"] and set(row["orphan_results"]) == {""}
    assert "toolu_05Edit" in row["unanswered_calls"]
    assert {f["kind"] for f in row["findings"]} == {"orphan-result", "unanswered-call"}
    code, _ = run("show", str(path), "--input-format", "claude-code", "--format", "anthropic", "--check")
    assert code == 0  # the repaired view pairs
    code, out = run("repair", str(path), "--input-format", "claude-code", "--json")
    assert code == 0 and one_row(out)["status"] == "repaired"
    texts = [b["text"] for line in path.read_bytes().splitlines() for b in
             (json.loads(line).get("message") or {}).get("content") or [] if isinstance(b, dict) and b.get("type") == "text"]
    assert any(f"tool result for call {json.dumps(value)}," in t for t in texts)  # kept as text, naming its id
    code, out = run("scan", str(path), "--input-format", "claude-code", "--json")
    assert code == 0 and one_row(out)["status"] == "clean"


def codex_with_call_id(tmp_path: Path, pick: Callable[[bytes], bool], value: Any) -> tuple[Path, list[bytes], int]:
    """The healthy Codex fixture with the ``call_id`` of the first line ``pick`` chooses
    set to ``value``, written to a file: (its path, its lines, that line's index)."""
    lines = split(load("codex", "healthy.jsonl"))
    at = next(i for i, raw in enumerate(lines) if pick(raw))
    obj = json.loads(lines[at])
    obj["payload"]["call_id"] = value
    lines[at] = encode(obj)
    path = tmp_path / "rollout.jsonl"
    path.write_bytes(b"\n".join(lines))
    return path, lines, at


@pytest.mark.parametrize("value", [["x"], {"a": 1}, 7], ids=json.dumps)
def test_codex_output_with_a_mistyped_call_id_is_an_orphan(tmp_path, value):
    # The output of call_D4mypy gets a mistyped call_id: it answers nothing (quarantined by
    # repair, as Codex drops it), and call_D4mypy is then unanswered (repair answers it).
    path, lines, at = codex_with_call_id(tmp_path, lambda raw: b'"function_call_output","call_id":"call_D4mypy"' in raw,
                                         value)
    code, out = run("scan", str(path), "--input-format", "codex", "--json")
    row = one_row(out)
    assert code == 1 and row["unanswered_calls"] == ["call_D4mypy"] and row["orphan_results"] == [""]
    assert [f["line"] for f in row["findings"] if f["kind"] == "orphan-result"] == [at + 1]
    for view in VIEWS:
        code, _ = run("show", str(path), "--input-format", "codex", "--format", view, "--check")
        assert code == 0
    code, out = run("repair", str(path), "--input-format", "codex", "--json")
    rep = one_row(out)
    assert code == 0 and rep["status"] == "repaired"
    with open(rep["quarantine"], "rb") as q:
        assert q.read() == lines[at] + b"\n"
    code, out = run("scan", str(path), "--input-format", "codex", "--json")
    assert code == 0 and one_row(out)["status"] == "clean"


@pytest.mark.parametrize("value", [["x"], {"a": 1}, 7], ids=json.dumps)
def test_codex_call_with_a_mistyped_call_id_names_no_call(tmp_path, value):
    # A call whose call_id is mistyped is not a call (as one without a call_id): its output
    # then answers nothing and is an orphan.
    path, _, _ = codex_with_call_id(tmp_path, lambda raw: b'"function_call","name"' in raw and b"call_D4mypy" in raw,
                                    value)
    code, out = run("scan", str(path), "--input-format", "codex", "--json")
    row = one_row(out)
    assert code == 1 and row["orphan_results"] == ["call_D4mypy"] and row["unanswered_calls"] == []
    code, out = run("show", str(path), "--input-format", "codex", "--format", "responses", "--check")
    assert code == 0 and "call_D4mypy" not in out


def test_type_that_is_a_list_is_an_unknown_entry(tmp_path):
    # Content detection and the entry tree hashed "type": a list there raised TypeError.
    lines = split(load("claude-code", "healthy.jsonl"))
    obj = json.loads(lines[2])
    obj["type"] = ["user"]
    lines[2] = encode(obj)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines))
    for fmt in ("claude-code", None):
        code, out = run("scan", str(path), "--json", *(("--input-format", fmt) if fmt else ()))
        assert code in SCAN_EXITS


def test_claude_session_record_with_a_mistyped_pid_is_not_a_live_process(tmp_path):
    # ~/.claude/sessions/<pid>.json is the tool's file too: a pid that is not a positive
    # int names no process (a huge one raised OverflowError, True was taken for pid 1).
    project = tmp_path / ".claude" / "projects" / "p"
    project.mkdir(parents=True)
    shutil.copy(os.path.join(FIXTURES, "claude-code", "dangling-call.jsonl"), project / "s1.jsonl")
    sessions = tmp_path / ".claude" / "sessions"
    sessions.mkdir()
    for n, pid in enumerate([10**30, True, -1, 0, "1", [1], None]):
        (sessions / f"{n}.json").write_text(json.dumps({"pid": pid, "sessionId": "s1"}))
    code, out = run("scan", str(project / "s1.jsonl"), "--json")
    row = one_row(out)
    assert code == 1 and row["status"] == "repairable" and row["in_use"] == []
    code, out = run("repair", str(project / "s1.jsonl"), "--json")
    assert code == 0 and one_row(out)["status"] == "repaired"


# --- sessionlog's own logs: the same mistyped ids --------------------------------------


@pytest.mark.parametrize("value", HOSTILE_IDS, ids=json.dumps)
@pytest.mark.parametrize("name,key", [("healthy.jsonl", "call_id"), ("healthy.jsonl", "id"),
                                      ("dangling-parallel.jsonl", "call_id"), ("dangling-parallel.jsonl", "id")])
def test_native_log_with_mistyped_call_ids_never_crashes_a_command(tmp_path, name, key, value):
    # Every record's call_id, or every tool call's id, mistyped: scan, show (each view,
    # --check), convert and repair exit with documented codes, and repair leaves a log a
    # second scan calls clean.
    with open(os.path.join(FIXTURES, name), "rb") as f:
        data = f.read()
    path = tmp_path / name
    path.write_bytes(every(data, key, value))
    before = path.read_bytes()
    code, _ = run("scan", str(path), "--json")
    assert code in {0, 1}
    for view in VIEWS:
        code, _ = run("show", str(path), "--format", view, "--check")
        assert code == 0, view  # the view pairs: a mistyped id names no call
    code, _ = run("convert", str(path), f"jsonl:{tmp_path / 'dst'}", "--repaired")
    assert code == 0
    assert path.read_bytes() == before
    code, out_ = run("repair", str(path), "--json")
    assert code == 0 and one_row(out_)["status"] in ("clean", "repaired")
    code, out_ = run("scan", str(path), "--json")
    assert code == 0 and one_row(out_)["status"] == "clean"
