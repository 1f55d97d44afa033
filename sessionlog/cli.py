"""The ``sessionlog`` command: scan, repair, show, convert, compact, bench, demo.

Exit codes (DESIGN.md section 7): 0 clean (or repaired), 1 repairable, 3 needs --force,
2 usage, 4 I/O error or not a session log, 5 a writer holds the session. Over several
sessions the worst wins, in the order 4 > 5 > 3 > 1 > 0.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from . import InvalidStoreUrl, open_store, scheme_of
from .contract import (
    EventStore,
    RepairReport,
    ScanResult,
    SessionLocked,
    SessionLogError,
    Status,
    UnsupportedFormat,
)
from .events import valid_session_id

EXIT_OK = 0
EXIT_REPAIRABLE = 1
EXIT_USAGE = 2
EXIT_NEEDS_FORCE = 3
EXIT_ERROR = 4
EXIT_LOCKED = 5
_SEVERITY = {EXIT_OK: 0, EXIT_REPAIRABLE: 1, EXIT_NEEDS_FORCE: 2, EXIT_LOCKED: 3, EXIT_ERROR: 4}

_STATUS_EXIT = {
    Status.CLEAN: EXIT_OK,
    Status.OPEN: EXIT_OK,
    Status.REPAIRABLE: EXIT_REPAIRABLE,
    Status.NEEDS_FORCE: EXIT_NEEDS_FORCE,
    Status.UNSUPPORTED: EXIT_ERROR,
    Status.ERROR: EXIT_ERROR,
}

_FILE_SUFFIXES = {".jsonl.zst": "zstd", ".jsonl": "jsonl"}
_SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def worst(codes: Sequence[int]) -> int:
    """The exit code of several sessions: 4 over 5 over 3 over 1 over 0."""
    return max(codes, key=lambda c: _SEVERITY[c], default=EXIT_OK)


class UsageError(Exception):
    """A target or option the command cannot make sense of (exit 2)."""


# --- targets ---------------------------------------------------------------------------


@dataclass
class Target:
    """A store and the sessions of it a command works on."""

    url: str
    sessions: list[str] | None  # None: every session of the store


def resolve_target(text: str, session: str | None = None) -> list[Target]:
    """A log file, a store directory or a store URL, as (store URL, sessions) pairs.

    A directory holding both ``*.jsonl`` and ``*.jsonl.zst`` sessions is two stores."""
    only = [session] if session is not None else None
    if os.path.isdir(text):
        names = os.listdir(text)
        found = [
            Target(f"{scheme}:{text}", only)
            for suffix, scheme in (("jsonl.zst", "zstd"), ("jsonl", "jsonl"))
            if any(n.endswith("." + suffix) and not n.startswith(".") and
                   (scheme != "jsonl" or not n.endswith(".zst")) for n in names)
        ]
        return found or [Target(f"jsonl:{text}", only)]
    if os.path.isfile(text) or os.path.islink(text):
        base = os.path.basename(text)
        directory = os.path.dirname(text) or "."
        for suffix, scheme in _FILE_SUFFIXES.items():
            if base.endswith(suffix):
                sid = base[: -len(suffix)]
                if not valid_session_id(sid):
                    raise UsageError(f"{text}: {sid!r} is not a valid session id")
                if session is not None and session != sid:
                    raise UsageError(f"{text} holds session {sid!r}, not {session!r}")
                return [Target(f"{scheme}:{directory}", [sid])]
        if base.endswith(_SQLITE_SUFFIXES):
            return [Target(f"sqlite:///{os.path.abspath(text)}", only)]
        raise UsageError(f"{text}: not a session log (expected *.jsonl, *.jsonl.zst or an SQLite database)")
    if ":" in text and not text.startswith((".", "/")):
        scheme_of(text)
        return [Target(text, only)]
    raise UsageError(f"{text}: no such file, directory or store URL")


def _open(url: str, *, writing: bool) -> EventStore:
    options: dict[str, Any] = {}
    if scheme_of(url) in ("jsonl", "zstd") and not writing:
        options["create_dir"] = False  # a scan never writes, not even a directory
    return open_store(url, **options)


def _each_session(targets: list[Target], *, writing: bool) -> Iterator[tuple[EventStore, str]]:
    for target in targets:
        store = _open(target.url, writing=writing)
        try:
            ids = target.sessions if target.sessions is not None else store.sessions()
            for sid in ids:
                yield store, sid
        finally:
            store.close()


def _count(targets: list[Target]) -> int:
    total = 0
    for target in targets:
        if target.sessions is not None:
            total += len(target.sessions)
        else:
            with _open(target.url, writing=False) as store:
                total += len(store.sessions())
    return total


class _Progress:
    """A progress bar on a terminal for long work; silent otherwise."""

    def __init__(self, total: int, label: str) -> None:
        self._bar: Any = None
        if total > 20 and sys.stderr.isatty():
            from rich.progress import Progress

            self._bar = Progress(transient=True)
            self._bar.start()
            self._task = self._bar.add_task(label, total=total)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# --- scan ------------------------------------------------------------------------------


def scan_row(sid: str, store: EventStore, result: ScanResult | None, error: SessionLogError | None) -> dict[str, Any]:
    if result is None:
        assert error is not None
        status = Status.UNSUPPORTED if isinstance(error, UnsupportedFormat) else Status.ERROR
        path = getattr(error, "path", None)
        return {
            "session": sid, "path": path, "records": None, "status": str(status), "damage": None,
            "open_turn": None, "open_step": None, "unanswered_calls": [], "error": str(error),
        }
    return {
        "session": sid,
        "path": result.path,
        "records": result.record_count,
        "status": str(result.status),
        "damage": result.damage.to_json() if result.damage is not None else None,
        "open_turn": result.open_turn,
        "open_step": result.open_step,
        "unanswered_calls": list(result.unanswered_calls),
    }


def _row_exit(row: dict[str, Any]) -> int:
    return _STATUS_EXIT[Status(row["status"])]


def cmd_scan(args: argparse.Namespace, out: TextIO) -> int:
    targets = resolve_target(args.target, args.session)
    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    progress = _Progress(_count(targets), "scanning")
    try:
        for store, sid in _each_session(targets, writing=False):
            try:
                row = scan_row(sid, store, store.scan(sid), None)
            except SessionLogError as exc:
                row = scan_row(sid, store, None, exc)
            codes.append(_row_exit(row))
            if args.json:
                out.write(json.dumps(row) + "\n")
            else:
                rows.append(row)
            progress.advance()
    finally:
        progress.close()
    if not args.json:
        _print_scan_table(rows, out)
    return worst(codes)


def _print_scan_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for col in ("session", "status", "records", "damage", "offset", "tail bytes", "after", "open", "unanswered"):
        table.add_column(col, justify="right" if col in ("records", "offset", "tail bytes", "after") else "left")
    styles = {"clean": "green", "open": "cyan", "repairable": "yellow", "needs-force": "red",
              "unsupported": "magenta", "error": "red"}
    for row in rows:
        d = row["damage"] or {}
        opened = " ".join(
            part for part in (
                f"turn {row['open_turn']}" if row["open_turn"] is not None else "",
                f"step {row['open_step']}" if row["open_step"] is not None else "",
            ) if part
        )
        table.add_row(
            row["session"], f"[{styles[row['status']]}]{row['status']}[/]",
            "" if row["records"] is None else str(row["records"]),
            d.get("kind", ""), str(d.get("offset", "")), str(d.get("length", "")),
            str(d.get("records_after", "")), opened, ", ".join(row["unanswered_calls"]),
        )
    console = Console(file=out, soft_wrap=False, width=max(80, _width(out)))
    console.print(table)
    for row in rows:
        if "error" in row:
            console.print(f"[red]{row['session']}[/]: {row['error']}", markup=True, highlight=False)
    if not rows:
        console.print("no sessions")


def _width(out: TextIO) -> int:
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return int(os.environ.get("COLUMNS", "160"))


# --- repair ----------------------------------------------------------------------------


def cmd_repair(args: argparse.Namespace, out: TextIO) -> int:
    targets = resolve_target(args.target, args.session)
    codes: list[int] = []
    reports: list[dict[str, Any]] = []
    progress = _Progress(_count(targets), "repairing")
    try:
        for store, sid in _each_session(targets, writing=not args.dry_run):
            code = EXIT_OK
            try:
                rep = store.repair(sid, force=args.force, dry_run=args.dry_run)
                row = rep.to_json()
                if rep.status == "refused":
                    code = EXIT_LOCKED if rep.reason == "a writer owns the session" else EXIT_NEEDS_FORCE
            except SessionLocked as exc:
                row = RepairReport(sid, None, "refused", reason=f"locked: {exc}").to_json()
                code = EXIT_LOCKED
            except SessionLogError as exc:
                row = RepairReport(sid, getattr(exc, "path", None), "refused", reason=str(exc)).to_json()
                row["error"] = str(exc)
                code = EXIT_ERROR
            if args.dry_run:
                row["dry_run"] = True
            codes.append(code)
            if args.json:
                out.write(json.dumps(row) + "\n")
            else:
                reports.append(row)
            progress.advance()
    finally:
        progress.close()
    if not args.json:
        _print_repair_table(reports, out, dry_run=args.dry_run)
    return worst(codes)


def _print_repair_table(rows: list[dict[str, Any]], out: TextIO, *, dry_run: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold", title="dry run: nothing written" if dry_run else None)
    for col in ("session", "status", "cut bytes", "appended", "quarantine / reason"):
        table.add_column(col)
    for row in rows:
        appended = ", ".join(
            f"{r['type']}" + (f" {r['code']}" if r.get("code") else "") for r in row["appended"]
        )
        status = row["status"]
        if dry_run and status == "repaired":
            status = "would repair"
        table.add_row(
            row["session"], status, str(row["truncated_bytes"]), appended,
            os.path.basename(row["quarantine"]) if row["quarantine"] else (row["reason"] or ""),
        )
    console = Console(file=out, soft_wrap=False, width=max(80, _width(out)))
    console.print(table)
    if not rows:
        console.print("no sessions")


# --- show ------------------------------------------------------------------------------


def repaired_view(store: EventStore, sid: str) -> Iterator[Any]:
    """The session as repair would leave it, without writing: the durable prefix, then
    what repair would append (with force: the view of the prefix)."""
    plan = store.repair(sid, force=True, dry_run=True)
    yield from store.read(sid)
    if plan.status == "repaired":
        yield from plan.appended


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    targets = resolve_target(args.target, args.session)
    pairs = list(_each_session(targets, writing=False))
    if len(pairs) != 1:
        raise UsageError(f"{args.target}: show needs exactly one session (found {len(pairs)}); use --session ID")
    store, sid = pairs[0]
    with _open(store.url, writing=False) as store:
        scan = store.scan(sid)
        if scan.damage is not None and scan.damage.kind.needs_force:
            print(f"warning: {sid}: {scan.damage.kind} at offset {scan.damage.offset}; showing the prefix before it",
                  file=sys.stderr)
        records = repaired_view(store, sid)
        if args.format == "events":
            for record in records:
                out.write(record.raw.decode("utf-8") + "\n")
            return EXIT_OK
        from . import projection

        view = projection.project(list(records), args.format)
        for issue in view.issues:
            print(f"note: {issue}", file=sys.stderr)
        out.write(json.dumps(view.to_json(), ensure_ascii=False, indent=2) + "\n")
        if args.check:
            violation = projection.check_pairing(view.items, args.format)
            if violation is not None:
                print(f"pairing violation: {violation.message}", file=sys.stderr)
                return EXIT_REPAIRABLE
    return EXIT_OK


# --- convert, compact, bench, demo ----------------------------------------------------


def cmd_convert(args: argparse.Namespace, out: TextIO) -> int:
    from . import convert as convert_mod

    src = resolve_target(args.src, args.session)
    if len(src) != 1:
        raise UsageError(f"{args.src}: holds more than one kind of store; pass a store URL")
    dst = resolve_target(args.dst) if os.path.exists(args.dst) or ":" in args.dst else [Target(_dir_url(args.dst), None)]
    results = convert_mod.convert(
        src[0].url, dst[0].url, session=src[0].sessions[0] if src[0].sessions else None,
        repaired=args.repaired,
    )
    codes = []
    for res in results:
        row = res.to_json() if hasattr(res, "to_json") else dict(vars(res))
        out.write(json.dumps(row) + "\n")
        status = row.get("status")
        codes.append(EXIT_OK if status == "converted" else EXIT_NEEDS_FORCE if status == "refused" else EXIT_ERROR)
    return worst(codes)


def _dir_url(path: str) -> str:
    return f"zstd:{path}" if path.endswith(".zst") else f"jsonl:{path}"


def cmd_compact(args: argparse.Namespace, out: TextIO) -> int:
    from .backends import zstd

    codes = []
    for target in resolve_target(args.target, args.session):
        if scheme_of(target.url) != "zstd":
            raise UsageError(f"{args.target}: compact rewrites Zstd stores (zstd:DIR)")
        with open_store(target.url) as store:
            for sid in target.sessions if target.sessions is not None else store.sessions():
                try:
                    result = zstd.compact(store, sid)
                    out.write(json.dumps({"session": sid, "status": "compacted", **_as_dict(result)}) + "\n")
                    codes.append(EXIT_OK)
                except SessionLocked as exc:
                    out.write(json.dumps({"session": sid, "status": "refused", "reason": str(exc)}) + "\n")
                    codes.append(EXIT_LOCKED)
                except SessionLogError as exc:
                    out.write(json.dumps({"session": sid, "status": "refused", "reason": str(exc)}) + "\n")
                    codes.append(EXIT_ERROR)
    return worst(codes)


def _as_dict(result: Any) -> dict[str, Any]:
    if result is None:
        return {}
    if isinstance(result, dict):
        return result
    if hasattr(result, "to_json"):
        return result.to_json()
    return {k: v for k, v in vars(result).items() if not k.startswith("_")}


def cmd_bench(args: argparse.Namespace, out: TextIO) -> int:
    from . import bench

    return int(bench.main(args.rest) or 0)


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from .demo import run_demo

    return run_demo(out, keep=args.keep)


# --- entry point -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionlog",
        description="Crash-safe storage for agent session logs: scan, repair and view them.",
        epilog="exit codes: 0 clean/repaired, 1 repairable, 2 usage, 3 needs --force, "
        "4 I/O error or not a session log, 5 a writer holds the session",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def target_cmd(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("target", help="a log file, a store directory, or a store URL (jsonl:DIR, zstd:DIR, sqlite:///FILE, postgresql+psycopg://...)")
        p.add_argument("--session", metavar="ID", help="one session of the store")
        return p

    p = target_cmd("scan", "validate sessions without writing anything")
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.set_defaults(func=cmd_scan)

    p = target_cmd("repair", "quarantine damaged tails and close open transcripts")
    p.add_argument("--dry-run", action="store_true", help="report what would be done; write nothing")
    p.add_argument("--force", action="store_true", help="also cut mid-log damage and seq breaks (point in time)")
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.set_defaults(func=cmd_repair)

    p = target_cmd("show", "print the repaired view of a session without writing")
    p.add_argument("--format", choices=("events", "openai", "anthropic", "responses"), default="events")
    p.add_argument("--check", action="store_true", help="check call/result pairing of the view (exit 1 on a violation)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("convert", help="copy sessions between stores, records byte-identical")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--session", metavar="ID")
    p.add_argument("--repaired", action="store_true", help="write the repaired view of a damaged source")
    p.set_defaults(func=cmd_convert)

    p = target_cmd("compact", "rewrite Zstd sessions into larger frames")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("bench", help="durable append throughput against the device ceiling", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="crash a writer mid tool call, then scan, repair and show")
    p.add_argument("--keep", action="store_true", help="keep the demo directory")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return args.func(args, out)
    except (UsageError, InvalidStoreUrl) as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SessionLocked as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except SessionLogError as exc:
        print(f"sessionlog: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("sessionlog: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
