"""Prefix rules shared by the byte-level backends: lines, envelope, contiguity, damage.

Pure: the scanner reads from a ``read(n) -> bytes`` callable (a file's ``read``, a
``BytesIO``, a decompressor) and never touches the file system itself. It yields the
records of the longest valid prefix and then classifies whatever follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Protocol

from .contract import (
    CorruptLog,
    Damage,
    Failure,
    InvalidEvent,
    UnsupportedFormat,
    classify_damage,
    power_loss_nuls,
)
from .events import (
    FORMAT,
    SESSION_START,
    Record,
    RecordError,
    RecordRun,
    region_run_in,
    encode_records_at,
    encode_records_sized,
)
from .events import encode_block as encode_records_block

CHUNK = 256 << 10
"""Bytes a scan reads at a time: a read of a few regions stays in cache until they are
decoded (1 MiB reads made the scan ~10% slower: each evicts what the last decoded)."""
REGION = 128 << 10
"""The most bytes one fast-path attempt decodes: regions that stay in cache scan faster."""
MIN_REGION = 4 << 10
_OVER_LIMIT = "record exceeds the record limit"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that protect memory and bound what a crash can damage.

    ``record_limit``: the largest record (line, without newline) append accepts and scan
    reads. ``batch_limit``: the largest append batch in bytes; it is also "one append's
    reach", the span a power loss can zero-fill at the end of a log.
    """

    record_limit: int = 1 << 20
    batch_limit: int = 1 << 20


DEFAULT_LIMITS = Limits()


def batch_size(lines: Sequence[bytes]) -> int:
    """The bytes record ``lines`` take in a batch: each line and its newline."""
    return sum(map(len, lines)) + len(lines)


def encode_batch(
    events: Sequence[Mapping[str, Any]], first_seq: int, limits: Limits, *, now: float | None = None
) -> list[bytes]:
    """The record lines of one append batch, seq from ``first_seq``, within ``limits``
    (``now``: the ``ts`` of events without their own; default the clock).

    Raises :class:`InvalidEvent` naming the event at fault, or when the batch (lines plus
    newlines) is over the batch limit; nothing is written then."""
    try:
        lines, size = encode_records_sized(events, first_seq, record_limit=limits.record_limit, now=now)
    except RecordError as exc:
        raise InvalidEvent(exc.reason) from None
    if size > limits.batch_limit:
        raise InvalidEvent(f"batch of {size} bytes exceeds the batch limit of {limits.batch_limit} bytes; split it")
    return lines


def encode_batches(
    batches: Sequence[Sequence[Mapping[str, Any]]], firsts: Sequence[int], limits: Limits, *,
    now: float | None = None,
) -> list[list[bytes]] | None:
    """The record lines of several append batches (batch ``i`` with seq from
    ``firsts[i]``), encoded in one encoder call: what :func:`encode_batch` gives for
    each, with one clock reading (or ``now``) for all. None when any batch would be
    refused or does not take the encoder's fast path: the caller then encodes each
    batch on its own (:func:`encode_batch` names the event at fault; only a batch that
    needs the exact path pays for it)."""
    seqs: list[int] = []
    for events, first in zip(batches, firsts, strict=True):
        seqs.extend(range(first, first + len(events)))
    lines = encode_records_at(list(chain.from_iterable(batches)), seqs, record_limit=limits.record_limit,
                              now=now, fast_only=True)
    if lines is None:
        return None
    out: list[list[bytes]] = []
    start = 0
    for events in batches:
        part = lines[start:start + len(events)]
        start += len(events)
        if batch_size(part) > limits.batch_limit:
            return None
        out.append(part)
    return out


def encode_block(events: Sequence[Mapping[str, Any]], first_seq: int, limits: Limits) -> tuple[bytes, int, float]:
    """One append batch as JSONL bytes (each record line ending in a newline, built
    once: what a JSONL log appends), with its number of records and the last record's
    ``ts``; the rules and errors of :func:`encode_batch`."""
    try:
        block, n, last_ts = encode_records_block(events, first_seq, record_limit=limits.record_limit)
    except RecordError as exc:
        raise InvalidEvent(exc.reason) from None
    if len(block) > limits.batch_limit:
        raise InvalidEvent(
            f"batch of {len(block)} bytes exceeds the batch limit of {limits.batch_limit} bytes; split it"
        )
    return block, n, last_ts


def check_header(record: Record, session_id: str | None, where: str) -> None:
    """Raise unless ``record`` is a valid ``session/start`` header for ``session_id``.

    An unknown ``format`` is :class:`UnsupportedFormat`; anything else that is not a
    header means the file is not a session log (:class:`CorruptLog`)."""
    if record.seq != 1 or record.type != SESSION_START:
        raise CorruptLog(
            f"{where}: not a session log: record 1 is {record.type!r} with seq {record.seq}, "
            "not a session/start header",
            path=where, offset=0,
        )
    fields = record.to_dict()
    fmt = fields.get("format")
    if fmt != FORMAT:
        said = "has no format" if fmt is None else f"is in format {fmt!r}"
        raise UnsupportedFormat(
            f"{where}: its header {said}, which is not supported (this version reads {FORMAT!r})", path=where
        )
    if session_id is not None and fields.get("session") != session_id:
        named = fields.get("session")
        raise CorruptLog(
            f"{where}: not the log of session {session_id!r}: its header names "
            + ("no session" if named is None else repr(named)),
            path=where, offset=0,
        )


class LineScan:
    """Stream the longest valid prefix of JSONL records from ``read``.

    Iterate to get the prefix's records; afterwards ``stable_offset`` (absolute, starting
    at ``start``), ``last_seq``, ``last_ts``, ``count`` and ``damage`` describe it. With
    ``session_id`` set (and ``start == 0``) record 1 must be the session's header.
    ``owned=True`` reports an incomplete last line as ``in-flight`` instead of ``torn``.
    """

    def __init__(
        self,
        read: Callable[[int], bytes],
        *,
        session_id: str | None,
        where: str,
        start: int = 0,
        expected_seq: int = 1,
        last_ts: float = 0.0,
        limits: Limits = DEFAULT_LIMITS,
        owned: bool = False,
    ) -> None:
        self._read = read
        self.session_id = session_id
        self.where = where
        self.start = start
        self.expected_seq = expected_seq
        self.limits = limits
        self.owned = owned
        self.stable_offset = start
        self.last_seq = expected_seq - 1
        self.last_ts = last_ts
        self.count = 0
        self.damage: Damage | None = None
        self._done = False

    def __iter__(self) -> Iterator[Record]:
        return chain.from_iterable(map(RecordRun.records, self.runs()))

    def runs(self) -> Iterator[RecordRun]:
        """The prefix's records, a proven run at a time (iterate a scanner once, either
        way): a consumer that reads the envelopes and members takes each region of
        records in one call, and no :class:`Record` object is built for it. The summary
        is up to date for each run when it is handed out."""
        if self._done:
            raise RuntimeError("a LineScan is iterated once")
        self._done = True
        read, limit = self._read, self.limits.record_limit
        buf = b""
        base = self.start  # absolute offset of buf[0]
        i = 0
        # A line cut by a read is joined with its end alone (``buf``), and the chunk it
        # ends in waits in ``ahead`` from ``ahead_at`` on: regions are decoded where they
        # lie in the chunk read, and no chunk is copied onto the bytes left before it.
        ahead: bytes | None = None
        ahead_at = 0
        expected = self.expected_seq
        header_needed = self.session_id is not None and self.start == 0
        from_line = Record.from_line
        # Fast-path attempts decode at most ``span`` bytes of whole lines. An attempt that
        # does not prove its whole region hands its first unproven line to the exact path,
        # with the next ``exact`` lines after consecutive failures (doubling), and the next
        # span shrinks to what was proven: no line is decoded more than a few times, so
        # the scan stays linear whatever the lines hold.
        span = REGION
        exact = 0  # lines to take on the exact path before the next attempt
        failures = 0  # consecutive attempts that did not prove their whole region
        while True:
            if not header_needed and not exact:
                end = buf.rfind(b"\n", i, i + span) + 1
                if end > i:
                    run = region_run_in(buf, i, end, expected)[0]
                    start = i
                    if end - i > limit and len(run):
                        # Keep the records before the first one over the limit; the exact
                        # path reports that one.
                        over = [k for k, line in enumerate(run.lines()) if len(line) > limit]
                        if over:
                            run = run.head(over[0])
                    if len(run):
                        i += len(run.data)
                        expected += len(run)
                        self.stable_offset = base + i
                        self.last_seq = run.seqs[-1]
                        self.last_ts = run.tss[-1]
                        self.count += len(run)
                        yield run
                    if i == end:
                        failures = 0
                        span = min(2 * span, REGION)
                        continue
                    exact = 1 << min(failures, 10)
                    failures += 1
                    span = max(MIN_REGION, min(REGION, 2 * (i - start)))
                elif buf.find(b"\n", i) >= 0:
                    exact = 1  # one line longer than the span
            nl = buf.find(b"\n", i)
            if nl < 0:
                if ahead is not None:  # the joined line is taken: on with the chunk it ends in
                    base += len(buf) - ahead_at
                    buf, i, ahead = ahead, ahead_at, None
                    continue
                if len(buf) - i > limit:
                    self._fail(base + i, buf[i:], None, _OVER_LIMIT)
                    return
                chunk = read(CHUNK)
                if not chunk:
                    if i < len(buf):
                        self._fail(base + i, buf[i:], None, "last record ends without a newline")
                    elif header_needed:
                        raise CorruptLog(f"{self.where}: not a session log: the file is empty",
                                         path=self.where, offset=0)
                    return
                first = chunk.find(b"\n") if i < len(buf) else -1
                if first >= 0:
                    ahead, ahead_at = chunk, first + 1
                    chunk = chunk[:ahead_at]
                buf = buf[i:] + chunk
                base += i
                i = 0
                continue
            if nl - i > limit:
                self._fail(base + i, self._rest(buf, i, ahead, ahead_at), None, _OVER_LIMIT)
                return
            line = buf[i:nl]
            try:
                record = from_line(line)
            except RecordError as exc:
                self._fail(base + i, self._rest(buf, i, ahead, ahead_at), False, exc.reason)
                return
            if record.seq != expected:
                self._fail(base + i, self._rest(buf, i, ahead, ahead_at), True,
                           f"seq {record.seq} where {expected} was expected")
                return
            if header_needed:
                check_header(record, self.session_id, self.where)
                header_needed = False
            i = nl + 1
            if exact:
                exact -= 1
            expected += 1
            self.stable_offset = base + i
            self.last_seq = record.seq
            self.last_ts = record.ts
            self.count += 1
            yield RecordRun.of([record])

    @staticmethod
    def _rest(buf: bytes, i: int, ahead: bytes | None, ahead_at: int) -> bytes:
        """The bytes read and not yet taken: ``buf`` from ``i``, then what waits ahead."""
        return buf[i:] if ahead is None else buf[i:] + ahead[ahead_at:]

    def _fail(self, offset: int, pending: bytes, decodes: bool | None, reason: str) -> None:
        """Classify the tail starting at ``offset``; ``pending`` holds its first bytes.

        ``decodes`` is True for a whole record with the wrong seq, False for a whole line
        that does not decode, None for a line cut short by EOF or over the limit."""
        if self.count == 0 and self.session_id is not None and self.start == 0:
            raise CorruptLog(
                f"{self.where}: not a session log: the first record does not decode at offset "
                f"{offset} ({reason})",
                path=self.where, offset=offset,
            )
        nl = pending.find(b"\n")
        # Without a newline the line runs to EOF, or past the record limit (longer than a sector).
        nul = power_loss_nuls(pending[:nl] if nl >= 0 else pending, offset, eof=nl < 0)
        if reason is _OVER_LIMIT and not nul:
            raise CorruptLog(
                f"{self.where}: record at offset {offset} exceeds the record limit of "
                f"{self.limits.record_limit} bytes",
                path=self.where, offset=offset,
            )
        tail = _TailCount(self._read, pending, offset, self.limits.record_limit)
        tail.run()
        failure = Failure.WRONG_SEQ if decodes else Failure.CUT_SHORT if decodes is None else Failure.UNDECODABLE
        self.damage = tail_damage(offset, nul, failure, reason, tail, self.limits, owned=self.owned)


class TailSummary(Protocol):
    """What a walk of the tail after damage found."""

    end: int  # where the tail ends (EOF)
    count: int  # records that still decode in it
    first_seq: int
    last_seq: int
    last_end: int  # the end of the last of them (the damage offset when none)


def tail_damage(
    offset: int, nul: bool, failure: Failure, reason: str, tail: TailSummary, limits: Limits, *, owned: bool,
    framed: bool = False,
) -> Damage:
    """The :class:`Damage` of a tail that starts at ``offset`` (whose damaged record or
    frame holds a power loss's NULs when ``nul``: see ``contract.power_loss_nuls``), for
    every byte-level scanner: a NUL run is judged by one append's reach.

    On JSONL an append is any number of lines, so records after the NULs that end within
    the batch limit may be the same append's. On Zstd (``framed``) an append is one
    frame: a verified frame after the damaged one is a later append, which began only
    once the damaged frame's append was durable, so NULs followed by one are not what a
    power loss leaves."""
    if framed:
        within = not tail.count
    else:
        within = tail.last_end - offset <= limits.batch_limit
    if nul:
        failure = Failure.NUL_RUN
        if within:
            reason = "NUL bytes in the last append's reach (a power loss inside it)"
        elif framed:
            reason = (f"NUL bytes in a frame followed by verified frames of later appends (records "
                      f"{tail.first_seq}..{tail.last_seq}): this frame was durable before them")
        else:
            reason = f"NUL bytes followed by records {tail.last_end - offset} bytes later, beyond one append"
    return Damage(
        kind=classify_damage(failure, records_after=tail.count, within_reach=within, owned=owned),
        offset=offset,
        length=tail.end - offset,
        records_after=tail.count,
        reason=reason,
        dropped_seqs=(tail.first_seq, tail.last_seq) if tail.count else None,
    )


class _TailCount:
    """Walk the tail after damage: its length and the records that still decode in it."""

    def __init__(self, read: Callable[[int], bytes], pending: bytes, offset: int, limit: int) -> None:
        self._read = read
        self._pending = pending
        self._offset = offset
        self._limit = limit
        self.end = offset + len(pending)
        self.count = 0
        self.first_seq = 0
        self.last_seq = 0
        self.last_end = offset  # end of the last decodable record (offset if none)

    def run(self) -> None:
        buf = self._pending
        base = self._offset
        skipping = False  # inside a line longer than the limit
        i = 0
        while True:
            if not skipping:
                # A line without "{" never decodes: skip every such line at once (a tail of
                # blank lines or text costs a byte search, not a decode per line).
                brace = buf.find(b"{", i)
                if brace < 0:
                    i = max(i, buf.rfind(b"\n", i) + 1)
                elif brace > i:
                    i = buf.rfind(b"\n", i, brace) + 1 or i
            nl = buf.find(b"\n", i)
            if nl < 0:
                if len(buf) - i > self._limit:
                    skipping = True
                    base += len(buf)
                    buf = b""
                    i = 0
                chunk = self._read(CHUNK)
                if not chunk:
                    return
                self.end += len(chunk)
                buf = buf[i:] + chunk
                base += i
                i = 0
                continue
            if not skipping and nl - i <= self._limit:  # the same answer however read() splits
                try:
                    record = Record.from_line(buf[i:nl])
                except RecordError:
                    pass
                else:
                    if not self.count:
                        self.first_seq = record.seq
                    self.count += 1
                    self.last_seq = record.seq
                    self.last_end = base + nl + 1
            skipping = False
            i = nl + 1


def tail_seqs(read: Callable[[int], bytes], limits: Limits = DEFAULT_LIMITS) -> tuple[int, int] | None:
    """The first and last seq of the records that decode in a tail read from its start
    (a quarantined JSONL tail): the ``dropped_seqs`` its scan reported, rebuilt."""
    tail = _TailCount(read, b"", 0, limits.record_limit)
    tail.run()
    return (tail.first_seq, tail.last_seq) if tail.count else None


def scan_bytes(data: bytes, *, session_id: str | None = None, limits: Limits = DEFAULT_LIMITS,
               owned: bool = False) -> tuple[list[Record], int, Damage | None]:
    """Scan an in-memory log: ``(records, stable_offset, damage)``."""
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        chunk = data[pos:pos + n]
        pos += len(chunk)
        return chunk

    scan = LineScan(read, session_id=session_id, where="<bytes>", limits=limits, owned=owned)
    records = list(scan)
    return records, scan.stable_offset, scan.damage
