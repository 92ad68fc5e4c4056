"""The shipped verifier's outputs on another x86 CPU or onnxruntime, pair by pair: writes JSON.

The golden outputs checked at load are a handful of inputs; this checks thousands, as
served. Two steps, on two machines:

* ``prepare`` (where the data is): ``--per-form`` seeded pairs of every task form's held-out
  split (the corpus's test pairs, evidence cut to the windows the network reads), each with
  this machine's logit and calibrated p, and a header naming the CPU, onnxruntime and the
  verifier's version: one gzipped JSON-lines file that travels.
* ``compare`` (on the other machine, with only the serving stack): the same pairs through
  the shipped verifier (loaded as the sidecar loads it, its golden check included) and the
  lookback models' golden check; the JSON gives the largest logit and p differences, and
  per uncertain band (the served one and every target precision the artifact carries) how
  many served labels (supported / uncertain / unsupported) changed.

Usage::

    python bench/cross_cpu.py prepare --data-dir ../shared/data --per-form 300 --out pairs.jsonl.gz
    python bench/cross_cpu.py compare --pairs pairs.jsonl.gz --out cross_cpu.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import random
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sidecar.claims.calibration import Band
from sidecar.claims.verifier import OnnxVerifier
from sidecar.golden import describe_cpu

if TYPE_CHECKING:  # compare runs where only the serving stack is installed
    from sidecar.lab.verifier.sources import Pair

__all__ = ["compared", "cpu_model", "main", "write_pairs"]

LOOKBACK_DIRS = ("smollm2-135m-nq-cw", "smollm2-135m-nq-fc")


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("" where it does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict[str, str]:
    return {
        "cpu_model": cpu_model(),
        "cpu_flags": describe_cpu(),
        "onnxruntime": version("onnxruntime"),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def prepare(args: argparse.Namespace) -> None:
    from sidecar.lab.verifier.datasets import CorpusConfig, build_corpus  # noqa: PLC0415

    verifier = OnnxVerifier.load(args.model, threads=1)
    window = verifier.artifact.evidence_max_chars
    corpus = build_corpus(CorpusConfig(args.data_dir, seed=0, window_chars=window))
    write_pairs(verifier, corpus.test, args.per_form, args.seed, args.out)


def write_pairs(
    verifier: OnnxVerifier,
    forms: Mapping[str, Sequence[Pair]],
    per_form: int,
    seed: int,
    out: Path,
) -> int:
    """At most ``per_form`` seeded pairs of each form with ``verifier``'s logit and p here,
    after a header naming this machine and the verifier; returns how many pairs."""
    rng = random.Random(seed)
    header = {
        "machine": machine(),
        "model": verifier.version,
        "window_chars": verifier.artifact.evidence_max_chars,
    }
    written = 0
    with gzip.open(out, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps(header) + "\n")
        for form, pairs in sorted(forms.items()):
            chosen = rng.sample(list(pairs), min(per_form, len(pairs)))
            texts = [(p.claim, p.evidence) for p in chosen]
            questions = [p.question for p in chosen]
            logits = verifier.logits(texts, questions)
            probs = verifier.calibration.probability(logits, verifier.coverages(texts, questions))
            for p, z, q in zip(chosen, logits.tolist(), probs.tolist(), strict=True):
                row = {"form": form, "claim": p.claim, "evidence": p.evidence}
                handle.write(json.dumps({**row, "question": p.question, "logit": z, "p": q}) + "\n")
            written += len(chosen)
            print(f"{form}: {len(chosen)} pairs", flush=True)
    return written


def _bands(verifier: OnnxVerifier) -> dict[str, Band]:
    bands = {"served": verifier.band}
    for entry in verifier.artifact.bands:
        bands[f"precision {entry.target_precision:g}"] = entry.band
    return bands


def compare(args: argparse.Namespace) -> None:
    text = json.dumps(compared(args.pairs, args.models), indent=2)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


def compared(pairs: Path, models: Path) -> dict[str, Any]:
    """The pairs of ``pairs`` scored here by ``models``' verifier, against their scores
    there; with the golden checks of the verifier and the lookback models."""
    from sidecar.lookback.serving import OnnxLookbackScorer  # noqa: PLC0415

    with gzip.open(pairs, "rt", encoding="utf-8") as handle:
        header = json.loads(handle.readline())
        rows = [json.loads(line) for line in handle]
    started = time.monotonic()
    verifier = OnnxVerifier.load(models / "verifier", threads=1)  # golden check at load
    golden = {"verifier": verifier.check_golden(str(models / "verifier"))}
    for name in LOOKBACK_DIRS:
        scorer = OnnxLookbackScorer.from_dir(models / "lookback" / name)
        golden[f"lookback/{name}"] = scorer.check_golden()
    if verifier.version != header["model"]:
        raise SystemExit(f"the pairs were scored by {header['model']}, not {verifier.version}")
    texts = [(r["claim"], r["evidence"]) for r in rows]
    questions = [r["question"] for r in rows]
    logits = verifier.logits(texts, questions)
    probs = verifier.calibration.probability(logits, verifier.coverages(texts, questions))
    there_z = np.array([r["logit"] for r in rows])
    there_p = np.array([r["p"] for r in rows])
    dz, dp = np.abs(logits - there_z), np.abs(np.asarray(probs) - there_p)
    changed: dict[str, Any] = {}
    for name, band in _bands(verifier).items():
        flips = [
            k
            for k, (a, b) in enumerate(zip(probs.tolist(), there_p.tolist(), strict=True))
            if band.label(a) != band.label(b)
        ]
        edges = np.array([band.unsupported_below, band.supported_from])
        nearest = float(np.min(np.abs(there_p[:, None] - edges[None, :])))
        changed[name] = {"labels_changed": len(flips), "nearest_p_to_an_edge": nearest}
    forms = sorted({r["form"] for r in rows})
    return {
        "reference": header,
        "here": machine(),
        "pairs": len(rows),
        "per_form": {f: sum(r["form"] == f for r in rows) for f in forms},
        "max_abs_logit_diff": float(dz.max()),
        "median_abs_logit_diff": float(np.median(dz)),
        "max_abs_p_diff": float(dp.max()),
        "bands": changed,
        "golden_drift": golden,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    p = steps.add_parser("prepare", help="score held-out pairs here; write them with the scores")
    p.add_argument("--model", type=Path, default=Path("models/verifier"))
    p.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    p.add_argument("--per-form", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=prepare)
    c = steps.add_parser("compare", help="score the same pairs here; compare")
    c.add_argument("--pairs", type=Path, required=True)
    c.add_argument("--models", type=Path, default=Path("models"))
    c.add_argument("--out", type=Path, required=True)
    c.set_defaults(func=compare)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
