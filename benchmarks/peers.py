"""Peers measured in the same run: what the same durable work costs elsewhere.

* stdlib ``sqlite3`` in WAL mode with ``synchronous=FULL`` (durable at commit), on the
  pinned table layout (``session_id, seq, record BLOB``, primary key ``(session_id,
  seq)``), inserting the append benchmarks' pre-encoded records:
  - ``commit-1``: one INSERT and COMMIT per event;
  - ``tail-commit-1``: the SQL backend's work per commit — ``BEGIN IMMEDIATE``, read the
    session's last seq, INSERT the next, COMMIT;
  - ``executemany-1024``: ``BEGIN IMMEDIATE``, read the last seq, ``executemany`` of
    1024 rows, COMMIT.
* openai-agents ``SQLiteSession.add_items`` (file-backed, WAL, the SDK's own settings:
  ``synchronous`` is the library default, FULL in the builds we know of, so one
  fdatasync of the WAL per call; the row is skipped where it would be weaker) against
  sessionlog's ``SessionLogSession`` on a JSONL store (one write and one fdatasync per
  call), one item per call and a turn's worth (a user message, two calls, their outputs,
  the answer) per call — only when the package is importable
  (``pip install 'sessionlog[agents]'``). Both run from the same event loop; the SDK's
  call hops to a worker thread (its design), ours runs inline. Not the same sync, though:
  the WAL is overwritten in place after each checkpoint, while a JSONL append grows the
  file, and on ext4 an fdatasync that changes the size also commits the journal — the
  costlier sync of the two, more so when other writers share the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import sqlite3
from typing import Any

from .rounds import Case, Result, Work, skipped

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
)
"""


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    conn.execute("PRAGMA synchronous=FULL")
    if mode.lower() != "wal" or conn.execute("PRAGMA synchronous").fetchone()[0] != 2:
        raise RuntimeError(f"{path}: could not set WAL with synchronous=FULL")
    conn.execute(_SCHEMA)
    return conn


def sqlite3_cases(directory: str, lines: list[bytes], stack: contextlib.ExitStack) -> list[Case]:
    """The stdlib sqlite3 peer cases (one database each, removed with ``directory``)."""
    cases = []
    n = len(lines)

    def make(name: str) -> sqlite3.Connection:
        conn = _connect(os.path.join(directory, f"peer-{name}.db"))
        stack.callback(conn.close)
        return conn

    conn1 = make("commit-1")
    seq1 = [0]

    def commit_1() -> Work:
        seq1[0] += 1
        line = lines[seq1[0] % n]
        conn1.execute("BEGIN")
        conn1.execute("INSERT INTO records VALUES (?, ?, ?)", ("s", seq1[0], line))
        conn1.execute("COMMIT")  # durable: synchronous=FULL syncs the WAL at commit
        return 1, len(line) + 1

    cases.append(Case("peer/sqlite3/commit-1", "peer", "stdlib sqlite3 WAL FULL: insert+commit per event",
                      commit_1, meta={"batch": 1}))

    conn2 = make("tail-commit-1")

    def tail_commit_1() -> Work:
        conn2.execute("BEGIN IMMEDIATE")
        last = conn2.execute("SELECT max(seq) FROM records WHERE session_id = ?", ("s",)).fetchone()[0] or 0
        line = lines[last % n]
        conn2.execute("INSERT INTO records VALUES (?, ?, ?)", ("s", last + 1, line))
        conn2.execute("COMMIT")
        return 1, len(line) + 1

    cases.append(Case("peer/sqlite3/tail-commit-1", "peer",
                      "stdlib sqlite3 WAL FULL: read tail+insert+commit per event", tail_commit_1,
                      meta={"batch": 1}))

    conn3 = make("executemany-1024")
    block = [lines[i % n] for i in range(1024)]
    block_bytes = sum(len(x) + 1 for x in block)

    def executemany_1024() -> Work:
        conn3.execute("BEGIN IMMEDIATE")
        last = conn3.execute("SELECT max(seq) FROM records WHERE session_id = ?", ("s",)).fetchone()[0] or 0
        conn3.executemany("INSERT INTO records VALUES (?, ?, ?)",
                          [("s", last + 1 + i, line) for i, line in enumerate(block)])
        conn3.execute("COMMIT")
        return 1024, block_bytes

    cases.append(Case("peer/sqlite3/executemany-1024", "peer",
                      "stdlib sqlite3 WAL FULL: executemany 1024 per commit", executemany_1024,
                      meta={"batch": 1024}))
    return cases


TURN_ITEMS = 6
AGENTS_ID = "peer/openai-agents/add-items-1"
AGENTS_LABEL = "openai-agents SQLiteSession.add_items, 1 item per call"
AGENTS_TURN_ID = "peer/openai-agents/add-items-turn"
AGENTS_TURN_LABEL = f"openai-agents SQLiteSession.add_items, a turn ({TURN_ITEMS} items) per call"
ADAPTER_ID = "adapter/openai-agents/add-items-1"
ADAPTER_LABEL = "sessionlog SessionLogSession (jsonl).add_items, 1 item per call"
ADAPTER_TURN_ID = "adapter/openai-agents/add-items-turn"
ADAPTER_TURN_LABEL = f"sessionlog SessionLogSession (jsonl).add_items, a turn ({TURN_ITEMS} items) per call"


def agent_turn(texts: list[str], n: int) -> list[dict[str, Any]]:
    """The items the Runner saves for one turn with two parallel calls: the user message,
    two function calls, their outputs and the answer (texts from the benchmark's pool)."""
    def text(k: int) -> str:
        return texts[(4 * n + k) % len(texts)]

    a, b = f"call_{n}_a", f"call_{n}_b"
    return [
        {"role": "user", "content": text(0)},
        {"type": "function_call", "id": f"fc_{n}_a", "call_id": a, "name": "deploy",
         "arguments": json.dumps({"note": text(1)[:120]})},
        {"type": "function_call", "id": f"fc_{n}_b", "call_id": b, "name": "notify",
         "arguments": json.dumps({"note": text(2)[:120]})},
        {"type": "function_call_output", "call_id": a, "output": text(1)},
        {"type": "function_call_output", "call_id": b, "output": text(2)},
        {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": text(3), "annotations": [], "logprobs": []}]},
    ]


def _add_items_cases(session: Any, loop: asyncio.AbstractEventLoop, texts: list[str],
                     ids: tuple[str, str], labels: tuple[str, str], group: str) -> list[Case]:
    """Two cases over one Agents SDK session: ``add_items`` of one user item per call and
    of a whole turn per call (each call durable on return). Units are items."""
    users = [{"role": "user", "content": t} for t in texts]
    user_bytes = [len(json.dumps(u)) for u in users]
    turns = [agent_turn(texts, n) for n in range(max(1, len(texts) // 4))]
    turn_bytes = [sum(len(json.dumps(i)) for i in t) for t in turns]
    state = [0, 0]

    def add_one() -> Work:
        k = state[0] % len(users)
        state[0] += 1
        loop.run_until_complete(session.add_items([users[k]]))
        return 1, user_bytes[k]

    def add_turn() -> Work:
        k = state[1] % len(turns)
        state[1] += 1
        loop.run_until_complete(session.add_items(turns[k]))
        return len(turns[k]), turn_bytes[k]

    return [Case(ids[0], group, labels[0], add_one, unit="items/s", meta={"batch": 1}),
            Case(ids[1], group, labels[1], add_turn, unit="items/s", meta={"batch": TURN_ITEMS})]


def _agents_missing() -> str | None:
    if importlib.util.find_spec("agents") is None:
        return "openai-agents is not installed (pip install 'sessionlog[agents]')"
    return None


def agents_cases(directory: str, texts: list[str], stack: contextlib.ExitStack) -> tuple[list[Case], list[Result]]:
    """The SDK's own ``SQLiteSession`` (file-backed, WAL, the SDK's settings): ``add_items``
    of one item and of a turn per call, if ``agents`` is importable."""
    missing = _agents_missing()
    ids, labels = (AGENTS_ID, AGENTS_TURN_ID), (AGENTS_LABEL, AGENTS_TURN_LABEL)
    if missing is None:
        try:
            from agents import SQLiteSession  # type: ignore[import-not-found]
        except Exception as exc:
            missing = f"cannot import agents.SQLiteSession: {exc}"
    if missing is not None:
        return [], [skipped(i, "peer", label, missing, "items/s") for i, label in zip(ids, labels)]
    path = os.path.join(directory, "peer-agents.db")
    session = SQLiteSession("bench", path)
    stack.callback(session.close)
    # The SDK sets WAL and leaves ``synchronous`` at the library's default: compare only
    # against a durable peer (FULL syncs the WAL at every commit: one fdatasync per call).
    durability = _sqlite_durability(path)
    if durability["journal_mode"] != "wal" or durability["synchronous"] < 2:
        reason = f"SQLiteSession would not be durable at commit here ({durability})"
        return [], [skipped(i, "peer", label, reason, "items/s") for i, label in zip(ids, labels)]
    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    cases = _add_items_cases(session, loop, texts, ids, labels, "peer")
    for case in cases:
        case.meta.update(durability)
    return cases, []


def _sqlite_durability(path: str) -> dict[str, Any]:
    """The journal mode of the database at ``path`` and the ``synchronous`` level a new
    connection gets (what the SDK's connections run with: it never sets it)."""
    conn = sqlite3.connect(path)
    try:
        return {"journal_mode": str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower(),
                "synchronous": int(conn.execute("PRAGMA synchronous").fetchone()[0])}
    finally:
        conn.close()


def agents_adapter_cases(directory: str, texts: list[str], stack: contextlib.ExitStack,
                         ) -> tuple[list[Case], list[Result]]:
    """sessionlog's ``SessionLogSession`` on a JSONL store, the same calls as
    :func:`agents_cases` (both durable on return)."""
    ids, labels = (ADAPTER_ID, ADAPTER_TURN_ID), (ADAPTER_LABEL, ADAPTER_TURN_LABEL)
    missing = _agents_missing()
    if missing is not None:
        return [], [skipped(i, "peer", label, missing, "items/s") for i, label in zip(ids, labels)]
    from sessionlog.integrations.openai_agents import SessionLogSession

    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    session = SessionLogSession("bench", store=f"jsonl:{os.path.join(directory, 'agents-adapter')}")
    stack.callback(session.close)
    return _add_items_cases(session, loop, texts, ids, labels, "peer"), []
