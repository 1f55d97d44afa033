"""The device ceiling: raw ``os.write`` + ``os.fdatasync`` of the same bytes a log holds.

No engine, no encoding, no lock: one ``write`` of ``per_sync`` record lines (the append
benchmarks' own records, about 300 bytes each) and one ``fdatasync``, appended to a file
in the bench directory. Every durable-append figure is read against this line, measured
in the same rounds.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from .rounds import Case, Work

SYNC_SIZES = (1, 64, 1024)


def ceiling_id(per_sync: int) -> str:
    return f"ceiling/sync-{per_sync}"


def ceiling_cases(directory: str, lines: list[bytes], stack: contextlib.ExitStack) -> list[Case]:
    """One case per size in :data:`SYNC_SIZES`; files are closed and removed by ``stack``."""
    cases = []
    for per_sync in SYNC_SIZES:
        path = os.path.join(directory, f"ceiling-{per_sync}.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        stack.callback(os.unlink, path)
        stack.callback(os.close, fd)
        blocks = [
            b"".join(lines[(k * per_sync + i) % len(lines)] + b"\n" for i in range(per_sync))
            for k in range(max(1, min(8, len(lines) // per_sync)))
        ]
        cases.append(Case(
            id=ceiling_id(per_sync),
            group="ceiling",
            label=f"raw write+fdatasync, {per_sync} per sync",
            op=_writer(fd, blocks, per_sync),
            reset=_truncater(fd),
            meta={"per_sync": per_sync, "record_bytes": sum(map(len, blocks)) / len(blocks) / per_sync},
        ))
    return cases


def _writer(fd: int, blocks: list[bytes], per_sync: int) -> Callable[[], Work]:
    state = [0]
    n = len(blocks)

    def op() -> Work:
        block = blocks[state[0] % n]
        state[0] += 1
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view):]
        os.fdatasync(fd)
        return per_sync, len(block)

    return op


def _truncater(fd: int) -> Callable[[], None]:
    def reset() -> None:
        os.ftruncate(fd, 0)

    return reset
