"""Throughput benchmarks (installed as sessionlog.bench; run as python -m benchmarks).

``sessionlog bench`` and ``python -m benchmarks`` measure, in one run of interleaved
rounds, durable append throughput of every backend that ``sessionlog.open_store`` can open
against the device ceiling (raw ``os.write`` + ``os.fdatasync``), scan and repair speed,
Zstd compression, peers (stdlib sqlite3, openai-agents ``SQLiteSession`` when installed),
and the peak memory of the CLI scanning a 1 GB log; then each target as a ratio of two
medians with PASS / MISS. See ``benchmarks/RESULTS.md`` for the latest figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

EXIT_OK = 0
EXIT_USAGE = 2


def build_parser(prog: str = "sessionlog bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Durable append and fsync throughput of every sessionlog backend against the device "
        "ceiling, in one run of interleaved rounds (medians; ratios taken in the same run).",
        epilog="Targets are bars, not tests: a MISS does not change the exit code. Exit 2 on a usage error.",
    )
    parser.add_argument("--json", action="store_true", help="print the run as one JSON document instead of tables")
    parser.add_argument("--plot", metavar="FILE.png", help="draw throughput against batch size and concurrency "
                        "(needs matplotlib: pip install 'sessionlog[plot]')")
    parser.add_argument("--markdown", metavar="FILE.md", help="also write the results as a markdown section")
    parser.add_argument("--smoke", action="store_true", help="a few-second run with tiny sizes (CI)")
    parser.add_argument("--dir", metavar="DIR", help="where the temp directory goes: put it on the file system "
                        "you want measured (default: the current directory; never tmpfs for fsync figures)")
    parser.add_argument("--postgres", metavar="URL", default=os.environ.get("SESSIONLOG_BENCH_POSTGRES_URL"),
                        help="also measure PostgreSQL at this URL (postgresql+psycopg://...); "
                        "default $SESSIONLOG_BENCH_POSTGRES_URL")
    parser.add_argument("--backends", metavar="NAMES", help="comma-separated subset: jsonl,zstd,sqlite,postgresql")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 9; smoke 2)")
    parser.add_argument("--seconds", type=float, help="time per timed case per round (default 0.5; smoke 0.02)")
    parser.add_argument("--scan-records", type=int, help="records in the scan corpus (default 200000)")
    parser.add_argument("--repair-mb", type=float, help="size of the torn log to repair, MB (default 100)")
    parser.add_argument("--memory-mb", type=int, help="size of the log the CLI scans for peak memory, MB "
                        "(default 1024; 0 skips)")
    parser.add_argument("--no-peers", action="store_true", help="skip stdlib sqlite3 and openai-agents")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; print a table (or ``--json``); returns the exit code (0, or 2
    for a usage error). Figures go to stdout, progress to stderr."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]  # ``sessionlog bench -- --json``: the separator is not ours
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)

    from . import report
    from .run import Settings, run

    if args.plot and not report.matplotlib_available():
        print("sessionlog bench: --plot needs matplotlib, which is not installed: "
              "pip install 'sessionlog[plot]' (or pip install matplotlib)", file=sys.stderr)
        return EXIT_USAGE
    directory = args.dir or os.getcwd()
    if not os.path.isdir(directory):
        print(f"sessionlog bench: --dir {directory}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    overrides = {
        key: value for key, value in (
            ("rounds", args.rounds), ("seconds", args.seconds), ("scan_records", args.scan_records),
            ("repair_mb", args.repair_mb), ("memory_mb", args.memory_mb),
        ) if value is not None
    }
    too_small = {"rounds": 1, "scan_records": 2, "memory_mb": 0}
    for key, value in overrides.items():
        if value < too_small.get(key, 0) or (key in ("seconds", "repair_mb") and value <= 0):
            print(f"sessionlog bench: --{key.replace('_', '-')} {value} is too small", file=sys.stderr)
            return EXIT_USAGE
    overrides["postgres_url"] = args.postgres
    overrides["peers"] = not args.no_peers
    if args.backends:
        names = tuple(n.strip() for n in args.backends.split(",") if n.strip())
        unknown = set(names) - {"jsonl", "zstd", "sqlite", "postgresql"}
        if unknown:
            print(f"sessionlog bench: unknown backend(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return EXIT_USAGE
        if "postgresql" in names and not args.postgres:
            print("sessionlog bench: postgresql needs --postgres URL", file=sys.stderr)
            return EXIT_USAGE
        overrides["backends"] = names
    settings = Settings.smoke_run(**overrides) if args.smoke else Settings(**overrides)

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"bench: {message}", file=sys.stderr, flush=True)

    command = "sessionlog bench " + " ".join(a if not a.startswith("postgresql") else "URL" for a in argv)
    doc = run(settings, directory, progress, command.strip())
    if args.plot:
        report.plot(doc, args.plot)
        progress(f"plot written to {args.plot}")
    if args.markdown:
        plot_name = os.path.relpath(args.plot, os.path.dirname(os.path.abspath(args.markdown))) if args.plot else None
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(report.markdown(doc, plot_name))
        progress(f"markdown written to {args.markdown}")
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        report.print_table(doc, sys.stdout)
    return EXIT_OK
