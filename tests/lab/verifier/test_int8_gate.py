"""The int8 gate: a quantised verifier is refused only when it is worse than fp32."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the [ml] extra (torch) exports the verifier")

from sidecar.lab.verifier.export import int8_holds


def _sets(acc: float, auroc: float) -> dict[str, dict[str, float | int | str]]:
    return {
        "dialogue": {"accuracy": 0.70, "auroc": 0.80},
        "summedits": {"accuracy": acc, "auroc": auroc},
    }


def test_int8_within_tolerance_is_kept() -> None:
    assert int8_holds(_sets(0.60, 0.70), _sets(0.595, 0.69), tolerance=0.01)


def test_int8_better_than_fp32_is_kept() -> None:
    # run 2's step-2,400 export: int8 was 0.024 more accurate on the 168-item SummEdits set
    assert int8_holds(_sets(0.60, 0.70), _sets(0.624, 0.73), tolerance=0.01)


@pytest.mark.parametrize(("acc", "auroc"), [(0.585, 0.70), (0.60, 0.675)])
def test_int8_worse_than_fp32_is_refused(acc: float, auroc: float) -> None:
    assert not int8_holds(_sets(0.60, 0.70), _sets(acc, auroc), tolerance=0.01)
