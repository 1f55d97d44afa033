"""The damage table (DESIGN.md section 3), as code: kinds, classification, repair policy."""

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
