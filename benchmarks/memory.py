"""Peak memory of ``sessionlog scan --json`` and of ``sessionlog show --format openai
--check`` on a log of at least 1 GB, in a child process.

A scan streams: its memory is bounded by the record limit (and the read chunk), not by
the log. ``show`` streams too (two passes, see ``sessionlog.projection.stream_view``): it
holds the session's call ids, not its records. The bench writes a JSONL session of
``size_mb`` MB into its temp directory (the generated transcript's records replayed with
fresh ``seq`` values and, each time round, fresh call ids, as a long session has), runs
each command on it as a child process, reads the child's own peak RSS from ``os.wait4``,
and deletes the file. The same command on a one-turn log gives the interpreter's baseline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from sessionlog.scan import DEFAULT_LIMITS

from .scans import Corpus

BOUND_RECORD_LIMITS = 32
"""The bar: peak RSS above the small-log baseline stays within this many record limits
(32 MiB at the default 1 MiB limit) however large the log."""

SHOW_BOUND_BYTES = 100_000_000
"""The bar of ``show --format openai --check``: peak RSS within 100 MB on the large log
(issue 12: "bounded (<= 100 MB) on a 1 GB log")."""


def scan_command() -> list[str]:
    """``sessionlog scan --json`` from this interpreter's environment."""
    return [*_sessionlog(), "scan", "--json"]


def show_command() -> list[str]:
    """``sessionlog show --format openai --check`` from this interpreter's environment."""
    return [*_sessionlog(), "show", "--format", "openai", "--check"]


def _sessionlog() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "sessionlog")
    if os.path.exists(script):
        return [script]
    found = shutil.which("sessionlog")
    if found:
        return [found]
    return [sys.executable, "-m", "sessionlog.cli"]


def write_log(path: str, corpus: Corpus, size_bytes: int) -> tuple[int, int]:
    """Write a session log of at least ``size_bytes`` at ``path``; returns (records, bytes)."""
    session_id = os.path.basename(path).removesuffix(".jsonl")
    # Each body line starts with '{"seq":N,'; everything from that first comma is kept.
    tails = [line[line.index(b","):] + b"\n" for line in corpus.body]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        header = corpus.header(session_id) + b"\n"
        os.write(fd, header)
        written, seq = len(header), 1
        chunk: list[bytes] = []
        chunk_bytes = 0
        n = len(tails)
        ends_turn = [b'"type":"turn/end"' in tail for tail in tails]
        done = False
        while not done:
            seq += 1
            i = (seq - 2) % n
            tail = tails[i]
            if seq - 2 >= n:  # call ids are unique in a session: each time round gets its own
                tail = tail.replace(b':"call_', b':"call_%dx' % ((seq - 2) // n))  # values, not "call_id"
            line = b'{"seq":%d%s' % (seq, tail)
            done = written + len(line) >= size_bytes and ends_turn[i]  # whole turns: it scans clean
            chunk.append(line)
            chunk_bytes += len(line)
            written += len(line)
            if chunk_bytes >= 4 << 20 or done:
                data = memoryview(b"".join(chunk))
                while data:
                    data = data[os.write(fd, data):]
                chunk, chunk_bytes = [], 0
    finally:
        os.close(fd)
    return seq, written


# Runs argv[1:] as its child and prints {"code", "maxrss_kib", "stdout", "stderr"} as JSON.
# This small process is the CLI's parent: Linux counts a child's RSS from its fork, so a
# child forked straight from the bench (which holds the corpus) would report the bench's size.
# With --discard-stdout first, the child's stdout goes to /dev/null ("stdout" is empty).
_PEAK_OF_CHILD = """
import json, os, subprocess, sys, tempfile
discard = sys.argv[1] == "--discard-stdout"
argv = sys.argv[2:] if discard else sys.argv[1:]
with tempfile.TemporaryFile() as err:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL if discard else subprocess.PIPE, stderr=err)
    out = b""
    if not discard:
        with proc.stdout:
            out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err.seek(0)
    json.dump({"code": proc.returncode, "maxrss_kib": usage.ru_maxrss, "stdout": out.decode("utf-8", "replace"),
               "stderr": err.read().decode("utf-8", "replace")}, sys.stdout)
"""


def run_with_rusage(argv: list[str], *, discard_stdout: bool = False) -> tuple[int, int, float, str, str]:
    """Run ``argv`` as a child; return (exit code, its own peak RSS in bytes, seconds,
    stdout, stderr). The peak comes from ``os.wait4`` on that child alone, taken by a
    small intermediate interpreter (see ``_PEAK_OF_CHILD``). ``discard_stdout``: the
    child writes to /dev/null (stdout comes back empty)."""
    start = time.perf_counter()
    flag = ["--discard-stdout"] if discard_stdout else []
    proc = subprocess.run([sys.executable, "-c", _PEAK_OF_CHILD, *flag, *argv], capture_output=True, check=True)
    seconds = time.perf_counter() - start
    report = json.loads(proc.stdout)
    # ru_maxrss is in KiB on Linux.
    return report["code"], report["maxrss_kib"] * 1024, seconds, report["stdout"], report["stderr"]


def measure_scan_memory(directory: str, corpus: Corpus, size_mb: int) -> dict[str, Any]:
    """Peak RSS of the CLI scanning a ``size_mb`` MB log and a one-turn log."""
    work = os.path.join(directory, "memory")
    os.makedirs(work, mode=0o700, exist_ok=True)
    small = os.path.join(work, "small.jsonl")
    big = os.path.join(work, "big.jsonl")
    try:
        t0 = time.perf_counter()
        write_log(small, corpus, 1)
        records, nbytes = write_log(big, corpus, size_mb * 1_000_000)
        gen_seconds = time.perf_counter() - t0
        cmd = scan_command()
        code_small, rss_small, _, _, _ = run_with_rusage([*cmd, small])
        code, rss, seconds, out, err = run_with_rusage([*cmd, big])
        show = measure_show_memory(small, big)
        row: dict[str, Any] = {}
        try:
            row = json.loads(out.splitlines()[0]) if out.strip() else {}
        except ValueError:
            pass
        bound = BOUND_RECORD_LIMITS * DEFAULT_LIMITS.record_limit
        return {
            "command": " ".join([os.path.basename(cmd[0]), *cmd[1:]]),
            "log_bytes": nbytes,
            "log_records": records,
            "scanned_records": row.get("records"),
            "status": row.get("status"),
            "exit_code": code,
            "exit_code_small": code_small,
            "stderr": err.strip()[-500:] or None,
            "seconds": seconds,
            "records_per_s": records / seconds if seconds > 0 else None,
            "mb_per_s": nbytes / seconds / 1e6 if seconds > 0 else None,
            "peak_rss_bytes": rss,
            "baseline_rss_bytes": rss_small,
            "growth_bytes": rss - rss_small,
            "bound_bytes": bound,
            "generate_seconds": gen_seconds,
            "show": show,
        }
    finally:
        for path in (small, big):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        shutil.rmtree(work, ignore_errors=True)


def measure_show_memory(small: str, big: str) -> dict[str, Any]:
    """Peak RSS of ``show --format openai --check`` (the view written to /dev/null) on the
    large log ``big`` and on the one-turn log ``small``."""
    cmd = show_command()
    code_small, rss_small, _, _, _ = run_with_rusage([*cmd, small], discard_stdout=True)
    code, rss, seconds, _, err = run_with_rusage([*cmd, big], discard_stdout=True)
    # Its notes (one per renamed call, say) are not the point: keep the last line.
    last = [line for line in err.strip().splitlines() if not line.startswith("note: ")][-1:]
    nbytes = os.path.getsize(big)
    return {
        "command": " ".join([os.path.basename(cmd[0]), *cmd[1:]]),
        "log_bytes": nbytes,
        "exit_code": code,
        "exit_code_small": code_small,
        "stderr": last[0][-500:] if last else None,
        "seconds": seconds,
        "mb_per_s": nbytes / seconds / 1e6 if seconds > 0 else None,
        "peak_rss_bytes": rss,
        "baseline_rss_bytes": rss_small,
        "growth_bytes": rss - rss_small,
        "bound_bytes": SHOW_BOUND_BYTES,
    }
