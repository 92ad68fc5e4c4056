"""``bench/exit_heads.py``: the probe adds the head's features after each lower layer without
changing the network's own output, and an exit threshold is the first that keeps agreement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the train extra (onnx) builds the probe")

from bench.exit_heads import FEATURES, exit_threshold, features, probe_model, served_encoder
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lab.verifier.sources import Pair
from tests.claims.conftest import REPO

MODEL = REPO / "models" / "verifier"


def test_the_probe_keeps_the_logits_and_adds_features_after_every_lower_layer(
    tmp_path: Path,
) -> None:
    import onnxruntime as ort

    verifier = OnnxVerifier.load(MODEL, threads=1)
    outputs = probe_model(MODEL / verifier.artifact.onnx_file, tmp_path / "probe.onnx")
    assert outputs == ["logits", FEATURES, *(f"{FEATURES}@{k}" for k in range(5))]
    session = ort.InferenceSession(str(tmp_path / "probe.onnx"), providers=["CPUExecutionProvider"])
    pairs = [
        Pair("Paris is the capital of France.", "Paris is France's capital.", 1, "qa", "t", "g"),
        Pair("The moon is made of cheese.", "The moon is made of rock.", 0, "qa", "t", "h"),
    ]
    got = features(verifier, served_encoder(verifier, MODEL), session, outputs, pairs, desc="test")
    served = verifier.logits([(p.claim, p.evidence) for p in pairs], ["", ""])
    assert got[0].reshape(-1) == pytest.approx(served, abs=1e-4)
    final = got[1]
    for per_layer in got[2:]:
        assert per_layer.shape == final.shape  # the same block, read off a lower layer
        assert not np.allclose(per_layer, final)


def test_an_exit_threshold_is_the_smallest_that_keeps_the_agreement() -> None:
    z = np.array([-5.0, -3.0, -0.5, 0.2, 1.0, 4.0])
    final = np.array([False, False, True, False, True, True])
    # |z| >= 0: 4 of 6 agree; >= 0.25 drops 0.2 (wrong); >= 0.55 drops -0.5 (wrong): all agree
    assert exit_threshold(z, final, 1.0) == {"abs_z": 0.55, "exit_share": 0.6667}
    assert exit_threshold(z, final, 0.6) == {"abs_z": 0.0, "exit_share": 1.0}
    assert exit_threshold(z, ~final, 1.0) is None  # none agrees at any threshold
