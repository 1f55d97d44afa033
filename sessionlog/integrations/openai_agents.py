"""OpenAI Agents SDK: a ``Session`` that keeps the call when a run dies inside a tool.

::

    from sessionlog.integrations.openai_agents import SessionLogSession
    session = SessionLogSession("conv-1", store="jsonl:/var/lib/agent/sessions")
    result = await Runner.run(agent, "deploy 1.2.3", session=session, hooks=session.run_hooks())

:class:`SessionLogSession` implements the SDK's ``Session`` protocol over any sessionlog
store. Every item the Runner adds is kept in a record and comes back from
``get_items()`` equal as a dict, in order. The items are also written in sessionlog's own
vocabulary, so ``sessionlog scan``, ``repair`` and ``show`` understand the conversation:

- a user message item is a ``user/message`` (``content``: its text; ``item``: the SDK item);
- a model response (its reasoning, message and call items) is a ``step/start`` and an
  ``assistant/message`` (``tool_calls``: its calls; ``items``: the SDK items);
- a call's output item is a ``tool/result`` (``output``: its text; ``item``: the SDK item),
  and ``step/end`` closes the step once every call of the response has its output;
- any other item is an ``agents/item``; ``pop_item`` and ``clear_session`` append
  ``agents/pop`` and ``agents/clear``: nothing is ever deleted.

A text is written once per record: where ``content``, ``output`` or a call's ``arguments``
hold an item's text, the carried item holds null in its place and ``item_text`` says where
the record holds it (see "a text written once" below). A record is then about as large as
the JSON of the items it carries (one item; a response's items; with the run hooks, the
items of the ``add_items`` that settles them), which must be within the store's record
limit (1 MiB by default); the records of one ``add_items`` must be within its batch limit
(1 MiB by default): an ``add_items`` is one atomic append and is never split. Anything
larger is refused with :class:`sessionlog.InvalidEvent` naming the item, its size and the
limit, and nothing of that ``add_items`` is written.

The Runner saves a turn's response and its tool outputs in one ``add_items`` *after* the
tools ran. :meth:`SessionLogSession.run_hooks` closes that window: the response is recorded
when it arrives (``on_llm_end``), each call's ``tool/call`` is durable before its body runs
(``on_tool_start``) and its output when it returns (``on_tool_end``); each model request
gets ``llm/request`` (the results it carries) and ``llm/response``, which is what
:func:`sessionlog.pending_deliveries` reads. The response and output records are
provisional: the turn's own ``add_items`` settles them (one ``agents/items`` record that
replaces them, so nothing is doubled), and a tool hook for a call the log already holds
(one that arrives after the ``add_items`` that saved the call, or twice) writes nothing.
Only function and custom tools' outputs are recorded by ``on_tool_end``: the hooks of a
computer, shell, local shell or apply-patch tool are not told which call they are for, so
their outputs are written by the ``add_items`` alone, once. After a crash the session's
next open repairs the log once (sessionlog's repair: ``TOOL_OUTCOME_UNKNOWN`` for a call
that started, including such a tool that returned before the Runner saved the turn;
``TOOL_NOT_STARTED`` for one that did not) and ``get_items()`` returns every call with
exactly one output after it, in the shape the Responses API takes for the call's type (see
"a repaired call's output" below): the repair's text as the output of a function, custom or
local shell call; in ``stderr`` of a shell call (outcome ``timeout`` for
TOOL_OUTCOME_UNKNOWN, exit 1 for TOOL_NOT_STARTED); as the ``output`` of an apply-patch
call with ``status`` ``failed``. A computer call's output must be a screenshot: it gets a
1x1 placeholder image, and a developer message after the step's outputs holds the text.
The log keeps the repair's ``tool/result`` (its ``code`` and text) as written; these items
are a view of it.

A response whose calls the Runner saves without their outputs paused the run for a human
(approval): the calls get ``tool/approval`` ``requested``; ``approved`` is recorded when the
tool then starts, ``rejected`` when the Runner saves an output for it that no tool produced.
A run without ``session=`` (server-managed conversation state, which the SDK does not
combine with a Session) records its pause with :meth:`SessionLogSession.record_pause`.

The session owns its sessionlog session (one writer) from its first use until
:meth:`SessionLogSession.close`. Install with ``pip install 'sessionlog[agents]'``.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

import sessionlog
from sessionlog.events import Record, RecordError
from sessionlog.extras import require

require("agents", extra="agents", purpose="sessionlog.integrations.openai_agents")

from agents.items import ItemHelpers, ModelResponse, TResponseInputItem  # noqa: E402
from agents.lifecycle import RunHooks  # noqa: E402
from agents.memory import SessionSettings  # noqa: E402
from agents.run_context import RunContextWrapper  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = ["SessionLogSession", "SessionLogRunHooks", "Conversation"]

# Record types this adapter adds to the core vocabulary (kept verbatim by the engine).
AGENTS_ITEM = "agents/item"
"""An SDK item the transcript does not model (a system message, a handoff, a hosted tool)."""
AGENTS_ITEMS = "agents/items"
"""The items of one ``add_items`` that settles records the run hooks wrote first."""
AGENTS_POP = "agents/pop"
"""``pop_item``: the latest item is no longer part of the conversation."""
AGENTS_CLEAR = "agents/clear"
"""``clear_session``: no earlier item is part of the conversation."""

_CALL_OUTPUT_TYPES: dict[str, str] = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
}
_OUTPUT_TYPES = frozenset(_CALL_OUTPUT_TYPES.values())
_MODEL_ITEM_TYPES = frozenset({*_CALL_OUTPUT_TYPES, "reasoning"})

_encode = msgspec.json.encode
_decode = msgspec.json.decode


def _copy_items(items: Sequence[Any]) -> list[Any]:
    """A detached JSON copy of ``items`` (what a record will hold), or InvalidEvent."""
    try:
        return _decode(_encode(items if type(items) is list else list(items)))
    except (msgspec.EncodeError, TypeError, ValueError) as exc:
        raise sessionlog.InvalidEvent(f"session items are not JSON: {exc}") from exc


# --- what an SDK item is, for the transcript -------------------------------------------


def _is_map(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)  # items are dicts: no ABC check


def _kind(item: Any) -> str:
    """``user``, ``model`` (part of a model response), ``output`` (a call's output) or
    ``other``."""
    if not _is_map(item):
        return "other"
    type_ = item.get("type")
    if type_ is not None and not isinstance(type_, str):
        return "other"  # no type we know (and a list cannot be looked up in a set)
    if type_ in _OUTPUT_TYPES:
        return "output"
    if type_ in _MODEL_ITEM_TYPES:
        return "model"
    if type_ is None or type_ == "message":
        role = item.get("role")
        if role == "assistant":
            return "model"
        if role == "user":
            return "user"
    return "other"


def _add_kind(item: Any) -> str:
    """:func:`_kind` of an item of a copied batch (plain JSON values), telling a model
    item that is a call (``call``: its call id a string) from the rest of a response."""
    if type(item) is not dict:
        return "other"
    type_ = item.get("type")
    if type_ is None or type_ == "message":
        role = item.get("role")
        return "model" if role == "assistant" else "user" if role == "user" else "other"
    if type(type_) is not str:
        return "other"
    if type_ in _OUTPUT_TYPES:
        return "output"
    if type_ in _CALL_OUTPUT_TYPES:
        return "call" if type(item.get("call_id")) is str else "model"
    return "model" if type_ == "reasoning" else "other"


def _call_id(item: Any) -> str | None:
    if not _is_map(item):
        return None
    call_id = item.get("call_id")
    return call_id if type(call_id) is str or isinstance(call_id, str) else None


def _is_call(item: Any) -> bool:
    if not _is_map(item):
        return False
    type_ = item.get("type")
    return isinstance(type_, str) and type_ in _CALL_OUTPUT_TYPES and _call_id(item) is not None


def _text(content: Any) -> str:
    """The text of a message's content (its text parts joined), else its JSON."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if type(part) is dict or _is_map(part):
                text = part.get("text")
                if not isinstance(text, str):
                    text = part.get("refusal")
                if isinstance(text, str):
                    texts.append(text)
        if texts:
            return "".join(texts)
    return json.dumps(content, ensure_ascii=False)


def _arguments(item: Mapping[str, Any]) -> dict[str, Any]:
    raw = item.get("arguments", item.get("input"))
    if isinstance(raw, str):
        try:
            decoded = _decode(raw)  # standard JSON: what json.loads gives, faster
        except msgspec.DecodeError:
            try:
                # What else json.loads takes, but NaN, Infinity or 1e999: a record cannot
                # hold them (JSON has no such number), so such arguments stay one string.
                decoded = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
            except ValueError:
                return {"arguments": raw}
        return decoded if isinstance(decoded, dict) else {"arguments": decoded}
    return raw if isinstance(raw, dict) else ({} if raw is None else {"arguments": raw})


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is not a finite number")
    return number


def _identity(item: Any) -> str:
    """What makes two versions of an item the same item (call/output: type and call id)."""
    if _is_map(item):
        call_id = _call_id(item)
        type_ = item.get("type")
        if call_id is not None and isinstance(type_, str) and (type_ in _CALL_OUTPUT_TYPES or type_ in _OUTPUT_TYPES):
            return f"{type_}:{call_id}"
        item_id = item.get("id")
        if isinstance(item_id, str):
            return f"{type_}#{item_id}"
    return _encode(item).decode()


# --- the conversation a log holds (pure) ------------------------------------------------


@dataclass(slots=True)
class _Call:
    call_id: str
    name: str
    output_type: str
    started: bool = False  # a tool/call record exists
    answered: bool = False  # a tool/result record exists
    awaiting: bool = False  # its latest tool/approval is "requested"


@dataclass(slots=True)
class _Step:
    turn: str
    step: int
    first_index: int  # where its items start in the conversation
    calls: dict[str, _Call] = field(default_factory=dict)

    def unanswered(self) -> list[_Call]:
        return [c for c in self.calls.values() if not c.answered]

    def all_answered(self) -> bool:
        return all(c.answered for c in self.calls.values())

    def copy(self) -> _Step:
        return _Step(self.turn, self.step, self.first_index,
                     {k: _Call(c.call_id, c.name, c.output_type, c.started, c.answered, c.awaiting)
                      for k, c in self.calls.items()})


class Conversation:
    """The SDK items and the open step a session's records describe. Pure: feed it every
    record in order (committed :class:`~sessionlog.Record` objects or dicts with ``seq``
    and ``type``); :attr:`items` is what ``get_items()`` returns.

    ``partial=True``: only the log's latest records are fed. :attr:`items` are then the
    conversation's latest items, and :attr:`sufficient` says whether the state equals what
    a whole replay gives: the records reach back to a user message (a turn starts afresh
    there), hold the latest assistant message, and nothing fed refers to a record before
    them."""

    def __init__(self, *, partial: bool = False) -> None:
        self.partial = partial
        self._anchored = False  # partial: a user message was fed
        self._answered = False  # partial: an assistant message was fed (so the latest one)
        self._dangling = False  # partial: something fed refers to an earlier record
        self.items: list[Any] = []
        self.turns = 0
        self.step_number = 0
        self.open_step: _Step | None = None
        self.provisional_from: int | None = None  # index of the first unsettled hook item
        self.provisional_seq: int | None = None  # seq of the record that holds it
        self.last_seq = 0
        self.latest_calls: dict[str, _Call] = {}  # the latest assistant message's calls
        self.request: str | None = None  # an llm/request without its llm/response yet
        self._notes_at: int | None = None  # index of the notes that end a run of repair results

    @property
    def turn(self) -> str:
        return f"t{self.turns}"

    def feed(self, record: Mapping[str, Any], seq: int | None = None) -> None:
        """Account for ``record`` (its ``seq``, or ``seq`` for an event just appended)."""
        type_ = record["type"]
        if seq is None:
            seq = record["seq"]
        self.last_seq = seq
        if self._notes_at is not None and not (type_ == "tool/result" and record.get("synthetic")
                                               and "item" not in record):
            self._notes_at = None  # the repair's run of results ended: its notes stay where they are
        if type_ == "user/message":
            label = record.get("turn")
            number = label[1:] if isinstance(label, str) and label.startswith("t") else ""
            if number.isdigit():
                self.turns = int(number)
                self._anchored = True
            else:
                self.turns += 1
                self._dangling |= self.partial
            self.step_number = 0
            if "item" in record:
                self._add(record)
        elif type_ == "step/start":
            step = record.get("step")
            self.step_number = step if isinstance(step, int) else self.step_number + 1
            self.open_step = _Step(self.turn, self.step_number, len(self.items))
        elif type_ == "assistant/message":
            self._answered = True
            items = record.get("items")
            tool_calls = record.get("tool_calls")
            step = self.open_step
            if step is None or step.calls:
                step = self.open_step = _Step(self.turn, self.step_number, len(self.items))
            if isinstance(items, list):
                if "item_text" in record:
                    items = _restored(record, items)  # the texts the record holds once
                types = {_call_id(i): _CALL_OUTPUT_TYPES[i["type"]] for i in items if _is_call(i)} if tool_calls else {}
                if record.get("provisional"):
                    self._note_provisional(seq)
                self.items.extend(items)
            else:
                types = {}
            calls = step.calls
            for req in tool_calls or ():
                if _is_map(req):
                    call_id = req.get("id")
                    if isinstance(call_id, str) and call_id not in calls:
                        calls[call_id] = _Call(call_id, str(req.get("name") or ""),
                                               types.get(call_id, "function_call_output"))
            self.latest_calls = calls
        elif type_ == "tool/call":
            call = self._call(record)
            if call is not None:
                call.started = True
        elif type_ == "tool/approval":
            call = self._call(record)
            if call is not None:
                call.awaiting = record.get("state") == "requested"
        elif type_ == "tool/result":
            call = self._call(record)
            if call is not None:
                call.answered = True
                call.awaiting = False
            if "item" in record:
                self._add(record)
            elif record.get("synthetic") and not self._has_output(record.get("call_id")):
                self._dangling |= self.partial and call is None
                # sessionlog's repair answered the call: the SDK's output item for it, and
                # for a computer call the note that carries its text. Notes follow the
                # step's last output, so no item comes between a call and its output.
                output, note = _recovered_output(call.output_type if call is not None else "function_call_output",
                                                 record.get("call_id"), record.get("output"), record.get("code"))
                if self._notes_at is None:
                    self.items.append(output)
                else:
                    self.items.insert(self._notes_at, output)
                    self._notes_at += 1
                if note is not None:
                    if self._notes_at is None:
                        self._notes_at = len(self.items)
                    self.items.append(note)
        elif type_ == "step/end":
            self.open_step = None
            self.provisional_from = self.provisional_seq = None
        elif type_ == AGENTS_ITEM:
            if "item" in record:
                self._add(record)
        elif type_ == AGENTS_ITEMS:
            replaces = record.get("replaces_from")
            if replaces is not None and self.provisional_from is not None:
                del self.items[self.provisional_from:]
            if replaces is not None and replaces != self.provisional_seq:
                self._dangling |= self.partial  # it replaces items from before these records
            self.provisional_from = self.provisional_seq = None
            self.items.extend(record.get("items") or ())
        elif type_ == AGENTS_POP:
            if self.items:
                self.items.pop()
            else:
                self._dangling |= self.partial
            if self.provisional_from is not None and self.provisional_from > len(self.items):
                self.provisional_from = len(self.items)
        elif type_ == "llm/request":
            self.request = record.get("request")
        elif type_ == "llm/response":
            self.request = None
        elif type_ == AGENTS_CLEAR:
            self.items = []
            if self.open_step is not None:
                self.open_step.first_index = 0
            self.provisional_from = self.provisional_seq = None

    def _add(self, record: Mapping[str, Any]) -> None:
        """Add the ``item`` of ``record`` (which has one)."""
        if record.get("provisional"):
            self._note_provisional(self.last_seq)
        item = record["item"]
        if "item_text" in record:
            item = _restored(record, item)  # the text the record holds once
        self.items.append(item)

    def _note_provisional(self, seq: int) -> None:
        """A provisional record (``seq``) adds items from here on."""
        if self.provisional_from is None:
            self.provisional_from = len(self.items)
            self.provisional_seq = seq

    def _call(self, record: Mapping[str, Any]) -> _Call | None:
        call_id = record.get("call_id")
        if self.open_step is None or not isinstance(call_id, str):
            return None
        return self.open_step.calls.get(call_id)

    def _has_output(self, call_id: Any) -> bool:
        start = self.open_step.first_index if self.open_step is not None else 0
        return any(
            _is_map(i) and i.get("type") in _OUTPUT_TYPES and i.get("call_id") == call_id
            for i in self.items[start:]
        )

    @property
    def sufficient(self) -> bool:
        """True when this replay's state is a whole replay's (always, unless partial)."""
        return not self.partial or (self._anchored and self._answered and not self._dangling)

    @property
    def suspended(self) -> bool:
        """The open step waits only for calls a human is deciding on."""
        step = self.open_step
        if step is None:
            return False
        unanswered = step.unanswered()
        return bool(unanswered) and all(c.awaiting for c in unanswered)

    @property
    def needs_repair(self) -> bool:
        """A step is open that no live run can be finishing: the writer died in it."""
        return self.open_step is not None and not self.suspended

    # -- planning the records of an operation (nothing is changed here) ------------------

    def plan_add(self, batch: list[Any], *, hooks: bool) -> list[dict[str, Any]]:
        """The records that add ``batch`` (already copied) to the conversation."""
        return _AddPlan(self, batch, hooks=hooks).events

    def settle(self, plan: _AddPlan, last_seq: int) -> None:
        """Account for the records of ``plan`` (made from this state, appended, the last
        one at ``last_seq``): the state feeding them one by one gives, taken from the plan."""
        if not plan.carry and self.provisional_from is not None:
            del self.items[self.provisional_from:]  # the agents/items record replaces them
        if plan.settles:
            self.provisional_from = self.provisional_seq = None
        self.items.extend(plan.batch)
        self.last_seq = last_seq
        self._notes_at = None  # an add writes no repair results
        self.turns, self.step_number = plan.turns, plan.step_number
        if plan.copy is not None and self.latest_calls is plan.copied.calls:  # type: ignore[union-attr]
            self.latest_calls = plan.copy.calls
        if plan.latest is not None:
            self.latest_calls = plan.latest
        self.open_step = plan.step
        self._anchored |= plan.users
        self._answered |= plan.responses

    def plan_request(self, input_items: list[Any]) -> list[dict[str, Any]]:
        """Records for a model request about to be sent with ``input_items``: the outputs
        it carries that the transcript does not have yet (a locally produced error for an
        unknown tool, when no session saved it), then ``llm/request`` naming the latest
        assistant message's results it carries (what sessionlog's delivery tracking reads)."""
        events: list[dict[str, Any]] = []
        carried: list[str] = []
        step = self.open_step
        for item in input_items:
            call_id = _call_id(item)
            call = self.latest_calls.get(call_id) if _kind(item) == "output" and call_id else None
            if call is None or call.call_id in carried:
                continue
            carried.append(call.call_id)
            if not call.answered and step is not None and call.call_id in step.calls:
                events.append({"type": "tool/result", "turn": step.turn, "step": step.step,
                               "call_id": call.call_id, "name": call.name, "output": _output_text(item),
                               "is_error": False})
        if step is not None and step.calls and len(events) == len(step.unanswered()):
            # Every call of the open step is answered and the Runner moved on.
            events.append({"type": "step/end", "turn": step.turn, "step": step.step, "status": "completed"})
        request = f"r{self.last_seq + len(events) + 1}"
        events.append({"type": "llm/request", "turn": self.turn, "request": request, "results": carried})
        return events

    def plan_pause(self, outputs: list[Any], awaiting: list[str]) -> list[dict[str, Any]]:
        """Records for a run that returned interruptions: the outputs it produced that the
        transcript lacks, and ``tool/approval`` ``requested`` for the calls it paused on."""
        step = self.open_step
        if step is None:
            return []
        events: list[dict[str, Any]] = []
        for item in outputs:
            call = step.calls.get(_call_id(item) or "")
            if call is not None and not call.answered and all(e.get("call_id") != call.call_id for e in events):
                events.append({"type": "tool/result", "turn": step.turn, "step": step.step,
                               "call_id": call.call_id, "name": call.name, "output": _output_text(item),
                               "is_error": False})
        for call_id in awaiting:
            call = step.calls.get(call_id)
            if call is not None and not (call.answered or call.started or call.awaiting):
                events.append({"type": "tool/approval", "turn": step.turn, "step": step.step,
                               "call_id": call_id, "state": "requested"})
        return events

    def plan_response(self, items: list[Any], response_id: str | None = None) -> list[dict[str, Any]]:
        """Records for a model response the run hooks saw (before its tools run):
        ``llm/response`` for the pending request, and the response's calls as a new step."""
        events: list[dict[str, Any]] = []
        if self.request is not None:
            event: dict[str, Any] = {"type": "llm/response", "turn": self.turn, "request": self.request}
            if response_id is not None:
                event["response_id"] = response_id
            events.append(event)
        calls = [i for i in items if _is_call(i)]
        if calls:
            events += self._plan_step(items, calls)
        return events

    def _plan_step(self, items: list[Any], calls: list[Any]) -> list[dict[str, Any]]:
        events = self._close_answered_step()
        step = self.step_number + 1
        events.append({"type": "step/start", "turn": self.turn, "step": step})
        events.append(_assistant_message(self.turn, step, items, calls, carry=True, provisional=True))
        return events

    def plan_tool_start(self, call_id: str, name: str, call_item: Any) -> list[dict[str, Any]]:
        """Records for a function or custom tool about to run call ``call_id``: its
        ``tool/call``; nothing for a call the log has started already, or holds outside the
        open step: a hook that arrives after the Runner saved the call (its ``add_items``
        closed the step), or twice, would otherwise record the call again as a step of its
        own, and its output again with it (``on_tool_end`` answers that step)."""
        call = self._call({"call_id": call_id})
        events: list[dict[str, Any]] = []
        if call is None:
            if self._holds_call(call_id):
                return []
            # A call the hooks did not see the response of: record it as its own step.
            items = [call_item] if call_item is not None else [
                {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}
            ]
            events = self._plan_step(items, items)
            step = self.step_number + 1
        else:
            if call.started:
                return []
            step = self.open_step.step  # type: ignore[union-attr]
            if call.awaiting:
                events.append({"type": "tool/approval", "turn": self.turn, "step": step,
                               "call_id": call_id, "state": "approved"})
        events.append({"type": "tool/call", "turn": self.turn, "step": step, "call_id": call_id, "name": name})
        return events

    def _holds_call(self, call_id: str) -> bool:
        """The conversation holds a call ``call_id`` outside the open step (the latest
        response's, or an earlier one's). Only asked for a call the open step lacks."""
        return call_id in self.latest_calls or any(_call_id(i) == call_id and _is_call(i) for i in self.items)

    def plan_local_tool_start(self, call_type: str, executed: set[str] | None) -> list[dict[str, Any]]:
        """Records for a computer, shell, local shell or apply-patch tool about to run one of
        the open step's calls of ``call_type``. The hook does not say which: the calls the
        Runner marked executed (``executed``, from its run context) that are not started
        yet; when that is unknown or names none of them, every such call not started yet
        (a call recorded as started that did not start is answered TOOL_OUTCOME_UNKNOWN
        after a crash, never the reverse)."""
        step = self.open_step
        if step is None:
            return []
        output_type = _CALL_OUTPUT_TYPES[call_type]
        waiting = [c for c in step.calls.values() if c.output_type == output_type and not c.started and not c.answered]
        chosen = [c for c in waiting if executed is not None and c.call_id in executed] or waiting
        events: list[dict[str, Any]] = []
        for call in chosen:
            if call.awaiting:
                events.append({"type": "tool/approval", "turn": self.turn, "step": step.step,
                               "call_id": call.call_id, "state": "approved"})
            events.append({"type": "tool/call", "turn": self.turn, "step": step.step, "call_id": call.call_id,
                           "name": call.name})
        return events

    def output_type_of(self, call_id: str) -> str:
        """The output item type the open step's call ``call_id`` asks for."""
        call = self._call({"call_id": call_id})
        return call.output_type if call is not None else "function_call_output"

    def plan_tool_end(self, call_id: str, name: str, item: Any) -> list[dict[str, Any]]:
        call = self._call({"call_id": call_id})
        if call is None or call.answered:
            return []
        event = {"type": "tool/result", "turn": self.turn, "step": self.open_step.step,  # type: ignore[union-attr]
                 "call_id": call_id, "name": name, "output": _output_text(item), "is_error": False}
        _carry(event, item, "output")
        event["provisional"] = True
        return [event]

    def _close_answered_step(self) -> list[dict[str, Any]]:
        step = self.open_step
        if step is not None and not step.unanswered():
            return [{"type": "step/end", "turn": step.turn, "step": step.step, "status": "completed"}]
        return []


# The local tools whose hooks get the run context, not a ToolContext: the call item type
# each runs, by class name (no import of classes an SDK version may not have).
_LOCAL_TOOL_CALLS = {
    "ComputerTool": "computer_call",
    "LocalShellTool": "local_shell_call",
    "ShellTool": "shell_call",
    "ApplyPatchTool": "apply_patch_call",
}


def _local_call_type(tool: Any) -> str | None:
    for cls in type(tool).__mro__:
        call_type = _LOCAL_TOOL_CALLS.get(cls.__name__)
        if call_type is not None:
            return call_type
    return None


def _executed_call_ids(context: Any) -> set[str] | None:
    """The call ids the Runner marked executed in ``context`` (it does so just before the
    tool's hooks), or None where this SDK version does not keep them (a private record:
    read defensively, never required)."""
    invocations = getattr(context, "_tool_invocations", None)
    if not isinstance(invocations, Mapping):
        return None
    try:
        return {call_id for call_id, record in invocations.items()
                if isinstance(call_id, str) and getattr(record, "executed", False) is True}
    except Exception:  # pragma: no cover - a changed private structure
        return None


def _as_item(value: Any) -> Any:
    """An SDK object (a pydantic model) as the dict the Runner would save."""
    dump = getattr(value, "model_dump", None)
    return dump(exclude_unset=True) if callable(dump) else value


def _output_text(item: Mapping[str, Any]) -> str:
    output = item.get("output")
    return output if isinstance(output, str) else _text(output)


# --- a repaired call's output, in the shape the Responses API takes ----------------------
#
# sessionlog's repair answers a call that has no result with a synthetic ``tool/result``:
# its ``code`` (TOOL_OUTCOME_UNKNOWN: a durable ``tool/call`` exists; TOOL_NOT_STARTED: it
# does not) and its text. The log keeps that record as written; this is its SDK item, in
# the shape the call's output type has in the openai package's input item params
# (openai/types/responses/response_input_item_param.py):
#
# - ``function_call_output``, ``custom_tool_call_output``, ``local_shell_call_output``: a
#   string ``output``, the text;
# - ``shell_call_output``: ``output`` is a list of ``{stdout, stderr, outcome}`` and an
#   outcome is ``{"type": "exit", "exit_code"}`` or ``{"type": "timeout"}``
#   (response_function_shell_call_output_content_param.py), with no "unknown": one entry,
#   the text in ``stderr``, ``stdout`` empty;
# - ``apply_patch_call_output``: ``status`` ``"completed"`` or ``"failed"`` (required) and an
#   optional ``output`` string: ``failed`` with the text;
# - ``computer_call_output``: ``output`` is a screenshot (``{"type": "computer_screenshot",
#   "image_url" | "file_id"}``) and the item has no member for text: a 1x1 placeholder
#   image, and the text (which says the image is a placeholder) in a developer message
#   after the step's last output, where it comes between no call and its output. The item
#   alone is the same for both codes; the message tells them apart. Leaving the call out
#   instead would hide from the model that it acted, which is what a repair is to prevent.
#
# ``local_shell_call_output`` keeps the SDK's own shape, ``call_id`` (the installed types
# name that member ``id``; the SDK sends ``call_id`` for every local shell output).

_PLACEHOLDER_SCREENSHOT = (
    # A valid PNG of one black pixel (1x1, 8-bit grayscale): no screen was captured.
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR42mNgAAAAAgAB5Sfe/AAAAABJRU5ErkJggg=="
)


def _recovered_output(output_type: str, call_id: Any, text: Any, code: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The SDK output item of ``output_type`` for a call sessionlog's repair answered
    with ``text`` and ``code``, and the message that carries the text where the item has
    no room for it (a computer call's), else None. A code other than TOOL_NOT_STARTED is
    taken as TOOL_OUTCOME_UNKNOWN, the cautious reading."""
    if output_type not in ("shell_call_output", "apply_patch_call_output", "computer_call_output"):
        return {"type": output_type, "call_id": call_id, "output": text}, None
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False)
    not_started = code == sessionlog.TOOL_NOT_STARTED
    if output_type == "shell_call_output":
        # No outcome says "not known". An exit code says the commands finished, and a
        # failing one invites a retry: for a call that may have run, a timeout (started, cut
        # off, its effects unknown) misleads least. A call that never ran gets exit 1 with
        # the text in stderr, what the SDK itself answers for a shell call a human rejected.
        outcome = {"type": "exit", "exit_code": 1} if not_started else {"type": "timeout"}
        return {"type": output_type, "call_id": call_id,
                "output": [{"stdout": "", "stderr": text, "outcome": outcome}]}, None
    if output_type == "apply_patch_call_output":
        # "failed" for both: the patch was not (known to be) applied; the text says which.
        return {"type": output_type, "call_id": call_id, "status": "failed", "output": text}, None
    note = (f"{text} The computer_call_output of call {call_id} holds a 1x1 placeholder image, not a "
            "screenshot: take a screenshot before acting on the screen.")
    return ({"type": output_type, "call_id": call_id,
             "output": {"type": "computer_screenshot", "image_url": _PLACEHOLDER_SCREENSHOT}},
            {"type": "message", "role": "developer", "content": note})


# --- a text written once ---------------------------------------------------------------
#
# A record that carries SDK items (``item`` of a ``user/message`` or ``tool/result``,
# ``items`` of an ``assistant/message``) also holds their text in sessionlog's own members
# (``content``, ``output``, ``tool_calls``' arguments). A text is written once: the
# carried item holds null where the text was and ``item_text`` says where the record holds
# it; reading puts it back (:func:`_restored`). So a record is about as large as the JSON
# of the items it carries, not twice that. ``item_text`` is either
#
# - a string ``M`` (a ``user/message``/``tool/result`` whose item's own ``M``, ``content``
#   or ``output``, is the very string the record's ``M`` holds), or
# - a list of references, each an object with ``at`` (the path of the null in ``item``, or
#   in ``items`` starting with the item's index) and one of
#   ``text``: the path of a string in the record, optionally cut to ``[start:end]`` (code
#   points): a text part of the item, e.g. ``{"at": [0, "content", 0, "text"], "text":
#   ["content"]}``;
#   ``parse``: likewise, a string that ``json.loads`` turns into the value (what
#   ``content`` holds for content without text: the value's JSON);
#   ``json``: the path of a value in the record that ``json.dumps`` with ``separators``
#   and ``ensure_ascii`` writes as the string (a call's ``arguments``, which
#   ``tool_calls`` holds as an object), used only when that gives the very string.
#
# A text under _REF_MIN code points (the whole content, output or arguments) is written
# twice, as before, unless it is the item's own string member (the string form, always
# used): that costs at most a few KB of a record, and the Python a reference takes stays
# off the path of a common add_items.

_REF_MIN = 4096  # code points of text a record would repeat before it is referenced
_PIECE_MIN = 128  # a shorter piece of it is left in place (its reference costs ~70 bytes)
_JSON_FORMS: tuple[tuple[tuple[str, str], bool], ...] = (
    ((",", ":"), False),  # compact
    ((", ", ": "), True),  # json.dumps' defaults (what the SDK's helpers write)
    ((", ", ": "), False),
    ((",", ":"), True),
)
_Path = list[Any]


def _carry(event: dict[str, Any], item: Any, member: str) -> None:
    """Put the SDK ``item`` in ``event`` (a ``user/message`` or ``tool/result`` whose
    ``member``, ``content`` or ``output``, is the item's text), its text written once (see
    above)."""
    text = item.get(member) if type(item) is dict else None
    if type(text) is str and text == event.get(member):
        event["item"] = {**item, member: None}  # in its place, so the item reads back in its order
        event["item_text"] = member
        return
    source = event.get(member)
    refs = None
    if type(source) is str and len(source) >= _REF_MIN and type(item) is dict and member in item:
        refs = _text_refs(source, [member], _text_pieces(item[member], [member]), item)
    if refs:
        event["item"] = _with_values(item, [(ref["at"], None) for ref in refs])
        event["item_text"] = refs
    else:
        event["item"] = item


def _text_pieces(content: Any, at: _Path) -> list[tuple[_Path, str | None]]:
    """Where the pieces of ``_text(content)`` are (``content`` at ``at``), in order: a
    path and its string, or (for content without text, whose JSON ``_text`` gives) the
    path of the content and None."""
    if type(content) is str:
        return [(at, content)]
    if type(content) is list:
        pieces: list[tuple[_Path, str | None]] = []
        for j, part in enumerate(content):
            if type(part) is dict:
                key, text = "text", part.get("text")
                if type(text) is not str:
                    key, text = "refusal", part.get("refusal")
                if type(text) is str:
                    pieces.append(([*at, j, key], text))
        if pieces:
            return pieces
    return [(at, None)]


def _text_refs(source: str, source_path: _Path, pieces: list[tuple[_Path, str | None]],
               root: Any) -> list[dict[str, Any]]:
    """References (see above) for ``pieces`` of ``root`` whose strings, joined, are
    ``source`` (at ``source_path`` in the record); none when they are not."""
    refs: list[dict[str, Any]] = []
    texts: list[str] = []
    start = 0
    for at, text in pieces:
        kind = "text"
        if text is None:
            kind, text = "parse", json.dumps(_value_at(root, at), ensure_ascii=False)  # as _text writes it
        texts.append(text)
        end = start + len(text)
        if end - start >= _PIECE_MIN:
            ref: dict[str, Any] = {"at": at, kind: source_path}
            if start or end != len(source):
                ref["start"], ref["end"] = start, end
            refs.append(ref)
        start = end
    if start != len(source) or (texts[0] if len(texts) == 1 else "".join(texts)) != source:
        return []  # not the text the record holds: written twice, as before
    return refs


def _argument_ref(call: Mapping[str, Any], at: _Path, tool_call: Mapping[str, Any], k: int) -> dict[str, Any] | None:
    """A reference for a call's raw ``arguments``/``input`` string (``call`` at ``at``)
    to ``tool_call`` (its ``tool_calls`` entry, index ``k``), or None."""
    member = "arguments" if "arguments" in call else "input"
    raw = call.get(member)
    if type(raw) is not str or len(raw) < _REF_MIN:
        return None
    value = tool_call["arguments"]
    path: _Path = ["tool_calls", k, "arguments"]
    if type(value) is dict and len(value) == 1 and "arguments" in value and (
            value["arguments"] == raw or not raw.lstrip().startswith("{")):
        # What _arguments wrapped: a string that is no JSON (e.g. cut short), or JSON that
        # is no object.
        value, path = value["arguments"], [*path, "arguments"]
        if value == raw:
            return {"at": [*at, member], "text": path}
    try:
        value = _decode(_encode(value))  # what reading the record gives
    except (msgspec.EncodeError, msgspec.DecodeError):
        return None
    for separators, ensure_ascii in _JSON_FORMS:
        try:
            if json.dumps(value, separators=separators, ensure_ascii=ensure_ascii) == raw:
                return {"at": [*at, member], "json": path, "separators": list(separators),
                        "ensure_ascii": ensure_ascii}
        except (TypeError, ValueError):
            return None
    return None


def _value_at(root: Any, path: _Path) -> Any:
    for key in path:
        root = root[key]
    return root


def _with_values(root: Any, puts: list[tuple[_Path, Any]]) -> Any:
    """A copy of ``root`` (plain JSON values) with each ``(path, value)`` of ``puts`` set
    (paths that exist); only the containers on the paths are copied, each once."""
    root = root.copy()
    mine = {id(root)}
    for path, value in puts:
        node = root
        for key in path[:-1]:
            child = node[key]
            if id(child) not in mine:
                node[key] = child = child.copy()
                mine.add(id(child))
            node = child
        node[path[-1]] = value
    return root


def _lookup(root: Any, path: Any) -> tuple[bool, Any]:
    """``(True, value)`` at ``path`` (a list of member names and indexes) in ``root``,
    else ``(False, None)``: never raises on a path a hand-edited log may hold."""
    if type(path) is not list or not path:
        return False, None
    node = root
    for key in path:
        if type(key) is str and (type(node) is dict or isinstance(node, Mapping)):
            if key not in node:
                return False, None
            node = node[key]
        elif type(key) is int and type(node) is list and 0 <= key < len(node):
            node = node[key]
        else:
            return False, None
    return True, node


def _restored(record: Mapping[str, Any], root: Any) -> Any:
    """``root`` (the ``item`` or ``items`` ``record`` carries) with the texts its
    ``item_text`` references put back in place; a reference that does not resolve (a log
    edited by hand) leaves its null."""
    refs = record.get("item_text")
    if type(refs) is str:
        if type(root) is dict and root.get(refs, 0) is None and refs in record:
            return {**root, refs: record[refs]}  # the text the record holds once
        return root
    if type(refs) is not list:
        return root
    puts: list[tuple[_Path, Any]] = []
    for ref in refs:
        if type(ref) is not dict:
            continue
        at = ref.get("at")
        found, current = _lookup(root, at)
        if not found or current is not None:
            continue
        value = _referenced(record, ref)
        if value is not _MISSING:
            puts.append((at, value))
    return _with_values(root, puts) if puts else root


_MISSING = object()


def _referenced(record: Mapping[str, Any], ref: dict[str, Any]) -> Any:
    """The value ``ref`` stands for, or _MISSING."""
    for kind in ("text", "parse", "json"):
        if kind in ref:
            break
    else:
        return _MISSING
    path = ref[kind]
    if type(path) is not list or not path or type(path[0]) is not str or path[0] not in record:
        return _MISSING
    found, value = _lookup({path[0]: record[path[0]]}, path)
    if not found:
        return _MISSING
    if kind == "json":
        separators, ensure_ascii = ref.get("separators"), ref.get("ensure_ascii")
        if (type(separators) is not list or len(separators) != 2 or not all(type(s) is str for s in separators)
                or type(ensure_ascii) is not bool):
            return _MISSING
        try:
            return json.dumps(value, separators=(separators[0], separators[1]), ensure_ascii=ensure_ascii)
        except (TypeError, ValueError):
            return _MISSING
    if type(value) is not str:
        return _MISSING
    start, end = ref.get("start", 0), ref.get("end", len(value))
    if type(start) is not int or type(end) is not int or not 0 <= start <= end <= len(value):
        return _MISSING
    text = value[start:end]
    if kind == "text":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return _MISSING


def _assistant_message(turn: str, step: int, group: list[Any], calls: list[Any], *,
                       carry: bool, provisional: bool = False) -> dict[str, Any]:
    texts = [_text(i.get("content")) for i in group
             if (type(i) is dict or _is_map(i)) and i.get("role") == "assistant" and i.get("content") is not None]
    event: dict[str, Any] = {
        "type": "assistant/message",
        "turn": turn,
        "step": step,
        "content": "".join(texts) if texts else None,
        "tool_calls": [
            {"id": _call_id(c), "name": str(c.get("name") or c.get("type")), "arguments": _arguments(c)}
            for c in calls
        ],
    }
    if carry:
        refs = _message_refs(event, group, calls)
        if refs:
            event["items"] = _with_values(group, [(ref["at"], None) for ref in refs])
            event["item_text"] = refs
        else:
            event["items"] = group
    if provisional:
        event["provisional"] = True
    return event


def _message_refs(event: dict[str, Any], group: list[Any], calls: list[Any]) -> list[dict[str, Any]]:
    """References (see above) for the texts of a response's items (``group``) that its
    ``assistant/message`` (``event``) holds: its content, its calls' arguments."""
    refs: list[dict[str, Any]] = []
    content = event["content"]
    if content is not None and len(content) >= _REF_MIN:
        pieces: list[tuple[_Path, str | None]] = []
        for i, item in enumerate(group):
            if type(item) is dict and item.get("role") == "assistant" and item.get("content") is not None:
                pieces += _text_pieces(item["content"], [i, "content"])
        refs += _text_refs(content, ["content"], pieces, group)
    index = None
    for k, call in enumerate(calls):
        raw = call.get("arguments", call.get("input")) if type(call) is dict else None
        if type(raw) is str and len(raw) >= _REF_MIN:
            if index is None:
                index = {id(item): i for i, item in enumerate(group)}
            i = index.get(id(call))
            ref = _argument_ref(call, [i], event["tool_calls"][k], k) if i is not None else None
            if ref is not None:
                refs.append(ref)
    return refs


class _AddPlan:
    """Turns one ``add_items`` batch (a detached copy: plain JSON values) into records (see
    the module docstring), and works out the state feeding those records to the
    conversation gives (:meth:`Conversation.settle`), so the records are not fed again
    after they are appended. Nothing in the conversation is changed here."""

    __slots__ = ("batch", "hooks", "carry", "turns", "turn", "step_number", "step", "outputs", "events",
                 "length", "latest", "settles", "users", "responses", "names", "copied", "copy")

    def __init__(self, conv: Conversation, batch: list[Any], *, hooks: bool) -> None:
        self.batch = batch
        self.hooks = hooks
        self.turns = conv.turns
        self.turn = conv.turn
        self.step_number = conv.step_number
        # The open step's calls change here (started, answered): on a copy, until settled.
        self.copied = conv.open_step
        self.step = self.copy = conv.open_step.copy() if conv.open_step is not None else None
        self.events: list[dict[str, Any]] = []
        self.latest: dict[str, _Call] | None = None  # calls of the latest assistant message planned
        self.users = self.responses = False  # a user message, an assistant message planned
        self.names: dict[str, str] = {}  # the name records give a call of a step planned here
        # The batch settles what the hooks wrote when it holds any of it: one record with
        # the batch as the Runner gave it replaces the hooks' versions (atomic everywhere).
        pending = conv.items[conv.provisional_from:] if conv.provisional_from is not None else ()
        if pending:
            ids = set(map(_identity, pending))
            self.carry = carry = not any(_identity(i) in ids for i in batch)
        else:
            self.carry = carry = True
        # How many items the conversation holds once the records so far are fed.
        if carry:
            self.length = len(conv.items)
            self.settles = False  # provisional items stay provisional (unless a step ends)
        else:
            self.events.append({"type": AGENTS_ITEMS, "items": batch, "replaces_from": conv.provisional_seq})
            self.length = (conv.provisional_from or 0) + len(batch)
            self.settles = True
        kinds = list(map(_add_kind, batch))
        # Without hooks, the outputs in the batch say which calls ran (see flush).
        self.outputs = set() if hooks else {i["call_id"] for i, kind in zip(batch, kinds) if kind == "output"}
        append = self.events.append
        group: list[Any] = []
        calls: list[Any] = []
        for item, kind in zip(batch, kinds):
            if kind == "model":
                group.append(item)
                continue
            if kind == "call":
                group.append(item)
                calls.append(item)
                continue
            if group:
                self.flush(group, calls)
                group, calls = [], []
            if kind == "user":
                self.turns += 1
                self.turn = turn = f"t{self.turns}"
                self.step_number = 0
                self.users = True
                event = {"type": "user/message", "turn": turn, "content": _text(item.get("content"))}
                if carry:
                    _carry(event, item, "content")
                    self.length += 1
                append(event)
            elif kind == "output":
                self.answer(item)
            elif carry:
                append({"type": AGENTS_ITEM, "item": item})
                self.length += 1
        if group:
            self.flush(group, calls)
        self.finish()

    def flush(self, group: list[Any], calls: list[Any]) -> None:
        """The records of one model response (``group``: its items in order; ``calls``:
        those that are calls)."""
        step = self.step
        events = self.events
        carry = self.carry
        if step is not None and calls and all(c["call_id"] in step.calls for c in calls):
            # The hooks recorded this response already.
            if carry:
                events.extend({"type": AGENTS_ITEM, "item": i} for i in group)
                self.length += len(group)
            return
        self.close_step()
        self.step_number = n = self.step_number + 1
        turn = self.turn
        events.append({"type": "step/start", "turn": turn, "step": n})
        events.append(_assistant_message(turn, n, group, calls, carry=carry))
        self.responses = True
        # The step as feeding its assistant message makes it: it starts where the
        # message's items go; each call once (the first of an id), named as its
        # tool_calls entry names it, answered by the output type the (last) item of its
        # id asks for when the message carries the items.
        step = _Step(turn, n, self.length)
        if carry:
            self.length += len(group)
        self.latest = step.calls
        if not calls:
            events.append({"type": "step/end", "turn": turn, "step": n, "status": "completed"})
            self.step = None
            self.settles = True
            return
        # The records name a call of this step by its (last) item's name (none: "").
        self.names = names = {}
        step_calls = step.calls
        for c in calls:
            call_id, type_, name = c["call_id"], c["type"], c.get("name")
            names[call_id] = str(name or "")
            call = step_calls.get(call_id)
            if call is None:
                call = step_calls[call_id] = _Call(call_id, str(name or type_), "function_call_output")
            if carry:
                call.output_type = _CALL_OUTPUT_TYPES[type_]
        self.step = step
        if not self.hooks:
            # These calls ran before the Runner saved them: their intent goes first, so a
            # batch cut short never claims a call that ran did not start.
            outputs = self.outputs
            for call in step.calls.values():
                if call.call_id in outputs:
                    self.start(call)

    def start(self, call: _Call) -> None:
        step = self.step
        assert step is not None
        self.events.append({"type": "tool/call", "turn": step.turn, "step": step.step,
                            "call_id": call.call_id, "name": self.names.get(call.call_id, call.name)})
        call.started = True

    def answer(self, item: Any) -> None:
        call_id = item.get("call_id")  # an output item (see _kind): a dict
        step = self.step
        call = step.calls.get(call_id) if step is not None and type(call_id) is str else None
        if call is None or call.answered:
            # An output the transcript has already (the hooks wrote it) or none asked for.
            if self.carry:
                self.events.append({"type": AGENTS_ITEM, "item": item})
                self.length += 1
            return
        assert step is not None
        if call.awaiting and not call.started and self.hooks:
            # It was waiting for a human and no tool ran: the Runner saved the rejection.
            self.events.append({"type": "tool/approval", "turn": step.turn, "step": step.step,
                                "call_id": call_id, "state": "rejected"})
        if not call.started and not self.hooks:
            self.start(call)
        event = {"type": "tool/result", "turn": step.turn, "step": step.step, "call_id": call_id,
                 "name": self.names.get(call_id, call.name), "output": _output_text(item), "is_error": False}
        if self.carry:
            _carry(event, item, "output")
            self.length += 1
        self.events.append(event)
        call.answered = True
        call.awaiting = False

    def close_step(self) -> None:
        step = self.step
        if step is not None and step.all_answered():
            self.events.append({"type": "step/end", "turn": step.turn, "step": step.step, "status": "completed"})
            self.step = None
            self.settles = True

    def finish(self) -> None:
        step = self.step
        if step is None:
            return
        if step.all_answered():
            self.close_step()
            return
        for call in step.unanswered():
            if not call.started and not call.awaiting:
                # The Runner saved the response without this call's output: the run paused
                # for a decision on it (an approval interruption).
                self.events.append({"type": "tool/approval", "turn": step.turn, "step": step.step,
                                    "call_id": call.call_id, "state": "requested"})
                call.awaiting = True


# --- the session -------------------------------------------------------------------------

_T = TypeVar("_T")
_LOCAL_SCHEMES = frozenset({"jsonl", "zstd", "memory"})
_FILE_SCHEMES = frozenset({"jsonl", "zstd"})  # a read from a seq scans from the start
_WINDOW = 16  # records a partial replay reads first (then 4x as many, and so on)


class _JsonlTail:
    """The latest records of a JSONL session, read backwards from the end of its file
    through the store's I/O seam, each validated as a scan would (it decodes as a record,
    no longer than the record limit, the seqs run without a gap to the log's last one).
    What was read is kept: asking for more reads only the bytes before it."""

    _CHUNK = 64 << 10

    def __init__(self, store: Any, session_id: str, end: int, last_seq: int) -> None:
        self._store = store
        self._session_id = session_id
        self._pos = end  # bytes before this offset are not read yet
        self._carry = b""  # the start of the oldest line read, not yet complete
        self._records: list[Any] = []  # validated, newest first
        self._lines: list[bytes] = []  # read, complete, not decoded yet (oldest first)
        self._last_seq = last_seq
        self._limit = store.limits.record_limit
        self._chunk = self._CHUNK
        self._failed = False
        self._started = False

    def latest(self, n: int) -> list[Any] | None:
        """The latest ``n`` records (all of them if the log holds fewer), oldest first;
        None if they do not validate (the caller reads the log whole)."""
        if not self._failed and len(self._records) < n:
            try:
                self._read_back(n)
            except (OSError, sessionlog.SessionLogError):
                self._failed = True
        if self._failed:
            return None
        return self._records[:n][::-1]

    def _read_back(self, n: int) -> None:
        """Decode records (newest first) until ``n`` are taken or the header is."""
        records = self._records
        fd = None
        try:
            while len(records) < n and (not records or records[-1].seq > 1):
                if not self._lines:
                    if self._pos == 0:
                        raise sessionlog.CorruptLog("the records do not reach back to seq 1")
                    if fd is None:
                        fd = self._store.open_read(self._session_id)
                    self._read_chunk(fd)
                    continue
                self._take(self._lines.pop())
        finally:
            if fd is not None:
                self._store.fs.close(fd)

    def _read_chunk(self, fd: int) -> None:
        """Read the bytes before those read so far: the complete lines they end go to
        ``_lines`` (oldest first), the first one's start stays in ``_carry``."""
        size = min(self._chunk, self._pos)
        start = self._pos - size
        data = self._store.fs.pread(fd, size, start)
        if len(data) != size:
            raise sessionlog.CorruptLog("the session file is shorter than its known end")
        self._pos = start
        self._chunk = min(self._chunk * 2, 8 << 20)
        if self._started:
            data += self._carry  # completes the oldest line read before
        elif data.endswith(b"\n"):
            data = data[:-1]
            self._started = True
        else:
            raise sessionlog.CorruptLog("the session file does not end with a newline")
        lines = data.split(b"\n")
        # The first line may start before ``start``: kept until the next read.
        self._carry = lines.pop(0) if start > 0 else b""
        if len(self._carry) > self._limit:
            raise sessionlog.CorruptLog("a record over the record limit")
        self._lines = lines

    def _take(self, line: bytes) -> None:
        """Add the record ``line`` (the one before those taken)."""
        if len(line) > self._limit:
            raise sessionlog.CorruptLog("a record over the record limit")
        try:
            record = Record.from_line(line)
        except RecordError as exc:
            raise sessionlog.CorruptLog(f"a record does not decode: {exc.reason}") from None
        expected = self._records[-1].seq - 1 if self._records else self._last_seq
        if record.seq != expected:
            raise sessionlog.CorruptLog(f"seq {record.seq} where {expected} was expected")
        self._records.append(record)


class SessionLogSession:
    """The OpenAI Agents SDK ``Session`` protocol over a sessionlog store.

    ``store`` is a store URL (``jsonl:DIR``, ``zstd:DIR``, ``sqlite:///FILE``,
    ``postgresql+psycopg://...``, ``memory:``) or an open :class:`sessionlog.EventStore`
    (left open by :meth:`close`). The session is created on first use. From its first
    use until :meth:`close` this object owns the sessionlog session (its single writer):
    a second owner gets :class:`sessionlog.SessionLocked`. The first use after a crash
    repairs the log once, durably (sessionlog's repair, never forced); a log whose damage
    needs ``--force`` raises :class:`sessionlog.CorruptLog`.

    Where the work runs: opening (which reads the log, and repairs it after a crash) runs
    in a worker thread. After that, on a local file or memory store an operation is one
    write and one ``fdatasync`` of a few hundred bytes (the session's lock is already held)
    and runs on the event loop's thread; on SQL stores (a busy wait, a network round trip)
    it runs in a worker thread. ``offload=True`` always uses a worker thread,
    ``offload=False`` never does after the open.

    Every method accepts the Runner's ``wrapper`` keyword (unused). Errors are
    :class:`sessionlog.SessionLogError` subclasses.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        store: str | sessionlog.EventStore,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        offload: bool | None = None,
    ) -> None:
        self.session_id = session_id
        if isinstance(session_settings, Mapping):
            session_settings = SessionSettings(**session_settings)
        self.session_settings = session_settings if session_settings is not None else SessionSettings()
        if isinstance(store, str):
            self._store: sessionlog.EventStore = sessionlog.open_store(store)
            self._owns_store = True
        else:
            self._store = store
            self._owns_store = False
        scheme = sessionlog.scheme_of(self._store.url)
        self._offload = scheme not in _LOCAL_SCHEMES if offload is None else offload
        self._seekable = scheme not in _FILE_SCHEMES
        self._scheme = scheme
        self._handle: sessionlog.SessionHandle | None = None
        self._conversation = Conversation()
        self._lock = threading.Lock()
        self._hooks = False
        self._closed = False

    # -- the Session protocol ---------------------------------------------------------

    async def get_items(self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None,
                        ) -> list[TResponseInputItem]:
        """The conversation's items in order; with ``limit`` (or ``session_settings.limit``)
        the latest ``limit`` of them, still in order (0: none; negative: all)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit

        def read() -> list[Any]:
            self._whole(limit if limit is not None and limit >= 0 else None)
            items = self._conversation.items
            if limit is not None and limit >= 0:
                items = items[-limit:] if limit else []
            return _copy_items(items)

        return await self._run(read)

    async def add_items(self, items: list[TResponseInputItem], *,
                        wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Append ``items`` durably (one atomic batch, durable on return).

        Raises :class:`sessionlog.InvalidEvent`, and writes nothing, when an item does not
        fit a record or the batch is over the store's batch limit (the message names the
        item, its size and the limit), or an item is not JSON."""
        batch = _copy_items(items)
        if not batch:
            self._check_open()
            return
        await self._run(self._add, batch)

    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None) -> TResponseInputItem | None:
        """Remove the latest item from the conversation and return it (None when empty).
        The log keeps it: an ``agents/pop`` record is appended (naming the item as
        ``removed``, unless that would not fit a record)."""

        def pop() -> Any:
            self._whole(1)
            items = self._conversation.items
            if not items:
                return None
            item = _copy_items(items[-1:])[0]
            self._append([self._pop_record(item)], [item], "pop_item")
            return item

        return await self._run(pop)

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Start the conversation over. The log keeps its history: an ``agents/clear``
        record is appended."""
        await self._run(lambda: self._append([{"type": AGENTS_CLEAR}]))

    # -- run hooks ------------------------------------------------------------------------

    def run_hooks(self, inner: RunHooks[Any] | None = None) -> SessionLogRunHooks:
        """The SDK ``RunHooks`` that record a response's calls before their tools run
        (pass them as ``hooks=`` to every run of this session); ``inner`` (your own hooks)
        is called after each of them."""
        self._hooks = True
        return SessionLogRunHooks(self, inner)

    async def record_pause(self, result: Any) -> None:
        """Record that ``result`` (a ``RunResult`` with ``interruptions``) paused the run
        for approvals. Only needed when the run has no ``session=`` (server-managed
        conversation state, where the SDK refuses a Session): the outputs the run produced
        locally and the calls awaiting a decision become durable, so reopening the session
        while a human decides repairs nothing. With ``session=`` the Runner's own
        ``add_items`` records the same and this is a no-op."""
        outputs = _copy_items([_as_item(getattr(i, "raw_item", None)) for i in getattr(result, "new_items", ())
                               if getattr(i, "type", None) == "tool_call_output_item"])
        awaiting = [call_id for i in getattr(result, "interruptions", ())
                    if (call_id := _call_id(_as_item(getattr(i, "raw_item", None)))) is not None]
        await self._run(lambda: self._append(self._conversation.plan_pause(outputs, awaiting), outputs,
                                             "record_pause"))

    async def _record_request(self, input_items: list[Any]) -> None:
        items = _copy_items([_as_item(i) for i in input_items])
        await self._run(lambda: self._append(self._conversation.plan_request(items), items,
                                             "on_llm_start record"))

    async def _record_response(self, response: ModelResponse) -> None:
        items = _copy_items([_as_item(i) for i in response.to_input_items()])
        response_id = response.response_id
        await self._run(lambda: self._append(self._conversation.plan_response(items, response_id), items,
                                             "on_llm_end record"))

    async def _record_tool_start(self, context: RunContextWrapper[Any], tool: Any = None) -> None:
        if not isinstance(context, ToolContext):
            # A computer, shell, local shell or apply-patch tool: the hook is not told
            # which call starts, only the tool.
            call_type = _local_call_type(tool)
            if call_type is not None:
                executed = _executed_call_ids(context)
                await self._run(lambda: self._append(self._conversation.plan_local_tool_start(call_type, executed)))
            return
        call = context.tool_call
        call_item = _copy_items([_as_item(call)])[0] if call is not None else None
        call_id, name = context.tool_call_id, context.tool_name
        await self._run(lambda: self._append(self._conversation.plan_tool_start(call_id, name, call_item)))

    async def _record_tool_end(self, context: RunContextWrapper[Any], result: object) -> None:
        if not isinstance(context, ToolContext):
            return
        if context.tool_call is not None:
            item = ItemHelpers.tool_call_output_item(context.tool_call, result)
        else:  # a custom tool: its output item has the type its call asks for
            item = {"type": self._conversation.output_type_of(context.tool_call_id), "call_id": context.tool_call_id,
                    "output": str(result)}
        output = _copy_items([_as_item(item)])[0]
        call_id, name = context.tool_call_id, context.tool_name
        await self._run(lambda: self._append(self._conversation.plan_tool_end(call_id, name, output), [output],
                                             "on_tool_end record"))

    # -- ownership ----------------------------------------------------------------------

    def close(self) -> None:
        """Release the sessionlog session (and the store, when opened from a URL)."""
        with self._lock:
            self._closed = True
            handle, self._handle = self._handle, None
            if handle is not None:
                handle.close()
            if self._owns_store:
                self._store.close()

    async def __aenter__(self) -> SessionLogSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __enter__(self) -> SessionLogSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise sessionlog.StoreClosed(f"session {self.session_id!r} is closed")

    async def _run(self, operation: Callable[..., _T], *args: Any) -> _T:
        """Run ``operation(*args)`` alone, with the session open (see the class docstring
        for the thread it runs on). Once started it completes even if the caller is
        cancelled."""
        if self._offload or self._handle is None:
            return await asyncio.to_thread(self._locked, operation, *args)
        return self._locked(operation, *args)

    def _locked(self, operation: Callable[..., _T], *args: Any) -> _T:
        with self._lock:
            self._check_open()
            if self._handle is None:
                self._open()
            return operation(*args)

    def _open(self) -> None:
        store, sid = self._store, self.session_id
        try:
            handle = store.session(sid, create=True)
        except sessionlog.CorruptLog:
            handle = store.session(sid, repair=True)
        try:
            conversation = self._replay(handle)
            if conversation.needs_repair:
                # The last writer died inside a step: answer its calls once, durably.
                handle.close()
                handle = store.session(sid, repair=True)
                latest = self._latest_records(handle)
                added = handle.last_seq - conversation.last_seq
                records = latest(added) if latest is not None else None
                for record in records if records is not None else handle.records(conversation.last_seq):
                    if record.seq > conversation.last_seq:
                        conversation.feed(record)
        except BaseException:
            handle.close()
            raise
        self._handle, self._conversation = handle, conversation

    def _replay(self, handle: sessionlog.SessionHandle, enough: int | None = 0) -> Conversation:
        """The conversation the log holds, with at least its latest ``enough`` items (None:
        all of them). Where the store can give the latest records without reading what is
        before them (SQL and memory: a read from a seq; JSONL: the file read backwards from
        its end), only those are read, as many as it takes to reach back to a user message
        and to hold ``enough`` items; otherwise (Zstd, or a tail that does not validate) the
        log is read whole."""
        last = handle.last_seq
        latest = self._latest_records(handle) if enough is not None else None
        window = _WINDOW
        while latest is not None and window < last:
            records = latest(window)
            if records is None:
                break  # the tail did not validate: the whole read says what is there
            conversation = Conversation(partial=True)
            for record in records:
                conversation.feed(record)
            if conversation.sufficient and len(conversation.items) >= enough:  # type: ignore[operator]
                return conversation
            window *= 4
        conversation = Conversation()
        for record in handle.records():
            conversation.feed(record)
        return conversation

    def _latest_records(self, handle: sessionlog.SessionHandle) -> Callable[[int], Any] | None:
        """``latest(n)``: the log's latest ``n`` records in order (an iterable; None when
        they cannot be read and validated), for a store that can read them without reading
        the whole log; else None."""
        if self._seekable:
            last = handle.last_seq
            return lambda n: handle.records(max(0, last - n))
        store = self._store
        end = getattr(handle, "end", None)
        if self._scheme == "jsonl" and isinstance(end, int) and hasattr(store, "open_read"):
            return _JsonlTail(store, self.session_id, end, handle.last_seq).latest
        return None

    def _whole(self, enough: int | None) -> None:
        """Make sure the conversation holds at least its latest ``enough`` items (None:
        all of them), reading more of the log if a partial replay holds fewer."""
        conversation = self._conversation
        if conversation.partial and (enough is None or enough > len(conversation.items)):
            assert self._handle is not None
            self._conversation = self._replay(self._handle, enough)

    def _add(self, batch: list[Any]) -> None:
        """``add_items`` of ``batch`` (a detached copy), with the session open: one
        durable batch, accounted for from its plan (not fed record by record)."""
        assert self._handle is not None
        conversation = self._conversation
        plan = _AddPlan(conversation, batch, hooks=self._hooks)
        if plan.events:
            conversation.settle(plan, self._append_batch(plan.events, batch, "add_items"))

    def _append(self, events: list[dict[str, Any]], items: list[Any] | None = None, what: str = "") -> None:
        """Append ``events`` (made from ``items``, by ``what``) as one durable batch and
        account for them."""
        if not events:
            return
        seq = self._append_batch(events, items or [], what or f"{events[-1]['type']} record") - len(events)
        feed = self._conversation.feed
        for event in events:
            seq += 1
            feed(event, seq)


    def _append_batch(self, events: list[dict[str, Any]], items: list[Any], what: str) -> int:
        """Append ``events`` (made from ``items``, by ``what``) as one durable batch; its
        last seq. The store's refusal of a record or batch over its size limit is told in
        the items' terms (:func:`_refusal`)."""
        assert self._handle is not None
        try:
            return self._handle.append(events)
        except sessionlog.InvalidEvent as exc:
            refusal = _refusal(events, items, what, getattr(self._store, "limits", None))
            if refusal is None:
                raise
            raise refusal from exc

    def _pop_record(self, item: Any) -> dict[str, Any]:
        """The ``agents/pop`` record for ``item``: it names the item (``removed``) unless
        that would not fit a record; the item is in the record that added it anyway."""
        limit = getattr(getattr(self._store, "limits", None), "record_limit", 1 << 20)
        if len(_encode(item)) + 256 > limit:
            return {"type": AGENTS_POP}
        return {"type": AGENTS_POP, "removed": item}


_ENVELOPE = 40  # what a record adds to its event's JSON: seq, ts (about)


def _refusal(events: list[dict[str, Any]], items: list[Any], what: str, limits: Any) -> sessionlog.InvalidEvent | None:
    """Why the store refused ``events`` (made from ``items`` by ``what``) as
    :class:`sessionlog.InvalidEvent`: which item is too large for a record, or how far the
    batch is over the batch limit, and the limit; None when no size limit explains it (the
    store's own error is then the one to raise)."""
    record_limit = getattr(limits, "record_limit", 1 << 20)
    batch_limit = getattr(limits, "batch_limit", 1 << 20)
    try:
        sizes = [len(_encode(event)) + _ENVELOPE for event in events]
        item_sizes = [len(_encode(item)) for item in items]
    except (msgspec.EncodeError, TypeError, ValueError):
        return None
    nothing = f"Nothing of this {what} was written; the session is as it was."
    biggest = max(range(len(events)), key=sizes.__getitem__)
    if sizes[biggest] > record_limit:
        event = events[biggest]
        held = _items_held(event, items)
        record = f"the {event.get('type')} record"
        if not held:
            return sessionlog.InvalidEvent(
                f"{what}: {record} would be about {sizes[biggest]:,} bytes, over the store's record limit "
                f"of {record_limit:,} bytes. {nothing}")
        if len(held) == 1:
            j = held[0]
            return sessionlog.InvalidEvent(
                f"{what}: items[{j}] ({_describe(items[j])}) is {item_sizes[j]:,} bytes of JSON; {record} that "
                f"holds it would be about {sizes[biggest]:,} bytes, over the store's record limit of "
                f"{record_limit:,} bytes. {nothing}")
        return sessionlog.InvalidEvent(
            f"{what}: {record} that holds {len(held)} of its items would be about {sizes[biggest]:,} bytes, over "
            f"the store's record limit of {record_limit:,} bytes. {nothing} The largest: "
            f"{_largest(held, items, item_sizes)}.")
    total = sum(sizes) + len(sizes)
    if total > batch_limit:
        named = _largest(range(len(items)), items, item_sizes)
        return sessionlog.InvalidEvent(
            f"{what}: the records of its {len(items)} item{'s' if len(items) != 1 else ''} come to about "
            f"{total:,} bytes, over the store's batch limit of {batch_limit:,} bytes (one {what} is one "
            f"atomic append: it is not split). {nothing} The largest: {named}.")
    return None


def _largest(indexes: Any, items: list[Any], item_sizes: list[int]) -> str:
    """The (at most three) largest of ``items`` at ``indexes``, for an error message."""
    largest = sorted(indexes, key=item_sizes.__getitem__, reverse=True)[:3]
    return ", ".join(f"items[{j}] ({_describe(items[j])}) {item_sizes[j]:,} bytes of JSON" for j in largest)


def _items_held(event: Mapping[str, Any], items: list[Any]) -> list[int]:
    """The indexes in ``items`` of the items ``event`` holds (their text, if not the item)."""
    if "item" in event:
        held = [_restored(event, event["item"])]
    elif type(event.get("items")) is list:
        held = _restored(event, event["items"])
    elif event.get("type") == "tool/result":
        return [j for j, i in enumerate(items) if _kind(i) == "output" and _call_id(i) == event.get("call_id")]
    elif event.get("type") == "assistant/message":
        ids = {c.get("id") for c in event.get("tool_calls") or () if _is_map(c)}
        return [j for j, i in enumerate(items) if _kind(i) == "model" and (_is_call(i) and _call_id(i) in ids
                                                                         or i.get("role") == "assistant")]
    else:
        return []
    indexes: list[int] = []
    for item in held:
        for j, candidate in enumerate(items):
            if j not in indexes and candidate == item:
                indexes.append(j)
                break
    return indexes


def _describe(item: Any) -> str:
    """``item`` for an error message: its type, role and id."""
    if not _is_map(item):
        return type(item).__name__
    words = [str(item.get("type") or "message")]
    for key in ("role", "call_id", "id"):
        value = item.get(key)
        if isinstance(value, str):
            words.append(f"{key} {value[:60]!r}")
    return ", ".join(words)


class SessionLogRunHooks(RunHooks[Any]):
    """Run hooks that make a response's calls durable before their tools run. Made by
    :meth:`SessionLogSession.run_hooks`; ``inner`` hooks are called after each."""

    def __init__(self, session: SessionLogSession, inner: RunHooks[Any] | None = None) -> None:
        self.session = session
        self.inner = inner

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any, input_items: Any) -> None:
        await self.session._record_request(list(input_items))
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        await self.session._record_response(response)
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        if self.inner is not None:
            await self.inner.on_agent_start(context, agent)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        if self.inner is not None:
            await self.inner.on_agent_end(context, agent, output)

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        if self.inner is not None:
            await self.inner.on_handoff(context, from_agent, to_agent)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        await self.session._record_tool_start(context, tool)
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        await self.session._record_tool_end(context, result)
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)
