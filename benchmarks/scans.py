"""Reading back: scan (what recovery runs first), repair of a torn log, Zstd ratio.

All three use one generated transcript (:mod:`.transcript`): at least ``scan_records``
records and at least ``repair_mb`` MB of JSONL, imported into each backend as one session
(``import_session``: its bytes verbatim; on Zstd appended 64 records per batch, one
frame per 64 records). Throughput counts records and logical (uncompressed JSONL) bytes.

* scan: ``store.scan(id)`` validates every record and tracks the transcript; the
  baseline is msgspec alone decoding the same JSONL file (``Decoder.decode_lines`` over
  1 MiB chunks), no validation, no engine.
* repair: the session's log with a torn last record (JSONL: a line cut before its
  newline; Zstd: a frame cut short) is repaired with ``store.repair(id)`` — scan,
  quarantine, truncate, append the marker, each step durable. Between rounds (untimed)
  the log is torn again and the quarantine file removed. SQL has no torn bytes.
* compression: on-disk size of the Zstd session (appended 64 records per batch, so one
  frame per 64 records) against its JSONL bytes, and the same records framed 1, 8, 64
  and 1024 per frame with the backend's own framing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgspec

from sessionlog.events import Record, encode_record, header_event

from .appends import Backend
from .rounds import Case, Result, Work, skipped
from .transcript import events

FRAME_SIZES = (1, 8, 64, 1024)
SEED = 7


@dataclass(slots=True)
class Corpus:
    """A generated session's records after its header (seq 2..N), encoded."""

    body: list[bytes]
    body_bytes: int

    def header(self, session_id: str) -> bytes:
        return encode_record(header_event(session_id), 1, 1_735_689_600.0)

    def records(self, session_id: str) -> Iterator[Record]:
        yield Record.from_line(self.header(session_id))
        for line in self.body:
            yield Record.from_line(line)

    def count(self) -> int:
        return len(self.body) + 1

    def logical_bytes(self, session_id: str) -> int:
        return self.body_bytes + len(self.header(session_id)) + 1


def make_corpus(min_records: int, min_bytes: int, seed: int = SEED) -> Corpus:
    """At least ``min_records`` records (header included) and ``min_bytes`` of JSONL, in
    whole turns."""
    body: list[bytes] = []
    total = 100  # about the header's line
    for seq, event in enumerate(events(seed), start=2):
        line = encode_record(event, seq)
        body.append(line)
        total += len(line) + 1
        if len(body) + 1 >= min_records and total >= min_bytes and event["type"] == "turn/end":
            break  # whole turns: the session scans clean
    return Corpus(body, sum(len(x) + 1 for x in body))


FRAME_RECORDS = 64
"""Records per Zstd frame in the scan and repair sessions (one frame per append batch)."""


def _load(backend: Backend, session_id: str, corpus: Corpus) -> tuple[str, int]:
    """Make the corpus a session of ``backend``; returns (session id, JSONL bytes).

    Zstd: appended through a session handle in batches of :data:`FRAME_RECORDS`, so the
    file holds exactly one frame per 64 records (``import_session`` may frame larger).
    Others: ``import_session`` of the records' bytes verbatim."""
    sid = backend.sid(session_id)
    store = backend.store
    if backend.name != "zstd":
        store.import_session(sid, corpus.records(sid))
        return sid, corpus.logical_bytes(sid)
    store.create(sid)
    events = [Record.from_line(line).to_dict() for line in corpus.body]
    for event in events:
        del event["seq"]
    with store.session(sid) as handle:
        for i in range(0, len(events), FRAME_RECORDS):
            handle.append(events[i : i + FRAME_RECORDS])
    return sid, sum(len(r.raw) + 1 for r in store.read(sid))


def scan_id(backend: str) -> str:
    return f"scan/{backend}"


MSGSPEC_ID = "scan/msgspec-baseline"


def scan_cases(backends: list[Backend], corpus: Corpus) -> tuple[list[Case], list[Result], dict[str, tuple[str, int]]]:
    """A scan case per backend (the session imported here); returns the sessions made, by
    backend name, for the repair and compression steps to reuse."""
    cases: list[Case] = []
    results: list[Result] = []
    made: dict[str, tuple[str, int]] = {}
    for backend in backends:
        label = f"{backend.name}: store.scan of {corpus.count():,} records"
        if backend.store is None:
            results.append(skipped(scan_id(backend.name), "scan", label, backend.reason or "not available"))
            continue
        try:
            sid, logical = _load(backend, "scan", corpus)
        except Exception as exc:
            results.append(Result(scan_id(backend.name), "scan", label, "records/s", status="error",
                                  reason=f"import failed: {type(exc).__name__}: {exc}"))
            continue
        made[backend.name] = (sid, logical)
        cases.append(Case(scan_id(backend.name), "scan", label,
                          _scanner(backend.store, sid, corpus.count(), logical), timed=False,
                          meta={"backend": backend.name, "records": corpus.count(), "logical_bytes": logical}))
    return cases, results, made


def _scanner(store: object, sid: str, expect: int, nbytes: int) -> Callable[[], Work]:
    def op() -> Work:
        result = store.scan(sid)  # type: ignore[attr-defined]
        if result.record_count != expect or result.damage is not None:
            raise RuntimeError(f"scan of {sid} found {result.record_count} records, damage {result.damage}; "
                               f"expected {expect} clean")
        return result.record_count, nbytes

    return op


def msgspec_case(path: str, expect: int) -> Case:
    """msgspec alone decoding every line of the JSONL file at ``path`` (read in 1 MiB chunks)."""
    decoder = msgspec.json.Decoder()
    size = os.path.getsize(path)

    def op() -> Work:
        count = 0
        rest = b""
        fd = os.open(path, os.O_RDONLY)
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                buf = rest + chunk
                cut = buf.rfind(b"\n") + 1
                count += len(decoder.decode_lines(buf[:cut]))
                rest = buf[cut:]
        finally:
            os.close(fd)
        if count != expect:
            raise RuntimeError(f"msgspec decoded {count} lines of {path}, expected {expect}")
        return count, size

    return Case(MSGSPEC_ID, "scan", f"msgspec decode_lines alone, same {expect:,} JSONL lines", op, timed=False,
                meta={"records": expect, "logical_bytes": size})


# --- repair ---------------------------------------------------------------------------


def repair_id(backend: str) -> str:
    return f"repair/{backend}"


_TORN_LINE = b'{"seq":999999999,"ts":1735689600.0,"type":"tool/result","turn":"t","output":"cut short by a cr'


def _torn_bytes(backend: str) -> bytes:
    if backend == "zstd":
        import zstandard

        frame = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(
            _TORN_LINE + b'ash"}\n'
        )
        return frame[: len(frame) // 2]  # a frame cut short at EOF
    return _TORN_LINE  # a line without its newline at EOF


def repair_cases(backends: list[Backend], corpus: Corpus) -> tuple[list[Case], list[Result]]:
    """A repair case per file backend, on its own copy of the corpus."""
    cases: list[Case] = []
    results: list[Result] = []
    mb = corpus.logical_bytes("repair") / 1e6
    for backend in backends:
        label = f"{backend.name}: repair of a torn {mb:.0f} MB log"
        if backend.store is None:
            results.append(skipped(repair_id(backend.name), "repair", label, backend.reason or "not available"))
            continue
        if not hasattr(backend.store, "path_of"):
            results.append(skipped(repair_id(backend.name), "repair", label,
                                   "no torn bytes in a database: a transaction commits whole"))
            continue
        try:
            sid, logical = _load(backend, "repair", corpus)
            path = backend.store.path_of(sid)
            torn = _torn_bytes(backend.name)
            tear = _tearer(path, torn, backend.store.directory, os.path.basename(path))
            tear()
        except Exception as exc:
            results.append(Result(repair_id(backend.name), "repair", label, "records/s", status="error",
                                  reason=f"setup failed: {type(exc).__name__}: {exc}"))
            continue
        cases.append(Case(repair_id(backend.name), "repair", label, _repairer(backend.store, sid, corpus.count(), logical),
                          timed=False, reset=tear,
                          meta={"backend": backend.name, "logical_bytes": logical,
                                "disk_bytes": os.path.getsize(path)}))
    return cases, results


def _repairer(store: object, sid: str, count: int, nbytes: int) -> Callable[[], Work]:
    def op() -> Work:
        report = store.repair(sid)  # type: ignore[attr-defined]
        if report.status != "repaired" or not report.truncated_bytes:
            raise RuntimeError(f"repair of {sid}: {report.status} ({report.reason}); expected a cut torn tail")
        return count, nbytes

    return op


def _tearer(path: str, torn: bytes, directory: str, log_name: str) -> Callable[[], None]:
    def tear() -> None:
        for name in os.listdir(directory):
            if name.startswith(log_name + ".") and name.endswith(".quarantine"):
                os.unlink(os.path.join(directory, name))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, torn)
        finally:
            os.close(fd)

    return tear


# --- compression ----------------------------------------------------------------------


def compression_results(backends: list[Backend], made: dict[str, tuple[str, int]], corpus: Corpus) -> list[Result]:
    """The Zstd session's on-disk ratio, and the ratio per frame size with the backend's framing."""
    zstd = next((b for b in backends if b.name == "zstd"), None)
    label = "zstd: JSONL bytes / on-disk bytes, 64 records per frame (as stored)"
    if zstd is None or zstd.store is None or "zstd" not in made:
        reason = (zstd.reason if zstd is not None and zstd.reason else "zstd backend not measured")
        return [skipped("compression/zstd/stored-64", "compression", label, reason, unit="x")]
    sid, logical = made["zstd"]
    disk = os.path.getsize(zstd.store.path_of(sid))
    out = [_ratio("compression/zstd/stored-64", label, logical, disk, 64)]
    framing = zstd.store.framing
    lines = [r.raw for r in zstd.store.read(sid)]
    for per in FRAME_SIZES:
        size = 0
        for i in range(0, len(lines), per):
            size += len(framing.encode(lines[i : i + per]))
        out.append(_ratio(f"compression/zstd/frame-{per}", f"zstd level {getattr(framing, 'level', '?')}: "
                          f"{per} record{'s' if per > 1 else ''} per frame", logical, size, per))
    return out


def _ratio(id: str, label: str, logical: int, disk: int, per_frame: int) -> Result:
    ratio = logical / disk if disk else 0.0
    return Result(id, "compression", label, "x", median=ratio, rounds=[ratio],
                  meta={"logical_bytes": logical, "disk_bytes": disk, "records_per_frame": per_frame})



# --- adversarial shapes ------------------------------------------------------------------
# The scanner's fast path proves whole regions; a shape it cannot prove must cost a small
# factor, never a decode of the rest of the buffer per line (which once made logs written
# with spaces 1,500x slower). Each shape is the corpus's first records rewritten, scanned
# in memory by the engine's own scanner (``scan_bytes``: every rule, no store around it),
# against the same records compact. Units are bytes (a shape may hold no records).

SHAPES: dict[str, str] = {
    "compact": "compact lines (the reference)",
    "spaced": "lines written with spaces (json.dumps defaults)",
    "crlf": "CRLF line ends",
    "deep": "every 8th record holds a value nested 128 deep",
    "nested-repeated-keys": "every record holds an object with a repeated key (valid: nested)",
    "blank-lines": "the header, then only blank lines",
    "repeated-key-mid-log": "record 2 repeats a top-level key (mid-log: the rest is walked)",
    "multi-line-mid-log": "record 2 spans two lines (a msgspec.Raw with a newline, before append refused it)",
    "nul-run-mid-log": "a 1 MiB NUL run after record 2",
    "invalid-utf8-mid-log": "record 2 holds invalid UTF-8",
}


def shape_id(shape: str) -> str:
    return f"scan-shape/{shape}"


def shaped_log(corpus: Corpus, shape: str, max_bytes: int = 16 << 20) -> bytes:
    """The corpus's first records (at most ``max_bytes``) as one JSONL log in ``shape``."""
    import json

    header = corpus.header("shape")
    body, size = _first_lines(corpus, max_bytes)
    if shape == "spaced":
        body = [json.dumps(json.loads(line), ensure_ascii=False).encode() for line in body]
    elif shape == "crlf":
        body = [line + b"\r" for line in body]
    elif shape == "deep":
        nest = b"[" * 126 + b"1" + b"]" * 126
        body = [line[:-1] + b',"deep":' + nest + b"}" if i % 8 == 0 else line for i, line in enumerate(body)]
    elif shape == "nested-repeated-keys":
        body = [line[:-1] + b',"meta":{"k":1,"k":2}}' for line in body]
    elif shape == "blank-lines":
        return header + b"\n" * (size + 1)
    elif shape == "repeated-key-mid-log":
        body[0] = body[0][:-1] + b',"type":"again"}'
    elif shape == "multi-line-mid-log":
        body[0] = body[0].replace(b",", b",\n", 1)
    elif shape == "nul-run-mid-log":
        body[0] = body[0] + b"\n" + b"\0" * (1 << 20)
    elif shape == "invalid-utf8-mid-log":
        body[0] = body[0][:-1] + b',"bad":"\xff"}'
    return b"\n".join([header, *body]) + b"\n"


def _first_lines(corpus: Corpus, max_bytes: int) -> tuple[list[bytes], int]:
    """The corpus's first record lines (no newlines) until they reach ``max_bytes`` with
    their newlines, and that size."""
    body: list[bytes] = []
    size = 0
    for line in corpus.body:
        body.append(line)
        size += len(line) + 1
        if size >= max_bytes:
            break
    return body, size


def shape_cases(corpus: Corpus, max_bytes: int = 16 << 20) -> list[Case]:
    """A scan case per adversarial shape (see :data:`SHAPES`), each of about ``max_bytes``."""
    from sessionlog.scan import scan_bytes

    cases = []
    for shape, what in SHAPES.items():
        data = shaped_log(corpus, shape, max_bytes)

        def op(data: bytes = data) -> Work:
            scan_bytes(data, session_id="shape")
            return len(data), len(data)

        cases.append(Case(shape_id(shape), "scan-shape", f"scan of {len(data) / 1e6:.0f} MB: {what}", op,
                          timed=False, unit="bytes/s", meta={"shape": shape, "logical_bytes": len(data)}))
    return cases


# --- adversarial Zstd shapes -----------------------------------------------------------
# The Zstd scan's fast path decodes runs of whole frames as one region and takes a frame
# only when all of its records are proven; frames it cannot take go to the exact path one
# by one. Each shape is the corpus's first records framed another way, scanned in memory
# by the engine's own frame scanner, against the same records in 64-record frames (what
# batches of 64 appends write). Units are bytes of JSONL content.

ZSTD_SHAPES: dict[str, str] = {
    "frames-64": "64 records per frame (the reference: appends of 64)",
    "one-record-frames": "one record per frame (appends of one)",
    "1mib-frames": "frames of up to 1 MiB of records (what convert writes)",
    "no-content-size": "64-record frames without a content size (a streaming compressor's headers)",
    "skippable-frames": "a skippable frame after every 64-record frame",
    "spaced-frames": "64-record frames of lines written with spaces (json.dumps defaults)",
    "bad-checksum-mid-log": "frame 2 fails its checksum (mid-log: the rest is walked)",
    "repeated-bytes-frames": "half the content in frames of one 1 MB record of repeated bytes (~100 bytes each "
                             "compressed: what is decompressed ahead is bounded by the content declared)",
}


def zstd_shape_id(shape: str) -> str:
    return f"zstd-shape/{shape}"


def zstd_shaped_log(corpus: Corpus, shape: str, max_bytes: int = 16 << 20) -> tuple[bytes, int, int]:
    """The corpus's first records (at most ``max_bytes`` of JSONL) as one Zstd log in
    ``shape``, the bytes of JSONL content it holds and its number of records."""
    import json
    import struct

    import zstandard

    from sessionlog.backends.zstd import DEFAULT_LEVEL, compress_frame
    from sessionlog.backends.zstd_frames import SKIPPABLE_MAGIC

    header = corpus.header("shape") + b"\n"
    repeated = shape == "repeated-bytes-frames"
    body = [line + b"\n" for line in _first_lines(corpus, max_bytes // 2 if repeated else max_bytes)[0]]
    if shape == "spaced-frames":
        body = [json.dumps(json.loads(line), ensure_ascii=False).encode() + b"\n" for line in body]
    groups: list[list[bytes]] = []
    if shape == "one-record-frames":
        groups = [[line] for line in body]
    elif shape == "1mib-frames":
        group: list[bytes] = []
        filled = 0
        for line in body:
            if group and filled + len(line) > 1 << 20:
                groups.append(group)
                group, filled = [], 0
            group.append(line)
            filled += len(line)
        groups.append(group)
    else:
        groups = [body[i : i + FRAME_RECORDS] for i in range(0, len(body), FRAME_RECORDS)]
    if shape == "no-content-size":
        cctx = zstandard.ZstdCompressor(level=DEFAULT_LEVEL, write_checksum=True, write_content_size=False)
        frames = [cctx.compress(b"".join(group)) for group in groups]
    else:
        frames = [compress_frame(b"".join(group), DEFAULT_LEVEL) for group in groups]
    if shape == "skippable-frames":
        skippable = struct.pack("<II", SKIPPABLE_MAGIC, 8) + bytes(8)
        frames = [frame + skippable for frame in frames]
    elif shape == "bad-checksum-mid-log":
        frames[1] = frames[1][:-1] + bytes([frames[1][-1] ^ 0xFF])  # the checksum's last byte
    elif repeated:
        seq = len(body) + 2
        for seq in range(seq, seq + max(1, (max_bytes // 2) // 1_000_000)):
            line = encode_record({"type": "tool/result", "call_id": "c", "output": "a" * 1_000_000}, seq, 1.0) + b"\n"
            frames.append(compress_frame(line, DEFAULT_LEVEL))
            body.append(line)
    content = len(header) + sum(map(len, body))
    return compress_frame(header, DEFAULT_LEVEL) + b"".join(frames), content, len(body) + 1


def zstd_shape_cases(corpus: Corpus, max_bytes: int = 16 << 20) -> list[Case]:
    """A Zstd scan case per shape (see :data:`ZSTD_SHAPES`), each of about ``max_bytes``
    of JSONL content."""
    import io

    from sessionlog.backends.zstd_frames import FrameScan

    cases = []
    for shape, what in ZSTD_SHAPES.items():
        data, content, records = zstd_shaped_log(corpus, shape, max_bytes)
        # What the scan must find: every record, or the records before the bad frame.
        expect = (1 + FRAME_RECORDS, True) if shape == "bad-checksum-mid-log" else (records, False)

        def op(data: bytes = data, content: int = content, shape: str = shape,
               expect: tuple[int, bool] = expect) -> Work:
            scanner = FrameScan(io.BytesIO(data).read, session_id="shape", where="<bytes>")
            for _ in scanner.runs():
                pass
            if (scanner.count, scanner.damage is not None) != expect:
                raise RuntimeError(f"zstd shape {shape}: {scanner.count} records, damage {scanner.damage}; "
                                   f"expected {expect}")
            return content, content

        cases.append(Case(zstd_shape_id(shape), "zstd-shape", f"zstd scan of {content / 1e6:.0f} MB: {what}", op,
                          timed=False, unit="bytes/s",
                          meta={"shape": shape, "logical_bytes": content, "stored_bytes": len(data)}))
    return cases
