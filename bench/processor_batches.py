"""Whole requests through the processor in consumed batches, by chunk length.

The bench's load (``guardrail bench``) carries chunks of 200 characters;
retrieved chunks in production are often 1,000 or more, and any step whose
cost grows with the text shows only there. This runs the fast path's
processor (the served models, claims off) over batches of 50 requests (a
retrieval, 2 deltas and a final each, as the bench builds them) for each
chunk length, on the calling thread, and writes ms per request: the best of
``--rounds`` passes (the machine's noise is additive) and the median.

    .venv/bin/python bench/processor_batches.py --out bench/results/processor_batches.json

``--stages``: where a request's time goes instead, in batches of 50 with 200-character
chunks and the garbage collector frozen as the service freezes it: each stage's calls
are timed (``perf_counter_ns`` around them, inclusive: a stage's time counts its
parts' too, and each timed call adds ~0.3 us), in microseconds per request.

    .venv/bin/python bench/processor_batches.py --stages --out /tmp/stages.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sidecar import runtime
from sidecar.config import Settings
from sidecar.lab.bench.e2e import LoadShape, answer_events
from sidecar.lab.bench.ratios import machine, print_report
from sidecar.lab.bench.stages import as_served, request_items
from sidecar.pipeline import intake as intake_module
from sidecar.pipeline import processor as processor_module
from sidecar.pipeline.processor import BatchItem, Processor

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


def _stage_targets(processor: Processor) -> list[tuple[object, str, str]]:
    """(owner, attribute, stage name): the calls ``--stages`` times, outer stages first."""
    signals = processor.signals
    targets: list[tuple[object, str, str]] = [
        (processor.intake, "admit", "intake"),
        (intake_module, "decode_input", "intake.decode"),
        (processor.intake, "_hold", "intake.hold"),
        (processor.scoring, "score", "scoring"),
        (processor, "_decide", "decide"),
        (processor.policy, "decide", "decide.policy"),
        (processor_module, "answer_verdict_json", "decide.verdict_json"),
    ]
    if signals.certifier is not None:
        targets.append((signals.certifier, "certify", "intake.hold.certify"))
        targets.append((signals.certifier, "observe_decided", "decide.monitor"))
    if signals.confidence is not None:
        targets.append((signals.confidence, "score_batch", "scoring.confidence"))
    if signals.lookback is not None:
        targets.append((signals.lookback, "score_batch", "scoring.lookback"))
    return targets


@contextmanager
def _timed(targets: list[tuple[object, str, str]], spent: dict[str, int]) -> Iterator[None]:
    """Each target's calls add their nanoseconds to ``spent[stage]``; restored on exit."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    own = [name in vars(owner) for owner, name, _ in targets]  # else the class's method

    def wrap(fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[stage] += time.perf_counter_ns() - start

        return timed

    try:
        for (owner, name, stage), (_, _, fn) in zip(targets, saved, strict=True):
            setattr(owner, name, wrap(fn, stage))
        yield
    finally:
        for (owner, name, fn), held in zip(saved, own, strict=True):
            if held:  # a module's function, or an attribute of the instance itself
                setattr(owner, name, fn)
            else:  # the class's method again
                delattr(owner, name)


def stage_costs(count: int) -> dict[str, Any]:
    """Microseconds per request of each stage over ``count`` batches of ``BATCH`` requests."""
    processor = runtime.build_processor(Settings.load(signals={"claims": False}))
    work = batches(200, count + 1, "stages")
    processor.on_batch(work[0], 0.0)  # warm-up: first ONNX call, caches
    spent: dict[str, int] = defaultdict(int)
    # the garbage collector as the service sets it before it consumes, given back after
    with as_served(Settings.load()), _timed(_stage_targets(processor), spent):
        start = time.perf_counter_ns()
        for items in work[1:]:
            processor.on_batch(items, 0.0)
        total = time.perf_counter_ns() - start
    requests = count * BATCH
    return {
        "requests": requests,
        "total_us_per_request": round(total / requests / 1e3, 1),
        "stages_us_per_request": {
            stage: round(ns / requests / 1e3, 1) for stage, ns in sorted(spent.items())
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches-per-round", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--stages", action="store_true", help="per-stage costs instead")
    args = parser.parse_args()
    if args.stages:
        report = {
            "what": f"processor.on_batch, batches of {BATCH}, 200-character chunks: "
            "inclusive time of each stage's calls",
            **stage_costs(args.rounds * args.batches_per_round),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            **machine(),
        }
        print_report(report, args.out)
        return
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
