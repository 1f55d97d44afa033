"""The `sessionlog` command: exit codes, JSON lines, no write unless asked."""

from __future__ import annotations

import io
import json
import os
import re
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


def test_nonexistent_targets_exit_4_however_spelled(tmp_path, capsys):
    missing = tmp_path / "missing"
    for spelling in (str(missing), f"jsonl:{missing}", f"zstd:{missing}", f"sqlite:///{missing}.db",
                     str(missing / "s.jsonl"), "nosuch://x"):
        for command in ("scan", "repair", "show", "compact"):
            code, out = run(command, spelling)
            err = capsys.readouterr().err
            assert code == 4, (command, spelling)
            assert out == "" and "no such" in err and "Traceback" not in err, (command, spelling, err)
        code, out = run("convert", spelling, f"jsonl:{tmp_path / 'dst'}")
        assert code == 4 and out == "" and "no such" in capsys.readouterr().err
    assert not missing.exists() and not (tmp_path / "missing.db").exists()  # nothing created
    store = sessionlog.open_store(f"jsonl:{tmp_path / 'st'}")
    store.create("a")
    code, out = run("scan", str(tmp_path / "st"), "--session", "nope", "--json")
    assert code == 4 and "no session 'nope'" in capsys.readouterr().err


def test_usage_errors_exit_2(tmp_path, capsys):
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("a")
    store.create("b")
    assert run("frobnicate")[0] == 2
    assert run("scan")[0] == 2  # no TARGET
    assert run("scan", "jsonl:")[0] == 2  # a malformed URL
    capsys.readouterr()
    for command in ("scan", "repair", "show", "compact"):  # a host where the file goes: not an empty in-memory store
        assert run(command, "sqlite://x.db")[0] == 2, command
        assert "sqlite:///x.db" in capsys.readouterr().err
    assert run("convert", f"jsonl:{tmp_path}", "sqlite://x.db")[0] == 2
    assert "sqlite:///x.db" in capsys.readouterr().err and not os.path.exists("x.db")
    assert run("scan", str(tmp_path / "a.jsonl"), "--session", "b")[0] == 4  # names nothing, not usage
    assert run("show", str(tmp_path))[0] == 2  # two sessions
    assert run("show", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))[0] == 2
    assert run("repair", "-")[0] == 2  # standard input is for scan and show
    capsys.readouterr()
    assert run("scan", str(tmp_path), "--bogus")[0] == 2  # the command's usage names the option
    err = capsys.readouterr().err
    assert "usage: sessionlog scan" in err and "sessionlog scan: error: unrecognized arguments: --bogus" in err
    (tmp_path / "x.txt").write_text("hi")
    code, out = run("scan", str(tmp_path / "x.txt"), "--json")
    assert code == 4 and json_lines(out)[0]["status"] == "error"  # a file is judged by its content


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
    assert r.returncode == 4 and "Traceback" not in r.stderr and r.stdout == ""


def test_io_error_is_exit_4_without_traceback(tmp_path):
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("good")
    os.mkdir(tmp_path / "s1.jsonl")  # reading it fails with EISDIR
    code, out = run("scan", str(tmp_path), "--json")
    rows = {r["session"]: r for r in json_lines(out)}
    assert code == 4
    assert rows["s1"]["status"] == "error" and "s1.jsonl" in rows["s1"]["error"]
    assert rows["good"]["status"] == "clean"


# --- targets: files by their header, several targets, standard input -------------------


def test_a_renamed_log_is_the_session_its_header_names(tmp_path, capsys):
    copy = tmp_path / "copy"
    copy.mkdir()
    original = open(os.path.join(FIXTURES, "torn.jsonl"), "rb").read()
    (copy / "backup-of-yesterday.log").write_bytes(original)
    target = str(copy / "backup-of-yesterday.log")
    code, out = run("scan", target, "--json")
    [row] = json_lines(out)
    assert code == 1 and row["session"] == "torn" and row["status"] == "repairable"
    assert row["damage"]["kind"] == "torn" and row["path"] == target
    assert "inspected as session 'torn'" in capsys.readouterr().err
    assert run("scan", target, "--session", "torn", "--json")[0] == 1
    assert run("scan", target, "--session", "backup-of-yesterday")[0] == 4  # the file holds no such session
    assert os.listdir(copy) == ["backup-of-yesterday.log"]  # scan wrote nothing
    code, out = run("repair", target, "--json")
    [rep] = json_lines(out)
    assert code == 0 and rep["status"] == "repaired"
    assert os.path.dirname(rep["quarantine"]) == str(copy)
    assert os.path.basename(rep["quarantine"]).startswith("backup-of-yesterday.log.2612.torn.")
    repaired = (copy / "backup-of-yesterday.log").read_bytes()
    assert repaired.startswith(original[:2612]) and open(rep["quarantine"], "rb").read() == original[2612:]
    code, out = run("scan", target, "--json")
    assert code == 0 and json_lines(out)[0]["status"] == "clean"
    code, out = run("show", target, "--format", "openai", "--check")
    assert code == 0 and json.loads(out)["messages"]


def test_a_renamed_zstd_log_is_told_by_its_content(tmp_path):
    store = sessionlog.open_store(f"zstd:{tmp_path / 'z'}")
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    shutil.copy(tmp_path / "z" / "s1.jsonl.zst", tmp_path / "copied.bin")
    code, out = run("scan", str(tmp_path / "copied.bin"), "--json")
    [row] = json_lines(out)
    assert code == 1 and row["session"] == "s1" and row["status"] == "repairable"  # turn t1 open
    code, out = run("show", str(tmp_path / "copied.bin"))
    assert code == 0 and [json.loads(x)["type"] for x in out.splitlines()][:2] == ["session/start", "turn/start"]


@pytest.mark.parametrize("damage", ["bad-checksum", "zero-fill"])
def test_a_renamed_zstd_log_with_damage_after_its_header_frame_is_still_that_session(tmp_path, damage):
    """The header is read from the first frame alone: damage in a later frame (the kind a
    renamed copy of a crashed log has) does not hide the id it names, so the copy is
    scanned and repaired as that session (exit 1), not refused as another one (exit 4)."""
    store = sessionlog.open_store(f"zstd:{tmp_path / 'z'}")
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    for i in range(3):
        store.append("s1", [{"type": "note", "i": i}])
    data = bytearray((tmp_path / "z" / "s1.jsonl.zst").read_bytes())
    if damage == "bad-checksum":
        data[-2] ^= 0x01  # the last frame's checksum
    else:
        data += b"\0" * 4096
    copy = tmp_path / "copy.jsonl.zst"
    copy.write_bytes(bytes(data))
    code, out = run("scan", str(copy), "--json")
    [row] = json_lines(out)
    assert (code, row["session"], row["damage"]["kind"]) == (1, "s1", "corrupt" if damage == "bad-checksum" else "zero-fill")
    assert copy.read_bytes() == bytes(data)
    code, out = run("repair", str(copy), "--json")
    assert code == 0 and json_lines(out)[0]["status"] == "repaired"


def test_in_a_store_the_name_matters_and_scan_says_so_without_refusing(tmp_path, capsys):
    shutil.copy(os.path.join(FIXTURES, "healthy.jsonl"), tmp_path / "healthy.jsonl")
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), tmp_path / "s1.jsonl")  # header: 'torn'
    code, out = run("scan", str(tmp_path), "--json")
    rows = {r["session"]: r for r in json_lines(out)}
    assert code == 1  # the torn tail, not "not a log"
    assert set(rows) == {"healthy", "torn"}
    assert rows["torn"]["status"] == "repairable" and rows["torn"]["path"] == str(tmp_path / "s1.jsonl")
    err = capsys.readouterr().err
    assert "s1.jsonl" in err and "header names 'torn'" in err and "rename it to torn.jsonl" in err
    code, out = run("scan", str(tmp_path))  # the table says it too (on stderr), exit the same
    assert code == 1 and "torn" in out


@pytest.mark.parametrize("name", ["my session.jsonl", "séssion ✓.jsonl", "torn (copy).jsonl"])
def test_a_log_whose_name_is_no_session_id_is_scanned_and_repaired_in_its_directory(tmp_path, capsys, name):
    """A directory's log is never passed over for its name: it is inspected under the id
    its header names, with a note, as when the file is named alone."""
    shutil.copy(os.path.join(FIXTURES, "healthy.jsonl"), tmp_path / "healthy.jsonl")
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), tmp_path / name)
    code, out = run("scan", str(tmp_path), "--json")
    rows = {r["session"]: r for r in json_lines(out)}
    assert code == 1 and set(rows) == {"healthy", "torn"}
    assert rows["torn"]["status"] == "repairable" and rows["torn"]["path"] == str(tmp_path / name)
    assert "the file name is not a session id" in capsys.readouterr().err
    code, out = run("repair", str(tmp_path), "--json")
    assert code == 0 and {r["session"]: r["status"] for r in json_lines(out)} == {"healthy": "clean", "torn": "repaired"}
    code, out = run("scan", str(tmp_path / name), "--json")
    assert code == 0 and json_lines(out)[0]["status"] == "clean"


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_a_store_url_is_the_same_store_as_its_directory(tmp_path, scheme, capsys):
    """``jsonl:DIR`` and ``DIR`` name one store: a file whose header disagrees with its
    name is inspected under its header's id with a note either way, never refused."""
    store = sessionlog.open_store(f"{scheme}:{tmp_path}")
    store.create("s1", [{"type": "turn/start", "turn": "t1"}])
    store.create("s2")
    store.close()
    suffix = ".jsonl" if scheme == "jsonl" else ".jsonl.zst"
    shutil.copy(tmp_path / f"s1{suffix}", tmp_path / f"renamed{suffix}")
    by_path = run("scan", str(tmp_path), "--json")
    capsys.readouterr()
    code, out = run("scan", f"{scheme}:{tmp_path}", "--json")
    def rows(text):
        return sorted(json.dumps({k: v for k, v in r.items() if k != "note"}) for r in json_lines(text))
    assert (code, rows(out)) == (by_path[0], rows(by_path[1]))
    assert code == 1 and "renamed" not in {r["session"] for r in json_lines(out)}
    assert "header names 's1'" in capsys.readouterr().err
    code, out = run("repair", f"{scheme}:{tmp_path}", "--json")
    assert code == 0 and all(r["status"] in ("clean", "repaired") for r in json_lines(out))


def test_several_targets_and_globs(fixtures_copy):
    names = ["healthy", "torn", "mid-log"]
    code, out = run("scan", *(str(fixtures_copy / f"{n}.jsonl") for n in names), "--json")
    assert code == 3 and [r["session"] for r in json_lines(out)] == names
    # what the shell makes of logs/*.jsonl
    exe = os.path.join(os.path.dirname(sys.executable), "sessionlog")
    r = subprocess.run(f"{exe} repair --json {fixtures_copy}/t*.jsonl {fixtures_copy}/z*.jsonl", shell=True,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(x["session"] for x in json_lines(r.stdout)) == ["torn", "zero-fill"]
    assert all(x["status"] == "repaired" for x in json_lines(r.stdout))
    # a missing target among others: the others are still worked on, exit 4
    code, out = run("scan", str(fixtures_copy / "healthy.jsonl"), str(fixtures_copy / "gone.jsonl"), "--json")
    rows = json_lines(out)
    assert code == 4 and [r["status"] for r in rows] == ["clean", "error"]


def test_standard_input_for_scan_and_show(tmp_path):
    data = open(os.path.join(FIXTURES, "torn.jsonl"), "rb").read()
    cmd = [sys.executable, "-m", "sessionlog"]
    r = subprocess.run(cmd + ["scan", "-", "--json"], input=data, capture_output=True)
    assert r.returncode == 1, r.stderr
    [row] = json_lines(r.stdout.decode())
    assert row["session"] == "torn" and row["path"] == "-" and row["damage"]["kind"] == "torn"
    r = subprocess.run(cmd + ["show", "-", "--format", "openai", "--check"], input=data, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["messages"][0]["role"] == "user"
    r = subprocess.run(cmd + ["repair", "-"], input=data, capture_output=True)
    assert r.returncode == 2 and b"standard input" in r.stderr


@pytest.mark.parametrize("data", [b"", b"garbage", b"\x00" * 10])
def test_standard_input_errors_name_standard_input_not_a_deleted_spool(data):
    """What is wrong with standard input is said of ``-``: never of the temporary file it
    was spooled to, which is gone when the command returns."""
    cmd = [sys.executable, "-m", "sessionlog"]
    for args in (["scan", "-"], ["scan", "-", "--json"], ["show", "-"]):
        r = subprocess.run(cmd + args, input=data, capture_output=True, text=False)
        assert r.returncode == 4, (args, r.stderr)
        assert b"sessionlog-stdin-" not in r.stdout + r.stderr, (args, r.stdout, r.stderr)
        assert b"-: " in r.stdout + r.stderr, (args, r.stdout, r.stderr)


def test_version_and_python_m(fixtures_copy):
    r = subprocess.run([sys.executable, "-m", "sessionlog", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == f"sessionlog {sessionlog.__version__}"
    r = subprocess.run([sys.executable, "-m", "sessionlog", "scan", str(fixtures_copy / "torn.jsonl")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "torn" in r.stdout and r.stderr == ""


def test_help_documents_the_exit_codes_of_every_command():
    for command in ("scan", "repair", "show", "convert", "compact"):
        r = subprocess.run([sys.executable, "-m", "sessionlog", command, "--help"], capture_output=True, text=True)
        assert r.returncode == 0 and "exit codes:" in r.stdout, command
    r = subprocess.run([sys.executable, "-m", "sessionlog", "--help"], capture_output=True, text=True)
    assert "4 error (a target or session that does not exist" in " ".join(r.stdout.split())
    assert "0 clean/open/suspended" in " ".join(r.stdout.split())  # a suspended session exits 0
    assert "suspended" in sessionlog.cli.__doc__.split("Exit codes")[1].split("1 repairable")[0]


def test_repair_dry_run_names_the_quarantine_as_the_pattern_the_real_run_fills(fixtures_copy):
    path = str(fixtures_copy / "torn.jsonl")
    code, out = run("repair", path, "--dry-run", "--json")
    [dry] = json_lines(out)
    assert code == 0 and dry["quarantine_is_pattern"] is True
    assert dry["quarantine"] == path + ".2612.torn.<UTC stamp>-<random>.quarantine"
    [marker] = [e for e in dry["appended"] if e["type"] == "log/truncated"]
    assert marker["quarantine"] == "torn.jsonl.2612.torn.<UTC stamp>-<random>.quarantine"  # the same file
    code, out = run("repair", path, "--dry-run")
    assert "would quarantine 71 bytes in " + path + ".2612.torn.<UTC stamp>-<random>.quarantine" in out
    assert "dry run: nothing written" in out
    code, out = run("repair", path, "--json")
    [real] = json_lines(out)
    prefix, _, _ = dry["quarantine"].partition("<")
    assert real["quarantine"].startswith(prefix) and os.path.exists(real["quarantine"])


def test_restore_dry_run_says_so(fixtures_copy):
    path = str(fixtures_copy / "torn.jsonl")
    assert run("repair", path)[0] == 0
    before = open(path, "rb").read()
    code, out = run("restore", path, "--dry-run")
    assert code == 0 and "dry run: nothing written" in out and "would put back" in out
    assert open(path, "rb").read() == before
    code, out = run("restore", path)
    assert code == 0 and "dry run" not in out


def test_a_torn_tail_refusing_an_append_names_its_offset(fixtures_copy):
    store = sessionlog.open_store(f"jsonl:{fixtures_copy}")
    with pytest.raises(sessionlog.CorruptLog) as err:
        store.append("torn", [{"type": "x"}])
    assert err.value.offset == 2612 and "at offset 2612" in str(err.value) and "torn" in str(err.value)


def test_tables_are_never_cut_or_wrapped_when_piped(tmp_path):
    deep = tmp_path / ("a-very-long-directory-name-" * 6)
    deep.mkdir()
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), deep / "torn.jsonl")
    r = subprocess.run([sys.executable, "-m", "sessionlog", "repair", str(deep)], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0
    [line] = [x for x in r.stdout.splitlines() if "quarantined" in x]
    quarantine = line.split(" in ", 1)[1]
    assert os.path.exists(quarantine) and len(line) > 200
    assert r.stderr == ""


def _on_a_terminal(*argv: str) -> tuple[int, bytes, bytes]:
    """Run the command with standard error on a pseudo-terminal: (exit, stdout, stderr)."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "sessionlog", *argv], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = p.stdout.read()
    p.wait()
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    return p.returncode, out, err


def test_progress_only_on_a_terminal_in_bytes_and_off_when_quiet(fixtures_copy):
    size = os.path.getsize(fixtures_copy / "torn.jsonl")
    code, out, err = _on_a_terminal("scan", str(fixtures_copy / "torn.jsonl"))
    assert code == 1 and b"torn" in out
    assert b"scanning" in err and f"/{size / 1000:.1f} kB".encode() in err
    code, out, err = _on_a_terminal("repair", "--dry-run", str(fixtures_copy / "torn.jsonl"))
    assert code == 0 and b"dry run: repairing" in err
    for flag in ("--quiet", "--no-progress"):
        code, out, err = _on_a_terminal("scan", flag, str(fixtures_copy / "torn.jsonl"))
        assert code == 1 and err == b""
    r = subprocess.run([sys.executable, "-m", "sessionlog", "scan", str(fixtures_copy)], capture_output=True)
    assert r.stderr == b""  # not a terminal: no progress


@pytest.mark.parametrize("document", [
    {"messages": []}, {"system": "be\nbrief", "messages": [{"a": [1, {"b": "é"}]}, {"c": None}]},
    {"input": [{"x": {}}, [], "s"]}, {},
])
def test_show_writes_the_same_bytes_as_json_dumps_one_item_at_a_time(document):
    from sessionlog.cli import write_pretty

    out = io.StringIO()
    write_pretty(out, document)
    assert out.getvalue() == json.dumps(document, ensure_ascii=False, indent=2) + "\n"


@pytest.mark.parametrize("order", ["options-last", "options-between", "options-first"])
def test_convert_takes_its_options_anywhere(fixtures_copy, tmp_path, order):
    """``SRC... DST`` with the options before, between or after the paths."""
    src, dst = str(fixtures_copy / "torn.jsonl"), f"jsonl:{tmp_path / 'out'}"
    args = {"options-last": [src, dst, "--repaired"], "options-between": [src, "--repaired", dst],
            "options-first": ["--repaired", src, dst]}[order]
    code, _ = run("convert", *args)
    assert code == 0
    assert sessionlog.open_store(dst).scan("torn").status == "clean"
    assert run("convert", src, "--bogus", dst)[0] == 2


def test_foreign_tables_are_never_cut_or_wrapped_when_piped(tmp_path):
    deep = tmp_path / ("a-very-long-directory-name-" * 6)
    deep.mkdir()
    name = "7c1e9a52-3f0b-4d8e-9a61-2b5f0c4d9e13-with-a-long-name.jsonl"
    shutil.copy(os.path.join(FIXTURES, "claude-code", "dangling-call.jsonl"), deep / name)
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "sessionlog", "scan", str(deep)], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and name in r.stdout and "…" not in r.stdout
    r = subprocess.run([sys.executable, "-m", "sessionlog", "repair", str(deep)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "…" not in r.stdout
    [backup] = [n for n in os.listdir(deep) if n.endswith(".orig")]
    assert backup in r.stdout  # whole, on one line


def test_convert_and_salvage_create_a_dst_whose_parents_are_missing(tmp_path):
    """DST is created by the first session written into it, missing parent directories
    included (mkdir -p); a convert that writes nothing leaves none of them behind."""
    src = sessionlog.open_store(f"jsonl:{tmp_path / 'src'}")
    src.create("s1")
    src.append("s1", [{"type": "note", "i": 1}])
    want = [r.raw for r in src.read("s1")]
    for dst in (f"jsonl:{tmp_path / 'a' / 'b' / 'c'}", f"sqlite:///{tmp_path / 'd' / 'e' / 'x.sqlite'}"):
        assert run("convert", f"jsonl:{tmp_path / 'src'}", dst)[0] == 0
        assert [r.raw for r in sessionlog.open_store(dst).read("s1")] == want
    assert run("salvage", str(tmp_path / "src" / "s1.jsonl"), f"zstd:{tmp_path / 'f' / 'g'}")[0] == 0
    assert [r.raw for r in sessionlog.open_store(f"zstd:{tmp_path / 'f' / 'g'}").read("s1")] == want
    (tmp_path / "empty").mkdir()
    assert run("convert", f"jsonl:{tmp_path / 'empty'}", f"jsonl:{tmp_path / 'h' / 'i'}")[0] == 0
    assert not (tmp_path / "h").exists()
    store = sessionlog.open_store(f"jsonl:{tmp_path / 'j' / 'k'}")
    assert store.sessions() == [] and (tmp_path / "j" / "k").is_dir()


@pytest.mark.parametrize("command", ["scan", "repair", "show"])
def test_a_session_file_with_another_session_named_exits_4(tmp_path, command):
    """A --session the TARGET does not hold names nothing: exit 4 (not a usage error),
    whether the TARGET is a store or one session's file; no byte changes."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s1")
    path = tmp_path / "s1.jsonl"
    before = path.read_bytes()
    assert run(command, str(path), "--session", "other")[0] == 4
    assert run(command, f"jsonl:{tmp_path}", "--session", "other")[0] == 4
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s1.jsonl"]


@pytest.mark.parametrize("name", ["torn", "zero-fill", "corrupt-last", "mid-log"])
def test_show_of_a_damaged_log_says_it_shows_the_prefix(fixtures_copy, capsys, name):
    code, _ = run("show", str(fixtures_copy / f"{name}.jsonl"), "--format", "openai", "--check")
    kind = EXPECTED[name][1]
    assert code == 0 and f"{kind} at offset" in capsys.readouterr().err


def test_an_empty_target_names_nothing_not_the_current_directory(fixtures_copy, capsys, monkeypatch):
    monkeypatch.chdir(fixtures_copy)  # a directory of logs the empty word must not reach
    code, out = run("scan", "")
    assert code == 4 and out == "" and "empty TARGET" in capsys.readouterr().err


def test_a_destination_url_of_no_known_backend_is_named_as_such(tmp_path, capsys):
    code, out = run("convert", os.path.join(FIXTURES, "healthy.jsonl"), f"jsnol:{tmp_path / 'out'}")
    err = capsys.readouterr().err
    assert code == 2 and "'jsnol' is no store backend" in err and "zstd:jsnol" not in err
    assert not (tmp_path / "out").exists()


def test_convert_force_without_repaired_is_a_usage_error(tmp_path, capsys):
    code, out = run("convert", os.path.join(FIXTURES, "torn.jsonl"), f"jsonl:{tmp_path / 'dst'}", "--force")
    assert code == 2 and "--repaired" in capsys.readouterr().err
    assert not (tmp_path / "dst").exists()


def test_a_scan_row_of_a_log_that_cannot_be_read_names_its_path(tmp_path):
    shutil.copy(os.path.join(FIXTURES, "healthy.jsonl"), tmp_path / "healthy.jsonl")
    os.mkfifo(tmp_path / "x.jsonl")  # no log: never read (a read would hang)
    code, out = run("scan", str(tmp_path), "--json")
    rows = {row["session"]: row for row in json_lines(out)}
    assert code == 4 and rows["x"]["status"] == "error"
    assert rows["x"]["path"] == str(tmp_path / "x.jsonl")


def test_scan_json_also_writes_an_error_to_standard_error(capsys):
    code, out = run("scan", os.path.join(FIXTURES, "bad", "future-format.jsonl"), "--json")
    [row] = json_lines(out)
    assert code == 4 and row["status"] == "unsupported"
    assert "sessionlog/9" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["scan", "repair", "show", "convert", "compact"])
def test_a_url_naming_the_other_backends_directory_says_so(fixtures_copy, tmp_path, capsys, command):
    """zstd:DIR where DIR holds only *.jsonl logs (or jsonl:DIR of *.jsonl.zst) names no
    session: exit 4 naming the URL that would, never a quiet empty answer; nothing written."""
    before = {p.name: p.read_bytes() for p in fixtures_copy.iterdir()}
    args = [command, f"zstd:{fixtures_copy}"] + ([f"jsonl:{tmp_path / 'dst'}"] if command == "convert" else [])
    code, out = run(*args)
    err = capsys.readouterr().err
    assert code == 4 and f"name it jsonl:{fixtures_copy}" in err and out == ""
    assert {p.name: p.read_bytes() for p in fixtures_copy.iterdir()} == before
    assert not (tmp_path / "dst").exists()
    # The other way round, and an empty directory is still an empty store.
    zdir = tmp_path / "z"
    code, _ = run("convert", f"jsonl:{fixtures_copy}", f"zstd:{zdir}", "--repaired", "--force")
    code, out = run("scan", f"jsonl:{zdir}")
    assert code == 4 and f"name it zstd:{zdir}" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert run("scan", f"zstd:{tmp_path / 'empty'}") == (0, "")
    assert f"zstd:{tmp_path / 'empty'}: no sessions" in capsys.readouterr().err  # said, not silent


def test_scan_says_why_each_damaged_log_is_damaged(fixtures_copy):
    """The damage's reason (what repair refuses with) is in the scan row and below the
    table, one line per damaged log naming its file and offset."""
    code, out = run("scan", str(fixtures_copy), "--json")
    rows = {r["session"]: r for r in json_lines(out)}
    code, table = run("scan", str(fixtures_copy))
    for name, (status, kind, *_) in EXPECTED.items():
        damage = rows[name]["damage"]
        if kind is None:
            assert damage is None
            continue
        assert damage["kind"] == kind and damage["reason"]
        line = f"{rows[name]['path']}: {kind} at offset {damage['offset']}: {damage['reason']}"
        assert line in table.splitlines(), line
    assert rows["mid-log"]["damage"]["reason"] == "invalid UTF-8 at byte 43"


def test_a_sqlite_sessions_scan_row_names_the_database_file_and_its_damage_is_at_a_row(tmp_path, capsys):
    import sqlite3

    db = tmp_path / "s.db"
    assert run("convert", os.path.join(FIXTURES, "healthy.jsonl"), f"sqlite:///{db}")[0] == 0
    with sqlite3.connect(db) as c:
        c.execute("UPDATE sessionlog_records SET record = ? WHERE seq = 21", (b'{"seq":21,"ts":1,"type"',))
    for target in (f"sqlite:///{db}", str(db)):
        code, out = run("scan", target, "--json")
        [row] = json_lines(out)
        assert row["path"] == str(db) and row["damage"]["kind"] == "corrupt"
        code, table = run("scan", target)
        line = f"{db} session {row['session']!r}: corrupt at row {row['damage']['offset']}: {row['damage']['reason']}"
        assert line in table.splitlines()
        run("show", target, "--format", "events")
        assert f"corrupt at row {row['damage']['offset']}; showing the prefix" in capsys.readouterr().err
    for target in (f"sqlite:///{db}", str(db)):  # repair's row names it too
        code, out = run("repair", target, "--dry-run", "--json")
        assert [r["path"] for r in json_lines(out)] == [str(db)]


def test_a_missing_targets_scan_row_has_every_documented_key(tmp_path):
    code, out = run("scan", os.path.join(FIXTURES, "healthy.jsonl"), str(tmp_path / "nosuch"), "--json")
    found, missing = json_lines(out)
    assert code == 4 and missing["status"] == "error"
    assert set(found) <= set(missing) | {"note"}


def test_a_log_whose_file_name_is_not_utf8_is_refused_clearly_and_left_as_it_is(tmp_path, capsys):
    """The log/truncated record names its quarantine file as JSON text: a name that is
    not UTF-8 cannot be named, and repair says so (naming the file) before any change."""
    name = os.fsdecode(b"x\xff.jsonl")
    path = tmp_path / name
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), path)
    before = path.read_bytes()
    code, out = run("repair", str(path), "--json")
    [row] = json_lines(out)
    assert code == 4 and row["status"] == "refused"
    assert "file name is not valid UTF-8" in row["reason"] and "rename the log" in row["reason"]
    assert path.read_bytes() == before and os.listdir(tmp_path) == [name]
    assert run("scan", str(path))[0] == 1  # scan reads it as it is
    assert run("repair", str(path), "--dry-run")[0] == 0  # what repair would do, the name escaped
    code, out = run("show", str(path), "--format", "events")
    assert code == 0 and out
    assert "x\\xff.jsonl" in capsys.readouterr().err  # notes print the name's bytes escaped
    assert path.read_bytes() == before and os.listdir(tmp_path) == [name]


def test_errors_name_what_is_wrong(tmp_path, capsys):
    """A directory where a file is read, an invalid id, a SRC session a DST file would
    rename: each error says so (not 'no such file', not 'asked for')."""
    healthy = os.path.join(FIXTURES, "healthy.jsonl")
    assert run("salvage", FIXTURES, f"jsonl:{tmp_path}/x")[0] == 4
    assert "is a directory; salvage reads one log file" in capsys.readouterr().err
    assert run("scan", FIXTURES, "--session", "..")[0] == 4
    assert "not a valid session id" in capsys.readouterr().err
    assert run("scan", f"sqlite:///{tmp_path}")[0] == 4
    assert "is a directory, not a SQLite database file" in capsys.readouterr().err
    assert run("convert", healthy, str(tmp_path / "new" / "other.jsonl"))[0] == 2
    err = capsys.readouterr().err
    assert "SRC holds session 'healthy', but the DST file names session 'other'" in err
    assert str(tmp_path / "new" / "healthy.jsonl") in err and not (tmp_path / "new").exists()


def test_an_internal_error_exits_4_not_the_repairable_code(monkeypatch, capsys):
    """A bug in a command is exit 4 with a note asking for a report, never exit 1 (which
    a script reads as "repairable" and answers with a repair)."""
    import sessionlog.cli as cli

    def broken(args, out):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "_run", broken)
    assert main(["scan", os.path.join(FIXTURES, "healthy.jsonl")]) == 4
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: boom" in err and "a bug: please report it" in err


@pytest.mark.parametrize("view", ["events", "openai", "responses", "anthropic"])
def test_show_of_a_log_with_a_cut_names_no_quarantine_and_is_the_same_every_time(fixtures_copy, view):
    """show writes nothing: the repaired view's marker names no quarantine file (none is
    made; it named a new random one on each run) but the log that keeps the bytes."""
    path = fixtures_copy / "mid-log.jsonl"
    first = run("show", str(path), "--format", view)
    assert first == run("show", str(path), "--format", view) and first[0] == 0
    if view == "events":
        [marker] = [json.loads(x) for x in first[1].splitlines() if '"log/truncated"' in x]
        assert marker["quarantine"] is None and marker["source"] == str(path)
    assert ".quarantine" not in first[1]
    assert not [n for n in os.listdir(fixtures_copy) if n.endswith(".quarantine")]


def test_salvage_names_what_a_source_that_is_not_a_file_is_and_gives_a_json_row(tmp_path, capsys):
    """salvage of a FIFO says it is a FIFO (not "no such log file"), and with --json a
    failure is a row on standard output, as on every command; nothing is created."""
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    dst = tmp_path / "out"
    code, out = run("salvage", str(fifo), f"jsonl:{dst}", "--json")
    err = capsys.readouterr().err
    assert code == 4 and "not a regular file (a FIFO)" in err and "Traceback" not in err
    [row] = json_lines(out)
    assert row["session"] is None and row["source"] == str(fifo) and "a FIFO" in row["error"]
    code, out = run("salvage", str(tmp_path / "missing.jsonl"), f"jsonl:{dst}", "--json")
    assert code == 4 and "no such log file" in json_lines(out)[0]["error"]
    assert not dst.exists()


def test_a_header_without_a_format_or_a_session_is_said_so_not_as_none(tmp_path, capsys):
    """Messages say what a header lacks, in words, never Python's ``None``."""
    no_format = tmp_path / "a.jsonl"
    no_format.write_bytes(b'{"seq":1,"ts":1.0,"type":"session/start","session":"a"}\n')
    assert run("scan", str(no_format))[0] == 4
    err = capsys.readouterr().err
    assert "its header has no format" in err and "None" not in err
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    no_session = tmp_path / "b.jsonl"
    no_session.write_bytes(b'{"seq":1,"ts":1.0,"type":"session/start","format":"sessionlog/1"}\n')
    with pytest.raises(sessionlog.CorruptLog) as info:
        store.scan("b")
    assert "its header names no session" in str(info.value) and "None" not in str(info.value)
