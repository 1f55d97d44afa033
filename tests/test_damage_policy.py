"""The damage table (docs/damage.md), as code: kinds, classification, repair policy."""

from __future__ import annotations

import pytest

from sessionlog.contract import DamageKind, Failure, classify_damage


@pytest.mark.parametrize(
    ("failure", "after", "within", "owned", "kind"),
    [
        (Failure.CUT_SHORT, 0, True, False, DamageKind.TORN),
        (Failure.CUT_SHORT, 0, True, True, DamageKind.IN_FLIGHT),
        (Failure.CUT_SHORT, 2, True, False, DamageKind.MID_LOG),  # a frame "cut short" with frames after it
        (Failure.NUL_RUN, 0, True, False, DamageKind.ZERO_FILL),
        (Failure.NUL_RUN, 3, True, False, DamageKind.ZERO_FILL),
        (Failure.NUL_RUN, 3, False, False, DamageKind.MID_LOG),
        (Failure.UNDECODABLE, 0, True, False, DamageKind.CORRUPT),
        (Failure.UNDECODABLE, 1, True, False, DamageKind.MID_LOG),
        (Failure.WRONG_SEQ, 0, True, False, DamageKind.SEQ_BREAK),
        (Failure.WRONG_SEQ, 5, False, True, DamageKind.SEQ_BREAK),
    ],
)
def test_classification(failure, after, within, owned, kind):
    assert classify_damage(failure, records_after=after, within_reach=within, owned=owned) is kind


def test_repair_policy():
    assert {k for k in DamageKind if k.repairable} == {DamageKind.TORN, DamageKind.ZERO_FILL, DamageKind.CORRUPT}
    assert {k for k in DamageKind if k.needs_force} == {DamageKind.SEQ_BREAK, DamageKind.MID_LOG}
    assert not DamageKind.IN_FLIGHT.repairable and not DamageKind.IN_FLIGHT.needs_force
    assert [str(k) for k in DamageKind] == ["torn", "zero-fill", "corrupt", "seq-break", "mid-log", "in-flight"]


# --- power loss inside one multi-page append ------------------------------------------
#
# Page writeback within one unsynced write has no order: any subset of the append's 4 KiB
# pages may reach the disk (the others read as NULs), and the size update may land short.
# None of that is acknowledged history, so every such tail is repairable without force and
# the durable prefix survives byte for byte.

import os  # noqa: E402
import secrets  # noqa: E402
import tempfile  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import sessionlog  # noqa: E402
from sessionlog.contract import SECTOR, power_loss_nuls  # noqa: E402

PAGE = 4096
EXAMPLES = int(os.environ.get("SESSIONLOG_HYPOTHESIS_EXAMPLES", "0")) or (
    300 if os.environ.get("SESSIONLOG_SLOW") else 40
)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _history(scheme: str) -> tuple[str, bytes, bytes, int]:
    """A session with some durable history, then one multi-page append; returns the
    file name, the durable prefix's bytes, the append's bytes and the prefix's last seq."""
    with tempfile.TemporaryDirectory() as d:
        store = sessionlog.open_store(f"{scheme}:{d}")
        store.create("s", [{"type": "note", "text": secrets.token_hex(700)}])
        last = store.append("s", [{"type": "note", "text": secrets.token_hex(300)}])
        path = store.path_of("s")
        with open(path, "rb") as f:
            prefix = f.read()
        # Random hex stays a few pages after compression too.
        store.append("s", [{"type": "note", "i": i, "text": secrets.token_hex(900)} for i in range(24)])
        with open(path, "rb") as f:
            whole = f.read()
    assert len(whole) - len(prefix) > 3 * PAGE
    return store.file_name("s"), prefix, whole[len(prefix):], last


HISTORY = {scheme: _history(scheme) for scheme in ("jsonl", "zstd")}


def _pages(start: int, end: int) -> list[tuple[int, int]]:
    """The append's pages as file ranges: the first starts at the old EOF (the part of
    its page before that is durable history), the rest are aligned 4 KiB pages."""
    out, lo = [], start
    while lo < end:
        hi = min(end, (lo // PAGE + 1) * PAGE)
        out.append((lo, hi))
        lo = hi
    return out


@pytest.mark.parametrize("scheme", sorted(HISTORY))
@SETTINGS
@given(data=st.data())
def test_any_subset_of_a_multi_page_appends_pages_is_repairable(scheme, data):
    name, prefix, append, last = HISTORY[scheme]
    start, end = len(prefix), len(prefix) + len(append)
    pages = _pages(start, end)
    landed = data.draw(st.lists(st.booleans(), min_size=len(pages), max_size=len(pages)))
    cut = data.draw(st.sampled_from([start] + [hi for _, hi in pages]))  # where the size update landed
    image = bytearray(prefix + append)
    for (lo, hi), ok in zip(pages, landed):
        if not ok:
            image[lo:hi] = bytes(hi - lo)
    image = bytes(image[:cut])
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, name), "wb") as f:
            f.write(image)
        store = sessionlog.open_store(f"{scheme}:{d}")
        res = store.scan("s")
        assert res.last_seq >= last  # nothing acknowledged is missing
        if res.damage is not None:
            assert not res.damage.kind.needs_force, (res.damage, landed, cut - start)
            assert res.damage.kind.repairable
        rep = store.repair("s")
        assert rep.status in ("clean", "repaired")
        after = store.scan("s")
        assert after.status == "clean"
        with open(os.path.join(d, name), "rb") as f:
            assert f.read().startswith(prefix)  # the durable prefix, byte for byte
        assert store.append("s", [{"type": "after"}]) > last


def _jsonl(records: list[dict]) -> bytes:
    import json

    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


def test_a_flipped_byte_with_records_after_it_is_still_mid_log():
    from sessionlog.scan import scan_bytes

    recs = [{"seq": 1, "ts": 1.0, "type": "session/start", "session": "s", "format": "sessionlog/1"}]
    recs += [{"seq": i, "ts": 1.0, "type": "note", "text": "x" * 100} for i in range(2, 60)]
    data = bytearray(_jsonl(recs))
    at = data.index(b'"seq":30') + 2
    for flipped in (b"\0", b"\x01"):
        bad = bytes(data[:at]) + flipped + bytes(data[at + 1:])
        _, _, damage = scan_bytes(bad, session_id="s")
        assert damage is not None and damage.kind is DamageKind.MID_LOG, damage


def test_a_nul_page_inside_a_line_followed_by_records_within_reach_is_zero_fill():
    from sessionlog.scan import scan_bytes

    recs = [{"seq": 1, "ts": 1.0, "type": "session/start", "session": "s", "format": "sessionlog/1"}]
    recs += [{"seq": i, "ts": 1.0, "type": "note", "text": "y" * 1500} for i in range(2, 30)]
    data = bytearray(_jsonl(recs))
    stable = data.index(b'{"seq":10,')
    page = (stable // PAGE + 1) * PAGE
    data[page:page + PAGE] = bytes(PAGE)  # a page of the last append never written back
    records, offset, damage = scan_bytes(bytes(data), session_id="s")
    assert damage is not None and damage.kind is DamageKind.ZERO_FILL and damage.records_after > 0
    assert offset <= page
    # The same NULs with the records after them beyond one append's reach: mid-log.
    limits = sessionlog.Limits(batch_limit=PAGE, record_limit=PAGE)
    _, _, damage = scan_bytes(bytes(data), session_id="s", limits=limits)
    assert damage is not None and damage.kind is DamageKind.MID_LOG


def _framed_history() -> tuple[str, bytes, list[int]]:
    """A Zstd session of several acknowledged appends (one frame each, some of several
    pages); returns the file name, its bytes and where each append's frame starts."""
    with tempfile.TemporaryDirectory() as d:
        store = sessionlog.open_store(f"zstd:{d}")
        store.create("s")
        path = store.path_of("s")
        starts = []
        for n in (3, 40, 2, 25, 1, 1):
            starts.append(os.path.getsize(path))
            store.append("s", [{"type": "note", "i": i, "text": secrets.token_hex(200)} for i in range(n)])
        with open(path, "rb") as f:
            return store.file_name("s"), f.read(), starts


FRAMED = _framed_history()


@SETTINGS
@given(data=st.data())
def test_nuls_in_a_frame_with_later_appends_after_it_are_mid_log(data):
    """On Zstd an append is one frame, and a writer starts an append only once the one
    before it is durable: a power loss's NULs (an aligned sector or more) inside a frame
    that later appends' whole frames follow lie in acknowledged history, however close
    to the end, and are never cut without force (a plain repair used to cut them as
    zero-fill when they were within the batch limit of the end: acknowledged appends
    lost)."""
    name, image, starts = FRAMED
    k = data.draw(st.integers(0, len(starts) - 2), label="frame")
    lo, hi = starts[k], starts[k + 1]
    first = -(-lo // SECTOR)  # the frame's first whole aligned sector
    if (first + 1) * SECTOR > hi:
        return  # a frame within one sector: no whole sector of it is NULs alone
    sector = data.draw(st.integers(first, hi // SECTOR - 1), label="sector")
    count = data.draw(st.integers(1, 8), label="sectors")
    nul_lo, nul_hi = sector * SECTOR, min(hi, (sector + count) * SECTOR)
    damaged = image[:nul_lo] + bytes(nul_hi - nul_lo) + image[nul_hi:]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(damaged)
        store = sessionlog.open_store(f"zstd:{d}")
        damage = store.scan("s").damage
        assert damage is not None and damage.kind is DamageKind.MID_LOG, damage
        assert damage.offset == lo and damage.records_after > 0
        assert store.repair("s").status == "refused"
        with open(path, "rb") as f:
            assert f.read() == damaged  # not a byte changed


@pytest.mark.parametrize(
    ("unit", "offset", "crash"),
    [
        (bytes(412) + b"abc", 100, True),  # NULs where the tail starts, to the end of its sector
        (bytes(3), 100, True),  # NULs to the end of the file, before the end of their sector
        (b"\0abc", 100, False),  # one byte flipped to NUL where the tail starts: no sector is half written
        (bytes(411) + b"abc", 100, False),
        (b"ab" + bytes(512) + b"cd", 510, True),  # covers the sector 512..1024
        (b"ab" + bytes(512) + b"cd", 0, False),  # 512 NULs at 2..514: no whole aligned sector
        (b"ab" + bytes(1023) + b"cd", 0, True),  # any 1023 NULs cover a sector
        (b"a\0b", 0, False),  # one flipped byte
        (b"", 0, False),
    ],
)
def test_power_loss_nuls(unit, offset, crash):
    assert power_loss_nuls(unit, offset, eof=True) is crash


@pytest.mark.parametrize(
    ("unit", "offset", "crash"),
    [
        (bytes(3), 100, False),  # a record zeroed in place: its newline and more in the same sector
        (bytes(411), 100, False),
        (bytes(412), 100, True),  # to the end of its sector: the next bytes are another sector's
        (b"ab" + bytes(512), 510, True),
    ],
)
def test_power_loss_nuls_before_the_end_of_the_file(unit, offset, crash):
    assert power_loss_nuls(unit, offset, eof=False) is crash


def test_durable_batches_keep_order_and_fit():
    from sessionlog.contract import durable_batches

    lines = [bytes([65 + i % 26]) * (i * 37 % 300 + 1) for i in range(500)]
    batches = durable_batches(lines, 1000)
    assert [line for b in batches for line in b] == lines
    assert all(sum(len(x) + 1 for x in b) <= 1000 for b in batches)
    assert all(sum(len(x) + 1 for x in a) + len(b[0]) + 1 > 1000 for a, b in zip(batches, batches[1:]))
    assert durable_batches([], 1000) == []


def _appended(tmp_path, backend, n, pad=""):
    """A store with session "s" of ``n`` one-record appends; the log's path and where each
    append starts."""
    store = sessionlog.open_store(f"{backend}:{tmp_path}")
    store.create("s")
    [path] = list(tmp_path.glob("s.*"))
    starts = []
    for i in range(n):
        starts.append(path.stat().st_size)
        store.append("s", [{"type": "note", "i": i, "pad": pad}])
    return store, path, starts


@pytest.mark.parametrize("backend", ["jsonl", "zstd"])
def test_one_nul_at_the_start_of_an_old_record_is_mid_log(tmp_path, backend):
    """A byte of old history flipped to NUL where a record (a frame) starts, with
    acknowledged appends after it: not what a power loss leaves, never cut without force."""
    store, path, starts = _appended(tmp_path, backend, 50)
    data = bytearray(path.read_bytes())
    data[starts[10]] = 0
    path.write_bytes(bytes(data))
    damage = store.scan("s").damage
    assert damage is not None and damage.kind is DamageKind.MID_LOG and damage.offset == starts[10]
    assert store.repair("s").status == "refused"
    assert path.read_bytes() == bytes(data)


@pytest.mark.parametrize("backend", ["jsonl", "zstd"])
def test_an_old_record_zeroed_in_place_inside_one_sector_is_mid_log(tmp_path, backend):
    """A short record (a frame) of old history zeroed in place, its newline kept, with the
    next one in the same 512-byte sector: a power loss leaves NULs to the end of their
    sector, never NULs that stop where other bytes follow; never cut without force."""
    store, path, starts = _appended(tmp_path, backend, 50)
    k = next(k for k in range(10, 49) if starts[k] // SECTOR == (starts[k + 1] - 1) // SECTOR)
    end = starts[k + 1] - (1 if backend == "jsonl" else 0)
    data = bytearray(path.read_bytes())
    data[starts[k]:end] = bytes(end - starts[k])
    path.write_bytes(bytes(data))
    damage = store.scan("s").damage
    assert (damage.kind, damage.offset, damage.records_after) == (DamageKind.MID_LOG, starts[k], 49 - k)
    assert store.repair("s").status == "refused"
    assert path.read_bytes() == bytes(data)


@pytest.mark.parametrize("backend", ["jsonl", "zstd"])
@pytest.mark.parametrize("case", ["flipped byte, records after", "NULs past the end"])
def test_opening_a_damaged_session_names_the_damage_as_scan_does(tmp_path, backend, case):
    """A writer refused at open by damage near the tail hears what `sessionlog scan` says:
    the same kind and offset, and the repair it needs (force for mid-log)."""
    store, path, starts = _appended(tmp_path, backend, 20, pad="x" * 100)
    data = bytearray(path.read_bytes())
    if case.startswith("flipped"):
        data[starts[17] + 5] ^= 0x55
    else:
        data += bytes(600)
    path.write_bytes(bytes(data))
    damage = store.scan("s").damage
    assert damage is not None
    with pytest.raises(sessionlog.CorruptLog) as info:
        store.session("s")
    assert (info.value.kind, info.value.offset, info.value.path) == (str(damage.kind), damage.offset, str(path))
    assert f"{damage.kind} at offset {damage.offset}" in str(info.value)
    assert ("force" in str(info.value)) == damage.kind.needs_force
    assert damage.kind is (DamageKind.MID_LOG if case.startswith("flipped") else DamageKind.ZERO_FILL)
    assert path.read_bytes() == bytes(data)
