"""restore: the quarantined bytes back in place, byte for byte, or a refusal that changes nothing."""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest

import sessionlog
from sessionlog.contract import read_prefix
from sessionlog.cli import main

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


def run(*args: str) -> tuple[int, list[dict]]:
    out = io.StringIO()
    code = main([*args, "--json"], out)
    return code, [json.loads(x) for x in out.getvalue().splitlines()]


def files(d) -> dict[str, bytes]:
    return {n: (d / n).read_bytes() for n in sorted(os.listdir(d)) if not n.startswith(".")}


@pytest.mark.parametrize("name,force", [("torn", False), ("zero-fill", False), ("corrupt-last", False),
                                        ("mid-log", True), ("seq-break", True)])
def test_restore_undoes_a_repair_byte_for_byte(tmp_path, name, force):
    shutil.copy(os.path.join(FIXTURES, f"{name}.jsonl"), tmp_path / f"{name}.jsonl")
    original = (tmp_path / f"{name}.jsonl").read_bytes()
    code, [rep] = run("repair", str(tmp_path / f"{name}.jsonl"), *(["--force"] if force else []))
    assert code == 0 and rep["status"] == "repaired"
    before = files(tmp_path)
    code, [dry] = run("restore", str(tmp_path / f"{name}.jsonl"), "--dry-run")
    assert code == 0 and dry["status"] == "restored" and files(tmp_path) == before
    code, [row] = run("restore", str(tmp_path / f"{name}.jsonl"))
    assert code == 0 and row["status"] == "restored" and f".{row['offset']}." in os.path.basename(rep["quarantine"])
    assert (tmp_path / f"{name}.jsonl").read_bytes() == original
    assert not os.path.exists(rep["quarantine"]) and os.path.exists(rep["quarantine"] + ".restored")
    code, [scan] = run("scan", str(tmp_path / f"{name}.jsonl"))
    assert scan["status"] in ("repairable", "needs-force") and scan["damage"] is not None
    code, [again] = run("restore", str(tmp_path / f"{name}.jsonl"))
    assert code == 0 and again["status"] == "nothing"
    # and the repair can be done again, the same way
    code, [rep2] = run("repair", str(tmp_path / f"{name}.jsonl"), *(["--force"] if force else []))
    assert code == 0 and rep2["truncated_bytes"] == rep["truncated_bytes"]


def test_restore_refuses_when_records_were_appended_after_the_repair(tmp_path):
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), tmp_path / "torn.jsonl")
    assert run("repair", str(tmp_path))[0] == 0
    sessionlog.open_store(f"jsonl:{tmp_path}").append("torn", [{"type": "user/message", "turn": "t9",
                                                                 "content": "written after the repair"}])
    before = files(tmp_path)
    code, [row] = run("restore", str(tmp_path))
    assert code == 4 and row["status"] == "refused" and "would lose it" in row["reason"]
    assert files(tmp_path) == before


def test_restore_refuses_without_the_quarantine_and_on_a_locked_session(tmp_path):
    shutil.copy(os.path.join(FIXTURES, "torn.jsonl"), tmp_path / "torn.jsonl")
    code, [rep] = run("repair", str(tmp_path))
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    with store.session("torn"):
        code, [row] = run("restore", str(tmp_path))
        assert code == 5 and row["status"] == "locked"
    os.rename(rep["quarantine"], str(tmp_path / "elsewhere"))
    before = files(tmp_path)
    code, [row] = run("restore", str(tmp_path))
    assert code == 4 and row["status"] == "refused" and "is gone" in row["reason"]
    assert files(tmp_path) == before


def test_restore_a_zstd_session(tmp_path):
    store = sessionlog.open_store(f"zstd:{tmp_path}")
    store.create("z", [{"type": "turn/start", "turn": "t1"}])
    store.append("z", [{"type": "user/message", "turn": "t1", "content": "hi"}])
    path = tmp_path / "z.jsonl.zst"
    path.write_bytes(path.read_bytes() + b"\x28\xb5\x2f\xfd\x00\x00")  # a torn frame
    original = path.read_bytes()
    code, [rep] = run("repair", str(path))
    assert code == 0 and rep["status"] == "repaired" and path.read_bytes() != original
    code, [row] = run("restore", str(path))
    assert code == 0 and row["status"] == "restored" and path.read_bytes() == original


def test_restore_on_a_sql_store_is_a_usage_error(tmp_path):
    sessionlog.open_store(f"sqlite:///{tmp_path}/x.db").create("a")
    out = io.StringIO()
    assert main(["restore", f"sqlite:///{tmp_path}/x.db"], out) == 2


# --- salvage ---------------------------------------------------------------------------


def _one_frame_session(tmp_path, n=2000):
    import zstandard

    store = sessionlog.open_store(f"jsonl:{tmp_path / 'j'}")
    store.create("s1")
    for i in range(n):
        store.append("s1", [{"type": "user/message", "turn": "t", "content": f"message {i} " + "x" * 40}])
    data = (tmp_path / "j" / "s1.jsonl").read_bytes()
    frame = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True).compress(data)
    return data, frame


def test_salvage_a_one_frame_zstd_session_with_a_flipped_byte(tmp_path):
    data, frame = _one_frame_session(tmp_path)
    flipped = bytearray(frame)
    flipped[len(flipped) // 2] ^= 0x40
    (tmp_path / "z").mkdir()
    src = tmp_path / "z" / "s1.jsonl.zst"
    src.write_bytes(bytes(flipped))
    code, rows = run("scan", str(src))
    assert code == 4 and rows[0]["status"] == "error"  # what scan says of a damaged first frame
    out = io.StringIO()
    assert main(["salvage", str(src), f"jsonl:{tmp_path / 'saved'}", "--json"], out) == 0
    report = json.loads(out.getvalue())
    assert src.read_bytes() == bytes(flipped)  # the source is never written
    assert report["session"] == "s1" and report["damaged_regions"] == [0]
    saved = (tmp_path / "saved" / "s1.jsonl").read_bytes().splitlines(keepends=True)
    # the flip sits half-way through the frame; altered bytes after it may decode with a
    # wrong seq (a gap marker each)
    assert report["kept"] + report["gaps"] == len(saved) and report["kept"] > 500
    # Everything came from the one failed frame: decodable, but not verified by a checksum;
    # what decompressed before the flipped block is the original, byte for byte.
    assert report["unverified_seqs"][0] == 1 and report["unverified_seqs"][1] >= len(saved) - 1
    same = sum(1 for a, b in zip(saved, data.splitlines(keepends=True)) if a == b)
    assert same > 500
    code, [scan] = run("scan", str(tmp_path / "saved" / "s1.jsonl"))
    assert code == 0 and scan["status"] == "clean"
    out = io.StringIO()
    assert main(["salvage", str(src), f"jsonl:{tmp_path / 'saved'}"], out) == 4  # never overwrites DST


def test_salvage_keeps_records_after_a_bad_frame_with_a_marker(tmp_path):
    store = sessionlog.open_store(f"zstd:{tmp_path / 'z'}")
    store.create("s1")
    for i in range(30):
        store.append("s1", [{"type": "user/message", "turn": "t", "content": f"m{i} " + "y" * 60}])
    path = tmp_path / "z" / "s1.jsonl.zst"
    frames = path.read_bytes().split(b"\x28\xb5\x2f\xfd")[1:]
    bad = 10  # frames[0] is the header's: this one holds seq 11
    raw = bytearray(path.read_bytes())
    start = sum(len(f) + 4 for f in frames[:bad])
    raw[start + len(frames[bad]) - 2] ^= 0xFF  # inside its checksum
    path.write_bytes(bytes(raw))
    out = io.StringIO()
    assert main(["salvage", str(path), f"jsonl:{tmp_path / 'saved'}", "--json"], out) == 0
    report = json.loads(out.getvalue())
    assert report["gaps"] == 1 and report["kept"] == 30 and report["copied"] == 10
    assert report["unverified_seqs"] is None  # the bad frame's few bytes never came out
    recs = list(sessionlog.open_store(f"jsonl:{tmp_path / 'saved'}").read("s1"))
    assert [r.seq for r in recs] == list(range(1, 32))
    marker = recs[10]
    assert marker["type"] == "log/truncated" and marker["dropped_seqs"] == [11, 11] and marker["reason"] == "salvage"
    assert recs[11]["salvaged_seq"] == 12 and recs[11]["content"].startswith("m10 ")
    assert [r.raw for r in recs[:10]] == [r.raw for r in list(read_prefix(store, "s1"))[:10]]  # byte for byte


def test_the_by_hand_restore_in_damage_md_gives_back_the_log_and_leaves_no_unmarked_cut(tmp_path):
    """docs/damage.md's shell steps, run as written (with this repair's quarantine name and
    offset): the log is again the bytes it was before the repair, and a scan afterwards
    reports no quarantine that no log/truncated names (the next repair would mark it)."""
    import re
    import subprocess
    import sys

    with open(os.path.join(os.path.dirname(FIXTURES), "docs", "damage.md"), encoding="utf-8") as f:
        doc = f.read()
    [script] = [b for b in re.findall(r"```sh\n(.*?)```", doc, re.S) if "head -c" in b]
    store = tmp_path / "store"
    store.mkdir()
    original = open(os.path.join(FIXTURES, "torn.jsonl"), "rb").read()
    (store / "s1.jsonl").write_bytes(original)
    code, [row] = run("repair", str(store / "s1.jsonl"))
    assert code == 0 and row["status"] == "repaired"
    q = os.path.basename(row["quarantine"])
    offset = int(q.split(".")[2])
    script = re.sub(r"^q=.*$", f"q={q}", script, flags=re.M)
    script = re.sub(r"^offset=.*$", f"offset={offset}", script, flags=re.M)
    script = script.replace("cd STORE_DIR", f"cd {store}")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (store / "s1.jsonl").read_bytes() == original
    code, [after] = run("scan", str(store / "s1.jsonl"))
    assert after["unmarked_quarantines"] == [] and after["damage"]["kind"] == "torn"


def test_restore_with_nothing_to_do_or_refused_leaves_the_directory_as_it_was(tmp_path):
    """Like repair, restore creates a session's lock file only when it is about to write:
    with nothing to restore, or refused, it answers as its dry run does (on a read-only
    file system too) and adds no file."""
    shutil.copy(os.path.join(FIXTURES, "healthy.jsonl"), tmp_path / "healthy.jsonl")
    before = files(tmp_path)
    for extra in ((), ("--dry-run",)):
        code, [row] = run("restore", str(tmp_path), *extra)
        assert code == 0 and row["status"] == "nothing"
        assert files(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["healthy.jsonl"]


_KILLED_REPAIR = r"""
import os, signal, sys
import sessionlog
from sessionlog.durable import FileSystem

class KillMidMarker(FileSystem):
    '''SIGKILLs the process 20 bytes into the first write after the repair's cut: the
    marker batch is torn inside its first record, as a power cut or a kill may leave it.'''
    cut = False

    def ftruncate(self, fd, size):
        super().ftruncate(fd, size)
        self.cut = True

    def write(self, fd, data):
        if self.cut and len(data) > 1:
            super().write(fd, data[:20])
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write(fd, data)

store = sessionlog.open_store(sys.argv[1], fs=KillMidMarker())
store.repair("s")
"""


@pytest.mark.parametrize("scheme", ["jsonl", "zstd"])
def test_restore_undoes_a_repair_that_finished_one_killed_while_writing_its_marker(tmp_path, scheme):
    """A repair killed while writing its marker leaves its cut made, its quarantine
    unnamed and a torn batch; the next repair quarantines that too and names both. A
    restore then gives back the log as it was before the first repair, byte for byte
    (the torn batch was the stopped repair's own output), and the session scans as it
    did then."""
    import subprocess
    import sys

    url = f"{scheme}:{tmp_path}"
    store = sessionlog.open_store(url)
    store.create("s")
    store.append("s", [{"type": "turn/start", "turn": "t"}, {"type": "step/start", "turn": "t", "step": 1},
                       {"type": "assistant/message", "turn": "t", "step": 1, "content": None,
                        "tool_calls": [{"id": "c1", "name": "f", "arguments": {}}]}])
    store.append("s", [{"type": "tool/call", "turn": "t", "step": 1, "call_id": "c1", "name": "f"}])
    path = store.path_of("s")
    with open(path, "ab") as f:
        f.write(b"\0" * 3000)
    with open(path, "rb") as f:
        original = f.read()
    before = store.scan("s")
    child = subprocess.run([sys.executable, "-c", _KILLED_REPAIR, url], capture_output=True)
    assert child.returncode == -9, child.stderr
    assert store.scan("s").unmarked_quarantines  # the stopped repair's cut tail, named by no marker
    rep = store.repair("s")
    assert rep.status == "repaired" and store.scan("s").status.value == "clean"
    assert len([r for r in rep.appended if r["type"] == "log/truncated"]) == 2
    from sessionlog.restore import restore

    restored = restore(store, "s")
    assert restored.status == "restored", restored.reason
    with open(path, "rb") as f:
        assert f.read() == original
    after = store.scan("s")
    assert (after.damage.kind, after.damage.offset, after.unmarked_quarantines) == (
        before.damage.kind, before.damage.offset, [])
