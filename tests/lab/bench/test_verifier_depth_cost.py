"""``bench/verifier_depth_cost.py``: the shipped network cut to its first layers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.verifier_depth_cost import cut_to_depth
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lab.verifier.quantization import import_onnx
from tests.claims.conftest import REPO

pytest.importorskip("onnx")

SHIPPED = REPO / "models" / "verifier"


def test_a_cut_network_keeps_only_its_first_layers_and_still_scores(tmp_path: Path) -> None:
    out = cut_to_depth(SHIPPED, 2, tmp_path / "d2", max_length=128)
    onnx = import_onnx()
    model = onnx.load(str(out / "model.int8.onnx"))
    layers = {n.name.split("/")[3] for n in model.graph.node if "/encoder/encoder/layer." in n.name}
    assert layers == {"layer.0", "layer.1"}
    verifier = OnnxVerifier.load(out, threads=1)  # sha matches; no golden outputs to check
    assert verifier.artifact.max_length == 128 and verifier.version.endswith("-depth2")
    (p,) = verifier.probabilities([("Paris", "Paris is the capital of France.")], ["capital?"])
    assert 0.0 <= p <= 1.0
    shipped = OnnxVerifier.load(SHIPPED, threads=1)
    pair = [("Paris", "Paris is the capital of France.")]
    assert verifier.logits(pair, ["capital?"])[0] != shipped.logits(pair, ["capital?"])[0]


@pytest.mark.parametrize("depth", [0, 6, 7])
def test_a_depth_outside_the_network_is_refused(tmp_path: Path, depth: int) -> None:
    with pytest.raises(ValueError, match="layers"):
        cut_to_depth(SHIPPED, depth, tmp_path / "x")
