"""Int8 weights, fp32 arithmetic: the verifier's ONNX file that computes the same on every x86 CPU.

``onnxruntime.quantization.quantize_dynamic`` (u8 activations x s8 weights)
computes every matrix product in integers, and those integers depend on the
CPU and on the batch:

* without VNNI (AVX2, AVX-512BW) onnxruntime multiplies with ``vpmaddubsw``,
  whose int16 pair sums saturate; the shipped int8 verifier's logits moved by
  up to 3.2 under an emulated AVX2 CPU, which turned most verdicts into
  "unsupported". ``reduce_range`` (7-bit weights) avoids the saturation but
  still moved them by up to 0.1; per output channel, on 24 validation pairs under
  an emulated Haswell, 17 stayed within 2e-06 and 7 moved by 3.6e-04 to 0.11 (the
  integer products are exact there; the fp32 around them is not), for 0.435 of the
  time per pair (``bench/int8_compute.py``, docs/methods.md);
* the activation scale is one per tensor, computed over the whole batch, so a
  pair's logit depends on the other pairs and the padding of its batch (up to
  0.36 on the shipped model).

:func:`int8_weights_fp32_compute` keeps the int8 weights (a quarter of the fp32
file) and computes in fp32: every ``DynamicQuantizeLinear -> MatMulInteger ->
Cast -> Mul`` block becomes ``MatMul(A, Cast(W_int8) * scale)``. The ``Cast``
and the ``Mul`` read only initializers, so onnxruntime folds them into one fp32
weight matrix when the session starts (the same ``(q - 0) * scale`` products,
rounded once, on every CPU), and the products are fp32 GEMMs whose results
differ across instruction sets only in the last bits. Measurements are in
``models/verifier/MODEL_CARD.md``. Needs the ``onnx`` package (train extra);
the serving path never imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from sidecar.exceptions import ArtifactError, ConfigError

__all__ = ["QUANTIZATION", "import_onnx", "int8_weights_fp32_compute", "prune_graph"]

QUANTIZATION: Final = "int8-weights"  # VerifierArtifact.quantization of such a file
_QUANTIZED: Final = "_quantized"


def prune_graph(graph: Any, nodes: Iterable[Any]) -> None:
    """Give ``graph`` the ``nodes`` (in order) and initializers some graph output still
    needs; the others are dropped."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(list(nodes)):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    initializers = [i for i in graph.initializer if i.name in needed]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def import_onnx() -> Any:
    try:
        import onnx  # noqa: PLC0415 - the train extra, imported on use
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "rewriting the verifier's ONNX file needs onnx: "
            "pip install 'rag-guardrail-sidecar[train]'"
        ) from exc
    return onnx


def int8_weights_fp32_compute(dynamic_int8: Path, out: Path) -> int:
    """Rewrite a ``quantize_dynamic`` file to fp32 products of its int8 weights; blocks rewritten.

    Weights must be symmetric (zero point 0: ``weight_type=QInt8``). Nodes that
    no output needs any more (the activation quantisers) are dropped.
    """
    onnx = import_onnx()
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    model = onnx.load(str(dynamic_int8))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    users: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    replaced: dict[int, list[Any]] = {}
    dropped: set[int] = set()
    for node in graph.node:
        if node.op_type != "MatMulInteger":
            continue
        a_quantized, w_quantized, _, w_zero = node.input
        base = w_quantized.removesuffix(_QUANTIZED)
        if w_quantized not in inits or f"{base}_scale" not in inits:
            raise ArtifactError(f"{node.name}: weight {w_quantized} is not an initializer")
        if numpy_helper.to_array(inits[w_zero]).any():
            raise ArtifactError(f"{node.name}: weights are not symmetric (zero point != 0)")
        (cast,) = users[node.output[0]]
        (scale_mul,) = users[cast.output[0]]
        if cast.op_type != "Cast" or scale_mul.op_type != "Mul":
            raise ArtifactError(f"{node.name}: not a quantize_dynamic MatMulInteger block")
        activation = producer[a_quantized].input[0]
        replaced[id(node)] = [
            helper.make_node(
                "Cast",
                [w_quantized],
                [f"{base}_as_float"],
                to=TensorProto.FLOAT,
                name=f"{base}_cast",
            ),
            helper.make_node(
                "Mul", [f"{base}_as_float", f"{base}_scale"], [f"{base}_fp32"], name=f"{base}_scale"
            ),
            helper.make_node(
                "MatMul",
                [activation, f"{base}_fp32"],
                [scale_mul.output[0]],
                name=f"{node.name}_fp32",
            ),
        ]
        dropped.update({id(cast), id(scale_mul)})
    if not replaced:
        raise ArtifactError(f"{dynamic_int8} has no MatMulInteger block to rewrite")
    nodes = [
        new
        for node in graph.node
        if id(node) not in dropped
        for new in replaced.get(id(node), [node])
    ]
    prune_graph(graph, nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return len(replaced)
