"""``guardrail probe leakage``: the calibrated leakage probe (docs/methods.md §Coverage bound).

Runs the RAG loop (Qdrant + MiniLM + SmolLM2) on questions whose context has
every gold passage and every answer-bearing chunk removed, and measures delta,
the rate of confident wrong answers, with a Wilson 95% interval
(:mod:`sidecar.lab.report.probe`). Heavy imports happen inside the run function.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sidecar.cli.groups import get_group, progress_enabled
from sidecar.cli.lookback import _loop, _questions, _rag_args
from sidecar.exceptions import ConfigError
from sidecar.hashing import sha256_file

__all__ = ["register", "run_leakage"]

DEFAULT_CANDIDATES = 20


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``probe leakage``."""
    probe = get_group(sub, "probe", "Offline probes of the generator.")
    p = probe.add_parser(
        "leakage",
        help="Estimate delta: how often the generator answers wrongly from answer-free context.",
        description=(
            "Retrieve --candidates chunks per question, drop those from a gold passage or "
            "containing a gold answer, prompt the generator with the best K that remain and "
            "count confident wrong answers (not an abstention, not correct from memory): "
            "delta = errors / trials with a Wilson 95% interval (docs/methods.md §Coverage bound)."
        ),
    )
    _rag_args(p, part_default="eval")
    p.add_argument(
        "--candidates",
        type=int,
        default=DEFAULT_CANDIDATES,
        help="chunks retrieved before the gold and answer-bearing ones are dropped "
        f"(default {DEFAULT_CANDIDATES}; must be >= --k)",
    )
    p.add_argument(
        "--out", required=True, type=Path, metavar="FILE.json", help="where to write the result"
    )
    p.add_argument(
        "--json", action="store_true", help="print the result JSON (default: a one-line summary)"
    )
    p.set_defaults(func=run_leakage)


def run_leakage(args: argparse.Namespace) -> int:
    """``guardrail probe leakage``."""
    from sidecar.lab.report.probe import run_leakage_probe, write_probe  # noqa: PLC0415

    if args.candidates < args.k:
        raise ConfigError(f"--candidates must be >= --k ({args.k}), got {args.candidates}")
    questions = _questions(args)
    loop = _loop(args)
    result = run_leakage_probe(
        loop,
        questions,
        k=args.k,
        candidates=args.candidates,
        progress=progress_enabled(args),
        questions_file=args.questions,
        questions_sha256=sha256_file(args.questions),
        part=args.part,
    )
    write_probe(result, args.out)
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(f"{result.summary()} -> {args.out}\n")
    return 0
