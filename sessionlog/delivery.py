"""Delivery tracking: which tool results the model has not received yet.

Pure functions over records, no I/O. A result that exists in the log is not yet a result
the model has seen. A runtime that continues a server-side conversation (OpenAI
``previous_response_id`` / ``conversation``) sends only what the server does not hold,
so it must know which results are still owed. It records two events around each model
request (kept verbatim by every backend, like any other event):

``llm/request``
    ``request`` (string, the runtime's id for this request, unique in the session),
    ``results`` (list of call ids: the tool results this request carried, in the order
    carried), optional ``turn``, ``step``, and anything else the runtime wants
    (``model``, ``previous_response_id``...). Written before the request is sent.
``llm/response``
    ``request`` (the id of the request it answers), optional ``response_id``, optional
    ``error`` (present and not null: the request failed — HTTP error, refused input — and
    delivered nothing). Written when the response arrived.

A result is *delivered* once an ``llm/response`` without ``error`` is recorded for a
request that carried it. Until then it stays pending: delivery is **at least once**. The
window: a request reached the server (which appended its items to the conversation),
but the response was lost (timeout, crash before ``llm/response`` was durable). The log
cannot tell this from a request that never arrived, so the result is sent again. Against
``previous_response_id`` that is harmless (the new request forks from the same response).
Against a server ``conversation`` the outputs may then be present twice; a runtime that
can ask the server (list the conversation's items) passes the call ids it found there as
``server_holds`` and they are excluded.

What is owed is derived from the call ids of the latest ``assistant/message`` (not from a
list of "pending tools"): every call of that message with a result — a tool's output, a
locally produced error for an unknown tool, a denial, a synthetic recovery result — is
owed until delivered, each exactly once, in the assistant's call order. This is the rule
of openai-agents-python PR #4947, where an unknown tool's local error was lost on a
server-managed resume because it was never among the pending tool groups.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .events import Record
from .projection import FORMATS, UnknownFormat, result_is_error, result_text
from .transcript import PairedCall, pair_calls

LLM_REQUEST: Final = "llm/request"
LLM_RESPONSE: Final = "llm/response"


def request_event(
    request: str, results: Sequence[str], *, turn: Any = None, step: Any = None, **extra: Any
) -> dict[str, Any]:
    """The ``llm/request`` event for a model request that carries the results of
    ``results`` (call ids). Append it (durably) before sending the request."""
    event: dict[str, Any] = {"type": LLM_REQUEST}
    if turn is not None:
        event["turn"] = turn
    if step is not None:
        event["step"] = step
    event["request"] = request
    event["results"] = list(results)
    event.update(extra)
    return event


def response_event(
    request: str, *, response_id: str | None = None, error: str | None = None, turn: Any = None,
    step: Any = None, **extra: Any,
) -> dict[str, Any]:
    """The ``llm/response`` event recording that the response to ``request`` arrived
    (with ``error`` when the request failed and delivered nothing)."""
    event: dict[str, Any] = {"type": LLM_RESPONSE}
    if turn is not None:
        event["turn"] = turn
    if step is not None:
        event["step"] = step
    event["request"] = request
    if response_id is not None:
        event["response_id"] = response_id
    if error is not None:
        event["error"] = error
    event.update(extra)
    return event


@dataclass(frozen=True, slots=True)
class PendingResult:
    """A result owed to the model. ``seq`` is its ``tool/result`` record, or None for a
    view-time result (a closed step left the call without one; see
    :func:`sessionlog.transcript.pair_calls`)."""

    call_id: str
    name: str
    output: str
    is_error: bool
    code: str | None
    seq: int | None

    def item(self, fmt: str) -> dict[str, Any]:
        """This result as ``fmt`` carries it: a Chat ``tool`` message, a Responses
        ``function_call_output`` item, or an Anthropic ``tool_result`` block."""
        if fmt == "openai":
            return {"role": "tool", "tool_call_id": self.call_id, "content": self.output}
        if fmt == "responses":
            return {"type": "function_call_output", "call_id": self.call_id, "output": self.output}
        if fmt == "anthropic":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": self.call_id, "content": self.output}
            if self.is_error:
                block["is_error"] = True
            return block
        raise UnknownFormat(f"unknown view format {fmt!r}; known: {', '.join(FORMATS)}")


@dataclass(slots=True)
class Deliveries:
    """Where the latest assistant message's results stand.

    ``pending``: results that exist and are not delivered, in call order (send these).
    ``awaiting``: calls still without a result in the open step (a tool running, an
    approval not given); a provider rejects a request before they have one.
    ``in_doubt``: pending call ids a request carried whose response is not recorded (the
    at-least-once window). ``delivered``: call ids delivered."""

    assistant_seq: int | None
    call_ids: list[str] = field(default_factory=list)
    pending: list[PendingResult] = field(default_factory=list)
    awaiting: list[str] = field(default_factory=list)
    in_doubt: list[str] = field(default_factory=list)
    delivered: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """True when every call of the latest assistant message has a result."""
        return not self.awaiting


def _split(records: Iterable[Mapping[str, Any]], sink: list[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for record in records:
        # pair_calls refuses a record without its envelope (InvalidEvent) as it reads it.
        type_ = record.type if isinstance(record, Record) else record.get("type") if isinstance(record, Mapping) else None
        if type_ in (LLM_REQUEST, LLM_RESPONSE):
            sink.append(record)
        yield record


def _seq(record: Mapping[str, Any]) -> int:
    return record.seq if isinstance(record, Record) else record["seq"]


def _pending_result(call: PairedCall) -> PendingResult:
    assert call.result is not None
    code = call.result.get("code")
    return PendingResult(
        call.call_id, call.name, result_text(call.result), result_is_error(call.result),
        code if isinstance(code, str) else None, call.result_seq,
    )


def delivery_state(
    records: Iterable[Mapping[str, Any]], *, server_holds: Collection[str] = ()
) -> Deliveries:
    """The delivery state of the latest ``assistant/message``'s calls (see the module
    docstring for the records it reads). ``server_holds``: call ids whose results the
    server-side conversation is known to hold already (excluded from ``pending``)."""
    llm: list[Mapping[str, Any]] = []
    pairing = pair_calls(_split(records, llm))
    latest = pairing.latest
    if latest is None:
        return Deliveries(None)
    carried: dict[str, list[tuple[int, str]]] = {}  # call id -> [(request seq, request id)]
    answered: dict[str, int] = {}  # request id -> seq of its last successful response
    for record in llm:
        seq = _seq(record)
        if seq <= latest.seq:
            continue
        request = record.get("request")
        if not isinstance(request, str):
            continue
        type_ = record.type if isinstance(record, Record) else record["type"]
        if type_ == LLM_REQUEST:
            results = record.get("results")
            for call_id in results if isinstance(results, list) else []:
                if isinstance(call_id, str):
                    carried.setdefault(call_id, []).append((seq, request))
        elif record.get("error") is None:
            answered[request] = seq
    state = Deliveries(latest.seq, [c.call_id for c in latest.calls])
    for call in latest.calls:
        if call.result is None or call.awaiting_approval or (call.view_time and latest.open):
            # Still in the open step without a result (a tool running, a human deciding):
            # it may yet get a real one.
            state.awaiting.append(call.call_id)
            continue
        requests = carried.get(call.call_id, [])
        if call.call_id in server_holds or any(answered.get(r, -1) > s for s, r in requests):
            state.delivered.append(call.call_id)
            continue
        state.pending.append(_pending_result(call))
        if requests:
            state.in_doubt.append(call.call_id)
    return state


def pending_deliveries(
    records: Iterable[Mapping[str, Any]], *, server_holds: Collection[str] = ()
) -> list[PendingResult]:
    """The results that exist and have not been delivered, derived from the call ids of
    the latest ``assistant/message``, each once, in the assistant's call order, excluding
    ``server_holds`` and whatever a recorded response acknowledged (module docstring)."""
    return delivery_state(records, server_holds=server_holds).pending


def delivery_items(pending: Iterable[PendingResult], fmt: str) -> list[dict[str, Any]]:
    """The pending results as ``fmt`` items, in order (see :meth:`PendingResult.item`)."""
    return [p.item(fmt) for p in pending]
