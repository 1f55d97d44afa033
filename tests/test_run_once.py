"""A tool body runs at most once, and only a body that never ran is called "not started".

The step scope refuses (``CallNotPending``, nothing written) to run a call again once it
has started: while a scope of it runs, and once its ``tool/call`` is durable without a
result, whether the first run was cancelled by a timeout the runtime caught, is still
running in another task, or died with its process before a resume. A body interrupted
by a cancellation (the caller's, or one of its own) is answered ``TOOL_OUTCOME_UNKNOWN``
at once by its tool-call scope. Approval is asked only for a call that has not started,
and a rejection never calls a started call "not started"."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sessionlog
from sessionlog import TOOL_NOT_STARTED, TOOL_OUTCOME_UNKNOWN, Status
from sessionlog.projection import FORMATS, check_pairing, project
from sessionlog.recovery import CallNotPending, OutsideStep, StepScope, dispatch_tools

CALL = {"id": "c1", "name": "deploy", "arguments": {"version": "1.2.3"}}


def opening(calls: list[dict[str, Any]] = [CALL]) -> list[dict[str, Any]]:  # noqa: B006 - read only
    return [
        {"type": "turn/start", "turn": "t1"},
        {"type": "user/message", "turn": "t1", "content": "deploy"},
        {"type": "step/start", "turn": "t1", "step": 1},
        {"type": "assistant/message", "turn": "t1", "step": 1, "content": None, "tool_calls": calls},
    ]


def counted(output: str = "done", delay: float = 0.0) -> tuple[list[Any], Any]:
    """A tool body that records each run (its side effect), waits ``delay`` seconds and
    returns ``output``; and the list of its runs."""
    runs: list[Any] = []

    async def body(arguments: Any) -> str:
        runs.append(arguments)
        if delay:
            await asyncio.sleep(delay)
        return output

    return runs, body


def tools_of(store: sessionlog.EventStore) -> list[tuple[str, str, Any]]:
    return [(r["type"], r["call_id"], r.get("code")) for r in store.read("s") if r["type"].startswith("tool/")]


def assert_paired(store: sessionlog.EventStore) -> None:
    records = list(store.read("s"))
    for fmt in FORMATS:
        assert check_pairing(project(records, fmt).items, fmt) is None


def test_a_call_whose_run_timed_out_is_answered_unknown_and_never_run_again(tmp_path: Path) -> None:
    """A ``wait_for`` timeout cancels the body after its side effect; the runtime catches
    the timeout and tries the call again: refused, and the first run is on record as
    ``TOOL_OUTCOME_UNKNOWN`` (with its tool/call's seq), not left for the step's end."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening())
    runs, slow = counted("deployed", delay=30)

    async def main() -> None:
        async with store.writer() as w, w.step("s", resume=True) as step:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(step.run_tool(CALL, slow), 0.1)
            with pytest.raises(CallNotPending):
                await step.run_tool(CALL, slow)
            with pytest.raises(CallNotPending):
                await dispatch_tools(step, [CALL], {"deploy": slow})
            await step.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"}])

    asyncio.run(main())
    assert len(runs) == 1
    assert tools_of(store) == [("tool/call", "c1", None), ("tool/result", "c1", TOOL_OUTCOME_UNKNOWN)]
    [answer] = [r for r in store.read("s") if r["type"] == "tool/result"]
    [intent] = [r for r in store.read("s") if r["type"] == "tool/call"]
    assert answer["call_seq"] == intent.seq and answer["synthetic"] is True
    assert_paired(store)


@pytest.mark.parametrize("how", ["run_tool", "dispatch_tools"])
def test_a_call_being_run_is_not_run_again_by_another_task(tmp_path: Path, how: str) -> None:
    """Two tasks run the same call at once (a retry started while the first still runs):
    the second is refused before anything is written; one body, one result."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening())
    runs, work = counted(delay=0.05)

    async def main() -> list[Any]:
        async with store.writer() as w, w.step("s", resume=True) as step:
            if how == "run_tool":
                first, second = step.run_tool(CALL, work), step.run_tool(CALL, work)
            else:
                first, second = (dispatch_tools(step, [CALL], {"deploy": work}),
                                 dispatch_tools(step, [CALL], {"deploy": work}))
            return await asyncio.gather(first, second, return_exceptions=True)

    outcomes = asyncio.run(main())
    assert len(runs) == 1
    assert sum(isinstance(o, CallNotPending) for o in outcomes) == 1
    assert tools_of(store) == [("tool/call", "c1", None), ("tool/result", "c1", None)]


def test_a_body_that_ends_in_a_cancellation_of_its_own_is_answered_unknown(tmp_path: Path) -> None:
    """A body awaiting a task that other code cancels ends in CancelledError while the
    step itself is not cancelled: its call is answered ``TOOL_OUTCOME_UNKNOWN``, the
    other calls run on, and the session scans clean once the runtime ends the turn."""
    calls = [CALL, {"id": "c2", "name": "search", "arguments": {}}]
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening(calls))

    async def deploy(arguments: Any) -> str:
        inner = asyncio.ensure_future(asyncio.sleep(30))
        asyncio.get_running_loop().call_later(0.02, inner.cancel)
        await inner
        return "deployed"

    async def search(arguments: Any) -> str:
        return "found"

    async def main() -> None:
        async with store.writer() as w, w.step("s", resume=True) as step:
            await dispatch_tools(step, calls, {"deploy": deploy, "search": search})
            await step.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                                     {"type": "turn/end", "turn": "t1", "status": "completed"}])

    asyncio.run(main())
    assert sorted(tools_of(store)) == [("tool/call", "c1", None), ("tool/call", "c2", None),
                                       ("tool/result", "c1", TOOL_OUTCOME_UNKNOWN), ("tool/result", "c2", None)]
    assert store.scan("s").status is Status.CLEAN


_KILLED_IN_THE_BODY = """
import asyncio, json, sys, time
import sessionlog

store = sessionlog.open_store(sys.argv[1])
call = json.loads(sys.argv[2])

async def deploy(arguments):
    with open(sys.argv[3], "a") as effects:
        effects.write("deployed\\n")
    sys.stdout.write("ran\\n")
    sys.stdout.flush()
    time.sleep(60)  # killed here
    return "deployed"

async def main():
    async with store.writer() as w, w.step("s", resume=True) as step:
        await step.run_tool(call, deploy)

asyncio.run(main())
"""


def test_a_call_started_before_a_crash_is_not_run_again_on_resume(tmp_path: Path) -> None:
    """A process is killed (SIGKILL) inside the tool body; another resumes the step from
    the durable log: the call is refused, and repair answers it ``TOOL_OUTCOME_UNKNOWN``."""
    url = f"jsonl:{tmp_path / 'store'}"
    effects = tmp_path / "effects"
    sessionlog.open_store(url).create("s", opening())
    child = subprocess.Popen([sys.executable, "-c", _KILLED_IN_THE_BODY, url, json.dumps(CALL), str(effects)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ran"
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    store = sessionlog.open_store(url)

    async def resume() -> None:
        async with store.writer() as w, w.step("s", resume=True) as step:
            with pytest.raises(CallNotPending, match="has started"):
                await step.run_tool(CALL, lambda arguments: "deployed again")
            with pytest.raises(CallNotPending):
                await step.request_approval(CALL)

    asyncio.run(resume())
    assert effects.read_text() == "deployed\n"
    assert tools_of(store) == [("tool/call", "c1", None)]  # the refusals wrote nothing
    assert store.repair("s").status == "repaired"
    assert tools_of(store) == [("tool/call", "c1", None), ("tool/result", "c1", TOOL_OUTCOME_UNKNOWN)]


def test_approval_is_asked_only_for_a_call_that_may_still_run(tmp_path: Path) -> None:
    """``request_approval`` refuses, writing nothing, a call that has started (its
    tool-call scope is open), one nobody asked for, one already answered, and one
    awaiting a human already."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    calls = [CALL, {"id": "c2", "name": "search", "arguments": {}}, {"id": "c3", "name": "read", "arguments": {}}]
    store.create("s", opening(calls))

    async def main() -> None:
        async with store.writer() as w, w.step("s", resume=True) as step:
            async with step.tool_call(CALL):  # started: its body is running
                with pytest.raises(CallNotPending):
                    await step.request_approval(CALL)
            with pytest.raises(CallNotPending):
                await step.request_approval({"id": "nobody-asked", "name": "deploy", "arguments": {}})
            with pytest.raises(CallNotPending):
                await step.request_approval(CALL)  # answered now
            await step.request_approval(calls[1])
            with pytest.raises(CallNotPending):
                await step.request_approval(calls[1])  # awaiting already
            assert step.awaiting_approval() == ["c2"]

    asyncio.run(main())
    assert [(r["type"], r["call_id"], r.get("state")) for r in store.read("s") if r["type"].startswith("tool/")] == [
        ("tool/call", "c1", None), ("tool/result", "c1", None), ("tool/approval", "c2", "requested")]


def test_rejecting_a_call_whose_tool_call_is_durable_never_says_it_did_not_run(tmp_path: Path) -> None:
    """A log written around the scope holds a call's durable ``tool/call`` and then an
    approval request for it: rejecting it records ``TOOL_OUTCOME_UNKNOWN`` naming the
    tool/call, not ``TOOL_NOT_STARTED`` ("never ran"); a call that had not started is
    rejected ``TOOL_NOT_STARTED`` as before."""
    calls = [CALL, {"id": "c2", "name": "search", "arguments": {}}]
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening(calls) + [
        {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c1", "name": "deploy"},
        {"type": "tool/approval", "turn": "t1", "step": 1, "call_id": "c1", "state": "requested"},
        {"type": "tool/approval", "turn": "t1", "step": 1, "call_id": "c2", "state": "requested"},
    ])
    intent = next(r.seq for r in store.read("s") if r["type"] == "tool/call")

    async def main() -> None:
        async with store.writer() as w, w.step("s", resume=True) as step:
            await step.reject("c1", by="ops", reason="not today")
            await step.reject("c2", by="ops")

    asyncio.run(main())
    results = {r["call_id"]: r for r in store.read("s") if r["type"] == "tool/result"}
    assert results["c1"]["code"] == TOOL_OUTCOME_UNKNOWN and results["c1"]["call_seq"] == intent
    assert "not today" in results["c1"]["output"]
    assert results["c2"]["code"] == TOOL_NOT_STARTED


def test_a_scope_without_a_writer_refuses_a_started_call_too(tmp_path: Path) -> None:
    """The same rule on a plain session handle's scope (``StepScope``), fed with the log."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening() + [{"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c1",
                                    "name": "deploy"}])
    from sessionlog.transcript import PendingCalls

    async def main() -> None:
        with store.session("s") as handle:
            scope = StepScope(handle, tracker=PendingCalls().feed_all(store.read("s")))
            with pytest.raises(CallNotPending, match="has started"):
                await scope.run_tool(CALL, lambda arguments: "again")

    asyncio.run(main())
    assert tools_of(store) == [("tool/call", "c1", None)]


def test_a_cancelled_body_whose_answer_cannot_be_written_still_raises_its_cancellation(tmp_path: Path) -> None:
    """The answer to a cancelled body fails to write (the disk fails): the cancellation is
    what propagates, not the write's error, which is noted on it; the call stays refused
    (its tool/call is durable), and a repair answers it later."""
    from sessionlog.durable import FileSystem

    class FailingSync(FileSystem):
        armed = False

        def fdatasync(self, fd: int) -> None:
            if FailingSync.armed:
                raise OSError(5, "Input/output error")
            super().fdatasync(fd)

    store = sessionlog.open_store(f"jsonl:{tmp_path}", fs=FailingSync())
    store.create("s", opening())

    async def slow(arguments: Any) -> str:
        FailingSync.armed = True  # the tool/call is durable; what comes next is not
        await asyncio.sleep(30)
        return "deployed"

    async def main() -> None:
        with store.session("s") as handle:
            from sessionlog.transcript import PendingCalls

            scope = StepScope(handle, tracker=PendingCalls().feed_all(store.read("s")))
            with pytest.raises(TimeoutError) as raised:
                await asyncio.wait_for(scope.run_tool(CALL, slow), 0.1)
            assert any("could not record" in note for note in getattr(raised.value.__context__, "__notes__", [])
                       + getattr(raised.value, "__notes__", []))

    asyncio.run(main())
    FailingSync.armed = False
    assert tools_of(store) == [("tool/call", "c1", None)]
    assert store.repair("s").status == "repaired"
    assert tools_of(store) == [("tool/call", "c1", None), ("tool/result", "c1", TOOL_OUTCOME_UNKNOWN)]


class SlowAppends:
    """A session handle whose appends take a while (an async ``append``, as the
    :class:`~sessionlog.recovery.Appender` protocol allows): a cancellation can land while
    one is in flight. The append itself runs to completion."""

    def __init__(self, handle: Any, delay: float) -> None:
        self.handle, self.delay = handle, delay
        self.store = handle.store

    @property
    def last_seq(self) -> int:
        return self.handle.last_seq

    async def append(self, events: Any, *, expect_seq: int | None = None) -> int:
        await asyncio.sleep(self.delay)
        return self.handle.append(events, expect_seq=expect_seq)


def _scope_over(store: sessionlog.EventStore, handle: Any) -> StepScope:
    from sessionlog.transcript import PendingCalls

    return StepScope(handle, tracker=PendingCalls().feed_all(store.read("s")))


@pytest.mark.parametrize("output", ["done", "x" * (2 << 20)], ids=["returned", "over the record limit"])
@pytest.mark.parametrize("timeout", [0.05, 0.15], ids=["during the tool/call", "during the tool/result"])
def test_a_timeout_during_the_scopes_own_writes_leaves_no_call_unanswered(
    tmp_path: Path, timeout: float, output: str
) -> None:
    """A ``wait_for`` timeout that the runtime catches lands while the tool-call scope
    writes the intent (the body then never runs) or the result (the body ran; its output
    may be one the store refuses): the call is answered all the same, once, and the step
    ends clean: TOOL_OUTCOME_UNKNOWN when only the intent is durable, the real result or
    TOOL_OUTPUT_NOT_RECORDED when the body ran to its end."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening())
    runs, body = counted(output)

    async def main() -> None:
        with store.session("s") as handle:
            scope = _scope_over(store, SlowAppends(handle, 0.1))
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(scope.run_tool(CALL, body), timeout)
            await asyncio.sleep(0.3)  # what the scope was writing has landed
            with pytest.raises(CallNotPending):
                await scope.run_tool(CALL, body)
            await scope.append_async([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                                      {"type": "turn/end", "turn": "t1", "status": "completed"}])

    asyncio.run(main())
    codes = [code for kind, _, code in tools_of(store) if kind == "tool/result"]
    if timeout < 0.1:
        assert runs == [] and codes == [TOOL_OUTCOME_UNKNOWN]
    else:
        assert len(runs) == 1 and codes == [None if output == "done" else "TOOL_OUTPUT_NOT_RECORDED"]
    assert store.scan("s").status is Status.CLEAN


def test_a_call_whose_approval_is_being_requested_does_not_start(tmp_path: Path) -> None:
    """``request_approval`` and ``run_tool`` of one call at once: the one that comes second
    is refused while the approval request is written, so the body never runs behind a
    pending approval and the call never gets two results."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening())
    runs, body = counted()

    async def main() -> list[Any]:
        with store.session("s") as handle:
            scope = _scope_over(store, SlowAppends(handle, 0.05))
            return await asyncio.gather(scope.request_approval(CALL), scope.run_tool(CALL, body),
                                        return_exceptions=True)

    approval, run = asyncio.run(main())
    assert isinstance(approval, int) and isinstance(run, CallNotPending)
    assert runs == []
    assert [(r["type"], r.get("state")) for r in store.read("s") if r["type"].startswith("tool/")] == [
        ("tool/approval", "requested")]
    assert store.scan("s").status is Status.SUSPENDED


# --- any cancellation point -------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

EXAMPLES = 60 if __import__("os").environ.get("SESSIONLOG_SLOW") else 12


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 3),
    delay=st.sampled_from([0.0, 0.002, 0.01]),
    bodies=st.lists(st.sampled_from(["quick", "slow", "raises", "cancels itself", "huge"]), min_size=3, max_size=3),
    timeout=st.floats(0.0, 0.06),
    errors=st.sampled_from(["result", "raise"]),
    how=st.sampled_from(["dispatch_tools", "gathered run_tool in a recovering scope"]),
)
def test_a_timeout_anywhere_in_a_dispatch_runs_each_body_at_most_once_and_answers_each_call_once(
    tmp_path_factory: pytest.TempPathFactory, n: int, delay: float, bodies: list[str], timeout: float, errors: str,
    how: str,
) -> None:
    """A runtime dispatches a step's calls under a timeout it catches, at whatever point
    the timeout lands (in an append, a body, between calls), then tries every call again
    and ends the step: each body ran at most once, a retry ran none that had started, every
    call has exactly one result, a TOOL_OUTCOME_UNKNOWN only where its tool/call is durable,
    and the session scans clean. Gathered ``run_tool`` calls in a scope that recovers on
    failure race step recovery too: it answers calls whose bodies still run."""
    calls = [{"id": f"c{i}", "name": bodies[i], "arguments": {}} for i in range(n)]
    store = sessionlog.open_store(f"jsonl:{tmp_path_factory.mktemp('s')}")
    store.create("s", opening(calls))
    runs: list[str] = []

    def tool(kind: str) -> Any:
        async def body(arguments: Any) -> str:
            runs.append(kind)
            if kind == "slow":
                await asyncio.sleep(0.02)
            elif kind == "raises":
                raise RuntimeError("the tool failed")
            elif kind == "cancels itself":
                inner = asyncio.ensure_future(asyncio.sleep(1))
                asyncio.get_running_loop().call_later(0.005, inner.cancel)
                await inner
            elif kind == "huge":
                return "x" * (2 << 20)
            return "done"
        return body

    tools = {kind: tool(kind) for kind in ("quick", "slow", "raises", "cancels itself", "huge")}

    async def main() -> None:
        with store.session("s") as handle:
            scope = _scope_over(store, SlowAppends(handle, delay))
            try:
                if how == "dispatch_tools":
                    await asyncio.wait_for(dispatch_tools(scope, calls, tools, errors=errors), timeout)
                else:
                    async with scope:
                        await asyncio.wait_for(asyncio.gather(
                            *(scope.run_tool(c, tools[c["name"]], errors=errors) for c in calls)), timeout)
            except (TimeoutError, RuntimeError, asyncio.CancelledError):
                pass
            await asyncio.sleep(0.1)  # what was being written has landed, the bodies left running ended
            for call in calls:  # the retry: only a call that never started may run
                try:
                    await scope.run_tool(call, tools[call["name"]])
                except (CallNotPending, OutsideStep, RuntimeError, asyncio.CancelledError):
                    pass  # (a body's own cancellation propagates, its call answered)
            closers = []
            if scope.tracker.open_step is not None:
                closers.append({"type": "step/end", "turn": "t1", "step": 1, "status": "completed"})
            if scope.tracker.open_turn is not None:
                closers.append({"type": "turn/end", "turn": "t1", "status": "completed"})
            if closers:
                await scope.append_async(closers)

    asyncio.run(main())
    records = list(store.read("s"))
    for call in calls:
        cid = call["id"]
        intents = [r for r in records if r["type"] == "tool/call" and r["call_id"] == cid]
        answers = [r for r in records if r["type"] == "tool/result" and r["call_id"] == cid]
        assert len(intents) <= 1 and len(answers) == 1, (cid, records)
        if answers[0].get("code") == TOOL_OUTCOME_UNKNOWN:
            assert intents and answers[0]["call_seq"] == intents[0].seq
        elif answers[0].get("code") == TOOL_NOT_STARTED:  # step recovery, for a call that never started
            assert not intents
        else:
            assert intents and intents[0].seq < answers[0].seq  # a real answer: the intent came first
    assert len(runs) <= n and all(runs.count(k) <= bodies[:n].count(k) for k in set(runs))
    assert store.scan("s").status is Status.CLEAN


def test_parallel_calls_answered_by_step_recovery_while_one_still_runs_get_one_result_each(tmp_path: Path) -> None:
    """Two calls gathered in a step scope with ``errors="raise"``: one fails, the gather
    raises at once, and step recovery answers the other while its body still runs; that
    body's own result, which would be the call's second, is not written."""
    calls = [CALL, {"id": "c2", "name": "search", "arguments": {}}]
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening(calls))

    async def fail(arguments: Any) -> str:
        raise RuntimeError("the tool failed")

    async def slow(arguments: Any) -> str:
        await asyncio.sleep(0.03)  # ends while step recovery's append is in flight (appends take 0.02)
        return "found"

    async def main() -> None:
        with store.session("s") as handle:
            with pytest.raises(RuntimeError):
                async with _scope_over(store, SlowAppends(handle, 0.02)) as scope:
                    tasks = [asyncio.ensure_future(scope.run_tool(CALL, fail, errors="raise")),
                             asyncio.ensure_future(scope.run_tool(calls[1], slow, errors="raise"))]
                    await asyncio.gather(*tasks)
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)  # the slow body ends after recovery
            assert isinstance(outcomes[1], CallNotPending)  # run_tool never returns a result it did not record

    asyncio.run(main())
    answers = [(r["call_id"], r.get("code")) for r in store.read("s") if r["type"] == "tool/result"]
    assert sorted(answers) == [("c1", TOOL_OUTCOME_UNKNOWN), ("c2", TOOL_OUTCOME_UNKNOWN)]
    assert store.scan("s").status is Status.CLEAN


def test_a_second_cancellation_while_the_answer_is_written_is_not_called_a_failure(tmp_path: Path) -> None:
    """A body is cancelled, then cancelled again while its scope writes the answer: the
    answer lands, and the cancellation carries no note saying it could not be recorded."""
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening())

    async def body(arguments: Any) -> str:
        await asyncio.sleep(30)
        return "done"

    async def main() -> list[str]:
        with store.session("s") as handle:
            scope = _scope_over(store, SlowAppends(handle, 0.1))
            task = asyncio.ensure_future(scope.run_tool(CALL, body))
            await asyncio.sleep(0.15)  # the intent is durable, the body runs
            task.cancel()
            await asyncio.sleep(0.02)  # the answer is being written
            task.cancel()
            with pytest.raises(asyncio.CancelledError) as raised:
                await task
            await asyncio.sleep(0.2)
            return getattr(raised.value, "__notes__", [])

    assert asyncio.run(main()) == []
    assert tools_of(store) == [("tool/call", "c1", None), ("tool/result", "c1", TOOL_OUTCOME_UNKNOWN)]


def test_a_dispatch_cancelled_before_a_started_body_ever_ran_answers_its_call(tmp_path: Path) -> None:
    """A timeout lands just after a call's intent is durable and its body's task is made,
    before that task first runs: cancelled then, it never reaches its tool-call scope's
    exit, so dispatch_tools answers the call itself (TOOL_OUTCOME_UNKNOWN: the intent is
    durable), in every one of several tries."""
    async def body(arguments: Any) -> str:
        await asyncio.sleep(1)
        return "done"

    for attempt in range(5):
        store = sessionlog.open_store(f"jsonl:{tmp_path / str(attempt)}")
        store.create("s", opening())

        async def main() -> None:
            with store.session("s") as handle:
                scope = _scope_over(store, SlowAppends(handle, 0.002))
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(dispatch_tools(scope, [CALL], {"deploy": body}), 0.0024)
                await asyncio.sleep(0.05)

        asyncio.run(main())
        answers = [code for kind, _, code in tools_of(store) if kind == "tool/result"]
        assert answers == [TOOL_OUTCOME_UNKNOWN] or tools_of(store) == [], (attempt, tools_of(store))


@pytest.mark.parametrize("second", ["run_tool", "request_approval", "dispatch of an unknown tool"])
def test_a_call_answered_by_step_recovery_before_its_turn_to_be_written_never_starts(
    tmp_path: Path, second: str
) -> None:
    """Calls started as the model streams them: the first fails the step (``errors=
    "raise"``) and step recovery answers the second while the second's own write (its
    intent, its approval request, its TOOL_NOT_FOUND) waits its turn: that write is not
    made, the body never runs, and each call has exactly one answer."""
    calls = [CALL, {"id": "c2", "name": "search" if second != "dispatch of an unknown tool" else "nope",
                    "arguments": {}}]
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening(calls))
    runs: list[str] = []

    async def fail(arguments: Any) -> str:
        raise RuntimeError("the tool failed")

    async def search(arguments: Any) -> str:
        runs.append("search")
        return "found"

    async def main() -> None:
        with store.session("s") as handle:
            scope = _scope_over(store, SlowAppends(handle, 0.05))

            async def streamed_later() -> Any:
                await asyncio.sleep(0.12)  # queued behind recovery's append
                if second == "run_tool":
                    return await scope.run_tool(calls[1], search)
                if second == "request_approval":
                    return await scope.request_approval(calls[1])
                return await dispatch_tools(scope, [calls[1]], {"search": search})

            later = asyncio.ensure_future(streamed_later())
            with pytest.raises(RuntimeError):
                async with scope:
                    await asyncio.gather(scope.run_tool(CALL, fail, errors="raise"), later)
            outcome = (await asyncio.gather(later, return_exceptions=True))[0]
            if second != "dispatch of an unknown tool":
                assert isinstance(outcome, CallNotPending), outcome

    asyncio.run(main())
    assert runs == []
    answers = [(r["call_id"], r.get("code")) for r in store.read("s") if r["type"] == "tool/result"]
    assert sorted(answers) == [("c1", TOOL_OUTCOME_UNKNOWN), ("c2", TOOL_NOT_STARTED)]
    assert [r["type"] for r in store.read("s") if r["type"] == "tool/approval"] == []
    assert store.scan("s").status is Status.CLEAN


def test_two_dispatches_of_a_call_to_an_unknown_tool_answer_it_once(tmp_path: Path) -> None:
    calls = [{"id": "c1", "name": "no_such_tool", "arguments": {}}]
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening(calls))

    async def main() -> None:
        async with store.writer() as w, w.step("s", resume=True) as step:
            await asyncio.gather(dispatch_tools(step, calls, {}), dispatch_tools(step, calls, {}),
                                 return_exceptions=True)

    asyncio.run(main())
    assert tools_of(store) == [("tool/result", "c1", "TOOL_NOT_FOUND")]


def test_a_dispatch_with_no_room_for_a_body_is_refused(tmp_path: Path) -> None:
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening())

    async def main() -> None:
        async with store.writer() as w, w.step("s", resume=True) as step:
            for concurrency in (0, -1):
                with pytest.raises(ValueError, match="concurrency"):
                    await asyncio.wait_for(dispatch_tools(step, [CALL], {}, concurrency=concurrency), 5)

    asyncio.run(main())
    assert tools_of(store) == []


def test_two_resumed_scopes_approving_one_call_run_its_body_once(tmp_path: Path) -> None:
    """Two approval handlers for one awaiting call at once (a double click on Approve),
    each on the documented resume path in its own scope over one writer: the second
    decision is refused (NotAwaitingApproval; its scope catches up on the first's writes),
    the body runs once, and the call has one answer."""
    from sessionlog.recovery import NotAwaitingApproval

    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening())
    runs, deploy = counted("deployed", delay=0.01)

    async def main() -> list[Any]:
        async with store.writer() as w:
            async with w.step("s", resume=True) as step:
                await step.request_approval(CALL)

            async def handler(who: str) -> Any:
                async with w.step("s", resume=True) as step:
                    await step.approve("c1", by=who)
                    return await step.run_tool(CALL, deploy)

            return await asyncio.gather(handler("alice"), handler("alice again"), return_exceptions=True)

    outcomes = asyncio.run(main())
    assert len(runs) == 1
    assert any(isinstance(o, NotAwaitingApproval) for o in outcomes)
    assert [r["state"] for r in store.read("s") if r["type"] == "tool/approval"] == ["requested", "approved"]
    assert len([r for r in store.read("s") if r["type"] == "tool/call"]) == 1
    assert len([r for r in store.read("s") if r["type"] == "tool/result"]) == 1
    assert store.scan("s").status is Status.CLEAN


def test_one_scope_used_by_a_dispatch_per_event_loop(tmp_path: Path) -> None:
    """A sync runtime keeps one step scope and runs each assistant message's dispatch in
    its own ``asyncio.run``: every dispatch runs (the scope's lock is made per loop)."""
    # Two calls each: their appends contend for the scope's lock, which binds it to its loop.
    calls_a = [{"id": f"a{i}", "name": "search", "arguments": {}} for i in (1, 2)]
    calls_b = [{"id": f"b{i}", "name": "search", "arguments": {}} for i in (1, 2)]
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    store.create("s", opening(calls_a))

    async def search(arguments: Any) -> str:
        return "found"

    with store.session("s") as handle:
        with _scope_over(store, handle) as scope:
            asyncio.run(dispatch_tools(scope, calls_a, {"search": search}))
            scope.append([{"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
                          {"type": "step/start", "turn": "t1", "step": 2},
                          {"type": "assistant/message", "turn": "t1", "step": 2, "content": None,
                           "tool_calls": calls_b}])
            asyncio.run(dispatch_tools(scope, calls_b, {"search": search}))
    assert sorted(tools_of(store)) == sorted(
        [(kind, f"{m}{i}", None) for kind in ("tool/call", "tool/result") for m in "ab" for i in (1, 2)])
