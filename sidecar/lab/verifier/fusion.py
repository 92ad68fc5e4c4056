"""One fused ``Attention`` node per encoder layer: the verifier's self-attention in one kernel.

``torch.onnx.export`` writes BERT's self-attention (``scaled_dot_product_attention``)
as some thirty nodes per layer: the Q, K and V projections, reshapes and
transposes to heads, Q and K each scaled by ``head_size ** -0.25``, ``MatMul``,
the additive mask, ``Softmax``, an ``IsNaN``/``Where`` guard for rows that
attend to nothing, the context ``MatMul`` and the transposes back. onnxruntime
runs them one by one: its graph optimiser (and ``onnxruntime.transformers``)
does not recognise this form.

:func:`fuse_attention` replaces each such block with onnxruntime's
``com.microsoft.Attention`` (in the standard CPU wheel): the three projection
weights concatenated along their output axis, the three biases likewise, and
the raw ``attention_mask`` (cast to int32) as its mask. The weights stay
whatever the block read (an initializer, or the int8 ``Cast * scale`` products of
:mod:`sidecar.lab.verifier.quantization`); onnxruntime folds them into one
matrix when the session starts. The arithmetic is the same up to rounding; the
function checks that on a padded batch before it returns, and refuses a graph
with a softmax it cannot account for rather than ship it half fused. (One
input differs by construction: a row whose mask is all zeros gets zeros from
the export's guard and a plain average from ``Attention``; the verifier never
sends one, as every pair starts with ``[CLS]``.)
Measurements are in ``models/verifier/MODEL_CARD.md``. Needs the ``onnx``
package (train extra); the serving path never imports this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from sidecar.exceptions import ArtifactError
from sidecar.lab.verifier.quantization import import_onnx, prune_graph
from sidecar.onnxrt import onnxruntime

__all__ = ["FUSED_LOGIT_TOLERANCE", "fuse_attention"]

MASK_INPUT: Final = "attention_mask"
FUSED_LOGIT_TOLERANCE: Final = 1e-4  # max |logit| fused vs unfused on the check batch
_MASK_INT32: Final = "attention_mask_int32"
_TO_HEADS: Final = [0, 2, 1, 3]  # (batch, seq, heads, size) <-> (batch, heads, seq, size)
_KEY_TO_HEADS: Final = [0, 2, 3, 1]  # K transposed for Q @ K^T


@dataclass(frozen=True, slots=True)
class _Block:
    """One matched self-attention: what the fused node reads and the name it writes."""

    name: str
    hidden: str  # the layer input all three projections read
    weights: tuple[str, str, str]  # Q, K, V
    biases: tuple[str, str, str]
    num_heads: int
    output: str  # the (batch, seq, hidden) context, read by the layer's output projection


class _Graph:
    """Producers, consumers and constants of an ONNX graph, for matching."""

    def __init__(self, graph: Any, numpy_helper: Any) -> None:
        self.graph = graph
        self.inits = {i.name: i for i in graph.initializer}
        self.inputs = {i.name for i in graph.input}
        self.producer = {o: n for n in graph.node for o in n.output}
        self.users: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.users.setdefault(name, []).append(node)
        self._np = numpy_helper

    def node(self, value: str, op: str, where: str) -> Any:
        """The node computing ``value``, which must be an ``op``."""
        node = self.producer.get(value)
        if node is None or node.op_type != op:
            found = "a graph input or initializer" if node is None else node.op_type
            raise ArtifactError(f"{where}: expected {op} computing {value}, found {found}")
        return node

    def only_user(self, value: str, op: str | None, where: str) -> Any:
        """The one node reading ``value``'s values (an ``op`` when given; Shape nodes aside)."""
        users = [u for u in self.users.get(value, []) if u.op_type != "Shape"]
        if len(users) != 1 or op not in (None, users[0].op_type):
            found = [u.op_type for u in users]
            raise ArtifactError(
                f"{where}: expected {value} read by one {op or 'node'}, read by {found}"
            )
        return users[0]

    def constant(self, value: str) -> np.ndarray[Any, Any] | None:
        """The value of an initializer or a ``Constant`` (or a copy of one); None otherwise."""
        if value in self.inits:
            return np.asarray(self._np.to_array(self.inits[value]))
        node = self.producer.get(value)
        if node is not None and node.op_type == "Identity":  # torch's copy of an equal tensor
            return self.constant(node.input[0])
        if node is not None and node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    return np.asarray(self._np.to_array(attr.t))
        return None

    def reads_only_constants(self, value: str) -> bool:
        """``value`` is an initializer or computed from initializers alone (folded at load)."""
        if value in self.inits:
            return True
        node = self.producer.get(value)
        if node is None:
            return False
        return all(self.reads_only_constants(i) for i in node.input if i)

    def graph_inputs_behind(self, value: str) -> set[str]:
        """The graph inputs whose values ``value`` is computed from (not only their shapes)."""
        seen: set[str] = set()
        found: set[str] = set()
        stack = [value]
        while stack:
            name = stack.pop()
            if name in seen or not name:
                continue
            seen.add(name)
            if name in self.inputs:
                found.add(name)
            elif name in self.producer and self.producer[name].op_type != "Shape":
                stack.extend(self.producer[name].input)  # a Shape reads no values
        return found


def _perm(node: Any) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), [])


def _projection(g: _Graph, to_heads: Any, where: str) -> tuple[str, str, str, int, int]:
    """``Reshape(MatMul(x, W) + b, (batch, seq, heads, size))``: x, W, b, heads, size."""
    reshape = g.node(to_heads.input[0], "Reshape", where)
    shape = g.node(reshape.input[1], "Concat", where)
    heads, size = (g.constant(i) for i in shape.input[-2:])
    if len(shape.input) != 4 or heads is None or size is None or int(size.item()) <= 0:
        raise ArtifactError(f"{where}: {reshape.name} does not split the hidden axis into heads")
    add = g.node(reshape.input[0], "Add", where)
    matmuls = [
        g.producer[i] for i in add.input if i in g.producer and g.producer[i].op_type == "MatMul"
    ]
    biases = [i for i in add.input if g.constant(i) is not None]
    if len(matmuls) != 1 or len(biases) != 1:
        raise ArtifactError(f"{where}: {add.name} is not a projection's MatMul + bias")
    x, weight = matmuls[0].input
    if not g.reads_only_constants(weight):
        raise ArtifactError(f"{where}: {matmuls[0].name}'s weight {weight} is not a constant")
    bias = g.constant(biases[0])
    width = 0 if bias is None or bias.ndim != 1 else bias.shape[0]
    n_heads, head_size = divmod(width, int(size.item()))
    if head_size or int(heads.item()) not in (-1, n_heads):  # -1: as many as the width holds
        raise ArtifactError(
            f"{where}: bias {biases[0]} ({width} wide) is not {heads.item()} heads of {size.item()}"
        )
    return x, weight, biases[0], n_heads, int(size.item())


def _match(g: _Graph, softmax: Any) -> _Block:
    """The self-attention block around ``softmax``; ArtifactError naming what is not there."""
    where = f"attention at {softmax.name}"
    masked = g.node(softmax.input[0], "Add", where)
    scores = [
        g.producer[i] for i in masked.input if i in g.producer and g.producer[i].op_type == "MatMul"
    ]
    if len(scores) != 1:
        raise ArtifactError(f"{where}: {masked.name} does not add a mask to Q @ K^T")
    (mask_bias,) = [i for i in masked.input if i != scores[0].output[0]]
    if g.graph_inputs_behind(mask_bias) != {MASK_INPUT}:
        raise ArtifactError(f"{where}: the additive mask is not computed from {MASK_INPUT} alone")
    q_scaled, k_scaled = (g.node(i, "Mul", where) for i in scores[0].input)
    scales, heads_in = [], []
    for scaled, perm in ((q_scaled, _TO_HEADS), (k_scaled, _KEY_TO_HEADS)):
        factors = [c for c in (g.constant(i) for i in scaled.input) if c is not None]
        transposed = [i for i in scaled.input if g.constant(i) is None]
        if len(factors) != 1 or factors[0].size != 1 or len(transposed) != 1:
            raise ArtifactError(f"{where}: {scaled.name} is not a scale of Q or K")
        factor = factors[0]
        to_heads = g.node(transposed[0], "Transpose", where)
        if _perm(to_heads) != perm:
            raise ArtifactError(f"{where}: {to_heads.name} has perm {_perm(to_heads)}, not {perm}")
        scales.append(float(factor.item()))
        heads_in.append(to_heads)
    # Softmax -> [IsNaN/Where guard: a row that attends to nothing is zero] -> probs @ V
    probs = softmax.output[0]
    guard = [u for u in g.users.get(probs, []) if u.op_type == "Where"]
    if guard:
        probs = guard[0].output[0]
    context = g.only_user(probs, "MatMul", where)
    v_heads = g.node(context.input[1], "Transpose", where)
    if _perm(v_heads) != _TO_HEADS:
        raise ArtifactError(f"{where}: {v_heads.name} has perm {_perm(v_heads)}, not {_TO_HEADS}")
    # back from heads: [Reshape to the same shape] -> Transpose -> Reshape (batch, seq, hidden)
    node = g.only_user(context.output[0], None, where)
    if node.op_type == "Reshape":
        node = g.only_user(node.output[0], None, where)
    if node.op_type != "Transpose" or _perm(node) != _TO_HEADS:
        raise ArtifactError(f"{where}: {node.name} is not a Transpose back from heads")
    merge = g.only_user(node.output[0], "Reshape", where)
    projections = [_projection(g, t, where) for t in (*heads_in, v_heads)]
    (x, _, _, heads, size), *_ = projections
    if {(p[0], p[3], p[4]) for p in projections} != {(x, heads, size)}:
        raise ArtifactError(f"{where}: Q, K and V do not read one input split into equal heads")
    merged = g.constant(g.node(merge.input[1], "Concat", where).input[-1])
    if merged is None or int(merged.item()) not in (-1, heads * size):
        raise ArtifactError(f"{where}: {merge.name} does not merge {heads} heads of {size}")
    if not math.isclose(scales[0] * scales[1], 1 / math.sqrt(size), rel_tol=1e-5):
        raise ArtifactError(
            f"{where}: Q and K are scaled by {scales[0] * scales[1]:.6g} in all, "
            f"not 1/sqrt(head size {size})"
        )
    return _Block(
        name=softmax.name.rsplit("/", 1)[0] or softmax.name,
        hidden=x,
        weights=(projections[0][1], projections[1][1], projections[2][1]),
        biases=(projections[0][2], projections[1][2], projections[2][2]),
        num_heads=heads,
        output=merge.output[0],
    )


def _fused_nodes(block: _Block, helper: Any) -> list[Any]:
    p = block.name
    return [
        helper.make_node(
            "Concat", list(block.weights), [f"{p}/qkv_weight"], axis=1, name=f"{p}/qkv_weight"
        ),
        helper.make_node(
            "Concat", list(block.biases), [f"{p}/qkv_bias"], axis=0, name=f"{p}/qkv_bias"
        ),
        helper.make_node(
            "Attention",
            [block.hidden, f"{p}/qkv_weight", f"{p}/qkv_bias", _MASK_INT32],
            [block.output],
            name=f"{p}/Attention",
            domain="com.microsoft",
            num_heads=block.num_heads,
        ),
    ]


def fuse_attention(unfused: Path, out: Path) -> int:
    """``unfused`` with each self-attention as one ``Attention`` node, to ``out``; blocks fused.

    Every ``Softmax`` of the graph must be such a block: ArtifactError names the
    first one that is not (nothing is written), and when the fused file's logits
    differ from the unfused one's by more than :data:`FUSED_LOGIT_TOLERANCE`.
    """
    onnx = import_onnx()
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415

    model = onnx.load(str(unfused))
    graph = model.graph
    g = _Graph(graph, numpy_helper)
    if MASK_INPUT not in g.inputs:
        raise ArtifactError(f"{unfused} has no {MASK_INPUT} input for the fused attention's mask")
    softmaxes = [n for n in graph.node if n.op_type == "Softmax"]
    if not softmaxes:
        raise ArtifactError(f"{unfused} has no self-attention (Softmax) to fuse")
    blocks = {b.output: b for b in (_match(g, s) for s in softmaxes)}
    mask = helper.make_node(
        "Cast", [MASK_INPUT], [_MASK_INT32], to=TensorProto.INT32, name=_MASK_INT32
    )
    nodes = [mask]
    for node in graph.node:  # each block in place of its last node: the order stays topological
        block = blocks.get(node.output[0]) if len(node.output) == 1 else None
        nodes.extend(_fused_nodes(block, helper) if block is not None else [node])
    prune_graph(graph, nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    drift = _max_logit_difference(unfused, out, [i.name for i in graph.input])
    if drift > FUSED_LOGIT_TOLERANCE:
        out.unlink()
        raise ArtifactError(
            f"fusing the attention of {unfused} moved a logit by {drift:.3g}, "
            f"more than {FUSED_LOGIT_TOLERANCE}: the fused file was not kept"
        )
    return len(blocks)


def _max_logit_difference(a: Path, b: Path, inputs: list[str]) -> float:
    """max |output| difference of two files on a padded batch of random token ids."""
    ort = onnxruntime()

    rng = np.random.default_rng(0)
    lengths = np.array([40, 17, 3, 40])
    feed = {
        "input_ids": rng.integers(1000, 5000, size=(len(lengths), 40)),
        MASK_INPUT: (np.arange(40)[None, :] < lengths[:, None]).astype(np.int64),
        "token_type_ids": (np.arange(40)[None, :] >= lengths[:, None] // 2).astype(np.int64),
    }
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    outputs = [
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(
            None, {name: feed[name] for name in inputs}
        )[0]
        for path in (a, b)
    ]
    return float(np.max(np.abs(outputs[0] - outputs[1])))
