"""Peers measured in the same run: what the same durable work costs elsewhere.

* stdlib ``sqlite3`` in WAL mode with ``synchronous=FULL`` (durable at commit), on the
  pinned table layout (``session_id, seq, record BLOB``, primary key ``(session_id,
  seq)``), inserting the append benchmarks' pre-encoded records:
  - ``commit-1``: one INSERT and COMMIT per event;
  - ``tail-commit-1``: the SQL backend's work per commit — ``BEGIN IMMEDIATE``, read the
    session's last seq, INSERT the next, COMMIT;
  - ``executemany-1024``: ``BEGIN IMMEDIATE``, read the last seq, ``executemany`` of
    1024 rows, COMMIT.
* openai-agents ``SQLiteSession.add_items`` of one item per call, with the SDK's own
  SQLite settings — only when the package is importable (it is not a dependency).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sqlite3

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


AGENTS_ID = "peer/openai-agents/add-items-1"
AGENTS_LABEL = "openai-agents SQLiteSession.add_items, 1 item per call"


def agents_cases(directory: str, texts: list[str], stack: contextlib.ExitStack) -> tuple[list[Case], list[Result]]:
    """``SQLiteSession.add_items`` of one item per call, if ``agents`` is importable."""
    if importlib.util.find_spec("agents") is None:
        return [], [skipped(AGENTS_ID, "peer", AGENTS_LABEL, "openai-agents is not installed")]
    try:
        from agents import SQLiteSession  # type: ignore[import-not-found]
    except Exception as exc:
        return [], [skipped(AGENTS_ID, "peer", AGENTS_LABEL, f"cannot import agents.SQLiteSession: {exc}")]
    loop = asyncio.new_event_loop()
    stack.callback(loop.close)
    session = SQLiteSession("bench", os.path.join(directory, "peer-agents.db"))
    if hasattr(session, "close"):
        stack.callback(session.close)
    items = [{"role": "user", "content": t} for t in texts]
    state = [0]

    def add_one() -> Work:
        item = items[state[0] % len(items)]
        state[0] += 1
        loop.run_until_complete(session.add_items([item]))
        return 1, len(item["content"])

    return [Case(AGENTS_ID, "peer", AGENTS_LABEL, add_one, meta={"batch": 1})], []


def agents_adapter_results() -> list[Result]:
    """HOOK(agents-adapter): sessionlog's OpenAI Agents SDK session adapter, measured with
    ``add_items`` of one item per call against :data:`AGENTS_ID`, both durable. The adapter
    does not exist yet; when it does, build a Case like :func:`agents_cases` over it."""
    return [skipped("adapter/openai-agents/add-items-1", "peer", "sessionlog Agents SDK adapter, add_items 1 item",
                    "no OpenAI Agents SDK session adapter in sessionlog yet")]

