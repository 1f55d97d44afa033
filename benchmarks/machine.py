"""The machine a run was measured on: CPUs, kernel, and the file system under the temp dir.

Durable-append figures are figures of a device and a file system as much as of code;
every report carries where it came from.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _unescape_mount(path: str) -> str:
    # /proc mount paths escape space, tab, newline and backslash as octal.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def mount_of(path: str) -> dict[str, str]:
    """The mount holding ``path``: its mount point, file system type, device and options
    (empty where /proc/self/mountinfo is not available)."""
    real = os.path.realpath(path)
    best: dict[str, str] = {}
    best_len = -1
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        rest = right.split()
        if len(fields) < 6 or len(rest) < 2:
            continue
        point = _unescape_mount(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best_len:
            best_len = len(point)
            best = {
                "mount_point": point,
                "fs_type": rest[0],
                "device": rest[1],
                "options": fields[5] + ("," + rest[2] if len(rest) > 2 else ""),
            }
    return best


def describe(temp_dir: str) -> dict[str, Any]:
    """What to print next to the figures: nproc, CPU model, kernel, Python, memory, and the
    file system of ``temp_dir`` (where every benchmark file lives)."""
    mem_total = None
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    mount = mount_of(temp_dir)
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": _cpu_model(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "memory_bytes": mem_total,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "temp_dir": temp_dir,
        "fs_type": mount.get("fs_type"),
        "fs_device": mount.get("device"),
        "fs_mount_point": mount.get("mount_point"),
        "fs_options": mount.get("options"),
    }
