"""Claude Code transcripts and Codex rollouts: scan findings, repair plans and their
invariants, over the checked-in fixtures damaged at every line boundary and mid-line."""

from __future__ import annotations

import io
import json
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog import foreign
from sessionlog.contract import DamageKind, Status
from sessionlog.foreign.lines import split_lines
from sessionlog.projection import FORMATS, check_pairing, project

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
CLAUDE = os.path.join(FIXTURES, "claude-code")
CODEX = os.path.join(FIXTURES, "codex")
ALL = sorted([os.path.join(CLAUDE, n) for n in os.listdir(CLAUDE) if n.endswith(".jsonl")]
             + [os.path.join(CODEX, n) for n in os.listdir(CODEX) if n.endswith(".jsonl")])
EXAMPLES = int(os.environ.get("SESSIONLOG_SLOW", "0") and 2000 or 150)


def load(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def fmt_of(path: str) -> foreign.ForeignFormat:
    return foreign.get("claude-code" if os.sep + "claude-code" + os.sep in path else "codex")


# --- what each fixture is ---------------------------------------------------------------

EXPECTED = {
    "claude-code/healthy.jsonl": ("clean", [], []),
    "claude-code/dangling-call.jsonl": ("repairable", [("toolu_05Edit", "TOOL_NOT_STARTED")], []),
    "claude-code/interrupted-parallel.jsonl": ("repairable", [
        ("toolu_01Deploy", "TOOL_OUTCOME_UNKNOWN"), ("toolu_04Curl", "TOOL_NOT_STARTED"),
        ("toolu_S9Df", "TOOL_NOT_STARTED")], []),
    "claude-code/orphan-result.jsonl": ("repairable", [], ["toolu_99Lost"]),
    "claude-code/torn.jsonl": ("repairable", [], []),
    "codex/healthy.jsonl": ("clean", [], []),
    "codex/healthy-ordinals.jsonl": ("clean", [], []),
    "codex/dangling-call.jsonl": ("repairable", [("call_E5deploy", "TOOL_OUTCOME_UNKNOWN"),
                                                 ("call_F6patch", "TOOL_NOT_STARTED")], []),
    "codex/orphan-output.jsonl": ("repairable", [], ["call_Z9gone"]),
    "codex/torn.jsonl": ("repairable", [], []),
}


def test_every_fixture_is_listed():
    assert sorted(EXPECTED) == sorted(os.path.relpath(p, FIXTURES) for p in ALL)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_findings(name):
    status, unanswered, orphans = EXPECTED[name]
    path = os.path.join(FIXTURES, name)
    data = load(path)
    fmt = foreign.sniff(data[: foreign.HEAD_BYTES])
    assert fmt is fmt_of(path)  # recognized by content
    exam = foreign.examine(data, fmt)
    assert str(exam.status()) == status
    found = [(f.call_id, f.code) for f in exam.findings if f.kind == "unanswered-call"]
    assert found == unanswered
    assert exam.analysis.orphans == orphans
    as_is = check_pairing(fmt.native_items(exam.lines), fmt.native_view)
    assert (as_is is None) == (not unanswered and not orphans)  # what the tool would send is rejected
    repaired = exam.repaired()
    assert check_pairing(fmt.native_items(split_lines(repaired)), fmt.native_view) is None
    again = foreign.examine(repaired, fmt)
    assert again.plan.empty and again.status() is Status.CLEAN


def test_torn_fixture_damage():
    for path in (os.path.join(CLAUDE, "torn.jsonl"), os.path.join(CODEX, "torn.jsonl")):
        data = load(path)
        exam = foreign.examine(data, fmt_of(path))
        damage = exam.tail_damage
        assert damage is not None and damage.kind is DamageKind.TORN
        assert data[damage.offset:].count(b"\n") == 0 and damage.offset + damage.length == len(data)
        assert exam.repaired() == data[: damage.offset]  # the cut, and nothing else


def test_sessionlog_logs_and_other_files_are_not_foreign():
    for name in os.listdir(FIXTURES):
        if name.endswith(".jsonl"):
            assert foreign.sniff(load(os.path.join(FIXTURES, name))[:65536]) is None
    assert foreign.sniff(b"hello, world\n") is None
    assert foreign.sniff(b'{"a": 1}\n') is None


def test_claude_record_types_this_version_does_not_know_do_not_hide_the_format():
    """Claude Code adds record types with every release (an interactive session starts
    with a "mode" record, a teammate's with "agent-setting"): ahead of the entries, they
    decide nothing, and the file is still a Claude Code transcript."""
    data = load(os.path.join(CLAUDE, "dangling-call.jsonl"))
    sid = json.loads(raw_lines(data)[2])["sessionId"]
    head = (b'{"type":"mode","mode":"normal","sessionId":"' + sid.encode() + b'"}\n'
            b'{"type":"agent-setting","agentSetting":"default"}\n{"type":"tag","tag":"x"}\n')
    assert foreign.sniff(head + data) is foreign.get("claude-code")
    exam = foreign.examine(head + data, foreign.get("claude-code"))
    assert exam.damage.mid_log == [] and exam.analysis.unanswered  # the dangling call, found
    assert foreign.sniff(b'{"type":"mode","mode":"normal"}\n{"a": 1}\n') is None  # nothing says Claude Code
    assert foreign.sniff(b'{"type":"mode","seq":1}\n' + data) is None  # a sessionlog record is not one


def test_long_first_line_is_recognized_by_its_prefix():
    for path in (os.path.join(CLAUDE, "healthy.jsonl"), os.path.join(CODEX, "healthy.jsonl")):
        first = load(path).split(b"\n")[2 if "claude" in path else 0]
        assert foreign.sniff(first[:200]) is fmt_of(path)


# --- Claude Code specifics -------------------------------------------------------------


def entries(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def test_claude_answer_is_the_interrupted_form_chained_after_the_call():
    data = load(os.path.join(CLAUDE, "dangling-call.jsonl"))
    exam = foreign.examine(data, foreign.get("claude-code"))
    after = entries(exam.repaired())
    before = entries(data)
    [answer] = [e for e in after if "sessionlogRecovery" in e]
    asker = next(e for e in before if any(b.get("id") == "toolu_05Edit" for b in (e.get("message") or {}).get("content") or []
                                         if isinstance(b, dict)))
    assert answer["parentUuid"] == asker["uuid"] and answer["sourceToolAssistantUUID"] == asker["uuid"]
    assert answer["toolDenialKind"] == "interrupted" and answer["type"] == "user"
    [block] = answer["message"]["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_05Edit" and block["is_error"] is True
    assert block["content"].startswith("TOOL_NOT_STARTED: ")
    for key in ("sessionId", "cwd", "version", "gitBranch", "isSidechain"):
        assert answer[key] == asker[key]
    # The conversation that followed is re-attached after the answer: the resumed chain keeps it.
    follow = next(e for e in after if e.get("message", {}).get("content") == "Tu es toujours là ? Continue sans l'édition.")
    assert follow["parentUuid"] == answer["uuid"]
    items = foreign.get("claude-code").native_items(split_lines(exam.repaired()))
    texts = json.dumps(items, ensure_ascii=False)
    assert "Tu es toujours là" in texts and "je reprends sans modifier" in texts
    # The line right after the asking entry in the file is the answer.
    lines = exam.repaired().splitlines()
    assert json.loads(lines[lines.index(next(x for x in lines if b'"toolu_05Edit","name"' in x)) + 1])["uuid"] == answer["uuid"]


def test_claude_sidechain_call_is_answered_inside_its_sidechain():
    data = load(os.path.join(CLAUDE, "interrupted-parallel.jsonl"))
    exam = foreign.examine(data, foreign.get("claude-code"))
    answers = [e for e in entries(exam.repaired()) if "sessionlogRecovery" in e]
    side = next(a for a in answers if a["message"]["content"][0]["tool_use_id"] == "toolu_S9Df")
    assert side["isSidechain"] is True and side["agentId"] == "b19e"
    main = next(a for a in answers if a["isSidechain"] is False)
    # One answer entry for the whole response (same message.id), in call order, after the
    # result that exists.
    assert [b["tool_use_id"] for b in main["message"]["content"]] == ["toolu_01Deploy", "toolu_04Curl"]
    assert [r["code"] for r in main["sessionlogRecovery"]] == ["TOOL_OUTCOME_UNKNOWN", "TOOL_NOT_STARTED"]
    assert "line 10" in main["message"]["content"][0]["content"]  # names its evidence


def test_claude_orphan_result_is_kept_as_text():
    data = load(os.path.join(CLAUDE, "orphan-result.jsonl"))
    exam = foreign.examine(data, foreign.get("claude-code"))
    assert exam.plan.changed_lines() == [13]
    fixed = entries(exam.repaired())[12]
    assert fixed["uuid"] == entries(data)[12]["uuid"]
    [block] = fixed["message"]["content"]
    assert block["type"] == "text" and "toolu_99Lost" in block["text"] and "sortie d'un appel disparu" in block["text"]


def test_claude_healthy_with_parallel_branching_results_and_compaction_is_clean():
    data = load(os.path.join(CLAUDE, "healthy.jsonl"))
    exam = foreign.examine(data, foreign.get("claude-code"))
    assert exam.findings == [] and exam.plan.empty
    items = foreign.get("claude-code").native_items(exam.lines)
    # The resumed chain starts at the compact boundary: the summary, then what followed.
    assert "continued from a previous conversation" in json.dumps(items[0], ensure_ascii=False)
    assert check_pairing(items, "anthropic") is None


INTERRUPTED = b'{"type":"text","text":"[Request interrupted by user for tool use]"}'


def interrupted_results(data: bytes) -> bytes:
    """interrupted-parallel.jsonl with its results entry (line 9, toolu_02ReadLog) ending
    in a text block, as Claude Code writes a result the user interrupted."""
    lines = raw_lines(data)
    assert b'"toolu_02ReadLog","type":"tool_result"' in lines[8]
    at = lines[8].index(b"]},")
    lines[8] = lines[8][:at] + b"," + INTERRUPTED + lines[8][at:]
    return b"".join(lines)


def test_claude_an_answer_goes_before_a_results_entry_that_ends_in_text():
    """The API rejects a user message where a text block comes before a tool_result: the
    answer to the calls the results entry does not answer is chained before that entry
    (after the asking message), which is re-parented to the answer, so the file itself
    holds the results first, whatever Claude Code merges or reorders."""
    data = interrupted_results(load(os.path.join(CLAUDE, "interrupted-parallel.jsonl")))
    fmt = foreign.get("claude-code")
    exam = foreign.examine(data, fmt)
    after = raw_lines(exam.repaired())
    asker, results = json.loads(raw_lines(data)[7]), json.loads(raw_lines(data)[8])
    answer = json.loads(after[8])  # right after the asking entry, before the results entry
    assert [b["tool_use_id"] for b in answer["message"]["content"]] == ["toolu_01Deploy", "toolu_04Curl"]
    assert answer["parentUuid"] == asker["uuid"]
    moved = json.loads(after[9])
    assert moved["uuid"] == results["uuid"] and moved["parentUuid"] == answer["uuid"]
    assert {k: v for k, v in moved.items() if k != "parentUuid"} == {k: v for k, v in results.items() if k != "parentUuid"}
    user = next(m for m in fmt.native_items(split_lines(exam.repaired())) if m["role"] == "user"
                and any(b.get("type") == "tool_result" for b in m["content"]))
    assert [b["type"] for b in user["content"]] == ["tool_result"] * 3 + ["text"]
    assert check_pairing(fmt.native_items(split_lines(exam.repaired())), "anthropic") is None
    check_repair(fmt, data, force=False)


def test_claude_the_native_check_sees_a_text_block_before_a_later_result():
    """What Claude Code sends is judged as the entries hold it: a results entry ending in
    text with another results entry chained after it is a user message whose text comes
    before a tool_result, which the API rejects; the check is not fooled by putting
    results first."""
    data = interrupted_results(load(os.path.join(CLAUDE, "interrupted-parallel.jsonl")))
    lines = raw_lines(data)
    late = json.loads(lines[8])
    late.update(uuid="000000aa-5a1c-4e7b-9d2f-0c6a3b8e1faa", parentUuid=late["uuid"])
    late["message"]["content"] = [{"tool_use_id": "toolu_01Deploy", "type": "tool_result", "content": "ok"},
                                  {"tool_use_id": "toolu_04Curl", "type": "tool_result", "content": "ok"}]
    lines.insert(9, json.dumps(late, ensure_ascii=False).encode() + b"\n")
    items = foreign.get("claude-code").native_items(split_lines(b"".join(lines)))
    violation = check_pairing(items, "anthropic")
    assert violation is not None and "does not come before the other content" in violation.message


def test_claude_split_response_is_one_assistant_message():
    data = load(os.path.join(CLAUDE, "dangling-call.jsonl"))
    cut = data[: data.index(b'"uuid":"00000009')]  # cut inside the entry after the two results
    cut = cut[: cut.rindex(b"\n") + 1]
    exam = foreign.examine(cut, foreign.get("claude-code"))
    items = foreign.get("claude-code").native_items(exam.lines)
    assistant = [m for m in items if m["role"] == "assistant"]
    assert len(assistant) == 1
    assert [b["type"] for b in assistant[0]["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    # Both results (siblings branching from the last tool_use entry) answer it.
    assert [b["tool_use_id"] for b in items[-1]["content"]] == ["toolu_01Deploy", "toolu_02ReadLog"]


# --- Codex specifics ---------------------------------------------------------------------


def test_codex_answers_are_appended_in_codex_shape():
    data = load(os.path.join(CODEX, "dangling-call.jsonl"))
    exam = foreign.examine(data, foreign.get("codex"))
    assert exam.plan.appends_only(exam.lines)
    repaired = exam.repaired()
    assert repaired.startswith(data)
    new = entries(repaired[len(data):])
    assert [n["payload"]["type"] for n in new] == ["function_call_output", "custom_tool_call_output"]
    assert [n["payload"]["call_id"] for n in new] == ["call_E5deploy", "call_F6patch"]
    assert new[0]["payload"]["output"].startswith("TOOL_OUTCOME_UNKNOWN: ")
    assert "exec_command_begin" in new[0]["payload"]["output"]
    assert new[1]["payload"]["output"].startswith("TOOL_NOT_STARTED: ")
    assert all(isinstance(n["timestamp"], str) and list(n) == ["timestamp", "type", "payload"] for n in new)


def test_codex_ordinals_continue_at_the_end():
    data = load(os.path.join(CODEX, "healthy-ordinals.jsonl"))
    lines = data.splitlines(keepends=True)
    cut = b"".join(lines[:20])  # ends with two parallel calls, no outputs
    exam = foreign.examine(cut, foreign.get("codex"))
    new = entries(exam.repaired()[len(cut):])
    last = json.loads(lines[19])["ordinal"]
    assert [n["ordinal"] for n in new] == [last + 1, last + 2]
    assert [n["payload"]["call_id"] for n in new] == ["call_C3ruff", "call_D4mypy"]
    assert all(list(n) == ["timestamp", "ordinal", "type", "payload"] for n in new)  # as Codex writes a line
    assert exam.in_place_refusal is None and exam.status() is Status.REPAIRABLE


def test_codex_output_before_the_next_message_when_the_rollout_went_on():
    data = load(os.path.join(CODEX, "healthy.jsonl"))
    lines = data.splitlines(keepends=True)
    del lines[20]  # call_C3ruff's output is lost; its sibling's and the next message remain
    exam = foreign.examine(b"".join(lines), foreign.get("codex"))
    out = entries(exam.repaired())
    types = [(e["payload"].get("type"), e["payload"].get("call_id")) for e in out]
    at = types.index(("function_call_output", "call_C3ruff"))
    # After the response's items (and the unknown record after them), before the next message.
    assert types.index(("function_call_output", "call_D4mypy")) < at
    assert out[at - 1]["type"] == "world_state"
    assert out[at + 1]["payload"]["type"] == "message" and out[at + 1]["payload"]["role"] == "assistant"


def test_codex_compacted_history_restarts_pairing():
    data = load(os.path.join(CODEX, "healthy.jsonl"))
    lines = data.splitlines(keepends=True)
    # A call unanswered before the compaction is answered before it, not after.
    del lines[9]
    exam = foreign.examine(b"".join(lines), foreign.get("codex"))
    out = entries(exam.repaired())
    kinds = [e["type"] for e in out]
    answer = next(i for i, e in enumerate(out) if e["payload"].get("call_id") == "call_A1shell"
                  and e["payload"].get("type") == "function_call_output")
    assert answer < kinds.index("compacted")
    assert out[answer]["payload"]["output"].startswith("TOOL_OUTCOME_UNKNOWN")  # exec_command_begin seen


# --- views -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL, ids=lambda p: os.path.relpath(p, FIXTURES))
@pytest.mark.parametrize("view", FORMATS)
def test_views_of_repaired_files_pass_the_checkers(path, view):
    fmt = fmt_of(path)
    exam = foreign.examine(load(path), fmt, force=True)
    projection = project(fmt.events(exam.repaired_lines()), view)
    assert check_pairing(projection.items, view) is None
    assert not [i for i in projection.issues if "view shows" in i]  # repair answered every call itself
    assert projection.call_ids  # every fixture has calls on its resumed conversation


# --- damage at every line boundary and mid-line ----------------------------------------


def cuts(data: bytes) -> list[int]:
    offsets = set()
    for line in split_lines(data):
        offsets.update((line.offset, line.offset + len(line.raw) // 2, line.end - 1))
    offsets.add(len(data))
    return sorted(offsets)


def raw_lines(data: bytes) -> list[bytes]:
    """Lines as the tools write them: split at \\n only, the newline kept."""
    return re.findall(rb"[^\n]*\n|[^\n]+$", data)


def is_answer(raw: bytes) -> bool:
    obj = json.loads(raw)
    if "sessionlogRecovery" in obj:  # Claude Code: the interrupted-call form
        return all(b["type"] == "tool_result" and b["is_error"] is True for b in obj["message"]["content"])
    payload = obj.get("payload") or {}
    return obj.get("type") == "response_item" and payload.get("type") in (
        "function_call_output", "custom_tool_call_output", "tool_search_output")


def untouched_lines_kept(before: bytes, after: bytes, exam: foreign.Examination) -> None:
    """Walking both files in order: every line the plan does not name is byte-identical
    and in its place; a rewritten line differs from the original only where the format
    allows (Claude Code: its parent, or an orphan result turned into text); whatever else
    the new file holds is an answer the repair wrote."""
    old = raw_lines(before)
    new = iter(raw_lines(after))
    plan = exam.plan
    moved_to: dict[int, list[int]] = {}
    for index, target in sorted(plan.move.items()):
        moved_to.setdefault(target, []).append(index)
    for i, raw in enumerate(old):
        if i in plan.move:
            assert exam.format.name == "codex"
        if i not in plan.drop and i not in plan.move:
            got = next(new)
            if i in plan.replace:
                was, now = json.loads(raw[plan.cut.get(i, 0):]), json.loads(got)
                # Claude Code: an entry whose parentUuid key was lost gets one (relinked).
                assert set(now) - set(was) <= ({"parentUuid"} if exam.format.name == "claude-code" else set())
                assert set(was) <= set(now)
                if exam.format.name == "claude-code":
                    assert {k for k in was if was[k] != now[k]} <= {"parentUuid", "message"}
                elif was.get("type") == "compacted" and was != now:
                    # Codex: items removed from a compacted history, the rest as it was.
                    assert {k for k in was if was[k] != now[k]} == {"payload"}
                    old_history, new_history = was["payload"]["replacement_history"], now["payload"]["replacement_history"]
                    rest = iter(old_history)
                    assert all(any(x == y for y in rest) for x in new_history)  # what is left, in order
                    assert {**was["payload"], "replacement_history": None} == {**now["payload"], "replacement_history": None}
                else:
                    assert i in plan.cut and got.rstrip(b"\n") == raw[plan.cut[i]:].rstrip(b"\n")
            elif i == plan.terminate:
                assert got == raw + b"\n"
            else:
                assert got == raw
        for m in moved_to.get(i, ()):
            # Moved, byte for byte (a glued line: its entry); the last line, moved up, gets
            # the newline it lacked (plan.terminate).
            moved = plan.replace.get(m, old[m])
            assert next(new) == (moved + b"\n" if m == plan.terminate and not moved.endswith(b"\n") else moved)
        for _ in plan.insert_after.get(i, ()):
            assert is_answer(next(new))
    assert next(new, None) is None


def pairs_every_call_once(fmt: foreign.ForeignFormat, data: bytes) -> None:
    lines = split_lines(data)
    violation = check_pairing(fmt.native_items(lines), fmt.native_view)
    # A flipped byte can make an id one the provider refuses: that is not pairing, and
    # repair does not rename ids.
    assert violation is None or "does not match" in violation.message, violation
    if fmt.name == "codex":
        # Over the whole file, per stretch between compactions: every call has exactly one
        # output, every output one call.
        from sessionlog.foreign.codex import ANSWER, OUTPUTS, _call_id, _epochs

        for epoch in _epochs(lines):
            calls = [c for _, item in epoch if item.get("type") in ANSWER and (c := _call_id(item)) is not None]
            outs = [item.get("call_id") for _, item in epoch if item.get("type") in OUTPUTS]
            assert sorted(calls) == sorted(outs)
    else:
        # The resumed chain (checked above) answers each of its calls exactly once; over
        # the whole file every tool_use has an answer and no result answers nothing.
        objs = list({line.obj["uuid"]: line.obj for line in reversed(lines)
                     if line.obj is not None and isinstance(line.obj.get("uuid"), str)}.values())
        # A tool_use whose "id" was damaged away names no call: nothing can answer it.
        uses = [b["id"] for o in objs if o.get("type") == "assistant"
                for b in (o.get("message") or {}).get("content") or []
                if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("id"), str)]
        results = [b["tool_use_id"] for o in objs if o.get("type") == "user"
                   for b in (o.get("message") or {}).get("content") or []
                   if isinstance(b, dict) and b.get("type") == "tool_result"]
        assert set(uses) == set(results)


def check_repair(fmt: foreign.ForeignFormat, data: bytes, *, force: bool = True) -> foreign.Examination:
    exam = foreign.examine(data, fmt, force=force)
    if exam.plan.empty:
        # Scan calls the file clean: what the tool sends from it passes the check show runs.
        violation = check_pairing(fmt.native_items(exam.lines), fmt.native_view)
        assert violation is None or "does not match" in violation.message, violation
    after = exam.repaired()
    untouched_lines_kept(data, after, exam)
    pairs_every_call_once(fmt, after)
    again = foreign.examine(after, fmt, force=force)
    assert again.plan.empty, [f.detail for f in again.findings]  # a second repair changes nothing
    # What the plan removes is exactly what the quarantine file gets: every removed byte
    # is either in the new file or in the quarantine.
    removed = b"".join(exam.plan.quarantined(exam.lines))
    cut_total = sum(len(exam.lines[i].raw) for i in exam.plan.drop) + sum(
        torn for i, torn in exam.plan.cut.items() if i not in exam.plan.drop)
    assert len(removed) == cut_total
    for i, torn in exam.plan.cut.items():
        assert exam.lines[i].raw[:torn] in removed
    return exam


@pytest.mark.parametrize("path", ALL, ids=lambda p: os.path.relpath(p, FIXTURES))
def test_every_cut_repairs_to_a_paired_file(path):
    fmt = fmt_of(path)
    data = load(path)
    for cut in cuts(data):
        exam = check_repair(fmt, data[:cut], force=False)
        assert not exam.needs_force  # a cut never makes mid-log damage


@pytest.mark.parametrize("path", ALL, ids=lambda p: os.path.relpath(p, FIXTURES))
def test_garbage_in_the_middle_needs_force(path):
    fmt = fmt_of(path)
    data = load(path)
    lines = data.splitlines(keepends=True)
    at = len(lines) // 2
    lines.insert(at, b'{"parentUuid":"x","type":"us\x00\x00\x00\n')
    damaged = b"".join(lines)
    exam = foreign.examine(damaged, fmt)
    assert exam.status() is Status.NEEDS_FORCE and exam.tail_damage.kind is DamageKind.MID_LOG
    assert exam.tail_damage.records_after > 0
    forced = check_repair(fmt, damaged, force=True)
    assert at in forced.plan.drop


@st.composite
def damaged_files(draw, paths=tuple(ALL)):
    path = draw(st.sampled_from(paths))
    lines = raw_lines(load(path))
    for _ in range(draw(st.integers(0, 3))):
        if not lines:
            break
        op = draw(st.sampled_from(["drop", "duplicate", "swap", "flip", "glue"]))
        i = draw(st.integers(0, len(lines) - 1))
        if op == "drop":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap" and i + 1 < len(lines):
            lines[i], lines[i + 1] = lines[i + 1], lines[i]
        elif op == "glue" and i + 1 < len(lines):
            # A torn write, then a later append glued onto it.
            torn = lines[i][: draw(st.integers(1, max(1, len(lines[i]) - 2)))]
            lines[i: i + 2] = [torn + lines[i + 1]]
        elif op == "flip":
            raw = bytearray(lines[i])
            j = draw(st.integers(0, max(0, len(raw) - 2)))
            raw[j] ^= draw(st.integers(1, 255))
            lines[i] = bytes(raw)
    data = b"".join(lines)
    cut = draw(st.integers(0, len(data)))
    return path, data[:cut] if draw(st.booleans()) else data


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_files())
def test_property_any_damage_repairs_to_a_paired_file_keeping_untouched_lines(case):
    path, data = case
    check_repair(fmt_of(path), data, force=True)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_files(paths=(os.path.join(CODEX, "healthy-ordinals.jsonl"),)))
def test_property_a_rollout_with_ordinals_is_only_appended_to_or_refused(case):
    """Codex keeps byte offsets into a rollout whose lines carry ordinals. Whatever the
    damage, repair either keeps every byte up to the last newline where it is (cutting
    only a torn last line) and appends answers numbered on from the highest ordinal, in
    Codex's member order, leaving a clean file; or it refuses, naming a line of that
    prefix, and writes nothing."""
    _, data = case
    exam = foreign.examine(data, foreign.get("codex"), force=True)
    if not any(x.obj is not None and type(x.obj.get("ordinal")) is int for x in exam.lines):
        return  # no line left shows the ordinals (nothing decodes: repair refuses it, exit 4)
    prefix = data[: data.rfind(b"\n") + 1]
    refusal = exam.in_place_refusal
    if refusal is not None:
        line, offset = map(int, re.search(r"from line (\d+) \(offset (\d+)\)", refusal).groups())
        assert offset <= len(prefix) and split_lines(data)[line - 1].offset == offset
        assert exam.status() is Status.NEEDS_FORCE
        return
    after = exam.repaired()
    assert after.startswith(prefix)
    appended = b"".join(exam.plan.insert_after.get(len(exam.lines) - 1, ()))
    assert after.endswith(appended)
    # Between the two, what stays of a last line after the last newline: nothing (torn,
    # cut), the line with its newline, or the entry a torn write was glued to.
    kept = after[len(prefix): len(after) - len(appended)]
    assert kept in (b"", data[len(prefix):] + b"\n") or data.endswith(kept.rstrip(b"\n"))
    assert set(exam.plan.insert_after) <= {len(exam.lines) - 1}  # no line inserted before the last
    numbered = [o for x in split_lines(prefix + kept) if x.obj is not None and type(o := x.obj.get("ordinal")) is int]
    new = [x.obj for x in split_lines(appended)]
    assert [n["ordinal"] for n in new] == list(range(max(numbered) + 1, max(numbered) + 1 + len(new)))
    assert all(list(n) == ["timestamp", "ordinal", "type", "payload"] for n in new)
    assert foreign.examine(after, foreign.get("codex")).plan.empty


@pytest.mark.parametrize("path", [os.path.join(CLAUDE, "dangling-call.jsonl"), os.path.join(CODEX, "dangling-call.jsonl")],
                         ids=["claude-code", "codex"])
def test_a_write_glued_onto_a_torn_line_keeps_the_entry(path):
    fmt = fmt_of(path)
    lines = raw_lines(load(path))
    at = len(lines) - 3
    torn = lines[at][:37]
    glued = lines[:at] + [torn + lines[at + 1]] + lines[at + 2:]
    data = b"".join(glued)
    exam = foreign.examine(data, fmt)
    assert exam.status() is Status.REPAIRABLE  # not mid-log: nothing decodable is lost
    assert [f.kind for f in exam.findings if f.kind == "glued-line"] == ["glued-line"]
    assert exam.plan.quarantined(exam.lines) == [torn]
    after = raw_lines(exam.repaired())
    assert lines[at + 1] in after or fmt.name == "claude-code"  # the entry stays (maybe re-parented)
    check_repair(fmt, data, force=False)


def test_codex_output_after_a_message_moves_before_it_unchanged():
    lines = raw_lines(load(os.path.join(CODEX, "healthy.jsonl")))
    message = lines.pop(23)
    lines.insert(21, message)  # the assistant's message now sits between call_D4mypy and its output
    data = b"".join(lines)
    fmt = foreign.get("codex")
    exam = foreign.examine(data, fmt)
    assert check_pairing(fmt.native_items(exam.lines), "responses") is not None
    assert [f.kind for f in exam.findings] == ["misplaced-output"]
    after = raw_lines(exam.repaired())
    assert sorted(after) == sorted(lines)  # the same lines, byte for byte: one moved
    assert after.index(lines[22]) < after.index(message)
    check_repair(fmt, data, force=False)


def test_claude_an_entry_glued_onto_a_torn_one_is_reattached_to_the_torn_ones_parent():
    """The tool appended the next entry onto a torn write: repair keeps the glued entry
    (its torn prefix goes to the quarantine file) and, since the torn bytes still name
    their entry's uuid and parent, chains the kept entry to that parent: no broken chain,
    and the resumed conversation keeps what came before."""
    lines = raw_lines(load(os.path.join(CLAUDE, "dangling-call.jsonl")))
    data = b"".join(lines[:-1])[:-30] + lines[-1]  # the second-to-last entry torn, the last glued onto it
    torn_uuid = json.loads(lines[-2])["uuid"]
    fmt = foreign.get("claude-code")
    exam = foreign.examine(data, fmt)
    kinds = [f.kind for f in exam.findings]
    assert "glued-line" in kinds and "reattached" in kinds and "broken-chain" not in kinds
    repaired = exam.repaired()
    glued_uuid = json.loads(lines[-1])["uuid"]
    [kept] = [json.loads(r) for r in raw_lines(repaired) if f'"uuid":"{glued_uuid}"'.encode() in r]
    assert kept["parentUuid"] == json.loads(lines[-2])["parentUuid"] != torn_uuid
    after = foreign.examine(repaired, fmt)
    assert "broken-chain" not in [f.kind for f in after.findings], after.findings
    check_repair(fmt, data, force=False)


def test_claude_entries_chained_to_a_removed_line_are_reattached_to_its_parent():
    lines = raw_lines(load(os.path.join(CLAUDE, "interrupted-parallel.jsonl")))
    at = next(i for i, raw in enumerate(lines) if b'"uuid":"00000003-' in raw)
    middle = lines[at].index(b"Je lance")
    lines[at] = lines[at][:middle] + b"\xff\xfe" + lines[at][middle + 2:]  # undecodable, uuid still readable
    data = b"".join(lines)
    fmt = foreign.get("claude-code")
    exam = foreign.examine(data, fmt, force=True)
    assert "reattached" in [f.kind for f in exam.findings]
    first_question = "Déploie la version 1.2.3"
    assert first_question not in json.dumps(fmt.native_items(exam.lines), ensure_ascii=False)  # lost on resume
    repaired = exam.repaired()
    assert first_question in json.dumps(fmt.native_items(split_lines(repaired)), ensure_ascii=False)
    child = next(json.loads(raw) for raw in raw_lines(repaired) if b'"uuid":"00000004-' in raw)
    assert child["parentUuid"].startswith("00000002-")
    check_repair(fmt, data, force=True)


@pytest.mark.parametrize("where", ["mid-file", "last-line"])
def test_claude_a_lone_surrogate_escape_is_text_not_damage(tmp_path, where):
    """A tool truncating a text can cut an emoji in half and write its first half as a
    lone ``\\ud83d`` escape: valid JSON both tools parse. Such a line is an entry like any
    other: never cut as damage (a repair without force would have replaced a real result
    with an invented one), kept byte for byte by a repair, shown with the same escape, and
    converted with U+FFFD in its place (a sessionlog record is strict UTF-8), with a warning."""
    from sessionlog.cli import main

    lines = raw_lines(load(os.path.join(CLAUDE, "dangling-call.jsonl")))
    at = next(i for i, raw in enumerate(lines) if b'"tool_use_id":"toolu_01Deploy"' in raw)
    lines[at] = lines[at].replace("Déployé: v1.2.3".encode(), b"D\\u00e9ploy\\u00e9 \\ud83d", 1)
    assert b"\\ud83d" in lines[at]
    if where == "last-line":
        lines = lines[: at + 1]
    data = b"".join(lines)
    fmt = foreign.get("claude-code")
    exam = foreign.examine(data, fmt)
    assert exam.damage.tail == [] and exam.damage.mid_log == []
    assert "toolu_01Deploy" not in [f.call_id for f in exam.findings]  # its result is there
    after = check_repair(fmt, data, force=False)
    assert lines[at] in raw_lines(after.repaired())  # byte for byte
    path = tmp_path / "s.jsonl"
    path.write_bytes(data)
    out = io.StringIO()
    assert main(["show", str(path)], out=out) == 0  # the resumed conversation's events
    if where == "last-line":  # (mid-file, the result lies before a compaction the tool resumes after)
        assert "\\ud83d" in out.getvalue()
    assert main(["show", str(path), "--format", "anthropic", "--check"], out=io.StringIO()) == 0
    assert main(["convert", "--repaired", str(path), f"jsonl:{tmp_path / 'dst'}"], out=io.StringIO()) == 0
    converted = (tmp_path / "dst" / "s.jsonl").read_text(encoding="utf-8")
    if where == "last-line":
        assert "D\u00e9ploy\u00e9 \ufffd" in converted


def test_claude_an_orphan_result_made_text_changes_only_its_message():
    """Turning an orphan tool_result into a text block rewrites the entry's ``message``
    and nothing else: every other member keeps its bytes (a number keeps its spelling,
    where re-encoding the entry would turn ``0.00003`` into ``3e-05``)."""
    lines = raw_lines(load(os.path.join(CLAUDE, "orphan-result.jsonl")))
    at = next(i for i, raw in enumerate(lines) if b'"tool_use_id":"toolu_99Lost"' in raw)
    extra = b',"toolUseResult":{"durationMs":0.00003,"rate":1.5e-7,"big":1E+2}'
    assert lines[at].rstrip().endswith(b"}")
    lines[at] = lines[at].rstrip()[:-1] + extra + b"}\n"
    data = b"".join(lines)
    fmt = foreign.get("claude-code")
    exam = check_repair(fmt, data, force=False)
    [after] = [r for r in raw_lines(exam.repaired()) if json.loads(r).get("uuid") == json.loads(lines[at])["uuid"]]
    assert extra in after
    before_members = json.loads(lines[at])
    after_members = json.loads(after)
    assert list(after_members) == list(before_members)  # same members, same order
    assert {k: v for k, v in after_members.items() if k != "message"} == \
        {k: v for k, v in before_members.items() if k != "message"}
    assert after_members["message"]["content"][0]["type"] == "text"


def test_codex_an_output_in_a_compacted_history_with_no_call_there_is_removed_from_it():
    """A ``compacted`` line's replacement history is what Codex resumes with: an output in
    it whose call is not before it (the shape behind "No tool call found for function call
    output" after a compaction) would be rejected. Repair removes that item from the
    history, rewriting only that line's payload (its other members keep their bytes), so
    that scan, repair and ``show --check`` agree."""
    lines = raw_lines(load(os.path.join(CODEX, "healthy.jsonl")))
    at = next(i for i, raw in enumerate(lines) if b'"type":"compacted"' in raw)
    obj = json.loads(lines[at])
    history = obj["payload"]["replacement_history"]
    orphan = {"type": "function_call_output", "call_id": "call_R0gone", "output": "orphan in history"}
    obj["payload"]["replacement_history"] = history + [orphan]
    lines[at] = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    data = b"".join(lines)
    fmt = foreign.get("codex")
    exam = foreign.examine(data, fmt)
    assert exam.status() is Status.REPAIRABLE and exam.analysis.orphans == ["call_R0gone"]
    assert check_pairing(fmt.native_items(exam.lines), "responses") is not None  # as it is: rejected
    after = check_repair(fmt, data, force=False)
    repaired = raw_lines(after.repaired())
    fixed = json.loads(repaired[at])
    assert fixed["payload"]["replacement_history"] == history and fixed["timestamp"] == obj["timestamp"]
    assert repaired[:at] + repaired[at + 1:] == lines[:at] + lines[at + 1:]  # no other line changed
    assert check_pairing(fmt.native_items(split_lines(after.repaired())), "responses") is None


def _conversation(data: bytes) -> list[dict]:
    fmt = foreign.get("claude-code")
    return [{k: v for k, v in e.items() if k not in ("seq", "ts")} for e in fmt.events(split_lines(data))]


def _chain(data: bytes) -> list[int]:
    """The line indexes of the conversation Claude Code resumes, root first."""
    return foreign.get("claude-code")._chain(foreign.claude_code._Tree(split_lines(data)))


def _cut_links(lines: list[bytes]) -> list[tuple[int, bytes, bytes]]:
    """For every entry of the healthy transcript chained to a parent: (its line, the line
    with a parentUuid that names no entry, the line with the parentUuid key damaged)."""
    out = []
    for i, raw in enumerate(lines):
        obj = json.loads(raw)
        if isinstance(obj.get("parentUuid"), str) and "uuid" in obj:
            gone = raw.replace(obj["parentUuid"].encode(), b"ffffffff-0000-4000-8000-00000000dead")
            out.append((i, gone, raw.replace(b'"parentUuid"', b'"parentUuiD"', 1)))
    return out


@pytest.mark.parametrize("damage", ["dangling", "key"])
@pytest.mark.parametrize("name", ["healthy.jsonl", "interrupted-parallel.jsonl", "orphan-result.jsonl"])
def test_claude_a_cut_link_on_the_resumed_conversation_is_relinked_to_the_entry_before_it(name, damage):
    """A parentUuid that names no entry of the file (a parent the tool never wrote, a line
    removed) or a damaged parentUuid key cuts the resumed conversation there: Claude Code
    resumes only what follows. Repair links the entry to the one written before it in the
    file; where that was its parent, the conversation is exactly the one repair gives
    without the damage."""
    path = os.path.join(CLAUDE, name)
    lines = raw_lines(load(path))
    fmt = foreign.get("claude-code")
    whole = _conversation(foreign.examine(b"".join(lines), fmt).repaired())
    entries = [json.loads(r) for r in lines]
    relinked = 0
    for i, gone, key in _cut_links(lines):
        data = b"".join(lines[:i] + [gone if damage == "dangling" else key] + lines[i + 1:])
        exam = foreign.examine(data, fmt)
        if i not in _chain(b"".join(lines)) or entries[i].get("isCompactSummary"):
            continue  # off the resumed conversation: reported, left alone; a summary starts one
        relinked += 1
        assert len(_chain(data)) < len(_chain(b"".join(lines)))  # the damage loses history on resume
        [finding] = [f for f in exam.findings if f.kind == "relinked"]
        assert finding.line == i + 1 and exam.status() == Status.REPAIRABLE
        check_repair(fmt, data, force=False)
        before = next(j for j in range(i - 1, -1, -1)
                      if entries[j].get("type") in ("user", "assistant", "system") and "uuid" in entries[j])
        after = exam.repaired()
        [line] = [r for r in raw_lines(after) if json.loads(r).get("uuid") == entries[i]["uuid"]]
        assert json.loads(line)["parentUuid"] in (entries[before]["uuid"], *[
            json.loads(r)["uuid"] for r in raw_lines(after) if is_answer(r)])  # or the answer repair put after it
        if entries[i]["parentUuid"] == entries[before]["uuid"]:
            assert _conversation(after) == whole
    assert relinked >= 3


def test_claude_a_removed_line_does_not_cut_the_conversation_off():
    """A middle line deleted (here each entry another is chained to): the entries chained
    to it are linked to the entry before them, repair answers what lost its result, and
    the resumed conversation still starts where it started."""
    path = os.path.join(CLAUDE, "healthy.jsonl")
    lines = raw_lines(load(path))
    fmt = foreign.get("claude-code")
    resumed = [json.loads(lines[j])["uuid"] for j in _chain(b"".join(lines))]
    parents = {json.loads(r).get("parentUuid") for r in lines}
    for i, raw in enumerate(lines):
        if json.loads(raw).get("uuid", "none") not in parents:
            continue
        data = b"".join(lines[:i] + lines[i + 1:])
        exam = check_repair(fmt, data, force=False)
        after = exam.repaired()
        uuids = [json.loads(raw_lines(after)[j])["uuid"] for j in _chain(after)]
        answers = {json.loads(r)["uuid"] for r in raw_lines(after) if is_answer(r)}
        assert set(uuids) - answers == set(resumed) - {json.loads(raw)["uuid"]}, i
        assert all("resume does not continue" in f.detail for f in foreign.examine(exam.repaired(), fmt).findings)


def test_claude_a_cut_link_off_the_resumed_conversation_is_reported_and_left():
    lines = raw_lines(load(os.path.join(CLAUDE, "healthy.jsonl")))
    fmt = foreign.get("claude-code")
    chain = _chain(b"".join(lines))
    [(i, gone, _)] = [c for c in _cut_links(lines) if c[0] not in chain][:1]
    data = b"".join(lines[:i] + [gone] + lines[i + 1:])
    exam = foreign.examine(data, fmt)
    assert exam.plan.empty and exam.status() == Status.CLEAN
    [finding] = exam.findings
    assert finding.kind == "broken-chain" and not finding.repairable and "branch" in finding.detail


def test_claude_an_orphan_result_between_a_call_and_its_result_is_kept_as_text_in_place():
    """An orphan result entry chained between an assistant entry and the entries holding
    its results: repair turns it into text, and the results after it still belong to
    the assistant entry (a second repair finds nothing; it used to find the call
    unanswered and its result an orphan, so `repair` refused its own plan)."""
    lines = raw_lines(load(os.path.join(CLAUDE, "healthy.jsonl")))
    result = json.loads(lines[8])
    assert result["message"]["content"][0]["tool_use_id"] == "toolu_01Deploy"
    orphan = dict(result, uuid="0000abcd-5a1c-4e7b-9d2f-0c6a3b8e1f99")
    orphan["message"] = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_ZZ",
                                                      "content": "from nowhere"}]}
    lines[8] = lines[8].replace(result["parentUuid"].encode(), orphan["uuid"].encode())
    lines.insert(8, (json.dumps(orphan, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
    data = b"".join(lines)
    fmt = foreign.get("claude-code")
    exam = check_repair(fmt, data, force=False)
    assert [f.kind for f in exam.findings] == ["orphan-result"]
    [kept] = [json.loads(r) for r in raw_lines(exam.repaired()) if orphan["uuid"].encode() + b'","timestamp' in r]
    assert [b["type"] for b in kept["message"]["content"]] == ["text"] and "from nowhere" in json.dumps(kept)


def _entry(uuid, parent, kind="user", **extra):
    obj = {"parentUuid": parent, "isSidechain": False, "type": kind}
    obj["message"] = ({"role": "user", "content": f"u-{uuid}"} if kind == "user" else
                      {"id": f"msg-{uuid}", "role": "assistant", "content": [{"type": "text", "text": f"a-{uuid}"}]})
    obj.update(extra, uuid=uuid, timestamp="2026-11-30T09:00:00.000Z", sessionId="s")
    return json.dumps(obj).encode()


def test_claude_relink_cases_that_must_stay_sound():
    """Shapes a review found (each ended badly in the first version of the relink): a cut
    whose nearest entry's lost parent leads back into the conversation below (examine
    never returned), a compact_boundary whose parentUuid key is damaged (it was linked to
    the history before the compaction), and a cut under an entry that has tool progress
    chained to it (the progress made it look taken, so an abandoned branch was used)."""
    fmt = foreign.get("claude-code")
    torn = b'{"parentUuid":"x","isSidechain":false,"type":"user","uuid":"lost","message":{"role":"user","con'
    looping = [_entry("u1", None), _entry("a1", "u1", "assistant"), torn + _entry("c", "lost"),
               _entry("r", "never-written", "assistant"), _entry("x", "r"), _entry("z", "x", "assistant")]
    exam = check_repair(fmt, b"\n".join(looping) + b"\n", force=False)
    assert "relinked" not in [f.kind for f in exam.findings]

    lines = raw_lines(load(os.path.join(CLAUDE, "healthy.jsonl")))
    [at] = [i for i, r in enumerate(lines) if b'"compact_boundary"' in r]
    lines[at] = lines[at].replace(b'"parentUuid"', b'"parentUuie"', 1)
    exam = check_repair(fmt, b"".join(lines), force=False)
    assert "relinked" not in [f.kind for f in exam.findings]
    assert _conversation(exam.repaired())[0]["content"].startswith("This session is being continued")

    progress = json.dumps({"parentUuid": "ask", "isSidechain": False, "type": "progress", "uuid": "p1",
                           "toolUseID": "t", "timestamp": "2026-11-30T09:00:00.000Z", "sessionId": "s"}).encode()
    rewound = [_entry("u1", None), _entry("old", "u1"), _entry("old-a", "old", "assistant"), _entry("ask", "u1"),
               progress, _entry("after", "gone-result", "assistant")]
    exam = check_repair(fmt, b"\n".join(rewound) + b"\n", force=False)
    [finding] = [f for f in exam.findings if f.kind == "relinked"]
    assert finding.line == 6 and "line 4" in finding.detail
    texts = [b["text"] for m in fmt.native_items(split_lines(exam.repaired())) for b in m["content"]]
    assert texts == ["u-u1", "u-ask", "a-after"]  # not the abandoned "old" branch


def _claude_entry(n: int, parent: int | None, kind: str, message: dict) -> bytes:
    def uid(k: int) -> str:
        return f"00000000-0000-4000-8000-0000000000{k:02d}"

    return json.dumps({"parentUuid": None if parent is None else uid(parent), "isSidechain": False, "type": kind,
                       "message": message, "uuid": uid(n), "sessionId": "s",
                       "timestamp": f"2026-11-30T09:00:{n:02d}.000Z"}).encode() + b"\n"


def _use(call: str) -> dict:
    return {"role": "assistant", "id": "msg_M", "type": "message", "model": "claude",
            "content": [{"type": "tool_use", "id": call, "name": "Bash", "input": {"command": call}}]}


def _result(call: str) -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": f"ran {call}"}]}


@pytest.mark.parametrize("result_a", [True, False], ids=["a-answered-off-chain", "a-unanswered"])
def test_claude_a_branch_that_leaves_a_response_half_way_pairs_what_it_resumes(result_a):
    """A rewind to the middle of a response: the resumed chain holds its first tool_use
    entry only, the response's other entry and the results are on the abandoned branch.
    The view holds the calls of the chain's entries and their answers, nothing for the
    call the chain does not hold; scan, repair and the view agree."""
    fmt = foreign.get("claude-code")
    data = b"".join([
        _claude_entry(1, None, "user", {"role": "user", "content": "do two things"}),
        _claude_entry(2, 1, "assistant", _use("toolu_A")),
        _claude_entry(3, 2, "assistant", _use("toolu_B")),
        *([_claude_entry(4, 3, "user", _result("toolu_A"))] if result_a else []),
        _claude_entry(5, 4 if result_a else 3, "user", _result("toolu_B")),
        _claude_entry(6, 2, "user", {"role": "user", "content": "actually, something else"}),
        _claude_entry(7, 6, "assistant", {"role": "assistant", "id": "msg_N", "type": "message", "model": "claude",
                                          "content": [{"type": "text", "text": "ok"}]}),
    ])
    exam = foreign.examine(data, fmt)
    assert exam.analysis.unanswered == ([] if result_a else ["toolu_A"]) and exam.analysis.orphans == []
    after = check_repair(fmt, data).repaired()
    items = fmt.native_items(split_lines(after))
    assert check_pairing(items, "anthropic") is None
    asked = [b["id"] for m in items if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    answered = [b["tool_use_id"] for m in items if m["role"] == "user" for b in m["content"]
                if b["type"] == "tool_result"]
    assert asked == answered == ["toolu_A"]


CODEX_CALLS = {
    "function_call": {"type": "function_call", "name": "shell", "arguments": "{\"command\":[\"ls\"]}",
                      "call_id": "c_1"},
    "local_shell_call": {"type": "local_shell_call", "call_id": "c_1", "status": "in_progress",
                         "action": {"type": "exec", "command": ["ls"]}},
    "custom_tool_call": {"type": "custom_tool_call", "status": "completed", "call_id": "c_1", "name": "apply_patch",
                         "input": "*** Begin Patch\n*** End Patch\n"},
    "tool_search_call": {"type": "tool_search_call", "call_id": "c_1", "execution": "client",
                         "arguments": {"query": "deploy"}},
}


@pytest.mark.parametrize("started", [False, True], ids=["not-started", "started"])
@pytest.mark.parametrize("kind", sorted(CODEX_CALLS))
def test_codex_every_call_type_is_answered_with_its_recovery_code(kind, started):
    """Every call type Codex pairs gets an answer that carries its code: the output text
    opens with it; a tool_search_output, which has no text, is "incomplete" (not a search
    that ran and found nothing), loads no tools, and keeps the code and text in
    sessionlog_recovery; read back, each is sessionlog's own error result with its code."""
    from sessionlog.foreign.codex import ANSWER

    data = load(os.path.join(CODEX, "healthy.jsonl"))
    stamp = '{"timestamp":"2026-11-30T10:01:00.000Z",'
    cut = data + (stamp + '"type":"response_item","payload":' + json.dumps(CODEX_CALLS[kind]) + "}\n").encode()
    if started:
        cut += (stamp + '"type":"event_msg","payload":{"type":"exec_command_begin","call_id":"c_1"}}\n').encode()
    code = "TOOL_OUTCOME_UNKNOWN" if started else "TOOL_NOT_STARTED"
    fmt = foreign.get("codex")
    exam = foreign.examine(cut, fmt)
    [new] = entries(exam.repaired()[len(cut):])
    payload = new["payload"]
    assert payload["type"] == ANSWER[kind] and payload["call_id"] == "c_1"
    if kind == "tool_search_call":
        assert (payload["status"], payload["execution"], payload["tools"]) == ("incomplete", "client", [])
        assert payload["sessionlog_recovery"]["code"] == code
        text = payload["sessionlog_recovery"]["text"]
        assert "output" not in payload
    else:
        text = payload["output"]
    assert text.startswith(f"{code}: the call to tool ")
    assert [(a["call_id"], a["code"]) for a in exam.plan.added] == [("c_1", code)]
    [result] = [e for e in fmt.events(split_lines(exam.repaired())) if e["type"] == "tool/result"
                and e["call_id"] == "c_1"]
    assert (result["code"], result["is_error"], result["synthetic"]) == (code, True, True)
    assert result["output"] == text


@pytest.mark.parametrize("kind", sorted(CODEX_CALLS))
def test_codex_every_call_has_json_arguments_in_every_view(kind):
    """A custom_tool_call's input is free text (an apply_patch patch), not JSON: its
    arguments are {"input": <text>} in the imported records, so the OpenAI views carry a
    JSON arguments string and Anthropic's tool_use an input object, as for any call."""
    data = load(os.path.join(CODEX, "healthy.jsonl"))
    call = CODEX_CALLS[kind]
    data += ('{"timestamp":"2026-11-30T10:01:00.000Z","type":"response_item","payload":'
             + json.dumps(call) + "}\n").encode()
    fmt = foreign.get("codex")
    lines = foreign.examine(data, fmt).repaired_lines()
    [asked] = [c for e in fmt.events(lines) if e["type"] == "assistant/message" for c in e["tool_calls"]
               if c["id"] == "c_1"]
    expected = {"input": call["input"]} if kind == "custom_tool_call" else \
        json.loads(call["arguments"]) if kind == "function_call" else call.get("arguments", call.get("action"))
    got = json.loads(asked["arguments"]) if isinstance(asked["arguments"], str) else asked["arguments"]
    assert got == expected
    openai = project(fmt.events(lines), "openai").items
    [function] = [c["function"] for m in openai for c in m.get("tool_calls") or () if c["id"] == "c_1"]
    assert json.loads(function["arguments"]) == expected
    responses = project(fmt.events(lines), "responses").items
    [item] = [i for i in responses if i.get("type") == "function_call" and i["call_id"] == "c_1"]
    assert json.loads(item["arguments"]) == expected
    anthropic = project(fmt.events(lines), "anthropic").items
    [use] = [b for m in anthropic if isinstance(m["content"], list) for b in m["content"]
             if b.get("type") == "tool_use" and b["id"] == "c_1"]
    assert use["input"] == expected
    [native] = [i for i in fmt.native_items(lines) if i.get("call_id") == "c_1" and i["type"] == "function_call"]
    assert json.loads(native["arguments"]) == expected


# --- Claude Code: results entries joined into one user message ------------------------------

def _cc(n: int, parent: int | None, kind: str, content: list | str, *, mid: str = "msg_M") -> bytes:
    """Entry ``n`` of a compact Claude Code transcript, chained to entry ``parent``."""
    def uid(k: int) -> str:
        return f"00000000-0000-4000-8000-0000000000{k:02d}"

    if kind == "assistant":
        message = {"id": mid, "type": "message", "role": "assistant", "model": "claude", "content": content}
    else:
        message = {"role": "user", "content": content}
    obj = {"parentUuid": None if parent is None else uid(parent), "isSidechain": False, "type": kind}
    if kind == "progress":
        obj.update(toolUseID="toolu_B", data={"type": "bash_progress"})
    else:
        obj["message"] = message
    obj.update(uuid=uid(n), sessionId="s", timestamp=f"2026-11-30T09:00:{n:02d}.000Z")
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _uses(*calls: str) -> list:
    return [{"type": "tool_use", "id": c, "name": "Bash", "input": {"command": c}} for c in calls]


def _tr(call: str) -> dict:
    return {"type": "tool_result", "tool_use_id": call, "content": f"ran {call}"}


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


INTERRUPTED_TEXT = "[Request interrupted by user for tool use]"
# The results of one assistant message asking for toolu_A, toolu_B and toolu_C (entry 2),
# as entries (number, parent, content), followed by a user prompt and an answer.
RESULT_SHAPES = {
    "text-then-a-later-entry": [(3, 2, [_tr("toolu_A"), _text(INTERRUPTED_TEXT)]), (4, 3, [_tr("toolu_B"), _tr("toolu_C")])],
    "text-then-two-later-entries": [(3, 2, [_tr("toolu_A"), _text(INTERRUPTED_TEXT)]), (4, 3, [_tr("toolu_B")]),
                                    (5, 4, [_tr("toolu_C")])],
    "text-first-in-its-entry": [(3, 2, [_text("look"), _tr("toolu_A")]), (4, 3, [_tr("toolu_B"), _tr("toolu_C")])],
    "text-first-in-the-only-entry": [(3, 2, [_text("look"), _tr("toolu_A"), _tr("toolu_B"), _tr("toolu_C")])],
    "two-entries-with-text": [(3, 2, [_tr("toolu_A"), _text("one")]), (4, 3, [_tr("toolu_B"), _text("two")]),
                              (5, 4, [_tr("toolu_C")])],
    "text-then-a-sibling-entry": [(3, 2, [_tr("toolu_A"), _text(INTERRUPTED_TEXT)]), (4, 2, [_tr("toolu_B"), _tr("toolu_C")])],
    "text-then-progress-then-results": [(3, 2, [_tr("toolu_A"), _text(INTERRUPTED_TEXT)]), (4, 3, "progress"),
                                        (5, 4, [_tr("toolu_B"), _tr("toolu_C")])],
    "text-then-a-later-entry-and-a-call-unanswered": [(3, 2, [_tr("toolu_A"), _text(INTERRUPTED_TEXT)]),
                                                      (4, 3, [_tr("toolu_B")])],
    "an-orphan-between-results": [(3, 2, [_tr("toolu_A")]), (4, 3, [_tr("toolu_Z")]),
                                  (5, 4, [_tr("toolu_B"), _tr("toolu_C")])],
    "a-duplicate-between-results": [(3, 2, [_tr("toolu_A")]), (4, 3, [_tr("toolu_A")]),
                                    (5, 4, [_tr("toolu_B"), _tr("toolu_C")])],
    "results-first-then-text": [(3, 2, [_tr("toolu_A")]), (4, 3, [_tr("toolu_B"), _tr("toolu_C"), _text("and this")])],
}


def results_shape(shape: list) -> bytes:
    entries = [_cc(1, None, "user", "run three things"), _cc(2, 1, "assistant", _uses("toolu_A", "toolu_B", "toolu_C"))]
    for n, parent, content in shape:
        entries.append(_cc(n, parent, "progress", []) if content == "progress" else _cc(n, parent, "user", content))
    last = max(n for n, _, _ in shape)
    tail = max(n for n, _, content in shape if content != "progress")
    entries.append(_cc(last + 1, tail, "user", "next"))
    entries.append(_cc(last + 2, last + 1, "assistant", [_text("done")], mid="msg_N"))
    return b"".join(entries)


@pytest.mark.parametrize("name", sorted(RESULT_SHAPES))
def test_claude_scan_repair_and_the_native_check_agree_on_results_split_over_entries(name):
    """The results of one assistant message spread over several entries, some holding
    text: what Claude Code joins into one user message (in tree order) passes the
    pairing check exactly when scan calls the file clean; repair leaves every
    tool_result first, every text block kept (once), and a file a second repair leaves
    alone."""
    fmt = foreign.get("claude-code")
    data = results_shape(RESULT_SHAPES[name])
    exam = foreign.examine(data, fmt)
    as_is = check_pairing(fmt.native_items(exam.lines), "anthropic")
    assert (as_is is None) == exam.plan.empty, (as_is, [f.detail for f in exam.findings])
    after = check_repair(fmt, data, force=False).repaired()
    items = fmt.native_items(split_lines(after))
    assert check_pairing(items, "anthropic") is None
    [results] = [m["content"] for m in items if m["role"] == "user" and m["content"][0].get("type") == "tool_result"]
    kinds = [b["type"] for b in results]
    assert kinds == sorted(kinds, key=lambda k: k != "tool_result")  # every tool_result first
    texts = [b["text"] for b in results if b["type"] == "text"]
    written = [b["text"] for _, _, content in RESULT_SHAPES[name] if content != "progress"
               for b in content if b["type"] == "text"]
    # The user prompt after the results joins the same user message, after them.
    assert [t for t in texts if not t.startswith("[sessionlog repair:")] == written + ["next"]
    for view in FORMATS:
        assert check_pairing(project(fmt.events(split_lines(after)), view).items, view) is None


def test_claude_results_with_text_answering_different_messages_are_clean():
    """[tool_result, text] answering one assistant message and [tool_result] answering a
    later one are two user messages: nothing to repair, and the check agrees."""
    fmt = foreign.get("claude-code")
    data = b"".join([
        _cc(1, None, "user", "go"), _cc(2, 1, "assistant", _uses("toolu_A")),
        _cc(3, 2, "user", [_tr("toolu_A"), _text("and also check this")]),
        _cc(4, 3, "assistant", _uses("toolu_B"), mid="msg_N"), _cc(5, 4, "user", [_tr("toolu_B")]),
    ])
    exam = foreign.examine(data, fmt)
    assert exam.plan.empty and exam.findings == []
    assert check_pairing(fmt.native_items(exam.lines), "anthropic") is None


def test_codex_a_call_repeated_in_a_compacted_history_is_removed_from_it():
    """A compacted line whose replacement history holds a call twice (and one output):
    Codex would send the call twice, which the API rejects. Scan used to call the file
    clean while show --check rejected it; now the repeat is found and removed from that
    history, and the one output answers the one call."""
    lines = raw_lines(load(os.path.join(CODEX, "healthy.jsonl")))
    [at] = [i for i, r in enumerate(lines) if b'"type":"compacted"' in r]
    compacted = json.loads(lines[at])
    call = {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "call_Z9"}
    compacted["payload"]["replacement_history"] += [call, dict(call),
                                                    {"type": "function_call_output", "call_id": "call_Z9", "output": "ok"}]
    lines[at] = json.dumps(compacted, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    data = b"".join(lines)
    fmt = foreign.get("codex")
    exam = check_repair(fmt, data, force=False)
    [finding] = exam.findings
    assert (finding.kind, finding.line, finding.call_id) == ("duplicate-call", at + 1, "call_Z9")
    assert "in the compacted history repeats the call" in finding.detail
    history = json.loads(raw_lines(exam.repaired())[at])["payload"]["replacement_history"]
    assert [i.get("call_id") for i in history if i.get("call_id") == "call_Z9"] == ["call_Z9", "call_Z9"]  # call, output
    assert check_pairing(fmt.native_items(split_lines(exam.repaired())), "responses") is None


# --- Claude Code: sibling branches of results ---------------------------------------------


def _show_check(fmt: foreign.ForeignFormat, lines) -> str | None:
    """What ``show --check`` says of ``lines`` (the repaired view, so the file as repair
    leaves it): the first violation over every view format and the tool's own
    conversation, or None."""
    for view in FORMATS:
        violation = check_pairing(project(fmt.events(lines), view).items, view)
        if violation is not None:
            return f"{view}: {violation.message}"
    violation = check_pairing(fmt.native_items(lines), fmt.native_view)
    return None if violation is None else f"native: {violation.message}"


def check_scan_repair_and_show_agree(data: bytes) -> foreign.Examination:
    """Scan calls the file clean only when the conversation show builds from it passes
    the check in every format; after repair, scan is clean and show --check passes; a
    second repair changes no byte."""
    fmt = foreign.get("claude-code")
    exam = foreign.examine(data, fmt)
    if exam.status() is Status.CLEAN:
        assert _show_check(fmt, exam.lines) is None
    assert exam.status() in (Status.CLEAN, Status.REPAIRABLE), [f.detail for f in exam.findings]
    check_repair(fmt, data, force=False)
    after = exam.repaired()
    again = foreign.examine(after, fmt)
    assert again.status() is Status.CLEAN, [f.detail for f in again.findings]
    assert _show_check(fmt, again.lines) is None
    assert again.repaired() == after
    return exam


def test_claude_a_sibling_repeating_a_result_on_the_resumed_branch_leaves_a_call_to_answer():
    """Entry 3 answers toolu_A and toolu_B; entry 4, its sibling (also below the
    assistant entry), repeats toolu_A's result, and the conversation goes on from entry 4.
    Claude Code resumes 1-2-4-5-6: entry 3 is on a branch it leaves, and joining it would
    repeat toolu_A, so toolu_B has no result there. Scan used to call the file clean (each
    branch pairs on its own) while show --check rejected it; now scan finds toolu_B
    unanswered on the resumed branch and repair answers it there, TOOL_OUTCOME_UNKNOWN
    (line 3 shows it ran), after entry 4, entry 5 re-parented to the answer."""
    fmt = foreign.get("claude-code")
    data = b"".join([
        _cc(1, None, "user", "go"),
        _cc(2, 1, "assistant", _uses("toolu_A", "toolu_B")),
        _cc(3, 2, "user", [_tr("toolu_A"), _tr("toolu_B")]),
        _cc(4, 2, "user", [_tr("toolu_A")]),
        _cc(5, 4, "user", "next"),
        _cc(6, 5, "assistant", [_text("done")], mid="msg_N"),
    ])
    assert _show_check(fmt, split_lines(data)) is not None  # the conversation Claude Code resumes
    exam = check_scan_repair_and_show_agree(data)
    assert exam.status() is Status.REPAIRABLE
    [finding] = exam.findings
    assert (finding.kind, finding.line, finding.call_id, finding.code) == (
        "unanswered-call", 2, "toolu_B", "TOOL_OUTCOME_UNKNOWN")
    assert "line 3" in finding.detail
    after = entries(exam.repaired())
    assert [e["uuid"] for e in after[:4]] == [e["uuid"] for e in entries(data)[:4]]
    answer = after[4]
    assert answer["parentUuid"] == after[3]["uuid"] and after[5]["parentUuid"] == answer["uuid"]
    [block] = answer["message"]["content"]
    assert block["tool_use_id"] == "toolu_B" and block["content"].startswith("TOOL_OUTCOME_UNKNOWN: ")
    assert raw_lines(exam.repaired())[:4] == raw_lines(data)[:4]  # every other line byte for byte
    assert raw_lines(exam.repaired())[6:] == raw_lines(data)[5:]


SIBLING_CASES = {
    # The conversation goes on from a results entry (line 6) whose sibling (line 3) holds
    # the other answer and text: re-chaining them used to bring the branch below line 3
    # (line 4, 5) into the resumed conversation, repeating toolu_2A.
    "a-sibling-with-text-and-a-branch-below": [
        (2, 1, "assistant", _uses("toolu_2A", "toolu_2B")), (3, 2, "user", [_tr("toolu_2B"), _text("see"), _tr("toolu_Z")]),
        (4, 3, "user", [_tr("toolu_2A")]), (5, 4, "assistant", [_text("ok")]), (6, 2, "user", [_tr("toolu_2A")])],
    # An orphan on the resumed branch, the call's answer on a dead sibling: the answer for
    # toolu_2B went below the dead sibling, and the re-chain emptied line 4.
    "an-orphan-on-the-resumed-branch-and-an-answer-off-it": [
        (2, 1, "assistant", _uses("toolu_2A", "toolu_2B")), (3, 2, "user", [_tr("toolu_2A")]),
        (4, 2, "user", [_tr("toolu_Z")]), (5, 4, "user", [_tr("toolu_2A")])],
    # One response over three entries, the last two siblings (a fork inside the response):
    # one answer entry per branch, for the calls asked on its way.
    "a-response-split-by-a-fork": [
        (2, 1, "assistant", _uses("toolu_3A")), (3, 2, "assistant", _uses("toolu_4A")),
        (4, 2, "assistant", _uses("toolu_12A"))],
}


@pytest.mark.parametrize("name", sorted(SIBLING_CASES))
def test_claude_sibling_branches_scan_repair_and_show_agree(name):
    data = b"".join([_cc(1, None, "user", "go"), *(
        _cc(n, parent, kind, content, mid="msg_M" if kind == "assistant" and n != 5 else "msg_5")
        for n, parent, kind, content in SIBLING_CASES[name])])
    check_scan_repair_and_show_agree(data)


def test_claude_a_result_off_the_first_entry_of_a_forked_response_answers_only_the_calls_on_its_way():
    """Entries 2 and 3 are one response (message m2): entry 2 asks toolu_1, entry 3,
    chained below it, asks toolu_2; the results entry 4 hangs off entry 2 (a sibling of
    entry 3) and answers both. Claude Code resumes 1-2-4: the message it sends asks only
    toolu_1, so toolu_2's result there answers no call of it. Scan used to pair it with
    toolu_2 anyway (any entry of the response) while the resumed pass kept it as text:
    repair refused its own result and a second round answered toolu_2 TOOL_NOT_STARTED.
    Now the result is kept as text and toolu_2 is answered on its own branch (below entry
    3), TOOL_OUTCOME_UNKNOWN (line 4 holds its result); every other line byte for byte."""
    fmt = foreign.get("claude-code")
    data = b"".join([
        _cc(1, None, "user", "go"),
        _cc(2, 1, "assistant", _uses("toolu_1"), mid="m2"),
        _cc(3, 2, "assistant", _uses("toolu_2"), mid="m2"),
        _cc(4, 2, "user", [_tr("toolu_1"), _tr("toolu_2")]),
    ])
    exam = check_scan_repair_and_show_agree(data)
    assert exam.status() is Status.REPAIRABLE
    assert [(f.kind, f.line, f.call_id, f.code) for f in exam.findings] == [
        ("unanswered-call", 3, "toolu_2", "TOOL_OUTCOME_UNKNOWN"), ("orphan-result", 4, "toolu_2", None)]
    after = entries(exam.repaired())
    assert [e["uuid"] for e in after[:3]] + [after[4]["uuid"]] == [e["uuid"] for e in entries(data)]
    answer = after[3]
    assert answer["parentUuid"] == after[2]["uuid"]  # below entry 3, off the resumed chain
    [block] = answer["message"]["content"]
    assert block["tool_use_id"] == "toolu_2" and block["content"].startswith("TOOL_OUTCOME_UNKNOWN: ")
    assert after[4]["message"]["content"][0] == json.loads(raw_lines(data)[3])["message"]["content"][0]
    assert after[4]["message"]["content"][1]["type"] == "text"  # toolu_2's result, kept as text
    assert raw_lines(exam.repaired())[:3] == raw_lines(data)[:3]


FORKED_RESPONSE_CASES = {
    # the results entry below entry 3: 1-2-3-4 resumes both calls, answered; clean
    "results-below-the-second-entry": ([(2, 1, _uses("toolu_1")), (3, 2, _uses("toolu_2"))],
                                       [(4, 3, "user", [_tr("toolu_1"), _tr("toolu_2")])], Status.CLEAN),
    "three-entries-results-below-the-first": (
        [(2, 1, _uses("toolu_1")), (3, 2, _uses("toolu_2")), (4, 3, _uses("toolu_3"))],
        [(5, 2, "user", [_tr("toolu_1"), _tr("toolu_2"), _tr("toolu_3")])], Status.REPAIRABLE),
    "three-entries-results-below-the-second": (
        [(2, 1, _uses("toolu_1")), (3, 2, _uses("toolu_2")), (4, 3, _uses("toolu_3"))],
        [(5, 3, "user", [_tr("toolu_1"), _tr("toolu_2"), _tr("toolu_3")])], Status.REPAIRABLE),
    # the conversation goes on from entry 3: resume sends 2+3 and joins entry 4 (a result
    # that branched off the response) to it; valid as it is, so clean and left alone
    "continued-from-the-second-entry": (
        [(2, 1, _uses("toolu_1")), (3, 2, _uses("toolu_2"))],
        [(4, 2, "user", [_tr("toolu_1"), _tr("toolu_2")]), (5, 3, "user", "next"), (6, 5, "assistant", [_text("ok")])],
        Status.CLEAN),
    # the conversation goes on from the results entry: as in the case above the table
    "continued-from-the-results": (
        [(2, 1, _uses("toolu_1")), (3, 2, _uses("toolu_2"))],
        [(4, 2, "user", [_tr("toolu_1"), _tr("toolu_2")]), (5, 4, "user", "next"), (6, 5, "assistant", [_text("ok")])],
        Status.REPAIRABLE),
    # an answer repair adds below entry 4 for entry 4's calls must stay below it when the
    # results message of the resumed branch (1-2-5-6) is re-chained to put results first
    "an-answer-below-the-second-entry-is-not-moved-up": (
        [(2, 1, _uses("toolu_1", "toolu_2")), (4, 2, _uses("toolu_3", "toolu_4"))],
        [(3, 2, "user", [_tr("toolu_Z"), _tr("toolu_1"), _text("note")]), (5, 2, "assistant", [_text("t")]),
         (6, 5, "user", [_tr("toolu_2"), _tr("toolu_Z"), _text("note")])], Status.REPAIRABLE),
}


@pytest.mark.parametrize("name", sorted(FORKED_RESPONSE_CASES))
def test_claude_a_forked_response_scan_repair_and_show_agree(name):
    """Variants of the case above: scan is clean exactly when the resumed conversation
    passes show --check as it is, repair leaves a clean file, and a second repair changes
    nothing."""
    fmt = foreign.get("claude-code")
    response, rest, status = FORKED_RESPONSE_CASES[name]
    data = b"".join([_cc(1, None, "user", "go"), *(_cc(*entry[:4], mid=entry[4]) for entry in sorted(
        [(n, p, "assistant", c, "m2") for n, p, c in response] + [(n, p, kind, c, f"m{n}") for n, p, kind, c in rest]))])
    assert (_show_check(fmt, split_lines(data)) is None) is (status is Status.CLEAN)
    exam = check_scan_repair_and_show_agree(data)
    assert exam.status() is status, [f.detail for f in exam.findings]
    if status is Status.CLEAN:
        assert exam.repaired() == data


@pytest.mark.parametrize("between", ["a-user-text", "a-later-response"])
def test_claude_a_call_whose_result_the_file_holds_elsewhere_is_never_called_not_started(between):
    """toolu_A's result is in the file, on the resumed chain, but after a user's text entry
    (or below a later response): kept as text there, it still shows the call ran, so the
    answer repair gives toolu_A is TOOL_OUTCOME_UNKNOWN naming that line, never
    TOOL_NOT_STARTED."""
    middle = (_cc(3, 2, "user", "hello") if between == "a-user-text"
              else _cc(3, 2, "assistant", [_text("x")], mid="msg_2"))
    data = b"".join([_cc(1, None, "user", "go"), _cc(2, 1, "assistant", _uses("toolu_A"), mid="msg_1"), middle,
                     _cc(4, 3, "user", [_tr("toolu_A")]), _cc(5, 4, "assistant", [_text("ok")], mid="msg_3")])
    exam = check_scan_repair_and_show_agree(data)
    [call] = [f for f in exam.findings if f.kind == "unanswered-call"]
    assert (call.call_id, call.code) == ("toolu_A", "TOOL_OUTCOME_UNKNOWN") and "line 4" in call.detail
    answers = [b["content"] for e in entries(exam.repaired()) for b in e["message"]["content"]
               if e["type"] == "user" and isinstance(b, dict) and b.get("type") == "tool_result"]
    assert answers and not any(a.startswith("TOOL_NOT_STARTED") for a in answers)


def test_claude_a_tool_use_id_reused_by_a_later_response_is_reported_and_refused():
    """toolu_A is used by two responses of the resumed conversation, each answered: the API
    rejects the repeated id, so show --check fails on the file. Scan used to call it clean
    and repair changed nothing; now scan reports it (reused-call-id, not repairable) and
    repair refuses the file, saying why."""
    fmt = foreign.get("claude-code")
    data = b"".join([_cc(1, None, "user", "go"), _cc(2, 1, "assistant", _uses("toolu_A"), mid="msg_1"),
                     _cc(3, 2, "user", [_tr("toolu_A")]), _cc(4, 3, "assistant", _uses("toolu_A"), mid="msg_2"),
                     _cc(5, 4, "user", [_tr("toolu_A")]), _cc(6, 5, "assistant", [_text("ok")], mid="msg_3")])
    exam = foreign.examine(data, fmt)
    assert _show_check(fmt, exam.lines) is not None
    assert exam.status() is not Status.CLEAN
    [finding] = exam.findings
    assert (finding.kind, finding.line, finding.call_id, finding.repairable) == ("reused-call-id", 4, "toolu_A", False)
    assert exam.in_place_refusal is not None and "toolu_A" in exam.in_place_refusal
