"""The Python work of an append: ``sessionlog.scan.encode_batch`` (validate, encode,
prove) on batches of 1024 events, no I/O. The SQL backends' appends run it; JSONL and
Zstd run ``encode_block``, the same rules and fast path building one block instead of a
line per record. What remains of a durable append is the write and the sync.

Two reference batches (flat events of scalars; events of the generated transcript, with
nesting and their own ``ts``) measured in events/s against the per-event targets, and one
case per adversarial shape (values the fast path must decline or prove another way)
measured in bytes/s against the transcript batch: a shape that made the encoder
quadratic would show as a ratio near zero.
"""

from __future__ import annotations

import itertools
from types import MappingProxyType
from collections.abc import Callable
from typing import Any

import msgspec

from .rounds import Case, Work

BATCH = 1024


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def flat_batch() -> list[dict[str, Any]]:
    return [{"type": "llm/retry", "attempt": i, "model": "gpt-x", "delay": 0.5, "ok": True} for i in range(BATCH)]


def transcript_batch(n: int = BATCH) -> list[dict[str, Any]]:
    from .transcript import events

    return list(itertools.islice(events(3), n))


def _wide(base: list[dict[str, Any]], members: int) -> list[dict[str, Any]]:
    return [dict(base[0], **{f"k{j}": j for j in range(members)}), *base[1:]]


SHAPES: dict[str, tuple[str, Callable[[list[dict[str, Any]]], list[Any]]]] = {
    "deep": ("every 8th event holds a value nested 120 deep",
             lambda base: [dict(e, deep=_nested(120)) if i % 8 == 0 else e for i, e in enumerate(base)]),
    "raw": ("every event holds a msgspec.Raw (pre-encoded JSON, proven on its bytes)",
            lambda base: [dict(e, raw=msgspec.Raw(b'{"k":[1,2,{"x":"y"}]}')) for e in base]),
    "mapping": ("every 8th event a read-only mapping, not a dict (the exact path: each event alone)",
                lambda base: [MappingProxyType(e) if i % 8 == 0 else e for i, e in enumerate(base)]),
    "wide": ("one event of 20,000 members in the batch", lambda base: _wide(base, 20_000)),
    "long-string": ("every event holds a 16,385-character string of quotes, backslashes, line breaks and "
                    "non-ASCII text (about 36 KB as JSON)",
                    lambda base: [dict(e, blob='"\\\n\u00e9\u2028' * 3277) for e in base]),
}
"""Adversarial batches: the transcript batch with a twist that takes the encoder off its
fast path."""


def encode_id(what: str) -> str:
    return f"encode/{what}"


def shape_id(shape: str) -> str:
    return f"encode-shape/{shape}"


SCALED: dict[str, tuple[str, str]] = {
    "transcript": (f"{BATCH} transcript events", f"{4 * BATCH} transcript events"),
    "wide": ("one event of 20,000 members alone", "one event of 80,000 members alone"),
}
"""Batches at two sizes, 4x apart, compared in bytes/s: a linear encoder keeps its rate,
one quadratic in the number of events or in one event's size drops to about a quarter
(a slow constant alone does not move this ratio)."""


def scaled_id(what: str, times: int) -> str:
    """The case of ``what`` at ``times`` its size (the transcript batch at 1x is the
    shapes' reference case, measured once)."""
    return shape_id("transcript") if (what, times) == ("transcript", 1) else f"encode-scale/{what}-{times}x"


def _case(case_id: str, group: str, label: str, batch: list[Any], unit: str) -> Case:
    from sessionlog.scan import Limits, encode_batch

    # Limits that take every batch here whole: what is measured is the work per event.
    limits = Limits(record_limit=1 << 24, batch_limit=1 << 30)
    nbytes = sum(map(len, encode_batch(batch, 2, limits))) + len(batch)

    def op() -> Work:
        encode_batch(batch, 2, limits)
        return (len(batch) if unit == "events/s" else nbytes), nbytes

    return Case(case_id, group, label, op, unit=unit, meta={"events": len(batch), "bytes": nbytes})


def floor_id(what: str) -> str:
    """msgspec alone encoding the same batch: the floor under ``encode_id(what)``."""
    return f"encode/msgspec-{what}"


def _floor_case(what: str, batch: list[dict[str, Any]]) -> Case:
    """``msgspec.json.Encoder().encode_lines`` of the same events, nothing else: no
    envelope, no checks. What any encoder of these events pays on this machine, so the
    per-event figures above can be read against the CPU they ran on."""
    encoder = msgspec.json.Encoder()
    nbytes = len(encoder.encode_lines(batch))

    def op() -> Work:
        encoder.encode_lines(batch)
        return len(batch), nbytes

    return Case(floor_id(what), "encode", f"msgspec encode_lines alone, the same {BATCH} {what} events", op,
                unit="events/s", meta={"events": len(batch), "bytes": nbytes})


def encode_cases() -> list[Case]:
    """The reference batches (events/s and bytes/s of the transcript one) with msgspec's
    own encoding of each as its floor, one case per :data:`SHAPES` entry and one per
    :data:`SCALED` entry (bytes/s)."""
    flat, transcript = flat_batch(), transcript_batch()
    cases = [
        _case(encode_id("flat"), "encode", f"encode_batch of {BATCH} flat events (scalars)", flat, "events/s"),
        _floor_case("flat", flat),
        _case(encode_id("transcript"), "encode", f"encode_batch of {BATCH} transcript events", transcript,
              "events/s"),
        _floor_case("transcript", transcript),
        _case(shape_id("transcript"), "encode-shape", f"encode_batch of {BATCH} transcript events (bytes)",
              transcript, "bytes/s"),
    ]
    for shape, (what, make) in SHAPES.items():
        cases.append(_case(shape_id(shape), "encode-shape", f"encode_batch: {what}", make(transcript), "bytes/s"))
    scaled = {"transcript": (transcript, transcript_batch(4 * BATCH)),
              "wide": (_wide(transcript, 20_000)[:1], _wide(transcript, 80_000)[:1])}
    for what, labels in SCALED.items():
        for times, label, batch in zip((1, 4), labels, scaled[what]):
            if scaled_id(what, times).startswith(shape_id("")):
                continue  # measured above
            cases.append(_case(scaled_id(what, times), "encode-scale", f"encode_batch of {label} (bytes)", batch,
                               "bytes/s"))
    return cases
