"""``guardrail calibrate retrieval`` and ``guardrail eval retrieval``: arguments in, recipe called.

The recipe (index, retrieve, label, calibrate; certify held-out questions as the
sidecar does per event) is the lab's: :mod:`sidecar.lab.conformal.recipe` and
:mod:`sidecar.lab.conformal.evaluate`, imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.cli.groups import add_rag_runtime_args, get_group, progress_enabled

if TYPE_CHECKING:
    from sidecar.lab.conformal.recipe import RetrievalData

__all__ = ["register", "run_calibrate", "run_calibrate_scores", "run_eval"]

DEFAULT_CHUNK_WORDS = 64
DEFAULT_TOP_K = 10
DEFAULT_SPLIT_SEED = 0
DEFAULT_CAL_FRACTION = 0.5
DEFAULT_RETRIEVER = "qdrant-minilm-l6"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calibrate retrieval`` and ``eval retrieval``."""
    calibrate = get_group(sub, "calibrate", "Calibrate a guardrail signal on labelled data.")
    p = calibrate.add_parser(
        "retrieval",
        help="Conformal calibration of retrieval scores (q_hat, Mondrian keys, alpha-sweep).",
        description=(
            "Index a corpus in Qdrant, retrieve the top K chunks of the calibration questions, "
            "label them and write the conformal calibration artifact "
            "(docs/methods.md §Retrieval certification)."
        ),
    )
    _data_args(p, chunk_default=DEFAULT_CHUNK_WORDS, split_default="cal")
    p.add_argument(
        "--alpha", default="0.1", help="significance level in (0, 1), exact (default 0.1)"
    )
    p.add_argument("--k", type=int, default=DEFAULT_TOP_K, dest="top_k", help="retrieval depth K")
    p.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="eq. (1) ROUGE-L percentile as a fraction (0.99); 0 = by document id only",
    )
    p.add_argument("--tenant", default="default", help="Mondrian key: tenant")
    p.add_argument("--collection", default="default", help="Mondrian key: collection")
    p.add_argument("--retriever", default=DEFAULT_RETRIEVER, help="Mondrian key: retriever id")
    p.add_argument("--out", required=True, type=Path, help="artifact path (JSON)")
    p.add_argument(
        "--allow-vacuous",
        action="store_true",
        help="write the artifact even when it has no threshold at alpha (k > n: too few "
        "correct chunks); a sidecar serving it trusts no chunk",
    )
    p.set_defaults(func=run_calibrate)

    own = calibrate.add_parser(
        "scores",
        help="Conformal calibration of your own retriever's labelled scores (JSON lines).",
        description=(
            "Calibrate the certification on your retriever's own labelled retrievals: one JSON "
            'object a line, {"scores": [...best first], "labels": [true, false, ...], '
            '"tenant": ..., "collection": ..., "retriever": ...} (the three names optional: '
            "the options below fill them in). Each (tenant, collection, retriever) gets its own "
            "Mondrian calibration beside the pooled one. Scores must be similarities (higher "
            "is better). Serve the result with GUARDRAIL_SIGNALS__CALIBRATION."
        ),
    )
    own.add_argument("--data", required=True, type=Path, help="labelled retrievals (JSON lines)")
    own.add_argument("--out", required=True, type=Path, help="artifact path (JSON)")
    own.add_argument(
        "--alpha", default="0.1", help="significance level in (0, 1), exact (default 0.1)"
    )
    own.add_argument("--tenant", default="default", help="tenant of lines that name none")
    own.add_argument("--collection", default="default", help="collection of lines that name none")
    own.add_argument("--retriever", default="default", help="retriever of lines that name none")
    own.add_argument(
        "--embedding-model",
        default="unspecified",
        help="what produced the scores (recorded in the artifact)",
    )
    own.add_argument(
        "--allow-vacuous",
        action="store_true",
        help="write the artifact even when it has no threshold at alpha (k > n)",
    )
    own.set_defaults(func=run_calibrate_scores)

    evaluate = get_group(sub, "eval", "Evaluate a guardrail signal on held-out data.")
    e = evaluate.add_parser(
        "retrieval",
        help="Coverage, mean(m1), mean(m2) of a retrieval calibration on held-out questions.",
        description=(
            "Certify the top K chunks of held-out questions with a calibration artifact, as "
            "the sidecar does per event, and report coverage, mean(m1), mean(m2) and q_hat."
        ),
    )
    _data_args(e, chunk_default=None, split_default="test")
    e.add_argument("--calibration", required=True, type=Path, help="calibration artifact")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--plot", type=Path, help="write mean(m1), mean(m2) against alpha (PNG)")
    e.add_argument("--tenant", help="key to certify under (default: the artifact's)")
    e.add_argument("--collection", help="key to certify under (default: the artifact's)")
    e.add_argument("--retriever", help="key to certify under (default: the artifact's)")
    e.add_argument(
        "--unknown-collection",
        choices=["fallback-global", "reject"],
        default="fallback-global",
        help="a collection the artifact never saw: certify with the global calibration "
        "or reject (dead-letter) the event",
    )
    e.add_argument(
        "--allow-corpus-mismatch",
        action="store_true",
        help="evaluate on another corpus than the one calibrated on (a generalisation study)",
    )
    e.set_defaults(func=run_eval)


def _data_args(
    p: argparse.ArgumentParser, *, chunk_default: int | None, split_default: str
) -> None:
    p.add_argument(
        "--questions", required=True, type=Path, help="NQ-open-format questions (.jsonl[.gz])"
    )
    p.add_argument(
        "--corpus",
        required=True,
        nargs="+",
        type=Path,
        help="NQ-open-format files whose passages (union) form the corpus",
    )
    p.add_argument(
        "--chunk-words",
        type=int,
        default=chunk_default,
        help=f"chunk size in words (default {chunk_default or 'from the artifact'})",
    )
    p.add_argument(
        "--split",
        choices=["cal", "test", "all"],
        default=split_default,
        help=f"which part of the deterministic question split to use (default {split_default})",
    )
    p.add_argument(
        "--split-seed",
        type=int,
        default=None,
        help=f"split seed (default {DEFAULT_SPLIT_SEED}; eval: the artifact's)",
    )
    p.add_argument(
        "--cal-fraction",
        type=float,
        default=None,
        help=f"share of questions in the calibration part (default {DEFAULT_CAL_FRACTION}; "
        "eval: the artifact's)",
    )
    p.add_argument("--max-questions", type=int, help="use only the first N questions of the part")
    p.add_argument("--device", default="cpu", help="torch device for the embedder (cpu, cuda)")
    p.add_argument("--batch-size", type=int, default=64, help="embedding batch size")
    add_rag_runtime_args(p)


# ------------------------------------------------------------------ the commands


def _data(args: argparse.Namespace) -> RetrievalData:
    from sidecar.lab.conformal.recipe import RetrievalData  # noqa: PLC0415

    return RetrievalData(
        questions=args.questions,
        corpus=tuple(args.corpus),
        split=args.split,
        max_questions=args.max_questions,
        device=args.device,
        batch_size=args.batch_size,
        threads=args.threads,
        qdrant_path=args.qdrant_path,
        qdrant_url=args.qdrant_url,
        progress=progress_enabled(args),
    )


def _write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def run_calibrate(args: argparse.Namespace) -> int:
    """``guardrail calibrate retrieval``: write the calibration artifact."""
    from sidecar.lab.conformal.recipe import CalibrateSpec, calibrate  # noqa: PLC0415

    spec = CalibrateSpec(
        out=args.out,
        alpha=args.alpha,
        top_k=args.top_k,
        beta=args.beta,
        chunk_words=args.chunk_words,
        split_seed=DEFAULT_SPLIT_SEED if args.split_seed is None else args.split_seed,
        cal_fraction=DEFAULT_CAL_FRACTION if args.cal_fraction is None else args.cal_fraction,
        tenant=args.tenant,
        collection=args.collection,
        retriever=args.retriever,
        allow_vacuous=args.allow_vacuous,
    )
    _write(json.dumps(calibrate(_data(args), spec)))
    return 0


def run_calibrate_scores(args: argparse.Namespace) -> int:
    """``guardrail calibrate scores``: a calibration of your retriever's labelled scores."""
    from sidecar.lab.conformal.from_scores import calibrate_scores  # noqa: PLC0415

    defaults = {"tenant": args.tenant, "collection": args.collection, "retriever": args.retriever}
    summary = calibrate_scores(
        args.data,
        args.out,
        alpha=args.alpha,
        defaults=defaults,
        embedding_model_id=args.embedding_model,
        allow_vacuous=args.allow_vacuous,
    )
    if summary["mixed_scales"]:
        sys.stderr.write(
            "guardrail calibrate scores: warning: these keys' scores span under a tenth of "
            f"the pooled range: {summary['mixed_scales']}; the global calibration, which "
            "serves every key without its own (unknown keys, keys with too few labels), mixes "
            "their scales and guarantees nothing for them: calibrate each scale in a file "
            "of its own\n"
        )
    _write(json.dumps(summary))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """``guardrail eval retrieval``: certify held-out retrievals and report the metrics."""
    from sidecar.lab.conformal.evaluate import (  # noqa: PLC0415
        EvalSpec,
        evaluate_retrieval,
        summary_text,
    )
    from sidecar.lab.conformal.recipe import SplitDefaults  # noqa: PLC0415

    spec = EvalSpec(
        calibration=args.calibration,
        defaults=SplitDefaults(DEFAULT_CHUNK_WORDS, DEFAULT_SPLIT_SEED, DEFAULT_CAL_FRACTION),
        chunk_words=args.chunk_words,
        split_seed=args.split_seed,
        cal_fraction=args.cal_fraction,
        tenant=args.tenant,
        collection=args.collection,
        retriever=args.retriever,
        unknown_collection=args.unknown_collection,
        allow_corpus_mismatch=args.allow_corpus_mismatch,
        plot=args.plot,
    )
    result = evaluate_retrieval(_data(args), spec)
    _write(json.dumps(result) if args.json else summary_text(result))
    return 0
