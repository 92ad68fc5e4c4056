"""What a claim verifier of this width costs at each depth (not a timed test): writes JSON.

The shipped verifier (MiniLM-L6 width: 384 hidden, 1,536 feed-forward) cut to its first
K encoder layers, the classifier head reading layer K instead of layer 6
(:func:`cut_to_depth`). The cut network is untrained for that head (its probabilities
mean nothing); its cost is that of any K-layer network of this width with the shipped
tokenizer, input length and int8-weights file, which is what a shallower student would
cost once trained. Each depth is timed against the shipped file, interleaved call by call
(:func:`bench.verifier_latency.measure`: per pair at batch 1 and 8, per claim with five
chunks), so the ratio holds on any machine; the absolute numbers are this machine's.

Usage (pin one core of a quiet machine, e.g. ``taskset -c 1``)::

    python bench/verifier_depth_cost.py --depths 1 2 3 --n 60 --out depth_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.verifier_latency import measure
from sidecar.claims.verifier import METADATA_FILE, OnnxVerifier
from sidecar.hashing import sha256_file
from sidecar.lab.verifier.quantization import import_onnx, prune_graph
from sidecar.lab.verifier.sources import read_halueval_qa, split_of

__all__ = ["cut_to_depth", "main"]

_LAYER_OUT = "/encoder/encoder/layer.{}/output/LayerNorm/LayerNormalization_output_0"
_LAYER_PREFIX = "/encoder/encoder/layer."


def cut_to_depth(model_dir: Path, depth: int, out: Path, *, max_length: int | None = None) -> Path:
    """A verifier directory at ``out``: ``model_dir``'s network cut to its first ``depth``
    layers (no golden outputs: they would not hold), ``max_length`` tokens if given."""
    onnx = import_onnx()
    meta = json.loads((model_dir / METADATA_FILE).read_text(encoding="utf-8"))
    model = onnx.load(str(model_dir / meta["onnx_file"]))
    layers = {n.name.split("/")[3] for n in model.graph.node if n.name.startswith(_LAYER_PREFIX)}
    if not 1 <= depth < len(layers):
        raise ValueError(f"depth {depth}: the network has {len(layers)} layers")
    last, cut = _LAYER_OUT.format(len(layers) - 1), _LAYER_OUT.format(depth - 1)
    rewired = 0
    for node in model.graph.node:
        if node.name.startswith(_LAYER_PREFIX):
            continue
        for i, name in enumerate(node.input):
            if name == last:
                node.input[i] = cut
                rewired += 1
    if not rewired:
        raise ValueError(f"no node outside the encoder reads {last}: not the shipped layout")
    prune_graph(model.graph, list(model.graph.node))
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out / meta["onnx_file"]))
    shutil.copy(model_dir / meta["tokenizer_file"], out / meta["tokenizer_file"])
    meta["onnx_sha256"] = sha256_file(out / meta["onnx_file"])
    meta.pop("golden", None)
    meta["version"] = f"{meta['version']}-depth{depth}"[:64]
    if max_length is not None:
        meta["max_length"] = max_length
    (out / METADATA_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/verifier"))
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--max-length", type=int, nargs="+", default=[], help="also time depth 1 at these lengths"
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data/halueval/qa_data.json"))
    parser.add_argument("--n", type=int, default=60, help="claims to time per depth")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    records = [r for r in read_halueval_qa(args.data) if split_of(r.question) == "test"][: args.n]
    shipped = OnnxVerifier.load(args.model, threads=1)
    runs: list[tuple[str, int, int | None]] = [(f"depth{k}", k, None) for k in args.depths]
    runs += [(f"depth1-{n}tok", 1, n) for n in args.max_length]
    result: dict[str, Any] = {
        "model": shipped.version,
        "max_length": shipped.artifact.max_length,
        "threads": 1,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "note": "ratios are paired call by call with the shipped file; absolutes are this host's",
        "depths": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, depth, length in runs:
            cut = cut_to_depth(args.model, depth, Path(tmp) / name, max_length=length)
            model, base = measure([OnnxVerifier.load(cut, threads=1), shipped], records)
            result["depths"][name] = {
                "layers": depth,
                "max_length": length or shipped.artifact.max_length,
                "ratio_to_shipped": model["paired_ratio_to_baseline"],
                "p50_ms": {k: model[k]["p50_ms"] for k in ("pair_batch1", "claim_check_k5")},  # type: ignore[index]
                "shipped_p50_ms": {
                    k: base[k]["p50_ms"]  # type: ignore[index]
                    for k in ("pair_batch1", "claim_check_k5")
                },
            }
            print(name, json.dumps(result["depths"][name]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
