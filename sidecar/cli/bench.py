"""``guardrail bench [--quick] [--json] [--out FILE]``: benchmarks through the real broker."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="throughput / latency / RSS benchmarks through a real broker")
    p.add_argument("--quick", action="store_true", help="a quarter of the full sizes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", type=Path, default=Path("bench/results/latest.json"))
    p.set_defaults(func=run)


HEADLINE = (
    "fast_drain_vs_noop",
    "p99_at_half_capacity_vs_noop",
    "full_path_vs_fast_path",
    "noop_vs_raw_client",
    "throughput_answers_per_s",
    "noop_answers_per_s",
    "raw_client_answers_per_s",
    "half_capacity_answers_per_s",
    "p99_ms_at_half_capacity",
    "noop_p99_ms_at_half_capacity",
    "p99_ms_at_500",
    "full_path_answers_per_s",
    "claim_p95_ms",
    "rss_mb",
    "startup_s",
    "baseline_ratio",
    "scale_out_ratio",
    "serving_imports_torch",
    "cpu_model",
    "cpu_flags",
    "incomplete",
)


def run(args: argparse.Namespace) -> int:
    from sidecar.lab.bench.suite import run_bench  # noqa: PLC0415

    report = run_bench(quick=args.quick, out=args.out)
    if args.json:
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
    else:
        for key in HEADLINE:
            sys.stdout.write(f"{key:<28} {report[key]}\n")
        sys.stdout.write(f"full report: {args.out}\n")
    if report["failure"] is not None:
        sys.stderr.write(f"guardrail bench: FAILED: {report['failure']}\n")
        return 1
    return 0
