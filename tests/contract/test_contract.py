"""The event-store contract, run against every backend in conftest.BACKENDS."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from types import MappingProxyType

import pytest

import sessionlog
from sessionlog import (
    TOOL_NOT_STARTED,
    TOOL_OUTCOME_UNKNOWN,
    InvalidEvent,
    InvalidSessionId,
    SequenceConflict,
    SessionExists,
    SessionLocked,
    SessionNotFound,
)

TURN = [
    {"type": "turn/start", "turn": "t1"},
    {"type": "user/message", "turn": "t1", "content": "hi"},
    {"type": "step/start", "turn": "t1", "step": 1},
    {
        "type": "assistant/message", "turn": "t1", "step": 1, "content": None,
        "tool_calls": [
            {"id": "c1", "name": "read", "arguments": {"path": "/a"}},
            {"id": "c2", "name": "write", "arguments": {"path": "/b"}},
            {"id": "c3", "name": "ls", "arguments": {}},
        ],
    },
    {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c1", "name": "read"},
    {"type": "tool/result", "turn": "t1", "step": 1, "call_id": "c1", "output": "ok", "is_error": False},
    {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "c2", "name": "write"},
]

CLOSED = [
    {"type": "turn/start", "turn": "t1"},
    {"type": "step/start", "turn": "t1", "step": 1},
    {"type": "assistant/message", "turn": "t1", "step": 1, "content": "done", "tool_calls": []},
    {"type": "step/end", "turn": "t1", "step": 1, "status": "completed"},
    {"type": "turn/end", "turn": "t1", "status": "completed"},
]


def types(records):
    return [r["type"] for r in records]


def test_create_publishes_header(store):
    assert store.create("s1") == 1
    [header] = list(store.read("s1"))
    assert header["type"] == "session/start"
    assert header["session"] == "s1"
    assert header["format"] == "sessionlog/1"
    assert header["seq"] == 1 and isinstance(header["ts"], float)
    assert "s1" in store.sessions()


def test_create_existing_raises(store):
    store.create("s1")
    with pytest.raises(SessionExists):
        store.create("s1")
    assert len(list(store.read("s1"))) == 1


def test_create_with_first_events(store):
    assert store.create("s1", CLOSED) == 6
    assert types(store.read("s1")) == ["session/start"] + [e["type"] for e in CLOSED]


def test_append_assigns_contiguous_seq_and_ts(store):
    store.create("s1")
    assert store.append("s1", [{"type": "turn/start", "turn": "t1"}]) == 2
    assert store.append("s1", [{"type": "a"}, {"type": "b", "ts": 12.5}]) == 4
    recs = list(store.read("s1"))
    assert [r["seq"] for r in recs] == [1, 2, 3, 4]
    assert recs[3]["ts"] == 12.5
    assert all(isinstance(r["ts"], (int, float)) for r in recs)


def test_append_empty_batch_is_noop(store):
    store.create("s1")
    assert store.append("s1", []) == 1
    assert len(list(store.read("s1"))) == 1


def test_append_to_missing_session(store):
    with pytest.raises(SessionNotFound):
        store.append("nope", [{"type": "x"}])


def test_expect_seq(store):
    store.create("s1")
    assert store.append("s1", [{"type": "a"}], expect_seq=1) == 2
    with pytest.raises(SequenceConflict) as info:
        store.append("s1", [{"type": "b"}], expect_seq=1)
    assert info.value.expected == 1 and info.value.found == 2
    assert store.append("s1", [{"type": "b"}], expect_seq=2) == 3
    assert [r["type"] for r in store.read("s1")] == ["session/start", "a", "b"]


@pytest.mark.parametrize(
    "bad",
    ["", "a/b", "../x", "a..b", ".hidden", "-x", "x" * 129, "sp ace", "é", "a\0b", None, 5],
)
def test_bad_session_ids_refused(store, bad):
    with pytest.raises(InvalidSessionId):
        store.create(bad)
    with pytest.raises(InvalidSessionId):
        store.append(bad, [{"type": "x"}])
    with pytest.raises(InvalidSessionId):
        store.scan(bad)


def test_good_session_ids(store):
    for sid in ["a", "A.b-c_d", "0" * 128, "x.y"]:
        store.create(sid)
    assert set(store.sessions()) >= {"a", "A.b-c_d", "0" * 128, "x.y"}


@pytest.mark.parametrize(
    "event",
    [{"no": "type"}, {"type": ""}, {"type": 5}, {"type": "x", "seq": 3}, {"type": "x", "v": object()},
     {"type": "x", "ts": "yesterday"}, {"type": "x", "ts": float("nan")}],
)
def test_invalid_events_refused_and_nothing_written(store, event):
    store.create("s1")
    with pytest.raises(InvalidEvent):
        store.append("s1", [{"type": "fine"}, event])
    with pytest.raises(InvalidEvent):
        store.append("s1", [event])
    with store.session("s1") as handle, pytest.raises(InvalidEvent):
        handle.append([event])
    assert len(list(store.read("s1"))) == 1
    assert store.append("s1", [{"type": "fine"}]) == 2


class _Unreadable(Mapping):
    """An event mapping whose own code fails when it is read."""

    def __init__(self, exc):
        self.exc = exc

    def __getitem__(self, key):
        raise self.exc

    def __iter__(self):
        return iter(["type", "x"])

    def __len__(self):
        return 2


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyError("type"), TypeError("no")])
def test_an_event_that_fails_to_be_read_is_invalid_event_naming_why(store, exc):
    store.create("s1")
    event = _Unreadable(exc)
    for append in (lambda: store.append("s1", [{"type": "fine"}, event]), lambda: store.append("s1", [event])):
        with pytest.raises(InvalidEvent, match=f"event [01] of the batch: the event could not be read: "
                                                f"{type(exc).__name__}"):
            append()
    with store.session("s1") as handle, pytest.raises(InvalidEvent, match="could not be read"):
        handle.append([event])
    assert len(list(store.read("s1"))) == 1


def test_any_mapping_is_an_event(store):
    store.create("s1")
    assert store.append("s1", [MappingProxyType({"type": "a", "v": [1]}), {"type": "b"}]) == 3
    assert [(r["type"], r.get("v")) for r in store.read("s1")][1:] == [("a", [1]), ("b", None)]


def test_large_finite_numbers_round_trip(store):
    store.create("s1")
    store.append("s1", [{"type": "x", "v": [1e308, 1e308], "w": -1e308, "n": 2**70, "z": -0.0}])
    record = list(store.read("s1"))[-1]
    assert record["v"] == [1e308, 1e308] and record["w"] == -1e308 and record["n"] == 2**70
    assert b'"z":-0.0' in record.raw


@pytest.mark.parametrize("batch", [{"type": "x"}, None, 5, "x"])
def test_what_is_not_a_batch_is_invalid_event(store, batch):
    """A single mapping, None or a number where a batch belongs: InvalidEvent (never a
    TypeError), through every entry point that takes events, and nothing is written."""
    store.create("s1")
    with pytest.raises(InvalidEvent):
        store.append("s1", batch)
    with store.session("s1") as handle, pytest.raises(InvalidEvent):
        handle.append(batch)
    with pytest.raises(InvalidEvent):
        store.create("s2", batch)
    assert [r.seq for r in store.read("s1")] == [1] and "s2" not in store.sessions()


def test_unknown_types_and_fields_round_trip_verbatim(store):
    store.create("s1")
    odd = {"type": "llm/retry", "attempt": 2, "nested": {"ü": [1, 2.5, None, True, {"k": "v\n"}]},
           "big": 12345678901234567890, "emoji": "\U0001F600"}
    store.append("s1", [odd])
    rec = list(store.read("s1"))[1]
    assert rec["nested"] == odd["nested"]
    assert rec["big"] == odd["big"] and rec["emoji"] == odd["emoji"]
    raw = rec.raw
    # the scan, the repair and the copy keep those bytes
    assert store.scan("s1").records[1].raw == raw
    store.repair("s1")
    assert list(store.read("s1"))[1].raw == raw
    dst = sessionlog.open_store("memory:")
    dst.import_session("s1", store.read("s1"))
    assert [r.raw for r in dst.read("s1")] == [r.raw for r in store.read("s1")]


def test_records_are_read_only(store):
    store.create("s1")
    rec = next(iter(store.read("s1")))
    with pytest.raises(TypeError):
        rec["type"] = "x"  # type: ignore[index]


def test_read_after_seq(store):
    store.create("s1", CLOSED)
    assert [r["seq"] for r in store.read("s1", after_seq=4)] == [5, 6]
    assert list(store.read("s1", after_seq=6)) == []
    with pytest.raises(SequenceConflict):
        list(store.read("s1", after_seq=9))


def test_read_after_a_seq_below_one_reads_everything_and_a_non_int_is_refused(store):
    store.create("s1", CLOSED)
    everything = [r["seq"] for r in store.read("s1")]
    assert everything == [1, 2, 3, 4, 5, 6]
    for start in (0, -1, -100):
        assert [r["seq"] for r in store.read("s1", after_seq=start)] == everything
    for beyond in (7, 2**63 - 1, 2**63, 2**70):
        with pytest.raises(SequenceConflict):
            list(store.read("s1", after_seq=beyond))
    for bad in ("2", 1.5, None, True):
        with pytest.raises(TypeError, match="after_seq must be an int"):
            list(store.read("s1", after_seq=bad))


def test_scan_clean_session(store):
    store.create("s1", CLOSED)
    res = store.scan("s1")
    assert res.status == "clean"
    assert res.damage is None
    assert res.open_turn is None and res.open_step is None and res.unanswered_calls == []
    assert types(res.records) == ["session/start"] + [e["type"] for e in CLOSED]


def test_scan_reports_open_transcript(store):
    store.create("s1", TURN)
    res = store.scan("s1")
    assert res.status == "repairable"
    assert res.damage is None
    assert res.open_turn == "t1" and res.open_step == 1
    assert res.unanswered_calls == ["c2", "c3"]


def test_repair_closes_transcript(store):
    store.create("s1", TURN)
    rep = store.repair("s1")
    assert rep.status == "repaired"
    assert rep.truncated_bytes == 0 and rep.quarantine is None
    appended = [dict(r) for r in rep.appended]
    assert [(r["type"], r.get("call_id"), r.get("code")) for r in appended] == [
        ("tool/result", "c2", TOOL_OUTCOME_UNKNOWN),
        ("tool/result", "c3", TOOL_NOT_STARTED),
        ("step/end", None, None),
        ("turn/end", None, None),
    ]
    assert all(r["synthetic"] is True for r in appended)
    assert appended[0]["call_seq"] == 8 and appended[0]["is_error"] is True
    assert appended[2]["status"] == appended[3]["status"] == "interrupted"
    last_real_ts = list(store.read("s1"))[7]["ts"]
    assert all(r["ts"] == last_real_ts for r in appended)
    recs = list(store.read("s1"))
    assert [r["seq"] for r in recs] == list(range(1, 13))
    # The committed result of c1 was not replaced.
    assert [r["call_id"] for r in recs if r["type"] == "tool/result"] == ["c1", "c2", "c3"]
    res = store.scan("s1")
    assert res.status == "clean" and res.unanswered_calls == []


def test_repair_is_idempotent(store):
    store.create("s1", TURN)
    store.repair("s1")
    before = [r.raw for r in store.read("s1")]
    again = store.repair("s1")
    assert again.status == "clean" and again.appended == []
    assert [r.raw for r in store.read("s1")] == before


def test_repair_dry_run_writes_nothing(store):
    store.create("s1", TURN)
    before = [r.raw for r in store.read("s1")]
    plan = store.repair("s1", dry_run=True)
    assert plan.status == "repaired" and len(plan.appended) == 4
    assert [r.raw for r in store.read("s1")] == before
    assert [r.raw for r in store.repair("s1").appended] == [r.raw for r in plan.appended]


def test_repair_clean_session_changes_nothing(store):
    store.create("s1", CLOSED)
    before = [r.raw for r in store.read("s1")]
    assert store.repair("s1").status == "clean"
    assert [r.raw for r in store.read("s1")] == before


def test_closed_historical_turn_gets_its_missing_results_and_no_closers(store):
    # Every requested call gets one durable result, wherever it is: repair writes the
    # answers at the end (the views pair them with their calls); the closed step and
    # turn stay as they were.
    hist = TURN + [
        {"type": "step/end", "turn": "t1", "step": 1, "status": "error"},
        {"type": "turn/end", "turn": "t1", "status": "error"},
    ]
    store.create("s1", hist)
    res = store.scan("s1")
    assert res.status == "repairable" and res.unanswered_calls == ["c2", "c3"]
    assert res.open_turn is None and res.open_step is None
    rep = store.repair("s1")
    assert [(r["type"], r["call_id"], r["code"], r["turn"]) for r in rep.appended] == [
        ("tool/result", "c2", TOOL_OUTCOME_UNKNOWN, "t1"), ("tool/result", "c3", TOOL_NOT_STARTED, "t1")]
    assert store.scan("s1").status == "clean"
    assert store.repair("s1").status == "clean"


def test_session_handle_owns_the_session(store):
    store.create("s1")
    with store.session("s1") as s:
        assert s.last_seq == 1
        assert s.append([{"type": "turn/start", "turn": "t1"}]) == 2
        with pytest.raises(SessionLocked):
            store.session("s1")
        res = store.scan("s1")
        assert res.status == "open"
        with pytest.raises(SessionLocked):
            store.repair("s1")
        assert s.append([{"type": "turn/end", "turn": "t1", "status": "completed"}], expect_seq=2) == 3
    # released on exit
    with store.session("s1") as s:
        assert s.last_seq == 3


def test_one_shot_append_waits_for_the_owner(store_url):
    with sessionlog.open_store(store_url, lock_timeout=5.0) as store:
        store.create("s1")
        handle = store.session("s1")
        done = []

        def other():
            done.append(store.append("s1", [{"type": "late"}]))

        t = threading.Thread(target=other)
        t.start()
        handle.append([{"type": "early"}])
        handle.close()
        t.join(10)
        assert done == [3]
        assert types(store.read("s1")) == ["session/start", "early", "late"]


def test_one_shot_append_times_out(store_url):
    with sessionlog.open_store(store_url, lock_timeout=0.05) as store:
        store.create("s1")
        with store.session("s1"):
            with pytest.raises(SessionLocked):
                store.append("s1", [{"type": "x"}])


def test_session_create_flag(store):
    with store.session("new", create=True) as s:
        s.append([{"type": "x"}])
    assert types(store.read("new")) == ["session/start", "x"]


def test_session_repair_flag_closes_transcript(store):
    store.create("s1", TURN)
    with store.session("s1", repair=True) as s:
        assert s.last_seq == 12
    assert store.scan("s1").status == "clean"


def test_delete(store):
    store.create("s1", TURN)
    store.repair("s1")
    store.delete("s1")
    assert "s1" not in store.sessions()
    with pytest.raises(SessionNotFound):
        list(store.read("s1"))
    store.create("s1")  # the id can be reused
    assert len(list(store.read("s1"))) == 1


def test_import_session_is_verbatim(store):
    src = sessionlog.open_store("memory:")
    src.create("s1", TURN)
    src.append("s1", [{"type": "custom/x", "k": [1, {"z": None}]}])
    assert store.import_session("s1", src.read("s1")) == 9
    assert [r.raw for r in store.read("s1")] == [r.raw for r in src.read("s1")]
    with pytest.raises(SessionExists):
        store.import_session("s1", src.read("s1"))


def test_import_refuses_gaps_and_foreign_headers(store):
    src = sessionlog.open_store("memory:")
    src.create("s1", CLOSED)
    recs = list(src.read("s1"))
    with pytest.raises(InvalidEvent):
        store.import_session("s1", [recs[0], recs[2]])
    with pytest.raises(InvalidEvent):
        store.import_session("other", recs)
    assert "s1" not in store.sessions() and "other" not in store.sessions()


def test_atomic_batches_is_declared(store):
    assert isinstance(store.atomic_batches, bool)


def test_many_sessions_listed(store):
    for i in range(30):
        store.create(f"s{i:02d}")
    assert store.sessions()[:30] == [f"s{i:02d}" for i in range(30)]


def test_store_is_a_context_manager(store_url):
    with sessionlog.open_store(store_url) as store:
        store.create("s1")
    with pytest.raises(sessionlog.SessionLogError):
        store.create("s2")


def test_write_behind_over_every_backend(store):
    import asyncio

    store.create("s1")

    async def main():
        async with store.writer() as w:
            seqs = await asyncio.gather(*(w.append("s1", [{"type": "ev", "k": k}]) for k in range(20)))
            w.submit("s1", [{"type": "last"}])
            await w.flush("s1")
        return seqs

    seqs = asyncio.run(main())
    assert sorted(seqs) == list(range(2, 22))
    records = list(store.read("s1"))
    assert [r["seq"] for r in records] == list(range(1, 23)) and records[-1]["type"] == "last"
    assert store.scan("s1").status == "clean"  # released on close


def test_scan_records_are_exactly_the_scanned_prefix(store):
    store.create("s1", [{"type": "a"}])
    res = store.scan("s1")
    store.append("s1", [{"type": "b"}])
    store.append("s1", [{"type": "c"}, {"type": "d"}])
    assert [r["seq"] for r in res.records] == [1, 2]
    assert types(res.records) == ["session/start", "a"]
    assert res.records is res.records  # read once


def test_scan_records_of_a_log_cut_or_replaced_since_raise(store):
    store.create("s1", [{"type": "a"}, {"type": "b"}])
    res = store.scan("s1")
    store.delete("s1")
    store.create("s1")
    with pytest.raises(sessionlog.CorruptLog, match="changed since the scan"):
        res.records
    # Same length, another last record: still not the scanned prefix.
    store.append("s1", [{"type": "a"}])
    res = store.scan("s1")
    store.delete("s1")
    store.create("s1", [{"type": "z"}])
    with pytest.raises(sessionlog.CorruptLog, match="changed since the scan"):
        res.records


def test_scan_records_after_close_never_return_other_records(store_url):
    store = sessionlog.open_store(store_url)
    store.create("s1", [{"type": "a"}])
    read_before = store.scan("s1")
    assert types(read_before.records) == ["session/start", "a"]
    unread = store.scan("s1")
    store.close()
    assert types(read_before.records) == ["session/start", "a"]
    with pytest.raises(sessionlog.StoreClosed):
        unread.records


def _wide_step(n: int = 3000) -> list[dict]:
    """A step whose assistant message asks for ``n`` calls: its repair plan is larger
    than one append batch (1 MiB)."""
    calls = [{"id": f"call_{i:05d}", "name": "probe", "arguments": {}} for i in range(n)]
    return [
        {"type": "turn/start", "turn": "t1"},
        {"type": "step/start", "turn": "t1", "step": 1},
        {"type": "assistant/message", "turn": "t1", "step": 1, "content": None, "tool_calls": calls},
        {"type": "tool/call", "turn": "t1", "step": 1, "call_id": "call_00007", "name": "probe"},
    ]


def _answered_once(records) -> None:
    from sessions import answered_exactly_once

    assert answered_exactly_once(list(records)) == []


def test_a_repair_larger_than_one_batch_is_written(store):
    store.create("s1", _wide_step())
    assert store.repair("s1", dry_run=True).status == "repaired"
    rep = store.repair("s1")
    assert rep.status == "repaired" and len(rep.appended) == 3002
    assert sum(len(r.raw) + 1 for r in rep.appended) > 1 << 20
    assert store.scan("s1").status == "clean"
    records = list(store.read("s1"))
    _answered_once(records)
    unknown = [r for r in records if r["type"] == "tool/result" and r.get("code") == TOOL_OUTCOME_UNKNOWN]
    assert [r["call_id"] for r in unknown] == ["call_00007"]
    assert store.repair("s1").status == "clean"


def test_session_repair_flag_with_a_plan_larger_than_one_batch(store):
    store.create("s1", _wide_step())
    with store.session("s1", repair=True) as s:
        s.append([{"type": "turn/start", "turn": "t2"}])
    records = list(store.read("s1"))
    _answered_once(records[:-1])
    assert records[-1]["type"] == "turn/start"


def test_live_step_recovery_larger_than_one_batch(store):
    from sessionlog import StepScope

    store.create("s1", _wide_step()[:1])
    with pytest.raises(RuntimeError, match="boom"), store.session("s1") as handle:
        with StepScope(handle, turn="t1") as step:
            for event in _wide_step()[1:]:
                step.append([event])
            raise RuntimeError("boom")
    res = store.scan("s1")
    assert res.status == "clean", res
    records = list(store.read("s1"))
    _answered_once(records)
    assert records[-1]["type"] == "turn/end" and records[-1]["status"] == "error"
