"""Whole requests through the processor in consumed batches, by chunk length.

The bench's load (``guardrail bench``) carries chunks of 200 characters;
retrieved chunks in production are often 1,000 or more, and any step whose
cost grows with the text shows only there. This runs the fast path's
processor (the served models, claims off) over batches of 50 requests (a
retrieval, 2 deltas and a final each, as the bench builds them) for each
chunk length, on the calling thread, and writes ms per request: the best of
``--rounds`` passes (the machine's noise is additive) and the median.

    .venv/bin/python bench/processor_batches.py --out bench/results/processor_batches.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from sidecar import runtime
from sidecar.config import Settings
from sidecar.lab.bench.e2e import LoadShape, answer_events
from sidecar.lab.bench.ratios import machine, print_report
from sidecar.lab.bench.stages import request_items
from sidecar.pipeline.processor import BatchItem

BATCH = 50


def batches(chars: int, count: int, tag: str) -> list[list[BatchItem]]:
    """``count`` batches of ``BATCH`` whole requests with chunks of ``chars`` characters.

    Each request is built from its own id, as the bench's load is (its hits and
    attention, hence its confidence and whether it gets advice, vary with it).
    """
    shape = LoadShape(payload_chars=chars)
    out = []
    for b in range(count):
        items: list[BatchItem] = []
        for i in range(BATCH):
            rid = f"{tag}-{b}-{i}"
            items.extend(request_items(answer_events(rid, shape), rid, b * BATCH + i))
        out.append(items)
    return out


def per_request_ms(chars: int, rounds: int, per_round: int) -> dict[str, Any]:
    processor = runtime.build_processor(Settings.load(signals={"claims": False}))
    work = batches(chars, rounds * per_round, f"c{chars}")
    processor.on_batch(work[0], 0.0)  # warm-up: first ONNX call, caches
    passes = []
    for r in range(rounds):
        start = time.perf_counter()
        for items in work[r * per_round : (r + 1) * per_round]:
            processor.on_batch(items, 0.0)
        passes.append((time.perf_counter() - start) / (per_round * BATCH) * 1e3)
    return {
        "chunk_chars": chars,
        "requests_per_pass": per_round * BATCH,
        "best_ms": round(min(passes), 4),
        "median_ms": round(statistics.median(passes), 4),
        "passes_ms": [round(p, 4) for p in passes],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches-per-round", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = [per_request_ms(c, args.rounds, args.batches_per_round) for c in args.chars]
    report = {
        "what": f"processor.on_batch, batches of {BATCH} whole requests, fast path",
        "results": results,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        **machine(),
    }
    print_report(report, args.out)


if __name__ == "__main__":
    main()
