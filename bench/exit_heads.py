"""Could the verifier stop early? Exit heads on the shipped network's lower layers (not timed).

A pair's cost is about proportional to the layers it runs through (docs/methods.md,
"Fewer layers"), so an early exit — stop after layer ``k`` when a head on that layer
is sure, run the rest otherwise — would cut the mean cost without a new network. This
measures how sure such heads can be on the shipped network as it is (frozen): the
served ONNX file gets, after each of its lower layers, a copy of the final head's
feature block (the pooled claim and evidence vectors, their difference, product,
cosine and token-alignment features: everything the final linear head reads, computed
from that layer's output), and a logistic regression per layer is fitted on seeded
training pairs (standardised features) and scored on validation pairs, against the
label and against the full network's decision (logit > 0). Per layer: validation
AUROC, and the smallest ``|z|`` at which the head's exits agree with the full
network on at least ``--agreement`` of the exited pairs, with the share that exits
(none when no threshold gets there).

    .venv/bin/python bench/exit_heads.py --corpus WORK_DIR/corpus --train 6000 \\
        --out bench/results/exit_heads.json

``--corpus``: a corpus written by ``guardrail train verifier --work-dir WORK_DIR``
(its training and validation pairs, evidence already windowed as the network reads
it). Needs the train extra (onnx, scikit-learn).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from sidecar.claims.verifier import OnnxVerifier, PairEncoder
from sidecar.lab.verifier.datasets import read_corpus
from sidecar.lab.verifier.sources import Pair
from sidecar.onnxrt import onnxruntime

LAYER_OUT = "/encoder/encoder/layer.{k}/output/LayerNorm/LayerNormalization_output_0"
FEATURES = "/Concat_1_output_0"  # what the final head (``/head/Gemm``) reads


def probe_model(model: Path, out: Path) -> list[str]:
    """``model`` with the head's feature block copied after every layer but the last;
    writes it to ``out`` and returns its outputs (logits, final features, layer 0..n-2)."""
    import onnx  # noqa: PLC0415 - the train extra

    m = onnx.load(str(model))
    graph = m.graph
    nodes = list(graph.node)
    layers = sum(1 for n in nodes if n.op_type == "Attention")
    last = LAYER_OUT.format(k=layers - 1)
    start = next(i for i, n in enumerate(nodes) if last in n.output) + 1
    tail = [n for n in nodes[start:] if not n.name.startswith("/head") and n.name != "/Squeeze"]
    made = {o for n in tail for o in n.output}
    outputs = ["logits", FEATURES]
    for k in range(layers - 1):
        src = LAYER_OUT.format(k=k)
        for node in tail:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}@{k}"
            copy.input[:] = [
                src if i == last else (f"{i}@{k}" if i in made else i) for i in node.input
            ]
            copy.output[:] = [f"{o}@{k}" for o in node.output]
            graph.node.append(copy)
        outputs.append(f"{FEATURES}@{k}")
    for name in outputs[1:]:
        graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    onnx.save(m, str(out))
    return outputs


def served_encoder(verifier: OnnxVerifier, model_dir: Path) -> PairEncoder:
    """The tokenizer and length ``verifier`` encodes its pairs with (read once)."""
    artifact = verifier.artifact
    return PairEncoder.from_file(model_dir / artifact.tokenizer_file, artifact.max_length)


def features(
    verifier: OnnxVerifier,
    encoder: PairEncoder,
    session: Any,
    outputs: Sequence[str],
    pairs: Sequence[Pair],
    *,
    desc: str,
) -> list[npt.NDArray[np.float32]]:
    """Every output of the probe for each pair, one pair at a time (as served)."""
    names = {i.name for i in session.get_inputs()}
    texts = verifier.inputs([(p.claim, p.evidence) for p in pairs], [p.question for p in pairs])
    rows: list[list[npt.NDArray[np.float32]]] = [[] for _ in outputs]
    feeds = encoder.encode_each(texts)  # as OnnxVerifier.logits encodes them
    for feed in tqdm(feeds, total=len(texts), desc=desc, unit="pair", mininterval=10):
        got = session.run(list(outputs), {k: v for k, v in feed.items() if k in names})
        for row, value in zip(rows, got, strict=True):
            row.append(np.asarray(value, dtype=np.float32).reshape(-1))
    return [np.stack(row) for row in rows]


def exit_threshold(
    z: npt.NDArray[np.float64], final: npt.NDArray[np.bool_], agreement: float
) -> dict[str, float] | None:
    """The smallest ``|z|`` whose exits agree with the full network on >= ``agreement``."""
    for t in np.linspace(0.0, 8.0, 161):
        exits = np.abs(z) >= t
        if not exits.any():
            return None
        if ((z[exits] > 0) == final[exits]).mean() >= agreement:
            return {"abs_z": round(float(t), 2), "exit_share": round(float(exits.mean()), 4)}
    return None


def main() -> None:
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415 - the train extra
    from sklearn.metrics import roc_auc_score  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=Path("models/verifier"))
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--train", type=int, default=6000, help="training pairs (seeded)")
    parser.add_argument("--val", type=int, default=0, help="validation pairs (0: all)")
    parser.add_argument("--agreement", type=float, default=0.98)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/exit_heads.json"))
    args = parser.parse_args()

    ort = onnxruntime()

    verifier = OnnxVerifier.load(args.model_dir, threads=1)
    corpus = read_corpus(args.corpus)
    rng = random.Random(args.seed)
    train = rng.sample(corpus.train, min(args.train, len(corpus.train)))
    val = corpus.val if not args.val else rng.sample(corpus.val, min(args.val, len(corpus.val)))
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        outputs = probe_model(args.model_dir / verifier.artifact.onnx_file, path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        encoder = served_encoder(verifier, args.model_dir)
        tr = features(verifier, encoder, session, outputs, train, desc="train")
        va = features(verifier, encoder, session, outputs, val, desc="val")
    y_tr = np.array([p.label for p in train])
    y_va = np.array([p.label for p in val])
    final_tr, final_va = tr[0].reshape(-1) > 0, va[0].reshape(-1) > 0
    report: dict[str, Any] = {
        "model": verifier.version,
        "train_pairs": len(train),
        "val_pairs": len(val),
        "agreement": args.agreement,
        "full_network_val_auroc": round(float(roc_auc_score(y_va, va[0].reshape(-1))), 4),
        "layers": {},
    }
    for k in range(len(outputs) - 2):
        x_tr, x_va = tr[k + 2], va[k + 2]
        mu, sd = x_tr.mean(axis=0), x_tr.std(axis=0) + 1e-6
        row: dict[str, Any] = {}
        for target, y in (("label", y_tr), ("full_network", final_tr.astype(int))):
            head = LogisticRegression(C=1.0, max_iter=2000).fit((x_tr - mu) / sd, y)
            z = head.decision_function((x_va - mu) / sd)
            row[f"fit_to_{target}"] = {
                "val_auroc": round(float(roc_auc_score(y_va, z)), 4),
                "exit": exit_threshold(z, final_va, args.agreement),
            }
        report["layers"][f"after_{k + 1}_of_{len(outputs) - 1}"] = row
        print(k + 1, json.dumps(row), flush=True)
    report["seconds"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
