"""sidecar.golden: CPU features from /proc/cpuinfo, drift, the refusal message."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sidecar.exceptions import ConfigError
from sidecar.golden import (
    GoldenOutputs,
    cpu_features,
    describe_cpu,
    max_drift,
    record_golden,
)

AVX2_ONLY = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2
"""
VNNI = AVX2_ONLY.replace("bmi2", "bmi2 avx512f avx512bw avx512_vnni amx_tile amx_int8")


def test_cpu_features_are_read_from_the_flags_line(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(AVX2_ONLY, encoding="utf-8")
    assert cpu_features(path) == ("avx2", "fma")
    assert describe_cpu(path).endswith(
        "with avx2 fma, without avx512f avx512bw avx512_vnni avx_vnni amx_tile amx_int8"
    )
    path.write_text(VNNI, encoding="utf-8")
    assert cpu_features(path) == (
        "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile", "amx_int8",
    )  # fmt: skip
    assert cpu_features(tmp_path / "missing") is None
    assert "no CPU flags readable" in describe_cpu(tmp_path / "missing")


def test_max_drift_is_the_largest_difference_and_nan_when_not_finite() -> None:
    assert max_drift([1.0, 2.0], [1.0 + 1e-6, 2.0 - 3e-6]) == pytest.approx(3e-6, abs=1e-12)
    assert math.isnan(max_drift([1.0], [math.nan]))
    assert math.isnan(max_drift([1.0], [math.inf]))
    with pytest.raises(ValueError, match="2 outputs for 1 references"):
        max_drift([1.0], [1.0, 2.0])


def test_outputs_within_the_tolerance_pass_and_report_their_drift() -> None:
    golden = record_golden(["a", "b"], [0.25, -1.5], output="logit", tolerance=1e-3)
    assert golden.inputs == ["a", "b"] and golden.references == [0.25, -1.5]
    # one at a time, then as one batch: both runs are compared with the references
    drift = golden.check([0.2504, -1.5, 0.25, -1.4993], model="m")
    assert drift == pytest.approx(7e-4, abs=1e-9)


@pytest.mark.parametrize("bad", [0.2515, math.nan])
def test_outputs_past_the_tolerance_refuse_with_the_cpu_and_the_drift(bad: float) -> None:
    golden = record_golden(["a", "b"], [0.25, -1.5], output="logit", tolerance=1e-3)
    with pytest.raises(ConfigError) as info:
        golden.check([0.25, -1.5, bad, -1.5], model="claim verifier v1")
    message = str(info.value)
    assert "claim verifier v1" in message and "logit moved by up to" in message
    assert "This CPU: " + describe_cpu() in message
    assert "more than the allowed 0.001" in message
    with pytest.raises(ValueError, match="3 outputs for 2 golden cases"):
        golden.check([0.25, -1.5, 0.25], model="m")


def test_past_the_tolerance_on_the_recording_cpu_the_files_are_blamed_not_the_cpu() -> None:
    """Audit: golden outputs edited in the metadata gave "run it on a node whose CPU
    matches" on the very machine that recorded them."""
    golden = record_golden(["a"], [0.25], output="logit", tolerance=1e-3)
    assert golden.recorded_on == describe_cpu()
    with pytest.raises(ConfigError, match="CPU features are the same") as info:
        golden.check([0.5], model="m")
    assert "node whose CPU matches" not in str(info.value)
    elsewhere = golden.model_copy(update={"recorded_on": "x86_64 with avx2 fma, without ..."})
    with pytest.raises(ConfigError, match="node whose CPU matches") as info:
        elsewhere.check([0.5], model="m")
    assert "files were changed since export" in str(info.value)


def test_golden_outputs_round_trip_through_json() -> None:
    golden = record_golden([[0.0, 0.5], [1.0, 0.25]], [0.1, 0.9], output="p", tolerance=1e-5)
    again = GoldenOutputs[list[float]].model_validate_json(golden.model_dump_json())
    assert again == golden
    with pytest.raises(ValueError, match="greater than 0"):
        GoldenOutputs[str](output="p", tolerance=0.0, recorded_on="x", cases=[])
