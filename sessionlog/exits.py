"""The command line's exit codes (docs/cli.md) and how several combine."""

from __future__ import annotations

from collections.abc import Iterable

OK = 0
REPAIRABLE = 1
USAGE = 2
NEEDS_FORCE = 3
ERROR = 4
LOCKED = 5

_SEVERITY = {OK: 0, REPAIRABLE: 1, NEEDS_FORCE: 2, LOCKED: 3, ERROR: 4}


def worst(codes: Iterable[int]) -> int:
    """The exit code of several sessions: 4 over 5 over 3 over 1 over 0 (0 for none)."""
    return max(codes, key=_SEVERITY.__getitem__, default=OK)
