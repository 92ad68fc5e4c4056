"""Choosing the verifier's uncertain band at start (the target precision it was fitted for).

An export fits the band for several target precisions on the same validation
pairs (``verifier.json`` ``bands``); the sidecar serves its own band unless the
setting names another one the artifact has. Claim verdicts then name the
verifier as ``<version>+p<target>``, and an allow certificate fitted with the
verifier's own band does not apply (the confidence reads the claim labels).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sidecar.claims.calibration import Band
from sidecar.claims.verifier import OnnxVerifier, load_claim_checker
from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.runtime import build_policy
from tests.claims.conftest import REPO

SHIPPED = REPO / "models" / "verifier"
WIDE = {"target_precision": 0.9, "unsupported_below": 0.29, "supported_from": 0.75}


def _copy(tmp_path: Path, **update: Any) -> Path:
    """The shipped verifier with its metadata changed (the ONNX file and tokenizer as is)."""
    out = tmp_path / "verifier"
    out.mkdir(parents=True)
    meta = json.loads((SHIPPED / "verifier.json").read_text(encoding="utf-8"))
    for name in (meta["onnx_file"], meta["tokenizer_file"]):
        (out / name).symlink_to(SHIPPED / name)
    shutil.copy(SHIPPED / "MODEL_CARD.md", out / "MODEL_CARD.md")
    meta.update(update)
    (out / "verifier.json").write_text(json.dumps(meta), encoding="utf-8")
    return out


def _with_bands(tmp_path: Path) -> Path:
    meta = json.loads((SHIPPED / "verifier.json").read_text(encoding="utf-8"))
    own = {
        "target_precision": 0.8,
        "unsupported_below": meta["unsupported_below"],
        "supported_from": meta["supported_from"],
        "uncertain_share": 0.0,
    }
    return _copy(tmp_path, target_precision=0.8, bands=[own, {**WIDE, "uncertain_share": 0.23}])


def test_the_setting_serves_the_band_fitted_for_it(tmp_path: Path) -> None:
    model = _with_bands(tmp_path)
    own = OnnxVerifier.load(model, threads=1)
    assert own.band == own.artifact.band and own.version == own.artifact.version
    same = OnnxVerifier.load(model, threads=1, target_precision=0.8)  # its own, by name
    assert same.band == own.band and same.version == own.version
    wide = OnnxVerifier.load(model, threads=1, target_precision=0.9)
    assert wide.band == Band(0.29, 0.75)
    assert wide.version == f"{own.artifact.version}+p0.9"
    checker = load_claim_checker(model, threads=1, target_precision=0.9)
    assert checker.version == f"{own.artifact.version}+p0.9+rules"
    assert checker.scorer.verifier.band.label(0.5).value == "uncertain"


def test_a_target_the_artifact_has_no_band_for_is_refused_with_the_choices(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"=0\.93: .* it has bands for 0\.8, 0\.9 \(unset"):
        OnnxVerifier.load(_with_bands(tmp_path), threads=1, target_precision=0.93)
    one = _copy(tmp_path / "old", target_precision=None, bands=[])
    with pytest.raises(ConfigError, match="exported with one band only"):
        OnnxVerifier.load(one, threads=1, target_precision=0.9)
    assert OnnxVerifier.load(one, threads=1).band.supported_from > 0.0  # unset: its own


@pytest.mark.parametrize("value", ["0.4", "1.0", "high"])
def test_the_setting_is_checked_when_the_settings_load(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION", value)
    with pytest.raises(ConfigError, match="GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION"):
        Settings.load()


def test_a_certificate_fitted_with_the_verifiers_own_band_does_not_apply(
    tmp_path: Path,
) -> None:
    """The shipped nq-open profile's claims-on certificate, served with a wider band."""
    model = _with_bands(tmp_path)

    def nq_open(**signals: Any) -> Any:
        settings = Settings.load(
            models={"dir": str(REPO / "models")},
            signals={"claims": True, "verifier": str(model), **signals},
        )
        return build_policy(settings).certified["nq-open"]  # type: ignore[attr-defined]

    own = nq_open()
    assert (own.path.name, own.inactive) == ("nq-open-claims.json", None)
    wide = nq_open(verifier_target_precision=0.9)
    assert wide.inactive is not None
    assert "the sidecar serves minilm-ce-" in wide.inactive and "+p0.9" in wide.inactive
    with pytest.raises(ConfigError, match="no band fitted for it"):
        nq_open(verifier_target_precision=0.85)  # at start, before any verifier is loaded
