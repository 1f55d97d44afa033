"""One benchmark run: set up every case, run them in interleaved rounds, build the document.

The document (what ``--json`` prints) holds the machine, the settings, every result by
id, the memory measurement and the targets; the table, markdown and plot render it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sessionlog.events import encode_record

from . import appends, ceiling, encodes, memory, peers, scans
from .machine import describe
from .rounds import Case, Result, run_interleaved
from .targets import all_targets, evaluate, memory_target, show_memory_target
from .transcript import small_events

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class Settings:
    """How big and how long a run is. ``smoke`` is CI's few-second run."""

    rounds: int = 9
    seconds: float = 0.5
    scan_records: int = 200_000
    repair_mb: float = 100.0
    memory_mb: int = 1024
    record_bytes: int = 300
    postgres_url: str | None = None
    backends: tuple[str, ...] | None = None
    peers: bool = True
    smoke: bool = False

    @classmethod
    def smoke_run(cls, **overrides: Any) -> Settings:
        base = dict(rounds=2, seconds=0.02, scan_records=2_000, repair_mb=0.5, memory_mb=2, smoke=True)
        base.update(overrides)
        return cls(**base)


def redact(url: str) -> str:
    """A URL without its password."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _order(case: Case) -> tuple[int, int]:
    """Round order: cases compared with each other run next to each other."""
    batch = case.meta.get("batch") or case.meta.get("per_sync") or 0
    rank = {"ceiling": 0, "append": 1, "peer": 2, "sessions": 3, "write-behind": 4, "scan": 5, "scan-shape": 6,
            "zstd-shape": 7, "repair": 8}
    if case.group in ("ceiling", "append", "peer"):
        return ({1: 0, 64: 1, 1024: 2}.get(batch, 3), rank[case.group])
    if case.group == "write-behind" and case.meta.get("producers") == 1:
        return (0, rank["append"])  # right after the direct batch-1 append it is compared with
    return (3 + rank.get(case.group, 9), 0)


def run(settings: Settings, directory: str, progress: Callable[[str], None], command: str) -> dict[str, Any]:
    """Run the benchmarks in a fresh temp directory under ``directory``; return the document.

    Everything the run writes lives in that temp directory, which is removed at the end
    (PostgreSQL sessions made by the run are deleted)."""
    started = time.time()
    tmp = tempfile.mkdtemp(prefix="sessionlog-bench-", dir=directory)
    try:
        with contextlib.ExitStack() as stack:
            doc = _run(settings, tmp, progress, stack)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["command"] = command
    doc["started"] = datetime.datetime.fromtimestamp(started, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    doc["seconds"] = round(time.time() - started, 1)
    return doc


def _run(settings: Settings, tmp: str, progress: Callable[[str], None], stack: contextlib.ExitStack) -> dict[str, Any]:
    machine = describe(tmp)
    pool = small_events(2048, seed=1, size=settings.record_bytes)
    ts = time.time()
    lines = [encode_record(e, 1_000_000 + i, ts) for i, e in enumerate(pool)]
    record_bytes = sum(len(x) + 1 for x in lines) / len(lines)

    cases: list[Case] = []
    results: list[Result] = []
    progress("opening backends")
    backends = appends.open_backends(tmp, settings.postgres_url, settings.backends, stack)
    cases += ceiling.ceiling_cases(tmp, lines, stack)
    for backend in backends:
        progress(f"setting up appends: {backend.name}")
        c, r = appends.append_cases(backend, pool, record_bytes, stack)
        cases += c
        results += r
        if backend.store is not None:
            c, r = appends.write_behind_cases(backend, pool, record_bytes, stack)
        else:
            r = [appends.skipped(appends.write_behind_id(backend.name, p, mode), "write-behind",
                                 f"{backend.name}: write-behind, {p} producers ({mode})",
                                 backend.reason or "not available")
                 for mode in ("producers", "submit-flush") for p in appends.PRODUCERS]
            c = []
        cases += c
        results += r
    if settings.peers:
        cases += peers.sqlite3_cases(tmp, lines, stack)
        texts = [e.get("content") or e.get("output") or "" for e in pool]
        c, r = peers.agents_cases(tmp, texts, stack)
        cases += c
        results += r
        c, r = peers.agents_adapter_cases(tmp, texts, stack)
        cases += c
        results += r

    progress(f"generating the transcript ({settings.scan_records:,}+ records, {settings.repair_mb:g}+ MB)")
    corpus = scans.make_corpus(settings.scan_records, int(settings.repair_mb * 1e6))
    progress("importing it into each backend")
    c, r, made = scans.scan_cases(backends, corpus)
    cases += c
    results += r
    jsonl = next((b for b in backends if b.name == "jsonl" and "jsonl" in made), None)
    if jsonl is not None:
        baseline_path = jsonl.store.path_of(made["jsonl"][0])
    else:
        baseline_path = os.path.join(tmp, "baseline.jsonl")
        with open(baseline_path, "wb") as f:
            f.write(corpus.header("baseline") + b"\n")
            f.writelines(line + b"\n" for line in corpus.body)
    cases.append(scans.msgspec_case(baseline_path, corpus.count()))
    cases += scans.shape_cases(corpus, max_bytes=2 << 20 if settings.smoke else 16 << 20)
    cases += scans.zstd_shape_cases(corpus, max_bytes=2 << 20 if settings.smoke else 16 << 20)
    cases += encodes.encode_cases()
    c, r = scans.repair_cases(backends, corpus)
    cases += c
    results += r
    progress("compression ratios")
    results += scans.compression_results(backends, made, corpus)

    cases.sort(key=_order)
    by_id = run_interleaved(cases, settings.rounds, settings.seconds, progress)
    for res in results:
        by_id.setdefault(res.id, res)

    mem: dict[str, Any] | None = None
    if settings.memory_mb > 0:
        progress(f"scan and show of a {settings.memory_mb} MB log in a child process")
        try:
            mem = memory.measure_scan_memory(tmp, corpus, settings.memory_mb)
        except Exception as exc:
            print(f"bench: memory measurement failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            mem = None

    names = [b.name for b in backends]
    ordered = {rid: by_id[rid] for rid in _report_order(by_id)}
    target_rows = evaluate(all_targets(names), ordered)
    if settings.memory_mb > 0:
        target_rows.append(memory_target(mem))
        target_rows.append(show_memory_target(mem))
    return {
        "schema": SCHEMA_VERSION,
        "machine": machine,
        "config": {
            "rounds": settings.rounds,
            "seconds_per_case_round": settings.seconds,
            "scan_records": corpus.count(),
            "corpus_bytes": corpus.logical_bytes("scan"),
            "record_bytes": record_bytes,
            "memory_mb": settings.memory_mb,
            "smoke": settings.smoke,
        },
        "backends": {
            b.name: {"url": redact(b.url), "status": "measured" if b.store is not None else "skipped",
                     "reason": b.reason}
            for b in backends
        },
        "results": {rid: res.to_json() for rid, res in ordered.items()},
        "memory": mem,
        "targets": target_rows,
    }


def _report_order(by_id: dict[str, Result]) -> list[str]:
    """Table order: by group, then backend (as in the URL list), then batch size."""
    groups = ["ceiling", "append", "sessions", "write-behind", "peer", "scan", "scan-shape", "zstd-shape", "repair",
              "compression", "encode", "encode-shape", "encode-scale"]
    names = ["raw", "jsonl", "zstd", "sqlite", "postgresql"]
    index = {rid: i for i, rid in enumerate(by_id)}

    def key(rid: str) -> tuple[int, int, int, int]:
        res = by_id[rid]
        part = rid.split("/")[1] if "/" in rid else ""
        batch = res.meta.get("batch") or res.meta.get("per_sync") or res.meta.get("records_per_frame") or 0
        return (groups.index(res.group) if res.group in groups else 99,
                names.index(part) if part in names else 50, int(batch), index[rid])

    return sorted(by_id, key=key)
