"""The event-store contract: what every backend promises, its result types and its errors.

Every backend (memory, jsonl, zstd, sql) implements :class:`EventStore` and is tested by
the one suite in ``tests/contract/``. The engine raises nothing but
:class:`SessionLogError` subclasses; an ``OSError`` or driver error is chained as the
cause.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .events import Record, SessionLogError

# --- errors ----------------------------------------------------------------------------


class InvalidSessionId(SessionLogError, ValueError):
    """A session id outside ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}`` or containing ``..``."""


class InvalidEvent(SessionLogError, ValueError):
    """An event that cannot be appended (no type, not serializable, over a size limit)."""


class SessionExists(SessionLogError):
    """``create`` of a session that is already there (or differs only in case)."""


class SessionNotFound(SessionLogError, KeyError):
    """The session does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument
        return Exception.__str__(self)


class SessionLocked(SessionLogError):
    """Another writer owns the session (holds its lock)."""


class SequenceConflict(SessionLogError):
    """``expect_seq`` did not match the session's last seq."""

    def __init__(self, message: str, *, expected: int, found: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.found = found


class AppendFailed(SessionLogError):
    """An append was not acknowledged. ``outcome_unknown`` is True when the batch may
    still have become durable (an error during commit, a rollback that failed)."""

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class OwnershipLost(AppendFailed):
    """An append was refused because its handle no longer owns the session: its lock was
    lost (PostgreSQL: the lock connection ended) and another writer may have taken the
    session, or did. Nothing was written. What the handle's owner knew of the session
    may be stale (another writer may have repaired it since): read the session again
    before writing more, through a new handle; never replay events prepared under the
    lost ownership blindly."""


class CorruptLog(SessionLogError):
    """The log is damaged (or is not a session log) where the operation needs it whole."""

    def __init__(
        self, message: str, *, path: str | None = None, offset: int | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.kind = kind


class UnsupportedFormat(SessionLogError):
    """The header names a ``format`` this version does not know; nothing is repaired."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class IOFailure(SessionLogError):
    """An operating-system or database error while reading or writing a store; the
    original error is chained as the cause."""


class DurabilityRefused(SessionLogError):
    """The database connection's settings would weaken durability (SQLite ``synchronous``
    below FULL or not in WAL mode, PostgreSQL ``synchronous_commit=off`` or ``fsync=off``):
    the store refuses to open rather than acknowledge appends that a crash could lose."""


class StoreClosed(SessionLogError):
    """The store or session handle was closed (or poisoned by a failed rollback)."""


# --- damage and its policy (one table, every backend) ----------------------------------


class DamageKind(enum.StrEnum):
    """What the tail after the durable prefix is (docs/damage.md)."""

    TORN = "torn"
    ZERO_FILL = "zero-fill"
    CORRUPT = "corrupt"
    SEQ_BREAK = "seq-break"
    MID_LOG = "mid-log"
    IN_FLIGHT = "in-flight"

    @property
    def needs_force(self) -> bool:
        """True when cutting this tail may drop acknowledged history."""
        return self in _NEEDS_FORCE

    @property
    def repairable(self) -> bool:
        """True when ``repair`` truncates this tail without ``force``."""
        return self in _REPAIRABLE

    @property
    def status(self) -> Status | None:
        """What this damage alone makes of a session: needs-force, repairable, or None
        (a write in flight is not damage)."""
        return Status.NEEDS_FORCE if self.needs_force else Status.REPAIRABLE if self.repairable else None


_REPAIRABLE = frozenset({DamageKind.TORN, DamageKind.ZERO_FILL, DamageKind.CORRUPT})
_NEEDS_FORCE = frozenset({DamageKind.SEQ_BREAK, DamageKind.MID_LOG})


class Failure(enum.Enum):
    """What stopped a scanner at the end of the stable prefix (before classification)."""

    CUT_SHORT = "cut short"  # the last record/frame ends early at EOF
    UNDECODABLE = "undecodable"  # a whole record/frame that does not decode or verify
    WRONG_SEQ = "wrong seq"  # a record that decodes with the wrong seq
    NUL_RUN = "NUL run"  # NUL bytes start at the stable offset


def classify_damage(failure: Failure, *, records_after: int, within_reach: bool, owned: bool) -> DamageKind:
    """The damage table (README "Damage and what repair does with it"), once for every
    backend.

    ``failure`` is NUL_RUN when the damaged record or frame holds a power loss's NULs
    (:func:`power_loss_nuls`), whatever else is wrong with it; ``records_after``:
    records that still decode in the tail; ``within_reach``: they all end within one
    append (the batch limit) of the stable offset, so the whole tail can be what one
    unacknowledged append left; ``owned``: a writer holds the session, so a record cut
    short at EOF is a write in flight."""
    if failure is Failure.NUL_RUN:
        return DamageKind.ZERO_FILL if within_reach or not records_after else DamageKind.MID_LOG
    if failure is Failure.WRONG_SEQ:
        return DamageKind.SEQ_BREAK
    if records_after:
        return DamageKind.MID_LOG
    if failure is Failure.CUT_SHORT:
        return DamageKind.IN_FLIGHT if owned else DamageKind.TORN
    return DamageKind.CORRUPT


SECTOR = 512
"""The smallest unit a disk writes: a page the page cache never wrote back reads as
NULs over whole aligned sectors (a 4 KiB page is eight)."""
_ZERO_SECTOR = bytes(SECTOR)


def power_loss_nuls(unit: bytes, offset: int, *, eof: bool) -> bool:
    """True when ``unit``, the damaged record or frame that starts the tail at file
    offset ``offset`` (``eof``: it runs to the end of the file), holds the NULs a power
    loss inside one append leaves: NULs right where the tail starts (the append's first
    page never written back), or a NUL run covering a whole aligned sector (a later page
    of it never written back, whatever landed around it). A flipped byte, even to NUL, or
    a record zeroed in place is neither: a sector is written whole or not at all, so NULs
    where the tail starts run at least to the end of their sector, or to the end of the
    file when that comes first; a unit that ends sooner (at a newline, or where the next
    frame starts) has other bytes in that sector."""
    head = SECTOR - offset % SECTOR
    if len(unit) < head:
        head = len(unit) if eof else 0  # else the sector holds more than this unit's NULs
    if head and unit[:head] == bytes(head):
        return True
    i = unit.find(_ZERO_SECTOR)
    if i < 0:
        return False
    j = i + (-(offset + i)) % SECTOR  # the first aligned sector at or after the run's start
    while j + SECTOR <= len(unit):
        if unit[j:j + SECTOR] == _ZERO_SECTOR:
            return True
        i = unit.find(_ZERO_SECTOR, j + 1)
        if i < 0:
            return False
        j = i + (-(offset + i)) % SECTOR
    return False


@dataclass(frozen=True, slots=True)
class Damage:
    """The tail after the durable prefix.

    ``offset`` is where the stable prefix ends (bytes for file backends, the position of
    the first bad row for SQL), ``length`` the tail's size in bytes, ``records_after``
    how many decodable records lie in the tail, ``dropped_seqs`` the first and last seq
    among them (None when none decode), ``reason`` a short human explanation.
    """

    kind: DamageKind
    offset: int
    length: int
    records_after: int = 0
    reason: str = ""
    dropped_seqs: tuple[int, int] | None = None

    def refusal(self, where: str = "offset") -> str:
        """Why repair without force leaves this damage alone (``where``: what ``offset``
        counts, "offset" in bytes or "row")."""
        return (
            f"{self.kind} at {where} {self.offset} ({self.reason}); {self.records_after} decodable "
            "record(s) after it may be acknowledged history: repair with force to cut it"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "offset": self.offset,
            "length": self.length,
            "records_after": self.records_after,
            "reason": self.reason,
        }


class Status(enum.StrEnum):
    """A session's scan status, as the command line reports it."""

    CLEAN = "clean"
    OPEN = "open"
    SUSPENDED = "suspended"
    """The open step's only unanswered calls await a human's approval, the tail is clean."""
    REPAIRABLE = "repairable"
    NEEDS_FORCE = "needs-force"
    UNSUPPORTED = "unsupported"
    ERROR = "error"


@dataclass(slots=True)
class ScanResult:
    """What a scan found. ``records`` materializes the prefix on access."""

    session: str
    path: str | None
    record_count: int
    last_seq: int
    last_ts: float
    stable_offset: int
    damage: Damage | None
    open_turn: str | None
    open_step: int | None
    unanswered_calls: list[str]
    owned: bool = False
    unmarked_quarantines: list[str] = field(default_factory=list)
    """Quarantine files no ``log/truncated`` marker names (a repair interrupted after its cut)."""
    skipped_frames: int = 0
    """Zstd skippable frames in the prefix (metadata: not records, not carried by convert)."""
    awaiting_approval: list[str] = field(default_factory=list)
    """Unanswered calls whose latest ``tool/approval`` is ``requested`` (repair leaves them
    alone unless it expires approvals)."""
    suspended: bool = False
    """True when all that is open is calls awaiting approval and the steps and turns holding them."""
    tracker: Any = field(default=None, repr=False)
    _load: Callable[[], Iterable[Record]] | None = field(default=None, repr=False)
    _records: list[Record] | None = field(default=None, repr=False)
    _last_raw: bytes | None = field(default=None, repr=False)

    @classmethod
    def of_prefix(
        cls,
        session: str,
        path: str | None,
        prefix: Any,
        tracker: Any,
        *,
        stable_offset: int,
        owned: bool,
        unmarked_quarantines: list[str],
        load: Callable[[], Iterable[Record]],
        last_raw: bytes | None = None,
    ) -> ScanResult:
        """The result of a scan: ``prefix`` is the scanner (``count``, ``last_seq``,
        ``last_ts``, ``damage``, optional ``skipped_frames``), ``tracker`` the
        :class:`~sessionlog.transcript.PendingCalls` fed its records. ``load`` streams
        the log's records from seq 1 when ``records`` is first read; ``last_raw`` (the
        bytes of the prefix's last record) lets that read tell a log rewritten since."""
        return cls(
            session=session,
            path=path,
            record_count=prefix.count,
            last_seq=prefix.last_seq,
            last_ts=prefix.last_ts,
            stable_offset=stable_offset,
            damage=prefix.damage,
            open_turn=tracker.open_turn,
            open_step=tracker.open_step,
            unanswered_calls=[c.call_id for c in tracker.unanswered()],
            awaiting_approval=[c.call_id for c in tracker.awaiting()],
            suspended=tracker.suspended,
            owned=owned,
            unmarked_quarantines=unmarked_quarantines,
            skipped_frames=getattr(prefix, "skipped_frames", 0),
            tracker=tracker,
            _load=load,
            _last_raw=last_raw,
        )

    @property
    def records(self) -> list[Record]:
        """Exactly the scanned prefix, seq 1..``last_seq``, in order (read on first access;
        records appended since are not included). Raises CorruptLog when the log no
        longer holds that prefix (cut or replaced since the scan); never returns other
        records."""
        if self._records is None:
            self._records = self._read_prefix() if self._load is not None else []
        return self._records

    def _read_prefix(self) -> list[Record]:
        assert self._load is not None
        where = self.path or f"session {self.session!r}"
        out: list[Record] = []
        source = self._load()
        try:
            for record in source:
                if record.seq > self.last_seq:
                    break
                if record.seq != len(out) + 1:
                    break
                out.append(record)
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        if len(out) != self.last_seq:
            raise CorruptLog(
                f"{where}: the log changed since the scan: it holds seq 1..{len(out)} of the "
                f"scanned prefix seq 1..{self.last_seq}; scan again",
                path=self.path, kind=None,
            )
        if self._last_raw is not None and bytes(out[-1].raw) != self._last_raw:
            raise CorruptLog(
                f"{where}: the log changed since the scan: record seq {self.last_seq} is not the "
                "record the scan read; scan again",
                path=self.path,
            )
        return out

    @property
    def in_flight(self) -> bool:
        return self.damage is not None and self.damage.kind is DamageKind.IN_FLIGHT

    @property
    def transcript_open(self) -> bool:
        """True when repair would close something (a turn, a step, an unanswered call)."""
        return bool(
            self.open_turn is not None
            or self.open_step is not None
            or self.unanswered_calls
            or self.unmarked_quarantines
        )

    @property
    def status(self) -> Status:
        """``open`` while a writer owns the session (its ``damage`` is still reported:
        damage before the in-flight tail is what a repair will need once the writer is
        gone; ``damage.kind.status`` says which)."""
        if self.owned:
            return Status.OPEN
        if self.damage is not None:
            return Status.NEEDS_FORCE if self.damage.kind.needs_force else Status.REPAIRABLE
        if not self.transcript_open:
            return Status.CLEAN
        return Status.SUSPENDED if self.suspended and not self.unmarked_quarantines else Status.REPAIRABLE


@dataclass(slots=True)
class RepairReport:
    """What a repair did (or, with ``dry_run``, would do)."""

    session: str
    path: str | None
    status: str  # "repaired" | "clean" | "refused"
    reason: str | None = None
    truncated_bytes: int = 0
    quarantine: str | None = None
    appended: list[Mapping[str, Any]] = field(default_factory=list)
    damage: Damage | None = None
    publish_quarantine: bool = field(default=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "path": self.path,
            "status": self.status,
            "reason": self.reason,
            "truncated_bytes": self.truncated_bytes,
            "quarantine": self.quarantine,
            "appended": [dict(r) for r in self.appended],
        }


def repair_reason(damage: Damage | None, *, unmarked: bool, transcript: bool) -> str:
    """Why a repair appends what it appends: the damage it cuts, else a quarantine file
    that no marker names (a repair stopped after its cut) and/or an open transcript."""
    if damage is not None:
        return str(damage.kind)
    parts = (["unmarked quarantine"] if unmarked else []) + (["open transcript"] if transcript else [])
    return " and ".join(parts) or "open transcript"


@dataclass(slots=True)
class CompactReport:
    """What ``compact`` did to one session.

    ``status``: "compacted" (rewritten and renamed into place), "unchanged" (the file
    already is, byte for byte, what compaction would write), "refused" (damaged: repair
    first; ``damage`` says how), "locked" (a writer owns the session) or "error"."""

    session: str
    path: str | None
    status: str
    reason: str | None = None
    frames_before: int = 0
    frames_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    content_bytes: int = 0
    records: int = 0
    dropped_skippable_frames: int = 0
    damage: Damage | None = field(default=None, repr=False)

    @property
    def exit_code(self) -> int:
        """0 done, 5 locked, 3 damage that needs force, 1 repairable damage, 4 an error."""
        if self.status in ("compacted", "unchanged"):
            return 0
        if self.status == "locked":
            return 5
        if self.status == "refused":
            return 3 if self.damage is not None and self.damage.kind.needs_force else 1
        return 4


# --- the contract ----------------------------------------------------------------------


@runtime_checkable
class SessionHandle(Protocol):
    """An owned session: the single writer, for as long as the handle is open."""

    session_id: str

    def append(self, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None) -> int: ...
    @property
    def last_seq(self) -> int: ...
    def records(self, after_seq: int = 0) -> Iterator[Record]: ...
    def close(self) -> None: ...
    def __enter__(self) -> SessionHandle: ...
    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class EventStore(Protocol):
    """What every backend provides. See docs/damage.md and docs/backends.md for the guarantees."""

    url: str
    atomic_batches: bool
    """True when an unacknowledged batch is absent or whole after a crash; False (JSONL)
    when a prefix of its whole records may survive."""

    def create(self, session_id: str, events: Sequence[Mapping[str, Any]] = ()) -> int:
        """Publish a new session (header, seq 1, then ``events``); returns the last seq.
        Raises SessionExists, InvalidSessionId."""
        ...

    def append(
        self, session_id: str, events: Sequence[Mapping[str, Any]], *, expect_seq: int | None = None
    ) -> int:
        """Append durably under the lock for this call; returns the last seq assigned.
        Raises SessionNotFound, SessionLocked, SequenceConflict, CorruptLog, AppendFailed."""
        ...

    def session(self, session_id: str, *, repair: bool = False, create: bool = False) -> SessionHandle:
        """Own the session until the handle is closed. Raises SessionLocked, CorruptLog."""
        ...

    def scan(self, session_id: str) -> ScanResult:
        """Validate the whole session without writing anything."""
        ...

    def read(self, session_id: str, after_seq: int = 0) -> Iterator[Record]:
        """Stream the durable prefix's records with seq > ``after_seq`` (an int; below 1
        reads from the header; TypeError for anything else). Raises SequenceConflict
        when ``after_seq`` lies beyond the prefix's last record, and CorruptLog after the
        prefix when damage that needs ``--force`` follows it (records that still decode lie
        beyond: the prefix is not the session's history; :func:`read_prefix` reads it)."""
        ...

    def repair(
        self, session_id: str, *, force: bool = False, dry_run: bool = False, expire_approvals: bool = False
    ) -> RepairReport:
        """Quarantine and truncate a damaged tail, then close the transcript. Calls awaiting
        approval, and the step and turn holding them, are left alone unless
        ``expire_approvals``."""
        ...

    def import_session(self, session_id: str, records: Iterable[Record]) -> int:
        """Publish a new session made of exactly ``records`` (their bytes verbatim: seq,
        ts and unknown fields kept), atomically: all of it or nothing. The records must
        start with this session's header and be contiguous. Returns the last seq.
        Raises SessionExists, InvalidEvent. Used by ``convert`` and ``compact``."""
        ...

    def delete(self, session_id: str) -> None: ...
    def sessions(self) -> list[str]: ...
    def writer(self, **options: Any) -> Any:
        """Write-behind over this store (a :class:`sessionlog.writer.WriteBehind`)."""
        ...
    def close(self) -> None: ...
    def __enter__(self) -> EventStore: ...
    def __exit__(self, *exc: object) -> None: ...


def synthetic_lines(events: Sequence[Mapping[str, Any]], first_seq: int, *, record_limit: int) -> list[bytes]:
    """The record lines (seq from ``first_seq``) of the engine's own synthetic events: a
    repair's markers, results and closers, or live recovery's. Unlike an append's batch
    they are not bounded by the batch limit: :func:`durable_batches` splits them.
    Raises InvalidEvent (a record over the record limit)."""
    from .events import RecordError, encode_records

    try:
        return encode_records(events, first_seq, record_limit=record_limit)
    except RecordError as exc:
        raise InvalidEvent(exc.reason) from None


def durable_batches(lines: Sequence[bytes], batch_limit: int) -> list[list[bytes]]:
    """``lines`` in order, split into consecutive batches of at most ``batch_limit``
    bytes each (lines plus newlines), each one durable append.

    The engine's own records must always fit: a repair plan for an assistant message
    with thousands of calls is larger than one batch. Written in order (markers first,
    results, closers last), every prefix of the batches is a log the next repair
    finishes: its tracker sees the results written as answered and plans the rest."""
    batches: list[list[bytes]] = []
    size = batch_limit + 1
    for line in lines:
        if size + len(line) + 1 > batch_limit:
            batches.append([])
            size = 0
        batches[-1].append(line)
        size += len(line) + 1
    return batches


def plan_batches(
    events: Sequence[Mapping[str, Any]], first_seq: int, *, batch_limit: int, record_limit: int
) -> list[list[Mapping[str, Any]]]:
    """``events`` (synthetic, appended from ``first_seq``) grouped as :func:`durable_batches`
    groups their lines: for a caller that appends events through a handle (live step
    recovery). Pass a ``first_seq`` at least as large as the real one when it is not
    known: a larger seq only makes the lines longer."""
    lines = synthetic_lines(events, first_seq, record_limit=record_limit)
    out: list[list[Mapping[str, Any]]] = []
    i = 0
    for batch in durable_batches(lines, batch_limit):
        out.append(list(events[i:i + len(batch)]))
        i += len(batch)
    return out


def events_list(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``events`` as a list. Raises InvalidEvent for a lone mapping, or anything else that
    is not an iterable of events, passed where a batch is expected."""
    if type(events) is list:  # the common case, without the ABC checks
        return events.copy()
    if isinstance(events, Mapping):
        raise InvalidEvent("append takes a sequence of events, not a single mapping")
    if not isinstance(events, Iterable):
        raise InvalidEvent(f"append takes a sequence of events, not {type(events).__name__}")
    return list(events)


class ImportCheck:
    """Checks that records handed to ``import_session`` form a valid session, in order."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.last_seq = 0

    def __call__(self, record: Record) -> Record:
        if record.seq != self.last_seq + 1:
            raise InvalidEvent(
                f"import of {self.session_id!r}: seq {record.seq} where {self.last_seq + 1} was expected"
            )
        if self.last_seq == 0:
            from .events import FORMAT, SESSION_START

            fields = record.to_dict()
            if record.type != SESSION_START or fields.get("session") != self.session_id or fields.get("format") != FORMAT:
                raise InvalidEvent(f"import of {self.session_id!r}: record 1 is not this session's header")
        self.last_seq = record.seq
        return record


READ_LIMIT = (1 << 63) - 1
"""The largest ``after_seq`` a backend is handed (a SQL BIGINT): no log holds that many
records, so any larger one reads past the end just the same (SequenceConflict)."""


def read_prefix(store: EventStore, session_id: str, after_seq: int = 0) -> Iterator[Record]:
    """The durable prefix's records with seq > ``after_seq``, even when damage that needs
    ``--force`` lies after them, for the tools that show, convert or restore a damaged log
    (they say so themselves). ``store.read`` raises CorruptLog at that damage instead: a
    caller taking its records for the session's history must not get a part of it."""
    prefix = getattr(store, "read_prefix", None)
    return store.read(session_id, after_seq) if prefix is None else prefix(session_id, after_seq)


def read_start(after_seq: object) -> int:
    """``read``'s ``after_seq`` as every backend takes it: an int (not a bool); one below
    1 reads from the header, one beyond :data:`READ_LIMIT` is that limit. Raises
    TypeError for anything else."""
    if type(after_seq) is not int:
        if not isinstance(after_seq, int) or isinstance(after_seq, bool):
            raise TypeError(f"read: after_seq must be an int, not {type(after_seq).__name__} ({after_seq!r})")
        after_seq = int(after_seq)
    return min(max(after_seq, 0), READ_LIMIT)
