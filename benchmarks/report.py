"""What a run prints: a table for people (rich), markdown for the README section, a plot.

The JSON document (``--json``) is the run itself (see ``benchmarks.run``); everything here
renders that one document, so the table, the markdown and the plot never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TextIO

# The column "x ref": the figure each row is read against, measured in the same rounds.
GROUP_TITLES = {
    "ceiling": "Device ceiling (raw os.write + os.fdatasync)",
    "append": "Durable appends",
    "sessions": "Many sessions",
    "write-behind": "Write-behind (group commit)",
    "peer": "Peers",
    "scan": "Scan / recovery",
    "scan-shape": "Scan of adversarial log shapes (in memory, bytes/s)",
    "zstd-shape": "Zstd scan of other frame shapes (in memory, bytes/s of content)",
    "repair": "Repair",
    "compression": "Compression",
    "encode": "Encoding an append batch (encode_batch, no I/O)",
    "encode-shape": "Encoding adversarial batches (bytes/s)",
    "encode-scale": "Encoding at two sizes, 4x apart (bytes/s)",
}


def reference_of(rid: str, row: dict[str, Any]) -> str | None:
    """The id of the result a row is compared with in the table (None: no comparison)."""
    group = row.get("group")
    if rid.startswith("adapter/openai-agents/"):
        return "peer/openai-agents/" + rid.rsplit("/", 1)[1]  # the SDK's SQLiteSession, same calls
    if group in ("append", "sessions", "peer") and row.get("batch"):
        return f"ceiling/sync-{row['batch']}"
    if group == "write-behind":
        backend = rid.split("/")[1]
        return f"append/{backend}/batch-1"
    if group == "scan" and rid != "scan/msgspec-baseline":
        return "scan/msgspec-baseline"
    if group == "scan-shape" and rid != "scan-shape/compact":
        return "scan-shape/compact"
    if group == "zstd-shape" and rid != "zstd-shape/frames-64":
        return "zstd-shape/frames-64"
    if group == "encode" and rid in ("encode/flat", "encode/transcript"):
        return "encode/msgspec-" + rid.rsplit("/", 1)[1]  # msgspec alone, the same events
    if group == "encode-shape" and rid != "encode-shape/transcript":
        return "encode-shape/transcript"
    if group == "encode-scale" and rid.endswith("-4x"):
        return "encode-shape/transcript" if rid == "encode-scale/transcript-4x" else rid[:-3] + "-1x"
    return None


def fmt_rate(value: float | None, unit: str = "records/s") -> str:
    if value is None:
        return "—"
    if unit == "x":
        return f"{value:.2f}x"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M/s"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k/s"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k/s"
    return f"{value:.0f}/s"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _rows(doc: dict[str, Any]) -> Iterable[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    results: dict[str, dict[str, Any]] = doc["results"]
    for group, title in GROUP_TITLES.items():
        members = [(rid, row) for rid, row in results.items() if row["group"] == group]
        if group.endswith("-shape"):  # the reference shape first, then the shapes read against it
            members.sort(key=lambda member: reference_of(*member) is not None)
        if members:
            yield title, members


def _cells(doc: dict[str, Any], rid: str, row: dict[str, Any]) -> list[str]:
    """label, median, MB/s, x ref, spread, note."""
    results = doc["results"]
    if row["status"] != "ok":
        return [row["label"], "—", "—", "—", "—", f"{row['status']}: {row['reason']}"]
    median = row["median"]
    ref = reference_of(rid, row)
    ref_row = results.get(ref) if ref else None
    vs = "—"
    if ref_row is not None and ref_row.get("status") == "ok" and ref_row.get("median"):
        vs = f"{median / ref_row['median']:.2f}x"
    rounds = row.get("rounds") or []
    spread = "—"
    if len(rounds) > 1 and median:
        spread = f"±{(max(rounds) - min(rounds)) / 2 / median * 100:.0f}%"
    note = ""
    if row["group"] == "encode" and median:
        note = f"{1e6 / median:.2f} µs per event"
    elif row["group"] in ("repair", "scan") and row.get("seconds_per_op") is not None:
        note = f"{row['seconds_per_op']:.2f} s per pass"
        if row.get("disk_bytes"):
            note += f", {fmt_bytes(row['disk_bytes'])} on disk"
    elif row["group"] == "compression":
        note = f"{fmt_bytes(row.get('logical_bytes'))} -> {fmt_bytes(row.get('disk_bytes'))}"
    mb = "—" if row["unit"] == "x" or row.get("mb_per_s") is None else f"{row['mb_per_s']:.1f}"
    return [row["label"], fmt_rate(median, row["unit"]), mb, vs, spread, note]


def _target_cells(t: dict[str, Any]) -> list[str]:
    ratio = "—" if t["ratio"] is None else f"{t['ratio']:.2f}"
    bar = "—" if t["bar"] is None else f"{t.get('bar_op', '>=')} {t['bar']:.3g}"
    value = ""
    if t.get("constant") is not None and t["value"] is not None:
        value = f" (measured {t['value']:,.2f})" if t["value"] < 100 else f" (measured {t['value']:,.0f}/s)"
    if t["id"] == "scan-memory" and t["value"] is not None:
        value = f" (grew {fmt_bytes(t['value'])})"
    return [t["description"] + value, ratio, bar, t["verdict"], t.get("reason") or ""]


def _machine_line(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    return (f"{m['nproc']} CPUs ({m['cpu_model']}), {m['kernel']}, {m['python']}, "
            f"temp dir on {m['fs_type']} ({m['fs_device']}); {doc['config']['rounds']} interleaved rounds, "
            f"medians; load average at start {', '.join(f'{x:.2f}' for x in m['load_average'] or [])}")


def _memory_line(doc: dict[str, Any]) -> str | None:
    mem = doc.get("memory")
    if not mem:
        return None
    return (f"`{mem['command']}` on a {fmt_bytes(mem['log_bytes'])} log ({mem['log_records']:,} records): "
            f"exit {mem['exit_code']}, {mem['seconds']:.1f} s ({mem['mb_per_s']:.0f} MB/s), peak RSS "
            f"{fmt_bytes(mem['peak_rss_bytes'])} vs {fmt_bytes(mem['baseline_rss_bytes'])} on a one-turn log")


def print_table(doc: dict[str, Any], out: TextIO) -> None:
    """The human report: throughput per group, the memory line, then the targets."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out, width=max(140, Console(file=out).width))
    console.print(f"[bold]sessionlog bench[/bold] — {_machine_line(doc)}")
    table = Table(show_lines=False, title="Median of interleaved rounds (x ref: against the ceiling of the "
                                          "same batch, the durable batch-1 rate, or msgspec)")
    for col, justify in (("case", "left"), ("median", "right"), ("MB/s", "right"), ("x ref", "right"),
                         ("spread", "right"), ("note", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for title, members in _rows(doc):
        table.add_row(f"[bold]{title}[/bold]", "", "", "", "", "")
        for rid, row in members:
            table.add_row(*_cells(doc, rid, row))
    console.print(table)
    line = _memory_line(doc)
    if line:
        console.print(line.replace("`", ""))
    targets = Table(title="Targets (ratios of medians from this run; bars, not timed tests)")
    for col in ("target", "ratio", "bar", "verdict", "why not measured"):
        targets.add_column(col)
    colors = {"PASS": "green", "MISS": "red", "SKIP": "yellow", "INFO": "cyan"}
    for t in doc["targets"]:
        cells = _target_cells(t)
        cells[3] = f"[{colors[t['verdict']]}]{cells[3]}[/]"
        targets.add_row(*cells)
    console.print(targets)


def markdown(doc: dict[str, Any], plot_name: str | None) -> str:
    """The README section: machine, command, throughput table, memory, targets, plot."""
    out = ["## Benchmarks", "",
           f"Measured with `{doc['command']}` on {doc['started']}.", "",
           f"Machine: {_machine_line(doc)}.", "",
           "Every figure is the median of interleaved rounds (A B A B ...) in one run; ratios compare "
           "medians from the same rounds. Absolute figures vary between runs on this shared machine; "
           "the ratios are what to read.", "",
           "| case | median | MB/s | x ref | spread | note |", "|---|---:|---:|---:|---:|---|"]
    for title, members in _rows(doc):
        out.append(f"| **{title}** | | | | | |")
        for rid, row in members:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(doc, rid, row)) + " |")
    out.append("")
    out.append("x ref: the row against the raw ceiling of the same batch size (appends, peers), the durable "
               "batch-1 rate (write-behind), or msgspec decoding the same lines (scans).")
    line = _memory_line(doc)
    if line:
        out += ["", f"Memory: {line}."]
    out += ["", "### Targets", "", "| target | ratio | bar | verdict | why not measured |", "|---|---:|---:|---|---|"]
    for t in doc["targets"]:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in _target_cells(t)) + " |")
    if plot_name:
        out += ["", f"![throughput against batch size and concurrency]({plot_name})"]
    out += ["", "### Reproduce", "",
            "`sessionlog bench` (or `python -m benchmarks` from the repository root) runs everything above "
            "in about five minutes; `--json` prints the run for machines, `--plot FILE.png` draws it (extra "
            "`plot`), `--markdown FILE.md` writes this section, `--postgres URL` adds PostgreSQL, `--dir DIR` "
            "chooses the file system measured, `--smoke` is CI's few-second run. The transcript behind the "
            "scan, repair, memory and compression figures is generated by `benchmarks/transcript.py` "
            "(seeded, deterministic; its parameters are documented there)."]
    return "\n".join(out) + "\n"


def matplotlib_available() -> bool:
    """True when ``--plot`` can draw (the optional ``plot`` extra is installed)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(doc: dict[str, Any], path: str) -> None:
    """Throughput against batch size and against concurrent producers, the ceiling as a
    line. Needs matplotlib (the ``plot`` extra); imported here, lazily."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results: dict[str, dict[str, Any]] = doc["results"]

    def median(rid: str) -> float | None:
        row = results.get(rid)
        return row["median"] if row and row["status"] == "ok" else None

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    batches = [1, 64, 1024]
    ceiling = [median(f"ceiling/sync-{b}") for b in batches]
    if all(v is not None for v in ceiling):
        ax1.plot(batches, ceiling, "k--", linewidth=2, label="raw write+fdatasync (ceiling)")
    for name in doc["backends"]:
        ys = [median(f"append/{name}/batch-{b}") for b in batches]
        pts = [(b, y) for b, y in zip(batches, ys) if y is not None]
        if pts:
            ax1.plot(*zip(*pts), marker="o", label=f"{name} (session handle)")
    peers = [(1, median("peer/sqlite3/tail-commit-1")), (1024, median("peer/sqlite3/executemany-1024"))]
    pts = [(b, y) for b, y in peers if y is not None]
    if pts:
        ax1.plot(*zip(*pts), linestyle=":", marker="s", color="grey", label="stdlib sqlite3 WAL FULL")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xticks(batches, [str(b) for b in batches])
    ax1.set_xlabel("records per durable batch (per fdatasync / commit)")
    ax1.set_ylabel("durable records/s (median)")
    ax1.set_title("Durable appends against batch size")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8)

    producers = [1, 8, 64]
    drew = False
    for name in doc["backends"]:
        ys = [median(f"write-behind/{name}/producers-{p}") for p in producers]
        pts = [(p, y) for p, y in zip(producers, ys) if y is not None]
        if pts:
            ax2.plot(*zip(*pts), marker="o", label=f"{name} write-behind")
            drew = True
        single = median(f"append/{name}/batch-1")
        if single is not None:
            ax2.axhline(single, linestyle=":", linewidth=1, color=f"C{list(doc['backends']).index(name)}",
                        label=f"{name} durable batch 1 (no group commit)")
    for b, style in ((1, "--"), (64, "-.")):
        value = median(f"ceiling/sync-{b}")
        if value is not None:
            ax2.axhline(value, color="k", linestyle=style, linewidth=1.5, label=f"ceiling, {b} per sync")
    if not drew:
        ax2.text(0.5, 0.5, "write-behind not measured:\nno embedded writer yet", transform=ax2.transAxes,
                 ha="center", va="center", fontsize=11, color="grey")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xticks(producers, [str(p) for p in producers])
    ax2.set_xlabel("concurrent producers, each awaiting durability")
    ax2.set_ylabel("durable events/s (median)")
    ax2.set_title("Write-behind against concurrency")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7)
    m = doc["machine"]
    fig.suptitle(f"sessionlog bench — {m['nproc']} CPUs, {m['kernel']}, {m['fs_type']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
