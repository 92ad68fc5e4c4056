"""Integer arithmetic for the claim verifier, measured: cost, accuracy, and drift on another CPU.

The shipped verifier keeps int8 weights but computes in fp32
(:mod:`sidecar.lab.verifier.quantization` says why). This bench builds what it refuses,
``onnxruntime.quantization.quantize_dynamic`` files that compute the matrix products in
integers (:func:`integer_compute`: u8 activations quantised per pair at run time, s8
weights per tensor or per output channel, 8-bit or 7-bit ``reduce_range``), and
measures each against the shipped file:

* cost: per pair at batch 1 and per claim (five chunks), interleaved call by call with
  the shipped file on one thread (:func:`bench.verifier_latency.measure`), so the ratio
  holds on any machine; the absolutes are this host's;
* accuracy: the raw logit's AUROC per task form on a seeded sample of validation pairs
  (``--per-form`` each), beside the shipped file's on the same pairs, and how far the
  logits move (the files are not recalibrated: the served band would need refitting);
* portability (``--emulate qemu-x86_64``): the same pairs' logits under an emulated CPU
  (``--cpu Haswell``: AVX2 and FMA, no AVX-512, no VNNI; QEMU user mode, ~2 s a pair),
  against this host's, for every variant and for the shipped file as the control.

Usage (one quiet core; needs the train extra's ``onnx``)::

    taskset -c 1 python bench/int8_compute.py --per-form 100 --emulate qemu-x86_64 \\
        --emulate-n 24 --out bench/results/int8_compute.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.verifier_latency import measure
from sidecar.claims.verifier import METADATA_FILE, OnnxVerifier
from sidecar.hashing import sha256_file
from sidecar.lab.bench.ratios import machine
from sidecar.lab.verifier.datasets import CorpusConfig, form_sets
from sidecar.lab.verifier.metrics import auroc_or_nan
from sidecar.lab.verifier.quantization import import_onnx
from sidecar.lab.verifier.sources import read_halueval_qa, split_of
from sidecar.onnxrt import onnxruntime

__all__ = ["VARIANTS", "integer_compute", "main", "sample_pairs"]

# name -> (per-channel weight scales, 7-bit weights)
VARIANTS: dict[str, tuple[bool, bool]] = {
    "int8-tensor": (False, False),
    "int8-channel": (True, False),
    "int8-channel-7bit": (True, True),
}
_FORMS = ("qa", "qa-decl", "sentences", "summaries", "dialogue", "begin")
_EVIDENCE_CHARS = 640  # one served window's worth


def integer_compute(model_dir: Path, out: Path, *, per_channel: bool, reduce_range: bool) -> Path:
    """A verifier directory at ``out`` whose file computes ``model_dir``'s network in integers.

    The shipped file's ``Cast(W_int8) * scale`` weights are folded to fp32 (onnxruntime's
    basic optimisation), then quantised again by ``quantize_dynamic`` with s8 weights. No
    golden outputs (they would not hold); the version says which variant it is.
    """
    ort = onnxruntime()
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    import_onnx()  # the train extra's onnx, with its message when it is missing
    meta = json.loads((model_dir / METADATA_FILE).read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folded = Path(tmp) / "fp32.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        ort.InferenceSession(
            str(model_dir / meta["onnx_file"]), options, providers=["CPUExecutionProvider"]
        )
        quantize_dynamic(
            folded,
            out / meta["onnx_file"],
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            reduce_range=reduce_range,
        )
    shutil.copy(model_dir / meta["tokenizer_file"], out / meta["tokenizer_file"])
    meta["onnx_sha256"] = sha256_file(out / meta["onnx_file"])
    meta.pop("golden", None)
    meta["quantization"] = "int8-dynamic"
    suffix = "-int8c" + ("-pc" if per_channel else "") + ("-7b" if reduce_range else "")
    meta["version"] = f"{meta['version']}{suffix}"[:64]
    (out / METADATA_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return out


def sample_pairs(data_dir: Path, per_form: int, seed: int = 0) -> list[dict[str, Any]]:
    """``per_form`` validation pairs of each form, seeded; evidence cut to one window."""
    sets = form_sets(CorpusConfig(data_dir, seed=0), "val", list(_FORMS))
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for form in _FORMS:
        pairs = list(sets[form])
        rng.shuffle(pairs)
        out += [
            {
                "form": form,
                "claim": p.claim,
                "evidence": p.evidence[:_EVIDENCE_CHARS],
                "question": p.question or "",
                "label": p.label,
            }
            for p in pairs[:per_form]
        ]
    return out


def _logits(model_dir: Path, pairs: Sequence[dict[str, Any]]) -> list[float]:
    verifier = OnnxVerifier.load(model_dir, threads=1)
    z = verifier.logits(
        [(p["claim"], p["evidence"]) for p in pairs], [p["question"] for p in pairs]
    )
    return [float(v) for v in z]


def _emulated(
    qemu: str, cpu: str, dirs: dict[str, Path], pairs: Sequence[dict[str, Any]], tmp: Path
) -> dict[str, list[float]]:
    """Each directory's logits on ``pairs`` computed under ``qemu -cpu cpu``."""
    (tmp / "pairs.json").write_text(json.dumps(list(pairs)), encoding="utf-8")
    spec = {name: str(d) for name, d in dirs.items()}
    (tmp / "dirs.json").write_text(json.dumps(spec), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run(
        [qemu, "-cpu", cpu, sys.executable, __file__, "--logits-of", str(tmp / "dirs.json"),
         "--pairs", str(tmp / "pairs.json"), "--out", str(tmp / "emulated.json")],
        check=True, env=env, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    result: dict[str, list[float]] = json.loads((tmp / "emulated.json").read_text("utf-8"))
    return result


def _form_aurocs(pairs: Sequence[dict[str, Any]], z: Sequence[float]) -> dict[str, float]:
    out = {}
    for form in _FORMS:
        idx = [i for i, p in enumerate(pairs) if p["form"] == form]
        if idx:
            out[form] = round(
                auroc_or_nan([z[i] for i in idx], [pairs[i]["label"] for i in idx]), 4
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/verifier"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--per-form", type=int, default=100, help="validation pairs per form")
    parser.add_argument("--time-n", type=int, default=60, help="claims to time per variant")
    parser.add_argument("--emulate", help="a QEMU user-mode binary (qemu-x86_64) to compare with")
    parser.add_argument("--cpu", default="Haswell", help="the emulated CPU model")
    parser.add_argument("--emulate-n", type=int, default=24, help="pairs to score emulated")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--logits-of", type=Path, help=argparse.SUPPRESS)  # the emulated child
    parser.add_argument("--pairs", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.logits_of is not None:
        pairs = json.loads(args.pairs.read_text(encoding="utf-8"))
        named = json.loads(args.logits_of.read_text(encoding="utf-8"))
        res = {name: _logits(Path(d), pairs) for name, d in named.items()}
        args.out.write_text(json.dumps(res), encoding="utf-8")
        return

    pairs = sample_pairs(args.data_dir, args.per_form)
    records = [r for r in read_halueval_qa(args.data_dir / "halueval" / "qa_data.json")
               if split_of(r.question) == "test"][: args.time_n]  # fmt: skip
    shipped = OnnxVerifier.load(args.model, threads=1)
    base = _logits(args.model, pairs)
    result: dict[str, Any] = {
        "model": shipped.version,
        "machine": platform.machine(),
        **machine(),
        "threads": 1,
        "pairs": len(pairs),
        "note": "ratios are paired call by call with the shipped file; absolutes are this "
        "host's; AUROC of the raw logit on seeded validation pairs (evidence: first 640 chars)",
        "shipped_auroc": _form_aurocs(pairs, base),
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        dirs: dict[str, Path] = {}
        for name, (per_channel, reduce_range) in VARIANTS.items():
            d = integer_compute(
                args.model, Path(tmp) / name, per_channel=per_channel, reduce_range=reduce_range
            )
            dirs[name] = d
            timed, shipped_timed = measure([OnnxVerifier.load(d, threads=1), shipped], records)
            z = _logits(d, pairs)
            moved = np.abs(np.asarray(z) - np.asarray(base))
            result["variants"][name] = {
                "per_channel": per_channel,
                "reduce_range": reduce_range,
                "ratio_to_shipped": timed["paired_ratio_to_baseline"],
                "p50_ms": {k: timed[k]["p50_ms"] for k in ("pair_batch1", "claim_check_k5")},  # type: ignore[index]
                "shipped_p50_ms": {
                    k: shipped_timed[k]["p50_ms"]  # type: ignore[index]
                    for k in ("pair_batch1", "claim_check_k5")
                },
                "auroc": _form_aurocs(pairs, z),
                "logit_moved_vs_shipped": {
                    "mean": round(float(moved.mean()), 4),
                    "max": round(float(moved.max()), 4),
                },
                "_logits": z,
            }
            print(name, json.dumps({k: v for k, v in result["variants"][name].items()
                                    if k != "_logits"}), flush=True)  # fmt: skip
        if args.emulate:
            n = args.emulate_n
            subset = pairs[:: max(1, len(pairs) // n)][:n]
            index = [pairs.index(p) for p in subset]
            emulated = _emulated(
                args.emulate, args.cpu, {"shipped": args.model, **dirs}, subset, Path(tmp)
            )
            native = {"shipped": [base[i] for i in index]} | {
                name: [result["variants"][name]["_logits"][i] for i in index] for name in dirs
            }
            result["emulated"] = {"cpu": args.cpu, "pairs": len(subset), "drift": {}}
            for name, z in emulated.items():
                d = np.abs(np.asarray(z) - np.asarray(native[name]))
                result["emulated"]["drift"][name] = {
                    "max": float(d.max()),
                    "pairs_over_1e-4": int((d > 1e-4).sum()),
                    "per_pair": [round(float(v), 6) for v in d],
                }
                print("emulated", args.cpu, name, json.dumps(result["emulated"]["drift"][name]))
    for v in result["variants"].values():
        v.pop("_logits")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
