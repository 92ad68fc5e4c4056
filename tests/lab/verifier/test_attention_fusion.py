"""The fused self-attention (sidecar.lab.verifier.fusion): same logits, one node per layer.

A tiny randomly initialised BERT (2 layers, 2 heads, 32 wide) exported by torch
as the real verifier is, fused as it is and compared with the unfused graph on
pairs of different lengths, one by one and as one padded batch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnxruntime.quantization import QuantType, quantize_dynamic

torch = pytest.importorskip("torch", reason="the [ml] extra (torch) exports the verifier")
pytest.importorskip("transformers", reason="the [ml] extra exports the verifier")

from sidecar.claims.verifier import PairEncoder  # noqa: E402
from sidecar.exceptions import ArtifactError  # noqa: E402
from sidecar.lab.verifier import fusion  # noqa: E402
from sidecar.lab.verifier.export import torch_export  # noqa: E402
from sidecar.lab.verifier.fusion import fuse_attention  # noqa: E402
from sidecar.lab.verifier.model import CrossEncoder  # noqa: E402
from sidecar.lab.verifier.quantization import int8_weights_fp32_compute  # noqa: E402
from sidecar.lab.verifier.settings import minilm_dir  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.lab.verifier.conftest import tiny_bert  # noqa: E402

PAIRS = [
    ("Metformin activates AMPK.", "Metformin reduces glucose output by activating AMPK."),
    (
        "The treaty was signed in 1919.",
        "The Treaty of Versailles was signed on June 28, 1919. " * 5,
    ),
    ("Paris is in Germany.", "Paris is the capital and largest city of France."),
    ("A claim.", ""),
]
TOLERANCE = 1e-5  # |logit| fused vs unfused; the shipped file: 4.3e-06 (MODEL_CARD.md)


@pytest.fixture(scope="module")
def unfused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model as torch exports it (fp32) and with int8 weights computed in fp32."""
    out = tmp_path_factory.mktemp("unfused")
    torch.manual_seed(0)
    model = CrossEncoder(tiny_bert()).eval()
    with torch.no_grad():  # biases as a trained model has them, not the initial zeros
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    fp32 = torch_export(model, minilm_dir(), out / "fp32.onnx")
    quantize_dynamic(str(fp32), str(out / "dynamic.onnx"), weight_type=QuantType.QInt8)
    int8_weights_fp32_compute(out / "dynamic.onnx", out / "int8.onnx")
    return {"fp32": fp32, "int8": out / "int8.onnx"}


def _logits(path: Path, feeds: list[dict[str, Any]]) -> np.ndarray[Any, Any]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(["logits"], feed)[0].reshape(-1) for feed in feeds])


def _feeds(max_length: int = 64) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each pair alone, and all of them as one padded batch."""
    encoder = PairEncoder.from_file(minilm_dir() / "tokenizer.json", max_length)
    one_by_one = [encoder.encode([pair]) for pair in PAIRS]
    batch = encoder.encode(PAIRS)
    assert len({f["input_ids"].shape[1] for f in one_by_one}) == len(PAIRS)  # padding differs
    return one_by_one, batch


def _ops(path: Path) -> Counter[str]:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_the_fused_graph_computes_the_same_logits(
    unfused: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    fused = tmp_path / "fused.onnx"
    assert fuse_attention(unfused[kind], fused) == 2  # one block per layer
    ops = _ops(fused)
    assert ops["Attention"] == 2 and not ops["Softmax"] and not ops["IsNaN"]
    assert _ops(unfused[kind])["Softmax"] == 2
    one_by_one, batch = _feeds()
    before = _logits(unfused[kind], one_by_one)
    np.testing.assert_allclose(_logits(fused, one_by_one), before, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(_logits(fused, [batch]), before, rtol=0, atol=TOLERANCE)
    # the int8 file's Q, K and V weights stay int8 (concatenated when the session folds them)
    assert _int8_weights(fused) == _int8_weights(unfused[kind])
    assert bool(_int8_weights(fused)) == (kind == "int8")


def _int8_weights(path: Path) -> set[str]:
    graph = onnx.load(str(path)).graph
    return {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.INT8}


def test_a_graph_without_self_attention_is_refused(tmp_path: Path) -> None:
    """No Softmax to fuse (a graph that is not the verifier's): an error, nothing written."""
    inputs = [
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    logits = onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", 1])
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Cast", ["input_ids"], ["ids"], to=onnx.TensorProto.FLOAT),
            onnx.helper.make_node("ReduceSum", ["ids"], ["logits"], keepdims=1),
        ],
        "no-attention",
        inputs,
        [logits],
    )
    source, out = tmp_path / "plain.onnx", tmp_path / "fused.onnx"
    onnx.save(onnx.helper.make_model(graph), str(source))
    with pytest.raises(ArtifactError, match="no self-attention"):
        fuse_attention(source, out)
    assert not out.exists()


def _edited(source: Path, dest: Path, edit: Any) -> Path:
    model = onnx.load(str(source))
    edit(model.graph)
    onnx.save(model, str(dest))
    return dest


def test_an_attention_of_another_shape_is_refused_by_name(
    unfused: dict[str, Path], tmp_path: Path
) -> None:
    def scale_q_twice(graph: Any) -> None:  # Q scaled by 2 x head_size ** -0.25
        producer = {o: n for n in graph.node for o in n.output}
        softmax = next(n for n in graph.node if n.op_type == "Softmax")
        scores = producer[producer[softmax.input[0]].input[0]]
        q_scale = producer[scores.input[0]]
        constant = producer[q_scale.input[1]]
        value = onnx.numpy_helper.to_array(constant.attribute[0].t)
        constant.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(value * 2))

    def drop_the_mask(graph: Any) -> None:  # scores + a constant instead of the padding mask
        softmax = next(n for n in graph.node if n.op_type == "Softmax")
        masked = next(n for n in graph.node if n.output[0] == softmax.input[0])
        graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(1, np.float32), "zero"))
        masked.input[1] = "zero"

    out = tmp_path / "fused.onnx"
    for edit, message in (
        (scale_q_twice, r"scaled by .* not 1/sqrt\(head size 16\)"),
        (drop_the_mask, "not computed from attention_mask"),
    ):
        edited = _edited(unfused["fp32"], tmp_path / f"{edit.__name__}.onnx", edit)
        with pytest.raises(ArtifactError, match=message) as info:
            fuse_attention(edited, out)
        assert "layer.0/attention/self/Softmax" in str(info.value)
        assert not out.exists()


def test_a_fused_file_whose_logits_moved_is_not_kept(
    unfused: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fusion, "FUSED_LOGIT_TOLERANCE", -1.0)  # any difference is too much
    out = tmp_path / "fused.onnx"
    with pytest.raises(ArtifactError, match=r"moved a logit by .* the fused file was not kept"):
        fuse_attention(unfused["fp32"], out)
    assert not out.exists()


def test_the_shipped_verifier_runs_one_attention_node_per_layer(tmp_path: Path) -> None:
    shipped = REPO / "models" / "verifier" / "model.int8.onnx"
    ops = _ops(shipped)
    assert ops["Attention"] == 6 and not ops["Softmax"] and not ops["MatMulInteger"]
    with pytest.raises(ArtifactError, match="no self-attention"):  # fused once only
        fuse_attention(shipped, tmp_path / "twice.onnx")
