"""Other tools' session files: scan, repair and view them like sessionlog's own logs.

An edge of sessionlog: nothing in the core imports this package. One module per foreign
format, each providing a :class:`ForeignFormat`; :data:`FORMATS` names them, and a third
format (an Agents SDK session table, a Google ADK or Pydantic AI store) is one more module
and one more entry there.

What is shared by every format lives beside them: the line model and damage classes
(:mod:`.lines`), findings and plans (:mod:`.plan`), the answer texts (:mod:`.answers`), the
file work (:mod:`.files`: in-use checks, backup, quarantine, atomic publish over
:mod:`sessionlog.durable`), and the command line (:mod:`.command`). A format module itself
is pure: decoded lines in, findings, a plan and conversation events out.
"""

from __future__ import annotations

import datetime
import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..contract import Damage, Status
from .lines import Line, LineDamage, classify, split_lines, unglue
from .plan import GLUED_LINE, Analysis, Finding, Plan, apply, first_changed_line

FORMATS: dict[str, str] = {
    "claude-code": "sessionlog.foreign.claude_code",
    "codex": "sessionlog.foreign.codex",
}
"""Format name (as ``--input-format`` spells it) -> the module whose ``FORMAT`` reads it."""

HEAD_BYTES = 256 * 1024
"""How much of a file content detection reads."""


class ForeignFormat(Protocol):
    """A reader/repairer for one foreign format. Every method but ``live_records`` is pure.

    - ``name``: the ``--input-format`` name; ``title``: how people call it;
      ``native_view``: the provider format the tool sends (a :data:`sessionlog.projection.FORMATS` name).
    - ``sniff(objects, head)``: True when the first decoded objects of a file (or, when
      its first line is longer than the head, the head's raw bytes) are this format's.
    - ``analyze(lines, lost)``: findings and the plan that repairs them, over a file's lines
      (``lost``: the torn prefixes cut from glued lines, as lines that do not decode: what
      they still say, such as an entry's id, may re-attach what was chained to them)
      (undecodable lines are the caller's: ignore them).
    - ``events(lines)``: the conversation the tool resumes, as sessionlog records for
      :func:`sessionlog.projection.project`.
    - ``native_items(lines)``: that conversation as the tool sends it, in ``native_view``,
      without fixing anything: what :func:`sessionlog.projection.check_pairing` judges.
    - ``live_records(path)``: the tool's own per-process records naming this file as in
      use by a live process (one sentence each); empty when none do.
    """

    name: str
    title: str
    native_view: str

    def sniff(self, objects: list[dict[str, Any]], head: bytes) -> bool: ...
    def analyze(self, lines: list[Line], lost: Sequence[Line] = ()) -> Analysis: ...
    def events(self, lines: list[Line]) -> list[dict[str, Any]]: ...
    def native_items(self, lines: list[Line]) -> list[dict[str, Any]]: ...
    def live_records(self, path: str) -> list[str]: ...


def get(name: str) -> ForeignFormat:
    """The format called ``name``; KeyError for an unknown name."""
    return importlib.import_module(FORMATS[name]).FORMAT  # type: ignore[no-any-return]


def sniff(head: bytes) -> ForeignFormat | None:
    """The foreign format a file's first bytes are, by content, or None."""
    objects = [line.obj for line in split_lines(head)[:8] if line.obj is not None and line.terminated]
    for name in FORMATS:
        fmt = get(name)
        if fmt.sniff(objects, head):
            return fmt
    return None


@dataclass(slots=True)
class Examination:
    """A foreign file examined, without writing: its lines, the undecodable ones
    (``damage``), what the format found (``analysis``), and ``plan``: everything a repair
    (with ``force``) would do, undecodable lines included."""

    format: ForeignFormat
    size: int
    lines: list[Line]
    damage: LineDamage
    analysis: Analysis
    plan: Plan
    force: bool

    @property
    def tail_damage(self) -> Damage | None:
        return self.damage.damage(self.size)

    @property
    def needs_force(self) -> bool:
        return bool(self.damage.mid_log)

    @property
    def in_place_refusal(self) -> str | None:
        """Why repair refuses to write this file, ``--force`` included, although the plan
        would repair it: the tool keeps byte offsets into the file
        (``analysis.offsets_indexed``) and the repair would change or shift bytes of its
        durable prefix (a line before the end changed, moved or removed, an insertion
        before the end; with ``--force``, an undecodable line before the end removed), or
        insert a line anywhere but at the very end.
        None when the repair only cuts what follows the last newline and appends, or the
        file is not indexed so. Names the first line concerned and its offset: also, whatever
        the plan, the line the tool stops reading at (:attr:`Analysis.unreadable_from`)."""
        if self.analysis.refusal is not None:
            return self.analysis.refusal
        indexed = self.analysis.offsets_indexed
        if indexed is None:
            return None
        concerned = [self.damage.mid_log[0]] if self.damage.mid_log else []
        stuck = self.analysis.unreadable_from
        if stuck is not None:
            concerned.append(self.lines[stuck.line - 1])
        # An answer before the last line, even one no reader has taken in yet (no newline),
        # would come before lines the tool numbered after it: it could not be numbered.
        concerned += [self.lines[i + 1] for i in self.plan.insert_after if i < len(self.lines) - 1]
        changed = None if self.plan.empty else first_changed_line(self.lines, self.plan)
        if changed is not None:
            concerned.append(changed)
        if not concerned:
            return None
        line = min(concerned, key=lambda found: found.index)
        if self.damage.mid_log and line is self.damage.mid_log[0]:
            why = f"line {line.number} does not decode and decodable lines follow it"
        elif stuck is not None and line.number == stuck.line:
            why = f"line {line.number}: {stuck.detail}"
        else:
            first = next((f for f in self.findings if f.repairable), None)
            why = f"line {first.line}: {first.detail}" if first is not None else "its last lines do not decode"
        return (f"{indexed}. Repairing it would change or shift its bytes from line {line.number} (offset "
                f"{line.offset}) on ({why}), and such a file is only ever appended to, --force included: "
                "nothing written. `sessionlog show FILE --format responses` shows the repaired history and "
                "`sessionlog convert --repaired FILE DST` imports it, without changing the file")

    @property
    def findings(self) -> list[Finding]:
        return self.analysis.findings

    def status(self, in_use: bool = False) -> Status:
        """clean, open (a live process uses the file), repairable, or needs-force: repair
        refuses it without ``--force`` (damage before the end), or at all
        (:attr:`in_place_refusal`)."""
        if in_use:
            return Status.OPEN
        if self.needs_force or self.in_place_refusal is not None:
            return Status.NEEDS_FORCE
        if not self.plan.empty:
            return Status.REPAIRABLE
        return Status.CLEAN

    def repaired(self) -> bytes:
        """The file as the plan leaves it (built in memory)."""
        return b"".join(apply(self.lines, self.plan))

    def repaired_lines(self) -> list[Line]:
        return split_lines(self.repaired()) if not self.plan.empty else self.lines


def examine(data: bytes, fmt: ForeignFormat, *, force: bool = False) -> Examination:
    """Examine ``data`` as ``fmt``: pure. The plan quarantines the undecodable tail and the
    torn prefix of glued lines always, mid-log lines only with ``force``; a repair without
    force refuses mid-log damage. The format analyzes the lines as they will be (a glued
    line as the entry it ends with)."""
    lines = split_lines(data)
    view = list(lines)
    cut: dict[int, int] = {}
    lost: list[Line] = []
    for line in lines:
        if line.obj is None and not line.blank:
            found = unglue(line.raw, lambda obj: fmt.sniff([obj], b""))
            if found is not None:
                torn, obj = found
                cut[line.index] = torn
                view[line.index] = Line(line.index, line.offset + torn, line.raw[torn:], obj)
                lost.append(Line(line.index, line.offset, line.raw[:torn], None))
    damage = classify(view)
    analysis = fmt.analyze(view, lost)
    plan = analysis.plan
    for index, torn in cut.items():
        plan.cut[index] = torn
        plan.replace.setdefault(index, view[index].raw)
        analysis.findings.append(Finding(
            GLUED_LINE, lines[index].number,
            f"the line starts with {torn} torn byte(s) of an earlier write that a later entry was glued "
            "onto; repair moves them to the quarantine file and keeps the entry"))
    for line in damage.tail:
        plan.drop[line.index] = str(damage.tail_kind)
    if force:
        for line in damage.mid_log:
            plan.drop[line.index] = "mid-log"
    last = view[-1] if view else None
    if last is not None and last.obj is not None and not last.terminated:
        plan.terminate = last.index
        analysis.findings.append(Finding("missing-newline", last.number,
                                         "the last line is complete but lacks its newline"))
    return Examination(fmt, len(data), lines, damage, analysis, plan, force)


def str_or_none(value: Any) -> str | None:
    """``value`` when it is a string, else None. A member a format holds as a string (an
    id, ``type``, ``role``, ``uuid``) may hold any JSON value in a damaged or hostile file;
    any other value names nothing, as if the member were missing. Every id, kind or role a
    format module compares, hashes or keys on goes through this first."""
    return value if isinstance(value, str) else None


def timestamp(value: Any) -> float | None:
    """Seconds since the epoch of an entry's ``timestamp`` (an ISO 8601 string, as both
    tools write it, e.g. ``2025-06-01T12:00:00.123Z``; a time without a zone is UTC), or
    None when it is missing or not one."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    try:
        seconds = moment.timestamp()
    except (OverflowError, OSError, ValueError):
        return None
    return seconds if math.isfinite(seconds) else None


class Stamps:
    """The ``ts`` of a format's events: each event takes the time of the entry it comes
    from, or (an entry without a readable one) the latest time before it, 0.0 before any."""

    def __init__(self) -> None:
        self.last = 0.0

    def of(self, entry: Any) -> float:
        seconds = timestamp(entry.get("timestamp")) if isinstance(entry, Mapping) else None
        if seconds is not None:
            self.last = seconds
        return self.last


def content_text(content: Any) -> str:
    """Text of a message or result ``content``: a string, or the text of its blocks
    (other blocks named in brackets, e.g. ``[image]``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, Mapping):
                kind = block.get("type")
                text = block.get("text")
                if isinstance(text, str):
                    parts.append(text)
                elif kind in ("tool_result",):
                    parts.append(content_text(block.get("content")))
                else:
                    parts.append(f"[{kind}]")
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(parts)
    return str(content)


__all__ = ["FORMATS", "Examination", "ForeignFormat", "Stamps", "content_text", "examine", "get", "sniff",
           "str_or_none", "timestamp"]
