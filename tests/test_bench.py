"""The benchmark harness: a smoke run end to end (JSON keys, positive figures, cleanup),
the transcript generator, interleaved rounds and target verdicts. No timed assertions:
figures are checked for presence and sign, never for speed."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from sessionlog.bench import main, transcript
from sessionlog.bench.memory import write_log
from sessionlog.bench.rounds import Case, Result, run_interleaved
from sessionlog.bench.scans import make_corpus
from sessionlog.bench.targets import Target, evaluate

import sessionlog
from sessionlog import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _positive(row: dict[str, Any], key: str = "median") -> None:
    assert isinstance(row[key], (int, float)) and row[key] > 0, row


def _check_document(doc: dict[str, Any]) -> None:
    for key in ("schema", "command", "started", "seconds", "machine", "config", "backends", "results",
                "memory", "targets"):
        assert key in doc
    machine = doc["machine"]
    assert machine["nproc"] >= 1 and machine["cpu_model"] and machine["kernel"] and machine["fs_type"]
    results = doc["results"]
    for per_sync in (1, 64, 1024):
        _positive(results[f"ceiling/sync-{per_sync}"])
        _positive(results[f"ceiling/sync-{per_sync}"], "mb_per_s")
    for batch in ("batch-1", "batch-64", "batch-1024", "oneshot-1", "sessions-100"):
        _positive(results[f"append/jsonl/{batch}"])
    for rid in ("scan/jsonl", "scan/msgspec-baseline", "repair/jsonl", "peer/sqlite3/commit-1",
                "peer/sqlite3/tail-commit-1", "peer/sqlite3/executemany-1024"):
        _positive(results[rid])
        _positive(results[rid], "mb_per_s")
    for name, backend in doc["backends"].items():
        # Every backend open_store knows is either measured or skipped with a reason.
        assert backend["status"] in ("measured", "skipped")
        if backend["status"] == "skipped":
            assert backend["reason"]
        else:
            _positive(results[f"append/{name}/batch-1"])
            _positive(results[f"scan/{name}"])
            if name in ("sqlite", "postgresql"):  # group commit across sessions
                _positive(results[f"append/{name}/group-100"])
    if doc["backends"].get("zstd", {}).get("status") == "measured":
        for per in (1, 8, 64, 1024):
            _positive(results[f"compression/zstd/frame-{per}"])
        _positive(results["compression/zstd/stored-64"])
    for rid, row in results.items():
        assert row["status"] in ("ok", "skipped", "error"), rid
        if row["status"] == "ok":
            _positive(row)
            assert all(r > 0 for r in row["rounds"]), rid
        else:
            assert row["reason"], rid
    assert len({t["id"] for t in doc["targets"]}) == len(doc["targets"])
    for target in doc["targets"]:
        assert target["verdict"] in ("PASS", "MISS", "SKIP", "INFO"), target
        if target["verdict"] in ("PASS", "MISS"):
            assert target["ratio"] is not None and target["ratio"] >= 0
    ids = {t["id"] for t in doc["targets"]}
    assert {"jsonl-append-1", "jsonl-append-64", "jsonl-append-1024", "jsonl-scan", "scan-memory",
            "show-memory"} <= ids
    # The absolute µs-per-event encode bars come with msgspec's own encoding of the same
    # events on the same CPU: the encoder's overhead as a ratio any machine can read.
    by_id = {t["id"]: t for t in doc["targets"]}
    for what in ("flat", "transcript"):
        _positive(results[f"encode/msgspec-{what}"])
        floor = by_id[f"encode-{what}-floor"]
        assert floor["verdict"] == "INFO" and 0 < floor["ratio"] == pytest.approx(
            results[f"encode/{what}"]["median"] / results[f"encode/msgspec-{what}"]["median"])
    # Every Zstd frame shape is scanned (its op checks what the scan found) and read
    # against 64-record frames.
    from sessionlog.bench.scans import ZSTD_SHAPES

    for shape in ZSTD_SHAPES:
        _positive(results[f"zstd-shape/{shape}"])
        if shape != "frames-64":
            assert by_id[f"zstd-shape-{shape}"]["verdict"] in ("PASS", "MISS")
    memory = doc["memory"]
    assert memory["exit_code"] == 0 and memory["status"] == "clean"
    assert memory["scanned_records"] == memory["log_records"] > 1
    assert memory["peak_rss_bytes"] > 0 and memory["baseline_rss_bytes"] > 0
    assert memory["show"]["exit_code"] == 0 and memory["show"]["peak_rss_bytes"] > 0


def test_smoke_run_through_the_cli_prints_the_document_and_cleans_up(tmp_path, capsys) -> None:
    # "--" keeps the sessionlog parser from reading bench's options as its own.
    code = cli.main(["bench", "--", "--smoke", "--json", "--quiet", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    _check_document(doc)
    assert doc["config"]["smoke"] is True
    assert os.listdir(tmp_path) == []  # every bench file was removed


def test_python_dash_m_benchmarks_from_the_repository_root(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--backends", "jsonl", "--no-peers",
         "--memory-mb", "0", "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "raw write+fdatasync, 1 per sync" in proc.stdout  # the table for people
    assert "Targets" in proc.stdout and ("PASS" in proc.stdout or "MISS" in proc.stdout)
    assert os.listdir(tmp_path) == []


def test_markdown_and_plot(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    png, md = tmp_path / "out" / "plot.png", tmp_path / "out" / "RESULTS.md"
    png.parent.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    code = main(["--smoke", "--quiet", "--backends", "jsonl", "--memory-mb", "0", "--dir", str(work),
                 "--plot", str(png), "--markdown", str(md)])
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert "| jsonl: session handle, batch 1 |" in text and "![" in text and "(plot.png)" in text
    assert "Targets" in text


def test_plot_without_matplotlib_is_a_clear_usage_error(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code = main(["--smoke", "--plot", str(tmp_path / "x.png"), "--dir", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "sessionlog[plot]" in err
    assert os.listdir(tmp_path) == []  # refused before measuring anything


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--backends", "oracle"], ["--backends", "postgresql"],
                                  ["--seconds", "-1"], ["--dir", "/nonexistent/dir"]])
def test_usage_errors_exit_2(argv: list[str], capsys) -> None:
    assert main(argv) == 2


# --- the transcript generator ---------------------------------------------------------


def test_transcript_is_deterministic_given_a_seed() -> None:
    first = list(itertools.islice(transcript.events(5), 500))
    assert first == list(itertools.islice(transcript.events(5), 500))
    assert first != list(itertools.islice(transcript.events(6), 500))


def test_transcript_is_a_valid_session_that_scans_clean(tmp_path) -> None:
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    corpus = make_corpus(3_000, 0)
    records = list(corpus.records("gen"))
    store.import_session("gen", iter(records))
    result = store.scan("gen")
    assert result.record_count == len(records) and result.status == "clean"
    types = [r.type for r in records]
    for kind in ("turn/start", "user/message", "step/start", "assistant/message", "tool/call", "tool/result",
                 "step/end", "turn/end"):
        assert kind in types
    # Every call the assistant asked for has exactly one durable tool/call and one result.
    asked = [c["id"] for r in records if r.type == "assistant/message" for c in r["tool_calls"]]
    called = [r["call_id"] for r in records if r.type == "tool/call"]
    answered = [r["call_id"] for r in records if r.type == "tool/result"]
    assert sorted(asked) == sorted(called) == sorted(answered) and len(set(asked)) == len(asked)
    for r in records:
        if r.type == "assistant/message":
            assert all(isinstance(c["arguments"], dict) for c in r["tool_calls"])
    sizes = sorted(len(r["output"]) for r in records if r.type == "tool/result")
    assert sizes[0] < 200 and sizes[-1] > 4000  # outputs of varied size


def test_small_events_match_the_ceiling_record_size() -> None:
    from sessionlog.events import encode_record

    lines = [encode_record(e, 1_000_000 + i, 1_760_000_000.123456) for i, e in
             enumerate(transcript.small_events(30))]
    assert all(280 <= len(line) <= 320 for line in lines)


def test_large_log_writer_makes_a_clean_session_of_at_least_the_size(tmp_path) -> None:
    corpus = make_corpus(500, 0)
    path = tmp_path / "big.jsonl"
    records, nbytes = write_log(str(path), corpus, 300_000)
    assert nbytes == path.stat().st_size >= 300_000
    store = sessionlog.open_store(f"jsonl:{tmp_path}")
    result = store.scan("big")
    assert result.record_count == records > corpus.count() and result.status == "clean"


# --- rounds and targets ---------------------------------------------------------------


def test_interleaved_rounds_run_every_case_once_per_round_and_survive_a_failing_case() -> None:
    calls: list[str] = []

    def op(name: str):
        def run() -> tuple[int, int]:
            calls.append(name)
            if name == "broken" and calls.count("broken") == 2:
                raise RuntimeError("backend under construction")
            return 10, 1000

        return run

    cases = [Case(n, "append", n, op(n), timed=False) for n in ("a", "b", "broken")]
    results = run_interleaved(cases, rounds=3, budget=0.0)
    assert calls == ["a", "b", "broken", "a", "b", "broken", "a", "b"]  # A B C A B C A B
    assert results["a"].status == "ok" and len(results["a"].rounds) == 3 and results["a"].median > 0
    assert results["broken"].status == "error" and "under construction" in results["broken"].reason


def test_target_verdicts() -> None:
    def ok(rid: str, median: float) -> Result:
        return Result(rid, "append", rid, "records/s", median=median)

    results = {
        "num": ok("num", 90.0), "den": ok("den", 100.0), "low": ok("low", 10.0),
        "gone": Result("gone", "append", "gone", "records/s", status="skipped", reason="not built yet"),
    }
    rows = evaluate([
        Target("pass", "", "num", "den", 0.9),
        Target("miss", "", "low", "den", 0.5),
        Target("info", "", "num", "den", None),
        Target("skip", "", "gone", "den", 10.0),
        Target("const", "", "num", None, 1.0, constant=100.0),
    ], results)
    verdicts = {r["id"]: (r["verdict"], r["ratio"]) for r in rows}
    assert verdicts["pass"] == ("PASS", pytest.approx(0.9))
    assert verdicts["miss"] == ("MISS", pytest.approx(0.1))
    assert verdicts["info"] == ("INFO", pytest.approx(0.9))
    assert verdicts["skip"][0] == "SKIP" and "not built yet" in rows[3]["reason"]
    assert verdicts["const"] == ("MISS", pytest.approx(0.9))
