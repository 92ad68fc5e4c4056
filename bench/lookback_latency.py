"""Serving latency of the lookback scorer: single requests and micro-batches.

Scores real recorded summaries (rows of a lookback dataset, as float16
``AttentionSummary`` events) with ``OnnxLookbackScorer`` on CPU, one thread, as
the sidecar does: event -> check -> select/pad/scale -> ONNX -> LookbackSignal.
Writes one JSON file with percentiles per mode (not a timed test).

    .venv/bin/python bench/lookback_latency.py \
        --model models/lookback/smollm2-135m-nq-cw --data out/lookback/nq-dev-k3 \
        --out out/bench/lookback_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from sidecar.contracts.events import (
    AttentionSummary,
    GenerationFinal,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.lab.lookback.dataset import load_dataset
from sidecar.lookback.serving import LookbackRequest, OnnxLookbackScorer


def _percentiles(samples_us: list[float]) -> dict[str, float]:
    arr = np.array(samples_us)
    return {
        "p50_us": float(np.percentile(arr, 50)),
        "p95_us": float(np.percentile(arr, 95)),
        "p99_us": float(np.percentile(arr, 99)),
        "mean_us": float(arr.mean()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="lookback dataset directory")
    parser.add_argument("--out", type=Path, default=Path("out/bench/lookback_latency.json"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    args = parser.parse_args()

    scorer = OnnxLookbackScorer.from_dir(args.model, intra_op_threads=args.threads)
    meta = scorer.metadata
    data = load_dataset(args.data)
    ratios = data.ratios(meta.variant)
    finals = [
        GenerationFinal(
            request_id=f"bench-{int(q)}",
            answer="answer",
            generator_model=meta.generator_model,
            attention=AttentionSummary.from_array(r, variant=meta.variant),
        )
        for q, r in zip(data.rows.qid, ratios, strict=True)
    ]
    cert = RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=["a", "b"], m1=True, m2=2 / 3)
    n = args.requests
    for f in finals[:50]:  # warm-up
        scorer.score(f, cert)

    single: list[float] = []
    for i in range(n):
        f = finals[i % len(finals)]
        t0 = time.perf_counter_ns()
        scorer.check(f)
        scorer.score(f, cert)
        single.append((time.perf_counter_ns() - t0) / 1000.0)

    batched: dict[str, Any] = {}
    for size in args.batch_sizes:
        per_batch: list[float] = []
        for start in range(0, n, size):
            batch = [LookbackRequest(finals[(start + j) % len(finals)], cert) for j in range(size)]
            t0 = time.perf_counter_ns()
            scorer.score_many(batch)
            per_batch.append((time.perf_counter_ns() - t0) / 1000.0)
        stats = _percentiles(per_batch)
        stats["per_request_mean_us"] = statistics.fmean(per_batch) / size
        stats["batches"] = len(per_batch)
        batched[str(size)] = stats

    result = {
        "model_version": scorer.version,
        "variant": meta.variant,
        "features": meta.n_features,
        "providers": scorer.providers,
        "onnx_threads": args.threads,
        "requests": n,
        "distinct_summaries": len(finals),
        "single": _percentiles(single),
        "batched": batched,
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
