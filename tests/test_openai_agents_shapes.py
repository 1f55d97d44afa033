"""After a crash, every item ``get_items()`` returns, and every item of the next model
request, is an input item the Responses API takes: checked against the openai package's
own TypedDicts for input items (``openai/types/responses/response_input_item_param.py``),
read from their annotations (required keys, literal values, nested shapes, no unknown
keys), not against shapes written out here. A call sessionlog's repair answered gets the
output shape its call type requires (a computer call a screenshot, a shell call a list of
``{stdout, stderr, outcome}``, an apply-patch call a ``status``) with the repair's text
wherever that shape holds text, TOOL_OUTCOME_UNKNOWN and TOOL_NOT_STARTED told apart, and
the log keeps the synthetic ``tool/result`` with its code."""

from __future__ import annotations

import asyncio
import base64
import collections.abc
import io
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

import typing_extensions as te  # noqa: E402
from agents import RunHooks, Runner  # noqa: E402
from agents.testing import ScriptedModel, assistant_message  # noqa: E402
from openai.types.responses.response_input_item_param import ResponseInputItemParam  # noqa: E402
from test_openai_agents_tools import (  # noqa: E402
    KINDS,
    SavedBeforeTurn,
    assert_each_output_once,
    every_kind_agent,
    every_kind_of_call,
    resume_every_kind,
    output_ids,
    reference_run,
)

import sessionlog  # noqa: E402

UNKNOWN, NOT_STARTED = sessionlog.TOOL_OUTCOME_UNKNOWN, sessionlog.TOOL_NOT_STARTED


# --- a strict check against the openai package's TypedDicts -------------------------------


def shape_errors(value: Any, annotation: Any, at: str) -> list[str]:
    """Where the JSON ``value`` does not have the shape ``annotation`` (from the openai
    package's param types) describes; empty when it has. Raises on an annotation it has no
    rule for, so a new kind of type is never passed unchecked."""
    tp = _bare(annotation)
    origin, args = te.get_origin(tp), te.get_args(tp)
    if tp is Any or tp is object:
        return []
    if tp is type(None):
        return [] if value is None else [f"{at}: {value!r:.60} is not null"]
    if origin is te.Literal:
        return [] if any(value == a and type(value) is type(a) for a in args) else [
            f"{at}: {value!r:.60} is not one of {list(args)}"]
    if origin in (typing.Union, types.UnionType):
        branches = [shape_errors(value, a, at) for a in args]
        if any(not b for b in branches):
            return []
        named = [b for a, b in zip(args, branches) if _names_its_type(value, _bare(a))]
        return [f"{at}: matches no member of the union"] + [e for b in named or branches for e in b][:12]
    if te.is_typeddict(tp):
        if type(value) is not dict:
            return [f"{at}: {type(value).__name__} {value!r:.60} where a {tp.__name__} object is required"]
        hints = te.get_type_hints(tp, include_extras=True)
        errors = [f"{at}: no {k!r}, required in {tp.__name__}" for k in sorted(_required(tp, hints)) if k not in value]
        errors += [f"{at}: {k!r} is not a key of {tp.__name__}" for k in value if k not in hints]
        for key, member in value.items():
            if key in hints:
                errors += shape_errors(member, hints[key], f"{at}.{key}")
        return errors
    if tp in (str, int, float, bool):
        if type(value) is tp or (tp is float and type(value) is int):
            return []
        return [f"{at}: {type(value).__name__} {value!r:.60} where {tp.__name__} is required"]
    if origin in (list, collections.abc.Sequence, collections.abc.Iterable):
        if type(value) is not list:  # a str is iterable, never a list of entries
            return [f"{at}: {type(value).__name__} {value!r:.60} where a list is required"]
        return [e for i, v in enumerate(value) for e in shape_errors(v, args[0], f"{at}[{i}]")]
    if origin in (dict, collections.abc.Mapping):
        if type(value) is not dict:
            return [f"{at}: {type(value).__name__} where an object is required"]
        return [e for k, v in value.items() for e in shape_errors(k, args[0], f"{at} key") + shape_errors(v, args[1], f"{at}.{k}")]
    raise TypeError(f"{at}: no rule for the annotation {tp!r}")


def _bare(annotation: Any) -> Any:
    while te.get_origin(annotation) in (te.Annotated, te.Required, te.NotRequired):
        annotation = te.get_args(annotation)[0]
    return annotation


def _required(tp: Any, hints: dict[str, Any]) -> set[str]:
    """A TypedDict's required keys, from its annotations: the openai package's modules
    have string annotations, which leave ``__required_keys__`` empty."""
    def required(hint: Any) -> bool:
        origin = te.get_origin(hint)
        if origin is te.Annotated:
            return required(te.get_args(hint)[0])
        return True if origin is te.Required else False if origin is te.NotRequired else tp.__total__
    return {key for key, hint in hints.items() if required(hint)}


def _names_its_type(value: Any, tp: Any) -> bool:
    """``value`` names ``tp`` by its ``type`` literal (which union member to blame)."""
    if not (te.is_typeddict(tp) and type(value) is dict):
        return False
    hint = _bare(te.get_type_hints(tp, include_extras=True).get("type"))
    return te.get_origin(hint) is te.Literal and value.get("type") in te.get_args(hint)


def input_item_errors(item: Any, at: str = "item") -> list[str]:
    """Where ``item`` is not a ``ResponseInputItemParam``.

    One reading, where the installed types and the SDK disagree for every local shell
    output, real or repaired: ``LocalShellCallOutput`` names the call ``id`` (required; "the
    unique ID of the local shell tool call generated by the model") and has no ``call_id``,
    while the SDK (agents/run_internal/tool_actions.py) sends ``call_id`` and no ``id``.
    Such an item is checked with its ``call_id`` read as ``id``; the control test shows the
    SDK's own items need this and nothing else."""
    if type(item) is dict and item.get("type") == "local_shell_call_output" and "id" not in item and "call_id" in item:
        item = {("id" if k == "call_id" else k): v for k, v in item.items()}
    return shape_errors(item, ResponseInputItemParam, at)


def all_errors(items: list[Any], what: str) -> list[str]:
    return [e for i, item in enumerate(items) for e in input_item_errors(item, f"{what}[{i}]")]


def test_the_check_takes_every_item_the_sdk_itself_sends(tmp_path: Path) -> None:
    """The control: the SDK's own SQLiteSession over two turns of every tool kind (no
    crash): every item of every model request, and every item it keeps, passes."""
    inputs, items = asyncio.run(reference_run(tmp_path))
    sent = [item for request in inputs for item in request]
    assert {i.get("type") for i in sent} >= {f"{t}_output" for t in (
        "computer_call", "local_shell_call", "shell_call", "apply_patch_call", "custom_tool_call", "function_call")}
    assert all_errors(sent, "sent") == []
    assert all_errors(items, "items") == []


@pytest.mark.parametrize("item", [
    {"type": "computer_call_output", "call_id": "c", "output": "TOOL_OUTCOME_UNKNOWN: ..."},
    {"type": "shell_call_output", "call_id": "c", "output": "TOOL_OUTCOME_UNKNOWN: ..."},
    {"type": "shell_call_output", "call_id": "c", "output": [{"stdout": "", "stderr": "x", "outcome": {"type": "unknown"}}]},
    {"type": "apply_patch_call_output", "call_id": "c", "output": "TOOL_OUTCOME_UNKNOWN: ..."},
    {"type": "apply_patch_call_output", "call_id": "c", "status": "unknown", "output": "x"},
    {"type": "local_shell_call_output", "output": "x"},
    {"type": "function_call_output", "call_id": "c", "output": "x", "code": "TOOL_OUTCOME_UNKNOWN"},
], ids=["computer-text", "shell-text", "shell-outcome", "patch-no-status", "patch-status", "local-no-id", "extra-key"])
def test_the_check_refuses_a_shape_the_types_do_not_describe(item: dict[str, Any]) -> None:
    assert input_item_errors(item) != []


# --- a crash, then the repaired session ------------------------------------------------


class SavedAfterResponse(RunHooks[Any]):
    """Keeps the log as the session's ``on_llm_end`` left it (they run after it): what a
    kill after the response, before any tool started, leaves."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.kept: list[bytes] = []

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        self.kept.append(self.log.read_bytes())


def crashed_log(store: Path, code: str) -> bytes:
    """The log a kill leaves in which every computer, shell, local shell and apply-patch
    call is answered ``code`` by the repair (with UNKNOWN: killed after every tool ran,
    before the Runner saved the turn; with NOT_STARTED: after the response, before any
    tool started, so the function and custom calls are too)."""
    log = store / "s.jsonl"

    async def run() -> bytes:
        model = ScriptedModel([every_kind_of_call(1), [assistant_message("done", item_id="m1")]])
        async with SavedBeforeTurn("s", store=f"jsonl:{store}", log=log) as session:
            after_response = SavedAfterResponse(log)
            await Runner.run(every_kind_agent(model), "go", session=session, hooks=session.run_hooks(after_response))
            return session.before_add[1] if code == UNKNOWN else after_response.kept[0]

    return asyncio.run(run())


@dataclass
class Repaired:
    code: str
    calls: list[str]  # the calls the repair answered
    items: list[Any]  # get_items() of the session opened on the crashed log
    sent: list[Any]  # the next model request's input
    reopened: list[Any]  # get_items() of a later session, after that run
    records: list[dict[str, Any]]


@pytest.fixture(scope="module")
def repaired(tmp_path_factory: pytest.TempPathFactory) -> Any:
    runs: dict[str, Repaired] = {}

    def repaired_run(code: str) -> Repaired:
        if code in runs:
            return runs[code]
        base = tmp_path_factory.mktemp(code.lower())
        (base / "store").mkdir()
        (base / "crashed").mkdir()
        (base / "crashed" / "s.jsonl").write_bytes(crashed_log(base / "store", code))
        with sessionlog.open_store(f"jsonl:{base / 'crashed'}") as store:
            items, sent, reopened = asyncio.run(resume_every_kind(store))
            records = [dict(r) for r in store.read("s")]
            assert_each_output_once(store, reopened, [f"{kind}1" for kind in KINDS])
        kinds = KINDS if code == NOT_STARTED else ["cu", "ls", "sh", "ap"]
        runs[code] = Repaired(code, [f"{kind}1" for kind in kinds], items, sent, reopened, records)
        return runs[code]

    return repaired_run


@pytest.mark.parametrize("code", [UNKNOWN, NOT_STARTED])
def test_after_a_repair_every_item_and_the_next_request_are_valid_input(code: str, repaired: Any) -> None:
    run = repaired(code)
    synthetic = {r["call_id"]: r["code"] for r in run.records if r["type"] == "tool/result" and r.get("synthetic")}
    assert synthetic == dict.fromkeys(run.calls, code)  # the log holds the repair's results as written
    assert all_errors(run.items, "get_items()") == []
    assert all_errors(run.sent, "request input") == []
    calls = [f"{kind}1" for kind in KINDS]
    assert sorted(output_ids(run.items)) == sorted(calls) and output_ids(run.sent) == output_ids(run.items)
    assert run.reopened[:len(run.items)] == run.items  # a later open reads the same view of the log


def recovery_text(run: Repaired, call_id: str) -> str:
    """The text of the log's synthetic ``tool/result`` for ``call_id``."""
    (record,) = [r for r in run.records if r["type"] == "tool/result" and r["call_id"] == call_id]
    assert record["synthetic"] is True and record["code"] == run.code and record["output"].startswith(run.code)
    return record["output"]


def output_of(items: list[Any], call_id: str) -> dict[str, Any]:
    (item,) = [i for i in items if str(i.get("type", "")).endswith("_output") and i.get("call_id") == call_id]
    return item


@pytest.mark.parametrize("code", [UNKNOWN, NOT_STARTED])
def test_a_repaired_shell_call_says_so_in_stderr(code: str, repaired: Any) -> None:
    run = repaired(code)
    item = output_of(run.items, "sh1")
    assert input_item_errors(item) == []
    # No outcome is "unknown": a call that may have run is a timeout (its effects unknown),
    # one that never ran exits 1, as the SDK answers a shell call a human rejected.
    outcome = {"type": "timeout"} if code == UNKNOWN else {"type": "exit", "exit_code": 1}
    assert item["output"] == [{"stdout": "", "stderr": recovery_text(run, "sh1"), "outcome": outcome}]
    assert output_of(run.sent, "sh1") == item


@pytest.mark.parametrize("code", [UNKNOWN, NOT_STARTED])
def test_a_repaired_apply_patch_call_failed_with_the_text(code: str, repaired: Any) -> None:
    run = repaired(code)
    item = output_of(run.items, "ap1")
    assert input_item_errors(item) == []
    assert (item["status"], item["output"]) == ("failed", recovery_text(run, "ap1"))
    assert output_of(run.sent, "ap1") == item


@pytest.mark.parametrize("code", [UNKNOWN, NOT_STARTED])
def test_a_repaired_computer_call_gets_a_placeholder_image_and_a_note(code: str, repaired: Any) -> None:
    """A screenshot has no room for text: the output holds a 1x1 PNG (no screen was
    captured), and a developer message after the step's last output holds the text."""
    run = repaired(code)
    item = output_of(run.items, "cu1")
    assert input_item_errors(item) == []
    assert item["output"]["type"] == "computer_screenshot"
    prefix = "data:image/png;base64,"
    assert item["output"]["image_url"].startswith(prefix)
    image = base64.b64decode(item["output"]["image_url"][len(prefix):], validate=True)
    pil = pytest.importorskip("PIL.Image")
    with pil.open(io.BytesIO(image)) as png:
        png.load()  # decodes: checks every chunk
        assert (png.format, png.size) == ("PNG", (1, 1))
    text = recovery_text(run, "cu1")
    for items in (run.items, run.sent):
        notes = [i for i in items if i.get("type") == "message" and i.get("role") == "developer"]
        assert len(notes) == 1 and notes[0]["content"].startswith(text) and "placeholder" in notes[0]["content"]
        assert input_item_errors(notes[0]) == []
        last_output = max(k for k, i in enumerate(items) if str(i.get("type", "")).endswith("_output"))
        assert items.index(notes[0]) == last_output + 1  # no item between a call and its output


@pytest.mark.parametrize("code, call_id", [(UNKNOWN, "ls1"), (NOT_STARTED, "ls1"), (NOT_STARTED, "f1"),
                                           (NOT_STARTED, "ct1")])
def test_a_repaired_call_whose_output_is_a_string_holds_the_text(code: str, call_id: str, repaired: Any) -> None:
    run = repaired(code)
    item = output_of(run.items, call_id)
    assert input_item_errors(item) == []
    assert item["output"] == recovery_text(run, call_id)
