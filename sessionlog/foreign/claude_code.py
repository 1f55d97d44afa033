"""Claude Code transcripts (``~/.claude/projects/<slug>/<session-id>.jsonl``).

The conversation is a tree of entries linked by ``parentUuid``; resume walks it back from
the newest leaf. What this module relies on (and what it leaves alone):

- One API response is several assistant entries sharing ``message.id``, each chained to
  the one before (possibly with results in between): they are one assistant message, a
  *group*. Its ``tool_use`` blocks are answered by ``tool_result`` blocks of the user
  entries chained after it; parallel results may branch off the group as siblings.
- The owner of a result entry is the assistant entry above it, walking ``parentUuid``
  through result entries, meta user entries and entries the API never sees (``system``
  other than ``compact_boundary``, ``progress``, ``attachment``). A ``tool_result`` whose
  owner did not ask for it (or repeats an answer on its path) is an orphan.
- ``compact_boundary`` entries start a new chain (``parentUuid`` null,
  ``logicalParentUuid`` for display): nothing is linked across them.
- Sidechain entries (``isSidechain``, subagents) are answered inside their sidechain: the
  answer copies the asking entry's ``isSidechain`` and ``agentId``.

Repair, in Claude Code's own interrupted-call form: one user entry per group with
unanswered calls, holding a ``tool_result`` block (``is_error: true``) per missing answer,
``toolDenialKind: "interrupted"`` and ``sourceToolAssistantUUID``, chained after the group's
last entry (after its existing results that hold only ``tool_result`` blocks: a results
entry with text, such as ``[Request interrupted by user for tool use]``, comes after the
answer, since the API rejects a ``tool_result`` after text in a message), inserted right
after that line; whatever was chained there before is re-parented to the new entry, so the
resumed chain keeps the conversation that followed. Orphan results become text blocks
(kept, not dropped). Results entries whose joined message would hold a text block before a
``tool_result`` are re-chained (or, failing that, their text blocks moved) so that every
``tool_result`` comes first (:meth:`ClaudeCode._results_first`). What the pairing check
judges (:meth:`ClaudeCode.native_items`) is the conversation block for block as the
entries hold it, never reordered: scan calls a file clean only when it passes.

Evidence that a call started (``TOOL_OUTCOME_UNKNOWN`` rather than ``TOOL_NOT_STARTED``): a
record other than the asking entry and the results that names the ``tool_use`` id in
``toolUseID``, ``parentToolUseID`` or ``tool_use_id`` (tool progress, a subagent's records),
except a ``PreToolUse`` hook's progress (the hook runs before the tool is allowed to start).
"""

from __future__ import annotations

import json
import os
import re
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any

from . import Stamps, content_text, str_or_none
from .answers import ORPHAN_NOTE, answer_code, answer_text, orphan_text, result_event
from .lines import Line, decode_line, encode_entry, split_lines, with_members
from .plan import (BROKEN_CHAIN, DUPLICATE_RESULT, ORPHAN_RESULT, REATTACHED, RELINKED, RESULT_AFTER_TEXT,
                   REUSED_CALL_ID, UNANSWERED_CALL, Analysis, Finding)

CONVERSATION = frozenset({"user", "assistant"})
ENTRIES = CONVERSATION | {"system", "progress", "attachment"}
"""Entry types that take part in the ``parentUuid`` tree."""
TYPES = frozenset({
    "user", "assistant", "system", "summary", "attachment", "file-history-snapshot",
    "queue-operation", "progress", "ai-title", "custom-title", "agent-name", "last-prompt",
    "permission-mode", "pr-link", "worktree-state",
})
COPIED = ("isSidechain", "userType", "entrypoint", "cwd", "sessionId", "version", "gitBranch",
          "agentId", "slug")
"""Members the answer entry copies from the entry that asked, in Claude Code's order."""
EVIDENCE_KEYS = ("toolUseID", "parentToolUseID", "tool_use_id")
_MISSING = object()
_NAMESPACE = uuidlib.UUID("4f1d3c52-6b0e-4c8a-9a53-5e55107a0c13")


def _message(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    message = obj.get("message")
    return message if isinstance(message, Mapping) else {}


def _blocks(obj: Mapping[str, Any]) -> list[Any]:
    content = _message(obj).get("content")
    return content if isinstance(content, list) else []


def _kind(obj: Mapping[str, Any]) -> str | None:
    """The entry's or block's ``type``; None when it is not a string (names no type)."""
    return str_or_none(obj.get("type"))


def _result_id(block: Mapping[str, Any]) -> str:
    """The call a ``tool_result`` block answers: its ``tool_use_id``; "" (no call, as when
    the member is missing) for any value but a string."""
    return str_or_none(block.get("tool_use_id")) or ""


def _is_result_entry(obj: Mapping[str, Any]) -> bool:
    """A user entry of tool results: one with a ``tool_result`` block, or with a result
    repair kept as text (its orphan note): it stays where results are, so the results
    chained after it still reach the assistant entry that asked for them."""
    return obj.get("type") == "user" and any(
        isinstance(b, Mapping) and (b.get("type") == "tool_result" or (
            b.get("type") == "text" and isinstance(b.get("text"), str) and b["text"].startswith(ORPHAN_NOTE)))
        for b in _blocks(obj))


def _passes_through(obj: Mapping[str, Any]) -> bool:
    """Entries an owner walk steps over: results, meta user entries, and what the API
    never sees. A compact boundary stops it (it has no parent anyway)."""
    kind = obj.get("type")
    if kind == "user":
        return _is_result_entry(obj) or obj.get("isMeta") is True
    if kind == "system":
        return obj.get("subtype") != "compact_boundary"
    return kind in ("progress", "attachment")


class _Group:
    """One assistant message: the entries of one response, in chain order."""

    __slots__ = ("key", "entries", "uses", "names", "answered", "results")

    def __init__(self, key: str) -> None:
        self.key = key
        self.entries: list[int] = []
        self.uses: list[str] = []
        self.names: dict[str, str] = {}
        self.answered: set[str] = set()
        self.results: list[int] = []  # result entries it owns, file order


class _Tree:
    """The entries of one transcript and the links between them."""

    def __init__(self, lines: list[Line]) -> None:
        self.lines = lines
        self.by_uuid: dict[str, int] = {}
        self.children: dict[str, list[int]] = {}
        self.entries: list[int] = []
        for line in lines:
            obj = line.obj
            if obj is None:
                continue
            uid = obj.get("uuid")
            if not isinstance(uid, str) or _kind(obj) not in ENTRIES:
                continue
            if uid in self.by_uuid:
                continue  # a line repeated with its uuid: Claude Code keeps one entry per uuid
            self.by_uuid[uid] = line.index
            self.entries.append(line.index)
            parent = obj.get("parentUuid")
            if isinstance(parent, str):
                self.children.setdefault(parent, []).append(line.index)
        self._group_of: dict[int, _Group] = {}
        self._owner: dict[int, int | None] = {}

    def obj(self, index: int) -> dict[str, Any]:
        obj = self.lines[index].obj
        assert obj is not None
        return obj

    def parent(self, index: int) -> int | None:
        parent = self.obj(index).get("parentUuid")
        return self.by_uuid.get(parent) if isinstance(parent, str) else None

    def owner(self, index: int) -> int | None:
        """The assistant entry above ``index``, walking through what passes through."""
        if index in self._owner:
            return self._owner[index]
        seen = {index}
        cur = self.parent(index)
        while cur is not None and cur not in seen and self.obj(cur).get("type") != "assistant":
            if not _passes_through(self.obj(cur)):
                cur = None
                break
            seen.add(cur)
            cur = self.parent(cur)
        if cur in seen:
            cur = None
        self._owner[index] = cur
        return cur

    def group(self, index: int) -> _Group:
        """The group of assistant entry ``index`` (created on first sight)."""
        path: list[int] = []
        cur: int | None = index
        found: _Group | None = None
        while cur is not None and cur not in path:
            if cur in self._group_of:
                found = self._group_of[cur]
                break
            path.append(cur)
            above = self.owner(cur)
            mid = str_or_none(_message(self.obj(cur)).get("id"))
            if above is None or mid is None or str_or_none(_message(self.obj(above)).get("id")) != mid:
                break
            cur = above
        for i in reversed(path):
            if found is None:
                found = _Group(str(self.obj(i).get("uuid")))
            self._group_of[i] = found
        assert found is not None
        return found


def _groups(tree: _Tree, resumed: set[int] | None = None) -> tuple[list[_Group], list[tuple[int, int, str, str]]]:
    """Every group with its calls and answers, and the orphan or duplicate results found:
    (line index, block position, block's tool_use_id, kind). A results entry answers the
    calls asked on its way down from the first entry of its response to its owner, and,
    when that owner is on the ``resumed`` chain, those of the response's entries on it
    (resume joins a result that branched off the response to the message it sends)."""
    groups: dict[int, _Group] = {}
    for index in tree.entries:
        obj = tree.obj(index)
        if obj.get("type") != "assistant":
            continue
        group = tree.group(index)
        groups.setdefault(id(group), group)
        group.entries.append(index)
        for block in _blocks(obj):
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                use = block.get("id")
                if isinstance(use, str) and use not in group.names:
                    group.uses.append(use)
                    group.names[use] = str(block.get("name"))
    bad: list[tuple[int, int, str, str]] = []
    answered_on_path: dict[int, set[str]] = {}
    asked_down_to: dict[int, set[str]] = {}
    for index in tree.entries:
        obj = tree.obj(index)
        if not _is_result_entry(obj):
            continue
        owner = tree.owner(index)
        group = tree.group(owner) if owner is not None else None
        if group is not None:
            group.results.append(index)
        # The calls this entry may answer: those asked by the response's entries from its
        # first down to its owner. A call asked on another branch of a response a fork
        # split is not in the message this entry answers, as Claude Code resumes it.
        asked = _asked_down_to(tree, owner, asked_down_to) if owner is not None else set()
        if group is not None and resumed is not None and owner in resumed:
            asked = asked | {u for e in group.entries if e in resumed for u in _uses_of(tree.obj(e))}
        above = _answered_above(tree, index, owner, answered_on_path)
        here: set[str] = set()
        for position, block in enumerate(_blocks(obj)):
            if not (isinstance(block, Mapping) and block.get("type") == "tool_result"):
                continue
            rid = _result_id(block)
            if group is None or rid not in asked:
                bad.append((index, position, rid, ORPHAN_RESULT))
            elif rid in above or rid in here:
                bad.append((index, position, rid, DUPLICATE_RESULT))
            else:
                here.add(rid)
                group.answered.add(rid)
        answered_on_path[index] = above | here
    return list(groups.values()), bad


def _asked_down_to(tree: _Tree, owner: int, memo: dict[int, set[str]]) -> set[str]:
    """The calls asked by assistant entry ``owner`` and the entries of its response above
    it (its way from the response's first entry)."""
    if owner not in memo:
        group = tree.group(owner)
        asked: set[str] = set()
        seen: set[int] = set()
        cur: int | None = owner
        while cur is not None and cur not in seen and tree.group(cur) is group:
            seen.add(cur)
            asked |= _uses_of(tree.obj(cur))
            cur = tree.owner(cur)
        memo[owner] = asked
    return memo[owner]


def _answered_above(tree: _Tree, index: int, owner: int | None, memo: dict[int, set[str]]) -> set[str]:
    """Ids answered by result entries between ``index`` and its owner."""
    cur = tree.parent(index)
    while cur is not None and cur != owner:
        if cur in memo:
            return memo[cur]
        cur = tree.parent(cur)
    return set()


def _branches(tree: _Tree, group: _Group, calls: list[str], resumed: set[int]) -> list[tuple[int, list[str]]]:
    """Where the unanswered ``calls`` of ``group`` are answered: its last entries (those
    no other entry of it is chained below), each with the calls asked on its way from the
    first, each call once; the one on the resumed chain first, then the rest newest first.
    A response split by a fork has several; any other, one: its newest entry."""
    if not calls:
        return []
    members = set(group.entries)
    above: dict[int, set[int]] = {}
    for entry in group.entries:
        seen: set[int] = set()
        cur = tree.parent(entry)
        while cur is not None and cur not in seen:
            seen.add(cur)
            cur = tree.parent(cur)
        above[entry] = seen & members
    inner = set().union(*above.values())
    lasts = sorted((e for e in group.entries if e not in inner), key=lambda e: (e in resumed, e), reverse=True)
    found: list[tuple[int, list[str]]] = []
    left = list(calls)
    for last in lasts:
        path = above[last] | {last}
        here = [c for c in left if any(c in _uses_of(tree.obj(e)) for e in path)]
        if here:
            found.append((last, here))
            left = [c for c in left if c not in here]
    return found


def _evidence(lines: list[Line], asking: set[int], results: set[int]) -> dict[str, str]:
    """call id -> where the file shows that the call started."""
    found: dict[str, str] = {}
    for line in lines:
        obj = line.obj
        if obj is None or line.index in asking or line.index in results:
            continue
        data = obj.get("data")
        if isinstance(data, Mapping) and data.get("hookEvent") == "PreToolUse":
            continue
        for key in EVIDENCE_KEYS:
            value = obj.get(key)
            if isinstance(value, str) and value not in found:
                found[value] = f"line {line.number}: a {obj.get('type')} record names it in {key}"
    return found


_UUID = re.compile(rb'"uuid":"([0-9A-Za-z_-]{1,100})"')
_PARENT = re.compile(rb'\{"parentUuid":(null|"([0-9A-Za-z_-]{1,100})")')


def _lost_links(tree: _Tree, lines: Sequence[Line]) -> dict[str, str | None]:
    """The undecodable lines whose bytes still name their ``uuid`` and ``parentUuid``
    (an entry the file no longer holds): uuid -> parent."""
    links: dict[str, str | None] = {}
    for line in lines:
        above = _PARENT.match(line.raw) if line.obj is None and not line.blank else None
        found = _UUID.findall(line.raw) if above is not None else []
        if found:
            uid = found[-1].decode("utf-8", "replace")
            if uid not in tree.by_uuid:
                links[uid] = None if above.group(1) == b"null" else above.group(2).decode("utf-8", "replace")
    return links


def _past_lost(parent: Any, links: dict[str, str | None]) -> Any:
    """``parent``, or when it is a lost entry (:func:`_lost_links`), the nearest ancestor
    of it that is not."""
    for _ in range(len(links)):
        if not isinstance(parent, str) or parent not in links:
            break
        parent = links[parent]
    return parent


def _reparented(line: Line, new_parent: str | None) -> bytes:
    """``line`` with ``parentUuid`` set to ``new_parent``: the one member changed in
    place when the bytes allow it, else the object re-encoded (members in order)."""
    obj = dict(line.obj or {})
    old = obj.get("parentUuid")
    obj["parentUuid"] = new_parent
    if isinstance(old, str) or old is None:
        needle = b'"parentUuid":' + json.dumps(old).encode()
        if line.raw.count(needle) == 1:
            raw = line.raw.replace(needle, b'"parentUuid":' + json.dumps(new_parent).encode())
            if decode_line(raw.rstrip(b"\n")) == obj:
                return raw if raw.endswith(b"\n") else raw + b"\n"
    return encode_entry(obj)


def _answer_entry(asker: Mapping[str, Any], parent: str, calls: list[tuple[str, str, str | None]]) -> dict[str, Any]:
    """Claude Code's interrupted-call form for ``calls`` ((id, tool name, evidence))."""
    ids = ",".join(c[0] for c in calls)
    entry: dict[str, Any] = {"parentUuid": parent}
    for key in COPIED:
        if key in asker:
            entry[key] = asker[key]
    entry["type"] = "user"
    entry["message"] = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": cid, "content": answer_text(name, cid, evidence), "is_error": True}
        for cid, name, evidence in calls
    ]}
    entry["uuid"] = str(uuidlib.uuid5(_NAMESPACE, f"{asker.get('uuid')}/{parent}/{ids}"))
    if "timestamp" in asker:
        entry["timestamp"] = asker["timestamp"]
    entry["toolUseResult"] = "Error: " + "; ".join(f"{answer_code(e)} ({cid})" for cid, _, e in calls)
    entry["toolDenialKind"] = "interrupted"
    entry["sourceToolAssistantUUID"] = asker.get("uuid")
    entry["sessionlogRecovery"] = [{"tool_use_id": cid, "code": answer_code(e), "evidence": e}
                                   for cid, _, e in calls]
    return entry


class ClaudeCode:
    """The Claude Code transcript reader/repairer."""

    name = "claude-code"
    title = "Claude Code transcript"
    native_view = "anthropic"

    def sniff(self, objects: list[dict[str, Any]], head: bytes) -> bool:
        for obj in objects:
            if "payload" in obj or "seq" in obj:  # a Codex rollout, a sessionlog log
                return False
            kind = _kind(obj)
            if kind not in TYPES:
                # A record type this version does not know (Claude Code adds some with
                # every release: "mode", "agent-setting", "tag"...): it decides nothing.
                continue
            if ("uuid" in obj and "parentUuid" in obj) or "sessionId" in obj or "leafUuid" in obj \
                    or kind == "file-history-snapshot":
                return True
        if not objects:
            return head.startswith((b'{"parentUuid":', b'{"type":"summary"', b'{"type":"file-history-snapshot"'))
        return False

    # --- scan and plan -------------------------------------------------------------------

    def analyze(self, lines: list[Line], lost: Sequence[Line] = ()) -> Analysis:
        analysis = self._analyze_links(lines, lost)
        for _ in range(len(lines) + 2):  # each round mends one thing more, or none: done
            if not self._resumed_pairing(lines, analysis):
                break
        self._results_first(lines, analysis)
        self._reused_ids(lines, analysis)
        self._same_for_copies(lines, analysis)
        return analysis

    @staticmethod
    def _same_for_copies(lines: list[Line], analysis: Analysis) -> None:
        """Give a line repeated byte for byte (its ``uuid`` included: the tool keeps one
        entry per uuid, the copies being the same entry) the very edit the plan makes to
        its first copy, which is the one the analysis reads: left as it was, the copy
        would still hold what the edit mends (a second answer kept as a result)."""
        plan = analysis.plan
        first: dict[bytes, int] = {}
        for line in lines:
            if line.obj is None or not isinstance(line.obj.get("uuid"), str) or not line.raw.endswith(b"\n"):
                continue
            at = first.setdefault(line.raw, line.index)
            if at != line.index and at in plan.replace and line.index not in plan.replace \
                    and line.index not in plan.drop:
                plan.replace[line.index] = plan.replace[at]

    def _reused_ids(self, lines: list[Line], analysis: Analysis) -> None:
        """Report a ``tool_use`` id that an earlier response of the conversation Claude
        Code resumes (as the plan leaves it) already used, and refuse the file: the API
        rejects a repeated id, and renaming a call the tool ran would part it from its
        results and progress records."""
        planned, origin = _as_planned(lines, analysis.plan)
        tree = _Tree(planned)
        first: dict[str, tuple[_Group, int]] = {}
        for index in self._chain(tree):
            obj = tree.obj(index)
            if obj.get("type") != "assistant":
                continue
            group = tree.group(index)
            for use in _uses_of_blocks(_blocks(obj)):
                at, after, _ = origin[index]
                number = lines[at].number if at >= 0 else lines[after].number + 1
                if use not in first:
                    first[use] = (group, number)
                    continue
                earlier, where = first[use]
                # Within one response too: its entries are one assistant message, which may
                # not name a call twice (the API rejects it); which copy the results answer
                # cannot be told, so nothing is guessed at.
                what = ("earlier in the same response" if earlier is group else "by an earlier response")
                detail = (f"tool_use id {use} was used {what} (line {where}) of the conversation "
                          "Claude Code resumes: the API rejects a repeated id; repair refuses the file (renaming a "
                          "call would part it from its results)")
                analysis.findings.append(Finding(REUSED_CALL_ID, number, detail, call_id=use, repairable=False))
                if analysis.refusal is None:
                    analysis.refusal = f"line {number}: {detail}"
        analysis.findings.sort(key=lambda f: f.line)

    def _analyze_links(self, lines: list[Line], lost: Sequence[Line]) -> Analysis:
        """Every finding and edit but :meth:`_results_first`'s."""
        tree = _Tree(lines)
        named = _lost_links(tree, [*lines, *lost])
        links = self._relinks(tree, named)
        if not links:
            return self._analyze(lines, lost, named, tree)
        relinked = list(lines)
        for index, parent in links.items():
            line = lines[index]
            relinked[index] = Line(line.index, line.offset, _reparented(line, parent),
                                   {**(line.obj or {}), "parentUuid": parent})
        analysis = self._analyze(relinked, lost, named)
        line_of = {line.obj["uuid"]: line.number for line in reversed(lines)
                   if line.obj is not None and isinstance(line.obj.get("uuid"), str) and _kind(line.obj) in ENTRIES}
        for index, parent in links.items():
            analysis.plan.replace.setdefault(index, relinked[index].raw)
            old = (lines[index].obj or {}).get("parentUuid", _MISSING)
            what = (f"parentUuid {old} names no entry of this file" if isinstance(old, str)
                    else "the entry has no parentUuid" if old is _MISSING else f"parentUuid {old!r} is not a uuid")
            analysis.findings.append(Finding(
                RELINKED, lines[index].number,
                f"{what}, so resume loses everything before line {lines[index].number}; repair links it to "
                f"line {line_of[parent]}, the entry before it in the file "
                "(Claude Code writes an entry after its parent)"))
        analysis.findings.sort(key=lambda f: f.line)
        return analysis

    def _relinks(self, tree: _Tree, named: dict[str, str | None]) -> dict[int, str]:
        """New parents for the entries where the resumed conversation is cut off: walking
        back from the leaf, an entry whose ``parentUuid`` names no entry of the file (a
        parent the tool never wrote, a line lost or removed) or that has no ``parentUuid``
        at all (a damaged key) ends the conversation there, and everything before it is
        lost on resume. Such an entry is given the user, assistant or system entry written
        just before it in the file on its side (main conversation or the same sidechain;
        progress and attachment entries are passed over), and the walk goes on from there.
        Only that one entry is considered, and only when it has no conversation child yet
        (the tool chains each entry to the one it wrote last; a fork could split an
        assistant message over two branches) and its ancestors do not lead back into the
        conversation below: otherwise the cut is reported, not guessed at. An explicit
        null is a root and stays one; a ``compact_boundary``, or a compaction summary
        (``isCompactSummary``) whose boundary is missing, starts the conversation; a parent
        whose undecodable line still names its own parent is re-attached past it
        (:meth:`_reattach_children_of_lost`)."""
        chain = self._chain(tree)
        if not chain:
            return {}

        def above(node: int) -> int | None:  # the parent, past undecodable lines that name theirs
            if node in up:
                return up[node]
            parent = _past_lost(tree.obj(node).get("parentUuid"), named)
            return tree.by_uuid.get(parent) if isinstance(parent, str) else None

        def talks(index: int) -> bool:
            return _kind(tree.obj(index)) in CONVERSATION or _kind(tree.obj(index)) == "system"

        position = {index: at for at, index in enumerate(tree.entries)}
        parents = {tree.by_uuid[p] for p, kids in tree.children.items()
                   if p in tree.by_uuid and any(talks(k) for k in kids)}
        parents |= {tree.by_uuid[a] for uid in named if any(talks(k) for k in tree.children.get(uid, ()))
                    if isinstance(a := _past_lost(uid, named), str) and a in tree.by_uuid}
        up: dict[int, int] = {}
        on = set(chain)
        root = chain[0]
        links: dict[int, str] = {}
        for _ in range(len(tree.entries) + 1):
            obj = tree.obj(root)
            if obj.get("isCompactSummary") is True or obj.get("subtype") == "compact_boundary":
                break  # a compaction starts the conversation, its boundary there or not
            parent = obj.get("parentUuid", _MISSING)
            past = _past_lost(parent, named)
            if past is None or (isinstance(past, str) and past in named):
                break
            if isinstance(past, str) and past in tree.by_uuid:
                target = tree.by_uuid[past]  # re-attached past the undecodable lines
                if past == parent or target in on:
                    break  # the walk stopped at a cycle: nothing to link
            else:
                found = self._predecessor(tree, root, position, on, parents, above)
                if found is None:
                    break
                target = found
                links[root] = str(tree.obj(target)["uuid"])
            up[root] = target
            parents.add(target)
            node: int | None = target
            while node is not None and node not in on:
                on.add(node)
                root = node
                node = above(node)
        return links

    @staticmethod
    def _predecessor(tree: _Tree, root: int, position: dict[int, int], on: set[int], parents: set[int],
                     above: Any) -> int | None:
        """The entry ``root`` is re-linked to (see :meth:`_relinks`), or None."""
        side = (tree.obj(root).get("isSidechain") is True, tree.obj(root).get("agentId"))
        for at in range(position[root] - 1, -1, -1):
            index = tree.entries[at]
            obj = tree.obj(index)
            if _kind(obj) not in CONVERSATION and _kind(obj) != "system":
                continue
            if (obj.get("isSidechain") is True, obj.get("agentId")) != side:
                continue
            if index in on or index in parents:
                return None  # the entry before it is taken: not a guess to make
            seen: set[int] = set()
            node: int | None = index
            while node is not None and node not in on and node not in seen:
                seen.add(node)
                node = above(node)
            return index if node is None else None
        return None

    def _analyze(self, lines: list[Line], lost: Sequence[Line], named: dict[str, str | None],
                 tree: _Tree | None = None) -> Analysis:
        """The findings and plan for ``lines`` (``named``: :func:`_lost_links` of them;
        ``tree``: theirs, when already built)."""
        tree = tree if tree is not None else _Tree(lines)
        resumed = set(self._chain(tree))
        groups, bad = _groups(tree, resumed)
        analysis = Analysis()
        plan = analysis.plan
        asking = {i for g in groups for i in g.entries}
        results = {i for g in groups for i in g.results}
        evidence = _evidence(lines, asking, results)
        # A result for a call, wherever the file holds it (after a user's text, below a later
        # response: kept as text there), shows that the call ran: never "not started".
        for index in tree.entries:
            for block in _blocks(tree.obj(index)) if tree.obj(index).get("type") == "user" else ():
                if _is_tool_result(block) and _result_id(block) not in evidence:
                    evidence[_result_id(block)] = f"line {lines[index].number} holds a result for it, elsewhere"
        new_parent: dict[int, str | None] = {}
        inserted: set[str] = set()  # uuids of the answer entries the plan adds
        bad_at: dict[int, set[int]] = {}
        for index, position, _, _ in bad:
            bad_at.setdefault(index, set()).add(position)

        def only_results(index: int) -> bool:
            # A result entry that holds tool_result blocks and nothing else once orphans
            # become text: an answer may follow it. One with a text block (Claude Code's
            # "[Request interrupted by user for tool use]", an orphan kept as text) may
            # not: the answer's tool_result would come after that text in the user
            # message the API gets, which it rejects, so the answer goes before it.
            blocks = _blocks(tree.obj(index))
            return bool(blocks) and all(isinstance(b, Mapping) and b.get("type") == "tool_result"
                                        and p not in bad_at.get(index, ()) for p, b in enumerate(blocks))

        for group in groups:
            missing = [u for u in group.uses if u not in group.answered]
            # One answer entry per branch of the response: below each of its last entries
            # (one unless a fork split the response), for the calls asked on the way to it,
            # the branch resume continues first.
            for last, calls_here in _branches(tree, group, missing, resumed):
                point = last
                while True:
                    uid = tree.obj(point).get("uuid")
                    kids = [k for k in tree.children.get(str(uid), ())
                            if k in results and only_results(k) and tree.group(tree.owner(k)) is group]
                    # On the resumed chain, the answer stays on it: the message resume sends
                    # is the one it must complete.
                    if point in resumed:
                        kids = [k for k in kids if k in resumed]
                    if not kids:
                        break
                    point = kids[-1]
                asker = tree.obj(last)
                parent = str(tree.obj(point).get("uuid"))
                calls = [(u, group.names[u], evidence.get(u)) for u in calls_here]
                entry = _answer_entry(asker, parent, calls)
                plan.insert(point, encode_entry(entry))
                inserted.add(entry["uuid"])
                for kid in tree.children.get(parent, ()):
                    new_parent[kid] = entry["uuid"]
                for cid, name, ev in calls:
                    code = answer_code(ev)
                    analysis.unanswered.append(cid)
                    analysis.findings.append(Finding(
                        UNANSWERED_CALL, lines[min(i for i in group.entries if cid in _uses_of(tree.obj(i)))].number,
                        f"tool_use {cid} ({name}) has no tool_result; repair answers it {code}"
                        + (f" ({ev})" if ev else ""), call_id=cid, code=code))
                    plan.added.append({"type": "tool_result", "call_id": cid, "code": code,
                                       "after_line": lines[point].number})
        orphans = bad_at
        for index, position, rid, kind in bad:
            analysis.orphans.append(rid)
            analysis.findings.append(Finding(
                kind, lines[index].number,
                f"tool_result for {rid!r} " + ("answers no tool_use of the message before it"
                                               if kind == ORPHAN_RESULT else "repeats an earlier answer")
                + "; repair keeps it as a text block", call_id=rid))
        for line in [*lines, *lost]:  # an undecodable line, or the torn bytes cut from a glued one
            if line.obj is None and not line.blank:
                self._reattach_children_of_lost(tree, line, named, new_parent, analysis)
        for index in sorted(set(new_parent) | set(orphans)):
            if index in orphans:
                obj = tree.obj(index)
                changes = {"message": _textified(obj, orphans[index])}
                if index in new_parent:
                    changes["parentUuid"] = new_parent[index]
                plan.replace[index] = with_members(lines[index], changes)
            else:
                plan.replace[index] = _reparented(lines[index], new_parent[index])
        for index in tree.entries:
            parent = new_parent.get(index, tree.obj(index).get("parentUuid", _MISSING))
            if parent is None or (isinstance(parent, str) and (parent in tree.by_uuid or parent in inserted)) \
                    or tree.obj(index).get("isCompactSummary") is True:
                continue  # a compaction summary starts the conversation whether or not its boundary is there
            what = (f"parentUuid {parent} names no entry of this file" if isinstance(parent, str)
                    else "the entry has no parentUuid" if parent is _MISSING else f"parentUuid {parent!r} is not a uuid")
            where = ("resume loses what came before" if index in resumed
                     else "on a branch resume does not continue; left as it is")
            analysis.findings.append(Finding(BROKEN_CHAIN, lines[index].number, f"{what}: {where}",
                                             repairable=False))
        return analysis

    def _resumed_pairing(self, lines: list[Line], analysis: Analysis) -> bool:
        """Add to ``analysis`` one edit the conversation Claude Code resumes still needs
        once the plan so far is done, judged with the very turns :meth:`native_items`
        reads; False when it needs none.

        The rest of the analysis pairs results with calls branch by branch over the whole
        tree, where each branch may pair on its own; resume follows one branch and joins to
        each results message only the results that branched off it without repeating an
        answer it holds (:meth:`_turns`). So a sibling that repeats one result of an entry
        on a branch resume leaves takes that entry's other answers with it, and a
        result below a second entry of a response repeats one below the first. Here, on
        that conversation: a ``tool_result`` the assistant message before it did not ask
        for, or that repeats an answer of its message, becomes a text block, as an orphan
        does (all of a round's, at once); a call its results message does not answer gets
        Claude Code's interrupted-call answer, after the last entry of the message on the
        chain that holds only ``tool_result`` blocks, its chain child re-parented to the
        answer (one message a round), ``TOOL_OUTCOME_UNKNOWN`` when the file holds a result
        for it elsewhere (it ran)."""
        plan = analysis.plan
        planned, origin = _as_planned(lines, plan)
        laid_out: list[list[tuple[int, list[Any]]]] = []
        answering: list[tuple[_Group, list[str]]] = []
        self._turns(planned, as_written=True, laid_out=laid_out, answering=answering)
        tree = _Tree(planned)

        def number(index: int) -> int:  # in the file as it is (an inserted answer: after its line)
            at, after, _ = origin[index]
            return lines[at].number if at >= 0 else lines[after].number + 1

        def rewrite(index: int, raw: bytes) -> None:
            at, after, k = origin[index]
            if at >= 0:
                plan.replace[at] = raw
            else:
                plan.insert_after[after][k] = raw

        bad: dict[int, set[int]] = {}  # entry -> positions of the blocks to keep as text
        gaps: list[tuple[_Group, list[str], set[int]]] = []
        for message, (group, asked) in zip(laid_out, answering, strict=True):
            held: set[str] = set()
            for r, blocks in message:
                for block in blocks:
                    if not _is_tool_result(block):
                        continue
                    rid = _result_id(block)
                    if rid in asked and rid not in held:
                        held.add(rid)
                        continue
                    bad.setdefault(r, set()).add(next(p for p, b in enumerate(_blocks(tree.obj(r))) if b is block))
                    repeat = rid in held
                    analysis.orphans.append(rid)
                    analysis.findings.append(Finding(
                        DUPLICATE_RESULT if repeat else ORPHAN_RESULT, number(r),
                        f"tool_result for {rid!r} " + ("repeats an earlier answer" if repeat
                                                       else "answers no tool_use of the message before it")
                        + " in the conversation Claude Code resumes (its results entries joined as it joins "
                        "them); repair keeps it as a text block", call_id=rid))
            missing = [u for u in dict.fromkeys(asked) if u not in held]
            if missing:
                gaps.append((group, missing, {r for r, _ in message}))
        if bad:
            for r, positions in bad.items():
                rewrite(r, with_members(planned[r], {"message": _textified(tree.obj(r), positions)}))
            return True
        if not gaps:
            return False
        group, missing, mine = gaps[0]
        chain = self._chain(tree)
        at = {index: k for k, index in enumerate(chain)}
        point = max((i for i in group.entries if i in at), key=at.__getitem__)
        asker = tree.obj(point)
        while at[point] + 1 < len(chain):
            below = chain[at[point] + 1]
            blocks = _blocks(tree.obj(below))
            if below not in mine or not blocks or not all(_is_tool_result(b) for b in blocks):
                break
            point = below
        elsewhere: dict[str, str] = {}
        for index in tree.entries:
            for block in _blocks(tree.obj(index)) if tree.obj(index).get("type") == "user" else ():
                if _is_tool_result(block) and _result_id(block) in missing:
                    where = "on a branch the resumed conversation leaves" if index not in at else "elsewhere"
                    elsewhere.setdefault(_result_id(block), f"line {number(index)} holds a result for it, {where}")
        asking = {i for g in _groups(tree)[0] for i in g.entries}
        evidence = {**_evidence(planned, asking, {i for i in tree.entries if _is_result_entry(tree.obj(i))}),
                    **elsewhere}
        calls = [(u, group.names.get(u, "?"), evidence.get(u)) for u in missing]
        entry = _answer_entry(asker, str(tree.obj(point).get("uuid")), calls)
        if at[point] + 1 < len(chain):
            child = chain[at[point] + 1]
            rewrite(child, _reparented(planned[child], entry["uuid"]))
        here, after, k = origin[point]
        if here >= 0:
            plan.insert_after.setdefault(here, []).insert(0, encode_entry(entry))
        else:
            plan.insert_after[after].insert(k + 1, encode_entry(entry))
        for cid, name, ev in calls:
            code = answer_code(ev)
            analysis.unanswered.append(cid)
            analysis.findings.append(Finding(
                UNANSWERED_CALL, number(min(i for i in group.entries if cid in _uses_of(tree.obj(i)))),
                f"tool_use {cid} ({name}) has no tool_result in the conversation Claude Code resumes (its "
                f"results entries joined as it joins them); repair answers it {code} there"
                + (f" ({ev})" if ev else ""), call_id=cid, code=code))
            plan.added.append({"type": "tool_result", "call_id": cid, "code": code, "after_line": number(point)})
        analysis.findings.sort(key=lambda f: f.line)
        return True

    def _results_first(self, lines: list[Line], analysis: Analysis) -> None:
        """Add to ``analysis`` the edits that put every ``tool_result`` block of a results
        message before its other blocks, judged on the conversation as the rest of the
        plan leaves it, with the very turns :meth:`native_items` reads.

        A results message joins the result entries answering one assistant message in
        their tree order; a text block of one of them (Claude Code's ``[Request
        interrupted by user for tool use]``, an orphan result kept as text) before a
        ``tool_result`` of a later one is a user message the API rejects, as Claude Code
        sends it when it does not move ``tool_result`` blocks first itself (its versions
        that merge such entries as they are). Repair re-chains those entries: the ones
        holding only ``tool_result`` blocks first, then those with other blocks, then
        those with no ``tool_result`` left; what was chained below any of them goes below
        the last. Contents stay as they are, unless two entries with other blocks both
        hold a ``tool_result``, or an entry's own text comes before its ``tool_result``:
        then the other blocks move, in order, after the last ``tool_result`` of the
        message (into that entry). Where re-chaining would make a cycle, would bring
        into the resumed conversation the entries below a result that branched off it, or
        would move a results entry up from below a later entry of a split response (it
        would lose that entry's calls, :func:`_groups`), the entries are chained below the
        first that holds only ``tool_result`` blocks, where it is; failing that too, only
        that move is done, in the order the entries are."""
        plan = analysis.plan
        if not analysis.orphans and not any(
                line.obj is not None and _is_result_entry(line.obj)
                and any(not _is_tool_result(b) for b in _blocks(line.obj)) for line in lines):
            return  # only a block other than a tool_result can come before one
        planned, origin = _as_planned(lines, plan)
        laid_out: list[list[tuple[int, list[Any]]]] = []
        answering: list[tuple[_Group, list[str]]] = []
        self._turns(planned, as_written=True, laid_out=laid_out, answering=answering)
        tree = _Tree(planned)
        chain = self._chain(tree)
        resumed = set(chain)
        for message, (group, _) in zip(laid_out, answering, strict=True):
            late = _first_late_result(message)
            if late is None:
                continue
            order = [r for r, _ in message]
            held = dict(message)

            def rank(r: int) -> int:
                has_result = any(_is_tool_result(b) for b in held[r])
                return 0 if all(_is_tool_result(b) for b in held[r]) else 1 if has_result else 2

            anchor = tree.parent(order[0])  # what the first of them is chained to
            chained = sorted(order, key=rank) if anchor is not None else order
            changes: dict[int, dict[str, Any]] = {}
            if chained != order and anchor is not None:
                # Chained where the first of them is; failing that (a results entry moved up
                # from below a later entry of a split response would lose its calls), where
                # the first that holds only tool_result blocks is, the rest below it.
                # Failing both (a results entry chained between two entries of a split
                # response, such as an orphan kept as text: a result moved above it would
                # lose the later entry's calls, one left below it comes after its text), the
                # response's entries are chained one after the other first, the results below
                # its last one.
                tries: list[tuple[int | None, dict[int, int]]] = [
                    (a, {}) for a in dict.fromkeys([anchor, tree.parent(chained[0])])]
                for anchor, moved in tries + list(self._response_first(tree, chain, group, held).items()):
                    if anchor is None:
                        continue
                    parents = {r: p for r, p in zip(chained, [anchor, *chained[:-1]], strict=True)}
                    parents.update(moved)
                    for r in [*chained[:-1], *([anchor] if moved else [])]:
                        for kid in tree.children.get(str(tree.obj(r).get("uuid")), ()):
                            if kid not in held and kid not in moved:
                                parents[kid] = chained[-1]  # what followed the results follows them still
                    if not _cyclic(tree, parents) and not self._keeps_conversation(tree, planned, parents, resumed,
                                                                                   held):
                        # The resumed conversation would go on into a branch it left, below one
                        # of the results: that branch hangs where the results do instead.
                        for r in chained:
                            for kid in tree.children.get(str(tree.obj(r).get("uuid")), ()):
                                if kid not in held and kid not in resumed:
                                    parents[kid] = anchor
                    if not _cyclic(tree, parents) and self._keeps_conversation(tree, planned, parents, resumed, held) \
                            and _keeps_calls(tree, parents):
                        for r, parent in parents.items():
                            changes[r] = {"parentUuid": tree.obj(parent).get("uuid")}
                        break
                else:
                    chained = order  # only the contents change
            for r, content in _results_first_contents(tree, chained, held).items():
                changes.setdefault(r, {})["message"] = {**_message(tree.obj(r)), "content": content}
            for r, change in changes.items():
                line = planned[r]
                if change.get("parentUuid", _MISSING) == tree.obj(r).get("parentUuid") and "message" not in change:
                    continue
                raw = (_reparented(line, change["parentUuid"]) if "message" not in change
                       else with_members(line, change))
                where = origin[r]
                if where[0] < 0:  # an answer this plan inserts
                    plan.insert_after[where[1]][where[2]] = raw
                else:
                    plan.replace[where[0]] = raw
            entry, rid = late

            def number(index: int) -> int:  # in the file as it is (an inserted answer: after its line)
                at, after, _ = origin[index]
                return lines[at].number if at >= 0 else lines[after].number + 1

            asker = tree.owner(order[0])
            analysis.findings.append(Finding(
                RESULT_AFTER_TEXT, number(entry),
                f"tool_result for {rid!r} comes after other content in the user message answering "
                + (f"the assistant entry of line {number(asker)}" if asker is not None else "its assistant message")
                + " (its results entries joined as Claude Code chains them), which the API rejects; repair "
                "chains the results entries so that every tool_result comes first", call_id=rid))
        analysis.findings.sort(key=lambda f: f.line)

    @staticmethod
    def _response_first(tree: _Tree, chain: list[int], group: _Group,
                        results: Mapping[int, Any]) -> dict[int, dict[int, int]]:
        """For a response split by its own results entries on the resumed ``chain`` (an
        entry of ``group`` chained below one of the ``results`` of its message): {its last
        entry on the chain: the new parents that chain each of its entries there to the one
        before it}; {} otherwise."""
        entries = [e for e in chain if e in group.entries]
        parents: dict[int, int] = {}
        for before, entry in zip(entries, entries[1:]):
            cur = tree.parent(entry)
            seen: set[int] = set()
            while cur is not None and cur != before and cur not in seen:
                seen.add(cur)
                cur = tree.parent(cur)
            if cur == before and not seen.isdisjoint(results):
                parents[entry] = before
        return {entries[-1]: parents} if parents else {}

    def _keeps_conversation(self, tree: _Tree, planned: list[Line], parents: dict[int, int], resumed: set[int],
                            results: Mapping[int, Any]) -> bool:
        """True when giving the entries of ``parents`` those parents leaves the resumed
        conversation the user and assistant entries it holds, with the ``results`` entries
        of one message joined into it and nothing else: a result that branched off it is
        joined, never the branch below that result."""
        moved = list(planned)
        for r, parent in parents.items():
            line = planned[r]
            moved[r] = Line(line.index, line.offset, line.raw, {**tree.obj(r), "parentUuid": tree.obj(parent).get("uuid")})
        talks = {i for i in resumed if _kind(tree.obj(i)) in CONVERSATION}
        chain = {i for i in self._chain(_Tree(moved)) if _kind(tree.obj(i)) in CONVERSATION}
        return talks <= chain <= talks | set(results)

    @staticmethod
    def _reattach_children_of_lost(tree: _Tree, line: Line, named: dict[str, str | None],
                                   new_parent: dict[int, str | None], analysis: Analysis) -> None:
        """An undecodable line is cut (the tail) or, with force, removed (mid-log): the
        entries chained to it would lose everything above them on resume. When its own
        ``uuid`` and ``parentUuid`` can still be read from its bytes (``named``), they are
        re-attached to its parent (or, when that line is lost too, the nearest ancestor
        the file still holds)."""
        lost = _UUID.findall(line.raw) if _PARENT.match(line.raw) else []
        if not lost:
            return
        uid = lost[-1].decode("utf-8", "replace")
        kids = [k for k in tree.children.get(uid, ()) if k not in new_parent]
        if not kids or uid not in named:
            return
        parent = _past_lost(uid, named)
        for kid in kids:
            new_parent[kid] = parent
        analysis.findings.append(Finding(
            REATTACHED, line.number,
            f"line {line.number} does not decode and {len(kids)} entr{'y' if len(kids) == 1 else 'ies'} "
            f"chained to it (uuid {uid}) would lose what came before on resume; repair re-attaches them to "
            f"its parent {parent}" + ("" if parent == named[uid] else " (the nearest ancestor the file still holds)")))

    # --- views ---------------------------------------------------------------------------

    def _chain(self, tree: _Tree) -> list[int]:
        """The resumed chain: from the newest leaf back to its root, in order."""
        conv = [i for i in tree.entries if _kind(tree.obj(i)) in CONVERSATION]
        main = [i for i in conv if tree.obj(i).get("isSidechain") is not True] or conv
        if not main:
            return []
        cur = main[-1]
        seen = {cur}
        while True:
            kids = [k for k in tree.children.get(str(tree.obj(cur).get("uuid")), ())
                    if _kind(tree.obj(k)) in CONVERSATION and k not in seen]
            if not kids:
                break
            cur = kids[-1]
            seen.add(cur)
        chain = []
        node: int | None = cur
        visited: set[int] = set()
        while node is not None and node not in visited:
            visited.add(node)
            chain.append(node)
            node = tree.parent(node)
        return chain[::-1]

    def _turns(self, lines: list[Line], sources: list[int] | None = None, *, as_written: bool = False,
               laid_out: list[list[tuple[int, list[Any]]]] | None = None,
               answering: list[tuple[_Group, list[str]]] | None = None) -> list[tuple[str, list[Any]]]:
        """The resumed conversation as (role, blocks) messages ("results" for the user
        message answering an assistant message): an assistant
        message per group with the results it owns (on the chain, in chain order, then off
        it for ids not yet answered: parallel results that branched), a user message per
        other entry. The results message lists its ``tool_result`` blocks in call order,
        other blocks after them; ``as_written`` keeps every block where the entries put
        it, as the tool sends them (a text block before a later entry's ``tool_result``
        stays before it). ``sources``, when given, gets the index of the entry each
        message starts with; ``laid_out``, for each results message, its entries in the
        order it holds them, each with the blocks of it the message holds; ``answering``,
        for each results message, the group it answers and the calls the assistant message
        before it asks for (those of the group's entries on the chain), in order."""
        tree = _Tree(lines)
        groups, _ = _groups(tree)
        group_of = {i: g for g in groups for i in g.entries}
        turns: list[tuple[str, list[Any]]] = []
        current: _Group | None = None
        chain = self._chain(tree)
        on_chain = {index: at for at, index in enumerate(chain)}
        emitted: set[int] = set()

        def close() -> None:
            nonlocal current
            if current is None:
                return
            blocks: list[Any] = []
            ids: set[str] = set()
            if laid_out is not None:
                laid_out.append([])
            # The calls the message asks for: those of its entries on the chain (a branch
            # that leaves a response half-way, a rewind, resumes without the rest of it).
            asked_in_order = _uses_of_blocks(turns[-1][1])
            asked = set(asked_in_order)
            if answering is not None:
                answering.append((current, asked_in_order))
            ordered = sorted((r for r in current.results if r in on_chain), key=on_chain.__getitem__) + [
                r for r in current.results if r not in on_chain]
            taken: dict[int, list[Any]] = {}  # result entry -> the blocks of it the message holds
            for r in ordered:
                rblocks = [b for b in _blocks(tree.obj(r)) if isinstance(b, Mapping) and b.get("type") == "tool_result"]
                named = {rid for b in rblocks if (rid := str_or_none(b.get("tool_use_id"))) is not None}
                if r not in on_chain:
                    # A parallel result that branched off: its answers to calls the message
                    # asks for and nothing else answered, or nothing of it.
                    if not named.isdisjoint(ids) or named.isdisjoint(asked):
                        continue
                    emitted.add(r)
                    ids.update(named)
                    taken[r] = [b for b in _blocks(tree.obj(r)) if not (
                        isinstance(b, Mapping) and b.get("type") == "tool_result" and _result_id(b) not in asked)]
                    continue
                emitted.add(r)
                ids.update(named)
                taken[r] = list(_blocks(tree.obj(r)))
            for r in (_tree_order(tree, list(taken)) if as_written else taken):
                blocks.extend(taken[r])
                if laid_out is not None:
                    laid_out[-1].append((r, taken[r]))
            if not as_written:
                order = {u: i for i, u in enumerate(current.uses)}
                blocks.sort(key=lambda b: order.get(_result_id(b), len(order))
                            if isinstance(b, Mapping) and b.get("type") == "tool_result" else len(order) + 1)
            turns.append(("results", blocks))
            if sources is not None:
                sources.append(min((r for r in current.results if r in emitted), default=max(current.entries)))
            current = None

        for index in chain:
            obj = tree.obj(index)
            kind = obj.get("type")
            if kind == "assistant":
                group = group_of[index]
                if group is not current:
                    close()
                    current = group
                    turns.append(("assistant", []))
                    if sources is not None:
                        sources.append(index)
                content = _message(obj).get("content")
                turns[-1][1].extend(content if isinstance(content, list) else
                                    [{"type": "text", "text": content}] if isinstance(content, str) else [])
            elif kind == "user":
                if current is not None and index in current.results:
                    continue
                close()
                if index in emitted:
                    continue
                content = _message(obj).get("content")
                turns.append(("user", content if isinstance(content, list) else
                              [{"type": "text", "text": content}] if isinstance(content, str) else []))
                if sources is not None:
                    sources.append(index)
        close()
        return turns

    def native_items(self, lines: list[Line]) -> list[dict[str, Any]]:
        """The resumed conversation in Anthropic's shape, blocks as the entries hold them
        (consecutive user entries joined, nothing reordered): a text block written before
        a later ``tool_result`` is before it here too, where the API rejects it."""
        items: list[dict[str, Any]] = []
        for role, blocks in self._turns(lines, as_written=True):
            role = "user" if role == "results" else role
            if not blocks:
                continue
            blocks = [_ids_named(b) for b in blocks]
            if items and items[-1]["role"] == role:
                items[-1]["content"].extend(blocks)
            else:
                items.append({"role": role, "content": blocks})
        return items

    def events(self, lines: list[Line]) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        entries = {line.index: line.obj for line in lines}
        sources: list[int] = []
        stamps = Stamps()
        ts = 0.0

        def add(record: dict[str, Any]) -> None:
            record.update(seq=len(records) + 1, ts=ts)
            records.append(record)

        for (role, blocks), source in zip(self._turns(lines, sources), sources, strict=True):
            ts = stamps.of(entries.get(source))
            if role == "assistant":
                calls = [{"id": str_or_none(b.get("id")), "name": b.get("name"), "arguments": b.get("input")}
                         for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_use"]
                text = content_text([b for b in blocks if isinstance(b, Mapping) and b.get("type") == "text"])
                add({"type": "assistant/message", "content": text or None, "tool_calls": calls})
                continue
            others = []
            for b in blocks:
                if isinstance(b, Mapping) and b.get("type") == "tool_result":
                    add(result_event(str_or_none(b.get("tool_use_id")), content_text(b.get("content")),
                                     b.get("is_error") is True))
                else:
                    others.append(b)
            text = content_text(others)
            if text:
                add({"type": "user/message", "content": text})
        return records

    # --- the tool's own per-process records ----------------------------------------------

    def live_records(self, path: str) -> list[str]:
        """``<claude dir>/sessions/<pid>.json`` records (``pid``, ``sessionId``) of live
        processes naming this transcript's session. The claude dir is the one the file
        lives under (``<dir>/projects/<slug>/...``), else ``$CLAUDE_CONFIG_DIR`` or
        ``~/.claude``."""
        session = _session_of(path)
        found = []
        for directory in _claude_dirs(path):
            sessions = os.path.join(directory, "sessions")
            try:
                names = os.listdir(sessions)
            except OSError:
                continue
            for name in names:
                if not name.endswith(".json"):
                    continue
                try:
                    with open(os.path.join(sessions, name), "rb") as f:
                        record = json.loads(f.read(65536))
                except (OSError, ValueError):
                    continue
                if not isinstance(record, dict) or record.get("sessionId") != session:
                    continue
                pid = record.get("pid")
                if type(pid) is int and 0 < pid != os.getpid() and _alive(pid):
                    found.append(f"Claude Code process {pid} runs this session ({os.path.join(sessions, name)})")
        return found


def _tree_order(tree: _Tree, results: list[int]) -> list[int]:
    """``results`` (result entries answering one assistant message) in the order their
    tree gives them, as the tool sends them: each one after the result it is chained
    below (through entries the API never sees), siblings in file order. A result that
    branched off the chain then sits beside its sibling, before whatever was chained
    below that sibling later."""
    among = set(results)
    below: dict[int | None, list[int]] = {}
    for r in sorted(results):
        above: int | None = None
        seen = {r}
        cur = tree.parent(r)
        while cur is not None and cur not in seen:
            if cur in among:
                above = cur
                break
            if not _passes_through(tree.obj(cur)) or tree.obj(cur).get("type") == "user":
                break  # the message that asked, or an entry of the conversation: r starts a branch
            seen.add(cur)
            cur = tree.parent(cur)
        below.setdefault(above, []).append(r)
    order: list[int] = []
    stack = list(reversed(below.get(None, [])))
    while stack:
        r = stack.pop()
        order.append(r)
        stack.extend(reversed(below.get(r, [])))
    placed = set(order)
    return order + [r for r in results if r not in placed]  # below a cycle, defensively: as they came


def _is_tool_result(block: Any) -> bool:
    return isinstance(block, Mapping) and block.get("type") == "tool_result"


def _first_late_result(message: list[tuple[int, list[Any]]]) -> tuple[int, str | None] | None:
    """The entry holding the first ``tool_result`` block of a results message (its
    entries with the blocks it holds of each, in order) that comes after another block,
    and that block's id; None when every ``tool_result`` comes first."""
    other = False
    for r, blocks in message:
        for block in blocks:
            if not _is_tool_result(block):
                other = True
            elif other:
                return r, str_or_none(block.get("tool_use_id"))
    return None


def _results_first_contents(tree: _Tree, entries: list[int], held: dict[int, list[Any]]) -> dict[int, list[Any]]:
    """The new contents of results ``entries`` (chained in this order; ``held``: the
    blocks of each the message holds) that make every ``tool_result`` of the message come
    first: the other blocks of the entries up to the last one holding a ``tool_result``
    move, in order, after that one's ``tool_result`` blocks. Only the entries whose
    content changes."""
    holding = [r for r in entries if any(_is_tool_result(b) for b in held[r])]
    if not holding:
        return {}
    last = holding[-1]
    moved: list[Any] = []
    contents: dict[int, list[Any]] = {}
    for r in entries[: entries.index(last) + 1]:
        blocks = _blocks(tree.obj(r))
        results = [b for b in blocks if _is_tool_result(b)]
        moved += [b for b in blocks if not _is_tool_result(b)]
        new = results + moved if r == last else results
        if new != blocks:
            contents[r] = new
    return contents


def _cyclic(tree: _Tree, parents: dict[int, int]) -> bool:
    """True when giving the entries of ``parents`` those parents makes a cycle."""
    for start in parents:
        seen: set[int] = set()
        cur: int | None = start
        while cur is not None:
            if cur in seen:
                return True
            seen.add(cur)
            cur = parents[cur] if cur in parents else tree.parent(cur)
    return False


def _keeps_calls(tree: _Tree, parents: dict[int, int]) -> bool:
    """True when giving the entries of ``parents`` those parents (no cycle) leaves every
    results entry among them below its owner still: a results entry moved up from below
    a later entry of a split response to an earlier one would lose the calls that later
    entry asks (:func:`_groups` pairs a result only with the calls on its way)."""
    for r in parents:
        if not _is_result_entry(tree.obj(r)) or (old := tree.owner(r)) is None:
            continue
        cur: int | None = parents[r]
        seen: set[int] = set()
        while cur is not None and cur not in seen and tree.obj(cur).get("type") != "assistant":
            seen.add(cur)
            cur = parents[cur] if cur in parents else tree.parent(cur)
        way: set[int] = set()
        group = tree.group(old)
        while cur is not None and cur not in way and tree.obj(cur).get("type") == "assistant" \
                and tree.group(cur) is group:
            way.add(cur)
            cur = tree.owner(cur)
        if old not in way:
            return False
    return True


def _as_planned(lines: list[Line], plan: Any) -> tuple[list[Line], list[tuple[int, int, int]]]:
    """The lines as ``plan`` (replacements and insertions only) leaves them, and where
    each comes from: ``(index, -1, -1)`` for line ``index``, ``(-1, after, k)`` for the
    ``k``-th line the plan inserts after line ``after``."""
    if not plan.replace and not plan.insert_after:
        return lines, [(line.index, -1, -1) for line in lines]
    chunks: list[bytes] = []
    origin: list[tuple[int, int, int]] = []
    for line in lines:
        chunks.append(plan.replace.get(line.index, line.raw))
        origin.append((line.index, -1, -1))
        for k, raw in enumerate(plan.insert_after.get(line.index, ())):
            if chunks[-1] and not chunks[-1].endswith(b"\n"):
                chunks[-1] += b"\n"
            chunks.append(raw)
            origin.append((-1, line.index, k))
    planned = split_lines(b"".join(chunks))
    assert len(planned) == len(origin)
    return planned, origin


def _ids_named(block: Any) -> Any:
    """``block`` as the pairing checker reads it: a ``tool_use`` ``id`` or ``tool_result``
    ``tool_use_id`` that is not a string names no call, so it is given as None (as if the
    member were missing); any other block as it is."""
    if isinstance(block, Mapping):
        key = {"tool_use": "id", "tool_result": "tool_use_id"}.get(_kind(block) or "")
        if key is not None and key in block and not isinstance(block[key], str):
            return {**block, key: None}
    return block


def _uses_of_blocks(blocks: list[Any]) -> list[str]:
    """The ids of the ``tool_use`` blocks among ``blocks``, in order."""
    return [b["id"] for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)]


def _uses_of(obj: Mapping[str, Any]) -> set[str]:
    return {use for b in _blocks(obj) if isinstance(b, Mapping) and b.get("type") == "tool_use"
            and (use := str_or_none(b.get("id"))) is not None}


def _textified(obj: Mapping[str, Any], bad: set[int]) -> dict[str, Any]:
    """The entry's message with the ``tool_result`` blocks at positions ``bad`` turned into
    text blocks, placed after the blocks that stay."""
    message = dict(_message(obj))
    keep: list[Any] = []
    moved: list[Any] = []
    for position, block in enumerate(_blocks(obj)):
        if position in bad:
            rid = block.get("tool_use_id")
            rid = rid if isinstance(rid, str) else json.dumps(rid, ensure_ascii=False)
            moved.append({"type": "text", "text": orphan_text(rid) + "\n" + content_text(block.get("content"))})
            continue
        keep.append(block)
    message["content"] = keep + moved
    return message


def _session_of(path: str) -> str:
    """The session a transcript belongs to: its file name, or for a subagent file
    (``<session>/subagents/agent-*.jsonl``) the directory above ``subagents``."""
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if parent == "subagents":
        return os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(path))))
    name = os.path.basename(path)
    return name[: -len(".jsonl")] if name.endswith(".jsonl") else name


def _claude_dirs(path: str) -> list[str]:
    dirs = []
    parts = os.path.abspath(path).split(os.sep)
    if "projects" in parts:
        at = len(parts) - 1 - parts[::-1].index("projects")
        dirs.append(os.sep.join(parts[:at]) or os.sep)
    env = os.environ.get("CLAUDE_CONFIG_DIR")
    dirs.append(env if env else os.path.join(os.path.expanduser("~"), ".claude"))
    return list(dict.fromkeys(dirs))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no process has that number
        return False
    except PermissionError:
        return True
    return True


FORMAT = ClaudeCode()
