"""Offline store-to-store tools: ``convert`` between any two backends, ``compact``.

Built on the public store API only (``open_store``, ``scan``, ``read``, ``repair`` with
``dry_run``, ``import_session``): every record is copied as its exact bytes, unknown
fields included; a DST session is never overwritten (``import_session`` publishes a new
session atomically or raises ``SessionExists``) and SRC is never written.

Exit codes, for a command that reports several sessions (worst wins: 4 > 5 > 3 > 1 > 0):
0 every session done (or already identical in DST) · 1 a session's damage is repairable
(``--repaired``) · 3 a session's damage needs ``--repaired --force`` · 4 an error: I/O,
not a session log, unsupported format, a different DST session of that id · 5 a writer
owns the session. ``compact`` of a store without frames is one usage error (exit 2).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from . import InvalidStoreUrl, open_store, scheme_of
from .contract import (
    CompactReport,
    EventStore,
    InvalidEvent,
    ScanResult,
    SessionExists,
    SessionLogError,
    SessionNotFound,
    read_prefix,
)
from .durable import printable
from .events import LOG_TRUNCATED, Record
from .exits import worst
from .targets import StoreTarget, destination, local_path, resolve, resolve_target

__all__ = ["ConvertResult", "Destination", "NothingToCompact", "SkippableFramesDropped", "compact", "compact_row",
           "convert", "digest", "exit_code", "publish", "resolve_target"]


class SkippableFramesDropped(UserWarning):
    """SRC held zstd skippable frames (metadata readers skip); DST does not keep them."""


class NothingToCompact(SessionLogError):
    """``compact`` on a store whose backend has no frames (JSONL, SQL, memory): a usage
    error for the whole store (exit 2), not one per session."""


@dataclass(slots=True)
class ConvertResult:
    """What ``convert`` did with one session.

    ``status``: "converted"; "skipped" (DST already holds exactly these records, e.g. from
    an interrupted run: left as it is); "exists" (DST holds a different session of that id:
    left untouched); "refused" (SRC is damaged and ``repaired`` was not asked, or its damage
    needs ``force``; ``scan`` is the report); "locked" (a writer owns the SRC session);
    "error" (not a session log, unsupported format, I/O). ``records`` is the number written
    (or found identical)."""

    session: str
    status: str
    records: int = 0
    reason: str | None = None
    scan: ScanResult | None = None
    warnings: tuple[str, ...] = ()
    needs_force: bool = False  # refused for damage that needs --force, where no scan says so (a foreign file)

    @property
    def exit_code(self) -> int:
        if self.status in ("converted", "skipped"):
            return 0
        if self.status == "locked":
            return 5
        if self.status == "refused":
            damage = self.scan.damage if self.scan is not None else None
            return 3 if self.needs_force or (damage is not None and damage.kind.needs_force) else 1
        return 4

    def to_json(self) -> dict[str, Any]:
        """The command line's ``--json`` row."""
        return {"session": self.session, "status": self.status, "records": self.records,
                "reason": self.reason, "warnings": list(self.warnings)}


def exit_code(results: Iterable[ConvertResult | CompactReport]) -> int:
    """The command's exit code: the worst of the sessions' (0 when there are none)."""
    return worst(r.exit_code for r in results)


# --- convert ------------------------------------------------------------------------


def convert(
    src: str | StoreTarget,
    dst_url: str,
    *,
    session: str | None = None,
    repaired: bool = False,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[ConvertResult]:
    """Copy every session of SRC (or just ``session``) into DST, record bytes verbatim.

    A session that DST already holds with exactly the records that would be written is
    "skipped" (rerunning an interrupted convert finishes it); one that differs is left
    untouched ("exists"). A damaged SRC session is "refused" with its scan report, unless
    ``repaired``: then the repaired view (the durable prefix plus the records ``repair``
    would append) is written to DST and SRC stays as it is. Damage that needs force
    (mid-log, seq-break) also needs ``force``: the copy is cut at the durable prefix, the
    dropped bytes stay in SRC (the marker's ``quarantine`` is null and ``source`` names
    SRC). Skippable zstd frames in SRC are dropped with a :class:`SkippableFramesDropped`
    warning. Each DST session is published atomically (Zstd: in frames of up to 1 MiB of
    records) and read back to check its bytes. ``progress`` is called with the number of
    records just written.

    SRC and DST may be plain paths (see :mod:`sessionlog.targets`); a path naming one
    session file selects that session (SRC: the session its header names).

    A DST that does not exist yet is created only when the first session is to be written
    to it: a convert that writes nothing (every session refused, locked or failing, or
    none at all) leaves no new directory or database file behind, and one whose first
    write fails removes what opening DST created, while it is still empty.

    Raises InvalidStoreUrl, SessionNotFound (no SRC store or session), IOFailure."""
    if isinstance(src, str):
        [target, *more] = resolve(src, session=session)
        if more:
            raise InvalidStoreUrl(f"{src}: holds files whose names differ from their headers; convert them one by one")
    else:
        target = src
    dst_text = dst_url
    dst_url, dst_session = destination(dst_url)
    if session is not None and target.session is not None and target.session != session:
        raise InvalidStoreUrl(f"--session {session!r}, but SRC holds session {target.session!r}")
    if dst_session is not None:
        src_named = session if session is not None else target.session
        if src_named is not None and src_named != dst_session:
            what = "--session names" if session is not None else "SRC holds"
            raise InvalidStoreUrl(
                f"{what} session {src_named!r}, but the DST file names session {dst_session!r}: a session "
                f"keeps its id (its header names it); name DST "
                f"{os.path.join(os.path.dirname(dst_text), src_named)}"
                f"{'.jsonl.zst' if dst_text.endswith('.zst') else '.jsonl'} or its directory")
    for named in (target.session, dst_session):
        if named is not None:
            session = named
    if session is not None and target.session is None:
        target = StoreTarget(target.text, target.url, session=session)
    store = target.open(writing=False)
    try:
        ids = target.sessions(store)
        with Destination(dst_url) as dst:
            return [_convert_one(store, dst, sid, repaired, force, progress) for sid in ids]
    finally:
        store.close()


def _new_paths(url: str) -> list[str]:
    """The files and directories opening the store ``url`` may create, when it is a local
    store that does not exist yet (empty: it exists, or it is not local)."""
    path = local_path(url)
    if not path or os.path.lexists(path):
        return []
    path = os.path.abspath(path)
    parents: list[str] = []  # the missing directories above it, outermost first
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.lexists(parent):
        parents.insert(0, parent)
        parent = os.path.dirname(parent)
    if scheme_of(url) != "sqlite":
        return [*parents, path]  # a file store's directory
    lock_dir = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.locks")
    return [*parents, *(p for p in (path, *(path + s for s in ("-wal", "-shm", "-journal")), lock_dir)
                        if not os.path.lexists(p))]


class Destination:
    """The store a command writes new sessions into (``convert``'s and ``salvage``'s DST),
    so that a command that writes nothing creates nothing.

    A DST that exists is opened at once (its errors come before any SRC work); a local
    one that does not exist (a directory, a SQLite file) is created by :meth:`open`, which
    the command calls for the first session it is about to write. On exit, if opening
    created it and no session was published in it (``published``: the command failed, or
    its write did), what opening created is removed, each path only while it is still
    empty. A PostgreSQL DST is opened at once (the database exists; nothing to remove)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.created = _new_paths(url)
        self.published = False
        self._store: EventStore | None = None
        self._existing: set[str] = set()
        if not self.created:
            self.open()

    def open(self) -> EventStore:
        """The store, opened (and created) on the first call."""
        if self._store is None:
            try:
                self._store = open_store(self.url)
                self._existing = set(self._store.sessions())
            except BaseException:
                self.__exit__(None, None, None)
                raise
        return self._store

    def holds(self, sid: str) -> bool:
        """Whether DST held the session when it was opened."""
        self.open()
        return sid in self._existing

    def __enter__(self) -> Destination:
        return self

    def __exit__(self, *exc: object) -> None:
        store, self._store = self._store, None
        empty = not self.published
        try:
            if store is not None:
                if empty and self.created:
                    try:
                        empty = not store.sessions()
                    except (SessionLogError, OSError):
                        empty = False  # cannot tell: leave it
                store.close()
        finally:
            if empty:
                _remove_if_empty(self.created)
            self.created = []


def _remove_if_empty(paths: list[str]) -> None:
    """Remove what a failed command created: a directory only when it holds nothing; a
    SQLite database (and its WAL, shared-memory and journal files) the caller found holding
    no session. Best effort: what cannot be removed stays, the command's error stands."""
    for path in reversed(paths):
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)  # refuses a directory that is not empty
            elif os.path.lexists(path):
                os.unlink(path)
        except OSError:
            pass


def _convert_one(src: EventStore, dst_: Destination, sid: str, repaired: bool, force: bool,
                 progress: Callable[[int], None] | None) -> ConvertResult:
    try:
        scan = src.scan(sid)
    except SessionLogError as exc:  # not a session log, UnsupportedFormat, IOFailure
        return ConvertResult(sid, "error", reason=str(exc))
    if scan.owned:
        return ConvertResult(sid, "locked", reason="a writer owns the session; convert it when the writer is done",
                             scan=scan)
    appended: list[Record] = []
    if scan.damage is not None or scan.unmarked_quarantines:
        if not repaired:
            what = (f"{scan.damage.kind} at offset {scan.damage.offset} ({scan.damage.reason})"
                    if scan.damage is not None else "quarantined tail without its marker")
            hint = "--repaired --force" if scan.damage is not None and scan.damage.kind.needs_force else "--repaired"
            return ConvertResult(sid, "refused", reason=f"SRC is damaged: {what}; convert {hint} "
                                 "writes the repaired view (SRC is never written)", scan=scan)
        plan = src.repair(sid, dry_run=True, force=force)
        if plan.status == "refused":
            reason = plan.reason
            if scan.damage is not None and scan.damage.kind.needs_force:
                reason = f"{reason}; convert --repaired --force cuts it in the copy only (SRC is never written)"
            return ConvertResult(sid, "refused", reason=reason, scan=scan)
        appended = [unwritten_record(r, scan.path) for r in plan.appended]
    elif repaired and scan.transcript_open:
        plan = src.repair(sid, dry_run=True)
        appended = [unwritten_record(r, scan.path) for r in plan.appended]
    notes: list[str] = []
    skipped = scan.skipped_frames
    if skipped:
        note = f"{sid}: {skipped} skippable zstd frame(s) in SRC are not carried over"
        warnings.warn(note, SkippableFramesDropped, stacklevel=3)
        notes.append(note)
    return publish(dst_, sid, lambda: _stream(src, sid, scan, appended), scan.last_seq + len(appended),
                   scan=scan, notes=tuple(notes), progress=progress, invalid="SRC changed while converting")


def publish(dst_: Destination, sid: str, records: Callable[[], Iterable[Record]], expected: int, *,
            scan: ScanResult | None = None, notes: tuple[str, ...] = (),
            progress: Callable[[int], None] | None = None, invalid: str | None = None) -> ConvertResult:
    """Write ``records()`` (``expected`` of them, a new session's from its header) as the
    new session ``sid`` of DST, published atomically and read back byte for byte: the
    step every convert ends with. A session DST already held with exactly these records is
    "skipped", a different one is left as it is ("exists"). ``invalid``: the reason an
    ``InvalidEvent`` from the store is reported under (SRC changed since its scan), else
    it is an error like any other. ``progress`` is called with the records just written."""
    dst = dst_.open()  # a new DST is created here, for the first session to be written
    if dst_.holds(sid):
        differs = _difference(records(), dst.read(sid))
        if differs is None:
            return ConvertResult(sid, "skipped", records=expected, scan=scan, warnings=notes,
                                 reason="DST already holds these records")
        return ConvertResult(sid, "exists", reason=f"{dst.url}: a different session {sid!r} already exists "
                             f"({differs}); not overwritten (an earlier convert with other options, or of "
                             "another SRC, wrote it: remove it from DST or convert into another DST)",
                             scan=scan)
    written = hashlib.sha256()
    count = 0

    def counted() -> Iterator[Record]:
        nonlocal count
        for record in records():
            written.update(record.raw)
            written.update(b"\n")
            count += 1
            if progress is not None and count % 256 == 0:
                progress(256)
            yield record

    try:
        last = dst.import_session(sid, counted())
    except SessionExists as exc:
        return ConvertResult(sid, "exists", reason=str(exc))
    except InvalidEvent as exc:
        reason = str(exc) if invalid is None else f"{invalid}: {exc}"
        return ConvertResult(sid, "error", reason=reason, scan=scan)
    except SessionLogError as exc:
        return ConvertResult(sid, "error", reason=str(exc), scan=scan)
    dst_.published = True
    if progress is not None and count % 256:
        progress(count % 256)
    if last != expected or count != expected or digest(dst.read(sid)) != written.digest():
        raise SessionLogError(f"{dst.url}: session {sid!r} does not read back byte-identical after convert")
    return ConvertResult(sid, "converted", records=count, scan=scan, warnings=notes)


def _stream(src: EventStore, sid: str, scan: ScanResult, appended: list[Record]) -> Iterator[Record]:
    """Exactly the prefix the scan reported, then the repair plan's records (if any)."""
    reader = read_prefix(src, sid)
    try:
        yield from itertools.takewhile(lambda r: r.seq <= scan.last_seq, reader)
        yield from appended
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()  # release SRC's file handle even when the prefix ended early


def _difference(new: Iterable[Record], held: Iterable[Record]) -> str | None:
    """Where the records a convert would write differ from those DST holds (None when
    they are the same bytes): the first seq that differs and both counts."""
    first = None
    count = {"new": 0, "held": 0}
    sentinel = object()
    for a, b in itertools.zip_longest(new, held, fillvalue=sentinel):
        if a is not sentinel:
            count["new"] += 1
        if b is not sentinel:
            count["held"] += 1
        if first is None and (a is sentinel or b is sentinel or a.raw != b.raw):  # type: ignore[union-attr]
            first = count["new"] if a is not sentinel else count["held"]
    if first is None:
        return None
    return (f"it holds {count['held']} records, this convert writes {count['new']}; "
            f"they differ from record {first} on")


def digest(records: Iterable[Record]) -> bytes:
    """SHA-256 of the records' lines, each with its newline: two sessions with the same
    digest hold the same bytes."""
    hasher = hashlib.sha256()
    for record in records:
        hasher.update(record.raw)
        hasher.update(b"\n")
    return hasher.digest()


def unwritten_record(record: object, src_path: str | None) -> Record:
    """A repair-plan record as a copy or a view of the repaired session gets it: a
    ``log/truncated`` marker names no quarantine (none is written: the dropped bytes stay
    in SRC) and says where they are (``source``)."""
    if isinstance(record, Record) and record.type != LOG_TRUNCATED:
        return record
    fields = dict(record)  # type: ignore[call-overload]
    if fields.get("type") == LOG_TRUNCATED and fields.get("quarantine") is not None:
        fields["quarantine"] = None
        fields["source"] = None if src_path is None else printable(src_path)  # a name that is not UTF-8: escaped
    return Record.from_line(_raw(fields))


def _raw(record: object) -> bytes:
    import msgspec

    return msgspec.json.encode(dict(record))  # type: ignore[call-overload]


# --- compact ------------------------------------------------------------------------


def compact(
    target: str | StoreTarget,
    *,
    session: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[CompactReport]:
    """Rewrite each session of a Zstd store (or just ``session``) into large frames,
    under its writer lock, atomically (see ``ZstdStore.compact``). A damaged session is
    "refused", an owned one "locked". ``progress`` is called with the number of records
    just rewritten. Raises NothingToCompact (a backend without frames), InvalidStoreUrl,
    SessionNotFound, IOFailure."""
    if isinstance(target, str):
        [target, *_] = resolve(target, session=session)
    elif session is not None and target.session is None:
        target = StoreTarget(target.text, target.url, session=session)
    if session is not None and target.session is not None and session != target.session:
        raise InvalidStoreUrl(f"session {session!r} asked for, but the target names session {target.session!r}")
    store = target.open(writing=True)
    try:
        rewrite = getattr(store, "compact", None)
        if rewrite is None:
            raise NothingToCompact(f"{store.url}: only Zstd stores have frames to compact "
                                   "(convert it to zstd:DIR to compress it)")
        results = []
        for sid in target.sessions(store):
            try:
                results.append(rewrite(sid, progress=progress))
            except SessionNotFound:
                raise
            except SessionLogError as exc:
                results.append(CompactReport(sid, None, "error", reason=str(exc)))
        return results
    finally:
        store.close()


def compact_row(report: CompactReport) -> dict[str, Any]:
    """The command line's ``--json`` row for one compacted session: the frame counts and
    the size after are null when nothing was rewritten (refused, locked, error): a scan
    that stops at damage does not count the frames after it, and no frame was written."""
    done = report.status in ("compacted", "unchanged")
    return {"session": report.session, "status": report.status, "reason": report.reason,
            "bytes_before": report.bytes_before, "bytes_after": report.bytes_after if done else None,
            "frames_before": report.frames_before if done else None,
            "frames_after": report.frames_after if done else None}
