"""Salvage: every record that still decodes from a damaged log file, into a new store.

``repair`` keeps the durable prefix and quarantines the rest; when the damage sits early
(a flipped byte in the first frame of a Zstd session written as one frame: everything is
"not a session log") that is too little. ``salvage`` reads the file as best it can — JSONL
lines; Zstd frames decompressed as far as they go (a frame that fails its checksum still
yields what decompressed before the error, as ``zstd -dc`` prints it), resuming at the
next frame — and keeps every complete line that decodes as a record, in file order. It
never writes the source.

The salvaged session needs contiguous seqs: records up to the first gap are copied byte
for byte; at each gap a synthetic ``log/truncated`` marker (``reason`` "salvage",
``dropped_seqs``, ``quarantine`` null, ``source`` the file) takes the next seq, and every
record after it is re-encoded with the next seq and its original one as
``salvaged_seq`` (the only records that are not byte-identical). A record whose seq does
not move forward (a repeat, garbage that decodes) is left out and counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .contract import SessionLogError
from .events import LOG_TRUNCATED, SESSION_START, Record, RecordError, valid_session_id

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
FEED = 4096  # compressed bytes per decompress call: what precedes an error is kept


class NothingToSalvage(SessionLogError):
    """No record 1 ``session/start`` header decodes in the file: there is no session to
    rebuild (nothing is written)."""


@dataclass(slots=True)
class SalvageReport:
    """What ``salvage`` recovered: ``kept`` records (``copied`` byte for byte, the rest
    re-sequenced), ``gaps`` markers written, ``dropped`` decodable lines left out (seq not
    moving forward), ``damaged_regions`` the byte offsets in the source where reading
    failed (a frame that did not decompress, bytes that are not a frame), ``unverified``
    the (new) seqs of records read from a frame that failed its checksum or did not finish:
    they decode, but a flipped byte may have altered them (check them before trusting
    them)."""

    session: str
    source: str
    kept: int = 0
    copied: int = 0
    gaps: int = 0
    dropped: int = 0
    damaged_regions: list[int] | None = None
    unverified: list[int] = field(default_factory=list)

    def unverified_range(self) -> list[int] | None:
        return [self.unverified[0], self.unverified[-1]] if self.unverified else None

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "source": self.source, "kept": self.kept, "copied": self.copied,
                "gaps": self.gaps, "dropped": self.dropped, "damaged_regions": self.damaged_regions or [],
                "unverified_seqs": self.unverified_range()}


def readable_lines(data: bytes, damaged: list[int]) -> Iterator[tuple[bytes, bool]]:
    """The complete lines of ``data`` (JSONL, or Zstd frames) that can be read, each with
    whether its bytes are verified (False: it comes from a frame that failed, whose output
    may be altered from the corrupted block on). Lines never join across a damaged region.
    Offsets where reading failed are appended to ``damaged``."""
    if not data.startswith(ZSTD_MAGIC):
        for line in _lines(data):
            yield line, True
        return
    import zstandard

    pos = 0
    while pos < len(data):
        if data.startswith(ZSTD_MAGIC, pos):
            obj = zstandard.ZstdDecompressor().decompressobj()
            out: list[bytes] = []
            at = pos
            failed = False
            while at < len(data) and not obj.eof:
                try:
                    out.append(obj.decompress(data[at:at + FEED]))
                except zstandard.ZstdError:
                    failed = True
                    break
                at += FEED
            content = b"".join(out)
            if failed or not obj.eof:
                damaged.append(pos)
                for line in _lines(content):
                    yield line, False
                nxt = data.find(ZSTD_MAGIC, pos + 1)
                pos = nxt if nxt >= 0 else len(data)
                continue
            for line in _lines(content):
                yield line, True
            pos = min(at, len(data)) - len(obj.unused_data)
        else:
            if not (0x184D2A50 <= int.from_bytes(data[pos:pos + 4].ljust(4, b"\0"), "little") <= 0x184D2A5F):
                damaged.append(pos)
                nxt = data.find(ZSTD_MAGIC, pos + 1)
                pos = nxt if nxt >= 0 else len(data)
            else:  # a skippable frame: metadata, skipped
                pos += 8 + int.from_bytes(data[pos + 4:pos + 8], "little")


def _lines(content: bytes) -> Iterator[bytes]:
    parts = content.split(b"\n")
    yield from parts[:-1]  # the last part has no newline: incomplete, never kept


def salvage(source: str, dst_url: str) -> SalvageReport:
    """Rebuild the session in the log file ``source`` into the store ``dst_url`` (a new
    session there; SessionExists if it has one of that id), keeping every record that
    still decodes. A DST store this creates is removed again when the import fails (while
    it holds nothing). Raises NothingToSalvage, SessionExists, IOFailure."""
    from .convert import Destination

    try:
        with open(source, "rb") as f:
            data = f.read()
    except OSError as exc:
        from .contract import IOFailure

        raise IOFailure(f"{source}: cannot read: {exc.strerror or exc}") from exc
    damaged: list[int] = []
    records: list[Record] = []
    unverified: set[int] = set()
    for line, verified in readable_lines(data, damaged):
        try:
            records.append(Record.from_line(line))
        except RecordError:
            continue
        if not verified:
            unverified.add(len(records) - 1)
    header = records[0] if records else None
    if header is None or header.seq != 1 or header.type != SESSION_START \
            or not valid_session_id(header.get("session")):
        raise NothingToSalvage(f"{source}: no session/start header decodes; nothing to salvage")
    report = SalvageReport(header["session"], os.path.abspath(source), damaged_regions=damaged)
    with Destination(dst_url) as dst:  # a new DST that gets no session is removed again
        dst.open().import_session(report.session, _sequenced(records, report, unverified))
        dst.published = True
    return report


def _sequenced(records: list[Record], report: SalvageReport, unverified: set[int]) -> Iterator[Record]:
    seq = 0  # the last seq written
    last_original = 0
    shifted = False
    for index, record in enumerate(records):
        if record.seq <= last_original:
            report.dropped += 1
            continue
        if record.seq != last_original + 1:
            seq += 1
            report.gaps += 1
            shifted = True
            yield _encode({"seq": seq, "ts": record.ts, "type": LOG_TRUNCATED, "offset": None,
                           "dropped_bytes": None, "reason": "salvage", "quarantine": None,
                           "dropped_seqs": [last_original + 1, record.seq - 1], "source": report.source,
                           "synthetic": True})
        seq += 1
        last_original = record.seq
        report.kept += 1
        if index in unverified:
            report.unverified.append(seq)
        if not shifted:
            report.copied += 1
            yield record
        else:
            fields = msgspec.json.decode(record.raw)
            fields["seq"] = seq
            fields["salvaged_seq"] = record.seq
            yield _encode(fields)


def _encode(fields: dict[str, Any]) -> Record:
    return Record.from_line(msgspec.json.encode(fields))
