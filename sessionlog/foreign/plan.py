"""Findings and repair plans for foreign files: pure data, and the one way a plan is applied.

A format module reads the decoded lines and returns an :class:`Analysis`: what it found
(one :class:`Finding` each) and the line edits that repair it (a :class:`Plan`). Applying a
plan (:func:`apply`) copies every line it does not name byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .lines import Line

# Finding kinds (the ``kind`` member of a finding, stable for --json consumers).
UNANSWERED_CALL = "unanswered-call"
ORPHAN_RESULT = "orphan-result"
DUPLICATE_RESULT = "duplicate-result"
DUPLICATE_CALL = "duplicate-call"
MISPLACED_OUTPUT = "misplaced-output"
MISSING_NEWLINE = "missing-newline"
GLUED_LINE = "glued-line"
REATTACHED = "reattached"
BROKEN_CHAIN = "broken-chain"
"""A ``parentUuid`` naming no entry of the file (or none at all) off the conversation
resume continues, or with no entry before it to link to: reported, not changed."""
DUPLICATE_ORDINAL = "duplicate-ordinal"
"""A Codex rollout line whose ``ordinal`` an earlier line already carries (Codex's writer
reuses one after an unfinished turn): its history projection stops there. Reported, and
the file refused in place (:attr:`Analysis.unreadable_from`)."""
RESULT_AFTER_TEXT = "result-after-text"
"""A ``tool_result`` after another block (text) in the user message answering an
assistant message, as the tool joins its results entries: repair re-chains them so that
every ``tool_result`` comes first (Claude Code)."""
REUSED_CALL_ID = "reused-call-id"
"""A ``tool_use`` id that an earlier response of the resumed conversation already used
(Claude Code): the API rejects the history, and no repair that keeps the calls and their
results as written can mend it. Reported, and the file refused (:attr:`Analysis.refusal`)."""
RELINKED = "relinked"
"""An entry of the resumed conversation whose parent is not in the file: repair links it
to the entry written before it (Claude Code)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a scan found: ``kind``, the 1-based ``line`` it concerns, the ``call_id``
    when it is about one tool call, ``code`` the recovery code repair answers it with,
    ``detail`` one sentence, and ``repairable`` False for what repair only reports."""

    kind: str
    line: int
    detail: str
    call_id: str | None = None
    code: str | None = None
    repairable: bool = True

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"kind": self.kind, "line": self.line, "detail": self.detail}
        if self.call_id is not None:
            row["call_id"] = self.call_id
        if self.code is not None:
            row["code"] = self.code
        if not self.repairable:
            row["repairable"] = False
        return row


@dataclass(slots=True)
class Plan:
    """Line edits, by line index: ``drop`` removes a line (its bytes go to the quarantine
    file), ``replace`` swaps a line's bytes, ``insert_after`` adds whole new lines after
    a line (after the last line means at the end of the file), ``terminate`` adds the
    missing ``\\n`` to the last line. ``added`` describes each inserted answer for the
    report (``type``, ``call_id``, ``code``)."""

    drop: dict[int, str] = field(default_factory=dict)
    replace: dict[int, bytes] = field(default_factory=dict)
    insert_after: dict[int, list[bytes]] = field(default_factory=dict)
    terminate: int | None = None
    added: list[dict[str, Any]] = field(default_factory=list)
    move: dict[int, int] = field(default_factory=dict)
    """Lines kept byte for byte but moved: line index -> the line they go after (before the
    insertions there)."""
    cut: dict[int, int] = field(default_factory=dict)
    """Glued lines: line index -> how many leading (torn) bytes go to the quarantine file;
    ``replace`` holds what stays of the line."""

    @property
    def empty(self) -> bool:
        return not (self.drop or self.replace or self.insert_after or self.cut or self.move
                    or self.terminate is not None)

    def quarantined(self, lines: list[Line]) -> list[bytes]:
        """The bytes the plan removes, in file order: dropped lines and torn prefixes."""
        out = []
        for i in sorted(set(self.drop) | set(self.cut)):
            out.append(lines[i].raw if i in self.drop else lines[i].raw[: self.cut[i]])
        return out

    def insert(self, after: int, line: bytes) -> None:
        self.insert_after.setdefault(after, []).append(line)

    def appends_only(self, lines: list[Line]) -> bool:
        """True when applying the plan only adds bytes at the end of the file (a durable
        append is enough: every existing byte stays where it is)."""
        last = len(lines) - 1
        return not (self.drop or self.replace or self.cut or self.move) and all(
            i == last for i in self.insert_after)

    def changed_lines(self) -> list[int]:
        """1-based numbers of existing lines the plan drops, rewrites or moves."""
        return sorted(i + 1 for i in set(self.drop) | set(self.replace) | set(self.move))


def apply(lines: list[Line], plan: Plan) -> list[bytes]:
    """The repaired file as chunks: every line the plan does not name, byte for byte, in
    order, with the plan's replacements and insertions."""
    out: list[bytes] = []
    moved: dict[int, list[int]] = {}
    for index, after in sorted(plan.move.items()):
        moved.setdefault(after, []).append(index)

    def kept(line: Line) -> bytes:
        raw = plan.replace.get(line.index, line.raw)
        if plan.terminate == line.index and not raw.endswith(b"\n"):
            raw += b"\n"
        return raw

    for line in lines:
        if line.index not in plan.drop and line.index not in plan.move:
            out.append(kept(line))
        out.extend(kept(lines[i]) for i in moved.get(line.index, ()))
        out.extend(plan.insert_after.get(line.index, ()))
    if not lines:
        out.extend(plan.insert_after.get(-1, ()))
    return out


def durable_end(lines: list[Line]) -> int:
    """Where a file's durable prefix ends: after its last newline. A tool that reads
    complete lines only (Codex's history projection) has read at most that far; what
    follows is a torn last line no reader has taken in."""
    if not lines:
        return 0
    last = lines[-1]
    return last.end if last.terminated else last.offset


def first_changed_line(lines: list[Line], plan: Plan) -> Line | None:
    """The first line of the durable prefix (:func:`durable_end`) whose bytes the
    repaired file does not hold at the same offset (the plan drops, rewrites or moves it,
    or inserts before it), or None when the plan leaves the prefix byte for byte where it
    is: it only cuts what follows the last newline and appends. Judged on the bytes
    :func:`apply` produces, chunk by chunk, without joining them."""
    end = durable_end(lines)
    at = 0  # offset in the repaired file
    index = 0  # the line of the original file that holds offset ``at``
    for chunk in apply(lines, plan):
        view = memoryview(chunk)
        while view and at < end:
            line = lines[index]
            start = at - line.offset
            take = min(len(view), line.end - at)
            if view[:take] != memoryview(line.raw)[start:start + take]:
                return line
            view = view[take:]
            at += take
            if at == line.end:
                index += 1
        if at >= end:
            return None
    return lines[index] if at < end else None  # the repaired file ends inside the prefix


def appended_bytes(lines: list[Line], plan: Plan) -> bytes:
    """What an append-only plan adds at the end of the file."""
    last = len(lines) - 1
    head = b"\n" if plan.terminate == last else b""
    return head + b"".join(plan.insert_after.get(last, ()))


@dataclass(slots=True)
class Analysis:
    """What a format found in a file's decodable lines, and the plan that repairs it."""

    findings: list[Finding] = field(default_factory=list)
    plan: Plan = field(default_factory=Plan)
    session: str | None = None
    unanswered: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    offsets_indexed: str | None = None
    """Why the durable prefix of the file must stay byte for byte where it is (the tool
    keeps byte offsets into it), when it must: a repair that would change or shift any of
    it is refused, ``--force`` included (:attr:`Examination.in_place_refusal`)."""
    refusal: str | None = None
    """Why repair refuses this file, ``--force`` included, whatever the plan (a shape no
    edit it makes can mend): :attr:`Examination.in_place_refusal` gives it."""
    unreadable_from: Finding | None = None
    """Where the tool stops reading the file whatever a repair that only appends does (a
    Codex rollout whose ordinals repeat: renumbering would rewrite every line from there
    on), with :attr:`offsets_indexed` set: the file is refused in place, ``--force``
    included, naming that line."""
