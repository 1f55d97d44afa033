"""The command line for foreign files: ``scan``, ``repair``, ``show`` and ``convert`` of a
Claude Code transcript or Codex rollout (or a directory of them), with sessionlog's
statuses, exit codes, tables and ``--json`` rows.

:func:`claim` is the hook the ``sessionlog`` command calls first: it returns a
:class:`ForeignTarget` when the target is a foreign file or a directory holding them (by
content, or forced with ``--input-format``), else None and the command goes on as for
sessionlog logs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from .. import exits
from ..contract import SessionLogError, Status
from ..convert import ConvertResult, Destination, publish
from ..durable import read_head
from ..events import Record, RecordError, encode_record, header_event, valid_session_id
from ..targets import destination
from . import FORMATS, HEAD_BYTES, Examination, ForeignFormat, examine, get, sniff
from .files import OpenFiles, in_use, open_files, read, write_repair
from .lines import LONE_SURROGATE, dumps, dumps_strict
from ..terminal import console as terminal_console

STATUS_EXIT = {
    Status.CLEAN: exits.OK,
    Status.OPEN: exits.OK,
    Status.REPAIRABLE: exits.REPAIRABLE,
    Status.NEEDS_FORCE: exits.NEEDS_FORCE,
    Status.ERROR: exits.ERROR,
}
SKIPPED_SUFFIXES = (".orig", ".quarantine", ".tmp")


class ForeignUsageError(SessionLogError):
    """A foreign target the command cannot work on as asked (exit 2)."""


@dataclass(slots=True)
class ForeignTarget:
    """The foreign files a command-line target names: (path, format) pairs; ``root`` is
    the directory given (paths are shown relative to it), or None for one file."""

    files: list[tuple[str, ForeignFormat]]
    root: str | None
    skipped: int = 0  # files of no format known here
    log_dirs: dict[str, int] = field(default_factory=dict)  # directory -> sessionlog logs in it (skipped)
    other_format: int = 0  # files shown to be another format than --input-format's (skipped)
    shown_as: str | None = None  # how to name the one file in what is printed (standard input: "-")


def _is_sessionlog(head: bytes) -> bool:
    return head.startswith(b'{"seq":')


def _jsonl_files(root: str) -> Iterator[str]:
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.endswith((".jsonl", ".jsonl.zst")) and not name.startswith("."):
                yield os.path.join(directory, name)


def _shown_otherwise(head: bytes, forced: ForeignFormat) -> str | None:
    """What a file's first bytes show it to be when that is not ``forced``'s format (a
    sessionlog log, the other foreign format), else None. Forcing a format is for a file
    its content does not reveal: read as the wrong format, a file would look clean."""
    if _is_sessionlog(head):
        return "a sessionlog log"
    found = sniff(head)
    return f"a {found.title}" if found is not None and found is not forced else None


def claim(target: str, input_format: str | None = None) -> ForeignTarget | None:
    """The foreign files ``target`` names, or None when it is not foreign (a sessionlog
    log, store or URL; something unrecognizable is left to the caller too).

    A file is foreign when its content is a known format (or ``input_format`` says so). A
    directory is foreign when files under it (recursively: ``~/.codex/sessions/``) are and
    no sessionlog log lies directly in it; unrecognized files under it are skipped.
    Raises ForeignUsageError for an unknown ``input_format``."""
    forced: ForeignFormat | None = None
    if input_format is not None:
        if input_format not in FORMATS:
            raise ForeignUsageError(f"unknown input format {input_format!r}; known: {', '.join(FORMATS)}")
        forced = get(input_format)
    if os.path.exists(target) and not os.path.isdir(target):
        head = read_head(target, HEAD_BYTES)
        if forced is not None:
            other = _shown_otherwise(head, forced)
            if other is not None:
                raise ForeignUsageError(f"{target}: --input-format {forced.name}, but its content is {other}")
            return ForeignTarget([(target, forced)], None)
        if _is_sessionlog(head):
            return None
        fmt = sniff(head)
        return ForeignTarget([(target, fmt)], None) if fmt is not None else None
    if not os.path.isdir(target):
        if forced is not None:
            raise ForeignUsageError(f"{target}: no such file or directory")
        return None
    try:
        top = os.listdir(target)
    except OSError:
        return None
    if forced is None and any(
            (name.endswith(".jsonl") or name.endswith(".jsonl.zst")) and not name.startswith(".")
            and (name.endswith(".zst") or _is_sessionlog(read_head(os.path.join(target, name), HEAD_BYTES))) for name in top):
        return None
    found = ForeignTarget([], target)
    for path in _jsonl_files(target):
        if path.endswith(".jsonl.zst"):
            found.log_dirs[os.path.dirname(path)] = found.log_dirs.get(os.path.dirname(path), 0) + 1
            continue
        head = read_head(path, HEAD_BYTES)
        if _is_sessionlog(head):
            found.log_dirs[os.path.dirname(path)] = found.log_dirs.get(os.path.dirname(path), 0) + 1
            continue
        if forced is None:
            fmt = sniff(head)
        else:  # a file shown to be the other format is skipped, as unknown ones are
            fmt = forced if _shown_otherwise(head, forced) is None else None
            if fmt is None and sniff(head) is not None:
                found.other_format += 1
                continue
        if fmt is None:
            found.skipped += 1
        else:
            found.files.append((path, fmt))
    if not found.files and forced is None:
        return None
    return found


@contextlib.contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for long runs over a terminal."""
    if not sys.stderr.isatty() or total < 20:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _name(target: ForeignTarget, path: str) -> str:
    if target.shown_as is not None:
        return target.shown_as
    return os.path.relpath(path, target.root) if target.root is not None else os.path.basename(path)


def _session(path: str, exam: Examination | None) -> str:
    if exam is not None and exam.analysis.session:
        return exam.analysis.session
    name = os.path.basename(path)
    return name[: -len(".jsonl")] if name.endswith(".jsonl") else name


def _skipped_note(target: ForeignTarget) -> None:
    if target.log_dirs:
        count = sum(target.log_dirs.values())
        dirs = sorted(target.log_dirs)
        shown = ", ".join(dirs[:3]) + (f" and {len(dirs) - 3} more" if len(dirs) > 3 else "")
        if dirs == [target.root]:  # only with --input-format: a directory of logs is a store otherwise
            print(f"note: {count} sessionlog log(s) in {target.root} are not read as Claude Code or Codex "
                  "files: name the directory without --input-format to work on them", file=sys.stderr)
        else:
            print(f"note: {count} sessionlog log(s) under {target.root} are not scanned with the Claude Code "
                  f"and Codex files: name their directory to work on them ({shown})", file=sys.stderr)
    if target.other_format:
        print(f"note: {target.other_format} file(s) under {target.root} are of another format than "
              "--input-format says; skipped", file=sys.stderr)
    if target.skipped:
        print(f"note: {target.skipped} *.jsonl file(s) under {target.root} are neither a Claude Code "
              "transcript, a Codex rollout nor a sessionlog log; skipped", file=sys.stderr)


# --- scan ------------------------------------------------------------------------------


def scan_row(path: str, fmt: ForeignFormat, name: str, held: OpenFiles | None = None, *,
             shown: str | None = None) -> dict[str, Any]:
    """What a scan says about one file, in the keys of a sessionlog scan row plus
    ``file``, ``format``, ``orphan_results``, ``findings`` and ``in_use`` (``held``: the
    open files of other processes, taken once for many files; ``shown``: the name the row
    gives the file, standard input's "-", say). Never writes."""
    shown = path if shown is None else shown
    try:
        snap = read(path)
        exam = examine(snap.data, fmt)
        busy = in_use(path, fmt, held)
    except SessionLogError as exc:
        return {"session": _session(shown, None), "file": name, "path": shown, "format": fmt.name,
                "records": None, "status": str(Status.ERROR), "damage": None, "open_turn": None,
                "open_step": None, "unanswered_calls": [], "orphan_results": [], "findings": [],
                "in_use": [], "error": str(exc).replace(path, shown)}
    damage = exam.tail_damage
    status = exam.status(in_use=bool(busy))
    if not exam.lines or not any(line.obj is not None for line in exam.lines):
        status = Status.ERROR
    row = {
        "session": _session(shown, exam), "file": name, "path": shown, "format": fmt.name,
        "records": len(exam.lines), "status": str(status),
        "damage": damage.to_json() if damage is not None else None,
        "open_turn": None, "open_step": None,
        "unanswered_calls": list(exam.analysis.unanswered), "orphan_results": list(exam.analysis.orphans),
        "findings": [f.to_json() for f in exam.findings], "in_use": busy,
    }
    if status is Status.ERROR:
        row["error"] = f"{shown}: no line decodes as a {fmt.title}"
    elif status is Status.NEEDS_FORCE and (refusal := exam.in_place_refusal) is not None:
        row["reason"] = refusal
    return row


def run_scan(target: ForeignTarget, *, as_json: bool, out: TextIO) -> int:
    rows = []
    codes = []
    held = open_files()
    with _progress("scanning", len(target.files)) as advance:
        for path, fmt in target.files:
            row = scan_row(path, fmt, _name(target, path), held, shown=target.shown_as)
            codes.append(STATUS_EXIT[Status(row["status"])])
            if as_json:
                out.write(dumps(row) + "\n")
            else:
                rows.append(row)
            advance(1)
    if not as_json:
        _scan_table(rows, out)
    _skipped_note(target)
    return exits.worst(codes)


STYLES = {"clean": "green", "open": "cyan", "repairable": "yellow", "needs-force": "red", "error": "red",
          "repaired": "green", "refused": "red"}


def _scan_table(rows: list[dict[str, Any]], out: TextIO) -> None:
    if not rows:
        print("note: no Claude Code transcripts or Codex rollouts", file=sys.stderr)
        return
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for col in ("file", "format", "status", "lines", "damage", "offset", "tail bytes", "unanswered", "orphans"):
        table.add_column(col, justify="right" if col in ("lines", "offset", "tail bytes") else "left")
    for row in rows:
        d = row["damage"] or {}
        table.add_row(
            row["file"], row["format"], f"[{STYLES[row['status']]}]{row['status']}[/]",
            "" if row["records"] is None else str(row["records"]), d.get("kind", ""), str(d.get("offset", "")),
            str(d.get("length", "")), ", ".join(row["unanswered_calls"]), ", ".join(row["orphan_results"]))
    console = terminal_console(out)
    console.print(table)
    for row in rows:
        for finding in row["findings"]:
            console.print(f"{row['file']}:{finding['line']}: {finding['detail']}", markup=False, highlight=False)
        for why in row["in_use"]:
            console.print(f"{row['file']}: in use: {why}", markup=False, highlight=False)
        if row.get("reason"):
            console.print(f"{row['file']}: repair refuses it: {row['reason']}", markup=False, highlight=False)
        if "error" in row:
            console.print(f"[red]{row['file']}[/]: {row['error']}", highlight=False)


# --- repair ----------------------------------------------------------------------------


def repair_file(path: str, fmt: ForeignFormat, *, force: bool, dry_run: bool) -> tuple[dict[str, Any], int]:
    """Repair one file (or, with ``dry_run``, say what repair would do, writing nothing):
    the report row and its exit code (0 clean or repaired, 3 refused: it needs --force, or
    the tool keeps byte offsets into the file and the repair would not only append to it
    (:attr:`Examination.in_place_refusal`, --force included), 5 in use by a live process, 4
    an error). The plan is checked in memory before anything is written: the repaired file
    must need no further repair."""
    row: dict[str, Any] = {"session": _session(path, None), "path": path, "format": fmt.name,
                           "status": "clean", "reason": None, "truncated_bytes": 0, "quarantine": None,
                           "backup": None, "appended": [], "changed_lines": []}
    if dry_run:
        row["dry_run"] = True
    try:
        snap = read(path)
        exam = examine(snap.data, fmt, force=force)
        row["session"] = _session(path, exam)
        if not any(line.obj is not None for line in exam.lines):
            row.update(status="refused", reason=f"no line decodes as a {fmt.title}")
            return row, exits.ERROR
        if exam.plan.empty and not exam.needs_force and exam.analysis.unreadable_from is None \
                and exam.analysis.refusal is None:
            return row, exits.OK
        busy = in_use(path, fmt)  # fresh, just before deciding to write
        if busy and not force:
            row.update(status="refused", reason="in use by a live process: " + "; ".join(busy)
                       + " (repair --force to repair anyway)")
            return row, exits.LOCKED
        refusal = exam.in_place_refusal  # --force or not: the tool keeps offsets into the file
        if refusal is not None:
            row.update(status="refused", reason=f"{path}: {refusal}")
            return row, exits.NEEDS_FORCE
        if exam.needs_force and not force:
            damage = exam.tail_damage
            assert damage is not None
            row.update(status="refused", reason=damage.refusal())
            return row, exits.NEEDS_FORCE
        if exam.plan.empty:
            return row, exits.OK
        again = examine(exam.repaired(), fmt, force=force)
        if not again.plan.empty:
            row.update(status="refused", reason="the repair would not leave a clean file (a bug: please report "
                       "it with the file); nothing written")
            return row, exits.ERROR
        plan = exam.plan
        row.update(status="repaired", truncated_bytes=sum(map(len, plan.quarantined(exam.lines))),
                   appended=list(plan.added), changed_lines=plan.changed_lines())
        if not dry_run:
            written = write_repair(snap, exam)
            row.update(backup=written.backup, quarantine=written.quarantine)
    except SessionLogError as exc:
        row.update(status="refused", reason=str(exc), error=str(exc))
        return row, exits.ERROR
    return row, exits.OK


def run_repair(target: ForeignTarget, *, force: bool, dry_run: bool, as_json: bool, out: TextIO) -> int:
    rows = []
    codes = []
    with _progress("repairing", len(target.files)) as advance:
        for path, fmt in target.files:
            row, code = repair_file(path, fmt, force=force, dry_run=dry_run)
            row["file"] = _name(target, path)
            codes.append(code)
            if as_json:
                out.write(dumps(row) + "\n")
            else:
                rows.append(row)
            advance(1)
    if not as_json:
        _repair_table(rows, out, dry_run=dry_run)
    _skipped_note(target)
    return exits.worst(codes)


def _repair_table(rows: list[dict[str, Any]], out: TextIO, *, dry_run: bool) -> None:
    if not rows:
        print("note: no Claude Code transcripts or Codex rollouts", file=sys.stderr)
        return
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold", title="dry run: nothing written" if dry_run else None)
    for col in ("file", "format", "status", "cut bytes", "answered", "changed lines", "backup / reason"):
        table.add_column(col)
    for row in rows:
        status = "would repair" if dry_run and row["status"] == "repaired" else row["status"]
        answered = ", ".join(f"{a['call_id']} {a['code']}" for a in row["appended"])
        table.add_row(row["file"], row["format"], f"[{STYLES.get(row['status'], 'white')}]{status}[/]",
                      str(row["truncated_bytes"]), answered, ", ".join(map(str, row["changed_lines"])),
                      os.path.basename(row["backup"]) if row["backup"] else (row["reason"] or ""))
    console = terminal_console(out)
    console.print(table)
    for row in rows:
        if row["quarantine"]:
            console.print(f"{row['file']}: removed lines kept in {row['quarantine']}", markup=False, highlight=False)


# --- show ------------------------------------------------------------------------------


def run_show(target: ForeignTarget, *, view_format: str, check: bool, out: TextIO, json_lines: bool = False) -> int:
    """Print the view of the file as repair would leave it (nothing written). ``--check``
    judges that view with the pairing checker of ``view_format`` and the tool's own
    conversation as it would resume it from the repaired file with the checker of its
    provider: exit 1 on a violation (a repair that would not leave a valid conversation).
    The file as it is is judged by scan; a file that needs repair is noted on stderr.
    ``json_lines``: the view one item per line (see :func:`~sessionlog.projection.json_lines_of`)
    instead of one indented document."""
    if len(target.files) != 1:
        raise ForeignUsageError(f"{target.root}: show needs exactly one file (found {len(target.files)})")
    path, fmt = target.files[0]
    shown = path if target.shown_as is None else target.shown_as
    from ..projection import check_pairing, json_lines_of, project

    snap = read(path)
    exam = examine(snap.data, fmt, force=True)
    damage = exam.tail_damage
    if damage is not None:
        print(f"warning: {shown}: {damage.kind} at offset {damage.offset} ({damage.reason}); showing the file "
              f"without {'the undecodable lines' if exam.needs_force else 'its damaged last line'}", file=sys.stderr)
    as_is = check_pairing(fmt.native_items(exam.lines), fmt.native_view)
    if as_is is not None:
        fixes = ("`sessionlog repair` fixes it" if exam.in_place_refusal is None
                 else "`sessionlog repair` refuses to change it (see `sessionlog scan`)")
        print(f"note: {shown} as it is fails the {fmt.native_view} pairing check ({as_is.message}); "
              f"{fixes}; this is the repaired view", file=sys.stderr)
    for finding in exam.findings:  # what the view differs from the file by, and what it cannot mend
        print(f"note: {shown}:{finding.line}: {finding.detail}", file=sys.stderr)
    lines = exam.repaired_lines()
    events = fmt.events(lines)
    if view_format == "events":
        for event in events:  # as a record line: seq and ts first, compact
            record = {"seq": event["seq"], "ts": event["ts"]} | event
            out.write(dumps(record, separators=(",", ":")) + "\n")
        return exits.OK
    view = project(events, view_format)
    for issue in view.issues:
        print(f"note: {issue}", file=sys.stderr)
    if json_lines:
        for item in json_lines_of(view.to_json()):
            out.write(dumps(item) + "\n")
    else:
        out.write(dumps(view.to_json(), indent=2) + "\n")
    if check:
        violation = check_pairing(view.items, view_format) or check_pairing(fmt.native_items(lines), fmt.native_view)
        if violation is not None:
            print(f"pairing violation: {violation.message}", file=sys.stderr)
            return exits.REPAIRABLE
    return exits.OK


# --- convert ----------------------------------------------------------------------------


def import_records(session: str, fmt: ForeignFormat, path: str, events: list[dict[str, Any]]) -> list[Record]:
    """A foreign conversation as a sessionlog session's records: a ``session/start`` header
    naming where it came from (``source``: the format and the file), then ``events``
    (:meth:`ForeignFormat.events`: what the tool resumes) with seqs from 2 and the times
    of their entries. The same file gives the same bytes. Raises RecordError for an event
    that cannot be a record (nested deeper than the format allows)."""
    first_ts = next((e["ts"] for e in events if e.get("ts")), 0.0)
    header = dict(header_event(session), source={"format": fmt.name, "path": os.path.abspath(path)})
    records = [Record.from_line(encode_record(header, 1, first_ts))]
    for seq, event in enumerate(events, start=2):
        body = {k: v for k, v in event.items() if k != "seq"}
        records.append(Record.from_line(encode_record(body, seq)))
    return records


def convert_file(path: str, fmt: ForeignFormat, dst: Destination, *, repaired: bool, force: bool,
                 session: str | None = None, held: OpenFiles | None = None) -> ConvertResult:
    """Import one foreign file into DST as a new sessionlog session (``session``, or the
    tool's own session id, or the file's name): the conversation the tool resumes
    (:func:`import_records`). SRC is never written. A file that needs repair is "refused"
    unless ``repaired`` (then the conversation as ``sessionlog repair`` would leave the
    file is imported; damage before the end also needs ``force``); a file a live process
    uses is "locked". A DST session already holding these records is "skipped", a
    different one is left as it is ("exists"). ``held``: the open files of other
    processes, taken once for many files (see :func:`files.open_files`)."""
    sid = session or _session(path, None)
    try:
        snap = read(path)
        exam = examine(snap.data, fmt, force=force)
    except SessionLogError as exc:
        return ConvertResult(sid, "error", reason=str(exc))
    sid = session or _session(path, exam)
    if not any(line.obj is not None for line in exam.lines):
        return ConvertResult(sid, "error", reason=f"{path}: no line decodes as a {fmt.title}")
    if not valid_session_id(sid):
        return ConvertResult(sid, "error", reason=f"{path}: {sid!r} is not a valid session id; name the DST "
                             "session: DIR/<id>.jsonl")
    busy = in_use(path, fmt, held)
    if busy:
        return ConvertResult(sid, "locked", reason="in use by a live process: " + "; ".join(busy)
                             + "; convert it when it is done")
    if exam.needs_force and not (repaired and force):
        damage = exam.tail_damage
        assert damage is not None
        return ConvertResult(sid, "refused", needs_force=True,
                             reason=f"SRC is damaged: {damage.refusal()}; convert --repaired --force imports the "
                             "conversation without the undecodable lines (SRC is never written)")
    if not exam.plan.empty and not repaired:
        found = exam.findings
        damage = exam.tail_damage
        if found:
            first = f"line {found[0].line}: {found[0].detail}"
        elif damage is not None:
            first = f"{damage.kind} at offset {damage.offset} ({damage.reason})"
        else:  # pragma: no cover - a plan without findings cuts a damaged tail
            first = "a damaged last line"
        return ConvertResult(sid, "refused", reason=f"SRC needs repair ({len(found) or 1} finding(s); "
                             f"first: {first}); convert --repaired imports the repaired conversation "
                             "(SRC is never written)")
    events, replaced = _strict_text(fmt.events(exam.repaired_lines() if repaired else exam.lines))
    try:
        records = import_records(sid, fmt, path, events)
    except RecordError as exc:
        return ConvertResult(sid, "error", reason=f"{path}: an entry cannot be a sessionlog record: {exc.reason}")
    result = publish(dst, sid, lambda: records, len(records))
    if replaced:
        result.warnings += (f"{path}: {replaced} lone UTF-16 surrogate(s) (half an emoji, cut by the tool) "
                            "written as U+FFFD: a sessionlog record is strict UTF-8",)
    return result


def _strict_text(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """``events`` with every lone surrogate in their strings (keys included) replaced by
    U+FFFD, and how many were; the events themselves when there is none (the common case,
    found by encoding them once)."""
    try:
        dumps_strict(events)
        return events, 0
    except UnicodeEncodeError:
        pass
    count = 0

    def fix(value: Any) -> Any:
        nonlocal count
        if isinstance(value, str):
            found = len(LONE_SURROGATE.findall(value))
            if found:
                count += found
                return LONE_SURROGATE.sub("\ufffd", value)
            return value
        if isinstance(value, dict):
            return {fix(k): fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    return [fix(e) for e in events], count


def convert_target(target: ForeignTarget, dst_text: str, *, repaired: bool, force: bool) -> list[ConvertResult]:
    """:func:`convert_file` for every file of ``target`` into the store ``dst_text`` names
    (a path or URL; a new ``DIR/<id>.jsonl`` names the session of a single file). Raises
    ForeignUsageError when DST names one session but SRC holds several files."""
    dst_url, dst_session = destination(dst_text)
    if dst_session is not None and len(target.files) != 1:
        raise ForeignUsageError(f"{dst_text} names one session, but {target.root} holds {len(target.files)} files")
    held = open_files()
    with Destination(dst_url) as dst, _progress("converting", len(target.files)) as advance:
        results = []
        written: dict[str, str] = {}  # session -> the file of this run it was imported from
        for path, fmt in target.files:
            result = convert_file(path, fmt, dst, repaired=repaired, force=force, session=dst_session, held=held)
            if result.status == "exists" and result.session in written:
                result.reason = (f"{path} names session {result.session!r}, which {written[result.session]} "
                                 "also names and was imported as; not overwritten. Import this file under "
                                 f"another id: sessionlog convert {path} DIR/<id>.jsonl")
            elif result.status in ("converted", "skipped"):
                written.setdefault(result.session, path)
            results.append(result)
            advance(1)
        return results
