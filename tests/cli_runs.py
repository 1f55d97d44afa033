"""The command line run in-process, for tests of what it prints and exits."""

from __future__ import annotations

import io
import json

from sessionlog.cli import main


def run(*args: str) -> tuple[int, str]:
    """``sessionlog ARGS``: its exit code and standard output."""
    out = io.StringIO()
    code = main(list(args), out)
    return code, out.getvalue()


def scan(path) -> tuple[int, dict]:
    """``sessionlog scan PATH --json`` of one file: its exit code and its one row."""
    code, out = run("scan", str(path), "--json")
    [row] = [json.loads(r) for r in out.splitlines() if r.strip()]
    return code, row
