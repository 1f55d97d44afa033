"""The ``sessionlog`` command: scan, repair, show, convert, compact, bench, demo.

Exit codes (DESIGN.md section 7): 0 clean (or repaired), 1 repairable, 3 needs --force,
2 usage, 4 I/O error or not a session log, 5 a writer holds the session. Over several
sessions the worst wins, in the order 4 > 5 > 3 > 1 > 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from . import InvalidStoreUrl, exits, open_store
from .contract import (
    DamageKind,
    EventStore,
    RepairReport,
    ScanResult,
    SessionLocked,
    SessionLogError,
    Status,
    UnsupportedFormat,
)
from .targets import open_source, resolve_target

EXIT_OK, EXIT_REPAIRABLE, EXIT_USAGE = exits.OK, exits.REPAIRABLE, exits.USAGE
EXIT_NEEDS_FORCE, EXIT_ERROR, EXIT_LOCKED = exits.NEEDS_FORCE, exits.ERROR, exits.LOCKED
worst = exits.worst

_STATUS_EXIT = {
    Status.CLEAN: EXIT_OK,
    Status.OPEN: EXIT_OK,
    Status.SUSPENDED: EXIT_OK,  # a human is deciding on a call: not a crash
    Status.REPAIRABLE: EXIT_REPAIRABLE,
    Status.NEEDS_FORCE: EXIT_NEEDS_FORCE,
    Status.UNSUPPORTED: EXIT_ERROR,
    Status.ERROR: EXIT_ERROR,
}


class UsageError(Exception):
    """A target or option the command cannot make sense of (exit 2)."""


# --- targets ---------------------------------------------------------------------------


def _target(text: str, session: str | None) -> tuple[str, str | None]:
    """The store URL and the one session (or None: all) a TARGET and --session name."""
    if ":" not in text and not os.path.exists(text):
        raise UsageError(f"{text}: no such file, directory or store URL")
    url, named = resolve_target(text)
    if named is not None and session is not None and named != session:
        raise UsageError(f"{text} holds session {named!r}, not {session!r}")
    return url, named if named is not None else session


def _open(url: str, *, writing: bool) -> EventStore:
    return open_store(url) if writing else open_source(url)


def _sessions(store: EventStore, session: str | None) -> list[str]:
    return [session] if session is not None else store.sessions()


@contextlib.contextmanager
def _progress(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Advance a progress bar on stderr when it is a terminal and the work is long."""
    if not sys.stderr.isatty() or (total is not None and total < 20):
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


# --- other tools' files (Claude Code transcripts, Codex rollouts) ---------------------


def _foreign(args: argparse.Namespace, out: TextIO) -> int | None:
    """Run scan/repair/show on a Claude Code transcript or Codex rollout (or a directory
    of them), recognized by content or named by --input-format: sessionlog.foreign does
    the work and prints its own table or --json rows. None when the target is not one."""
    from .foreign import command

    try:
        target = command.claim(args.target, args.input_format)
    except command.ForeignUsageError as exc:
        raise UsageError(str(exc)) from exc
    if target is None:
        return None
    if args.command == "scan":
        return command.run_scan(target, as_json=args.json, out=out)
    if args.command == "repair":
        return command.run_repair(target, force=args.force, dry_run=args.dry_run, as_json=args.json, out=out)
    try:
        return command.run_show(target, view_format=args.format, check=args.check, out=out)
    except command.ForeignUsageError as exc:
        raise UsageError(str(exc)) from exc


# --- scan ------------------------------------------------------------------------------


def scan_row(sid: str, result: ScanResult | None, error: SessionLogError | None) -> dict[str, Any]:
    if result is None:
        assert error is not None
        status = Status.UNSUPPORTED if isinstance(error, UnsupportedFormat) else Status.ERROR
        path = getattr(error, "path", None)
        return {
            "session": sid, "path": path, "records": None, "status": str(status), "damage": None,
            "open_turn": None, "open_step": None, "unanswered_calls": [], "awaiting_approval": [], "error": str(error),
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
        "awaiting_approval": list(result.awaiting_approval),
    }


def _row_exit(row: dict[str, Any]) -> int:
    status = Status(row["status"])
    if status is Status.OPEN and row["damage"] is not None:
        # Damage before a live writer's tail is not its doing: the code says what a
        # repair will need once the writer is gone (the status stays "open").
        status = DamageKind(row["damage"]["kind"]).status or status
    return _STATUS_EXIT[status]


def cmd_scan(args: argparse.Namespace, out: TextIO) -> int:
    foreign = _foreign(args, out)
    if foreign is not None:
        return foreign
    url, session = _target(args.target, args.session)
    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    with _open(url, writing=False) as store:
        ids = _sessions(store, session)
        with _progress("scanning", len(ids)) as advance:
            for sid in ids:
                try:
                    row = scan_row(sid, store.scan(sid), None)
                except SessionLogError as exc:
                    row = scan_row(sid, None, exc)
                codes.append(_row_exit(row))
                if args.json:
                    out.write(json.dumps(row) + "\n")
                else:
                    rows.append(row)
                advance(1)
    if not args.json:
        _print_scan_table(rows, out)
    return worst(codes)


def _print_scan_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for col in ("session", "status", "records", "damage", "offset", "tail bytes", "after", "open", "unanswered"):
        table.add_column(col, justify="right" if col in ("records", "offset", "tail bytes", "after") else "left")
    styles = {"clean": "green", "open": "cyan", "suspended": "cyan", "repairable": "yellow", "needs-force": "red",
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
    foreign = _foreign(args, out)
    if foreign is not None:
        return foreign
    url, session = _target(args.target, args.session)
    codes: list[int] = []
    reports: list[dict[str, Any]] = []
    with _open(url, writing=not args.dry_run) as store, _progress("repairing", None) as advance:
        for sid in _sessions(store, session):
            code = EXIT_OK
            try:
                rep = store.repair(sid, force=args.force, dry_run=args.dry_run,
                                   expire_approvals=args.expire_approvals)
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
            advance(1)
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


def repaired_view(store: EventStore, sid: str, plan: RepairReport) -> Iterator[Any]:
    """The session as repair would leave it, without writing: the durable prefix, then
    what the repair ``plan`` (a forced dry run) would append."""
    yield from store.read(sid)
    if plan.status == "repaired":
        yield from plan.appended


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    foreign = _foreign(args, out)
    if foreign is not None:
        return foreign
    url, session = _target(args.target, args.session)
    with _open(url, writing=False) as store:
        ids = _sessions(store, session)
        if len(ids) != 1:
            raise UsageError(f"{args.target}: show needs exactly one session (found {len(ids)}); use --session ID")
        sid = ids[0]
        plan = store.repair(sid, force=True, dry_run=True)  # one scan: damage and what repair appends
        damage = plan.damage
        if damage is not None and damage.kind.needs_force:
            print(f"warning: {sid}: {damage.kind} at offset {damage.offset}; showing the prefix before it",
                  file=sys.stderr)
        records = repaired_view(store, sid, plan)
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
    from . import convert

    src, session = _target(args.src, args.session)
    with _progress("converting", None) as advance:
        results = convert.convert(src, args.dst, session=session, repaired=args.repaired, progress=advance)
    for res in results:
        out.write(json.dumps({"session": res.session, "status": res.status, "records": res.records,
                              "reason": res.reason, "warnings": list(res.warnings)}) + "\n")
        for note in res.warnings:
            print(f"warning: {note}", file=sys.stderr)
    return convert.exit_code(results)


def cmd_compact(args: argparse.Namespace, out: TextIO) -> int:
    from . import convert

    url, session = _target(args.target, args.session)
    with _progress("compacting", None) as advance:
        results = convert.compact(url, session=session, progress=advance)
    for res in results:
        out.write(json.dumps({
            "session": res.session, "status": res.status, "reason": res.reason,
            "bytes_before": res.bytes_before, "bytes_after": res.bytes_after,
            "frames_before": res.frames_before, "frames_after": res.frames_after,
        }) + "\n")
    return convert.exit_code(results)


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
        if name in ("scan", "repair", "show"):
            p.add_argument("--input-format", choices=("claude-code", "codex"), default=None,
                           help="read TARGET as a Claude Code transcript or a Codex rollout (default: by content)")
        return p

    p = target_cmd("scan", "validate sessions without writing anything")
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.set_defaults(func=cmd_scan)

    p = target_cmd("repair", "quarantine damaged tails and close open transcripts")
    p.add_argument("--dry-run", action="store_true", help="report what would be done; write nothing")
    p.add_argument("--force", action="store_true", help="also cut mid-log damage and seq breaks (point in time)")
    p.add_argument("--expire-approvals", action="store_true",
                   help="answer calls awaiting approval TOOL_NOT_STARTED and close their step and turn")
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the harness parses its own options
        from . import bench

        return int(bench.main(argv[1:]) or 0)
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
    except OSError as exc:  # a backstop: the engine wraps these, the command never tracebacks
        print(f"sessionlog: {exc.filename or ''} {exc.strerror or exc}".strip(), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("sessionlog: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
