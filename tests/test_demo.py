"""``sessionlog demo``, run as a new user would: it must say true things about files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sessionlog", "demo", *args], capture_output=True, text=True,
                          timeout=120)


def test_demo_prints_whole_json_and_no_path_it_deletes():
    r = run_demo()
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith('{"')]
    assert len(lines) >= 7  # the repair report and the records around the crash
    for line in lines:
        json.loads(line)  # never cut mid-value
    for path in re.findall(r"/[^\s\"']*sessionlog-demo-[^\s\"']*", r.stdout):
        assert os.path.exists(path), f"the demo printed {path} and then deleted it"


def test_demo_keep_prints_paths_that_exist(tmp_path):
    r = run_demo("--keep")
    assert r.returncode == 0, r.stderr
    paths = re.findall(r"/[^\s\"':]*sessionlog-demo-[^\s\"':]*", r.stdout)
    assert any(p.endswith(".quarantine") for p in paths)
    try:
        for path in paths:
            assert os.path.exists(path), path
        # The torn record is the one the crashed writer was writing: the seq after the
        # last durable record.
        quarantine = next(p for p in paths if p.endswith(".quarantine"))
        log = quarantine[: quarantine.index(".jsonl") + len(".jsonl")]
        with open(quarantine, "rb") as f:
            torn = f.read()
        cut_after = int(re.search(rb'"seq":(\d+)', torn).group(1))
        with open(log, "rb") as f:
            records = [json.loads(line) for line in f]
        truncated = next(r for r in records if r["type"] == "log/truncated")
        assert cut_after == truncated["seq"]  # it took the seq the torn record never got
    finally:
        roots = {re.match(r"(.*/sessionlog-demo-[^/]+)", p).group(1) for p in paths}
        for root in roots:
            subprocess.run(["rm", "-r", root], check=False)
