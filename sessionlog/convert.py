"""Offline store-to-store tools: ``convert`` between any two backends, ``compact``.

Built on the public store API only (``open_store``, ``scan``, ``read``, ``repair`` with
``dry_run``, ``import_session``): every record is copied as its exact bytes, unknown
fields included; a DST session is never overwritten (``import_session`` publishes a new
session atomically or raises ``SessionExists``) and SRC is never written.

Exit codes, for a command that reports several sessions (worst wins: 4 > 5 > 3 > 1 > 0):
0 every session done · 1 a session's damage is repairable (``--repaired``, or repair it)
· 3 a session's damage needs a ``--force`` repair first · 4 an error: I/O, not a session
log, unsupported format, a DST session that already exists, a store that cannot compact ·
5 a writer owns the session.
"""

from __future__ import annotations

import hashlib
import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from . import InvalidStoreUrl, open_store
from .contract import (
    CompactReport,
    EventStore,
    InvalidEvent,
    ScanResult,
    SessionExists,
    SessionLogError,
    SessionNotFound,
)
from .events import Record
from .exits import worst
from .targets import open_source as _open_source
from .targets import resolve_target


class SkippableFramesDropped(UserWarning):
    """SRC held zstd skippable frames (metadata readers skip); DST does not keep them."""


@dataclass(slots=True)
class ConvertResult:
    """What ``convert`` did with one session.

    ``status``: "converted"; "exists" (DST already has the session: left untouched);
    "refused" (SRC is damaged and ``repaired`` was not asked, or its damage needs
    force; ``scan`` is the report); "locked" (a writer owns the SRC session); "error"
    (not a session log, unsupported format, I/O). ``records`` is the number written."""

    session: str
    status: str
    records: int = 0
    reason: str | None = None
    scan: ScanResult | None = None
    warnings: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        if self.status == "converted":
            return 0
        if self.status == "locked":
            return 5
        if self.status == "refused":
            damage = self.scan.damage if self.scan is not None else None
            return 3 if damage is not None and damage.kind.needs_force else 1
        return 4


def exit_code(results: Iterable[ConvertResult | CompactReport]) -> int:
    """The command's exit code: the worst of the sessions' (0 when there are none)."""
    return worst(r.exit_code for r in results)


# --- convert ------------------------------------------------------------------------


def convert(
    src_url: str,
    dst_url: str,
    *,
    session: str | None = None,
    repaired: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[ConvertResult]:
    """Copy every session of SRC (or just ``session``) into DST, record bytes verbatim.

    A session already in DST is left untouched ("exists"). A damaged SRC session is
    "refused" with its scan report, unless ``repaired``: then the repaired view (the
    durable prefix plus the records ``repair`` would append) is written to DST and SRC
    stays as it is. Damage that needs ``--force`` is always refused. Skippable zstd
    frames in SRC are dropped with a :class:`SkippableFramesDropped` warning. Each DST
    session is published atomically and read back to check its bytes. ``progress`` is
    called with the number of records just written.

    SRC and DST may also be plain paths (see :func:`resolve_target`); a path naming one
    session file selects that session.

    Raises InvalidStoreUrl, SessionNotFound (no SRC store or session), IOFailure."""
    src_url, src_session = resolve_target(src_url)
    dst_url, dst_session = resolve_target(dst_url)
    for named in (src_session, dst_session):
        if named is not None:
            if session is not None and named != session:
                raise InvalidStoreUrl(f"session {session!r} asked for, but a target names session {named!r}")
            session = named
    src = _open_source(src_url)
    try:
        dst = open_store(dst_url)
        try:
            ids = [session] if session is not None else src.sessions()
            if session is not None and session not in src.sessions():
                raise SessionNotFound(f"{src_url}: no session {session!r}")
            existing = set(dst.sessions())
            return [_convert_one(src, dst, sid, sid in existing, repaired, progress) for sid in ids]
        finally:
            dst.close()
    finally:
        src.close()


def _convert_one(src: EventStore, dst: EventStore, sid: str, exists: bool, repaired: bool,
                 progress: Callable[[int], None] | None) -> ConvertResult:
    if exists:
        return ConvertResult(sid, "exists", reason=f"{dst.url}: session {sid!r} already exists; not overwritten")
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
            return ConvertResult(sid, "refused", reason=f"SRC is damaged: {what}; convert --repaired "
                                 "writes the repaired view", scan=scan)
        plan = src.repair(sid, dry_run=True)
        if plan.status == "refused":
            return ConvertResult(sid, "refused", reason=plan.reason, scan=scan)
        appended = [r if isinstance(r, Record) else Record.from_line(_raw(r)) for r in plan.appended]
    elif repaired and scan.transcript_open:
        plan = src.repair(sid, dry_run=True)
        appended = [r if isinstance(r, Record) else Record.from_line(_raw(r)) for r in plan.appended]
    notes: list[str] = []
    skipped = scan.skipped_frames
    if skipped:
        note = f"{sid}: {skipped} skippable zstd frame(s) in SRC are not carried over"
        warnings.warn(note, SkippableFramesDropped, stacklevel=3)
        notes.append(note)
    digest = hashlib.sha256()
    count = 0

    reader = src.read(sid)

    def stream() -> Iterator[Record]:
        nonlocal count
        # Exactly the prefix the scan reported, then the repair plan's records (if any).
        prefix = itertools.takewhile(lambda r: r.seq <= scan.last_seq, reader)
        for record in itertools.chain(prefix, appended):
            digest.update(record.raw)
            digest.update(b"\n")
            count += 1
            if progress is not None and count % 256 == 0:
                progress(256)
            yield record

    try:
        last = dst.import_session(sid, stream())
    except SessionExists as exc:
        return ConvertResult(sid, "exists", reason=str(exc))
    except InvalidEvent as exc:  # DST refused a record SRC's scan accepted (or SRC changed since)
        return ConvertResult(sid, "error", reason=f"DST refused a record read from SRC: {exc}", scan=scan)
    except SessionLogError as exc:
        return ConvertResult(sid, "error", reason=str(exc), scan=scan)
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()  # release SRC's file handle even when the prefix ended early
    if progress is not None and count % 256:
        progress(count % 256)
    expected = scan.last_seq + len(appended)
    check = hashlib.sha256()
    for record in dst.read(sid):
        check.update(record.raw)
        check.update(b"\n")
    if last != expected or count != expected or check.digest() != digest.digest():
        raise SessionLogError(f"{dst.url}: session {sid!r} does not read back byte-identical after convert")
    return ConvertResult(sid, "converted", records=count, scan=scan, warnings=tuple(notes))


def _raw(record: object) -> bytes:
    import msgspec

    return msgspec.json.encode(dict(record))  # type: ignore[call-overload]


# --- compact ------------------------------------------------------------------------


def compact(
    url: str,
    *,
    session: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[CompactReport]:
    """Rewrite each session of a Zstd store (or just ``session``) into large frames,
    under its writer lock, atomically (see ``ZstdStore.compact``). A damaged session is
    "refused", an owned one "locked"; a store of another backend is an "error" result.
    ``progress`` is called with the number of records just rewritten.
    Raises InvalidStoreUrl, SessionNotFound, IOFailure."""
    url, named = resolve_target(url)
    if named is not None:
        if session is not None and named != session:
            raise InvalidStoreUrl(f"session {session!r} asked for, but the target names session {named!r}")
        session = named
    store = open_store(url)
    try:
        ids = [session] if session is not None else store.sessions()
        rewrite = getattr(store, "compact", None)
        if rewrite is None:
            return [CompactReport(sid, None, "error", reason=f"{store.url}: this backend has no frames to compact")
                    for sid in ids]
        results = []
        for sid in ids:
            try:
                results.append(rewrite(sid, progress=progress))
            except SessionNotFound:
                raise
            except SessionLogError as exc:
                results.append(CompactReport(sid, None, "error", reason=str(exc)))
        return results
    finally:
        store.close()
