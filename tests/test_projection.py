"""Provider views: every fixture and every damaged session projects to input that each
provider's pairing rules accept, with every requested call exactly once and one result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from sessions import crashed_sessions
from test_transcript import (
    assert_paired,
    assistant,
    call,
    damaged_sessions,
    numbered,
    requested_ids,
    result,
)

import sessionlog
from sessionlog.contract import read_prefix
from sessionlog.events import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN
from sessionlog.projection import FORMATS, UnknownFormat, check_pairing, project, stream_view

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURE_FILES = sorted(FIXTURES.glob("*.jsonl"))


def _view(store: sessionlog.EventStore, sid: str) -> list[Any]:
    """What `sessionlog show` projects: the durable prefix, then what repair would append."""
    plan = store.repair(sid, force=True, dry_run=True)
    return list(read_prefix(store, sid)) + (list(plan.appended) if plan.status == "repaired" else [])


@pytest.mark.parametrize("fixture", FIXTURE_FILES, ids=[f.stem for f in FIXTURE_FILES])
@pytest.mark.parametrize("fmt", FORMATS)
def test_fixture_views_pass_their_checker(tmp_path: Path, fixture: Path, fmt: str) -> None:
    shutil.copy(fixture, tmp_path / fixture.name)
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        sid = fixture.stem
        for records in (list(read_prefix(store, sid)), _view(store, sid)):
            view = project(records, fmt)
            assert check_pairing(view.items, fmt) is None
            assert_paired(view.items, fmt, records)
            json.dumps(view.to_json())  # JSON-able
        assert fixture.read_bytes() == (tmp_path / fixture.name).read_bytes()  # nothing written


def test_fixtures_are_there() -> None:
    assert len(FIXTURE_FILES) >= 3


@settings(max_examples=250, deadline=None)
@given(damaged_sessions())
def test_damaged_sessions_project_paired_in_every_format(records: list[dict[str, Any]]) -> None:
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None, (fmt, check_pairing(view.items, fmt))
        assert_paired(view.items, fmt, records)


@settings(max_examples=100, deadline=None)
@given(crashed_sessions())
def test_crashed_sessions_project_paired_in_every_format(events: list[dict[str, Any]]) -> None:
    records = numbered(events)
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None
        assert_paired(view.items, fmt, records)


def _mixed() -> list[dict[str, Any]]:
    return numbered([
        {"type": "turn/start", "turn": "t1"},
        {"type": "user/message", "turn": "t1", "content": "deploy and check"},
        {"type": "step/start", "turn": "t1", "step": 1},
        assistant("t1", 1, [("a", "deploy"), ("b", "search"), ("c", "ghost")], content="on it",
                  arguments={"q": "x"}),
        call("t1", 1, "a", "deploy"),
        result("t1", 1, "x9", "orphan"),
        result("t1", 1, "c", "no tool named ghost", True, code="TOOL_NOT_FOUND"),
        result("t1", 1, "c", "dup"),
        {"type": "step/end", "turn": "t1", "step": 1, "status": "error"},
        {"type": "turn/end", "turn": "t1", "status": "error"},
        {"type": "turn/start", "turn": "t2"},
        {"type": "user/message", "turn": "t2", "content": "what happened?"},
    ])


def test_openai_chat_shape() -> None:
    view = project(_mixed(), "openai")
    assert view.to_json().keys() == {"messages"}
    user, asst, a, b, c, user2 = view.items
    assert asst["tool_calls"][0] == {"id": "a", "type": "function",
                                    "function": {"name": "deploy", "arguments": '{"q":"x"}'}}
    assert [m["tool_call_id"] for m in (a, b, c)] == ["a", "b", "c"]
    assert a["content"].startswith(TOOL_OUTCOME_UNKNOWN) and b["content"].startswith(TOOL_NOT_STARTED)
    assert c["content"] == "TOOL_NOT_FOUND: no tool named ghost"
    assert user2 == {"role": "user", "content": "what happened?"}
    assert sum("orphan" in i for i in view.issues) == 1 and sum("duplicate" in i for i in view.issues) == 1
    assert sum("view shows" in i for i in view.issues) == 2


def test_responses_shape() -> None:
    view = project(_mixed(), "responses")
    assert view.to_json().keys() == {"input"}
    kinds = [(i["type"], i.get("role") or i.get("call_id")) for i in view.items]
    assert kinds == [("message", "user"), ("message", "assistant"), ("function_call", "a"), ("function_call", "b"),
                     ("function_call", "c"), ("function_call_output", "a"), ("function_call_output", "b"),
                     ("function_call_output", "c"), ("message", "user")]
    assert view.items[2]["arguments"] == '{"q":"x"}'


def test_anthropic_shape_results_open_the_next_user_message() -> None:
    view = project(_mixed(), "anthropic")
    user, asst, results = view.items
    assert [b["type"] for b in asst["content"]] == ["text", "tool_use", "tool_use", "tool_use"]
    assert asst["content"][1]["input"] == {"q": "x"}
    assert [b.get("tool_use_id") or b["type"] for b in results["content"]] == ["a", "b", "c", "text"]
    assert all(b["is_error"] is True for b in results["content"][:3])
    assert results["content"][3] == {"type": "text", "text": "what happened?"}


def test_is_error_false_is_not_an_error_block() -> None:
    records = numbered([assistant("t1", 1, [("a", "read_file")]), result("t1", 1, "a", "fine")])
    (_, res) = project(records, "anthropic").items
    assert res["content"] == [{"type": "tool_result", "tool_use_id": "a", "content": "fine"}]


def test_string_arguments_are_kept_as_json_text_and_decoded_for_anthropic() -> None:
    records = numbered([assistant("t1", 1, [("a", "read_file")], arguments='{"path": "/x"}'),
                        result("t1", 1, "a", "x")])
    assert project(records, "openai").items[0]["tool_calls"][0]["function"]["arguments"] == '{"path": "/x"}'
    assert project(records, "anthropic").items[0]["content"][0]["input"] == {"path": "/x"}


def test_projection_writes_nothing_and_keeps_the_log() -> None:
    records = _mixed()
    before = json.dumps(records)
    for fmt in FORMATS:
        project(records, fmt)
    assert json.dumps(records) == before


def test_unknown_format() -> None:
    with pytest.raises(UnknownFormat):
        project([], "gemini")
    with pytest.raises(UnknownFormat):
        check_pairing([], "gemini")


# --- the checkers name the first violation --------------------------------------------


def test_openai_checker_violations() -> None:
    asst = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    tool_a = {"role": "tool", "tool_call_id": "a", "content": "A"}
    tool_b = {"role": "tool", "tool_call_id": "b", "content": "B"}
    user = {"role": "user", "content": "hi"}
    assert check_pairing([user, asst, tool_b, tool_a], "openai") is None  # any order is valid
    v = check_pairing([user, asst, tool_a, user], "openai")
    assert (v.call_id, v.index) == ("b", 3) and "'b'" in v.message and "message 3" in v.message
    v = check_pairing([user, asst, tool_a], "openai")
    assert (v.call_id, v.index) == ("b", 3)
    v = check_pairing([user, tool_a], "openai")
    assert (v.call_id, v.index) == ("a", 1)
    v = check_pairing([asst, tool_a, tool_b, tool_b], "openai")
    assert (v.call_id, v.index) == ("b", 3)
    bad_args = json.loads(json.dumps(asst))
    bad_args["tool_calls"][1]["function"]["arguments"] = {}
    assert check_pairing([bad_args, tool_a, tool_b], "openai").call_id == "b"


def test_responses_checker_violations() -> None:
    fc = lambda cid: {"type": "function_call", "call_id": cid, "name": "f", "arguments": "{}"}  # noqa: E731
    out = lambda cid: {"type": "function_call_output", "call_id": cid, "output": "x"}  # noqa: E731
    assert check_pairing([fc("a"), fc("b"), out("b"), out("a")], "responses") is None
    v = check_pairing([fc("a"), fc("b"), out("a")], "responses")
    assert (v.call_id, v.index) == ("b", 1)
    v = check_pairing([out("a"), fc("a")], "responses")
    assert (v.call_id, v.index) == ("a", 0)
    v = check_pairing([fc("a"), out("a"), out("a")], "responses")
    assert (v.call_id, v.index) == ("a", 2)
    # a continuation of a server-side conversation sends only the outputs
    assert check_pairing([out("a")], "responses", server_calls={"a"}) is None
    assert check_pairing([out("a"), out("a")], "responses", server_calls={"a"}).index == 1


def test_anthropic_checker_violations() -> None:
    asst = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}},
                                             {"type": "tool_use", "id": "b", "name": "f", "input": {}}]}
    res = lambda cid, **kw: {"type": "tool_result", "tool_use_id": cid, "content": "x", **kw}  # noqa: E731
    text = {"type": "text", "text": "and"}
    assert check_pairing([asst, {"role": "user", "content": [res("b"), res("a", is_error=True), text]}],
                         "anthropic") is None
    v = check_pairing([asst, {"role": "user", "content": [res("a"), text, res("b")]}], "anthropic")
    assert (v.call_id, v.index) == ("b", 1)
    v = check_pairing([asst, {"role": "user", "content": [res("a")]}], "anthropic")
    assert (v.call_id, v.index) == ("b", 1)
    v = check_pairing([asst], "anthropic")
    assert (v.call_id, v.index) == ("a", 0)
    v = check_pairing([asst, {"role": "user", "content": [res("a"), res("b"), res("b")]}], "anthropic")
    assert (v.call_id, v.index) == ("b", 1)
    v = check_pairing([{"role": "user", "content": [res("z")]}], "anthropic")
    assert (v.call_id, v.index) == ("z", 0)


def test_view_of_damaged_session_every_call_once(tmp_path: Path) -> None:
    """The same through a store: a crashed parallel step, shown the way `show` shows it."""
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1", [
            {"type": "turn/start", "turn": "t1"},
            {"type": "step/start", "turn": "t1", "step": 1},
            assistant("t1", 1, [("a", "deploy"), ("b", "search")]),
            call("t1", 1, "b", "search"),
        ])
        records = _view(store, "s1")
        assert requested_ids(records) == ["a", "b"]
        for fmt in FORMATS:
            view = project(records, fmt)
            assert check_pairing(view.items, fmt) is None
            assert view.issues == []  # repair's own results are in the view, nothing made up
            assert_paired(view.items, fmt, records)


# --- every log that scans clean projects to a view its checker accepts --------------------


def _repaired_store(events: list[dict[str, Any]], store: Any = None) -> list[Any]:
    """``events`` in a memory store, repaired the way `sessionlog repair` does it."""
    store = store or sessionlog.open_store("memory:")
    store.create("s1", events)
    store.repair("s1")
    assert store.scan("s1").status == "clean"
    return list(store.read("s1"))


def test_a_call_id_reused_in_a_later_turn_gets_its_own_id_in_every_view() -> None:
    store = sessionlog.open_store("memory:")
    records = _repaired_store([
        {"type": "turn/start", "turn": "t1"},
        assistant("t1", 1, [("c1", "search")]),
        result("t1", 1, "c1", "first"),
        {"type": "turn/end", "turn": "t1", "status": "completed"},
        {"type": "turn/start", "turn": "t2"},
        assistant("t2", 1, [("c1", "deploy")]),  # seq 7
        call("t2", 1, "c1", "deploy"),
    ], store)
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None, (fmt, check_pairing(view.items, fmt))
        assert view.call_ids == ["c1", "c1"] and view.view_ids == ["c1", "call_7_0"]
        assert any("'call_7_0'" in i and "earlier call" in i for i in view.issues)
    chat = project(records, "openai").items
    assert chat[1] == {"role": "tool", "tool_call_id": "c1", "content": "first"}
    assert chat[3]["tool_call_id"] == "call_7_0" and chat[3]["content"].startswith(TOOL_OUTCOME_UNKNOWN)
    # names never change as the log grows (a later call with the name the view gave is renamed)
    last = store.append("s1", [{"type": "turn/start", "turn": "t3"}, assistant("t3", 1, [("call_7_0", "x")])])
    assert project(list(store.read("s1")), "responses").view_ids == ["c1", "call_7_0", f"call_{last}_0"]


def test_an_empty_call_id_that_repair_answered_passes_every_check() -> None:
    records = _repaired_store([
        {"type": "turn/start", "turn": "t1"},
        assistant("t1", 1, [("", "deploy"), ("ok", "search")]),
        call("t1", 1, "", "deploy"),
    ])
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None, (fmt, check_pairing(view.items, fmt))
        assert view.view_ids == ["call_3_0", "ok"]


def test_ids_other_providers_refuse_are_renamed() -> None:
    long_id = "x" * 41
    records = numbered([assistant("t1", 1, [("functions.get:0", "get"), (long_id, "get")]),
                        result("t1", 1, "functions.get:0", "A"), result("t1", 1, long_id, "B")])
    view = project(records, "anthropic")
    assert view.view_ids == ["call_2_0", "call_2_1"] and check_pairing(view.items, "anthropic") is None
    assert [b["content"] for b in view.items[1]["content"]] == ["A", "B"]


def test_checkers_refuse_ids_a_provider_refuses() -> None:
    def chat(cid: str) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": cid, "content": "x"}]

    assert check_pairing(chat("a") + chat("b"), "openai") is None
    v = check_pairing(chat("a") + chat("a"), "openai")
    assert (v.call_id, v.index) == ("a", 2) and "repeated" in v.message
    assert "40" in check_pairing(chat("x" * 41), "openai").message

    def claude(cid: str) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": [{"type": "tool_use", "id": cid, "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": cid, "content": "x"}]}]

    assert check_pairing(claude("a") + claude("b"), "anthropic") is None
    v = check_pairing(claude("a") + claude("a"), "anthropic")
    assert (v.call_id, v.index) == ("a", 2) and "repeated" in v.message
    assert check_pairing(claude("functions.f:0"), "anthropic").index == 0
    assert check_pairing(claude(""), "anthropic").index == 0

    fc = {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "a", "output": "x"}
    msg = {"type": "message", "role": "user", "content": "hi"}
    assert check_pairing([fc, out, msg], "responses") is None
    v = check_pairing([fc, msg, out], "responses")
    assert (v.call_id, v.index) == ("a", 1)
    assert check_pairing([fc, out, dict(fc), dict(out)], "responses").index == 2


def test_show_check_passes_for_a_reused_call_id(tmp_path: Path) -> None:
    from sessionlog.cli import main

    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1", [
            {"type": "turn/start", "turn": "t1"}, assistant("t1", 1, [("c1", "search")]),
            result("t1", 1, "c1", "first"), {"type": "turn/end", "turn": "t1", "status": "completed"},
            {"type": "turn/start", "turn": "t2"}, assistant("t2", 1, [("c1", "deploy")]),
            call("t2", 1, "c1", "deploy"),
        ])
        assert store.repair("s1").status == "repaired"
    for fmt in FORMATS:
        assert main(["show", str(tmp_path / "s1.jsonl"), "--format", fmt, "--check"]) == 0


@pytest.mark.parametrize(("arguments", "carried"), [
    ("rm -rf build", "rm -rf build"), ("", ""), ("NaN", "NaN"), ('{"a": NaN}', '{"a": NaN}'),
    ('{"path": "/x"', '{"path": "/x"'),  # not JSON: the text itself
    ("[1, 2]", [1, 2]), ('"x"', "x"), ("null", None),  # JSON, not an object: its value
    ([1, 2], [1, 2]), (3, 3),
])
def test_arguments_that_are_not_a_json_object_are_carried_wrapped_and_named(arguments: Any, carried: Any) -> None:
    """DESIGN: a call's arguments are a JSON object, and providers take nothing else (a
    model's truncated arguments bricked many conversations on replay). Every view carries
    them as ``{"arguments": <them>}``, which the model can still read, names the call and
    its record in its issues, and passes the check; the check itself still rejects such
    arguments in items built elsewhere, naming the message and the call."""
    records = numbered([{"type": "user/message", "turn": "t1", "content": "go"}, assistant("t1", 1, [("c1", "run")], arguments=arguments),
                        result("t1", 1, "c1", "done")])
    for fmt in FORMATS:
        view = project(records, fmt)
        [issue] = [i for i in view.issues if "arguments" in i]
        assert issue.startswith("call 'c1' of assistant message seq 3: its arguments are not a JSON object")
        assert check_pairing(view.items, fmt) is None
        with stream_view(lambda: iter(records), fmt) as streamed:
            assert list(streamed.issues()) == view.issues and list(streamed.items()) == view.items
    [message] = [m for m in project(records, "openai").items if m.get("tool_calls")]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"arguments": carried}
    message["tool_calls"][0]["function"]["arguments"] = arguments if isinstance(arguments, str) else json.dumps(arguments)
    violation = check_pairing([message], "openai")
    assert violation is not None and (violation.call_id, violation.index) == ("c1", 0)
    assert violation.message.startswith("message 0: call 'c1' arguments are not a JSON object text (")


@pytest.mark.parametrize("arguments", ['{"path": "/x"}', "{}", ' { } ', {"path": "/x"}, None])
def test_openai_check_takes_arguments_that_are_a_json_object(arguments: Any) -> None:
    records = numbered([assistant("t1", 1, [("c1", "run")], arguments=arguments), result("t1", 1, "c1", "done")])
    view = project(records, "openai")
    assert check_pairing(view.items, "openai") is None and not [i for i in view.issues if "arguments" in i]


def test_show_check_passes_a_call_whose_arguments_are_not_json_and_says_so(tmp_path: Path, capsys: Any) -> None:
    """`sessionlog show --check` on a log whose assistant message carries a shell line
    where its arguments belong: every view passes (exit 0), carrying the line wrapped in
    an object, and standard error names the record (seq) and the call."""
    from sessionlog.cli import main

    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1", [
            {"type": "turn/start", "turn": "t1"}, {"type": "user/message", "turn": "t1", "content": "clean up"},
            assistant("t1", 1, [("c1", "shell")], arguments="rm -rf build"), call("t1", 1, "c1", "shell"),
            result("t1", 1, "c1", "removed"), {"type": "turn/end", "turn": "t1", "status": "completed"},
        ])
    log = str(tmp_path / "s1.jsonl")
    for fmt in FORMATS:
        capsys.readouterr()
        assert main(["show", log, "--format", fmt, "--check"]) == 0
        out, err = capsys.readouterr()
        assert "call 'c1' of assistant message seq 4: its arguments are not a JSON object" in err
        assert "rm -rf build" in out
    for fmt in ("responses", "anthropic"):
        assert main(["show", log, "--format", fmt, "--check"]) == 0


# --- system messages ---------------------------------------------------------------------


def _with_system() -> list[dict[str, Any]]:
    return numbered([
        {"type": "system/message", "content": "You are terse."},
        {"type": "turn/start", "turn": "t1"},
        {"type": "user/message", "turn": "t1", "content": "hi"},
        assistant("t1", 1, [("a", "read_file")]),
        result("t1", 1, "a", "A"),
        {"type": "system/message", "turn": "t1", "content": "You are very terse."},
        {"type": "user/message", "turn": "t1", "content": "again"},
    ])


def test_system_messages_are_where_each_provider_expects_them() -> None:
    records = _with_system()
    chat = project(records, "openai")
    assert [m["role"] for m in chat.items] == ["system", "user", "assistant", "tool", "system", "user"]
    assert chat.items[0] == {"role": "system", "content": "You are terse."}
    assert chat.items[4] == {"role": "system", "content": "You are very terse."}
    responses = project(records, "responses")
    assert responses.items[0] == {"type": "message", "role": "system", "content": "You are terse."}
    assert [i.get("role") for i in responses.items].count("system") == 2
    claude = project(records, "anthropic")
    assert claude.system == "You are very terse."  # the instructions in force
    assert claude.to_json() == {"system": "You are very terse.", "messages": claude.items}
    assert all(m["role"] in ("user", "assistant") for m in claude.items)
    assert any("replaced" in i for i in claude.issues)
    for fmt in FORMATS:
        assert check_pairing(project(records, fmt).items, fmt) is None
    assert "system" not in project([r for r in records if r["type"] != "system/message"], "anthropic").to_json()


def test_unknown_format_is_a_sessionlog_error() -> None:
    with pytest.raises(sessionlog.SessionLogError):
        project([], "gemini")
    assert issubclass(UnknownFormat, ValueError)
    assert sessionlog.UnknownFormat is UnknownFormat and "UnknownFormat" in sessionlog.__all__


@pytest.mark.parametrize("fmt", FORMATS)
def test_check_pairing_rejects_an_item_that_is_not_an_object(fmt):
    """Every provider rejects a request whose items are not JSON objects."""
    for junk in (5, None, "user: hi", ["role", "user"]):
        violation = check_pairing([junk], fmt)
        assert violation is not None and violation.index == 0 and "not an object" in violation.message
    good = project([], fmt).items
    assert check_pairing([*good, 7], fmt).index == len(good)
