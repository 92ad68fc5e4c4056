"""``guardrail bench [--quick] [--json] [--out FILE] [--placement shared|split]
[--profile-only]``: benchmarks.

The whole bench runs through a real broker; ``--profile-only`` runs just the
in-process profile of whole requests (fast path, claim path), no broker.
"""

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
    p.add_argument("--out", type=Path, default=None, help="default bench/results/latest.json")
    p.add_argument(
        "--placement",
        choices=("shared", "split"),  # placement.PLACEMENTS (lab code: not imported here)
        default="shared",
        help="shared: the broker, the load generator and the process under test on every CPU; "
        "split: the process under test (sidecar, floors) on the first half of the CPUs, the "
        "broker and the load generator on the rest",
    )
    p.add_argument(
        "--profile-only",
        action="store_true",
        help="only the per-request profile, no broker (default --out bench/results/profile.json)",
    )
    p.set_defaults(func=run)


HEADLINE = (
    "fast_drain_vs_noop",
    "fast_drain_vs_noop_pairs",
    "fast_drain_vs_noop_single",
    "noop_vs_sidecar_loop_cpu",
    "paired_processor_cpu_us_per_request",
    "paired_loop_cpu_us_per_request",
    "p99_at_half_capacity_vs_noop",
    "p99_at_half_sidecar_capacity_vs_noop",
    "full_path_vs_fast_path",
    "noop_vs_raw_client",
    "parse_vs_noop",
    "dict_vs_noop",
    "throughput_answers_per_s",
    "noop_answers_per_s",
    "parse_answers_per_s",
    "dict_answers_per_s",
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
    "placement",
    "incomplete",
)


def run(args: argparse.Namespace) -> int:
    from sidecar.lab.bench.placement import Placement  # noqa: PLC0415
    from sidecar.lab.bench.suite import run_bench  # noqa: PLC0415

    if args.profile_only:
        return _profile(args.out or Path("bench/results/profile.json"), quick=args.quick)
    args.out = args.out or Path("bench/results/latest.json")
    placement = Placement.of(args.placement)  # a machine with one CPU: said before any run
    report = run_bench(quick=args.quick, out=args.out, placement=placement)
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


def _profile(out: Path, *, quick: bool) -> int:
    from sidecar.lab.bench.profile import profile_paths  # noqa: PLC0415

    scale = 0.25 if quick else 1.0
    report = profile_paths(n_fast=int(2000 * scale), n_claims=int(100 * scale))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    for path, profile in report.items():
        sys.stdout.write(f"{path:<11} {profile['per_request_ms']} ms/request\n")
        for row in profile["top_self_time"][:8]:
            sys.stdout.write(
                f"  {row['ms_per_request']:>8} ms  {row['function']}  {row['where']}\n"
            )
    sys.stdout.write(f"full profile: {out}\n")
    return 0
