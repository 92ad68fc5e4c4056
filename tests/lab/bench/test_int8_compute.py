"""``bench/int8_compute.py``: the shipped network computed in integers, for measuring."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.int8_compute import integer_compute
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lab.verifier.quantization import import_onnx
from tests.claims.conftest import REPO

pytest.importorskip("onnx")

SHIPPED = REPO / "models" / "verifier"
PAIR = [("Paris", "Paris is the capital and largest city of France.")]


@pytest.mark.parametrize(("per_channel", "reduce_range"), [(False, False), (True, True)])
def test_the_variant_computes_its_products_in_integers(
    tmp_path: Path, per_channel: bool, reduce_range: bool
) -> None:
    out = integer_compute(
        SHIPPED, tmp_path / "v", per_channel=per_channel, reduce_range=reduce_range
    )
    onnx = import_onnx()
    from onnx import numpy_helper

    model = onnx.load(str(out / "model.int8.onnx"))
    ops = {n.op_type for n in model.graph.node}
    assert {"MatMulInteger", "QAttention", "DynamicQuantizeLinear"} <= ops
    weights = [
        numpy_helper.to_array(i)
        for i in model.graph.initializer
        if i.data_type == onnx.TensorProto.INT8 and i.name.endswith("_quantized")
    ]
    assert weights, "no int8 weight initializers"
    low = min(int(w.min()) for w in weights)
    high = max(int(w.max()) for w in weights)
    # 7-bit weights keep AVX2's pairwise int16 sums (2 x 255 x 64 = 32,640) from saturating
    assert (low, high) == ((-64, 64) if reduce_range else (-127, 127))
    scales = [
        numpy_helper.to_array(i)
        for i in model.graph.initializer
        if i.name.endswith("_scale") and "MatMul" in i.name
    ]
    assert any(s.size > 1 for s in scales) == per_channel

    verifier = OnnxVerifier.load(out, threads=1)  # sha matches; no golden outputs
    assert verifier.artifact.quantization == "int8-dynamic"
    assert verifier.version.endswith("-7b" if reduce_range else "-int8c")
    shipped = OnnxVerifier.load(SHIPPED, threads=1)
    z, z_shipped = verifier.logits(PAIR, ["capital?"])[0], shipped.logits(PAIR, ["capital?"])[0]
    assert np.isfinite(z) and z != z_shipped
    if reduce_range:  # 8-bit weights saturate on AVX2-only CPUs: their logit may move by ~3
        assert z > 0 and z_shipped > 0  # the same network: a plainly supported claim stays so
