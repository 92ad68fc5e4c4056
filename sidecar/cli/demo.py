"""``guardrail demo``: broker + topics + sidecar + replayed events, verdicts printed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo", help="start Kafka and the sidecar, replay sample events, print verdicts, shut down"
    )
    p.add_argument("--events", type=Path, help="replay this file instead of the bundled sample")
    p.add_argument("--keep", action="store_true", help="keep the broker's data and the sidecar log")
    p.add_argument(
        "--real",
        type=int,
        default=0,
        metavar="N",
        help="instead of the recording: a real RAG service (Qdrant + MiniLM + SmolLM2 with the "
        "attention summariser) answers N held-out NQ-open questions (needs the ml extra)",
    )
    p.add_argument("--questions", type=Path, help="NQ-open file for --real")
    p.add_argument(
        "--claims",
        action="store_true",
        help="turn claim verification on (GUARDRAIL_SIGNALS__CLAIMS=true): claim verdicts "
        "stream before each answer verdict",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.lab.demo import run_demo  # noqa: PLC0415

    return run_demo(
        args.events, keep=args.keep, real=args.real, questions=args.questions, claims=args.claims
    )
