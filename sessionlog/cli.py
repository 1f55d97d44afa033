"""The ``sessionlog`` command: scan, repair, show, convert, compact, restore, bench, demo.

Every command that reports on sessions prints a table for people, or with ``--json`` one
JSON object per session per line (JSON Lines) for machines; notes, warnings and errors go
to standard error. Progress (bytes done of total, rate, time left) is drawn on standard
error only when it is a terminal; ``--quiet`` (``--no-progress``) turns it off.

Exit codes (docs/cli.md): 0 clean, open or suspended (or done), 1 repairable, 2 usage, 3 needs --force,
4 error (a TARGET or session that does not exist, however it is spelled; I/O; not a
session log; unsupported format), 5 a writer holds the session. Over several sessions
or targets the worst wins, in the order 4 > 5 > 3 > 1 > 0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import stat
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from . import InvalidStoreUrl, __version__, exits, scheme_of
from .contract import (
    DamageKind,
    EventStore,
    RepairReport,
    ScanResult,
    SessionLocked,
    SessionLogError,
    Status,
    UnsupportedFormat,
    read_prefix,
)
from .durable import printable as _printable
from .events import LOG_TRUNCATED
from .targets import STDIN, StoreTarget, TargetNotFound, close_opened, local_path, resolve, stdin_log
from .terminal import console

EXIT_OK, EXIT_REPAIRABLE, EXIT_USAGE = exits.OK, exits.REPAIRABLE, exits.USAGE
EXIT_NEEDS_FORCE, EXIT_ERROR, EXIT_LOCKED = exits.NEEDS_FORCE, exits.ERROR, exits.LOCKED
worst = exits.worst

EXIT_CODES_HELP = (
    "exit codes: 0 clean/open/suspended/repaired/done, 1 repairable (or a pairing violation with show --check), "
    "2 usage, 3 needs --force, 4 error (a target or session that does not exist, I/O, not a session "
    "log, unsupported format), 5 a writer holds the session; over several sessions the worst wins "
    "(4 > 5 > 3 > 1 > 0)"
)


def status_exit(status: Status) -> int:
    """The exit code a scan status stands for."""
    return {
        Status.REPAIRABLE: EXIT_REPAIRABLE,
        Status.NEEDS_FORCE: EXIT_NEEDS_FORCE,
        Status.UNSUPPORTED: EXIT_ERROR,
        Status.ERROR: EXIT_ERROR,
    }.get(status, EXIT_OK)


class UsageError(Exception):
    """A target or option the command cannot make sense of (exit 2)."""


# --- output ------------------------------------------------------------------------------


# Files that stand for something else in what is printed: standard input spooled to a
# temporary file (removed when the command returns) is shown as "-".
_SHOWN_AS: dict[str, str] = {}


def _shown(text: str) -> str:
    for path, shown in _SHOWN_AS.items():
        text = text.replace(path, shown)
    return _printable(text)


class _PrintableOut(io.TextIOBase):
    """``out`` with every write made :func:`_printable` (tables and views of a file
    whose name is not UTF-8 print, escaped, instead of failing)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(_printable(text))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return self._out.isatty()

    def fileno(self) -> int:
        return self._out.fileno()


def note(text: str) -> None:
    """A note, warning or error line for people: standard error."""
    print(_shown(text), file=sys.stderr)


def emit_json(out: TextIO, row: dict[str, Any]) -> None:
    text = json.dumps(row, ensure_ascii=False)
    if _printable(text) is not text:  # a file name that is not UTF-8: escaped inside its string
        text = json.dumps(_printable_strings(row), ensure_ascii=False)
    out.write(_shown(text) + "\n")


def _printable_strings(value: Any) -> Any:
    """``value`` (JSON data) with every string made :func:`_printable`."""
    if isinstance(value, str):
        return _printable(value)
    if isinstance(value, dict):
        return {_printable(k): _printable_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_printable_strings(v) for v in value]
    return value


@dataclass(slots=True)
class Meter:
    """Progress on standard error for long work: bytes done of a total (or sessions when
    the size is unknown), with rate and time left. Silent off a terminal or when quiet."""

    advance: Callable[[int], None]
    add_total: Callable[[int], None]


@contextlib.contextmanager
def progress(args: argparse.Namespace, label: str, total: int | None, *, unit: str = "bytes",
             by_reads: bool = False) -> Iterator[Meter]:
    """A :class:`Meter` for ``total`` units of work (bytes unless ``unit`` says otherwise;
    None: unknown). ``by_reads``: between two advances, follow the bytes the process reads
    (a scan of one large log). Labelled "dry run:" when the command is a dry run."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        yield Meter(lambda n: None, lambda n: None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    if getattr(args, "dry_run", False):
        label = f"dry run: {label}"
    counted = (MofNCompleteColumn(),) if unit != "bytes" else (DownloadColumn(), TransferSpeedColumn())
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), *counted,
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            done += n
            bar.update(task, completed=max(done, bar.tasks[0].completed))

        def add_total(n: int) -> None:
            bar.update(task, total=(bar.tasks[0].total or 0) + n)

        stop = threading.Event()
        if by_reads and total:
            # Within one large log the store reports nothing until it is done: show the
            # bytes this process has read since (Linux /proc/self/io), never past the total.
            start = _bytes_read()
            if start is not None:
                def follow() -> None:
                    while not stop.wait(0.2):
                        now = _bytes_read()
                        if now is not None:
                            bar.update(task, completed=max(done, min(total, now - start)))

                threading.Thread(target=follow, daemon=True).start()
        try:
            yield Meter(advance, add_total)
        finally:
            stop.set()


def _bytes_read() -> int | None:
    """Bytes this process has read so far (``rchar`` of /proc/self/io), None elsewhere."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _session_bytes(store: EventStore, sid: str) -> int:
    path_of = getattr(store, "path_of", None)
    if path_of is None:
        return 0
    try:
        return os.path.getsize(path_of(sid))
    except OSError:
        return 0


# --- targets -----------------------------------------------------------------------------


@dataclass(slots=True)
class Missing:
    """A TARGET that names nothing (exit 4 for it; the others are still worked on)."""

    text: str
    error: SessionLogError


def _targets(args: argparse.Namespace, stack: contextlib.ExitStack, *, stdin: bool,
             foreign: bool = True) -> list[Any]:
    """Every TARGET of the command, resolved: StoreTarget, a foreign-file target (Claude
    Code / Codex, see sessionlog.foreign), or Missing. ``-`` is standard input where
    ``stdin`` allows it. Raises UsageError for a malformed target (exit 2), before any
    target is worked on."""
    texts = list(args.targets)
    if texts.count(STDIN) > 1:
        raise UsageError("standard input (-) can be read once")
    out: list[Any] = []
    for text in texts:
        shown = None
        path = text
        if text == STDIN:
            if not stdin:
                raise UsageError(f"{args.command} does not read standard input (-): name a file")
            path = stack.enter_context(stdin_log())
            _SHOWN_AS[path] = STDIN
            shown = STDIN
        if foreign:
            claimed = _foreign_claim(path, getattr(args, "input_format", None))
            if claimed is not None:
                claimed.shown_as = shown
                out.append(claimed)
                continue
        try:
            resolved = resolve(path, session=args.session)
        except TargetNotFound as exc:
            out.append(Missing(text, exc))
            continue
        except InvalidStoreUrl as exc:
            raise UsageError(str(exc)) from exc
        for target in resolved:
            if shown is not None:
                target.shown_as, target.note = shown, None
            out.append(target)
    return out


def _foreign_claim(path: str, input_format: str | None) -> Any:
    """The hook for other tools' files (Claude Code transcripts, Codex rollouts): a
    foreign target when ``path`` is one (by content, or forced by --input-format)."""
    from .foreign import command

    try:
        return command.claim(path, input_format)
    except command.ForeignUsageError as exc:
        raise UsageError(str(exc)) from exc


def _foreign_hint(path: str | None) -> str:
    """For a file of a store directory that is no session log: what it is when it is a
    Claude Code transcript or a Codex rollout, and how to work on it ("" otherwise)."""
    if path is None or not os.path.isfile(path):
        return ""
    from .durable import read_head
    from .foreign import HEAD_BYTES, sniff

    try:
        found = sniff(read_head(path, HEAD_BYTES))
    except OSError:
        return ""
    return "" if found is None else f"; it is a {found.title}: name the file to work on it as one"


def _is_foreign(target: Any) -> bool:
    return not isinstance(target, (StoreTarget, Missing))


def _open(target: StoreTarget, args: argparse.Namespace, out: TextIO, codes: list[int], *,
          writing: bool) -> EventStore | None:
    """Open a target's store, or report why it cannot be (stderr, and a ``--json`` row)
    and return None: the other targets are still worked on. A malformed URL is a usage
    error for the whole command (UsageError)."""
    try:
        return target.open(writing=writing)
    except InvalidStoreUrl as exc:
        raise UsageError(str(exc)) from exc
    except SessionLogError as exc:
        note(f"sessionlog: {exc}")
        codes.append(EXIT_ERROR)
        if args.json:
            emit_json(out, {**_missing_row(Missing(target.text, exc)), "session": target.session})
        return None


def _missing_row(target: Missing) -> dict[str, Any]:
    return {"session": None, "path": target.text, "records": None, "status": str(Status.ERROR),
            "damage": None, "open_turn": None, "open_step": None, "unanswered_calls": [],
            "awaiting_approval": [], "unmarked_quarantines": [], "error": str(target.error)}


def _shown_path(target: StoreTarget, path: str | None) -> str | None:
    return target.shown_as if target.shown_as is not None else path


# --- scan --------------------------------------------------------------------------------


def scan_row(sid: str, result: ScanResult | None, error: SessionLogError | None) -> dict[str, Any]:
    """One scan's JSON row (the keys documented in docs/cli.md)."""
    if result is None:
        assert error is not None
        status = Status.UNSUPPORTED if isinstance(error, UnsupportedFormat) else Status.ERROR
        path = getattr(error, "path", None)
        return {
            "session": sid, "path": path, "records": None, "status": str(status), "damage": None,
            "open_turn": None, "open_step": None, "unanswered_calls": [], "awaiting_approval": [],
            "unmarked_quarantines": [], "error": str(error),
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
        "unmarked_quarantines": list(result.unmarked_quarantines),
    }


def _row_exit(row: dict[str, Any]) -> int:
    status = Status(row["status"])
    if status is Status.OPEN and row["damage"] is not None:
        # Damage before a live writer's tail is not its doing: the code says what a
        # repair will need once the writer is gone (the status stays "open").
        status = DamageKind(row["damage"]["kind"]).status or status
    return status_exit(status)


def cmd_scan(args: argparse.Namespace, out: TextIO) -> int:
    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    with contextlib.ExitStack() as stack:
        for target in _targets(args, stack, stdin=True):
            if isinstance(target, Missing):
                row = _missing_row(target)
            elif _is_foreign(target):
                from .foreign import command

                codes.append(command.run_scan(target, as_json=args.json, out=out))
                continue
            else:
                _scan_store(args, target, out, rows, codes)
                continue
            codes.append(EXIT_ERROR)
            note(f"sessionlog: {row['error']}")
            if args.json:
                emit_json(out, row)
    if not args.json:
        _print_scan_table(rows, out)
    return worst(codes)


def _scan_store(args: argparse.Namespace, target: StoreTarget, out: TextIO,
                rows: list[dict[str, Any]], codes: list[int]) -> None:
    if target.note:
        note(f"note: {target.note}")
    store = _open(target, args, out, codes, writing=False)
    if store is None:
        return
    sql = scheme_of(target.url) in ("sqlite", "postgresql")
    with store:
        ids = target.sessions(store)
        if not ids and not target.skip:
            note(f"{target.text}: no sessions")  # an empty store, not a silent success
        sizes = {sid: _session_bytes(store, sid) for sid in ids}
        with progress(args, "scanning", sum(sizes.values()) or None, by_reads=True) as meter:
            for sid in ids:
                try:
                    row = scan_row(sid, store.scan(sid), None)
                except SessionLogError as exc:
                    row = scan_row(sid, None, exc)
                    row["path"] = row["path"] or _path_of(store, sid)
                    row["error"] += _foreign_hint(row["path"])
                # A SQL session lives in the database: a SQLite store's path is its file.
                row["path"] = _shown_path(target, row["path"] or (local_path(target.url) if sql else None))
                if target.note:
                    row["note"] = target.note
                codes.append(_row_exit(row))
                if args.json:
                    emit_json(out, row)
                    if "error" in row:  # errors go to standard error, with --json too
                        note(f"{sid}: {row['error']}")
                else:
                    rows.append({**row, "_offset_is": "row" if sql else "offset"})
                meter.advance(sizes[sid])


_STYLES = {"clean": "green", "open": "cyan", "suspended": "cyan", "repairable": "yellow", "needs-force": "red",
           "unsupported": "magenta", "error": "red", "repaired": "green", "refused": "red",
           "would repair": "yellow", "converted": "green", "exists": "yellow", "skipped": "green",
           "compacted": "green", "unchanged": "green", "locked": "red", "restored": "green",
           "salvaged": "yellow", "nothing": "green"}


def _styled(status: str) -> str:
    return f"[{_STYLES.get(status, 'white')}]{status}[/]"


def _print_scan_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for col in ("session", "status", "records", "damage", "offset", "tail bytes", "after", "open", "unanswered"):
        table.add_column(col, justify="right" if col in ("records", "offset", "tail bytes", "after") else "left")
    for row in rows:
        d = row["damage"] or {}
        opened = " ".join(
            part for part in (
                f"turn {row['open_turn']}" if row["open_turn"] is not None else "",
                f"step {row['open_step']}" if row["open_step"] is not None else "",
            ) if part
        )
        table.add_row(
            row["session"] if row["session"] is not None else row["path"], _styled(row["status"]),
            "" if row["records"] is None else str(row["records"]),
            d.get("kind", ""), str(d.get("offset", "")), str(d.get("length", "")),
            str(d.get("records_after", "")), opened, ", ".join(row["unanswered_calls"]),
        )
    if rows:
        console(out).print(table)
    for row in rows:
        d = row["damage"]
        if d is not None and d.get("reason"):
            where = row.get("_offset_is", "offset")  # a SQL store's damage is at a row
            name = row["path"] or row["session"]
            if where == "row" and row["path"] and row["session"] is not None:
                name = f"{row['path']} session {row['session']!r}"  # one database file, many sessions
            console(out).print(f"{name}: {d['kind']} at {where} {d['offset']}: {d['reason']}",
                               markup=False, soft_wrap=True)
        for name in row.get("unmarked_quarantines", ()):
            console(out).print(f"{row['session']}: {name} holds bytes cut from the log that no log/truncated "
                               "record names (a repair stopped after its cut); repair appends the marker",
                               markup=False, soft_wrap=True)
        if "error" in row and row["session"] is not None:
            note(f"{row['session']}: {row['error']}")
            if "decompress" in row["error"]:
                note(f"{row['session']}: `sessionlog salvage {row['path']} DST` keeps every record that still "
                     "decodes")


# --- repair ------------------------------------------------------------------------------

_STAMP = re.compile(r"\.\d{8}T\d{6}Z-[0-9a-f]{8}\.quarantine$")
QUARANTINE_PATTERN_TAIL = ".<UTC stamp>-<random>.quarantine"


def _path_of(store: EventStore, sid: str) -> str | None:
    """The session's log file, for a file store (None for the others)."""
    path_of = getattr(store, "path_of", None)
    try:
        return path_of(sid) if path_of is not None else None
    except SessionLogError:
        return None


def repair_row(target: StoreTarget, sid: str, store: EventStore, args: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """Repair one session (or, with --dry-run, report what repair would do): its JSON row
    and exit code. A dry run names the quarantine as the pattern the real run fills in
    (``<log>.<offset>.<kind>.<UTC stamp>-<random>.quarantine``)."""
    code = EXIT_OK
    try:
        rep = _repair(store, sid, args)
        row = rep.to_json()
        if rep.status == "refused":
            code = EXIT_LOCKED if rep.reason == "a writer owns the session" else EXIT_NEEDS_FORCE
    except SessionLocked as exc:
        row = RepairReport(sid, _path_of(store, sid), "refused", reason=f"locked: {exc}").to_json()
        code = EXIT_LOCKED
    except SessionLogError as exc:
        row = RepairReport(sid, getattr(exc, "path", None) or _path_of(store, sid), "refused",
                           reason=str(exc)).to_json()
        row["error"] = str(exc)
        code = EXIT_ERROR
    # A SQL session lives in the database: a SQLite store's path is its file (as in scan).
    sql = scheme_of(target.url) in ("sqlite", "postgresql")
    row["path"] = _shown_path(target, row["path"] or (local_path(target.url) if sql else None))
    if args.dry_run:
        row["dry_run"] = True
        if row["quarantine"] and _STAMP.search(row["quarantine"]):
            row["quarantine"] = _STAMP.sub(QUARANTINE_PATTERN_TAIL, row["quarantine"])
            row["quarantine_is_pattern"] = True
            for event in row.get("appended") or ():  # the marker names the same file
                named = event.get("quarantine") if event.get("type") == LOG_TRUNCATED else None
                if isinstance(named, str) and _STAMP.search(named):
                    event["quarantine"] = _STAMP.sub(QUARANTINE_PATTERN_TAIL, named)
    if target.note:
        row["note"] = target.note
    return row, code


def _repair(store: EventStore, sid: str, args: argparse.Namespace) -> RepairReport:
    return store.repair(sid, force=args.force, dry_run=args.dry_run, expire_approvals=args.expire_approvals)


def cmd_repair(args: argparse.Namespace, out: TextIO) -> int:
    codes: list[int] = []
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        for target in _targets(args, stack, stdin=False):
            if isinstance(target, Missing):
                note(f"sessionlog: {target.error}")
                codes.append(EXIT_ERROR)
                if args.json:
                    row = RepairReport(None, target.text, "refused", reason=str(target.error)).to_json()  # type: ignore[arg-type]
                    emit_json(out, {**row, "error": str(target.error)})
                continue
            if _is_foreign(target):
                from .foreign import command

                codes.append(command.run_repair(target, force=args.force, dry_run=args.dry_run,
                                                as_json=args.json, out=out))
                continue
            if target.note:
                note(f"note: {target.note}")
            store = _open(target, args, out, codes, writing=not args.dry_run)
            if store is None:
                continue
            with store:
                ids = target.sessions(store)
                sizes = {sid: _session_bytes(store, sid) for sid in ids}
                with progress(args, "repairing", sum(sizes.values()) or None, by_reads=True) as meter:
                    for sid in ids:
                        row, code = repair_row(target, sid, store, args)
                        codes.append(code)
                        rows.append(row) if not args.json else emit_json(out, row)
                        meter.advance(sizes[sid])
    if not args.json:
        _print_repair_table(rows, out, dry_run=args.dry_run)
    return worst(codes)


def _print_repair_table(rows: list[dict[str, Any]], out: TextIO, *, dry_run: bool) -> None:
    from rich.table import Table

    if not rows:
        return
    table = Table(show_edge=False, header_style="bold",
                  title="dry run: nothing written" if dry_run else None)
    for col in ("session", "status", "cut bytes", "appended", "reason"):
        table.add_column(col)
    for row in rows:
        appended = ", ".join(
            f"{r['type']}" + (f" {r['code']}" if r.get("code") else "") for r in row["appended"]
        )
        status = "would repair" if dry_run and row["status"] == "repaired" else row["status"]
        table.add_row(row["session"] or row["path"] or "", _styled(status), str(row["truncated_bytes"]),
                      appended, row["reason"] or "")
    con = console(out)
    con.print(table)
    # Full paths below the table: never cut, never wrapped.
    for row in rows:
        if row["quarantine"]:
            verb = "would quarantine" if dry_run else "quarantined"
            what = " (a pattern: the stamp and random part are chosen when it is written)" \
                if row.get("quarantine_is_pattern") else ""
            con.print(f"{row['session']}: {verb} {row['truncated_bytes']} bytes in {row['quarantine']}{what}",
                      markup=False, soft_wrap=True)
    for row in rows:
        if "error" in row:
            note(f"{row['session'] or row['path']}: {row['error']}")


# --- show --------------------------------------------------------------------------------


def repaired_view(store: EventStore, sid: str, plan: RepairReport) -> Iterator[Any]:
    """The session as repair would leave it, without writing: the durable prefix, then
    :func:`planned_records`."""
    yield from read_prefix(store, sid)
    yield from planned_records(plan)


def planned_records(plan: RepairReport) -> list[Any]:
    """What the repair ``plan`` (a forced dry run) would append, as a view shows it: its
    marker names no quarantine (none is written, the bytes stay in the log)."""
    from .convert import unwritten_record

    if plan.status != "repaired":
        return []
    return [unwritten_record(record, plan.path) for record in plan.appended]


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    with contextlib.ExitStack() as stack:
        targets = _targets(args, stack, stdin=True)
        if len(targets) != 1:
            raise UsageError(f"show takes one session (got {len(targets)} targets)")
        [target] = targets
        if isinstance(target, Missing):
            raise target.error
        if _is_foreign(target):
            from .foreign import command

            try:
                return command.run_show(target, view_format=args.format, check=args.check, json_lines=args.json,
                                        out=out)
            except command.ForeignUsageError as exc:
                raise UsageError(str(exc)) from exc
        if target.note:
            note(f"note: {target.note}")
        with target.open(writing=False) as store:
            ids = target.sessions(store)
            if len(ids) != 1:
                raise UsageError(f"{target.text}: show needs exactly one session (found {len(ids)}); "
                                 "use --session ID")
            unit = "row" if scheme_of(target.url) in ("sqlite", "postgresql") else "offset"
            return _show(args, store, ids[0], out, unit)


def _show(args: argparse.Namespace, store: EventStore, sid: str, out: TextIO, unit: str = "offset") -> int:
    plan = store.repair(sid, force=True, dry_run=True)  # one scan: damage and what repair appends
    damage = plan.damage
    if damage is not None:  # torn or zero-filled tails too: the view is of the prefix, and says so
        note(f"warning: {sid}: {damage.kind} at {unit} {damage.offset}; showing the prefix before it")
    size = _session_bytes(store, sid) or None
    if args.format == "events":
        with progress(args, "reading", size) as meter:
            for record in _metered(repaired_view(store, sid, plan), meter):
                out.write(record.raw.decode("utf-8") + "\n")
        return EXIT_OK
    from . import projection

    # Two passes over the log (projection.stream_view): the pairing, then the view written
    # item by item. The second reads the records the first read, whatever a writer
    # appended meanwhile.
    meters: list[Meter] = []
    durable: list[int] = []
    appended = planned_records(plan)

    def read() -> Iterator[Any]:
        records = read_prefix(store, sid)
        if durable:
            records = itertools.islice(records, durable[0])
        n = 0
        for record in _metered(records, meters[-1]):
            n += 1
            yield record
        if not durable:
            durable.append(n)
        yield from appended

    with progress(args, "reading", size) as meter:
        meters.append(meter)
        view = projection.stream_view(read, args.format)
    with view:
        for issue in view.issues():
            note(f"note: {issue}")
        check = projection.PairingCheck(args.format) if args.check else None
        # A bar on stderr while the view goes to the same terminal would garble it.
        with progress(args if not out.isatty() else argparse.Namespace(quiet=True), "writing", size) as meter:
            meters.append(meter)
            document = view.to_json()
            key = "input" if "input" in document else "messages"
            if check is not None:
                document[key] = check.watch(document[key])
            if args.json:
                for item in projection.json_lines_of(document):
                    emit_json(out, item)
            else:
                write_pretty(out, document)
            del document
    if check is not None:
        violation = check.result()
        if violation is not None:
            note(f"pairing violation: {violation.message}")
            return EXIT_REPAIRABLE
    return EXIT_OK


def write_pretty(out: TextIO, document: dict[str, Any]) -> None:
    """``json.dumps(document, ensure_ascii=False, indent=2)`` and a newline, written one
    list item at a time (the same bytes without holding the whole text of a large view).
    A value may be an iterator of items (written as a list, read once)."""
    out.write("{")
    for n, (key, value) in enumerate(document.items()):
        out.write(("," if n else "") + "\n  " + json.dumps(key) + ": ")
        if isinstance(value, Iterator):
            first = next(value, _END)
            value = [] if first is _END else itertools.chain((first,), value)
        if not isinstance(value, (list, Iterator)) or (isinstance(value, list) and not value):
            out.write(json.dumps(value, ensure_ascii=False, indent=2).replace("\n", "\n  "))
            continue
        out.write("[")
        for i, item in enumerate(value):
            text = json.dumps(item, ensure_ascii=False, indent=2).replace("\n", "\n    ")
            out.write(("," if i else "") + "\n    " + text)
        out.write("\n  ]")
    out.write("\n}\n" if document else "}\n")


_END = object()


def _metered(records: Iterator[Any], meter: Meter) -> Iterator[Any]:
    for record in records:
        raw = getattr(record, "raw", None)
        if raw is not None:
            meter.advance(len(raw) + 1)
        yield record


# --- convert, compact, restore, bench, demo ---------------------------------------------


def _store_targets(texts: list[str], session: str | None, codes: list[int]) -> Iterator[StoreTarget]:
    """The store targets ``texts`` name, in order. One that names nothing is said on stderr
    and counted in ``codes`` as an error (the others still run); a malformed URL is a usage
    error."""
    for text in texts:
        try:
            targets = resolve(text, session=session)
        except TargetNotFound as exc:
            note(f"sessionlog: {exc}")
            codes.append(EXIT_ERROR)
            continue
        except InvalidStoreUrl as exc:
            raise UsageError(str(exc)) from exc
        yield from targets


def _convert_sources(args: argparse.Namespace, sources: list[str], codes: list[int]) -> Iterator[Any]:
    """convert's SRC targets in order: a foreign target (a Claude Code transcript, a Codex
    rollout or a directory of them: imported) or the store targets a text names."""
    for text in sources:
        claimed = _foreign_claim(text, args.input_format)
        if claimed is not None:
            yield claimed
        else:
            yield from _store_targets([text], args.session, codes)


def cmd_convert(args: argparse.Namespace, out: TextIO) -> int:
    from . import convert

    *sources, dst = args.targets
    if not sources:
        raise UsageError("convert needs SRC... DST")
    if args.force and not args.repaired:
        raise UsageError("--force applies to --repaired (the copy's cut): convert --repaired --force")
    if STDIN in args.targets:
        raise UsageError("convert does not read standard input (-): name a file or store")
    results = []
    codes: list[int] = []
    for target in _convert_sources(args, sources, codes):
        if _is_foreign(target):
            if args.session is not None:
                raise UsageError("--session picks a session of a store; a foreign file is one session: "
                                 "name the DST session as DIR/<id>.jsonl instead")
            from .foreign import command

            try:
                done = command.convert_target(target, dst, repaired=args.repaired, force=args.force)
            except command.ForeignUsageError as exc:
                raise UsageError(str(exc)) from exc
        else:
            if target.note:
                note(f"note: {target.note}")
            with progress(args, "converting", None, unit="records") as meter:
                done = convert.convert(target, dst, session=args.session, repaired=args.repaired,
                                       force=args.force, progress=meter.advance)
        for res in done:
            row = res.to_json()
            codes.append(res.exit_code)
            results.append(row)
            if args.json:
                emit_json(out, row)
            for warning in res.warnings:
                note(f"warning: {warning}")
    if not args.json:
        _print_result_table(results, out, ("session", "status", "records", "reason"))
    return worst(codes)


def cmd_compact(args: argparse.Namespace, out: TextIO) -> int:
    from . import convert

    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    if STDIN in args.targets:
        raise UsageError("compact does not read standard input (-): name a file or store")
    for target in _store_targets(args.targets, args.session, codes):
        with progress(args, "compacting", None, unit="records") as meter:
            try:
                done = convert.compact(target, session=args.session, progress=meter.advance)
            except convert.NothingToCompact as exc:
                raise UsageError(str(exc)) from exc
        for res in done:
            row = convert.compact_row(res)
            codes.append(res.exit_code)
            rows.append(row)
            if args.json:
                emit_json(out, row)
    if not args.json:
        _print_result_table(rows, out, ("session", "status", "frames_before", "frames_after",
                                        "bytes_before", "bytes_after", "reason"))
    return worst(codes)


def cmd_restore(args: argparse.Namespace, out: TextIO) -> int:
    from .restore import RestoreRefused, restore

    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    with contextlib.ExitStack() as stack:
        for target in _targets(args, stack, stdin=False, foreign=False):
            if isinstance(target, Missing):
                note(f"sessionlog: {target.error}")
                codes.append(EXIT_ERROR)
                continue
            store = _open(target, args, out, codes, writing=not args.dry_run)
            if store is None:
                continue
            with store:
                for sid in target.sessions(store):
                    try:
                        row = restore(store, sid, dry_run=args.dry_run).to_json()
                        code = EXIT_OK if row["status"] != "refused" else EXIT_ERROR
                    except RestoreRefused as exc:
                        raise UsageError(str(exc)) from exc
                    except SessionLocked as exc:
                        row, code = {"session": sid, "status": "locked", "reason": str(exc)}, EXIT_LOCKED
                    except SessionLogError as exc:
                        row, code = {"session": sid, "status": "error", "reason": str(exc)}, EXIT_ERROR
                    if args.dry_run:
                        row["dry_run"] = True
                    codes.append(code)
                    rows.append(row) if not args.json else emit_json(out, row)
    if not args.json:
        _print_result_table(rows, out, ("session", "status", "offset", "restored_bytes", "removed_records",
                                        "reason"), dry_run=args.dry_run)
        for row in rows:
            if row.get("status") == "restored":
                verb = "would put back" if args.dry_run else "put back"
                console(out).print(f"{row['session']}: {verb} the bytes of {row['quarantine']}",
                                   markup=False, soft_wrap=True)
    return worst(codes)


def cmd_salvage(args: argparse.Namespace, out: TextIO) -> int:
    from .salvage import salvage
    from .targets import destination

    try:
        if os.path.isdir(args.source):
            raise TargetNotFound(f"{args.source}: is a directory; salvage reads one log file (name it: DIR/<id>.jsonl)")
        if not os.path.lexists(args.source):
            raise TargetNotFound(f"{args.source}: no such log file")
        if not os.path.isfile(args.source):
            raise TargetNotFound(f"{args.source}: not a regular file ({_file_kind(args.source)}); salvage reads "
                                 "one log file")
        dst_url, named = destination(args.dst)
        report = salvage(args.source, dst_url)
    except SessionLogError as exc:
        if args.json:  # a row on every command, a failure's too
            emit_json(out, {"session": None, "source": args.source, "error": str(exc)})
        raise
    if named is not None and named != report.session:
        note(f"note: the session is {report.session!r} (its header's id), not {named!r}")
    row = report.to_json()
    if args.json:
        emit_json(out, row)
    else:
        lost = f", {report.gaps} gap(s) marked log/truncated and the records after them re-sequenced" \
            if report.gaps else ""
        console(out).print(f"{report.session}: kept {report.kept} records ({report.copied} byte for byte{lost}), "
                           f"left out {report.dropped} that did not continue the seq; unreadable regions at "
                           f"offsets {report.damaged_regions or 'none'}; written to {dst_url}",
                           markup=False, soft_wrap=True)
        if report.unverified:
            first, last = report.unverified_range()  # type: ignore[misc]
            note(f"warning: records {first}..{last} come from a frame that failed its checksum: they decode, "
                 "but a flipped byte may have altered them; check them before trusting them")
    return EXIT_OK


def _file_kind(path: str) -> str:
    """What the name ``path`` is, in words, when it is not a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return exc.strerror or str(exc)
    for test, kind in ((stat.S_ISLNK, "a dangling symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a file"


def _print_result_table(rows: list[dict[str, Any]], out: TextIO, columns: Sequence[str], *,
                        dry_run: bool = False) -> None:
    from rich.table import Table

    if not rows:
        return
    table = Table(show_edge=False, header_style="bold", title="dry run: nothing written" if dry_run else None)
    for col in columns:
        table.add_column(col.replace("_", " "), justify="right" if col.startswith(("records", "frames", "bytes"))
                         else "left")
    for row in rows:
        table.add_row(*(_styled(str(row[c])) if c == "status" else ("" if row.get(c) is None else str(row[c]))
                        for c in columns))
    console(out).print(table)


def cmd_bench(args: argparse.Namespace, out: TextIO) -> int:
    from . import bench

    return int(bench.main(args.rest) or 0)


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from .demo import run_demo

    return run_demo(out, keep=args.keep)


# --- entry point -------------------------------------------------------------------------

TARGET_HELP = ("log files, store directories, or store URLs (jsonl:DIR, zstd:DIR, sqlite:///FILE, "
               "postgresql+psycopg://...); a log file is the session its header names")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionlog",
        description="Crash-safe storage for agent session logs: scan, repair and view them.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"sessionlog {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_: str, exit_help: str, *, stdin: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, epilog=exit_help)
        p.add_argument("targets", nargs="+", metavar="TARGET",
                       help=TARGET_HELP + ("; - reads standard input" if stdin else ""))
        p.add_argument("--session", metavar="ID", help="one session of the store")
        p.add_argument("--quiet", "--no-progress", action="store_true", dest="quiet",
                       help="no progress bar on standard error")
        return p

    def foreign_formats(p: argparse.ArgumentParser) -> None:
        p.add_argument("--input-format", choices=("claude-code", "codex"), default=None,
                       help="read TARGET as a Claude Code transcript or a Codex rollout (default: by content)")

    p = command("scan", "validate sessions without writing anything",
                "exit codes: 0 clean/open/suspended, 1 repairable, 2 usage, 3 needs --force, 4 error (no such target "
                "or session, I/O, not a session log, unsupported format); the worst over all sessions",
                stdin=True)
    foreign_formats(p)
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.set_defaults(func=cmd_scan)

    p = command("repair", "quarantine damaged tails and close open transcripts",
                "exit codes: 0 clean or repaired, 2 usage, 3 needs --force (left unchanged), 4 error, "
                "5 a writer holds the session; the worst over all sessions")
    foreign_formats(p)
    p.add_argument("--dry-run", action="store_true", help="report what would be done; write nothing")
    p.add_argument("--force", action="store_true", help="also cut mid-log damage and seq breaks (point in time)")
    p.add_argument("--expire-approvals", action="store_true",
                   help="answer calls awaiting approval TOOL_NOT_STARTED and close their step and turn")
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.set_defaults(func=cmd_repair)

    p = command("show", "print the repaired view of one session without writing",
                "exit codes: 0 shown, 1 --check found a pairing violation, 2 usage (not exactly one "
                "session), 4 error", stdin=True)
    foreign_formats(p)
    p.add_argument("--format", choices=("events", "openai", "anthropic", "responses"), default="events")
    p.add_argument("--check", action="store_true", help="check call/result pairing of the view (exit 1 on a violation)")
    p.add_argument("--json", action="store_true",
                   help="JSON Lines: one event, message or input item per line (events always are)")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "convert", help="copy sessions between stores, records byte-identical",
        description="Copy every session of each SRC (or one, --session) into DST, records byte-identical. "
        "SRC is never written; a DST session is never overwritten (one that already holds the same records "
        "is skipped, so an interrupted convert can be run again). A Claude Code transcript or Codex rollout "
        "(or a directory of them) is imported: one new session per file holding the conversation the tool "
        "resumes.",
        epilog="exit codes: 0 done, 1 a SRC session is damaged and repairable (--repaired converts its "
        "repaired view), 2 usage, 3 its damage needs --repaired --force, 4 error (no such SRC, I/O, a "
        "different DST session of that id exists), 5 a writer holds the SRC session",
    )
    p.add_argument("targets", nargs="+", metavar="SRC... DST", help=TARGET_HELP + "; the last is DST")
    p.add_argument("--session", metavar="ID")
    foreign_formats(p)
    p.add_argument("--repaired", action="store_true", help="write the repaired view of a damaged source")
    p.add_argument("--force", action="store_true",
                   help="with --repaired: also cut mid-log damage and seq breaks in the copy (SRC untouched)")
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.add_argument("--quiet", "--no-progress", action="store_true", dest="quiet")
    p.set_defaults(func=cmd_convert)

    p = command("compact", "rewrite Zstd sessions into larger frames",
                "exit codes: 0 compacted or unchanged, 1 damaged (repair first), 2 usage (a store without "
                "frames), 3 damaged and needs repair --force, 4 error, 5 a writer holds the session")
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.set_defaults(func=cmd_compact)

    p = command("restore", "undo the latest repair: put the quarantined bytes back into the log",
                "exit codes: 0 restored (or nothing to restore), 2 usage (not a file store), 4 error or "
                "refused (it cannot be done without loss: nothing changed), 5 a writer holds the session")
    p.add_argument("--dry-run", action="store_true", help="check that it can be done; write nothing")
    p.add_argument("--json", action="store_true", help="one JSON object per session per line")
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser(
        "salvage", help="rebuild a damaged log's session in a new store from every record that still decodes",
        description="Read a damaged log file as far as it goes (JSONL lines; Zstd frames up to where they "
        "fail, then the next frame) and write every record that still decodes to a new session in DST. "
        "The source is never written.",
        epilog="exit codes: 0 salvaged, 2 usage, 4 error (no such file, no header decodes, DST already has "
        "the session, I/O)")
    p.add_argument("source", metavar="LOG", help="the damaged log file")
    p.add_argument("dst", metavar="DST", help="a store URL or directory (a new session is created there)")
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
    p.set_defaults(func=cmd_salvage)

    p = sub.add_parser("bench", help="durable append throughput against the device ceiling", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("demo", help="crash a writer mid tool call, then scan, repair and show")
    p.add_argument("--keep", action="store_true", help="keep the demo directory")
    p.set_defaults(func=cmd_demo)
    return parser


def _run(args: argparse.Namespace, out: TextIO) -> int:
    """The command, then the stores its targets opened closed (see targets.close_opened)."""
    try:
        return int(args.func(args, out))
    finally:
        close_opened()


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (a subcommand of ``parser``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]  # type: ignore[no-any-return]
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = _PrintableOut(out if out is not None else sys.stdout)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the harness parses its own options
        from . import bench

        return int(bench.main(argv[1:]) or 0)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            # argparse gives a list positional only the paths before the first option:
            # ``convert SRC --repaired DST`` names DST after one. Other extras are errors.
            if getattr(args, "command", None) == "convert" and not any(x.startswith("-") for x in extra):
                args.targets += extra
            else:  # the command's own usage, naming it
                _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return _run(args, out)
    except (UsageError, InvalidStoreUrl) as exc:
        note(f"sessionlog: {exc}")
        return EXIT_USAGE
    except SessionLocked as exc:
        note(f"sessionlog: {exc}")
        return EXIT_LOCKED
    except SessionLogError as exc:
        note(f"sessionlog: {exc}")
        return EXIT_ERROR
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - no second error at exit
        return EXIT_OK
    except OSError as exc:  # a backstop: the engine wraps these, the command never tracebacks
        note(f"sessionlog: {exc.filename or ''} {exc.strerror or exc}".strip())
        return EXIT_ERROR
    except KeyboardInterrupt:
        note("sessionlog: interrupted")
        return 130
    except Exception as exc:  # a bug: not exit 1, which says "repairable"
        traceback.print_exc()
        note(f"sessionlog: internal error: {type(exc).__name__}: {exc} (a bug: please report it, with the "
             "traceback above)")
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
