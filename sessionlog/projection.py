"""Provider views of a session: the input of the next model request, always paired.

Pure functions over records, no I/O. :func:`project` builds the request input for

- ``openai`` — OpenAI Chat Completions ``messages``: an assistant message carries
  ``tool_calls`` (``arguments`` as a JSON string), followed right away by one ``tool``
  message per call;
- ``responses`` — OpenAI Responses ``input`` items: ``message``, ``function_call``,
  ``function_call_output``;
- ``anthropic`` — Anthropic Messages ``messages``: ``tool_use`` blocks in the assistant
  message, then one ``user`` message whose content starts with every ``tool_result``
  block (``is_error`` kept);

from the one call/result pairing in :func:`sessionlog.transcript.pair_calls`: results
follow their calls in the assistant's call order (a result repair wrote at the end of the
log included), a call without a logged result gets a view-time result carrying its
recovery code (``TOOL_AWAITING_APPROVAL`` while a human decides), orphan and duplicate
results are left out, and all of them are reported in :attr:`Projection.issues`.

Call ids in a view: a call keeps its own id when it is 1 to 40 characters of
``[A-Za-z0-9_-]`` and no earlier call of the session used it; otherwise (an empty id, a
provider's other alphabet, an id reused in a later turn) the view calls it
``call_<seq>_<n>`` (its assistant message's seq and the call's position), which every
provider accepts. Earlier calls never change name when the log grows.

A ``system/message`` is where each provider expects system text: a ``system`` message
(``openai``) or a system ``message`` item (``responses``) at its place in the log, and
Anthropic's top-level ``system`` (:attr:`Projection.system`: the latest one, the
instructions in force). :func:`check_pairing` names the first pairing violation in a
list of items of any of the three formats.
"""

from __future__ import annotations

import bisect
import json
import re
import reprlib
import struct
import tempfile
from array import array
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .contract import InvalidEvent
from .events import (
    ASSISTANT_MESSAGE,
    SYSTEM_MESSAGE,
    TOOL_AWAITING_APPROVAL,
    TOOL_RESULT,
    USER_MESSAGE,
    Record,
    SessionLogError,
    requested_calls,
)
from .transcript import (
    Exchange,
    PairedCall,
    Pairing,
    PendingCall,
    PendingCalls,
    SystemEntry,
    UserEntry,
    awaiting_result,
    pair_calls,
    synthetic_result,
)

FORMATS: Final = ("openai", "responses", "anthropic")
"""The provider formats :func:`project` and :func:`check_pairing` know."""


class UnknownFormat(SessionLogError, ValueError):
    """A format name outside :data:`FORMATS`."""


VIEW_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""What a call id in a view looks like: what OpenAI Chat (at most 40 characters) and
Anthropic (``^[a-zA-Z0-9_-]+$``) both accept."""


@dataclass(slots=True)
class Projection:
    """A provider view of a session.

    ``items`` are JSON-able dicts: chat messages (``openai``), input items
    (``responses``) or Anthropic messages (``anthropic``). ``issues`` lists, one sentence
    each, what the view left out (orphan and duplicate results, repeated call ids),
    renamed (call ids) or made up (view-time results). ``call_ids`` are the requested
    calls' ids in the log, in view order, and ``view_ids`` the ids the view gives them
    (the same unless renamed). ``system`` is Anthropic's top-level system text (None
    for the other formats, which carry system messages among their items)."""

    format: str
    items: list[dict[str, Any]]
    issues: list[str] = field(default_factory=list)
    call_ids: list[str] = field(default_factory=list)
    view_ids: list[str] = field(default_factory=list)
    system: Any = None

    def to_json(self) -> dict[str, Any]:
        """The request fragment: ``{"messages": [...]}`` for ``openai`` and ``anthropic``
        (with ``"system"`` first when the session has a system message), ``{"input":
        [...]}`` for ``responses``."""
        if self.format == "responses":
            return {"input": self.items}
        if self.system is not None:
            return {"system": self.system, "messages": self.items}
        return {"messages": self.items}


@dataclass(frozen=True, slots=True)
class Violation:
    """The first place a request would be rejected for its tool pairing: ``call_id`` (None
    when the violation is not about one call), ``index`` of the offending item, and a
    sentence naming both."""

    call_id: str | None
    index: int
    message: str

    def __str__(self) -> str:
        return self.message


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UnknownFormat(f"unknown view format {fmt!r}; known: {', '.join(FORMATS)}")


# --- rendering pieces ------------------------------------------------------------------


def arguments_json(arguments: Any) -> str:
    """A call's arguments as the JSON object text OpenAI formats carry: a string that is
    one is kept as it is; anything else is :func:`arguments_object`'s object (a string
    that is not a JSON object's text, a list, a number: ``{"arguments": <it>}``), so a
    provider that takes only an object's text takes the view, and the model still reads
    what the log holds. The view names each such call (:func:`_arguments_issues`)."""
    if isinstance(arguments, str) and arguments_problem(arguments) is None:
        return arguments
    return json.dumps(arguments_object(arguments), ensure_ascii=False, separators=(",", ":"))


def arguments_problem(text: Any) -> str | None:
    """Why ``text``, a tool call's ``arguments`` as an OpenAI Chat view carries them, is not
    the text of a JSON object (what the API takes: strict JSON, no ``NaN``), or None when
    it is one. Never raises."""
    if not isinstance(text, str):
        return f"a {type(text).__name__}, not a string"
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return f"not JSON: {str(exc)[:80]}"
    if not isinstance(value, dict):
        return f"JSON {'null' if value is None else type(value).__name__}, not an object"
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _arguments_issues(seq: Any, calls: Iterable[tuple[str, Any]]) -> list[str]:
    """One sentence per call of assistant message ``seq`` ((call id, arguments)) whose
    arguments are not a JSON object, which every view carries wrapped in one."""
    issues = []
    for call_id, arguments in calls:
        if arguments is None or isinstance(arguments, Mapping):
            continue
        why = arguments_problem(arguments) if isinstance(arguments, str) else f"a JSON {_json_kind(arguments)}"
        if why is not None:
            issues.append(f"call {call_id!r} of assistant message seq {seq}: its arguments are not a JSON object "
                          f"({why}); providers take only an object, so the view carries them as "
                          '{"arguments": ...}')
    return issues


def _json_kind(value: Any) -> str:
    return {bool: "boolean", int: "number", float: "number", list: "array", str: "string"}.get(type(value), "value")


def arguments_object(arguments: Any) -> dict[str, Any]:
    """A call's arguments as the JSON object Anthropic's ``tool_use.input`` requires."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments, parse_constant=_no_constant)  # strict JSON: no NaN
        except (ValueError, RecursionError):
            return {"arguments": arguments}
        if isinstance(decoded, dict):
            return decoded
        return {"arguments": decoded}
    if arguments is None:
        return {}
    return {"arguments": arguments}


def result_text(result: Mapping[str, Any]) -> str:
    """A result's output as text. A result with a recovery ``code`` keeps the code in the
    text (the model reads only the text)."""
    output = result.get("output")
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    code = result.get("code")
    if isinstance(code, str) and code and code not in text:
        text = f"{code}: {text}"
    return text


def result_is_error(result: Mapping[str, Any]) -> bool:
    return result.get("is_error") is True


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [dict(b) if isinstance(b, Mapping) else {"type": "text", "text": str(b)} for b in content]
    return [{"type": "text", "text": json.dumps(content, ensure_ascii=False)}]


def _empty(content: Any) -> bool:
    return content is None or content == "" or content == []


def tool_message(call: PairedCall, view_id: str | None = None) -> dict[str, Any]:
    """The Chat Completions ``tool`` message for a paired call (``view_id``: its id in the view)."""
    assert call.result is not None
    return {"role": "tool", "tool_call_id": view_id or call.call_id, "content": result_text(call.result)}


def function_call_output(call: PairedCall, view_id: str | None = None) -> dict[str, Any]:
    """The Responses ``function_call_output`` item for a paired call."""
    assert call.result is not None
    return {"type": "function_call_output", "call_id": view_id or call.call_id,
            "output": result_text(call.result)}


def tool_result_block(call: PairedCall, view_id: str | None = None) -> dict[str, Any]:
    """The Anthropic ``tool_result`` block for a paired call (``is_error`` kept)."""
    assert call.result is not None
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": view_id or call.call_id,
        "content": result_text(call.result),
    }
    if result_is_error(call.result):
        block["is_error"] = True
    return block


def _system_text(content: Any) -> Any:
    if isinstance(content, (str, list)):
        return content
    return "" if content is None else json.dumps(content, ensure_ascii=False)


Entries = list[UserEntry | SystemEntry | Exchange]
ViewIds = dict[int, str]  # id(PairedCall) -> the call's id in the view


def view_ids(pairing: Pairing) -> tuple[ViewIds, list[str]]:
    """Each call's id in the views (see the module docstring) and one sentence per rename."""
    ids: ViewIds = {}
    used: set[str] = set()
    issues: list[str] = []
    for exchange in pairing.exchanges:
        for n, call in enumerate(exchange.calls):
            view_id = call.call_id
            if not VIEW_ID.fullmatch(view_id) or view_id in used:
                if not view_id:
                    why = "is empty"
                elif view_id in used:
                    why = "was used by an earlier call of this session"
                else:
                    why = "is not 1 to 40 characters of [A-Za-z0-9_-]"
                view_id = base = f"call_{exchange.seq}_{n}"
                again = 1
                while view_id in used:
                    again += 1
                    view_id = f"{base}_{again}"
                issues.append(f"call id {call.call_id!r} of assistant message seq {exchange.seq} {why}; "
                              f"the view calls it {view_id!r}")
            used.add(view_id)
            ids[id(call)] = view_id
    return ids, issues


def _openai_entry(entry: UserEntry | SystemEntry | Exchange, ids: ViewIds) -> list[dict[str, Any]]:
    if isinstance(entry, UserEntry):
        return [{"role": "user", "content": entry.content if entry.content is not None else ""}]
    if isinstance(entry, SystemEntry):
        return [{"role": "system", "content": _system_text(entry.content)}]
    if not entry.calls:
        return [] if _empty(entry.content) else [{"role": "assistant", "content": entry.content}]
    items = [{
        "role": "assistant",
        "content": None if _empty(entry.content) else entry.content,
        "tool_calls": [
            {"id": ids[id(c)], "type": "function",
             "function": {"name": c.name, "arguments": arguments_json(c.arguments)}}
            for c in entry.calls
        ],
    }]
    items.extend(tool_message(c, ids[id(c)]) for c in entry.calls)
    return items


def _responses_entry(entry: UserEntry | SystemEntry | Exchange, ids: ViewIds) -> list[dict[str, Any]]:
    if isinstance(entry, UserEntry):
        return [{"type": "message", "role": "user", "content": entry.content if entry.content is not None else ""}]
    if isinstance(entry, SystemEntry):
        return [{"type": "message", "role": "system", "content": _system_text(entry.content)}]
    items: list[dict[str, Any]] = []
    if not _empty(entry.content):
        items.append({"type": "message", "role": "assistant", "content": entry.content})
    items.extend(
        {"type": "function_call", "call_id": ids[id(c)], "name": c.name, "arguments": arguments_json(c.arguments)}
        for c in entry.calls
    )
    items.extend(function_call_output(c, ids[id(c)]) for c in entry.calls)
    return items


class _AnthropicMessages:
    """Anthropic messages built entry by entry. Consecutive messages of one role become one
    message, so the latest message stays open until a message of the other role starts:
    ``add`` returns the messages it completed, ``end`` the last one."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: dict[str, Any] | None = None

    def _start(self, message: dict[str, Any], done: list[dict[str, Any]]) -> None:
        if self.last is not None:
            done.append(self.last)
        self.last = message

    def _extend(self, role: str, blocks: list[dict[str, Any]], done: list[dict[str, Any]]) -> None:
        # The user text that follows a tool round goes after its tool_result blocks, which stay first.
        if not blocks:
            return
        if self.last is not None and self.last["role"] == role:
            self.last["content"].extend(blocks)
        else:
            self._start({"role": role, "content": blocks}, done)

    def add(self, entry: UserEntry | SystemEntry | Exchange, ids: ViewIds) -> list[dict[str, Any]]:
        done: list[dict[str, Any]] = []
        if isinstance(entry, SystemEntry):
            return done  # the top-level system text: Projection.system
        if isinstance(entry, UserEntry):
            self._extend("user", _text_blocks(entry.content), done)
            return done
        blocks = _text_blocks(entry.content)
        blocks.extend(
            {"type": "tool_use", "id": ids[id(c)], "name": c.name, "input": arguments_object(c.arguments)}
            for c in entry.calls
        )
        if entry.calls:
            # A new message, never merged into an earlier assistant message's end: the
            # tool_result blocks must open the very next user message.
            if self.last is not None and self.last["role"] == "assistant":
                self.last["content"].extend(blocks)
            else:
                self._start({"role": "assistant", "content": blocks}, done)
            self._start({"role": "user", "content": [tool_result_block(c, ids[id(c)]) for c in entry.calls]}, done)
        else:
            self._extend("assistant", blocks, done)
        return done

    def end(self) -> list[dict[str, Any]]:
        last, self.last = self.last, None
        return [] if last is None else [last]


def _openai(entries: Entries, ids: ViewIds) -> list[dict[str, Any]]:
    return [item for entry in entries for item in _openai_entry(entry, ids)]


def _responses(entries: Entries, ids: ViewIds) -> list[dict[str, Any]]:
    return [item for entry in entries for item in _responses_entry(entry, ids)]


def _anthropic(entries: Entries, ids: ViewIds) -> list[dict[str, Any]]:
    messages = _AnthropicMessages()
    items = [item for entry in entries for item in messages.add(entry, ids)]
    return items + messages.end()


_RENDER = {"openai": _openai, "responses": _responses, "anthropic": _anthropic}


def json_lines_of(document: Mapping[str, Any]) -> Iterator[Any]:
    """A view's document (``to_json``) as JSON Lines items: ``{"system": ...}`` first when
    there is one, then one item (message / input item) per line."""
    if "system" in document:
        yield {"system": document["system"]}
    yield from document.get("messages", document.get("input", []))


def project(records: Iterable[Mapping[str, Any]], fmt: str) -> Projection:
    """The ``fmt`` view (one of :data:`FORMATS`) of a session's records, paired.

    Guarantee: the items pass :func:`check_pairing` for ``fmt``; every call an
    ``assistant/message`` asked for appears exactly once, under an id unique in the view,
    with exactly one result, placed where the provider requires it, in the assistant's
    call order. A call whose ``arguments`` are not a JSON object (a string that is not
    one's text, a list) is carried as ``{"arguments": <them>}`` and named in
    :attr:`Projection.issues` (its id and its assistant message's seq). Nothing is
    written. Raises :class:`UnknownFormat` for an unknown ``fmt``."""
    _check_format(fmt)
    pairing = pair_calls(records)
    ids, renamed = view_ids(pairing)
    items = _RENDER[fmt](pairing.entries, ids)
    calls = [c for ex in pairing.exchanges for c in ex.calls]
    issues = list(pairing.issues) + renamed
    for exchange in pairing.exchanges:
        issues.extend(_arguments_issues(exchange.seq, ((c.call_id, c.arguments) for c in exchange.calls)))
    system = None
    if fmt == "anthropic":
        prompts = [e for e in pairing.entries if isinstance(e, SystemEntry)]
        if prompts:
            system = _system_text(prompts[-1].content)
            issues.extend(f"system message seq {e.seq} is replaced by the later one at seq {prompts[-1].seq} "
                          "(Anthropic takes one top-level system)" for e in prompts[:-1])
    return Projection(fmt, items, issues, [c.call_id for c in calls], [ids[id(c)] for c in calls], system)


_ENTRY = struct.Struct("<iq")  # a key's record in IdTable._keys: its length, its value, then its UTF-8


class IdTable:
    """Strings (call ids), each with an int, held compactly: every key's record (length,
    value, UTF-8) in one bytearray and an open-addressing index of offsets into it, about
    60 bytes a key where a dict of str to int takes about 150. Exact: keys are compared
    byte for byte. No removal."""

    __slots__ = ("_keys", "_index", "_mask", "_n")

    def __init__(self, size: int = 1024) -> None:
        size = 1 << max(0, size - 1).bit_length()  # a power of two
        self._keys = bytearray()
        self._mask = size - 1
        self._index = array("q", [-1]) * size  # offset of a key's record; -1: an empty slot
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def _slot(self, data: bytes, h: int) -> int:
        """The slot of ``data`` (hash ``h``), or the empty slot where it would go."""
        mask, index, keys, n = self._mask, self._index, self._keys, len(data)
        i = h & mask
        while True:
            o = index[i]
            if o < 0 or (_ENTRY.unpack_from(keys, o)[0] == n and keys[o + 12:o + 12 + n] == data):
                return i
            i = (i + 1) & mask

    def get(self, key: str, default: int | None = None) -> int | None:
        o = self._index[self._slot(key.encode("utf-8", "surrogatepass"), hash(key))]
        return default if o < 0 else _ENTRY.unpack_from(self._keys, o)[1]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._index[self._slot(key.encode("utf-8", "surrogatepass"), hash(key))] >= 0

    def __getitem__(self, key: str) -> int:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: int) -> None:
        data = key.encode("utf-8", "surrogatepass")
        h = hash(key)
        i = self._slot(data, h)
        o = self._index[i]
        if o >= 0:
            _ENTRY.pack_into(self._keys, o, len(data), value)
            return
        if (self._n + 1) * 3 > (self._mask + 1) * 2:  # at most 2/3 full
            self._grow()
            i = self._slot(data, h)
        self._index[i] = len(self._keys)
        self._keys += _ENTRY.pack(len(data), value)
        self._keys += data
        self._n += 1

    def _grow(self) -> None:
        size = (self._mask + 1) * 2
        self._mask = size - 1
        self._index = index = array("q", [-1]) * size
        keys, mask, o, end = self._keys, size - 1, 0, len(self._keys)
        while o < end:  # every record, in the order added
            n = _ENTRY.unpack_from(keys, o)[0]
            i = hash(keys[o + 12:o + 12 + n].decode("utf-8", "surrogatepass")) & mask
            while index[i] >= 0:
                i = (i + 1) & mask
            index[i] = o
            o += 12 + n


# --- streamed views --------------------------------------------------------------------
# The same view in two passes over the records, holding call ids and positions, never the
# records: the first pass runs the pairing (the one tracker) and learns which calls get a
# result from far away in the log (repair writes results at the end), which get a
# view-time result, and which calls the view renames; it writes the issues and the far
# results' text to temporary files. The second pass runs the tracker again over the same
# records and renders entry by entry: an assistant message waits only for the results
# that follow it before the next message.

_STREAM_TYPES = (USER_MESSAGE, SYSTEM_MESSAGE, ASSISTANT_MESSAGE)
_GENERATED = re.compile(r"call_(0|[1-9][0-9]*)_(0|[1-9][0-9]*)(?:_([1-9][0-9]*))?")


class _NotStreamable(Exception):
    """Seqs that are not increasing non-negative integers: the view is made in memory."""


class SessionChanged(SessionLogError):
    """The second pass of a streamed view read other records than the first."""


def _stream_envelope(record: Any, index: int) -> tuple[str, Any]:
    """A record's type and seq; InvalidEvent as :func:`pair_calls` raises it for a record
    without its envelope."""
    if isinstance(record, Record):
        return record.type, record.seq
    try:
        type_, seq, _ = record["type"], record["seq"], record["ts"]
        return type_, seq
    except (KeyError, TypeError, IndexError) as exc:
        raise InvalidEvent(f"record {index} is not a session record (a mapping with 'type', 'seq' and "
                           f"'ts'): {str(record)[:80]}") from exc


def _step_keys(tracker: PendingCalls) -> set[tuple[Any, Any]]:
    """The keys of the steps ``tracker`` holds open (as :attr:`PendingCall.step_key` spells them)."""
    return {PendingCall("", "", turn, step).step_key for turn, step in tracker.open_steps()}


class _Lines:
    """Strings written one by one to a temporary file (in memory while small), read back in order."""

    def __init__(self) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=1 << 20, mode="w+", encoding="utf-8", newline="\n")

    def add(self, text: str) -> None:
        self._file.write(json.dumps(text) + "\n")

    def __iter__(self) -> Iterator[str]:
        self._file.seek(0)
        for line in self._file:
            yield json.loads(line)

    def close(self) -> None:
        self._file.close()


class StreamedView:
    """A provider view made in two passes over the records (see :func:`stream_view`).

    ``issues()`` yields what :attr:`Projection.issues` holds, ``system`` is
    :attr:`Projection.system`, ``items()`` yields :attr:`Projection.items` one at a time
    (the second pass) and ``to_json()`` is :meth:`Projection.to_json` with the items as
    that iterator. Close it (or use it as a context manager) to remove its temporary
    files."""

    def __init__(self, read: Callable[[], Iterable[Mapping[str, Any]]], fmt: str) -> None:
        _check_format(fmt)
        self.format = fmt
        self.system: Any = None
        self._read = read
        self._memory: Projection | None = None
        self._issues = _Lines()
        self._renames = _Lines()
        self._arguments = _Lines()  # calls whose arguments are not a JSON object
        self._system_seqs: array[int] = array("q")
        # The calls the view renames, in log order: assistant message seq, call position, suffix.
        self._tape: tuple[array[int], array[int], array[int]] = (array("q"), array("q"), array("q"))
        self._view_time: dict[tuple[int, str], dict[str, Any]] = {}
        self._far: dict[tuple[int, str], tuple[int, int, bool]] = {}  # -> offset, length, is_error
        self._far_file: Any = None
        self._count = 0
        self._last_seq: int | None = None
        self._read_twice = False

    def __enter__(self) -> StreamedView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._issues.close()
        self._renames.close()
        self._arguments.close()
        if self._far_file is not None:
            self._far_file.close()

    def issues(self) -> Iterator[str]:
        if self._memory is not None:
            yield from self._memory.issues
            return
        yield from self._issues
        yield from self._renames
        yield from self._arguments
        if self.format == "anthropic" and self._system_seqs:
            last = self._system_seqs[-1]
            for seq in self._system_seqs[:-1]:
                yield (f"system message seq {seq} is replaced by the later one at seq {last} "
                       "(Anthropic takes one top-level system)")

    def to_json(self) -> dict[str, Any]:
        if self.format == "responses":
            return {"input": self.items()}
        if self.system is not None:
            return {"system": self.system, "messages": self.items()}
        return {"messages": self.items()}

    # -- pass 1 --------------------------------------------------------------------------

    def _generated(self, text: str) -> bool:
        """True when ``text`` is an id this view made up for a renamed call."""
        m = _GENERATED.fullmatch(text)
        if m is None:
            return False
        seq, n, again = int(m[1]), int(m[2]), int(m[3] or 1)
        if m[3] is not None and again < 2:
            return False  # a suffix starts at _2
        seqs, ns, agains = self._tape
        i = bisect.bisect_left(seqs, seq)
        while i < len(seqs) and seqs[i] == seq:
            if ns[i] == n and agains[i] == again:
                return True
            i += 1
        return False

    def _survey(self) -> None:
        records = self._read()
        if not isinstance(records, Iterable) or isinstance(records, (str, bytes, Mapping)):
            raise InvalidEvent(f"pair_calls takes a sequence of records, not {type(records).__name__}")
        tracker = PendingCalls()
        issues = self._issues
        # call id -> its latest call: (assistant seq << 2), or (result seq << 2) | 2 once
        # answered; | 1 once the view used the id as it is.
        seen = IdTable()
        last_assistant: int | None = None  # seq of the latest message, when it is an assistant message
        system_content: Any = None
        prev = -1
        count = 0
        for index, record in enumerate(records):
            type_, seq = _stream_envelope(record, index)
            if type(seq) is not int or seq <= prev:
                raise _NotStreamable
            prev = seq
            count += 1
            if type_ == TOOL_RESULT:
                call = tracker.feed(record)
                if call is not None:
                    state = seen[call.call_id]
                    if state & ~1 == call.assistant_seq << 2:  # the id's latest call: now answered
                        seen[call.call_id] = (seq << 2) | 2 | (state & 1)
                    if call.step is not None and call.step_key not in _step_keys(tracker):
                        issues.add(f"late result seq {seq} for call {call.call_id!r}, logged after its step "
                                   "closed, paired with its call")
                    if last_assistant != call.assistant_seq:
                        self._keep_far(call, record)
                    continue
                call_id = record.get("call_id")
                state = seen.get(call_id) if isinstance(call_id, str) else None
                if state is None:
                    issues.add(f"orphan result seq {seq} (call_id {call_id!r}): no assistant message "
                               "before it asked for that call; left out")
                else:
                    first = state >> 2 if state & 2 else None
                    issues.add(f"duplicate result seq {seq} for call {call_id!r} (first at seq {first}) left out")
                continue
            tracker.feed(record)
            if type_ == USER_MESSAGE:
                last_assistant = None
            elif type_ == SYSTEM_MESSAGE:
                last_assistant = None
                self._system_seqs.append(seq)
                if self.format == "anthropic":
                    system_content = record.get("content")
            elif type_ == ASSISTANT_MESSAGE:
                last_assistant = seq
                asked: set[str] = set()
                for req in requested_calls(record.get("tool_calls")):
                    if req.id in asked:
                        issues.add(f"assistant message seq {seq} asks for call id {req.id!r} twice; "
                                   "the repeat is left out")
                        continue
                    self._name(seq, len(asked), req.id, seen)
                    asked.add(req.id)
                    for issue in _arguments_issues(seq, [(req.id, req.arguments)]):
                        self._arguments.add(issue)
        self._count, self._last_seq = count, (prev if count else None)
        # What is still unanswered gets its view-time result.
        unanswered = tracker.unanswered()
        ambiguous = Counter(c.call_id for c in unanswered)
        open_steps = _step_keys(tracker)
        for call in unanswered:
            step_open = call.step_key in open_steps
            if call.approval == "requested":
                result = awaiting_result(call, ts=tracker.last_ts)
                issues.add(f"call {call.call_id!r} (assistant message seq {call.assistant_seq}) awaits "
                           f"approval; the view shows a {TOOL_AWAITING_APPROVAL} result (never written)")
            else:
                result = synthetic_result(call, ts=tracker.last_ts, ambiguous=ambiguous[call.call_id] > 1)
                where = "the log ends with its step open" if step_open else "its step was closed without it"
                issues.add(f"call {call.call_id!r} (assistant message seq {call.assistant_seq}) has no result: "
                           f"{where}; the view shows a {result['code']} result (the log is not rewritten)")
            self._view_time[(call.assistant_seq, call.call_id)] = result
        if self.format == "anthropic" and self._system_seqs:
            self.system = _system_text(system_content)

    def _name(self, seq: int, n: int, call_id: str, seen: IdTable) -> None:
        """Call ``n`` of assistant message ``seq``: its view id (see :func:`view_ids`), and
        the id's latest call from now on."""
        state = seen.get(call_id)
        used = state & 1 if state is not None else 0

        def taken(text: str) -> bool:
            s = seen.get(text)
            return (s is not None and s & 1 == 1) or self._generated(text)

        in_use = used == 1 or self._generated(call_id)
        if VIEW_ID.fullmatch(call_id) and not in_use:
            used = 1
        else:
            if not call_id:
                why = "is empty"
            elif in_use:
                why = "was used by an earlier call of this session"
            else:
                why = "is not 1 to 40 characters of [A-Za-z0-9_-]"
            view_id = base = f"call_{seq}_{n}"
            again = 1
            while taken(view_id):
                again += 1
                view_id = f"{base}_{again}"
            seqs, ns, agains = self._tape
            seqs.append(seq)
            ns.append(n)
            agains.append(again)
            self._renames.add(f"call id {call_id!r} of assistant message seq {seq} {why}; "
                              f"the view calls it {view_id!r}")
        seen[call_id] = (seq << 2) | used

    def _keep_far(self, call: PendingCall, record: Mapping[str, Any]) -> None:
        """Keep the text of a result logged after a later message (the second pass meets it
        after its call's message is written)."""
        if self._far_file is None:
            self._far_file = tempfile.SpooledTemporaryFile(max_size=4 << 20)
        data = result_text(record).encode("utf-8", "surrogatepass")
        offset = self._far_file.seek(0, 2)
        self._far_file.write(data)
        self._far[(call.assistant_seq, call.call_id)] = (offset, len(data), result_is_error(record))

    def _far_result(self, key: tuple[int, str]) -> dict[str, Any]:
        offset, length, is_error = self._far.pop(key)
        self._far_file.seek(offset)
        text = self._far_file.read(length).decode("utf-8", "surrogatepass")
        return {"output": text, "is_error": is_error}

    # -- pass 2 --------------------------------------------------------------------------

    def items(self) -> Iterator[dict[str, Any]]:
        """The view's items in order, made while reading the records a second time."""
        if self._memory is not None:
            yield from self._memory.items
            return
        if self._read_twice:
            raise RuntimeError("StreamedView.items() reads the records once")
        self._read_twice = True
        fmt = self.format
        messages = _AnthropicMessages() if fmt == "anthropic" else None

        def render(entry: UserEntry | SystemEntry | Exchange, ids: ViewIds) -> list[dict[str, Any]]:
            if fmt == "openai":
                return _openai_entry(entry, ids)
            if fmt == "responses":
                return _responses_entry(entry, ids)
            assert messages is not None
            return messages.add(entry, ids)

        tracker = PendingCalls()
        seqs, ns, agains = self._tape
        tape = 0
        waiting: dict[tuple[int, str], PairedCall] = {}  # calls of `held` whose result follows
        held: tuple[Exchange, ViewIds] | None = None
        count = 0
        seq: Any = None
        changed = SessionChanged("the records changed between the two passes of a streamed view")
        for record in self._read():
            if count == self._count:
                raise changed
            count += 1
            type_, seq = _stream_envelope(record, count - 1)
            if type_ == TOOL_RESULT:
                call = tracker.feed(record)
                if call is not None and waiting:
                    pair = waiting.pop((call.assistant_seq, call.call_id), None)
                    if pair is not None:
                        pair.result, pair.result_seq = record, seq
                        if not waiting:
                            assert held is not None
                            yield from render(*held)
                            held = None
                continue
            tracker.feed(record)
            if type_ not in _STREAM_TYPES:
                continue
            if waiting:
                raise changed
            if type_ == USER_MESSAGE:
                yield from render(UserEntry(seq, None, record.get("content")), {})
            elif type_ == SYSTEM_MESSAGE:
                yield from render(SystemEntry(seq, None, record.get("content")), {})
            else:
                calls: list[PairedCall] = []
                ids: ViewIds = {}
                asked: set[str] = set()
                for req in requested_calls(record.get("tool_calls")):
                    if req.id in asked:
                        continue
                    n = len(asked)
                    asked.add(req.id)
                    pair = PairedCall(req.id, req.name, req.arguments)
                    if tape < len(seqs) and seqs[tape] == seq and ns[tape] == n:
                        view_id = f"call_{seq}_{n}" if agains[tape] == 1 else f"call_{seq}_{n}_{agains[tape]}"
                        tape += 1
                    else:
                        view_id = req.id
                    ids[id(pair)] = view_id
                    key = (seq, req.id)
                    if key in self._view_time:
                        pair.result = self._view_time.pop(key)
                    elif key in self._far:
                        pair.result = self._far_result(key)
                    else:
                        waiting[key] = pair
                    calls.append(pair)
                exchange = Exchange(seq, None, None, record.get("content"), calls)
                if waiting:
                    held = (exchange, ids)
                else:
                    yield from render(exchange, ids)
        if waiting or count != self._count or (count and seq != self._last_seq):
            raise changed
        if messages is not None:
            yield from messages.end()


def stream_view(read: Callable[[], Iterable[Mapping[str, Any]]], fmt: str) -> StreamedView:
    """The ``fmt`` view of a session's records as :func:`project` makes it (the same
    items, issues and system text), made in two passes: ``read()`` is called once now
    (the pairing) and once more by :meth:`StreamedView.items` (the rendering), and must
    yield the same records both times.

    Memory: the call ids of the session (the pairing rules are about the whole
    conversation), the results logged far from their calls (repair writes its results at
    the end; their text goes to a temporary file), the calls left without a result, and
    one assistant message with the results that follow it; never the whole session.
    Records whose seqs are not increasing non-negative integers (not a log) are projected
    in memory by :func:`project`. Raises what :func:`project` raises, and
    :class:`SessionChanged` when the second pass reads other records."""
    view = StreamedView(read, fmt)
    try:
        view._survey()
    except _NotStreamable:
        view.close()
        view = StreamedView(read, fmt)
        view._memory = project(read(), fmt)
        view.system = view._memory.system
    except BaseException:
        view.close()
        raise
    return view


# --- pairing checkers ------------------------------------------------------------------


def check_pairing(
    items: Iterable[Mapping[str, Any]], fmt: str, *, server_calls: Collection[str] = ()
) -> Violation | None:
    """The first tool-pairing violation in ``items`` (``fmt`` one of :data:`FORMATS`), or
    None when every call has exactly one result where the provider requires it.

    At least as strict as each provider:

    - ``openai``: an assistant message's ``tool_calls`` (ids non-empty strings of at most
      40 characters, unique in the whole conversation; ``arguments`` a string holding a
      JSON object, as the API requires: :func:`arguments_problem`) are
      followed right away by one ``tool`` message per call; a ``tool`` message anywhere
      else is a violation.
    - ``responses``: every ``function_call`` has a non-empty ``call_id`` unique in the
      input; every ``function_call_output`` answers an earlier, still unanswered
      ``function_call``; no ``message`` item comes between a ``function_call`` and its
      output; every ``function_call`` is answered once. ``server_calls`` are call ids a
      server-side conversation already holds (a request continuing
      ``previous_response_id`` or a ``conversation`` sends only their outputs).
    - ``anthropic``: ``tool_use`` ids match ``^[a-zA-Z0-9_-]+$`` and are unique in the
      whole conversation, and the next message is a ``user`` message whose content
      starts with one ``tool_result`` per ``tool_use`` and holds no other; a
      ``tool_result`` anywhere else is a violation.

    An item that is not a JSON object is a violation in every format (it is the one
    named, wherever it is). Any JSON value anywhere else is judged, never raised on: an id
    that is not a string (or is empty) names no call, so a call or ``tool_use`` with one is
    a violation, as is a ``tool``/``function_call_output``/``tool_result`` answering one
    (the violation's ``call_id`` is then None); ``tool_calls`` that is not a list is a
    violation. A value a message quotes is shown as a bounded repr. ``items`` is read
    once, in order (any iterable: see :class:`PairingCheck` for the checker fed one item
    at a time).

    Raises :class:`UnknownFormat` for an unknown ``fmt`` (nothing else)."""
    check = PairingCheck(fmt, server_calls=server_calls)
    for item in items:
        check.feed(item)
    return check.result()


_ANTHROPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")

_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxstring, _QUOTE.maxother = 2, 60, 60
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 4
_QUOTED_MAX: Final = 80


def _q(value: Any) -> str:
    """``value`` as a violation message quotes it: its repr, at most about 80 characters
    however large or deep the value (an id string of up to 58 characters in full)."""
    try:
        text = _QUOTE.repr(value)
    except (ValueError, RecursionError):  # an int past the str conversion limit, a deep Mapping
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _QUOTED_MAX else text[:_QUOTED_MAX - 3] + "..."


def _count(values: list[Any], value: Any) -> int:
    """``values.count(value)``; a comparison too deep for the stack counts as unequal."""
    try:
        return values.count(value)
    except RecursionError:
        return 1


def _named(call_id: Any) -> str | None:
    """A violation's ``call_id``: the id when it is a string, else None (it names no call)."""
    return call_id if isinstance(call_id, str) else None


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


class _Answered:
    """The call ids a Responses input answered (strings: an id of another type answers
    nothing)."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        self.ids = IdTable()

    def __contains__(self, call_id: Any) -> bool:
        return call_id in self.ids  # IdTable: False for anything but a str

    def add(self, call_id: str) -> None:
        self.ids[call_id] = 0


class PairingCheck:
    """:func:`check_pairing` fed one item at a time: ``feed`` each item in order, then
    ``result()``. It holds the call ids seen (the rules are about the whole conversation)
    and at most three items (Anthropic's rules look at the message before and after),
    never the conversation."""

    __slots__ = ("format", "count", "_server_calls", "_first", "_nonobject", "_done", "_result",
                 "_expected", "_owner", "_used", "_open", "_answered", "_prev", "_cur")

    def __init__(self, fmt: str, *, server_calls: Collection[str] = ()) -> None:
        """Raises :class:`UnknownFormat` for an unknown ``fmt``; :meth:`feed` and
        :meth:`result` raise nothing for any item (a :class:`RuntimeError` only for a
        ``feed`` after ``result()``)."""
        _check_format(fmt)
        self.format = fmt
        self.count = 0
        # Only a string id can be a call's: anything else in server_calls is never matched.
        self._server_calls = frozenset((server_calls,) if isinstance(server_calls, str) else
                                       (c for c in server_calls if isinstance(c, str)))
        self._first: Violation | None = None  # the first violation of the format's rules
        self._nonobject: Violation | None = None  # the first item that is not an object
        self._done = False
        self._result: Violation | None = None
        self._expected: list[str] = []  # openai: call ids of the last assistant message still owed a tool message
        self._owner = -1
        self._used = IdTable()  # call id -> the message that asked for it (openai, anthropic)
        self._open: dict[str, int] = {}  # responses: call id -> index of its unanswered function_call
        self._answered = _Answered()
        self._prev: Mapping[str, Any] | None = None  # anthropic: the two latest messages
        self._cur: Mapping[str, Any] | None = None

    def feed(self, item: Any) -> None:
        """Account for the next item."""
        if self._done:
            raise RuntimeError("PairingCheck.feed after result()")
        i = self.count
        self.count += 1
        if self._nonobject is not None:
            return
        if not isinstance(item, Mapping):
            self._nonobject = Violation(None, i, f"item {i} is not an object ({type(item).__name__})")
            return
        if self._first is not None:
            return  # the first violation is known; only an item that is not an object would replace it
        if self.format == "openai":
            self._first = self._openai(i, item)
        elif self.format == "responses":
            self._first = self._responses(i, item)
        else:
            if self._cur is not None:
                self._first = self._anthropic(i - 1, self._cur, self._prev, item)
            self._prev, self._cur = self._cur, item

    def watch(self, items: Iterable[Any]) -> Iterator[Any]:
        """``items``, each fed to the check as it passes."""
        for item in items:
            self.feed(item)
            yield item

    def result(self) -> Violation | None:
        """The first violation in the items fed (None: the pairing is valid). Ends the check."""
        if not self._done:
            self._done = True
            self._result = self._nonobject or self._first or self._end()
        return self._result

    def _end(self) -> Violation | None:
        if self.format == "openai":
            expected = self._expected
            if expected:
                return Violation(expected[0], self.count, f"end of messages: call {_q(expected[0])} of assistant "
                                 f"message {self._owner} has no tool message")
        elif self.format == "responses":
            if self._open:
                call_id, index = next(iter(self._open.items()))
                return Violation(call_id, index, f"item {index}: function_call {_q(call_id)} has no "
                                 "function_call_output")
        elif self._cur is not None:
            return self._anthropic(self.count - 1, self._cur, self._prev, None)
        return None

    def _openai(self, i: int, item: Mapping[str, Any]) -> Violation | None:
        expected, used = self._expected, self._used
        role = item.get("role")
        if role == "tool":
            call_id = item.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in expected:  # a list id is never hashed
                owner = self._owner
                why = "duplicate or unrequested" if owner >= 0 else "no assistant message right before asked for it"
                return Violation(_named(call_id), i, f"message {i}: tool message for call {_q(call_id)} is {why}"
                                 + (f" (assistant message {owner})" if owner >= 0 else ""))
            expected.remove(call_id)
            if not isinstance(item.get("content"), (str, list)):
                return Violation(call_id, i, f"message {i}: tool message for call {_q(call_id)} has no content")
            return None
        if expected:
            return Violation(expected[0], i, f"message {i}: call {_q(expected[0])} of assistant message "
                             f"{self._owner} has no tool message before it")
        self._owner = -1
        if role == "assistant" and item.get("tool_calls"):
            calls = item["tool_calls"]
            if not isinstance(calls, list):
                return Violation(None, i, f"message {i}: tool_calls is not a list ({type(calls).__name__})")
            seen: set[str] = set()
            for call in calls:
                call_id = call.get("id") if isinstance(call, Mapping) else None
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(call_id, str) or not call_id:
                    return Violation(None, i, f"message {i}: a tool call without an id")
                if len(call_id) > 40:
                    return Violation(call_id, i, f"message {i}: call id {_q(call_id)} is longer than 40 characters")
                if call_id in seen:
                    return Violation(call_id, i, f"message {i}: call id {_q(call_id)} repeated")
                if call_id in used:
                    return Violation(call_id, i, f"message {i}: call id {_q(call_id)} repeated "
                                     f"(assistant message {used[call_id]} used it)")
                if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
                    return Violation(call_id, i, f"message {i}: call {_q(call_id)} arguments are not a JSON string")
                why = arguments_problem(function["arguments"])
                if why is not None:
                    return Violation(call_id, i, f"message {i}: call {_q(call_id)} arguments are not a JSON object "
                                     f"text ({why}): {_q(function['arguments'])}")
                seen.add(call_id)
                expected.append(call_id)
            for call_id in seen:
                used[call_id] = i
            self._owner = i
        return None

    def _responses(self, i: int, item: Mapping[str, Any]) -> Violation | None:
        open_calls, answered, server_calls = self._open, self._answered, self._server_calls
        kind = item.get("type")
        if kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                return Violation(None, i, f"item {i}: function_call without a call_id")
            if call_id in open_calls or call_id in answered or call_id in server_calls:
                return Violation(call_id, i, f"item {i}: function_call {_q(call_id)} repeated")
            if not isinstance(item.get("arguments"), str):
                return Violation(call_id, i, f"item {i}: function_call {_q(call_id)} arguments are not a JSON string")
            open_calls[call_id] = i
        elif kind == "message" and open_calls:
            call_id, index = next(iter(open_calls.items()))
            return Violation(call_id, i, f"item {i}: a message comes before the output of function_call "
                             f"{_q(call_id)} (item {index})")
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):  # answers no call (and is never hashed)
                return Violation(None, i, f"item {i}: function_call_output for {_q(call_id)} has no "
                                 "function_call before it")
            if call_id in open_calls:
                del open_calls[call_id]
                answered.add(call_id)
            elif call_id in server_calls and call_id not in answered:
                answered.add(call_id)
            else:
                why = "a second output" if call_id in answered else "no function_call before it"
                return Violation(call_id, i, f"item {i}: function_call_output for {_q(call_id)} has {why}")
        return None

    def _anthropic(self, i: int, message: Mapping[str, Any], prev: Mapping[str, Any] | None,
                   nxt: Mapping[str, Any] | None) -> Violation | None:
        """Message ``i``, judged with the one before it (``prev``) and after it (``nxt``).
        Ids are hashed and counted only once they are known to be strings: a result's id of
        any other type answers no ``tool_use``."""
        used = self._used
        role = message.get("role")
        blocks = _blocks(message)
        if role == "assistant":
            uses = [b.get("id") for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_use"]
            if not uses:
                return None
            for use in uses:
                if not isinstance(use, str) or not _ANTHROPIC_ID.fullmatch(use):
                    return Violation(_named(use), i,
                                     f"message {i}: tool_use id {_q(use)} does not match ^[a-zA-Z0-9_-]+$")
            counts = Counter(uses)
            if len(counts) != len(uses):
                dup = next(u for u in uses if counts[u] > 1)
                return Violation(dup, i, f"message {i}: tool_use id {_q(dup)} repeated")
            for use in uses:
                if use in used:
                    return Violation(use, i, f"message {i}: tool_use id {_q(use)} repeated "
                                     f"(message {used[use]} used it)")
                used[use] = i
            if nxt is None or nxt.get("role") != "user":
                return Violation(uses[0], i, f"message {i}: tool_use {_q(uses[0])} is not followed by a user "
                                 "message with its tool_result")
            following = _blocks(nxt)
            lead = []
            for b in following:
                if not (isinstance(b, Mapping) and b.get("type") == "tool_result"):
                    break
                lead.append(b.get("tool_use_id"))
            rest = [b.get("tool_use_id") for b in following[len(lead):]
                    if isinstance(b, Mapping) and b.get("type") == "tool_result"]
            if rest:
                return Violation(_named(rest[0]), i + 1, f"message {i + 1}: tool_result for {_q(rest[0])} does not "
                                 "come before the other content")
            answered = Counter(res for res in lead if isinstance(res, str))
            for use in uses:
                if use not in answered:
                    return Violation(use, i + 1, f"message {i + 1}: no tool_result for tool_use {_q(use)} of "
                                     f"message {i}")
            for res in lead:
                if not isinstance(res, str):  # never equal to a tool_use id: not asked for
                    why = "repeated" if _count(lead, res) > 1 else f", which message {i} did not ask for"
                    return Violation(None, i + 1, f"message {i + 1}: tool_result for {_q(res)}"
                                     f"{' ' if why == 'repeated' else ''}{why}")
                if answered[res] > 1:
                    return Violation(res, i + 1, f"message {i + 1}: tool_result for {_q(res)} repeated")
                if res not in counts:
                    return Violation(res, i + 1, f"message {i + 1}: tool_result for {_q(res)}, which message {i} "
                                     "did not ask for")
        elif role == "user":
            asked = {b.get("id") for b in (_blocks(prev) if prev is not None and prev.get("role") == "assistant"
                                            else []) if isinstance(b, Mapping) and b.get("type") == "tool_use"
                     and isinstance(b.get("id"), str)}
            for b in blocks:
                if not (isinstance(b, Mapping) and b.get("type") == "tool_result"):
                    continue
                rid = b.get("tool_use_id")
                if not isinstance(rid, str) or rid not in asked:
                    return Violation(_named(rid), i, f"message {i}: tool_result for {_q(rid)} answers no tool_use "
                                     "in the message before it")
        return None
