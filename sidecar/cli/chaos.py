"""``guardrail chaos [--quick] [--json] [--only NAME]``: the fault-injection suite.

Scenarios: sidecar crashes (SIGKILL / SIGTERM), a broker restart, hostile input,
and a slow then stalled network between the sidecar and the broker.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson


def register(sub: Any) -> None:
    p = sub.add_parser(
        "chaos",
        help="fault-injection suite against a real broker (starts its own broker and sidecars)",
    )
    p.add_argument("--quick", action="store_true", help="small scale, within a few minutes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this scenario (repeatable): sigkill-restart, sigterm-restart, "
        "broker-restart, bad-input, network-stall",
    )
    p.add_argument("--soak", action="store_true", help="run the long soak instead of the suite")
    p.add_argument("--minutes", type=float, default=10.0, help="soak duration")
    p.add_argument("--rate", type=float, default=500.0, help="soak answers per second")
    p.add_argument("--half-fraction", type=float, default=0.1, help="requests that never finish")
    p.add_argument("--max-entries", type=int, default=2000, help="join store bound for the soak")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.chaos.runner import run_chaos, run_soak  # noqa: PLC0415

    if args.soak:
        report = run_soak(args.minutes, args.rate, args.half_fraction, args.max_entries, args.seed)
    else:
        report = run_chaos(quick=args.quick, seed=args.seed, only=args.only)
    if args.json:
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
    else:
        for s in report["scenarios"]:
            sys.stdout.write(
                f"{s['name']:<16} sent={s['sent']:<5} verdicts={s['verdicts']:<5} "
                f"duplicates={s['duplicates']:<4} lost={s['lost']:<3} dlq={s['dlq']:<3} "
                f"rss={s['peak_rss_mb']:.0f}MB lag={s['max_lag']} {s['seconds']}s {s['notes']}\n"
            )
    return 0 if all(s["lost"] == 0 for s in report["scenarios"]) else 1
