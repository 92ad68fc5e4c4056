"""``guardrail chaos [--quick] [--json] [--only NAME]``: the fault-injection suite.

Scenarios: sidecar crashes (SIGKILL / SIGTERM), a broker restart, hostile input
(a fixed corpus, and generated hostile records of every class of issue #20), and
a slow then stalled network between the sidecar and the broker. ``--soak`` runs
the long soak instead, optionally with oversize and poison records.
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
        "broker-restart, bad-input, hostile, network-stall",
    )
    p.add_argument("--soak", action="store_true", help="run the long soak instead of the suite")
    p.add_argument("--minutes", type=float, default=10.0, help="soak duration")
    p.add_argument("--rate", type=float, default=500.0, help="soak requests per second")
    p.add_argument("--half-fraction", type=float, default=0.1, help="requests that never finish")
    p.add_argument("--max-entries", type=int, default=2000, help="join store bound for the soak")
    p.add_argument(
        "--oversize-fraction",
        type=float,
        default=0.0,
        help="soak requests over the message limit or over the request byte budget",
    )
    p.add_argument(
        "--poison-fraction",
        type=float,
        default=0.0,
        help="soak requests replaced by a hostile case (absurd numbers, bytes that are not "
        "UTF-8, tricky request ids, another tenant's ids, label floods, late re-sends)",
    )
    p.add_argument(
        "--join-max-bytes",
        type=int,
        default=16 * 1024 * 1024,
        help="GUARDRAIL_JOIN__MAX_BYTES for the soak's sidecar",
    )
    p.add_argument(
        "--rss-factor",
        type=float,
        default=3.0,
        help="the soak's RSS budget: the RSS once ready plus this times --join-max-bytes",
    )
    p.set_defaults(func=run)


def _passed(s: dict[str, Any]) -> bool:
    return (
        s["lost"] == 0
        and not s.get("wedged_s")
        and s.get("unexpected", 0) == 0
        and s.get("memory", {}).get("within_budget", True)
    )


def run(args: argparse.Namespace) -> int:
    from sidecar.lab.chaos.runner import run_chaos  # noqa: PLC0415
    from sidecar.lab.chaos.soak import SoakPlan, run_soak  # noqa: PLC0415

    if args.soak:
        plan = SoakPlan(
            minutes=args.minutes,
            rate=args.rate,
            half_fraction=args.half_fraction,
            max_entries=args.max_entries,
            oversize_fraction=args.oversize_fraction,
            poison_fraction=args.poison_fraction,
            join_max_bytes=args.join_max_bytes,
            rss_factor=args.rss_factor,
        )
        report = run_soak(plan, args.seed)
    else:
        report = run_chaos(quick=args.quick, seed=args.seed, only=args.only)
    if args.json:
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
    else:
        for s in report["scenarios"]:
            sys.stdout.write(
                f"{s['name']:<16} sent={s['sent']:<5} verdicts={s['verdicts']:<5} "
                f"duplicates={s['duplicates']:<4} lost={s['lost']:<3} dlq={s['dlq']:<3} "
                f"unexpected={s['unexpected']:<3} wedged_s={s['wedged_s']} "
                f"rss={s['peak_rss_mb']:.0f}MB lag={s['max_lag']} {s['seconds']}s {s['notes']}\n"
            )
    return 0 if all(_passed(s) for s in report["scenarios"]) else 1
