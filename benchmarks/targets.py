"""The targets: each a bar on a ratio of two medians measured in the same run.

A target is not a timed test: a run reports each one as PASS, MISS, SKIP (one side was
not measured: the thing does not exist yet) or INFO (reported without a bar). The Zstd
ratio, the per-event encode targets and the memory bounds compare against a fixed number,
as the issues set them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .rounds import Result


@dataclass(frozen=True, slots=True)
class Target:
    """``numerator / denominator >= bar`` (``denominator`` None: against ``constant``)."""

    id: str
    description: str
    numerator: str
    denominator: str | None
    bar: float | None
    constant: float = 1.0


def file_backend_targets(backend: str) -> list[Target]:
    return [
        Target(f"{backend}-append-1", f"{backend} durable append, batch 1, session handle / raw 1 per sync",
               f"append/{backend}/batch-1", "ceiling/sync-1", 0.9),
        Target(f"{backend}-append-64", f"{backend} durable append, batch 64 / raw 64 per sync",
               f"append/{backend}/batch-64", "ceiling/sync-64", 0.85 if backend == "jsonl" else 0.7),
        Target(f"{backend}-append-1024", f"{backend} durable append, batch 1024 / raw 1024 per sync",
               f"append/{backend}/batch-1024", "ceiling/sync-1024", 0.5),
        Target(f"{backend}-oneshot-1", f"{backend} one-shot store.append (lock per call) / raw 1 per sync",
               f"append/{backend}/oneshot-1", "ceiling/sync-1", None),
        Target(f"{backend}-sessions-100", f"{backend} 100 sessions round-robin / raw 1 per sync",
               f"append/{backend}/sessions-100", "ceiling/sync-1", None),
        *write_behind_targets(backend),
    ]


def write_behind_targets(backend: str) -> list[Target]:
    """Write-behind on any backend: group commit at 64 producers, submit()+flush() within
    20% of await append() at 64, and one producer against a direct durable append (what
    the hop to the writer costs)."""
    return [
        Target(f"{backend}-write-behind-64", f"{backend} write-behind, 64 producers / durable batch 1",
               f"write-behind/{backend}/producers-64", f"append/{backend}/batch-1", 10.0),
        Target(f"{backend}-submit-flush-64", f"{backend} write-behind, 64 producers: submit+flush / await append",
               f"write-behind/{backend}/submit-flush-64", f"write-behind/{backend}/producers-64", 0.8),
        Target(f"{backend}-write-behind-1", f"{backend} write-behind, 1 producer awaiting each / durable batch 1",
               f"write-behind/{backend}/producers-1", f"append/{backend}/batch-1", 0.9),
    ]


def write_behind_group_target(backend: str) -> Target:
    """Cross-session group commit through the writer (SQL): 100 sessions x 1 producer."""
    return Target(f"{backend}-write-behind-group-100",
                  f"{backend} write-behind, 100 sessions x 1 producer: group commit / a commit per session",
                  f"write-behind/{backend}/sessions-100", f"write-behind/{backend}/sessions-per-session-100", 5.0)


def all_targets(backends: list[str]) -> list[Target]:
    """Every target of a run over ``backends`` (names), in report order."""
    out: list[Target] = []
    for name in ("jsonl", "zstd"):
        if name in backends:
            out.extend(file_backend_targets(name))
    if "sqlite" in backends:
        out += [
            Target("sqlite-commit-1", "sqlite backend batch 1 / stdlib sqlite3 read tail+insert+commit",
                   "append/sqlite/batch-1", "peer/sqlite3/tail-commit-1", 0.8),
            Target("sqlite-executemany-1024", "sqlite backend batch 1024 / stdlib sqlite3 executemany 1024",
                   "append/sqlite/batch-1024", "peer/sqlite3/executemany-1024", 0.85),
            *write_behind_targets("sqlite"),
            write_behind_group_target("sqlite"),
            Target("sqlite-group-100", "sqlite 100 sessions x 1 event: one append_group / a commit per session",
                   "append/sqlite/group-100", "append/sqlite/sessions-100", 5.0),
        ]
    if "postgresql" in backends:
        out += [
            Target("postgresql-append-1", "postgresql batch 1 / stdlib sqlite3 read tail+insert+commit",
                   "append/postgresql/batch-1", "peer/sqlite3/tail-commit-1", None),
            Target("postgresql-group-100",
                   "postgresql 100 sessions x 1 event: one append_group / a commit per session",
                   "append/postgresql/group-100", "append/postgresql/sessions-100", 5.0),
            write_behind_group_target("postgresql"),
        ]
    if "jsonl" in backends:
        out.append(Target("jsonl-scan", "jsonl store.scan / msgspec decoding the same lines alone",
                          "scan/jsonl", "scan/msgspec-baseline", 0.6))
    if "zstd" in backends:
        out += [
            Target("zstd-scan", "zstd store.scan, 64 records per frame / msgspec decoding the JSONL lines alone",
                   "scan/zstd", "scan/msgspec-baseline", 0.6),
            Target("zstd-ratio", "zstd compression ratio >= 3.5x at 64 records per frame",
                   "compression/zstd/stored-64", None, 1.0, constant=3.5),
        ]
    out += shape_targets()
    out += zstd_shape_targets()
    out += encode_targets()
    out += [
        Target("agents-adapter", "Agents SDK SessionLogSession (jsonl) / SQLiteSession, add_items of 1 item",
               "adapter/openai-agents/add-items-1", "peer/openai-agents/add-items-1", 1.5),
        Target("agents-adapter-turn", "Agents SDK SessionLogSession (jsonl) / SQLiteSession, add_items of a turn",
               "adapter/openai-agents/add-items-turn", "peer/openai-agents/add-items-turn", 1.5),
    ]
    return out


def shape_targets() -> list[Target]:
    """Each adversarial log shape scans within 3x of the same records compact (bytes/s)."""
    from .scans import SHAPES, shape_id

    return [Target(f"scan-shape-{shape}", f"scan, {what} / compact", shape_id(shape), shape_id("compact"), 1 / 3)
            for shape, what in SHAPES.items() if shape != "compact"]


def zstd_shape_targets() -> list[Target]:
    """Each Zstd frame shape scans within 3x of 64-record frames (bytes/s of content)."""
    from .scans import ZSTD_SHAPES, zstd_shape_id

    return [Target(f"zstd-shape-{shape}", f"zstd scan, {what} / 64 records per frame", zstd_shape_id(shape),
                   zstd_shape_id("frames-64"), 1 / 3)
            for shape, what in ZSTD_SHAPES.items() if shape != "frames-64"]


def encode_targets() -> list[Target]:
    """The Python work per event of ``encode_batch`` (flat: <= 0.6 µs, transcript: <= 1.2 µs,
    as events/s against a constant), each adversarial batch within 4x of the transcript
    batch's bytes/s, and batches 4x larger at least half as fast in bytes/s as at 1x (no
    shape or size takes the encoder quadratic)."""
    from .encodes import SCALED, SHAPES, encode_id, floor_id, scaled_id
    from .encodes import shape_id as encode_shape_id

    return [
        Target("encode-flat", "encode_batch of flat events: <= 0.6 µs of Python work per event",
               encode_id("flat"), None, 1.0, constant=1e6 / 0.6),
        Target("encode-transcript", "encode_batch of transcript events: <= 1.2 µs per event",
               encode_id("transcript"), None, 1.0, constant=1e6 / 1.2),
        # The µs bars above are absolute: a slower CPU misses them with the same code. These
        # read the same runs against msgspec encoding the same events on the same CPU.
        Target("encode-flat-floor", "encode_batch of flat events / msgspec encode_lines alone (same events)",
               encode_id("flat"), floor_id("flat"), None),
        Target("encode-transcript-floor", "encode_batch of transcript events / msgspec encode_lines alone",
               encode_id("transcript"), floor_id("transcript"), None),
        *(Target(f"encode-shape-{shape}", f"encode_batch, {what} / transcript events (bytes/s)",
                 encode_shape_id(shape), encode_shape_id("transcript"), 1 / 4)
          for shape, (what, _) in SHAPES.items()),
        *(Target(f"encode-scale-{what}", f"encode_batch, {big} / {small} (bytes/s): linear in size",
                 scaled_id(what, 4), scaled_id(what, 1), 1 / 2)
          for what, (small, big) in SCALED.items()),
    ]


def evaluate(targets: list[Target], results: dict[str, Result]) -> list[dict[str, Any]]:
    """Each target with its measured ratio and verdict (PASS, MISS, SKIP, INFO).

    For a target against a constant the ratio shown is ``value / constant`` scaled back:
    ``ratio`` is the measured value over the constant and ``bar`` is 1.0, so "0.62" reads
    as "62% of the way"; ``value`` carries the measured figure itself."""
    rows = []
    for t in targets:
        num = results.get(t.numerator)
        den = results.get(t.denominator) if t.denominator is not None else None
        row: dict[str, Any] = {
            "id": t.id, "description": t.description, "numerator": t.numerator, "denominator": t.denominator,
            "bar": t.bar, "ratio": None, "value": None, "verdict": "SKIP", "reason": None,
        }
        if t.denominator is None:
            row["constant"] = t.constant
        missing = [r for r, rid in ((num, t.numerator), (den, t.denominator))
                   if rid is not None and (r is None or r.status != "ok" or not r.median)]
        if missing or num is None:
            reasons = []
            for rid in (t.numerator, t.denominator):
                if rid is None:
                    continue
                r = results.get(rid)
                if r is None:
                    reasons.append(f"{rid} not measured")
                elif r.status != "ok" or not r.median:
                    reasons.append(f"{rid}: {r.reason or r.status}")
            row["reason"] = "; ".join(reasons)
            rows.append(row)
            continue
        assert num.median is not None
        row["value"] = num.median
        ratio = num.median / (den.median if den is not None and den.median else t.constant)
        row["ratio"] = ratio
        row["verdict"] = "INFO" if t.bar is None else ("PASS" if ratio >= t.bar else "MISS")
        rows.append(row)
    return rows


def memory_target(memory: dict[str, Any] | None) -> dict[str, Any]:
    """The memory bound as a target row: the scan read every record of the large log, and
    its peak RSS grew over the small-log baseline by at most the bound (a multiple of the
    record limit): ``ratio`` is growth / bound, which must be <= 1 (``bar_op``)."""
    row: dict[str, Any] = {
        "id": "scan-memory", "description": "CLI scan of a large log: peak RSS growth within 32 record limits",
        "numerator": "memory.growth_bytes", "denominator": "memory.bound_bytes", "bar": None,
        "ratio": None, "value": None, "verdict": "SKIP", "reason": None,
    }
    if not memory:
        row["reason"] = "not measured"
        return row
    if memory.get("exit_code") != 0 or memory.get("scanned_records") != memory.get("log_records"):
        row["verdict"] = "MISS"
        row["reason"] = (f"scan exited {memory.get('exit_code')} with {memory.get('scanned_records')} of "
                         f"{memory.get('log_records')} records: {memory.get('stderr')}")
        return row
    growth, bound = memory["growth_bytes"], memory["bound_bytes"]
    row["value"] = growth
    row["ratio"] = growth / bound  # lower is better: at most 1.0
    row["bar"] = 1.0
    row["bar_op"] = "<="
    row["verdict"] = "PASS" if growth <= bound else "MISS"
    return row


def show_memory_target(memory: dict[str, Any] | None) -> dict[str, Any]:
    """``show --format openai --check`` of the large log: peak RSS within the bound (100 MB,
    issue 12): ``ratio`` is peak / bound, which must be <= 1; the growth over the one-turn
    log is in the memory section."""
    show = (memory or {}).get("show")
    row: dict[str, Any] = {
        "id": "show-memory", "description": "CLI show --format openai --check of a large log: peak RSS <= 100 MB",
        "numerator": "memory.show.peak_rss_bytes", "denominator": "memory.show.bound_bytes", "bar": None,
        "ratio": None, "value": None, "verdict": "SKIP", "reason": None,
    }
    if not show:
        row["reason"] = "not measured"
        return row
    if show.get("exit_code") != 0:
        row["verdict"] = "MISS"
        row["reason"] = f"show exited {show.get('exit_code')}: {show.get('stderr')}"
        return row
    peak, bound = show["peak_rss_bytes"], show["bound_bytes"]
    row["value"] = peak
    row["ratio"] = peak / bound  # lower is better: at most 1.0
    row["bar"] = 1.0
    row["bar_op"] = "<="
    row["verdict"] = "PASS" if peak <= bound else "MISS"
    return row
