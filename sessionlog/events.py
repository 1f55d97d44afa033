"""The vocabulary: the record envelope, the core event types and the recovery codes.

A record is one JSON object on one line. The engine decodes only its envelope
(``seq``, ``ts``, ``type``) while scanning and keeps the record's exact bytes;
everything else is decoded lazily, on first access, and never re-serialized.
"""

from __future__ import annotations

import gc
import json
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import accumulate, repeat
from operator import itemgetter
from typing import Annotated, Any, Final, Literal, TypeVar, overload

import msgspec
from msgspec import to_builtins

FORMAT: Final = "sessionlog/1"
"""The value of ``format`` in the ``session/start`` header this version writes and reads."""

# Core event types (docs/format.md).
SESSION_START: Final = "session/start"
TURN_START: Final = "turn/start"
TURN_END: Final = "turn/end"
STEP_START: Final = "step/start"
STEP_END: Final = "step/end"
USER_MESSAGE: Final = "user/message"
SYSTEM_MESSAGE: Final = "system/message"
ASSISTANT_MESSAGE: Final = "assistant/message"
TOOL_CALL: Final = "tool/call"
TOOL_RESULT: Final = "tool/result"
LOG_TRUNCATED: Final = "log/truncated"
TOOL_APPROVAL: Final = "tool/approval"
"""A human's decision on a call: ``state`` ``requested``, ``approved`` or ``rejected``."""

END_STATUSES: Final = frozenset({"completed", "error", "aborted", "interrupted"})

# Recovery codes carried by synthetic tool/result records (is_error: true).
TOOL_OUTCOME_UNKNOWN: Final = "TOOL_OUTCOME_UNKNOWN"
"""A durable tool/call exists but no result: the tool may have run."""
TOOL_NOT_STARTED: Final = "TOOL_NOT_STARTED"
"""The assistant asked for the call but no tool/call exists: the body did not run."""
TOOL_AWAITING_APPROVAL: Final = "TOOL_AWAITING_APPROVAL"
"""View-only: the call awaits a human's approval. Never written to a log."""

_T = TypeVar("_T")

MAX_DEPTH: Final = 128
"""Deepest JSON nesting a record may have (the record object itself is depth 1)."""

SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def valid_session_id(session: object) -> bool:
    """True when ``session`` is a string a session may be named by (docs/format.md)."""
    return (
        isinstance(session, str)
        and SESSION_ID.fullmatch(session) is not None
        and ".." not in session
    )


class SessionLogError(Exception):
    """Base of every error the engine raises (defined here, beside the vocabulary, so the
    pure modules can raise it; importable from :mod:`sessionlog.contract` and
    :mod:`sessionlog`).

    An error caused by one batch of a group commit (``append_group`` on the SQL stores)
    carries ``group_index``, the batch's position in the group."""


class RecordError(ValueError):
    """A line that does not decode as a record; ``reason`` says why in a few words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_fields_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_str_decoder = msgspec.json.Decoder(str)
_value_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


# --- the decode rules (one set, shared by every backend and both scan paths) -------------

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_KEEP_BRACKETS = bytes(b for b in range(256) if b not in b"{[]}")
_BRACKET_STEP = [1 if b in b"{[" else -1 if b in b"}]" else 0 for b in range(256)]


def nested_deeper(line: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when the JSON in ``line`` nests deeper than ``limit`` (the top-level object is
    depth 1; brackets inside strings do not count). Linear, without recursion: a count
    of opening brackets decides most lines; otherwise the strings are cut out (C-level
    regex) and the bracket depth summed over what is left."""
    if line.count(b"{") + line.count(b"[") <= limit:
        return False
    brackets = _STRING.sub(b"", line).translate(None, _KEEP_BRACKETS)
    return len(brackets) > limit and max(accumulate(map(_BRACKET_STEP.__getitem__, brackets))) > limit


_ROOM = 4 * MAX_DEPTH
_room_lock = threading.Lock()


def _with_room(codec: Callable[[Any], _T], value: Any) -> _T:
    """``codec(value)``; a RecursionError is retried once with the interpreter's recursion
    limit raised by a few times ``MAX_DEPTH``. A value at most ``MAX_DEPTH`` deep then
    encodes or decodes however deep the caller's own stack is; a second RecursionError
    (the value itself is far deeper) propagates."""
    try:
        return codec(value)
    except RecursionError:
        with _room_lock:
            limit = sys.getrecursionlimit()
            sys.setrecursionlimit(limit + _ROOM)
            try:
                return codec(value)
            finally:
                sys.setrecursionlimit(limit)


# Parses JSON into the pair count of each object (numbers kept as their digit count): the
# standard library's parser sees every pair, where msgspec keeps one of a repeated key.
_PAIRS = json.JSONDecoder(object_pairs_hook=len, parse_int=len, parse_float=len)


class _Envelope(msgspec.Struct, gc=False):
    seq: int
    ts: float
    type: str


_envelope_decoder = msgspec.json.Decoder(_Envelope)


def decode_envelope(line: bytes) -> tuple[int, float, str]:
    """Check that ``line`` (without its newline) decodes as a record; return its envelope.

    "Decodes" means: strict UTF-8, no line break (``\n``; a ``\r`` between tokens is JSON
    whitespace), one JSON object, unique top-level keys, ``seq`` an integer, ``ts`` a
    finite number, ``type`` a non-empty string, nesting at most ``MAX_DEPTH`` deep.
    Raises :class:`RecordError` otherwise.
    """
    record = Record.from_line(line)
    return record.seq, record.ts, record.type


def _decode_members(line: bytes) -> tuple[_Envelope, dict[str, msgspec.Raw]]:
    """The envelope and the top-level members (raw, undecoded) of a record line: the
    exact rules, line by line, that every backend's scan applies (the region fast path
    only ever accepts lines these rules accept)."""
    if not line.isascii():
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"invalid UTF-8 at byte {exc.start}") from None
    if b"\n" in line:
        raise RecordError("contains a line break")
    if nested_deeper(line):
        raise RecordError(f"nested deeper than {MAX_DEPTH}")
    try:
        envelope = _with_room(_envelope_decoder.decode, line)
        members = _with_room(_fields_decoder.decode, line)
    except msgspec.ValidationError as exc:
        raise RecordError(f"bad envelope: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise RecordError(f"not a JSON object: {exc}") from None
    # Re-encoding the members gives the line back exactly when the line is compact with
    # unique keys; anything else (spaces, escapes, a repeated key) takes the exact check.
    if _encoder.encode(members) != line:
        try:
            pairs = _with_room(_PAIRS.decode, line.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # pragma: no cover - msgspec accepted it
            raise RecordError(f"not a JSON object: {exc}") from None
        if pairs != len(members):
            raise RecordError("duplicate key")
    if not envelope.type:
        raise RecordError("type is empty")
    if not math.isfinite(envelope.ts):  # pragma: no cover - msgspec refuses 1e999 already
        raise RecordError("ts is not a finite number")
    return envelope, members


# Every byte but "{", "[" and newline: deleting them leaves each line's opening brackets.
_NOT_OPENERS = bytes(b for b in range(256) if b not in b"{[\n")
# Each line's first and last non-blank bytes are "{" and "}". A newline between a "}" and
# a "{" cannot lie inside a JSON value (after a nested value's "}" the grammar wants ",",
# "}" or "]"), so in such a region every newline ends a top-level value.
_ALIGNED = re.compile(rb"(?:[ \t\r]*\{[^\n]*\}[ \t\r]*\n)*")


def _decode_lines(region: bytes) -> list[dict[str, msgspec.Raw]] | None:
    """The members of the JSON values in ``region`` (newline-delimited), or None when it
    does not decode as JSON objects."""
    try:
        return _fields_decoder.decode_lines(region)
    except (msgspec.DecodeError, RecursionError):
        return None


def _aligned(region: bytes, n: int) -> bool:
    """True when each of the ``n`` lines of ``region`` starts with "{" and ends with "}"
    (blanks aside): then a region that decodes to ``n`` values has one per line."""
    return (region[:1] == b"{" and region.endswith(b"}\n") and region.count(b"}\n{") == n - 1) or (
        _ALIGNED.fullmatch(region) is not None
    )


def _unique_keys(lines: list[bytes], members: list[dict[str, msgspec.Raw]]) -> bool:
    """True when no line (one object each, proven aligned) repeats a top-level key: the
    pairs the standard library's parser counts in each top-level object match the
    members msgspec kept (a repeated key keeps one)."""
    try:
        counts = _with_room(_PAIRS.decode, (b"[" + b",".join(lines) + b"]").decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return counts == list(map(len, members))


def _proven_prefix(lines: list[bytes], region: bytes, members: list[dict[str, msgspec.Raw]]) -> int:
    """How many leading ``lines`` (``region`` is them, each ending in a newline; ``members``
    the objects decoded from it, as many as lines) are proven records but for the
    envelope: each line is one JSON object with unique top-level keys, nested at most
    ``MAX_DEPTH`` deep.

    Compact lines are proven by re-encoding the members: it gives each line back byte for
    byte. Lines written with blanks (another tool's ``json.dumps``) are proven as a
    region: aligned one object per line, and the top-level pairs counted."""
    good = len(lines)
    again = _encoder.encode_lines(members)
    if again != region and not (_aligned(region, len(lines)) and _unique_keys(lines, members)):
        # Each line against its own object's encoding (not against the pieces of
        # ``again``: an object whose member holds a newline spans two lines, and as many
        # objects as lines does not mean one object per line).
        for i, (line, member) in enumerate(zip(lines, members)):
            if line != _encoder.encode(member):
                good = i
                break
    # Depth: a line nested deeper than MAX_DEPTH opens more than MAX_DEPTH brackets. The
    # region's openers (newlines kept) are counted per line in C; only a line over the
    # bound is measured exactly.
    openers = region.translate(None, _NOT_OPENERS)
    if len(openers) - len(lines) > MAX_DEPTH:
        counts = list(map(len, openers.split(b"\n", good)))
        if max(counts) > MAX_DEPTH:
            for i, count in enumerate(counts):
                if i >= good:
                    break
                if count > MAX_DEPTH and nested_deeper(lines[i]):
                    good = i
    return good


_seqs_decoder = msgspec.json.Decoder(list[int])
_tss_decoder = msgspec.json.Decoder(list[float])
_types_decoder = msgspec.json.Decoder(list[str])
# The members gathered in C (a msgspec.Raw is a buffer: joined as it is).
_SEQ_OF, _TS_OF, _TYPE_OF = itemgetter("seq"), itemgetter("ts"), itemgetter("type")


def _envelopes(members: list[dict[str, msgspec.Raw]]) -> tuple[list[int], list[float], list[str]] | None:
    """The ``seq``, ``ts`` and ``type`` of each record, decoded from its raw members in one
    typed decode per member (the same typed rules as :class:`_Envelope`), or None when
    some record lacks one or one is not of its type."""
    try:
        return (
            _seqs_decoder.decode(b"[" + b",".join(map(_SEQ_OF, members)) + b"]"),
            _tss_decoder.decode(b"[" + b",".join(map(_TS_OF, members)) + b"]"),
            _types_decoder.decode(b"[" + b",".join(map(_TYPE_OF, members)) + b"]"),
        )
    except (KeyError, msgspec.DecodeError):
        return None


def decode_region(region: bytes, first_seq: int) -> list[Record]:
    """The records of the longest proven prefix of ``region``: see :func:`region_records`."""
    return region_run(region, first_seq)[0].records()


def region_records(region: bytes, first_seq: int) -> tuple[list[Record], bool]:
    """The records of the longest prefix of ``region`` (whole lines, each ending in a
    newline) that the region rules prove, with seqs running on from ``first_seq``, and
    whether that prefix is the whole region: :func:`region_run` with its records built."""
    run, whole = region_run(region, first_seq)
    return run.records(), whole


# A line nested deeper than MAX_DEPTH opens more than MAX_DEPTH brackets: in a region's
# openers (see _NOT_OPENERS) after a newline, more than MAX_DEPTH of them before the next.
# Searched in "\n" + openers: a match is tried at newlines only (the literal comes first),
# so the search is linear in the openers.
_MANY_OPENERS = re.compile(rb"\n[^\n]{%d}" % (MAX_DEPTH + 1))


def region_run(region: bytes, first_seq: int) -> tuple[RecordRun, bool]:
    """The records of the longest prefix of ``region`` (whole lines, each ending in a
    newline) that the region rules prove, with seqs running on from ``first_seq``, as a
    :class:`RecordRun`; and whether that prefix is the whole region.

    The fast path of a scan: the region's members are decoded in one msgspec call and
    proven as a whole; the envelopes are decoded from the raw members. The first line
    that is not proven (and the prefix is empty when the region is not one object per
    line) is left to the exact, line-by-line rules, which accept it or explain why not."""
    members = _decode_lines(region)
    if members is not None:
        # Proven whole, strict UTF-8 included (checked in the pass that finds the openers).
        run = _compact_run(region, members, first_seq)
        if run is not None:
            return run, True
    return _checked_run(region, first_seq, members)


def _checked_run(region: bytes, first_seq: int, members: list[dict[str, msgspec.Raw]] | None
                 ) -> tuple[RecordRun, bool]:
    """:func:`region_run` once the compact proof failed (``members``: the region's
    objects, None when it does not decode): the lines before the first byte that is not
    strict UTF-8, on the general path."""
    cut = False
    if not region.isascii():
        try:
            region.decode("utf-8")
        except UnicodeDecodeError as exc:
            # The lines before the first invalid byte (the exact path tells what it is).
            region = region[: region.rfind(b"\n", 0, exc.start) + 1]
            if not region:
                return RecordRun.empty(), False
            cut = True
            members = _decode_lines(region)
    run, every = _general_run(region, first_seq, members)
    return run, every and not cut


def region_run_in(buf: bytes, start: int, end: int, first_seq: int) -> tuple[RecordRun, bool]:
    """:func:`region_run` of ``buf[start:end]``, without copying the region out of
    ``buf`` first when its lines are written as this engine writes them: the members are
    decoded where they lie, and their re-encoding, which gives the region back byte for
    byte, is the run's copy of it (the one a slice would have made) on which the other
    rules are checked. The members' JSON text then refers to ``buf``."""
    if start == 0 and end == len(buf):
        return region_run(buf, first_seq)
    members = _decode_lines(memoryview(buf)[start:end])
    if members is not None:
        again = _encoder.encode_lines(members)
        if len(again) == end - start and buf.startswith(again, start):
            run = _compact_proven(again, members, first_seq)
            if run is not None:
                return run, True
        region = buf[start:end]
        if _utf8(region):
            # The members decoded from the very same bytes: the general path takes them.
            return _general_run(region, first_seq, members)
        return _checked_run(region, first_seq, members)
    return _checked_run(buf[start:end], first_seq, None)


def _utf8(data: bytes) -> bool:
    """True when ``data`` is strict UTF-8."""
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _compact_run(region: bytes, members: list[dict[str, msgspec.Raw]], first_seq: int) -> RecordRun | None:
    """The run of a region (whole lines) whose every line is a record
    written as this engine writes them, proven without splitting it into lines; None
    when any line is not (the general path then finds the proven prefix).

    Each of the ``n`` objects decoded from ``region`` (``members``) re-encodes to the
    region byte for byte, and the region holds ``n`` newlines: the encoder ends each
    object with one, so no object holds another and each line is one compact object with
    unique top-level keys (a repeated key keeps one member and would not re-encode to
    the same bytes). Depth: a line nested deeper than ``MAX_DEPTH`` opens more than
    ``MAX_DEPTH`` brackets; the openers are kept with the newlines in one C-level pass,
    and a line with that many is measured exactly, value by value. None too when the
    region is not strict UTF-8."""
    if _encoder.encode_lines(members) != region:
        return None
    return _compact_proven(region, members, first_seq)


def _compact_proven(region: bytes, members: list[dict[str, msgspec.Raw]], first_seq: int) -> RecordRun | None:
    """:func:`_compact_run` once ``members`` are proven to re-encode to ``region``: the
    UTF-8, newline count, depth and envelope rules (None when one does not hold)."""
    n = len(members)
    if not _utf8(region):
        return None
    if not _shallow(region, members):
        return None
    # Each seq is written as the digits of the integer expected: the only JSON text that
    # decodes to it as an integer (no leading zeros, no "+"; a fraction or an exponent
    # is a float). Any other text takes the general path, which decodes it.
    seqs = list(range(first_seq, first_seq + n))
    try:
        if b"[" + b",".join(map(_SEQ_OF, members)) + b"]" != _encoder.encode(seqs):
            return None
        tss = _tss_decoder.decode(b"[" + b",".join(map(_TS_OF, members)) + b"]")
        types = _types_decoder.decode(b"[" + b",".join(map(_TYPE_OF, members)) + b"]")
    except (KeyError, msgspec.DecodeError):
        return None
    if "" in types:
        return None
    return RecordRun(region, seqs, tss, types, members)


_WINDOW = 16 << 10
"""Bytes of whole lines whose brackets :func:`_shallow` counts at a time."""


def _shallow(region: bytes, members: list[dict[str, msgspec.Raw]]) -> bool:
    """For a region proven to be the compact objects ``members``, each ending in a
    newline: True when it holds one newline per object (no member's JSON text holds one)
    and no line nests deeper than ``MAX_DEPTH``.

    The brackets are counted a window of whole lines at a time with C-level searches
    (``bytes.replace`` of one byte finds it with ``memchr``), not byte by byte: every
    line opens at least its own object, so a line that opens more than ``MAX_DEPTH``
    brackets makes its window open at least ``MAX_DEPTH`` more brackets than it has
    lines. Only a window that does is read byte by byte: its openers are kept (newlines
    too, in one C-level pass), and a line with more than ``MAX_DEPTH`` is measured
    exactly, value by value."""
    size = len(region)
    start = 0
    lines = 0  # the lines before ``start``
    while start < size:
        end = region.rfind(b"\n", start, start + _WINDOW) + 1
        if end <= start:  # one line longer than a window: the window is that line
            end = region.find(b"\n", start) + 1 or size
        window = region[start:end] if start or end < size else region
        kept = window.replace(b"\n", b"")
        in_window = len(window) - len(kept)
        if len(kept) - len(kept.replace(b"{", b"").replace(b"[", b"")) - in_window >= MAX_DEPTH:
            openers = window.translate(None, _NOT_OPENERS)
            if _MANY_OPENERS.search(b"\n" + openers) is not None:
                counts = list(map(len, openers.split(b"\n")))
                if lines + len(counts) - 1 > len(members):
                    return False  # more lines than objects: a member's text holds a newline
                for k, count in enumerate(counts, lines):
                    if count > MAX_DEPTH and _members_deeper(members[k]):
                        return False
        lines += in_window
        start = end
    return lines == len(members)


def _members_deeper(members: dict[str, msgspec.Raw]) -> bool:
    """True when the record whose top-level ``members`` these are (its line proven to be
    them, written compact) nests deeper than ``MAX_DEPTH``: when one of its values nests
    deeper than ``MAX_DEPTH - 1``. A value that is not an array or an object (a string
    full of brackets, say) nests no deeper than the record itself."""
    for raw in members.values():
        view = memoryview(raw)
        if view[0] in _OPENS and nested_deeper(view.tobytes(), MAX_DEPTH - 1):
            return True
    return False


_OPENS = frozenset(b"[{")


def _general_run(region: bytes, first_seq: int, members: list[dict[str, msgspec.Raw]] | None
                 ) -> tuple[RecordRun, bool]:
    """:func:`region_run` for any region of valid UTF-8 (``members``: its objects, None
    when it does not decode): split into lines, each rule proven on the region or on the
    lines it does not hold for. Returns the run and whether it holds every line."""
    lines = region.split(b"\n")
    lines.pop()
    every = len(lines)
    if members is None:
        # Something in the region does not decode: the longest prefix that does, found by
        # halving (a few decodes of shrinking size, never one per line).
        low, high = 0, len(lines)  # lines[:low] decode; lines[:high] do not
        while high - low > 1:
            mid = (low + high) // 2
            if _decode_lines(b"\n".join(lines[:mid]) + b"\n") is None:
                high = mid
            else:
                low = mid
        lines = lines[:low]
        if not lines:
            return RecordRun.empty(), False
        region = b"\n".join(lines) + b"\n"
        members = _decode_lines(region)
        assert members is not None
    if len(lines) != len(members):  # not one object per line
        return RecordRun.empty(), False
    good = _proven_prefix(lines, region, members)
    if good < len(lines):
        del lines[good:], members[good:]
    envelopes = _envelopes(members)
    if envelopes is None:
        # Some envelope is missing or mistyped: the lines before the first such one.
        good = 0
        for members_of in members:
            if _envelopes([members_of]) is None:
                break
            good += 1
        del lines[good:], members[good:]
        envelopes = _envelopes(members)
        assert envelopes is not None
    seqs, tss, types = envelopes
    if seqs != list(range(first_seq, first_seq + len(seqs))):
        good = next(i for i, seq in enumerate(seqs) if seq != first_seq + i)
    if "" in types:
        good = min(good, types.index(""))
    if good < len(lines):
        del lines[good:], seqs[good:], tss[good:], types[good:], members[good:]
    # The proven lines are the first lines of ``region`` (whichever prefix it was cut to).
    data = region[: sum(map(len, lines)) + len(lines)]
    return RecordRun(data, seqs, tss, types, members, lines), len(lines) == every


def unreadable(lines: list[bytes]) -> tuple[int, str] | None:
    """The first of ``lines`` (record lines without newlines) that does not decode as a
    record, with the reason, or None when each one does. Proven per line: the batch's
    members are decoded in one call and re-encoded byte for byte (each line is then one
    compact object, whatever its neighbours hold); a line not proven that way is checked
    alone by the exact rules."""
    region = b"\n".join(lines) + b"\n"
    good = 0
    try:
        if not region.isascii():
            region.decode("utf-8")
        members = _with_room(_fields_decoder.decode_lines, region)
    except (UnicodeDecodeError, msgspec.DecodeError, RecursionError):
        pass
    else:
        if len(members) == len(lines):
            good = _proven_prefix(lines, region, members)
    for i in range(good, len(lines)):
        try:
            Record.from_line(lines[i])
        except RecordError as exc:
            return i, exc.reason
    return None


class Record(msgspec.Struct, gc=False, repr_omit_defaults=True):
    """One committed record: a read-only mapping over its exact bytes.

    ``raw`` is the record's line without the trailing newline. The envelope is
    available as attributes; a member is decoded when it is looked up (``r["call_id"]``
    decodes just that member), the whole record only when it is iterated or copied.

    A :class:`collections.abc.Mapping` (registered): a scan builds one per record, so it
    is a C-level struct rather than a Python class with an ``__init__``.
    """

    raw: bytes
    seq: int
    ts: float
    type: str
    _members: dict[str, msgspec.Raw] | None = None
    _fields: dict[str, Any] | None = None

    @classmethod
    def from_line(cls, line: bytes) -> Record:
        """Decode ``line`` (no newline); raises :class:`RecordError` if it is not a record."""
        envelope, members = _decode_members(line)
        return cls(line, envelope.seq, envelope.ts, envelope.type, members)

    def _decoded(self) -> dict[str, Any]:
        fields = self._fields
        if fields is None:
            fields = _value_decoder.decode(self.raw)
            msgspec.structs.force_setattr(self, "_fields", fields)
        return fields

    def __getitem__(self, key: str) -> Any:
        if self._fields is None and self._members is not None:
            return _value_decoder.decode(self._members[key])
        return self._decoded()[key]

    def raw_member(self, key: str) -> msgspec.Raw | None:
        """The member ``key`` as its JSON text, undecoded (None when the record has no such
        member or was not read with its members split, as the scanner reads records)."""
        return self._members.get(key) if self._members is not None else None

    def __contains__(self, key: object) -> bool:
        if self._fields is None and self._members is not None:
            return key in self._members
        return key in self._decoded()

    def get(self, key: str, default: Any = None) -> Any:
        if self._fields is None and self._members is not None:
            raw = self._members.get(key)
            return default if raw is None else _value_decoder.decode(raw)
        return self._decoded().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    keys = Mapping.keys
    items = Mapping.items
    values = Mapping.values

    def view(self, cls: type[_V]) -> _V:
        """Decode just the members ``cls`` (a typed view) names; unknown ones are skipped."""
        return _view_decoder(cls).decode(self.raw)

    def to_dict(self) -> dict[str, Any]:
        """A mutable copy of the decoded record."""
        return dict(self._decoded())

    def __repr__(self) -> str:
        return f"Record({self.raw.decode('utf-8', 'replace')})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Record):
            return self.raw == other.raw
        return Mapping.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]


Mapping.register(Record)


class RecordRun:
    """The records of a run of whole lines a scan proved, as parallel lists: ``data``
    (the lines, each ending in a newline), ``seqs``, ``tss``, ``types`` and ``members``
    (each record's top-level members, raw). No :class:`Record` object is built until
    :meth:`records` asks: a consumer that reads the envelopes and members (the scan's
    transcript tracking) takes a region of records in one call."""

    __slots__ = ("data", "seqs", "tss", "types", "members", "_lines", "_records")

    def __init__(self, data: bytes, seqs: list[int], tss: list[float], types: list[str],
                 members: list[dict[str, msgspec.Raw]], lines: list[bytes] | None = None) -> None:
        self.data = data
        self.seqs = seqs
        self.tss = tss
        self.types = types
        self.members = members
        self._lines = lines
        self._records: list[Record] | None = None

    @classmethod
    def empty(cls) -> RecordRun:
        return cls(b"", [], [], [], [], [])

    @classmethod
    def of(cls, records: list[Record]) -> RecordRun:
        """The run of records decoded one by one (each with its members split)."""
        run = cls(b"".join([r.raw + b"\n" for r in records]), [r.seq for r in records], [r.ts for r in records],
                  [r.type for r in records], [r._members for r in records],  # type: ignore[misc]
                  [r.raw for r in records])
        run._records = records
        return run

    def __len__(self) -> int:
        return len(self.seqs)

    def lines(self) -> list[bytes]:
        """The records' lines, without newlines."""
        lines = self._lines
        if lines is None:
            lines = self._lines = self.data.split(b"\n")
            lines.pop()
        return lines

    def records(self) -> list[Record]:
        """The run as :class:`Record` objects (built once)."""
        records = self._records
        if records is None:
            records = self._records = list(map(Record, self.lines(), self.seqs, self.tss, self.types, self.members))
        return records

    def last_raw(self) -> bytes:
        """The last record's line, without its newline (the run is not empty)."""
        data = self.data
        return data[data.rfind(b"\n", 0, len(data) - 1) + 1 : -1]

    def head(self, n: int) -> RecordRun:
        """The run of the first ``n`` records."""
        if n >= len(self):
            return self
        lines = self.lines()[:n]
        run = RecordRun(self.data[: sum(map(len, lines)) + n], self.seqs[:n], self.tss[:n], self.types[:n],
                        self.members[:n], lines)
        if self._records is not None:
            run._records = self._records[:n]
        return run


_LINE_BREAK = (
    "a msgspec.Raw value holds a line break (\\n or \\r) and a record is one line: pass the "
    "value itself, or its JSON without line breaks"
)


def read_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping event read once into a dict, as it is now (its own code runs here, and
    only here); RecordError when reading it fails."""
    try:
        return dict(event)
    except Exception as exc:  # noqa: BLE001 - the caller's mapping failed to be read
        raise RecordError(f"the event could not be read: {type(exc).__name__}: {exc}") from exc


def encode_record(event: Mapping[str, Any], seq: int, ts: float | None = None) -> bytes:
    """Serialize a new event as a record line (no newline), ``seq`` and ``ts`` first.

    ``event`` must carry a non-empty string ``type`` and must not carry ``seq``; its
    ``ts`` is kept when it has one, else ``ts`` (or the current time) is used.
    Raises :class:`RecordError` for an event that could not be read back as a record
    (not serializable, nested deeper than ``MAX_DEPTH``, a ``msgspec.Raw`` value that is
    not JSON or holds a line break); never RecursionError.
    """
    if type(event) is not dict:
        if not isinstance(event, Mapping):
            raise RecordError(f"an event is a mapping, not {type(event).__name__}")
        event = read_event(event)
    type_ = event.get("type")
    if type(type_) is not str or not type_:
        raise RecordError("an event needs a non-empty string 'type'")
    if "seq" in event:
        raise RecordError("'seq' is assigned by the store; do not set it")
    if not _str_keys(event):
        raise RecordError("event keys must be strings")
    event_ts = event.get("ts")
    if event_ts is None:
        event_ts = time.time() if ts is None else ts
    elif type(event_ts) is not float and (isinstance(event_ts, bool) or not isinstance(event_ts, (int, float))):
        raise RecordError("'ts' must be a finite number of seconds since the epoch")
    elif not _finite(event_ts):
        raise RecordError("'ts' must be a finite number of seconds since the epoch")
    # The event's own members keep their order after the envelope; "type" and "ts" keep
    # their envelope position (a repeated key in a dict display updates the first slot).
    body = {"seq": seq, "ts": event_ts, "type": type_, **event}
    body["ts"] = event_ts
    try:
        line = _with_room(_encoder.encode, body)
    except RecursionError:
        raise RecordError(f"event nested deeper than {MAX_DEPTH}") from None
    except (TypeError, msgspec.EncodeError, OverflowError, ValueError) as exc:
        raise RecordError(f"event is not JSON-serializable: {exc}") from None
    if not _SCALARS.issuperset(map(type, body.values())):
        # Containers can nest too deep, and a msgspec.Raw is copied verbatim: read it back.
        if b"\n" in line or b"\r" in line:
            raise RecordError(_LINE_BREAK)
        bad = unreadable([line])
        if bad is not None:
            raise RecordError(f"does not read back as a record: {bad[1]}")
    return line


_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
_INT = frozenset({int})


def _finite(number: int | float) -> bool:
    """True when ``number`` is finite as a float (an int too large for one is not)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def encode_records(
    events: Sequence[Mapping[str, Any]], first_seq: int, *, record_limit: int, now: float | None = None
) -> list[bytes]:
    """Record lines (no newlines) for a batch of new events, seq from ``first_seq``.

    The batch's events share one clock reading for ``ts`` unless they carry their own.
    Every line is proven to decode as a record on its own (what every backend's scan
    checks), so append never writes what scan refuses. Raises :class:`RecordError`
    naming the first event at fault (not an event, no type, ``seq`` set, not
    serializable, too deep, a ``msgspec.Raw`` that is not one line of JSON, longer than
    ``record_limit`` bytes); never RecursionError."""
    return encode_records_sized(events, first_seq, record_limit=record_limit, now=now)[0]


def encode_records_sized(
    events: Sequence[Mapping[str, Any]], first_seq: int, *, record_limit: int, now: float | None = None
) -> tuple[list[bytes], int]:
    """:func:`encode_records` with the batch's size in bytes: its lines and a newline
    each (what a batch limit bounds), measured once with the record limit's check."""
    found = _records_at(events, range(first_seq, first_seq + len(events)), record_limit, now, False)
    assert found is not None  # only fast_only declines
    return found


@overload
def encode_records_at(events: Sequence[Mapping[str, Any]], seqs: Sequence[int], *, record_limit: int,
                      now: float | None = ..., fast_only: Literal[False] = ...) -> list[bytes]: ...


@overload
def encode_records_at(events: Sequence[Mapping[str, Any]], seqs: Sequence[int], *, record_limit: int,
                      now: float | None = ..., fast_only: Literal[True]) -> list[bytes] | None: ...


def encode_records_at(
    events: Sequence[Mapping[str, Any]], seqs: Sequence[int], *, record_limit: int, now: float | None = None,
    fast_only: bool = False,
) -> list[bytes] | None:
    """:func:`encode_records` with each event's seq given: ``seqs`` holds one int (>= 1)
    per event, in any order (several sessions' batches encoded in one pass, each running
    on from its own tail). Same rules, same bytes for each event, same errors (the event
    at fault is named by its position in ``events``). With ``fast_only``, None instead
    when the batch does not take the one-call fast path or would be refused: the caller
    then encodes it another way. Raises ValueError for ``seqs`` that are not that."""
    found = _records_at(events, seqs, record_limit, now, fast_only)
    return None if found is None else found[0]


def _records_at(
    events: Sequence[Mapping[str, Any]], seqs: Sequence[int], record_limit: int, now: float | None,
    fast_only: bool,
) -> tuple[list[bytes], int] | None:
    """:func:`encode_records_at` with the batch size of its lines (see
    :func:`encode_records_sized`)."""
    when = time.time() if now is None else now
    if len(seqs) != len(events):
        raise ValueError(f"{len(events)} events but {len(seqs)} seqs")
    if type(seqs) is not range and seqs and (not _INT.issuperset(map(type, seqs)) or min(seqs) < 1):
        raise ValueError("seqs must be ints >= 1")
    if len(events) == 1:  # the most common append
        block = _one_block(events[0], seqs[0], when)
        if block is not None and len(block) <= record_limit + 1:
            return [block[:-1]], len(block)
    try:
        lines = _encode_fast(events, seqs, when, _LINES)
        if lines is not None:
            return lines, _checked_size(lines, record_limit)
    except RecordError:
        if fast_only:
            return None
        raise
    if fast_only:
        return None
    lines = _encode_each(events, seqs, when, record_limit)
    return lines, sum(map(len, lines)) + len(lines)


def encode_block(
    events: Sequence[Mapping[str, Any]], first_seq: int, *, record_limit: int, now: float | None = None
) -> tuple[bytes, int, float]:
    """:func:`encode_records` as one block of bytes, each record line ending in a newline
    (the JSONL bytes of the batch, built once), with the number of records and the
    ``ts`` of the last one. Same rules, same bytes, same errors."""
    when = time.time() if now is None else now
    n = len(events)
    if n == 1:  # the most common append
        block = _one_block(events[0], first_seq, when)
        if block is not None and len(block) <= record_limit + 1:
            return block, 1, when if type(when) is float else float(when)
    seqs = range(first_seq, first_seq + n)
    block = _encode_fast(events, seqs, when, _BLOCK)
    if block is None:
        lines = _encode_each(events, seqs, when, record_limit)
        block = b"\n".join(lines) + b"\n" if lines else b""
        last_ts = _envelope_decoder.decode(lines[-1]).ts if lines else when
        return block, n, last_ts
    if len(block) - n > record_limit:  # some line may be over: measure each
        lines = block.split(b"\n")
        lines.pop()
        _checked(lines, record_limit, nested=False)
    if not n:
        return block, 0, when
    last_ts = events[-1].get("ts", when)
    return block, n, last_ts if type(last_ts) is float else float(last_ts)


_FINITE = msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)


class _Fresh(msgspec.Struct, gc=False):
    """What the batch fast path asks of each event, checked in one C-level pass
    (``msgspec.convert``): string keys (exactly ``str``), a non-empty string ``type``,
    no ``seq``, and if it has a ``ts``, a finite int or float. The rest of each event
    is not looked at here."""

    type: Annotated[str, msgspec.Meta(min_length=1)]
    ts: Annotated[float, _FINITE] = 0.0
    seq: msgspec.UnsetType = msgspec.UNSET


class _FreshWithoutTs(msgspec.Struct, gc=False):
    """:class:`_Fresh` for an event without a ``ts`` of its own, as most are: a batch
    that passes this also has no event with a ``ts``, found in the same pass."""

    type: Annotated[str, msgspec.Meta(min_length=1)]
    ts: msgspec.UnsetType = msgspec.UNSET
    seq: msgspec.UnsetType = msgspec.UNSET


_FRESH = list[_Fresh]
_FRESH_WITHOUT_TS = list[_FreshWithoutTs]
_DICT = frozenset({dict})
_SEQUENCES = frozenset({list, tuple})


def _encode_lines_each(bodies: list[dict[str, Any]]) -> list[bytes]:
    return list(map(_encoder.encode, bodies))


def _encode_block(bodies: list[dict[str, Any]]) -> bytes:
    return _encoder.encode_lines(bodies)


_LINES: Final = _encode_lines_each
_BLOCK: Final = _encode_block


def _encode_fast(
    events: Sequence[Mapping[str, Any]], seqs: Sequence[int], when: float,
    encode: Callable[[list[dict[str, Any]]], _T],
) -> _T | None:
    """The batch's records, exactly as :func:`_encode_each` writes them, as ``encode``
    gives them (:data:`_LINES`: the lines; :data:`_BLOCK`: one block, each line ending
    in a newline); None when the batch is not one this path takes (the exact path then
    encodes it, or names the event at fault). Raises RecordError only for a batch the
    exact path refuses too.

    The path takes plain ``dict`` events that pass :class:`_Fresh` with an exact ``str``
    type. Each record is the exact path's body (``seq``, ``ts``, ``type``, then the
    event's members in order), all encoded in one call. The encoder then wrote every
    byte itself but the shared ``ts``, unless a value is a ``msgspec.Raw``: a batch
    whose values are JSON scalars (exact types), dicts, lists and tuples nested at most
    ``MAX_DEPTH`` deep (counted on the objects) is records by construction; any other
    batch is proven on its bytes."""
    if not _DICT.issuperset(map(type, events)):
        return None
    # Events that carry a ts mostly all do: the first one decides which check is tried first
    # (a failed convert costs more than a passed one).
    own_ts = bool(events) and "ts" in events[0]
    if not own_ts:
        try:
            msgspec.convert(events, _FRESH_WITHOUT_TS)
        except (ValueError, OverflowError, TypeError):  # ValidationError; a str msgspec cannot encode
            own_ts = True  # if _Fresh passes: the only difference between the two
    if own_ts:
        try:
            msgspec.convert(events, _FRESH)
        except (ValueError, OverflowError, TypeError):  # ValidationError; a str msgspec cannot encode
            return None
    if not events:
        return encode([])
    shared_ts = _encoder.encode(when)
    plain = _plain(events)
    if plain and not own_ts:
        spliced = _spliced(events, seqs, shared_ts, encode is _LINES)
        if spliced is not None:
            return spliced  # type: ignore[return-value]
    # A repeated key in a dict display keeps its first slot: "ts" stays second and "type"
    # third whatever their place in the event. The shared ts is encoded once (what the
    # encoder writes for ``when``, copied verbatim); an event's own ts replaces it.
    shared_ts = msgspec.Raw(shared_ts)
    bodies = [{"seq": seq, "ts": shared_ts, "type": None, **event} for seq, event in zip(seqs, events)]
    try:
        encoded = _with_room(encode, bodies)
    except (RecursionError, TypeError, msgspec.EncodeError, OverflowError, ValueError):
        return None
    # Every value an exact scalar (the type among them: an exact str), or containers of
    # what the encoder writes itself, not too deep.
    if plain:
        return encoded
    if not _STR.issuperset(map(type, map(dict.get, events, repeat("type")))):
        return None  # a str subclass as type: the exact path refuses it
    if encode is _LINES:
        lines = encoded
        block = b"\n".join(lines) + b"\n"
    else:
        block = encoded
        lines = block.split(b"\n")
        lines.pop()
    # JSON escapes every line break inside a string: only a msgspec.Raw can hold one.
    if len(lines) != len(events) or block.count(b"\n") != len(events) or b"\r" in block:
        return None
    if _verbatim_free(events):
        # The encoder wrote every byte itself: each line is one compact object with the
        # event's unique keys; what remains is the depth, counted on the bytes.
        deep = _first_too_deep(block, len(events))
        if deep is not None:
            raise RecordError(f"event {deep} of the batch does not read back as a record: "
                              f"nested deeper than {MAX_DEPTH}")
        return encoded
    bad = unreadable(lines)
    if bad is not None:
        raise RecordError(f"event {bad[0]} of the batch does not read back as a record: {bad[1]}")
    return encoded


_TYPE_FIRST = b'\n{"type":'
_TYPE_HEAD = _TYPE_FIRST[1:]
_SEQ = b'{"seq":'
_NL_SEQ = b'\n{"seq":'


def _spliced(events: Sequence[dict[str, Any]], seqs: Sequence[int], ts: bytes, as_lines: bool) -> list[bytes] | bytes | None:
    """The records of ``events`` (plain: see :func:`_plain`; none with a ``ts`` of its
    own; at least one) as :func:`_encode_fast` writes them, with the envelope spliced in
    front of each event's encoded members by C-level byte operations instead of a new
    dict per event; None unless every event's first member is its ``type``.

    In the batch's encoded lines a newline only ends a line (JSON escapes it in a
    string; no ``msgspec.Raw`` is there), so ``\\n{"type":`` occurs once per event
    exactly when each line starts with its type."""
    n = len(events)
    try:
        block = _with_room(_encoder.encode_lines, events)
    except (RecursionError, TypeError, msgspec.EncodeError, OverflowError, ValueError):
        return None
    if n == 1:  # one event (the most common append): the same bytes without the splitting
        if not block.startswith(_TYPE_HEAD):
            return None
        record = b"".join((_SEQ, _encoder.encode(seqs[0]), b',"ts":', ts, b",", block[1:]))
        return [record[:-1]] if as_lines else record
    rests = block.split(_TYPE_FIRST)
    if len(rests) != n or not rests[0].startswith(_TYPE_HEAD):
        return None
    rests[0] = rests[0][len(_TYPE_HEAD):]  # the first line's type, found without copying the block
    seq_texts = _encoder.encode(list(seqs))[1:-1].split(b",")
    middle = b',"ts":' + ts + b',"type":'
    if as_lines:
        rests[-1] = rests[-1][:-1]  # its newline
        return list(map(b"".join, zip(repeat(_SEQ), seq_texts, repeat(middle), rests)))
    # Four pieces a record, joined once: '{"seq":' (after a newline but the first), the
    # seq's digits, the ts and type's key, the rest of the encoded event.
    parts = [middle] * (4 * n)
    parts[0::4] = repeat(_NL_SEQ, n)
    parts[0] = _SEQ
    parts[1::4] = seq_texts
    parts[3::4] = rests
    return b"".join(parts)


def plain_size(events: Sequence[Mapping[str, Any]]) -> int | None:
    """The bytes ``msgspec`` encodes ``events`` to (as one JSON array) when the batch is
    records by construction, whatever its seqs: plain ``dict`` events with exact ``str``
    keys and a non-empty ``str`` type, no ``seq``, a finite ``ts`` if any, and only plain
    JSON values nested within the depth limit (:func:`_plain`). None when any event is
    not (:func:`encode_records` then says whether it is a record, and why not). Each
    record such an event makes is at most its own encoding plus the envelope."""
    encoded = plain_encoding(events)
    return None if encoded is None else len(encoded)


def plain_encoding(events: Sequence[Mapping[str, Any]]) -> bytes | None:
    """``events`` encoded as one JSON array when the batch is records by construction
    (see :func:`plain_size`), else None."""
    if not _DICT.issuperset(map(type, events)):
        return None
    if len(events) <= 4:  # msgspec.convert costs ~1 µs a call: a few events are checked here
        if not all(map(_fresh_without_ts, events)):
            return None  # (an event with its own ts: the exact path checks it)
    else:
        try:
            msgspec.convert(events, _FRESH)
        except (ValueError, OverflowError, TypeError):
            return None
    if not _plain(events):  # type: ignore[arg-type]
        return None
    try:
        return _encoder.encode(events)
    except (TypeError, msgspec.EncodeError, OverflowError, ValueError, RecursionError):
        return None


def _one_block(event: Mapping[str, Any], seq: int, when: float) -> bytes | None:
    """The record of a batch of one ``event`` as :func:`_encode_fast` writes it (a block:
    one line and its newline), or None when the event is not one this path takes: a plain
    ``dict`` (see :func:`_plain`) with exact ``str`` keys, a non-empty ``str`` type as its
    first member, and neither ``ts`` nor ``seq``.

    Such an event is a record by construction (see :func:`_encode_fast`); the checks are
    those of :class:`_Fresh` and :func:`_plain`, made on the one dict without building
    anything."""
    if (type(event) is not dict or type(seq) is not int or not _fresh_without_ts(event)
            or not (_SCALARS.issuperset(map(type, event.values())) or _plain([event]))):
        return None
    try:
        body = _encoder.encode(event)
    except (RecursionError, TypeError, msgspec.EncodeError, OverflowError, ValueError):
        return None  # a deep caller stack, say: the batch path encodes it with room
    if not body.startswith(_TYPE_HEAD):
        return None
    return b'{"seq":%d,"ts":%b,%b\n' % (seq, _encoder.encode(when), body[1:])


def _fresh_without_ts(event: dict[str, Any]) -> bool:
    """:class:`_FreshWithoutTs` checked on one dict in Python (cheaper than a
    ``msgspec.convert`` call for a few events): exact ``str`` keys, a non-empty ``str``
    type, neither ``ts`` nor ``seq``."""
    type_ = event.get("type")
    return (type(type_) is str and bool(type_) and "ts" not in event and "seq" not in event
            and _STR.issuperset(map(type, event)))


def _plain(events: Sequence[dict[str, Any]]) -> bool:
    """True when each member of ``events`` (depth 2 in its record) is a JSON scalar
    (exactly str, int, float, bool or None), or a dict, list or tuple of such values,
    nested at most ``MAX_DEPTH`` deep in all: what the encoder writes itself, byte by
    byte, as one compact line. False otherwise (a ``msgspec.Raw``, a subclass, any
    other type, or too deep): the caller proves such a batch another way.

    Walks the values level by level, a few C calls a level: the values of the next
    level, :func:`_members_of` all of them at once (the scalars, not containers the
    collector tracks, give none); at the last level (nothing below it) one C-level
    pass, :func:`_exact_leaves`, proves the usual case, exact scalars; otherwise are
    they all scalars (the search stops at the first container), the set of their
    types (each one of the plain types), and on to the next level."""
    values = _members_of(events)
    depth = 2  # of the values in ``values``: a container among them makes the record this deep
    while True:
        inner = _members_of(values)
        if not inner and depth <= MAX_DEPTH and _exact_leaves(values):
            return True
        if _SCALARS.issuperset(map(type, values)):  # stops at the first container: cheap either way
            return True
        kinds = set(map(type, values))
        if depth > MAX_DEPTH or not _PLAIN_KINDS.issuperset(kinds):
            return False
        values = inner
        depth += 1


def _exact_leaves(values: list[Any]) -> bool:
    """True when ``values`` (none of them holding anything the collector sees) are each
    an exact JSON scalar or an empty dict, list or tuple, in one C-level pass (cheaper
    than the type of each): ``msgspec.to_builtins`` gives back the very same object for
    each of those (an empty container an equal one), calls the hook (which refuses) for
    a subclass, a ``msgspec.Raw`` or a type it does not know, and converts every other
    type it knows (bytes, datetime, Decimal, a set, a Struct...) into an object of
    another type, which compares unequal. False also when in doubt."""
    try:
        return to_builtins(values, enc_hook=_refuse_verbatim) == values
    except (_Verbatim, TypeError, ValueError, OverflowError, RecursionError, msgspec.MsgspecError):
        return False


_PLAIN_KINDS = _SCALARS | _DICT | _SEQUENCES


def _members_of(values: Sequence[Any]) -> list[Any]:
    """Every value held by the containers among ``values``, in one C call.

    ``gc.get_referents`` asks each object the collector tracks for what it refers to:
    for a list or a tuple its items, for a dict its values (and its keys when they are not
    all strings); JSON scalars (str, int, float, bool, None) are not such objects and give
    nothing. The collector must reach every value to find cycles through it, so none is
    left out; a key that comes along is a str or another hashable scalar, which only adds
    a value to check. Twice as fast as chaining ``dict.values``."""
    return gc.get_referents(*values)


class _Verbatim(Exception):
    """A value the JSON encoder would copy verbatim (a msgspec.Raw)."""


def _refuse_verbatim(value: object) -> None:
    raise _Verbatim


def _verbatim_free(events: Sequence[Mapping[str, Any]]) -> bool:
    """True when no value in ``events`` is one the encoder copies verbatim instead of
    encoding (a ``msgspec.Raw``): one C-level walk, ``to_builtins`` handing anything it
    does not encode itself to a hook that refuses it. False also when in doubt."""
    try:
        msgspec.to_builtins(events, enc_hook=_refuse_verbatim)
    except (_Verbatim, TypeError, ValueError, OverflowError, RecursionError, msgspec.MsgspecError):
        return False
    return True


def _first_too_deep(data: bytes, n: int) -> int | None:
    """The first of the ``n`` lines of ``data`` (each one object, ending in a newline)
    nested deeper than ``MAX_DEPTH``, or None. Each line opens at least one bracket, so
    a batch with few brackets in all is decided by one count."""
    openers = data.translate(None, _NOT_OPENERS)
    if len(openers) - n - (n - 1) <= MAX_DEPTH:  # the newlines kept, one "{" per other line
        return None
    lines = None
    for i, count in enumerate(map(len, openers.split(b"\n"))):
        if count > MAX_DEPTH:
            if lines is None:
                lines = data.split(b"\n")
            if nested_deeper(lines[i]):
                return i
    return None


def _encode_each(
    events: Sequence[Mapping[str, Any]], seqs: Sequence[int], when: float, record_limit: int
) -> list[bytes]:
    lines = []
    for i, (event, seq) in enumerate(zip(events, seqs)):
        try:
            lines.append(encode_record(event, seq, when))
        except RecordError as exc:
            raise RecordError(f"event {i} of the batch: {exc.reason}") from None
    return _checked(lines, record_limit, nested=False)  # each line was read back alone



def _str_keys(event: Mapping[Any, Any]) -> bool:
    """True when every top-level key is a string (the encoder would turn 1 into "1",
    and a record with both would repeat a key: it would not decode)."""
    return _STR.issuperset(map(type, event))


def _checked(lines: list[bytes], record_limit: int, *, nested: bool) -> list[bytes]:
    """``lines`` when each reads back as a record within ``record_limit``.

    Events of strings, numbers, booleans and nulls always encode to a record. Anything
    else (containers, and values the encoder copies verbatim such as ``msgspec.Raw``) is
    proven line by line with the scanner's own rules (:func:`unreadable`)."""
    if not lines or max(map(len, lines)) > record_limit:
        for i, line in enumerate(lines):
            if len(line) > record_limit:
                raise RecordError(f"event {i} of the batch is {len(line)} bytes, over the record limit of {record_limit}")
    if nested:
        bad = unreadable(lines)
        if bad is not None:
            raise RecordError(f"event {bad[0]} of the batch does not read back as a record: {bad[1]}")
    return lines


def _checked_size(lines: list[bytes], record_limit: int) -> int:
    """The batch size of ``lines`` (each line and its newline) when each one is within
    ``record_limit``; else RecordError naming the first over it. Lines that are all
    within the limit together (the common case: a batch limit no larger than the record
    limit bounds them so) are not measured one by one."""
    size = sum(map(len, lines))
    if size > record_limit:
        _checked(lines, record_limit, nested=False)
    return size + len(lines)


def header_event(session: str) -> dict[str, Any]:
    """The ``session/start`` event that is record 1 of every session."""
    return {"type": SESSION_START, "session": session, "format": FORMAT}


# --- typed views of the core vocabulary ------------------------------------------------
# Each view names the members one kind of event carries; decoding a view skips the rest
# of the record without building it (a tool/result's output is never materialized).


class TurnView(msgspec.Struct):
    """``turn/start``, ``turn/end``."""

    turn: Any = None
    status: Any = None


class StepView(msgspec.Struct):
    """``step/start``, ``step/end``, ``assistant/message``, ``tool/call``, ``tool/result``."""

    turn: Any = None
    step: Any = None
    status: Any = None
    call_id: Any = None
    name: Any = None
    tool_calls: Any = None


class TruncatedView(msgspec.Struct):
    """``log/truncated``."""

    offset: Any = None
    dropped_bytes: Any = None
    reason: Any = None
    quarantine: Any = None


_V = TypeVar("_V", bound=msgspec.Struct)
_view_decoders: dict[type, msgspec.json.Decoder] = {}


def _view_decoder(cls: type) -> msgspec.json.Decoder:
    decoder = _view_decoders.get(cls)
    if decoder is None:
        decoder = _view_decoders[cls] = msgspec.json.Decoder(cls)
    return decoder


def view(record: Mapping[str, Any], cls: type[_V]) -> _V:
    """The typed view ``cls`` of a committed :class:`Record` or of a plain event mapping."""
    if isinstance(record, Record):
        try:
            return record.view(cls)
        except msgspec.ValidationError:
            pass
    return cls(**{name: record.get(name) for name in cls.__struct_fields__})


class ToolCallRequest(msgspec.Struct, frozen=True):
    """One entry of ``assistant/message.tool_calls``."""

    id: str
    name: str
    arguments: Any = None


def requested_calls(tool_calls: Any) -> list[ToolCallRequest]:
    """The calls an ``assistant/message``'s ``tool_calls`` asks for, in order; malformed
    entries are skipped."""
    calls = tool_calls or []
    out: list[ToolCallRequest] = []
    if not isinstance(calls, list):
        return out
    for call in calls:
        if isinstance(call, Mapping) and isinstance(call.get("id"), str):
            name = call.get("name")
            out.append(
                ToolCallRequest(
                    id=call["id"],
                    name=name if isinstance(name, str) else "",
                    arguments=call.get("arguments"),
                )
            )
    return out
