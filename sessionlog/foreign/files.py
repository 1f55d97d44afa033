"""The file work of a foreign repair, over sessionlog's one I/O seam (:mod:`sessionlog.durable`).

In order, each step durable before the next:

1. the original bytes are published beside the file as ``<file>.<stamp>-<random>.orig``
   (temp, fsync, link, directory fsync): whatever happens next, they are there;
2. the lines a repair removes are published as ``<file>.<offset>.<kind>.<stamp>-<random>.quarantine``;
3. the repaired file is either appended durably (when the repair only adds lines at the
   end: every existing byte stays where it is) or published in place atomically (temp,
   fsync, rename over the file only if it is still the one that was read, directory fsync).

A crash before step 3 leaves the file as it was; after it, the new file whole.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from dataclasses import dataclass

from ..contract import IOFailure
from ..durable import OS, O_NOFOLLOW, FileSystem, durable_append, publish_new, publish_replace, quarantine_name
from . import Examination, ForeignFormat
from .plan import appended_bytes, apply


@dataclass(slots=True)
class Snapshot:
    """A file's bytes and the ``stat`` they were read under."""

    path: str
    data: bytes
    stat: os.stat_result


def read(path: str, fs: FileSystem = OS) -> Snapshot:
    """Read the whole file (never following a symlink, never blocking on a FIFO). Raises
    IOFailure, also for anything but a regular file."""
    try:
        fd = fs.open(path, os.O_RDONLY | os.O_NONBLOCK | O_NOFOLLOW)
        try:
            st = fs.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IOFailure(f"{path}: not a regular file")
            chunks = []
            offset = 0
            while True:
                chunk = fs.pread(fd, 1 << 20, offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
        finally:
            fs.close(fd)
    except OSError as exc:
        raise IOFailure(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return Snapshot(path, b"".join(chunks), st)


OpenFiles = dict[tuple[int, int], list[str]]
"""(st_dev, st_ino) of every file another live process holds open -> who holds it."""


def open_files() -> OpenFiles:
    """Which files other live processes hold open, from ``/proc/<pid>/fd`` (one pass over
    every process this user may inspect; others are not seen)."""
    found: OpenFiles = {}
    me = os.getpid()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        if int(pid) == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        seen: set[tuple[int, int]] = set()
        for fd in fds:
            try:
                st = os.stat(os.path.join(fd_dir, fd))
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                found.setdefault(key, []).append(f"process {pid} ({_command(pid)}) holds it open")
    return found


def holders(path: str, index: OpenFiles | None = None) -> list[str]:
    """Other live processes holding ``path`` open, one sentence each (``index``: an
    :func:`open_files` taken earlier, else a fresh one)."""
    try:
        target = os.stat(path)
    except OSError:
        return []
    index = open_files() if index is None else index
    return list(index.get((target.st_dev, target.st_ino), ()))


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def in_use(path: str, fmt: ForeignFormat, index: OpenFiles | None = None) -> list[str]:
    """Why ``path`` is in use by a live process: it is held open (``index`` as for
    :func:`holders`), or the tool's own per-process records name it. Empty when nothing
    says so."""
    return holders(path, index) + fmt.live_records(path)


def backup_name(name: str) -> str:
    """A never-reused sibling name for the original bytes of ``name``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{name}.{stamp}-{secrets.token_hex(4)}.orig"


@dataclass(slots=True)
class Written:
    """Where a repair put things: the ``backup`` of the original bytes, the ``quarantine``
    of removed lines (None when none were), and whether it only ``appended``."""

    backup: str
    quarantine: str | None
    appended: bool


def write_repair(snapshot: Snapshot, exam: Examination, fs: FileSystem = OS) -> Written:
    """Carry out ``exam.plan`` on the file ``snapshot`` was read from (steps 1-3 above).

    Raises IOFailure (nothing is changed when the file changed since it was read)."""
    path = snapshot.path
    directory, name = os.path.split(os.path.abspath(path))
    plan = exam.plan
    try:
        backup = backup_name(name)
        publish_new(fs, directory, backup, [snapshot.data])
        quarantine = None
        removed = sorted(set(plan.drop) | set(plan.cut))
        if removed:
            first = removed[0]
            quarantine = quarantine_name(name, exam.lines[first].offset, plan.drop.get(first, "torn"))
            publish_new(fs, directory, quarantine, plan.quarantined(exam.lines))
        if plan.appends_only(exam.lines):
            fd = fs.open(path, os.O_WRONLY | os.O_APPEND | O_NOFOLLOW)
            try:
                st = fs.fstat(fd)
                if (st.st_ino, st.st_size, st.st_mtime_ns) != (
                        snapshot.stat.st_ino, snapshot.stat.st_size, snapshot.stat.st_mtime_ns):
                    raise FileExistsError(0, "changed since it was read; nothing appended", path)
                durable_append(fs, fd, appended_bytes(exam.lines, plan), st.st_size)
            finally:
                fs.close(fd)
        else:
            publish_replace(fs, directory, name, apply(exam.lines, plan), expect=snapshot.stat)
    except OSError as exc:
        raise IOFailure(f"{path}: repair not written: {exc.strerror or exc}") from exc
    return Written(os.path.join(directory, backup),
                   os.path.join(directory, quarantine) if quarantine else None, plan.appends_only(exam.lines))
