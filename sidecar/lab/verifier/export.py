"""Export and its checks: fp32 and int8 ONNX, torch/ONNX parity, the int8 gate, held-out scores.

:func:`write_onnx` writes ``model.onnx`` with ``torch.onnx.export`` and
``model.int8.onnx`` with int8 weights whose per-channel scales are computed
in fp32 (:mod:`sidecar.lab.verifier.quantization`), each with its
self-attention fused into onnxruntime's ``Attention`` kernel
(:mod:`sidecar.lab.verifier.fusion`); int8 is shipped only
when its held-out accuracy is no more than ``int8_tolerance`` below fp32
(AUROC no more than twice that below) on every set (:func:`int8_holds`).
Being better than fp32 is not a reason to refuse it.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from sidecar.claims.calibration import Band, Platt, coverage
from sidecar.claims.verifier import OnnxVerifier, PairEncoder
from sidecar.exceptions import ArtifactError
from sidecar.lab.verifier.evaluate import evaluate_pairs
from sidecar.lab.verifier.fusion import fuse_attention
from sidecar.lab.verifier.metrics import auroc_or_nan
from sidecar.lab.verifier.ml import TracerWarning, torch
from sidecar.lab.verifier.model import CrossEncoder
from sidecar.lab.verifier.quantization import int8_weights_fp32_compute
from sidecar.lab.verifier.settings import FP32_FILE, INPUTS, INT8_FILE, TOKENIZER_FILE
from sidecar.lab.verifier.sources import Pair
from sidecar.onnxrt import onnxruntime


class LogitSource(Protocol):
    """What the parity check needs of the torch side (``VerifierTrainer`` has it)."""

    def logits(
        self, pairs: Sequence[tuple[str, str]], questions: Sequence[str] | None = None
    ) -> np.ndarray[Any, np.dtype[np.float64]]: ...


__all__ = [
    "evaluate_onnx",
    "int8_holds",
    "onnx_parity",
    "score_sets",
    "torch_export",
    "write_onnx",
]

HEAD_NODE: Final = "/head/Gemm_MatMul"  # CrossEncoder.head once the quantiser split its Gemm


def torch_export(model: CrossEncoder, base_model_dir: Path, out: Path) -> Path:
    """``model`` as torch writes it (fp32, attention unfused) to ``out``."""
    arrays = PairEncoder.from_file(base_model_dir / TOKENIZER_FILE, 32).encode(
        [("a claim", "some evidence text")] * 2
    )
    dummy = {name: torch.from_numpy(arr) for name, arr in arrays.items()}
    axes = {n: {0: "batch", 1: "sequence"} for n in INPUTS} | {"logits": {0: "batch"}}
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of torch.export's, which needs
        # onnxscript (not in the [ml] extra); this plain BERT graph exports the same.
        # Its deprecation notices and tracer notes are silenced for this call only.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", TracerWarning)
        warnings.filterwarnings("ignore", "Exporting aten::index operator", UserWarning)
        torch.onnx.export(
            model,
            (dummy["input_ids"], dummy["attention_mask"], dummy["token_type_ids"]),
            str(out),
            input_names=INPUTS,
            output_names=["logits"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    return out


def write_onnx(model: CrossEncoder, base_model_dir: Path, out_dir: Path) -> Path:
    """``model.onnx``, ``model.int8.onnx`` and the tokenizer into ``out_dir``; the fp32 path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    unfused = {name: out_dir / f"{Path(name).stem}.unfused.onnx" for name in (FP32_FILE, INT8_FILE)}
    torch_export(model, base_model_dir, unfused[FP32_FILE])
    onnxruntime()  # its telemetry off before the package's first import
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    # Per-channel int8 weight scales (per tensor missed the accuracy gate on length-matched
    # QA), computed in fp32: dynamic u8 x s8 products depend on the CPU's instruction set
    # and on the batch (sidecar.lab.verifier.quantization). The head (1539 weights) stays fp32.
    dynamic = out_dir / "model.dynamic-int8.onnx"
    quantize_dynamic(
        str(unfused[FP32_FILE]),
        str(dynamic),
        weight_type=QuantType.QInt8,
        per_channel=True,
        nodes_to_exclude=[HEAD_NODE],
    )
    int8_weights_fp32_compute(dynamic, unfused[INT8_FILE])
    dynamic.unlink()
    # Both files, as either may ship: one Attention node per layer (sidecar.lab.verifier.fusion;
    # the saving is in the model card). A graph it cannot fuse fails the export (ArtifactError).
    for name, path in unfused.items():
        fuse_attention(path, out_dir / name)
        path.unlink()
    shutil.copyfile(base_model_dir / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)
    return out_dir / FP32_FILE


def int8_holds(
    fp32: dict[str, dict[str, float | int | str]],
    int8: dict[str, dict[str, float | int | str]],
    tolerance: float,
) -> bool:
    """int8 loses at most ``tolerance`` accuracy (twice it in AUROC) against fp32 on every set.

    One-sided: a quantised model that scores better on a small set is kept.
    """
    return all(
        float(fp32[k]["accuracy"]) - float(int8[k]["accuracy"]) <= tolerance
        and float(fp32[k]["auroc"]) - float(int8[k]["auroc"]) <= 2 * tolerance
        for k in fp32
    )


def onnx_parity(
    trainer: LogitSource, out_dir: Path, pairs: Sequence[Pair]
) -> dict[str, float | int | str]:
    """max |logit difference| torch vs ONNX fp32 and vs int8 on validation pairs."""
    texts = [(p.claim, p.evidence) for p in pairs]
    questions = [p.question for p in pairs]
    torch_z = trainer.logits(texts, questions)
    out: dict[str, float | int | str] = {"pairs": len(pairs)}
    for name in (FP32_FILE, INT8_FILE):
        z = OnnxVerifier.load(out_dir, onnx_file=name).logits(texts, questions)
        if z.shape != torch_z.shape:
            raise ArtifactError(f"{name} returned shape {z.shape}, torch {torch_z.shape}")
        out[f"max_abs_logit_diff_{name}"] = round(float(np.max(np.abs(z - torch_z))), 5)
    return out


def evaluate_onnx(
    out_dir: Path, onnx_name: str, sets: dict[str, list[Pair]], platt: Platt, band: Band
) -> dict[str, dict[str, float | int | str]]:
    """Each set scored by one ONNX file: calibrated numbers, logit-only and coverage-only AUROC."""
    verifier = OnnxVerifier.load(out_dir, onnx_file=onnx_name, calibration=platt, band=band)
    metrics: dict[str, dict[str, float | int | str]] = {}
    for name, pairs in sets.items():
        if not pairs:
            continue
        started = time.perf_counter()
        metrics[name] = evaluate_pairs(verifier.probabilities, pairs, band)
        logits_only = OnnxVerifier.load(
            out_dir, onnx_file=onnx_name, calibration=Platt(platt.logit_scale, 0.0, platt.bias)
        )
        metrics[name]["auroc_logit_only"] = evaluate_pairs(logits_only.probabilities, pairs, band)[
            "auroc"
        ]
        coverage_only = [coverage(p.claim, p.evidence) for p in pairs]
        metrics[name]["auroc_coverage_only"] = round(
            auroc_or_nan(coverage_only, [p.label for p in pairs]), 4
        )
        metrics[name]["seconds"] = round(time.perf_counter() - started, 1)
    return metrics


@dataclass(frozen=True, slots=True)
class _Fixed:
    """Probabilities already computed, in the shape ``evaluate_pairs`` calls."""

    probs: list[float]

    def __call__(self, pairs: Sequence[tuple[str, str]], questions: Sequence[str]) -> list[float]:
        return self.probs


def score_sets(
    verifier: OnnxVerifier, sets: dict[str, list[Pair]]
) -> dict[str, dict[str, float | int | str]]:
    """Each set scored once (logits, coverage): calibrated numbers + the baselines beside them."""
    out: dict[str, dict[str, float | int | str]] = {}
    for name, pairs in sets.items():
        if not pairs:
            continue
        started = time.perf_counter()
        texts = [(p.claim, p.evidence) for p in pairs]
        questions = [p.question for p in pairs]
        z = verifier.logits(texts, questions)
        covered = verifier.coverages(texts, questions)
        probs = [float(x) for x in verifier.calibration.probability(z, covered)]
        row = evaluate_pairs(_Fixed(probs), pairs, verifier.band)
        labels = [p.label for p in pairs]
        row["auroc_logit_only"] = round(auroc_or_nan([float(x) for x in z], labels), 4)
        row["auroc_coverage_only"] = round(auroc_or_nan(covered, labels), 4)
        row["seconds"] = round(time.perf_counter() - started, 1)
        out[name] = row
    return out
