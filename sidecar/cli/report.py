"""``guardrail dataset outcomes``, ``guardrail train confidence``, ``guardrail eval report``.

Outcome rows (see :mod:`sidecar.lab.report.collect`): the real RAG loop through the
sidecar, one labelled row per question. ``train confidence`` fits the
calibrated confidence and the chunk forecast on them (or on verdicts joined
with the feedback topic); ``eval report`` replays held-out rows through the
sidecar and writes the evaluation report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sidecar.cli.groups import get_group, progress_enabled
from sidecar.cli.lookback import _loop, _questions, _rag_args
from sidecar.exceptions import ConfigError

__all__ = ["register", "run_outcomes", "run_report", "run_train_confidence"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dataset outcomes``."""
    dataset = get_group(sub, "dataset", "Build a training or evaluation dataset.")
    d = dataset.add_parser(
        "outcomes",
        help="run the real RAG loop through the sidecar and record labelled outcome rows",
        description=(
            "Retrieve (Qdrant + MiniLM), answer (SmolLM2), feed the events to the sidecar's "
            "processor (signals and policy from GUARDRAIL_* settings) and append one labelled "
            "row per question to OUT/rows.jsonl. Resumable."
        ),
    )
    _rag_args(d, part_default="fit")
    d.add_argument(
        "--offset", type=int, default=0, help="skip the first N questions of the part (default 0)"
    )
    d.add_argument("--out", type=Path, required=True, help="output directory")
    for name in ("tenant", "collection", "retriever"):
        d.add_argument(
            f"--{name}",
            default=None,
            help=f"the {name} the events carry (default: the served calibration's key)",
        )
    d.set_defaults(func=run_outcomes)
    register_eval_train(sub)


def _event_key(args: argparse.Namespace, settings: Any) -> tuple[str, str, str]:
    """The key the outcome events carry: --tenant / --collection / --retriever, else the
    served calibration's own (audit: always default/nq-open/qdrant-minilm-l6, so a team's
    own calibration served every row by its global fallback, and the certificate fitted
    on them named the wrong key)."""
    from sidecar.lab.generator.service import (  # noqa: PLC0415
        DEFAULT_COLLECTION,
        DEFAULT_RETRIEVER,
        DEFAULT_TENANT,
    )

    served = (DEFAULT_TENANT, DEFAULT_COLLECTION, DEFAULT_RETRIEVER)
    if settings.signals.retrieval:
        from sidecar.conformal import load_artifact  # noqa: PLC0415

        path = Path(settings.models.dir) / settings.signals.calibration
        if path.is_file():
            g = load_artifact(path).global_key
            served = (g.tenant, g.collection, g.retriever)
    given = (args.tenant, args.collection, args.retriever)
    return (
        given[0] or served[0],
        given[1] or served[1],
        given[2] or served[2],
    )


def run_outcomes(args: argparse.Namespace) -> int:
    """``guardrail dataset outcomes``."""
    from sidecar.config import Settings  # noqa: PLC0415
    from sidecar.lab.report.collect import (  # noqa: PLC0415
        ROWS_FILE,
        collect_rows,
        default_processor_factory,
    )

    questions = _offset_questions(args)
    settings = Settings.load()
    key = _event_key(args, settings)
    loop = _loop(args)
    rows = list(
        collect_rows(
            loop,
            questions,
            default_processor_factory(settings),
            args.out / ROWS_FILE,
            progress=progress_enabled(args),
            key=key,
        )
    )
    correct = sum(1 for r in rows if r["correct"])
    summary = {
        "out": str(args.out),
        "questions": len(questions),
        "new_rows": len(rows),
        "correct": correct,
    }
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


def _offset_questions(args: argparse.Namespace) -> list[Any]:
    """The part's questions after ``--offset``, at most ``--limit`` of them."""
    if args.offset < 0:
        raise ConfigError(f"--offset must be >= 0, got {args.offset}")
    if args.limit is not None:
        args.limit += args.offset  # _questions cuts the part at --limit
    questions = _questions(args)[args.offset :]
    if not questions:
        raise ConfigError("no questions left after --offset")
    return questions


def register_eval_train(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``eval report`` and ``train confidence``."""
    evaluate = get_group(sub, "eval", "Evaluate a guardrail signal on held-out data.")
    e = evaluate.add_parser(
        "report",
        help="the real RAG loop through every signal: calibration, AUROC, decisions, bound",
        description=(
            "Run the RAG loop (Qdrant + MiniLM + SmolLM2) on held-out questions (resumable rows "
            "in OUT/rows.jsonl; --rows reuses recorded ones), replay them through the sidecar "
            "as configured by GUARDRAIL_* settings, and write OUT/report.json and PNG plots: "
            "reliability diagram, risk-coverage curve (certified allow), AUROC per signal, "
            "decision mix, m1/m2 vs alpha, coverage bound."
        ),
    )
    _rag_args(e, part_default="eval", required=False)
    e.add_argument("--offset", type=int, default=0, help="skip the first N questions of the part")
    e.add_argument("--rows", type=Path, nargs="+", help="recorded outcome rows (skip the RAG loop)")
    e.add_argument("--probe", type=Path, help="leakage probe result ('guardrail probe leakage')")
    e.add_argument(
        "--certificate",
        type=Path,
        nargs="+",
        default=[],
        help="allow certificates ('guardrail calibrate policy') to state in the report, also "
        "those that certify nothing (with the smallest certifiable risk)",
    )
    e.add_argument("--out", type=Path, required=True, help="output directory")
    e.add_argument("--json", action="store_true", help="print the headline numbers as JSON")
    e.set_defaults(func=run_report)

    train = get_group(sub, "train", "Train a guardrail model.")
    t = train.add_parser(
        "confidence",
        help=(
            "fit the calibrated confidence and the chunk forecast "
            "(docs/methods.md §Calibrated confidence)"
        ),
        description=(
            "Fit the answer-level calibrated confidence (logistic forecaster, then Platt or "
            "isotonic chosen by cross-validated NLL) and the chunk forecast on labelled "
            "outcomes: recorded rows ('dataset outcomes'), or verdicts joined with the "
            "feedback topic (--from-kafka; refits the answer model only)."
        ),
    )
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--rows", type=Path, nargs="+", help="outcome row files or directories")
    src.add_argument(
        "--from-kafka",
        action="store_true",
        help="read rag.verdicts and rag.feedback (GUARDRAIL_KAFKA__*, GUARDRAIL_TOPICS__*)",
    )
    t.add_argument("--out", type=Path, required=True, help="model directory to write")
    t.add_argument(
        "--chunks-from",
        type=Path,
        help="with --from-kafka: copy the chunk forecaster from this model directory",
    )
    t.add_argument("--seed", type=int, default=0, help="split seed (default 0)")
    t.add_argument("--json", action="store_true", help="print the model card metrics as JSON")
    t.set_defaults(func=run_train_confidence)


def run_report(args: argparse.Namespace) -> int:
    """``guardrail eval report``."""
    from sidecar.config import Settings  # noqa: PLC0415
    from sidecar.lab.report.collect import (  # noqa: PLC0415
        ROWS_FILE,
        collect_rows,
        default_processor_factory,
        load_rows,
    )
    from sidecar.lab.report.evaluate import build_report, replay_rows  # noqa: PLC0415
    from sidecar.lab.report.plots import write_plots  # noqa: PLC0415
    from sidecar.lab.report.probe import load_probe  # noqa: PLC0415

    settings = Settings.load()
    factory = default_processor_factory(settings)
    progress = progress_enabled(args)
    if args.rows:
        rows = [r for path in args.rows for r in load_rows(path)]
    else:
        if args.questions is None or args.corpus is None:
            raise ConfigError("eval report needs --rows, or --questions and --corpus")
        questions = _offset_questions(args)
        rows_file = args.out / ROWS_FILE
        list(collect_rows(_loop(args), questions, factory, rows_file, progress=progress))
        wanted = {q.index for q in questions}
        rows = [r for r in load_rows(rows_file) if r["qid"] in wanted]
    if not rows:
        raise ConfigError("no outcome rows to report on")
    probe = load_probe(args.probe) if args.probe else None
    replayed = replay_rows(rows, factory, progress=progress)
    calibration = (
        Path(settings.models.dir) / settings.signals.calibration
        if settings.signals.retrieval
        else None
    )
    report = build_report(
        replayed,
        calibration_file=calibration,
        probe=probe,
        bound_confidence=settings.coverage.confidence,
    )
    if args.certificate:
        from sidecar.confidence.certify_allow import load_certificate  # noqa: PLC0415

        report["certified_allow"]["certificates"] = [
            {"file": str(path), "summary": cert.summary(), **cert.model_dump(mode="json")}
            for path in args.certificate
            for cert in [load_certificate(path)]
        ]
    args.out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(report, args.out)
    report["plots"] = [p.name for p in plots]
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    headline = {
        k: report[k]
        for k in (
            "n",
            "accuracy",
            "auroc",
            "ece",
            "brier",
            "nll",
            "allow_rate",
            "error_rate_allowed",
            "error_rate_allowed_interval",
            "certified_risk",
            "block_rate",
            "caveat_rate",
        )
    }
    headline["coverage_bound_status"] = report["coverage_bound"]["status"]
    if report["certified_allow"].get("certificates"):
        headline["certificates"] = [c["summary"] for c in report["certified_allow"]["certificates"]]
    if args.json:
        sys.stdout.write(json.dumps(headline) + "\n")
    else:
        sys.stdout.write(
            " ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in headline.items()
            )
            + f"\nwrote {args.out / 'report.json'} and {len(plots)} plots\n"
        )
        for cert in report["certified_allow"].get("certificates", []):
            sys.stdout.write(f"certificate {cert['file']} ({cert['key']}): {cert['summary']}\n")
    return 0


def run_train_confidence(args: argparse.Namespace) -> int:
    """``guardrail train confidence``."""
    from sidecar.config import Settings  # noqa: PLC0415
    from sidecar.lab.confidence.recipe import train_from_kafka, train_from_rows  # noqa: PLC0415

    settings = Settings.load()
    if args.from_kafka:
        card = train_from_kafka(settings, args.out, chunks_from=args.chunks_from, seed=args.seed)
    else:
        card = train_from_rows(settings, args.rows, args.out, seed=args.seed)
    if args.json:
        sys.stdout.write(json.dumps(card) + "\n")
    else:
        answer = card["answer"]
        sys.stdout.write(
            f"{card['version']}: n={answer['n']} calibrator={answer['calibrator']} "
            f"held-out AUROC={answer['metrics'].get('auroc')} ECE={answer['metrics'].get('ece')}\n"
        )
    return 0
