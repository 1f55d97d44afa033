"""Durable appends through every backend ``sessionlog.open_store`` can open at run time.

Per backend: appends through an open session handle (the embedded path: the writer owns
the session and keeps its lock) at 1, 64 and 1024 events per batch; a one-shot
``store.append`` of one event, which takes and drops the lock per call; and 100 sessions
appended round-robin, one event each, through 100 open handles. Every append is durable
on return. The events are the ceiling's records (about 300 bytes each, generated text).

Write-behind: many producers, each awaiting durability of its own event, committed in
groups by the embedded writer (``sessionlog.writer``); see :func:`write_behind_cases`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sessionlog

from .rounds import Case, Result, Work, skipped

BATCH_SIZES = (1, 64, 1024)
ROUND_ROBIN_SESSIONS = 100
PRODUCERS = (1, 8, 64)


@dataclass(slots=True)
class Backend:
    """A store the run measures, or the reason it cannot (``store`` is None)."""

    name: str
    url: str
    store: Any | None
    reason: str | None = None
    prefix: str = ""

    def sid(self, name: str) -> str:
        """A session id unique to this run (PostgreSQL is shared between runs)."""
        return f"{self.prefix}{name}"


def backend_urls(directory: str, postgres_url: str | None) -> list[tuple[str, str]]:
    """(name, URL) of every backend a run tries, in table order."""
    urls = [
        ("jsonl", f"jsonl:{os.path.join(directory, 'jsonl')}"),
        ("zstd", f"zstd:{os.path.join(directory, 'zstd')}"),
        ("sqlite", f"sqlite:///{os.path.join(directory, 'sqlite', 'bench.db')}"),
    ]
    if postgres_url:
        urls.append(("postgresql", postgres_url))
    return urls


def open_backends(
    directory: str, postgres_url: str | None, only: Sequence[str] | None, stack: contextlib.ExitStack
) -> list[Backend]:
    """Open every backend that is there; a missing one is kept with the reason.

    The SQLite database's directory is created here (the URL names a file). Every opened
    store is closed by ``stack``; sessions made on PostgreSQL are deleted first."""
    out = []
    run_tag = f"bench-{os.getpid()}-{secrets.token_hex(3)}-"
    for name, url in backend_urls(directory, postgres_url):
        if only and name not in only:
            continue
        if name == "sqlite":
            os.makedirs(os.path.join(directory, "sqlite"), mode=0o700, exist_ok=True)
        try:
            store = sessionlog.open_store(url)
        except sessionlog.InvalidStoreUrl as exc:
            out.append(Backend(name, url, None, f"not available: {exc.__cause__ or exc}"))
            continue
        except Exception as exc:  # a backend under construction may fail in any way
            out.append(Backend(name, url, None, f"cannot open: {type(exc).__name__}: {exc}"))
            continue
        backend = Backend(name, url, store, prefix=run_tag if name == "postgresql" else "")
        stack.callback(_close_store, backend)
        out.append(backend)
    return out


def _close_store(backend: Backend) -> None:
    store = backend.store
    if store is None:
        return
    if backend.prefix:
        with contextlib.suppress(Exception):
            for sid in store.sessions():
                if sid.startswith(backend.prefix):
                    store.delete(sid)
    with contextlib.suppress(Exception):
        store.close()


def append_id(backend: str, what: str) -> str:
    return f"append/{backend}/{what}"


def _batches(events: Sequence[Mapping[str, Any]], size: int, count: int = 8) -> list[list[Mapping[str, Any]]]:
    n = len(events)
    return [[events[(k * size + i) % n] for i in range(size)] for k in range(count)]


def _handle_op(handle: Any, batches: list[list[Mapping[str, Any]]], nbytes: int) -> Callable[[], Work]:
    state = [0]

    def op() -> Work:
        batch = batches[state[0] % len(batches)]
        state[0] += 1
        handle.append(batch)
        return len(batch), nbytes

    return op


def append_cases(
    backend: Backend, events: Sequence[Mapping[str, Any]], record_bytes: float, stack: contextlib.ExitStack
) -> tuple[list[Case], list[Result]]:
    """The append cases of one backend, or results saying why they cannot run."""
    store = backend.store
    name = backend.name
    ids = [append_id(name, f"batch-{n}") for n in BATCH_SIZES] + [
        append_id(name, "oneshot-1"), append_id(name, f"sessions-{ROUND_ROBIN_SESSIONS}")
    ]
    labels = [f"{name}: session handle, batch {n}" for n in BATCH_SIZES] + [
        f"{name}: one-shot store.append, batch 1",
        f"{name}: {ROUND_ROBIN_SESSIONS} sessions round-robin, batch 1",
    ]
    if store is None:
        groups = ["append"] * len(BATCH_SIZES) + ["append", "sessions"]
        return [], [skipped(i, g, l, backend.reason or "not available") for i, g, l in zip(ids, groups, labels)]
    cases: list[Case] = []
    results: list[Result] = []

    def build(case_id: str, label: str, make: Callable[[], Case]) -> None:
        try:
            cases.append(make())
        except Exception as exc:
            res = Result(case_id, "append", label, "records/s", status="error",
                         reason=f"setup failed: {type(exc).__name__}: {exc}")
            results.append(res)

    for n, case_id, label in zip(BATCH_SIZES, ids, labels):
        def make(n: int = n, case_id: str = case_id, label: str = label) -> Case:
            sid = backend.sid(f"append-{n}")
            store.create(sid)
            handle = store.session(sid)
            stack.callback(handle.close)
            return Case(case_id, "append", label, _handle_op(handle, _batches(events, n), int(n * record_bytes)),
                        meta={"backend": name, "batch": n, "mode": "handle"})
        build(case_id, label, make)

    def make_oneshot() -> Case:
        sid = backend.sid("oneshot")
        store.create(sid)
        batches = _batches(events, 1)
        state = [0]

        def op() -> Work:
            state[0] += 1
            store.append(sid, batches[state[0] % len(batches)])
            return 1, int(record_bytes)

        return Case(ids[3], "append", labels[3], op, meta={"backend": name, "batch": 1, "mode": "one-shot"})

    build(ids[3], labels[3], make_oneshot)

    def make_round_robin() -> Case:
        appenders = []
        for i in range(ROUND_ROBIN_SESSIONS):
            sid = backend.sid(f"rr-{i:03d}")
            store.create(sid)
            handle = store.session(sid)
            stack.callback(handle.close)
            appenders.append(handle.append)
        batches = _batches(events, 1, count=ROUND_ROBIN_SESSIONS)
        state = [0]

        def op() -> Work:
            i = state[0] % ROUND_ROBIN_SESSIONS
            state[0] += 1
            appenders[i](batches[i])
            return 1, int(record_bytes)

        return Case(ids[4], "sessions", labels[4], op,
                    meta={"backend": name, "batch": 1, "sessions": ROUND_ROBIN_SESSIONS, "mode": "handle"})

    build(ids[4], labels[4], make_round_robin)

    if hasattr(store, "append_group"):
        group_id = append_id(name, f"group-{ROUND_ROBIN_SESSIONS}")
        group_label = f"{name}: {ROUND_ROBIN_SESSIONS} sessions x 1 event, one store.append_group per commit"

        def make_group() -> Case:
            # The same work as the round-robin case (100 owned sessions, one event each),
            # committed as one transaction: group commit across sessions.
            handles = []
            for i in range(ROUND_ROBIN_SESSIONS):
                sid = backend.sid(f"grp-{i:03d}")
                store.create(sid)
                handle = store.session(sid)
                stack.callback(handle.close)
                handles.append(handle)
            batches = _batches(events, 1, count=ROUND_ROBIN_SESSIONS)
            items = list(zip(handles, batches))

            def op() -> Work:
                store.append_group(items)
                return ROUND_ROBIN_SESSIONS, int(ROUND_ROBIN_SESSIONS * record_bytes)

            return Case(group_id, "sessions", group_label, op,
                        meta={"backend": name, "batch": 1, "sessions": ROUND_ROBIN_SESSIONS, "mode": "group"})

        build(group_id, group_label, make_group)
    return cases, results


# --- write-behind ---------------------------------------------------------------------


def write_behind_id(backend: str, producers: int, mode: str = "producers") -> str:
    return f"write-behind/{backend}/{mode}-{producers}"


GROUP_SESSIONS = 100
"""Sessions (one producer each) of the cross-session group commit cases (SQL stores)."""


def write_behind_cases(backend: Backend, events: Sequence[Mapping[str, Any]], record_bytes: float,
                       stack: contextlib.ExitStack) -> tuple[list[Case], list[Result]]:
    """Group commit through the embedded writer (``sessionlog.writer.WriteBehind``): one
    session per case; P asyncio producers (P in :data:`PRODUCERS`), each appending one
    event at a time, :data:`PER_PRODUCER` events each per operation
    (:data:`LONE_PER_PRODUCER` for one producer), in two styles:
    ``await writer.append(id, [event])`` (``producers-P``) and
    ``writer.submit(id, [event]); await writer.flush(id)`` (``submit-flush-P``). The
    targets compare P=64 against ``append/<backend>/batch-1``, the two styles at P=64, and
    P=1 against a direct durable append (what the hop to the writer costs).

    On stores with ``append_group`` (SQL): :data:`GROUP_SESSIONS` sessions, one producer
    each awaiting every append, with group commit across sessions (``sessions-100``) and
    with one commit per session (``group_commit=False``: ``sessions-100-per-session``)."""
    styles = (("producers", "awaiting durability"), ("submit-flush", "submit + flush"))
    labels = {(mode, p): f"{backend.name}: write-behind, {p} producer{'s' if p > 1 else ''}, {what}"
              for mode, what in styles for p in PRODUCERS}
    try:
        from sessionlog.writer import WriteBehind
    except ImportError as exc:
        reason = f"no embedded writer (sessionlog.writer.WriteBehind): {exc}"
        return [], [skipped(write_behind_id(backend.name, p, mode), "write-behind", label, reason)
                    for (mode, p), label in labels.items()]
    cases: list[Case] = []
    results: list[Result] = []

    def build(case_id: str, label: str, make: Callable[[], Case]) -> None:
        try:
            cases.append(make())
        except Exception as exc:
            results.append(Result(case_id, "write-behind", label, "records/s",
                                  status="error", reason=f"setup failed: {type(exc).__name__}: {exc}"))

    for (mode, p), label in labels.items():
        build(write_behind_id(backend.name, p, mode), label,
              lambda mode=mode, p=p, label=label: _write_behind_case(WriteBehind, backend, p, label, events,
                                                                     record_bytes, stack, mode=mode))
    if callable(getattr(backend.store, "append_group", None)):
        for grouped, mode in ((True, "sessions"), (False, "sessions-per-session")):
            what = "one append_group" if grouped else "a commit per session"
            label = f"{backend.name}: write-behind, {GROUP_SESSIONS} sessions x 1 producer, {what}"
            build(write_behind_id(backend.name, GROUP_SESSIONS, mode), label,
                  lambda grouped=grouped, mode=mode, label=label: _group_case(
                      WriteBehind, backend, grouped, mode, label, events, record_bytes, stack))
    return cases, results


PER_PRODUCER = 8
"""Events each producer appends (one at a time, awaiting each) per operation."""

LONE_PER_PRODUCER = 64
"""The same for one producer: entering the loop (``run_until_complete``, tens of µs) is
then spread over 64 appends, not charged to 8 as a cost of the writer."""


def _write_behind_case(writer_cls: Any, backend: Backend, producers: int, label: str,
                       events: Sequence[Mapping[str, Any]], record_bytes: float, stack: contextlib.ExitStack,
                       *, mode: str = "producers") -> Case:
    store = backend.store
    sid = backend.sid(f"wb-{mode}-{producers}")
    store.create(sid)
    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    writer = writer_cls(store)
    stack.callback(lambda: loop.run_until_complete(writer.close()))
    # Owned before the rounds, as the direct append's handle is.
    loop.run_until_complete(writer.append(sid, [events[0]]))
    n = len(events)
    per = LONE_PER_PRODUCER if producers == 1 else PER_PRODUCER

    async def producer(k: int) -> None:
        for j in range(per):
            await writer.append(sid, [events[(k * per + j) % n]])

    async def submitter(k: int) -> None:
        for j in range(per):
            writer.submit(sid, [events[(k * per + j) % n]])
            await writer.flush(sid)

    body = producer if mode == "producers" else submitter

    async def all_producers() -> None:
        await asyncio.gather(*(body(k) for k in range(producers)))

    units = producers * per

    def op() -> Work:
        loop.run_until_complete(all_producers())
        return units, int(units * record_bytes)

    return Case(write_behind_id(backend.name, producers, mode), "write-behind", label, op,
                meta={"backend": backend.name, "producers": producers, "mode": mode})


def _group_case(writer_cls: Any, backend: Backend, grouped: bool, mode: str, label: str,
                events: Sequence[Mapping[str, Any]], record_bytes: float, stack: contextlib.ExitStack) -> Case:
    store = backend.store
    ids = [backend.sid(f"wb-{mode}-{i:03d}") for i in range(GROUP_SESSIONS)]
    for sid in ids:
        store.create(sid)
    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    writer = writer_cls(store, group_commit=grouped)
    stack.callback(lambda: loop.run_until_complete(writer.close()))
    n = len(events)
    per = 2

    async def producer(k: int) -> None:
        for j in range(per):
            await writer.append(ids[k], [events[(k * per + j) % n]])

    async def all_producers() -> None:
        await asyncio.gather(*(producer(k) for k in range(GROUP_SESSIONS)))

    loop.run_until_complete(all_producers())  # owns the 100 sessions before the rounds
    units = GROUP_SESSIONS * per

    def op() -> Work:
        loop.run_until_complete(all_producers())
        return units, int(units * record_bytes)

    return Case(write_behind_id(backend.name, GROUP_SESSIONS, mode), "write-behind", label, op,
                meta={"backend": backend.name, "sessions": GROUP_SESSIONS, "group_commit": grouped})
