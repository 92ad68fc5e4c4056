"""The processor against a dict-level floor sketch of it, in one process (#22).

:class:`sidecar.lab.bench.dict_floor.DictFloor` (its docstring says what it does and
skips) takes the same batches of whole requests as the processor
(``bench/processor_batches.py``'s load: a retrieval, a delta and a final with its
attention summary each, 200-character chunks), alternated pass by pass; best of
``--rounds`` passes each, in microseconds per request. ``--native`` adds the same sketch
compiled outside the interpreter (:class:`~sidecar.lab.bench.native_floor.NativeFloor`,
built by ``make native-floor``)::

    .venv/bin/python bench/dict_floor.py --out bench/results/dict_floor.json
    make native-floor && .venv/bin/python bench/dict_floor.py --native \
        --out bench/results/native_floor.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from bench import processor_batches
from sidecar import runtime
from sidecar.config import Settings
from sidecar.lab.bench.dict_floor import DictFloor
from sidecar.lab.bench.native_floor import NativeFloor
from sidecar.lab.bench.ratios import machine, print_report
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import BatchItem

BATCH = processor_batches.BATCH


def batches(count: int, tag: str) -> list[list[BatchItem]]:
    """``processor_batches``' load: 200-character chunks, as the bench's."""
    return processor_batches.batches(200, count, tag)


def measure(rounds: int, per_round: int, *, native: bool = False) -> dict[str, Any]:
    """The processor and the sketch (``native``: and its compiled twin) on fresh batches,
    their order turned round pass by pass."""
    processor = runtime.build_processor(Settings.load(signals={"claims": False}))
    floors: dict[str, DictFloor | NativeFloor] = {"dict_floor": DictFloor(processor)}
    if native:
        floors["native_floor"] = NativeFloor(processor)
    names = ["processor", *floors]
    passes: dict[str, list[float]] = {name: [] for name in names}
    warm = batches(1, "w")[0]
    processor.on_batch(warm, 0.0)
    for floor in floors.values():
        floor.on_batch(warm)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            work = batches(per_round, f"{name}{r}")
            decided = 0
            start = time.perf_counter()
            for items in work:
                if name == "processor":
                    outputs = processor.on_batch(items, 0.0).outputs
                    decided += sum(o.destination is Destination.VERDICTS for o in outputs)
                else:
                    decided += len(floors[name].on_batch(items))
            passes[name].append((time.perf_counter() - start) / (per_round * BATCH) * 1e6)
            if decided != per_round * BATCH:
                raise SystemExit(f"{name} decided {decided} of {per_round * BATCH} requests")
    best = {k: round(min(v), 1) for k, v in passes.items()}
    return {
        "what": "us per request, batches of 50 whole requests: the processor and a dict-level "
        "floor sketch of it (bench/dict_floor.py's docstring says what the sketch does)"
        + (
            "; native_floor: the same sketch in Rust (sidecar/lab/bench/native_floor.py)"
            if native
            else ""
        ),
        "requests_per_pass": per_round * BATCH,
        "best_us": best,
        "median_us": {k: round(statistics.median(v), 1) for k, v in passes.items()},
        "passes_us": {k: [round(x, 1) for x in v] for k, v in passes.items()},
        "floor_vs_processor": round(best["dict_floor"] / best["processor"], 3),
        **(
            {"native_vs_processor": round(best["native_floor"] / best["processor"], 3)}
            if native
            else {}
        ),
        **machine(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches-per-round", type=int, default=20)
    parser.add_argument("--native", action="store_true", help="time the compiled sketch too")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = measure(args.rounds, args.batches_per_round, native=args.native)
    print_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
