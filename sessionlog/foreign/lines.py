"""The line model shared by every JSONL-based foreign format: pure, bytes in, lines out.

A foreign session file is split at ``\\n`` into :class:`Line` objects that keep their exact
bytes. A line *decodes* when it is strict UTF-8 holding one JSON object; a whitespace-only
line is *blank* (kept, never damage). What does not decode is classified once, here, with
the damage kinds of sessionlog's own logs:

- the undecodable lines at the end of the file, with no decodable line after them, are the
  *tail*: ``torn`` when the last line has no ``\\n``, ``zero-fill`` when it holds a NUL run,
  ``corrupt`` otherwise. Repair quarantines the tail and cuts it; no acknowledged entry
  is lost, since nothing decodable follows.
- an undecodable line with decodable lines after it is ``mid-log``: it may be an entry the
  tool relied on, so only ``repair --force`` removes it (quarantined as well).

A last line that decodes but lacks its ``\\n`` is complete: repair only adds the newline.

A *glued* line is the torn remains of a write that a later append was glued onto (the tool
appended after a crash without checking the file ended in ``\\n``): undecodable as a
whole, it ends with a whole entry of the format. It is not mid-log damage: repair moves the
torn bytes to the quarantine file and keeps the entry (:func:`unglue`).
"""

from __future__ import annotations

import json
import re

import msgspec
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..contract import Damage, DamageKind


_decode = msgspec.json.Decoder().decode


@dataclass(slots=True)
class Line:
    """One line of a foreign file: ``raw`` is its exact bytes, ``\\n`` included when
    present; ``obj`` the decoded object (None when it does not decode or is blank)."""

    index: int
    offset: int
    raw: bytes
    obj: dict[str, Any] | None
    blank: bool = False

    @property
    def number(self) -> int:
        """1-based line number, as editors show it."""
        return self.index + 1

    @property
    def terminated(self) -> bool:
        return self.raw.endswith(b"\n")

    @property
    def end(self) -> int:
        return self.offset + len(self.raw)


def decode_line(raw: bytes) -> dict[str, Any] | None:
    """The JSON object a line holds, or None (not strict UTF-8, not JSON, not an object).

    A string may hold a lone UTF-16 surrogate escape (``\\ud83d`` without its pair: an
    emoji cut in half when the tool truncated a text): valid JSON, which both tools
    parse, so such a line decodes too (the surrogate stays in the string, and is written
    back as the same escape, :func:`encode_entry`)."""
    try:
        obj = _decode(raw)
    except (msgspec.DecodeError, RecursionError):
        if not _SURROGATE_ESCAPE.search(raw):
            return None
        try:
            obj = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, RecursionError):  # not UTF-8, not JSON (JSONDecodeError is a ValueError)
            return None
    return obj if isinstance(obj, dict) else None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def unglue(raw: bytes, accept: Callable[[dict[str, Any]], bool]) -> tuple[int, dict[str, Any]] | None:
    """``(torn, entry)`` when the undecodable line ``raw`` is ``torn`` bytes followed by a
    whole JSON object that ``accept`` takes for an entry of the format (the longest such
    tail: the first ``{"`` it can start at), else None."""
    body = raw[:-1] if raw.endswith(b"\n") else raw
    start = body.find(b'{"', 1)
    while start > 0:
        obj = decode_line(body[start:])
        if obj is not None and accept(obj):
            return start, obj
        start = body.find(b'{"', start + 1)
    return None


def split_lines(data: bytes) -> list[Line]:
    """Every line of ``data`` with its offset and exact bytes (the last may lack ``\\n``)."""
    lines: list[Line] = []
    start = 0
    size = len(data)
    while start < size:
        nl = data.find(b"\n", start)
        end = size if nl < 0 else nl + 1
        raw = data[start:end]
        body = raw[:-1] if raw.endswith(b"\n") else raw
        blank = not body.strip(b" \t\r")
        obj = None if blank else decode_line(body)
        lines.append(Line(len(lines), start, raw, obj, blank))
        start = end
    return lines


def encode_entry(obj: dict[str, Any]) -> bytes:
    """One new line in the compact form both tools write (``JSON.stringify`` /
    ``serde_json``): no spaces, non-ASCII kept as UTF-8, ``\\n`` at the end."""
    return dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n"


def with_members(line: Line, changes: dict[str, Any]) -> bytes:
    """``line`` with its top-level members in ``changes`` set to new values (members in
    order, a new one at the end), every other member's bytes kept as they are (numbers
    keep their spelling: ``0.00003`` stays ``0.00003``); the whole object re-encoded only
    when its top level is not written compact."""
    body = line.raw[:-1] if line.raw.endswith(b"\n") else line.raw
    try:
        members = _members(body)
    except (msgspec.DecodeError, RecursionError):
        members = None
    if members is not None and msgspec.json.encode(members) == body:
        for name, value in changes.items():
            members[name] = msgspec.Raw(dumps(value, separators=(",", ":")).encode("utf-8"))
        return msgspec.json.encode(members) + b"\n"
    return encode_entry({**(line.obj or {}), **changes})


_members = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode


def dumps_strict(obj: Any) -> bytes:
    """``obj`` as compact UTF-8 JSON; UnicodeEncodeError when a string holds a lone surrogate."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def dumps(obj: Any, **options: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **options)``, with a lone surrogate (only a
    string can hold one: see :func:`decode_line`) written as the escape it was read from,
    so that the text encodes to UTF-8."""
    text = json.dumps(obj, ensure_ascii=False, **options)
    if LONE_SURROGATE.search(text):
        text = LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


@dataclass(slots=True)
class LineDamage:
    """The undecodable lines of a file: the ``tail`` run at the end (repairable) and the
    ``mid_log`` lines with decodable lines after them (force only)."""

    tail: list[Line] = field(default_factory=list)
    mid_log: list[Line] = field(default_factory=list)
    decodable_after_first: int = 0

    @property
    def tail_kind(self) -> DamageKind | None:
        if not self.tail:
            return None
        if any(b"\x00" in line.raw for line in self.tail):
            return DamageKind.ZERO_FILL
        if len(self.tail) == 1 and not self.tail[0].terminated:
            return DamageKind.TORN
        return DamageKind.CORRUPT

    def damage(self, size: int) -> Damage | None:
        """The one :class:`~sessionlog.contract.Damage` a scan reports: ``mid-log`` from the
        first such line when there is one, else the tail."""
        if self.mid_log:
            first = self.mid_log[0]
            return Damage(
                DamageKind.MID_LOG, first.offset, size - first.offset, self.decodable_after_first,
                reason=f"line {first.number} does not decode and decodable lines follow it",
            )
        kind = self.tail_kind
        if kind is None:
            return None
        first = self.tail[0]
        return Damage(kind, first.offset, size - first.offset, 0,
                      reason=f"line {first.number} to the end of the file does not decode")

    @property
    def dropped(self) -> list[Line]:
        """What a forced repair removes, in file order."""
        return self.mid_log + self.tail


def classify(lines: list[Line]) -> LineDamage:
    """Split the undecodable lines into the tail run and the mid-log lines."""
    bad = [line for line in lines if line.obj is None and not line.blank]
    if not bad:
        return LineDamage()
    last_good = max((line.index for line in lines if line.obj is not None), default=-1)
    tail = [line for line in bad if line.index > last_good]
    mid = [line for line in bad if line.index < last_good]
    after = sum(1 for line in lines if line.obj is not None and mid and line.index > mid[0].index)
    return LineDamage(tail, mid, after)
