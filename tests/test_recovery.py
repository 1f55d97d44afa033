"""Live step recovery: a step that fails after its assistant message was committed leaves
every call answered (right codes, call order), the step and turn closed with ``error`` /
``aborted``, the original exception propagating, and nothing for crash repair to do."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_transcript import assert_paired, assistant, call, result

import sessionlog
from sessionlog.backends.jsonl import open_jsonl
from sessionlog.durable import FileSystem
from sessionlog.events import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN
from sessionlog.delivery import pending_deliveries
from sessionlog.projection import FORMATS, check_pairing, project
from sessionlog.recovery import (
    TOOL_NOT_FOUND,
    CallNotPending,
    OutsideStep,
    StepScope,
    ToolOutcome,
    dispatch_tools,
    failure_status,
)


class SchedulerError(RuntimeError):
    pass


@pytest.fixture(params=["memory", "jsonl"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionlog.EventStore]:
    url = "memory:" if request.param == "memory" else f"jsonl:{tmp_path / 'store'}"
    with sessionlog.open_store(url) as st_:
        st_.create("s1", [{"type": "turn/start", "turn": "t1"},
                          {"type": "user/message", "turn": "t1", "content": "go"}])
        yield st_


def tail(store: sessionlog.EventStore, after: int = 3) -> list[tuple[Any, ...]]:
    """The records after the user message, as (type, call_id or status, code)."""
    out = []
    for r in store.read("s1", after_seq=after):
        out.append((r.type, r.get("call_id") or r.get("status"), r.get("code")))
    return out


def assert_clean_after(store: sessionlog.EventStore) -> None:
    report = store.repair("s1")
    assert report.status == "clean" and report.appended == []
    assert store.scan("s1").status == sessionlog.Status.CLEAN
    records = list(store.read("s1"))
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None and view.issues == []
        assert_paired(view.items, fmt, records)


CALLS = [("a", "deploy"), ("b", "search"), ("c", "read_file")]


def test_failure_before_any_dispatch(store: sessionlog.EventStore) -> None:
    boom = SchedulerError("scheduler broke before dispatch")
    with store.session("s1") as h, pytest.raises(SchedulerError) as raised:
        with StepScope(h, turn="t1") as scope:
            scope.append([{"type": "step/start", "turn": "t1", "step": 1}, assistant("t1", 1, CALLS)])
            raise boom
    assert raised.value is boom and not getattr(boom, "__notes__", None)
    assert tail(store) == [
        ("step/start", None, None), ("assistant/message", None, None),
        ("tool/result", "a", TOOL_NOT_STARTED), ("tool/result", "b", TOOL_NOT_STARTED),
        ("tool/result", "c", TOOL_NOT_STARTED), ("step/end", "error", None), ("turn/end", "error", None),
    ]
    synthetic = [r for r in store.read("s1") if r.type == "tool/result"]
    assert all(r["synthetic"] is True and r["is_error"] is True for r in synthetic)
    assert_clean_after(store)


def test_failure_after_some_dispatches_keeps_committed_results(store: sessionlog.EventStore) -> None:
    with store.session("s1") as h, pytest.raises(SchedulerError):
        with StepScope(h, turn="t1") as scope:
            scope.append([{"type": "step/start", "turn": "t1", "step": 1}, assistant("t1", 1, CALLS)])
            scope.append([call("t1", 1, "a", "deploy"), call("t1", 1, "c", "read_file")])
            scope.append([result("t1", 1, "c", "contents")])
            raise SchedulerError("after dispatch")
    assert tail(store) == [
        ("step/start", None, None), ("assistant/message", None, None),
        ("tool/call", "a", None), ("tool/call", "c", None), ("tool/result", "c", None),
        ("tool/result", "a", TOOL_OUTCOME_UNKNOWN), ("tool/result", "b", TOOL_NOT_STARTED),
        ("step/end", "error", None), ("turn/end", "error", None),
    ]
    unknown = next(r for r in store.read("s1") if r.get("code") == TOOL_OUTCOME_UNKNOWN)
    assert unknown["call_seq"] == 6  # the durable tool/call it rests on
    assert_clean_after(store)


def test_keyboard_interrupt_is_aborted(store: sessionlog.EventStore) -> None:
    with store.session("s1") as h, pytest.raises(KeyboardInterrupt):
        with StepScope(h, turn="t1") as scope:
            scope.append([{"type": "step/start", "turn": "t1", "step": 1}, assistant("t1", 1, CALLS[:1])])
            raise KeyboardInterrupt
    assert tail(store)[-3:] == [("tool/result", "a", TOOL_NOT_STARTED), ("step/end", "aborted", None),
                                ("turn/end", "aborted", None)]
    assert_clean_after(store)


def test_failure_before_the_assistant_message_closes_step_and_turn(store: sessionlog.EventStore) -> None:
    with store.session("s1") as h, pytest.raises(SchedulerError):
        with StepScope(h, turn="t1") as scope:
            scope.append([{"type": "step/start", "turn": "t1", "step": 1}])
            raise SchedulerError("model request failed")
    assert tail(store) == [("step/start", None, None), ("step/end", "error", None), ("turn/end", "error", None)]
    assert_clean_after(store)


def test_normal_exit_writes_nothing(store: sessionlog.EventStore) -> None:
    with store.session("s1") as h, StepScope(h, turn="t1") as scope:
        scope.append([{"type": "step/start", "turn": "t1", "step": 1}])
    assert tail(store) == [("step/start", None, None)]
    assert scope.recovered == []


def test_results_appended_behind_the_scope_are_not_answered_twice(store: sessionlog.EventStore) -> None:
    with store.session("s1") as h, pytest.raises(SchedulerError):
        with StepScope(h, turn="t1") as scope:
            scope.append([{"type": "step/start", "turn": "t1", "step": 1}, assistant("t1", 1, CALLS[:2])])
            h.append([call("t1", 1, "b", "search"), result("t1", 1, "b", "found")])  # not through the scope
            raise SchedulerError("x")
    results = [(r["call_id"], r.get("code")) for r in store.read("s1") if r.type == "tool/result"]
    assert results == [("b", None), ("a", TOOL_NOT_STARTED)]
    assert_clean_after(store)


def test_close_turn_false_ends_only_the_step(store: sessionlog.EventStore) -> None:
    with store.session("s1") as h, pytest.raises(SchedulerError):
        with StepScope(h, turn="t1", close_turn=False) as scope:
            scope.append([{"type": "step/start", "turn": "t1", "step": 1}])
            raise SchedulerError("retry me")
    assert tail(store)[-1] == ("step/end", "error", None)


def test_recording_failure_is_attached_and_the_original_propagates(tmp_path: Path) -> None:
    with sessionlog.open_store(f"jsonl:{tmp_path}") as store:
        store.create("s1", [{"type": "turn/start", "turn": "t1"}])
        boom = SchedulerError("original")
        with pytest.raises(SchedulerError) as raised:
            h = store.session("s1")
            with StepScope(h, turn="t1") as scope:
                scope.append([{"type": "step/start", "turn": "t1", "step": 1}, assistant("t1", 1, CALLS[:2])])
                h.close()  # the handle is gone: recovery cannot append
                raise boom
        assert raised.value is boom
        assert any("live step recovery could not record" in n for n in boom.__notes__)
        assert isinstance(boom.__context__, sessionlog.StoreClosed)
        # crash repair closes the same calls with the same codes
        report = store.repair("s1")
        assert [(r.get("call_id"), r.get("code"), r.get("status")) for r in report.appended] == [
            ("a", TOOL_NOT_STARTED, None), ("b", TOOL_NOT_STARTED, None), (None, None, "interrupted"),
            (None, None, "interrupted")]


def test_failure_status() -> None:
    assert failure_status(asyncio.CancelledError()) == "aborted"
    assert failure_status(KeyboardInterrupt()) == "aborted"
    assert failure_status(ValueError()) == "error"


# --- asyncio, with the parallel dispatcher ---------------------------------------------


class AsyncHandle:
    """A session handle whose append is a coroutine (a runtime's async store adapter)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    @property
    def last_seq(self) -> int:
        return self.handle.last_seq

    async def append(self, events: Any, *, expect_seq: int | None = None) -> int:
        await asyncio.sleep(0)
        return self.handle.append(events, expect_seq=expect_seq)


def _wrap(h: Any, kind: str) -> Any:
    return AsyncHandle(h) if kind == "async-append" else h


FOUR = [("a", "deploy"), ("b", "search"), ("c", "read_file"), ("d", "deploy")]


@pytest.mark.parametrize("kind", ["to-thread", "async-append"])
def test_dispatch_failure_with_errors_raise_stops_new_calls_and_waits_for_started(store: sessionlog.EventStore, kind: str) -> None:
    finished: list[str] = []

    async def deploy(args: Any) -> str:
        await asyncio.sleep(0.05)  # still running when search fails
        finished.append("deploy")
        return "deployed"

    async def search(args: Any) -> str:
        await asyncio.sleep(0.01)
        raise SchedulerError("search crashed the scheduler")

    async def step(h: Any) -> None:
        message = assistant("t1", 1, FOUR)
        async with StepScope(h, turn="t1") as scope:
            await scope.append_async([{"type": "step/start", "turn": "t1", "step": 1}, message])
            await dispatch_tools(scope, message["tool_calls"], {"deploy": deploy, "search": search, "read_file": search},
                                 concurrency=2, errors="raise")

    with store.session("s1") as h, pytest.raises(SchedulerError, match="search crashed"):
        asyncio.run(step(_wrap(h, kind)))
    assert finished == ["deploy"]
    assert tail(store) == [
        ("step/start", None, None), ("assistant/message", None, None),
        # b's scope answers b when its body fails (it may have done part of its work), while a runs on.
        ("tool/call", "a", None), ("tool/call", "b", None), ("tool/result", "b", TOOL_OUTCOME_UNKNOWN),
        ("tool/result", "a", None), ("tool/result", "c", TOOL_NOT_STARTED),
        ("tool/result", "d", TOOL_NOT_STARTED), ("step/end", "error", None), ("turn/end", "error", None),
    ]
    assert_clean_after(store)


@pytest.mark.parametrize("kind", ["to-thread", "async-append"])
def test_cancellation_aborts_the_step(store: sessionlog.EventStore, kind: str) -> None:
    started: list[str] = []  # one per slow body running

    async def slow(args: Any) -> str:
        started.append("slow")
        if len(started) == 2:
            both_running.set()
        await asyncio.sleep(10)
        return "never"

    async def quick(args: Any) -> ToolOutcome:
        return ToolOutcome("quick error", is_error=True)

    async def main(h: Any) -> None:
        message = assistant("t1", 1, [("q", "quick"), ("s", "slow"), ("g", "ghost"), ("z", "slow")])

        async def step() -> None:
            async with StepScope(h, turn="t1") as scope:
                await scope.append_async([{"type": "step/start", "turn": "t1", "step": 1}, message])
                await dispatch_tools(scope, message["tool_calls"], {"quick": quick, "slow": slow}, concurrency=2)

        nonlocal both_running
        both_running = asyncio.Event()
        task = asyncio.create_task(step())
        # Cancel once both slow bodies run (q answered, g not found, z's call durable),
        # whatever the machine's speed.
        await asyncio.wait_for(both_running.wait(), 30)
        task.cancel()
        await task

    both_running: asyncio.Event
    with store.session("s1") as h, pytest.raises(asyncio.CancelledError):
        asyncio.run(main(_wrap(h, kind)))
    assert tail(store) == [
        ("step/start", None, None), ("assistant/message", None, None),
        ("tool/call", "q", None), ("tool/call", "s", None), ("tool/result", "q", None),
        ("tool/result", "g", TOOL_NOT_FOUND), ("tool/call", "z", None),
        ("tool/result", "s", TOOL_OUTCOME_UNKNOWN), ("tool/result", "z", TOOL_OUTCOME_UNKNOWN),
        ("step/end", "aborted", None), ("turn/end", "aborted", None),
    ]
    assert_clean_after(store)


def test_async_success_writes_results_and_nothing_else(store: sessionlog.EventStore) -> None:
    async def echo(args: Any) -> str:
        return f"echo {args['n']}"

    async def main(h: Any) -> None:
        message = assistant("t1", 1, CALLS)
        async with StepScope(h, turn="t1") as scope:
            await scope.append_async([{"type": "step/start", "turn": "t1", "step": 1}, message])
            await dispatch_tools(scope, message["tool_calls"], {"deploy": echo, "search": echo, "read_file": echo})
            await scope.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                                      {"type": "turn/end", "turn": "t1", "status": "completed"}])
        assert scope.recovered == []

    with store.session("s1") as h:
        asyncio.run(main(h))
    outputs = [r["output"] for r in store.read("s1") if r.type == "tool/result"]
    assert sorted(outputs) == ["echo 0", "echo 1", "echo 2"]
    assert_clean_after(store)


# --- any failure point ----------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_failure_at_any_point_of_a_step(data: st.DataObject) -> None:
    n = data.draw(st.integers(0, 4))
    calls = [(f"c{i}", "tool") for i in range(n)]
    steps: list[list[dict[str, Any]]] = [[{"type": "step/start", "turn": "t1", "step": 1}],
                                         [assistant("t1", 1, calls)]]
    lanes = [[call("t1", 1, cid, "tool"), result("t1", 1, cid, "out")] for cid, _ in calls]
    while any(lanes):
        lane = data.draw(st.sampled_from([lane for lane in lanes if lane]))
        steps.append([lane.pop(0)])
    fail_after = data.draw(st.integers(0, len(steps)))
    cancelled = data.draw(st.booleans())
    with sessionlog.open_store("memory:") as store:
        store.create("s1", [{"type": "turn/start", "turn": "t1"},
                            {"type": "user/message", "turn": "t1", "content": "go"}])
        exc: BaseException = KeyboardInterrupt() if cancelled else SchedulerError("x")
        with store.session("s1") as h, pytest.raises(type(exc)):
            with StepScope(h, turn="t1") as scope:
                for batch in steps[:fail_after]:
                    scope.append(batch)
                raise exc
        records = list(store.read("s1"))
        committed_calls = {r["call_id"]: r.seq for r in records if r.type == "tool/call"}
        by_call = {}
        for r in records:
            if r.type == "tool/result":
                assert r["call_id"] not in by_call  # exactly one result per call
                by_call[r["call_id"]] = r
        if fail_after >= 2:
            assert list(by_call) == [cid for cid, _ in calls] or set(by_call) == {cid for cid, _ in calls}
            synthetic = [r for r in records if r.get("synthetic")]
            ordered = [r["call_id"] for r in synthetic if r.type == "tool/result"]
            assert ordered == [cid for cid, _ in calls if cid in ordered]  # call order
            for r in synthetic:
                if r.type == "tool/result":
                    want = TOOL_OUTCOME_UNKNOWN if r["call_id"] in committed_calls else TOOL_NOT_STARTED
                    assert r["code"] == want
        status = "aborted" if cancelled else "error"
        ends = [(r.type, r["status"]) for r in records if r.type in ("step/end", "turn/end")]
        assert ends == ([("step/end", status)] if fail_after >= 1 else []) + [("turn/end", status)]
        assert store.repair("s1").status == "clean"


def test_a_second_cancellation_does_not_interrupt_recovery(store: sessionlog.EventStore) -> None:
    class SlowAppend(AsyncHandle):
        async def append(self, events: Any, *, expect_seq: int | None = None) -> int:
            await asyncio.sleep(0.05)
            return self.handle.append(events, expect_seq=expect_seq)

    async def main(h: Any) -> None:
        async def step() -> None:
            try:
                async with StepScope(h, turn="t1") as scope:
                    await scope.append_async([{"type": "step/start", "turn": "t1", "step": 1},
                                              assistant("t1", 1, CALLS[:2])])
                    await asyncio.sleep(10)
            except BaseException as exc:
                seen.append(exc)
                raise

        task = asyncio.create_task(step())
        await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.sleep(0.01)  # recovery's append is in flight now
        task.cancel()
        await task

    seen: list[BaseException] = []
    with store.session("s1") as h, pytest.raises(asyncio.CancelledError):
        asyncio.run(main(SlowAppend(h)))
    (original,) = seen
    assert isinstance(original, asyncio.CancelledError)
    notes = getattr(original, "__notes__", [])
    assert not any("could not record" in n for n in notes)
    assert any("cancelled again" in n for n in notes)
    assert tail(store)[-4:] == [("tool/result", "a", TOOL_NOT_STARTED), ("tool/result", "b", TOOL_NOT_STARTED),
                                ("step/end", "aborted", None), ("turn/end", "aborted", None)]
    assert_clean_after(store)


def test_a_call_id_repeated_in_one_message_runs_once(store: sessionlog.EventStore) -> None:
    store.create("r", [{"type": "turn/start", "turn": "t"}, {"type": "step/start", "turn": "t", "step": 1}])
    runs: list[Any] = []

    async def tool(arguments: Any) -> ToolOutcome:
        runs.append(arguments)
        return ToolOutcome("ok")

    calls = [{"id": "a", "name": "t", "arguments": {"i": 1}}, {"id": "a", "name": "t", "arguments": {"i": 2}},
             {"id": "b", "name": "t", "arguments": {}}]

    async def main() -> None:
        with store.session("r") as handle:
            scope = StepScope(handle, turn="t", step=1)
            scope.append([{"type": "assistant/message", "turn": "t", "step": 1, "content": None, "tool_calls": calls}])
            await dispatch_tools(scope, calls, {"t": tool})

    asyncio.run(main())
    assert runs == [{"i": 1}, {}]
    assert [r["call_id"] for r in store.read("r") if r["type"] == "tool/call"] == ["a", "b"]


def test_a_repeated_call_id_keeps_the_assistants_order(store: sessionlog.EventStore) -> None:
    store.create("r", [{"type": "turn/start", "turn": "t"}, {"type": "step/start", "turn": "t", "step": 1}])
    runs: list[Any] = []

    async def tool(arguments: Any) -> str:
        runs.append(arguments["i"])
        return "ok"

    calls = [{"id": "a", "name": "t", "arguments": {"i": 1}}, {"id": "b", "name": "t", "arguments": {"i": 2}},
             {"id": "a", "name": "t", "arguments": {"i": 3}}]

    async def main() -> None:
        with store.session("r") as handle:
            scope = StepScope(handle, turn="t", step=1)
            scope.append([{"type": "assistant/message", "turn": "t", "step": 1, "content": None, "tool_calls": calls}])
            await dispatch_tools(scope, calls, {"t": tool}, concurrency=1)

    asyncio.run(main())
    assert runs == [1, 2]  # the first occurrence, in the assistant's order
    assert [r["call_id"] for r in store.read("r") if r["type"] == "tool/call"] == ["a", "b"]
    assert [r["call_id"] for r in store.read("r") if r["type"] == "tool/result"] == ["a", "b"]


def test_dispatch_outside_a_step_is_refused(store: sessionlog.EventStore) -> None:
    async def tool(arguments: Any) -> str:
        raise AssertionError("must not run")

    async def main() -> None:
        with store.session("s1") as handle:
            scope = StepScope(handle, turn="t1")  # the turn is open, no step is
            with pytest.raises(sessionlog.SessionLogError, match="outside a step"):
                await dispatch_tools(scope, [{"id": "a", "name": "t", "arguments": {}}], {"t": tool})

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "turn/start", "user/message"]


def test_a_raising_tool_is_an_error_result_and_the_step_goes_on(store: sessionlog.EventStore) -> None:
    ran: list[str] = []

    async def deploy(args: Any) -> str:
        ran.append("deploy")
        return "deployed"

    async def search(args: Any) -> str:
        raise SchedulerError("index offline")

    async def step(h: Any) -> None:
        message = assistant("t1", 1, FOUR)
        async with StepScope(h, turn="t1") as scope:
            await scope.append_async([{"type": "step/start", "turn": "t1", "step": 1}, message])
            await dispatch_tools(scope, message["tool_calls"], {"deploy": deploy, "search": search, "read_file": search},
                                 concurrency=1)
            await scope.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"}])

    with store.session("s1") as h:
        asyncio.run(step(h))
    assert ran == ["deploy", "deploy"]
    results = {r["call_id"]: r for r in store.read("s1") if r["type"] == "tool/result"}
    assert [results[c]["is_error"] for c in "abcd"] == [False, True, True, False]
    assert results["b"]["code"] == "TOOL_ERROR" and "SchedulerError: index offline" in results["b"]["output"]
    assert tail(store)[-1] == ("step/end", "completed", None)


# --- checkpoints over write-behind ------------------------------------------------------


class FlakyFS(FileSystem):
    """Fails the next ``fail`` syncs (the engine's one I/O seam)."""

    def __init__(self) -> None:
        self.fail = 0

    def fdatasync(self, fd: int) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError(errno.EIO, "injected")
        super().fdatasync(fd)


def _types(store: sessionlog.EventStore, sid: str = "s1") -> list[Any]:
    return [(r["type"], r.get("call_id") or r.get("request") or r.get("status"), r.get("code"))
            for r in store.read(sid, after_seq=3)]


def test_tool_call_scope_makes_the_intent_durable_before_the_body(tmp_path: Path) -> None:
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s1", [{"type": "turn/start", "turn": "t1"}, {"type": "user/message", "turn": "t1", "content": "go"}])
    seen_before_body: list[Any] = []
    calls = [{"id": "a", "name": "deploy", "arguments": {"v": 1}}, {"id": "b", "name": "search", "arguments": {}}]

    async def deploy(args: Any) -> str:
        seen_before_body.append([r["type"] for r in store.read("s1")][-1])  # durable: another reader sees it
        return f"deployed {args['v']}"

    async def search(args: Any) -> str:
        raise LookupError("index offline")

    async def main() -> list[ToolOutcome]:
        async with store.writer() as writer, writer.step("s1", turn="t1") as step:
            await step.append_async([{"type": "step/start", "turn": "t1", "step": 1}])
            async with step.model_request("r1") as request:
                request.response_id = "resp_1"
            await step.append_async([{"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
                                      "tool_calls": calls}])
            out = [await step.run_tool(calls[0], deploy), await step.run_tool(calls[1], search)]
            async with step.model_request("r2", results=["a", "b"]):
                pass
            await step.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"}])
            return out

    out = asyncio.run(main())
    assert seen_before_body == ["tool/call"]
    assert out[0] == ToolOutcome("deployed 1") and out[1].is_error and "LookupError: index offline" in out[1].output
    assert _types(store) == [
        ("step/start", None, None), ("llm/request", "r1", None), ("llm/response", "r1", None),
        ("assistant/message", None, None), ("tool/call", "a", None), ("tool/result", "a", None),
        ("tool/call", "b", None), ("tool/result", "b", "TOOL_ERROR"), ("llm/request", "r2", None),
        ("llm/response", "r2", None), ("step/end", "completed", None),
    ]
    responses = [r for r in store.read("s1") if r["type"] == "llm/response"]
    assert responses[0]["response_id"] == "resp_1" and "error" not in responses[0]
    assert [r for r in store.read("s1") if r["type"] == "llm/request"][1]["results"] == ["a", "b"]


def test_a_call_not_owed_a_result_is_never_run(store: sessionlog.EventStore) -> None:
    """A body runs only for a call the assistant asked for that has no result yet and does
    not await approval: run again, it would repeat its side effect and give the call a
    second result. Each refusal writes nothing and runs nothing."""
    ran: list[str] = []
    asked = [{"id": "a", "name": "deploy", "arguments": {}}, {"id": "b", "name": "deploy", "arguments": {}},
             {"id": "c", "name": "deploy", "arguments": {}}]

    def deploy(args: Any) -> str:
        ran.append("deploy")
        return "deployed"

    async def main() -> None:
        async with store.writer() as writer, writer.step("s1", turn="t1") as step:
            await step.append_async([{"type": "step/start", "turn": "t1", "step": 1},
                                     {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
                                      "tool_calls": asked}])
            await step.run_tool(asked[0], deploy)
            before = [r.seq for r in store.read("s1")]
            with pytest.raises(CallNotPending, match="'a'.*already has one"):
                await step.run_tool(asked[0], deploy)  # answered
            with pytest.raises(CallNotPending, match="'zz'"):
                await step.run_tool({"id": "zz", "name": "deploy", "arguments": {}}, deploy)  # never asked
            await step.request_approval(asked[1])
            with pytest.raises(CallNotPending, match="approval"):
                await step.run_tool(asked[1], deploy)  # a human is deciding
            with pytest.raises(CallNotPending, match="'a'"):
                await dispatch_tools(step, asked, {"deploy": deploy})  # one is answered: none runs
            assert [r.seq for r in store.read("s1")] == before + [before[-1] + 1]  # the approval request only
            await step.approve("b")
            await dispatch_tools(step, asked[1:], {"deploy": deploy})

    asyncio.run(main())
    assert ran == ["deploy"] * 3
    results = [r["call_id"] for r in store.read("s1") if r["type"] == "tool/result"]
    assert results == ["a", "b", "c"]  # one each


def test_a_failed_checkpoint_never_runs_the_body(tmp_path: Path) -> None:
    fs = FlakyFS()
    store = open_jsonl(str(tmp_path), fs=fs)
    store.create("s1", [{"type": "turn/start", "turn": "t1"}, {"type": "user/message", "turn": "t1", "content": "go"}])
    ran: list[str] = []
    call = {"id": "a", "name": "deploy", "arguments": {}}

    async def deploy(args: Any) -> str:
        ran.append("deploy")
        return "deployed"

    async def main() -> None:
        async with store.writer() as writer:
            with pytest.raises(sessionlog.AppendFailed):
                async with writer.step("s1", turn="t1") as step:
                    await step.append_async([{"type": "step/start", "turn": "t1", "step": 1},
                                             {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
                                              "tool_calls": [call]}])
                    fs.fail = 1  # the tool/call append fails: the body must not run
                    await step.run_tool(call, deploy)
            with pytest.raises(sessionlog.AppendFailed):
                async with writer.step("s1", turn="t2") as step2:
                    fs.fail = 1
                    async with step2.model_request("r9"):
                        ran.append("request sent")

    asyncio.run(main())
    assert ran == []
    # the first step was recovered once the disk was back: the call never started
    assert _types(store)[:4] == [("step/start", None, None), ("assistant/message", None, None),
                                 ("tool/result", "a", TOOL_NOT_STARTED), ("step/end", "error", None)]
    assert "llm/request" not in [t for t, _, _ in _types(store)]


def test_errors_raise_fails_the_step_and_recovery_says_the_outcome_is_unknown(store: sessionlog.EventStore) -> None:
    call = {"id": "a", "name": "deploy", "arguments": {}}

    async def deploy(args: Any) -> str:
        raise SchedulerError("half-way")

    async def main() -> None:
        async with store.writer() as writer:
            with pytest.raises(SchedulerError):
                async with writer.step("s1", turn="t1") as step:
                    await step.append_async([{"type": "step/start", "turn": "t1", "step": 1},
                                             {"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
                                              "tool_calls": [call]}])
                    await step.run_tool(call, deploy, errors="raise")

    asyncio.run(main())
    assert tail(store)[-4:] == [("tool/call", "a", None), ("tool/result", "a", TOOL_OUTCOME_UNKNOWN),
                                ("step/end", "error", None), ("turn/end", "error", None)]
    assert_clean_after(store)


def test_tool_calls_outside_a_step_are_refused(store: sessionlog.EventStore) -> None:
    async def main() -> None:
        async with store.writer() as writer:
            step = writer.step("s1", turn="t1")
            with pytest.raises(OutsideStep):
                async with step.tool_call({"id": "a", "name": "deploy", "arguments": {}}):
                    raise AssertionError("must not run")

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "turn/start", "user/message"]


def test_example_agent_loop_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    example = Path(__file__).resolve().parent.parent / "examples" / "agent_loop.py"
    done = subprocess.run([sys.executable, str(example), str(tmp_path / "sessions")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    store = sessionlog.open_store(f"jsonl:{tmp_path / 'sessions'}")
    (sid,) = store.sessions()
    assert store.scan(sid).status == sessionlog.Status.CLEAN
    records = list(store.read(sid))
    types = [r["type"] for r in records]
    assert types.count("llm/request") == types.count("llm/response") >= 2
    results = [r for r in records if r["type"] == "tool/result"]
    assert {r.get("code") for r in results} >= {None, "TOOL_ERROR", "TOOL_NOT_FOUND"}
    for fmt in FORMATS:
        view = project(records, fmt)
        assert check_pairing(view.items, fmt) is None and view.issues == []
    assert "final answer" in done.stdout


# --- approvals in the step scope ---------------------------------------------------------


APPROVAL_CALLS = [{"id": "c1", "name": "deploy", "arguments": {"v": 2}},
                  {"id": "c2", "name": "summon_unicorn", "arguments": {}},
                  {"id": "c3", "name": "search", "arguments": {"q": "x"}}]


async def _start_and_pause(store: sessionlog.EventStore, fail: bool = False) -> None:
    """Step 1 asks for three calls: c1 needs a human, c2 names an unknown tool, c3 runs
    (or, with ``fail``, the step fails before c3 starts)."""

    async def search(args: Any) -> str:
        return "found"

    async with store.writer() as writer, writer.step("s1", turn="t1") as step:
        await step.append_async([{"type": "step/start", "turn": "t1", "step": 1}])
        async with step.model_request("r1"):
            pass
        await step.append_async([{"type": "assistant/message", "turn": "t1", "step": 1, "content": None,
                                  "tool_calls": APPROVAL_CALLS}])
        await step.request_approval(APPROVAL_CALLS[0], reason="deploys to production")
        assert step.awaiting_approval() == ["c1"]
        await dispatch_tools(step, APPROVAL_CALLS[1:2], {"search": search})  # unknown tool: a local error
        if fail:
            raise SchedulerError("the runtime died mid-step")
        await dispatch_tools(step, APPROVAL_CALLS[2:], {"search": search})


def test_live_recovery_never_answers_a_call_awaiting_approval(store: sessionlog.EventStore) -> None:
    with pytest.raises(SchedulerError):
        asyncio.run(_start_and_pause(store, fail=True))
    results = {r["call_id"]: r.get("code") for r in store.read("s1") if r["type"] == "tool/result"}
    assert results == {"c2": "TOOL_NOT_FOUND", "c3": TOOL_NOT_STARTED}  # c1 is left to the human
    types = [r["type"] for r in store.read("s1")]
    assert "step/end" not in types and "turn/end" not in types  # held open by the awaiting call
    assert store.scan("s1").status == sessionlog.Status.SUSPENDED


def test_resume_approve_and_run(store: sessionlog.EventStore) -> None:
    asyncio.run(_start_and_pause(store))
    assert store.scan("s1").status == sessionlog.Status.SUSPENDED

    async def deploy(args: Any) -> str:
        return f"deployed v{args['v']}"

    async def resume() -> list[str]:
        async with store.writer() as writer, writer.step("s1", resume=True) as step:
            assert step.awaiting_approval() == ["c1"]
            with pytest.raises(sessionlog.SessionLogError):
                await step.approve("c3")  # not awaiting
            await step.approve("c1", by="alice")
            await step.run_tool(APPROVAL_CALLS[0], deploy)
            owed = [p.call_id for p in pending_deliveries(list(store.read("s1")))]
            await step.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                                     {"type": "turn/end", "turn": "t1", "status": "completed"}])
            return owed

    owed = asyncio.run(resume())
    assert owed == ["c1", "c2", "c3"]  # every result produced before and after the pause, once
    approvals = [(r["state"], r.get("by")) for r in store.read("s1") if r["type"] == "tool/approval"]
    assert approvals == [("requested", None), ("approved", "alice")]
    assert_clean_after(store)


def test_resume_and_reject_writes_the_result(store: sessionlog.EventStore) -> None:
    asyncio.run(_start_and_pause(store))

    async def resume() -> None:
        async with store.writer() as writer, writer.step("s1", resume=True) as step:
            await step.reject("c1", by="bob", reason="not on a Friday")
            assert step.awaiting_approval() == []
            await step.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                                     {"type": "turn/end", "turn": "t1", "status": "completed"}])

    asyncio.run(resume())
    records = list(store.read("s1"))
    rejected = [r for r in records if r["type"] == "tool/result" and r["call_id"] == "c1"]
    assert len(rejected) == 1 and rejected[0]["is_error"] and "not on a Friday" in rejected[0]["output"]
    assert [r["type"] for r in records if r["type"] == "tool/call"] == ["tool/call"]  # only c3 ever ran
    assert_clean_after(store)


def test_approval_outside_a_step_is_refused(store: sessionlog.EventStore) -> None:
    async def main() -> None:
        async with store.writer() as writer:
            step = writer.step("s1", turn="t1")
            with pytest.raises(OutsideStep):
                await step.request_approval(APPROVAL_CALLS[0])

    asyncio.run(main())
    assert [r["type"] for r in store.read("s1")] == ["session/start", "turn/start", "user/message"]
