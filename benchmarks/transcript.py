"""A deterministic generator of realistic agent session transcripts.

Benchmarks need logs that look like what agent runtimes write — not one event repeated —
because compression ratio and scan speed depend on it. Given a seed, :func:`events`
yields the same stream of session events every time (``random.Random(seed)``, no other
source of randomness), in the core vocabulary of docs/format.md:

``turn/start``, ``user/message``, then per step ``step/start``, ``assistant/message``
(``content`` text or null, ``tool_calls`` with JSON-object ``arguments``), for each call a
``tool/call`` and its ``tool/result``, ``step/end``; the last step of a turn answers in
text without calls; ``turn/end`` with status ``completed``.

What it is made of (the parameters of :class:`Shape`, defaults in brackets):

* Text is English-like: words drawn from a fixed vocabulary of about 400 common and
  technical words with Zipf frequencies (``zipf_s`` [1.1]); user messages are
  ``user_words`` [median 28] words, an assistant's preface before its calls
  ``preface_words`` [median 18] (``preface_p`` [0.5] of calls have one, the rest null),
  final answers ``answer_words`` [median 120], some with a code block.
* A turn has ``1 + Geometric(mean_steps - 1)`` steps [mean 3.5]; each step but the last
  calls tools: one call, or with probability ``parallel_p`` [0.25] two or three in
  parallel.
* Tools and their outputs, drawn with fixed weights: ``read_file`` (Python source of a
  generated project of 160 files, each with its own dozen identifiers and the same
  content on every read, as agents re-read files), ``grep`` (``path:line: text`` matches
  from those files), ``run_shell`` (pytest runs,
  git logs with hashes, build logs with timestamps), ``list_dir``, ``web_search`` (a JSON
  list of results with URLs and snippets), ``write_file`` (the file content is in the
  call's arguments, the output is one line), ``edit_file`` (old lines taken from the file,
  new lines generated, in the arguments).
  Output sizes are log-normal with a per-tool median, overall median about 1 KB, capped at
  ``max_output`` [16 KiB] like a runtime's output truncation; about ``error_p`` [0.06] of
  results are errors.
* Call ids are ``call_`` + 24 random letters and digits, as providers issue them
  (incompressible, as in real logs); timestamps advance by model latency (1-20 s) and
  tool run time (lognormal, median 0.4 s), with millisecond resolution.

Everything here is pure: bytes and dicts out, no files. :func:`session_lines` encodes a
whole session (header first) with the engine's own ``encode_record``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sessionlog.events import encode_record, header_event

_WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by not word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big high
such follow act why ask men change went light kind off need house picture try us again animal
point mother world near build self earth father file function test error value return module
class config request response server client cache index query table column row record session
event tool call result output input message model token step turn retry timeout failure
commit branch merge diff patch build deploy version release package dependency import export
path directory handler parser buffer stream offset length size limit batch queue worker
thread process signal lock durable sync write flush scan repair log entry header format
string integer list dict object field schema type check assert expected actual missing
invalid update create delete fetch load save parse render validate compute measure report
user assistant system prompt context window summary plan task goal issue bug fix feature
refactor cleanup rename move split merge document explain suggest verify confirm review
should could would might will can need because since while until unless although however
therefore instead already still just only also perhaps probably actually really simply
first second next last final previous current new old same different other another each
""".split()

_EXTS = ["py", "py", "py", "md", "toml", "json", "yaml", "txt", "sh"]
_DIRS = ["src", "src/core", "src/api", "src/storage", "tests", "tests/unit", "docs", "scripts", "tools"]
_ALNUM = string.ascii_letters + string.digits
_HEX = "0123456789abcdef"


@dataclass(frozen=True, slots=True)
class Shape:
    """The generator's parameters (see the module docstring for what each one shapes)."""

    zipf_s: float = 1.1
    user_words: int = 28
    preface_words: int = 18
    preface_p: float = 0.5
    answer_words: int = 120
    mean_steps: float = 3.5
    parallel_p: float = 0.25
    error_p: float = 0.06
    max_output: int = 16 * 1024
    start_ts: float = 1_735_689_600.0  # 2025-01-01T00:00:00Z


DEFAULT_SHAPE = Shape()

# (tool name, weight, median output bytes)
_TOOLS: list[tuple[str, float, int]] = [
    ("read_file", 0.26, 2400),
    ("grep", 0.16, 900),
    ("run_shell", 0.22, 1400),
    ("list_dir", 0.10, 500),
    ("web_search", 0.08, 1800),
    ("write_file", 0.09, 40),
    ("edit_file", 0.09, 60),
]


class _Gen:
    """The state of one generated transcript (its random stream, clock and project)."""

    def __init__(self, seed: int, shape: Shape) -> None:
        self.rng = random.Random(seed)
        self.shape = shape
        self.ts = shape.start_ts + self.rng.randrange(0, 86_400 * 30)
        weights = [1.0 / (rank + 1) ** shape.zipf_s for rank in range(len(_WORDS))]
        self.cum_words = list(itertools.accumulate(weights))
        self.tool_names = [t[0] for t in _TOOLS]
        self.tool_cum = list(itertools.accumulate(t[1] for t in _TOOLS))
        self.tool_median = {t[0]: t[2] for t in _TOOLS}
        self.files = [self._new_path() for _ in range(160)]
        self.idents = [self._ident() for _ in range(300)]
        self.sources: dict[str, list[str]] = {}

    # -- pieces ------------------------------------------------------------------------

    def words(self, n: int) -> list[str]:
        return self.rng.choices(_WORDS, cum_weights=self.cum_words, k=n)

    def sentence_text(self, n_words: int) -> str:
        words = self.words(max(1, n_words))
        out: list[str] = []
        i = 0
        while i < len(words):
            k = self.rng.randint(6, 16)
            chunk = words[i : i + k]
            chunk[0] = chunk[0].capitalize()
            if self.rng.random() < 0.15:
                chunk.insert(self.rng.randrange(len(chunk)), "`" + self.rng.choice(self.idents) + "`")
            out.append(" ".join(chunk) + self.rng.choice([".", ".", ".", "?", ":", "."]))
            i += k
        return " ".join(out)

    def lognormal(self, median: float, sigma: float = 0.9) -> float:
        return median * math.exp(self.rng.gauss(0.0, sigma))

    def count(self, median: float, sigma: float = 0.7) -> int:
        return max(1, int(self.lognormal(median, sigma)))

    def _ident(self) -> str:
        parts = self.words(self.rng.randint(1, 3))
        if self.rng.random() < 0.3:
            return "".join(p.capitalize() for p in parts)
        return "_".join(parts)

    def _new_path(self) -> str:
        name = "_".join(self.words(self.rng.randint(1, 2)))
        return f"{self.rng.choice(_DIRS)}/{name}.{self.rng.choice(_EXTS)}"

    def call_id(self) -> str:
        return "call_" + "".join(self.rng.choices(_ALNUM, k=24))

    def sha(self, n: int = 40) -> str:
        return "".join(self.rng.choices(_HEX, k=n))

    def clock(self, seconds: float) -> float:
        self.ts += seconds
        return round(self.ts, 3)

    def cap(self, text: str, target: float) -> str:
        limit = min(int(target), self.shape.max_output)
        if len(text) <= limit:
            return text
        return text[:limit] + f"\n... [output truncated, {len(text) - limit} more characters]"

    # -- tool bodies -------------------------------------------------------------------

    def code_lines(self, n: int, idents: list[str] | None = None) -> list[str]:
        """``n`` lines of Python-like source using ``idents`` (a file's own names)."""
        rng = self.rng
        idents = idents if idents is not None else rng.sample(self.idents, 12)
        lines: list[str] = []
        indent = ""
        for _ in range(n):
            r = rng.random()
            a, b, c = rng.choice(idents), rng.choice(idents), rng.choice(idents)
            if r < 0.08:
                lines.append(f"def {a}({b}: str, {c}: int = {rng.randint(0, 64)}) -> {rng.choice(['None', 'bool', 'str', 'dict[str, Any]'])}:")
                indent = "    "
            elif r < 0.12:
                lines.append(f"class {a.title().replace('_', '')}({rng.choice(['Exception', 'Protocol', 'object'])}):")
                indent = "    "
            elif r < 0.2:
                lines.append(f"{indent}# {self.sentence_text(rng.randint(4, 12))}")
            elif r < 0.3:
                lines.append(f"{indent}if {a} is None or {b} > {rng.randint(0, 1000)}:")
                lines.append(f"{indent}    raise ValueError(f\"{{{a}!r}}: {' '.join(self.words(4))}\")")
            elif r < 0.42:
                lines.append(f"{indent}return {a}.{b}({c}, {rng.choice(['True', 'False', 'None', repr(rng.choice(_WORDS))])})")
            elif r < 0.5:
                lines.append("")
            elif r < 0.56:
                lines.append(f"from .{a} import {b}, {c}")
            else:
                lines.append(f"{indent}{a} = {b}.get({rng.choice(_WORDS)!r}, {rng.randint(0, 4096)})")
        return lines

    def source(self, path: str) -> list[str]:
        """The content of a project file: generated once, the same on every read (agents
        re-read files), with the file's own dozen identifiers."""
        lines = self.sources.get(path)
        if lines is None:
            n = max(8, int(self.lognormal(110, 0.8)))
            lines = self.sources[path] = self.code_lines(n, self.rng.sample(self.idents, 14))
        return lines

    def output_for(self, name: str, args: dict[str, Any]) -> tuple[str, bool]:
        rng = self.rng
        target = self.lognormal(self.tool_median[name])
        if rng.random() < self.shape.error_p:
            msg = rng.choice([
                f"Error: [Errno 2] No such file or directory: '{rng.choice(self.files)}'",
                f"Error: command exited with status {rng.randint(1, 2)}\n" + self.sentence_text(rng.randint(5, 30)),
                f"Error: timed out after {rng.choice([30, 60, 120])} seconds",
                f"Traceback (most recent call last):\n  File \"{rng.choice(self.files)}\", line {rng.randint(1, 900)}, in {rng.choice(self.idents)}\n"
                f"{rng.choice(['KeyError', 'TypeError', 'AssertionError', 'RuntimeError'])}: {' '.join(self.words(rng.randint(3, 10)))}",
            ])
            return msg, True
        if name == "read_file":
            lines = self.source(args["path"])
            first = args.get("start_line", 1)
            last = min(len(lines), args.get("end_line", len(lines)))
            text = "\n".join(f"{i:>5}\t{lines[i - 1]}" for i in range(min(first, len(lines)), last + 1))
            target = len(text)
        elif name == "grep":
            rows = []
            for _ in range(max(1, int(target / 70))):
                path = rng.choice(self.files)
                src = self.source(path)
                i = rng.randrange(len(src))
                rows.append(f"{path}:{i + 1}:{src[i]}")
            text = "\n".join(rows)
        elif name == "run_shell":
            kind = rng.random()
            if kind < 0.4:
                rows = [
                    f"tests/{rng.choice(['unit', 'integration'])}/test_{rng.choice(self.idents)}.py::test_{rng.choice(self.idents)} "
                    f"{rng.choice(['PASSED', 'PASSED', 'PASSED', 'PASSED', 'FAILED', 'SKIPPED'])} [{rng.randint(1, 100):>3}%]"
                    for _ in range(max(1, int(target / 80)))
                ]
                rows.append(f"==== {rng.randint(1, 400)} passed, {rng.randint(0, 5)} failed in {rng.uniform(0.3, 90):.2f}s ====")
                text = "\n".join(rows)
            elif kind < 0.7:
                text = "\n".join(
                    f"commit {self.sha()}\nAuthor: {rng.choice(_WORDS).title()} <{rng.choice(_WORDS)}@example.com>\n"
                    f"Date:   {rng.randint(1, 28)} {rng.choice(['Jan', 'Feb', 'Mar', 'Apr'])} 2025\n\n    {self.sentence_text(rng.randint(5, 14))}\n"
                    for _ in range(max(1, int(target / 200)))
                )
            else:
                text = "\n".join(
                    f"2025-0{rng.randint(1, 9)}-{rng.randint(10, 28)}T{rng.randint(10, 23)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}."
                    f"{rng.randint(100, 999)}Z {rng.choice(['INFO', 'INFO', 'DEBUG', 'WARN', 'ERROR'])} "
                    f"[{rng.choice(self.idents)}] {self.sentence_text(rng.randint(4, 14))}"
                    for _ in range(max(1, int(target / 110)))
                )
        elif name == "list_dir":
            text = "\n".join(
                f"{rng.choice(['-rw-r--r--', 'drwxr-xr-x'])} {rng.randint(0, 99999):>6} {p}"
                for p in rng.sample(self.files, min(len(self.files), max(1, int(target / 45))))
            )
        elif name == "web_search":
            results = [
                {
                    "title": self.sentence_text(rng.randint(4, 10)).rstrip(".?:"),
                    "url": f"https://{rng.choice(_WORDS)}.{rng.choice(['com', 'org', 'io', 'dev'])}/{'/'.join(self.words(rng.randint(1, 3)))}",
                    "snippet": self.sentence_text(rng.randint(15, 45)),
                }
                for _ in range(max(1, int(target / 320)))
            ]
            text = json.dumps(results, indent=rng.choice([None, 2]))
        elif name == "write_file":
            text = f"Wrote {len(args.get('content', ''))} bytes to {args.get('path')}"
        else:
            text = f"Edited {args.get('path')}: replaced 1 occurrence"
        return self.cap(text, max(target, 30) * 1.5), False

    def arguments_for(self, name: str) -> dict[str, Any]:
        rng = self.rng
        path = rng.choice(self.files)
        if name == "read_file":
            args: dict[str, Any] = {"path": path}
            if rng.random() < 0.3:
                args["start_line"] = rng.randint(1, 400)
                args["end_line"] = args["start_line"] + rng.randint(20, 200)
            return args
        if name == "grep":
            return {"pattern": rng.choice(self.idents), "path": rng.choice(_DIRS), "case_sensitive": rng.random() < 0.7}
        if name == "run_shell":
            return {"command": rng.choice([
                f"python -m pytest {rng.choice(_DIRS)} -x -q",
                "git log --oneline -n 20",
                f"git diff -- {path}",
                f"ruff check {rng.choice(_DIRS)}",
                f"tail -n 200 logs/{rng.choice(self.idents)}.log",
            ]), "timeout": rng.choice([30, 60, 120, 300])}
        if name == "list_dir":
            return {"path": rng.choice(_DIRS), "recursive": rng.random() < 0.3}
        if name == "web_search":
            return {"query": " ".join(self.words(rng.randint(3, 8))), "max_results": rng.choice([5, 10])}
        if name == "write_file":
            return {"path": path, "content": "\n".join(self.code_lines(rng.randint(5, 60)))}
        src = self.source(path)
        i = rng.randrange(len(src))
        return {
            "path": path,
            "old_string": "\n".join(src[i : i + rng.randint(1, 6)]),
            "new_string": "\n".join(self.code_lines(rng.randint(1, 8))),
        }

    def tool_name(self) -> str:
        return self.rng.choices(self.tool_names, cum_weights=self.tool_cum, k=1)[0]


def events(seed: int = 0, shape: Shape = DEFAULT_SHAPE, *, first_turn: int = 1) -> Iterator[dict[str, Any]]:
    """An endless, deterministic stream of session events (no ``seq``; ``ts`` set), in
    whole turns. Take as many as needed (``itertools.islice``); stopping mid-turn leaves
    the transcript open, as a crash would."""
    g = _Gen(seed, shape)
    rng = g.rng
    for turn_no in itertools.count(first_turn):
        turn = f"turn-{turn_no}"
        yield {"type": "turn/start", "turn": turn, "ts": g.clock(rng.uniform(5, 600))}
        yield {"type": "user/message", "turn": turn, "content": g.sentence_text(g.count(shape.user_words)),
               "ts": g.clock(rng.uniform(0.001, 0.05))}
        steps = 1
        while rng.random() > 1.0 / max(1.0, shape.mean_steps - 1.0) and steps < 40:
            steps += 1
        steps += 1  # the last step answers in text
        for step in range(1, steps + 1):
            yield {"type": "step/start", "turn": turn, "step": step, "ts": g.clock(rng.uniform(0.001, 0.01))}
            last = step == steps
            if last:
                text = g.sentence_text(g.count(shape.answer_words))
                if rng.random() < 0.3:
                    text += "\n\n```python\n" + "\n".join(g.code_lines(rng.randint(3, 25))) + "\n```\n"
                yield {"type": "assistant/message", "turn": turn, "step": step, "content": text, "tool_calls": [],
                       "ts": g.clock(g.lognormal(4.0, 0.6))}
            else:
                n_calls = 1 if rng.random() >= shape.parallel_p else rng.randint(2, 3)
                calls = []
                for _ in range(n_calls):
                    name = g.tool_name()
                    calls.append({"id": g.call_id(), "name": name, "arguments": g.arguments_for(name)})
                content = g.sentence_text(g.count(shape.preface_words)) if rng.random() < shape.preface_p else None
                yield {"type": "assistant/message", "turn": turn, "step": step, "content": content,
                       "tool_calls": calls, "ts": g.clock(g.lognormal(3.0, 0.7))}
                for call in calls:
                    yield {"type": "tool/call", "turn": turn, "step": step, "call_id": call["id"], "name": call["name"],
                           "ts": g.clock(rng.uniform(0.0005, 0.005))}
                for call in calls:
                    output, is_error = g.output_for(call["name"], call["arguments"])
                    yield {"type": "tool/result", "turn": turn, "step": step, "call_id": call["id"],
                           "output": output, "is_error": is_error, "ts": g.clock(g.lognormal(0.4, 1.2))}
            yield {"type": "step/end", "turn": turn, "step": step, "status": "completed",
                   "ts": g.clock(rng.uniform(0.0005, 0.003))}
        yield {"type": "turn/end", "turn": turn, "status": "completed", "ts": g.clock(rng.uniform(0.0005, 0.003))}


def session_lines(session_id: str, n_records: int, seed: int = 0, shape: Shape = DEFAULT_SHAPE) -> Iterator[bytes]:
    """The first ``n_records`` records (header included) of a generated session, each an
    encoded record line without its newline, ``seq`` from 1."""
    if n_records < 1:
        return
    first = events(seed, shape)
    start_ts = shape.start_ts
    yield encode_record(header_event(session_id), 1, start_ts)
    for seq, event in enumerate(itertools.islice(first, n_records - 1), start=2):
        yield encode_record(event, seq)


def small_events(n: int, seed: int = 0, size: int = 300) -> list[dict[str, Any]]:
    """``n`` short generated events (``user/message`` and ``assistant/message`` text,
    ``tool/result`` outputs cut to fit) whose encoded records are about ``size`` bytes
    each — the payload of the append benchmarks, matched to the raw ceiling's record."""
    g = _Gen(seed, DEFAULT_SHAPE)
    out: list[dict[str, Any]] = []
    kinds = ["user/message", "assistant/message", "tool/result"]
    for i in range(n):
        kind = kinds[i % 3]
        if kind == "tool/result":
            event: dict[str, Any] = {"type": kind, "turn": f"turn-{i // 30 + 1}", "step": 1,
                                     "call_id": g.call_id(), "output": "", "is_error": False}
            key = "output"
        else:
            event = {"type": kind, "turn": f"turn-{i // 30 + 1}", "content": ""}
            key = "content"
        probe = len(encode_record(event, 1_000_000, 1_735_689_600.123))
        text = g.sentence_text(size // 5)
        event[key] = text[: max(0, size - probe)]
        out.append(event)
    return out
