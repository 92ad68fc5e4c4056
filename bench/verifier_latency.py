"""CPU latency of the claim verifier per claim (not a timed test): writes JSON.

Measures, for the shipped ONNX verifier (int8) and optionally an fp32 export
of the same architecture (``--fp32-dir``: a directory written by the
trainer's ``export``; weights do not change the cost):

* per-pair latency of ``OnnxVerifier.probabilities`` at batch size 1, and per
  pair at batch size 8;
* per-claim latency of the whole claim check (evidence selection over K = 5
  chunks + rule tier + verifier on up to two evidence views), which is what
  the sidecar spends on each claim of a streamed answer.

``--baseline DIR`` times another verifier directory (e.g. the previous ONNX
file of the same network) on the same calls, interleaved call by call, and
adds the median of the per-call ratios (model / baseline): on a shared
machine, sequential runs differ by more than a few percent.

Usage::

    python bench/verifier_latency.py --model models/verifier --out bench/verifier_latency.json
    python bench/verifier_latency.py --model models/verifier --baseline OLD_DIR --out ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.claims.atomic import Claim
from sidecar.claims.evidence import EvidenceChunk
from sidecar.claims.scorer import ClaimScorer
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lab.verifier.sources import QARecord, read_halueval_qa, split_of


def _percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "n": len(ordered),
        "mean_ms": round(statistics.fmean(ordered), 3),
        "p50_ms": round(ordered[len(ordered) // 2], 3),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 3),
    }


def measure(verifiers: Sequence[OnnxVerifier], records: list[QARecord]) -> list[dict[str, object]]:
    """Each verifier on the same calls, interleaved call by call (paired under the same load)."""
    scorers = [ClaimScorer(v) for v in verifiers]
    pairs = [(f"{r.question} {r.right_answer}.", r.knowledge) for r in records]
    for verifier in verifiers:
        verifier.probabilities(pairs[:4])  # warm-up
    single: list[list[float]] = [[] for _ in verifiers]
    for pair in pairs:
        for k, verifier in enumerate(verifiers):
            started = time.perf_counter()
            verifier.probabilities([pair])
            single[k].append((time.perf_counter() - started) * 1000.0)
    batched: list[list[float]] = [[] for _ in verifiers]
    for j in range(0, len(pairs) - 7, 8):
        for k, verifier in enumerate(verifiers):
            started = time.perf_counter()
            verifier.probabilities(pairs[j : j + 8])
            batched[k].append((time.perf_counter() - started) * 1000.0 / 8)
    per_claim: list[list[float]] = [[] for _ in verifiers]
    for j, record in enumerate(records):
        chunks = [EvidenceChunk("gold", record.knowledge)] + [
            EvidenceChunk(f"d{i}", records[(j + i) % len(records)].knowledge) for i in range(1, 5)
        ]
        claim = Claim(0, record.hallucinated_answer, (0, 1), (0, 1))
        for k, scorer in enumerate(scorers):
            started = time.perf_counter()
            scorer.check([claim], scorer.index(chunks))
            per_claim[k].append((time.perf_counter() - started) * 1000.0)
    samples = {"pair_batch1": single, "pair_batch8_per_pair": batched, "claim_check_k5": per_claim}
    out: list[dict[str, object]] = [
        {
            "model": verifier.version,
            "onnx_file": verifier.artifact.onnx_file,
            "onnx_sha256": verifier.artifact.onnx_sha256,
            **{name: _percentiles(times[k]) for name, times in samples.items()},
        }
        for k, verifier in enumerate(verifiers)
    ]
    if len(verifiers) == 2:  # the first against the second, call by call
        out[0]["paired_ratio_to_baseline"] = {
            name: _paired_ratio(times[0], times[1]) for name, times in samples.items()
        }
    return out


def _paired_ratio(new: list[float], old: list[float]) -> float:
    """Median of new / old over the same calls."""
    return round(statistics.median(a / b for a, b in zip(new, old, strict=True)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/verifier"))
    parser.add_argument("--fp32-dir", type=Path, default=None, help="an fp32 export to compare")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another verifier directory timed on the same calls, interleaved (e.g. the old file)",
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data/halueval/qa_data.json"))
    parser.add_argument("--n", type=int, default=100, help="claims to time")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--out", type=Path, default=Path("bench/verifier_latency.json"))
    args = parser.parse_args()

    records = [r for r in read_halueval_qa(args.data) if split_of(r.question) == "test"][: args.n]
    verifiers = [OnnxVerifier.load(args.model, threads=args.threads)]
    if args.baseline is not None:
        verifiers.append(OnnxVerifier.load(args.baseline, threads=args.threads))
    measured = measure(verifiers, records)
    result: dict[str, object] = {
        "threads": args.threads,
        "max_length": verifiers[0].artifact.max_length,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "note": "a shared 2-core machine under other load: compare runs on one host only",
        "int8": measured[0],
        **({"baseline": measured[1]} if args.baseline is not None else {}),
    }
    if args.fp32_dir is not None:
        fp32 = OnnxVerifier.load(args.fp32_dir, threads=args.threads, onnx_file="model.onnx")
        result["fp32"] = measure([fp32], records)[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
