"""Interleaved rounds: every case runs once per round (A B C A B C ...), medians at the end.

On a noisy shared machine a lone absolute time says little; two figures taken minutes
apart say little more. So all cases of a run share the same rounds: round 1 runs each
case once, round 2 runs each case again, and so on. A case's figure is the median of its
rounds, and every ratio compares two medians taken in the same rounds.

A :class:`Case` is one operation (``op``) plus how a round runs it: repeated until the
round's time budget is spent (appends: many fsyncs per round), or once (a scan of 200k
records, a repair). ``op`` returns the work it did: units (records) and bytes.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Work = tuple[int, int]
"""What one operation did: (units, bytes). Units are records unless a case says otherwise."""


@dataclass(slots=True)
class Case:
    """One measured operation. ``timed=True`` repeats ``op`` until the round's budget is
    spent; ``timed=False`` runs it once per round. ``reset`` (untimed) runs after each
    round, e.g. to truncate a ceiling file so the temp directory stays small."""

    id: str
    group: str
    label: str
    op: Callable[[], Work]
    timed: bool = True
    unit: str = "records/s"
    reset: Callable[[], None] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Result:
    """A case's figures: the median rate over rounds (units/s), MB/s (10^6 bytes), the
    median seconds per operation, and every round's rate. ``status`` is "ok", "skipped"
    (the thing measured is not there; ``reason`` says why) or "error" (it raised)."""

    id: str
    group: str
    label: str
    unit: str
    status: str = "ok"
    reason: str | None = None
    median: float | None = None
    mb_per_s: float | None = None
    seconds_per_op: float | None = None
    rounds: list[float] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    _samples: list[tuple[float, float, float, int]] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": self.group,
            "label": self.label,
            "unit": self.unit,
            "status": self.status,
            "reason": self.reason,
            "median": self.median,
            "mb_per_s": self.mb_per_s,
            "seconds_per_op": self.seconds_per_op,
            "rounds": self.rounds,
        }
        out.update(self.meta)
        return out


def skipped(id: str, group: str, label: str, reason: str, unit: str = "records/s") -> Result:
    """The result of a case whose subject is not there (a backend not built yet)."""
    return Result(id, group, label, unit, status="skipped", reason=reason)


def _one_round(case: Case, budget: float) -> tuple[float, float, float, int]:
    """Run ``case`` for one round; returns (units, bytes, seconds, operations)."""
    op = case.op
    clock = time.perf_counter
    units = nbytes = ops = 0
    start = clock()
    if case.timed:
        deadline = start + budget
        while True:
            u, b = op()
            units += u
            nbytes += b
            ops += 1
            now = clock()
            if now >= deadline:
                break
    else:
        units, nbytes = op()
        ops = 1
        now = clock()
    return units, nbytes, now - start, ops


def run_interleaved(
    cases: Sequence[Case],
    rounds: int,
    budget: float,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Result]:
    """Run every case once per round, in order, for ``rounds`` rounds; return results by id.

    A case that raises is reported with status "error" and left out of later rounds; the
    others go on.

    What the run set up before the rounds (the scan corpus, stores, event pools: hundreds
    of MB of objects) is frozen out of the cyclic garbage collector for the rounds
    (``gc.freeze``), and each case round starts after a collection: a case pays for the
    garbage it makes, not for the harness's heap, whichever round a full collection
    happens to fall in."""
    results = {c.id: Result(c.id, c.group, c.label, c.unit, meta=dict(c.meta)) for c in cases}
    live = list(cases)
    gc.collect()
    gc.freeze()
    try:
        _rounds(live, results, rounds, budget, progress)
    finally:
        gc.unfreeze()
    for res in results.values():
        if res.status != "ok" or not res._samples:
            continue
        res.median = statistics.median(res.rounds)
        res.mb_per_s = statistics.median(b / s / 1e6 if s > 0 else 0.0 for _, b, s, _ in res._samples)
        res.seconds_per_op = statistics.median(s / n for _, _, s, n in res._samples)
    return results


def _rounds(live: list[Case], results: dict[str, Result], rounds: int, budget: float,
            progress: Callable[[str], None] | None) -> None:
    for r in range(rounds):
        if progress is not None:
            progress(f"round {r + 1}/{rounds}")
        for case in list(live):
            res = results[case.id]
            gc.collect()
            try:
                units, nbytes, seconds, ops = _one_round(case, budget)
                if case.reset is not None:
                    case.reset()
            except Exception as exc:  # a backend under construction must not sink the run
                res.status = "error"
                res.reason = f"{type(exc).__name__}: {exc}"
                live.remove(case)
                print(f"bench: {case.id} failed: {res.reason}", file=sys.stderr)
                continue
            res._samples.append((units, nbytes, seconds, ops))
            res.rounds.append(units / seconds if seconds > 0 else 0.0)
