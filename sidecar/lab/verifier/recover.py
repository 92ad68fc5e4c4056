"""The verifier's network back in torch form, read from its exported int8-weights ONNX file.

A shipped verifier's training checkpoint stays on the machine that trained it; the
ONNX file ships. Its weights are int8 with a scale (``Cast(W_int8) * scale``, folded
by onnxruntime into one fp32 matrix at load: :mod:`sidecar.lab.verifier.quantization`)
and its self-attention is one fused ``Attention`` node per layer with the query, key
and value weights side by side (:mod:`sidecar.lab.verifier.fusion`). The products
``q * scale`` are the fp32 weights the served file computes with, so a
:class:`~sidecar.lab.verifier.model.CrossEncoder` given them computes what the
served file computes (up to the kernels' last bits): a start for further training
(``guardrail train verifier --init-from model.int8.onnx``) and the teacher for a
smaller network.

Reads the graph by structure, not by the exporter's node numbers: each ``Attention``
node's packed weight and bias; the three ``MatMul`` nodes with a constant weight after it
(attention output, intermediate, output); the three embedding tables (int8 with a scale,
or fp32); the layer norms and biases by their torch names (the exporter keeps them). The
fp32 twin of an export reads the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ArtifactError
from sidecar.lab.verifier.quantization import import_onnx

__all__ = ["state_from_onnx"]

_EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings")
# the MatMul weights after each layer's Attention node, in graph order
_AFTER_ATTENTION = ("attention.output.dense", "intermediate.dense", "output.dense")


def state_from_onnx(path: Path) -> dict[str, Any]:
    """A ``CrossEncoder`` state dict (torch tensors) with the weights ``path`` computes with.

    Raises ``ArtifactError`` when the file is not an exported verifier of the layout
    this reads (fused attention; int8 weights with a scale, or fp32).
    """
    from sidecar.lab.verifier.ml import torch  # noqa: PLC0415 - the train extra

    onnx = import_onnx()
    from onnx import numpy_helper  # noqa: PLC0415

    graph = onnx.load(str(path)).graph
    values = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    state: dict[str, npt.NDArray[np.float32]] = {
        name: array.astype(np.float32)
        for name, array in values.items()
        if array.dtype == np.float32
        and name.startswith(("encoder.", "head."))
        and not name.endswith("_scale")  # the embedding tables' (below)
    }
    head = state.pop("head.weight_Transposed", None)
    if head is None:
        raise ArtifactError(f"{path}: no head.weight_Transposed initializer (not a verifier)")
    state["head.weight"] = np.ascontiguousarray(head.T)
    for name in _EMBEDDINGS:
        prefix = f"encoder.embeddings.{name}.weight"
        if prefix in state:  # an fp32 file
            continue
        try:
            q, scale, zero = (values[prefix + s] for s in ("_quantized", "_scale", "_zero_point"))
        except KeyError as exc:
            raise ArtifactError(f"{path}: embedding table {name} not int8 with a scale") from exc
        state[prefix] = ((q.astype(np.int32) - int(zero)).astype(np.float32) * scale).astype(
            np.float32
        )
    attention = [n for n in graph.node if n.op_type == "Attention"]
    matmuls = [
        n
        for n in graph.node
        if n.op_type == "MatMul"
        and n.input[1] != "head.weight_Transposed"
        and _constant(n.input[1], values, producer)
    ]
    if not attention or len(matmuls) != 3 * len(attention):
        raise ArtifactError(
            f"{path}: {len(attention)} fused Attention nodes and {len(matmuls)} weight MatMuls; "
            "expected 3 MatMuls per layer (export with fusion)"
        )
    for layer, node in enumerate(attention):
        prefix = f"encoder.encoder.layer.{layer}"
        qkv_w = _folded(node.input[1], values, producer, path)  # (in, 3 * width)
        qkv_b = _folded(node.input[2], values, producer, path)
        width = qkv_w.shape[0]
        for k, part in enumerate(("query", "key", "value")):
            cut = slice(k * width, (k + 1) * width)
            state[f"{prefix}.attention.self.{part}.weight"] = np.ascontiguousarray(qkv_w[:, cut].T)
            state[f"{prefix}.attention.self.{part}.bias"] = qkv_b[cut].astype(np.float32)
        for name, matmul in zip(_AFTER_ATTENTION, matmuls[3 * layer : 3 * layer + 3], strict=True):
            weight = _folded(matmul.input[1], values, producer, path)
            state[f"{prefix}.{name}.weight"] = np.ascontiguousarray(weight.T)
    return {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in state.items()}


def _constant(name: str, values: dict[str, Any], producer: dict[str, Any]) -> bool:
    """Whether ``name`` is computed from initializers alone (a weight, not an activation)."""
    if name in values:
        return True
    node = producer.get(name)
    return (
        node is not None
        and node.op_type in ("Cast", "Mul", "Concat")
        and all(_constant(i, values, producer) for i in node.input if i)
    )


def _folded(
    name: str, values: dict[str, Any], producer: dict[str, Any], path: Path
) -> npt.NDArray[np.float32]:
    """``name``'s fp32 value: an initializer, or ``Cast(q) * scale`` as onnxruntime folds it
    (``q * scale``, rounded once), or a ``Concat`` of such."""
    if name in values:
        return np.asarray(values[name], dtype=np.float32)
    node = producer.get(name)
    if node is None:
        raise ArtifactError(f"{path}: {name} is neither an initializer nor computed")
    args = [_folded(i, values, producer, path) for i in node.input if i]
    if node.op_type == "Cast":
        return args[0].astype(np.float32)
    if node.op_type == "Mul":
        return (args[0] * args[1]).astype(np.float32)
    if node.op_type == "Concat":
        axis = next(a.i for a in node.attribute if a.name == "axis")
        return np.concatenate(args, axis=axis).astype(np.float32)
    raise ArtifactError(f"{path}: {name} comes from {node.op_type}, not a folded weight")
