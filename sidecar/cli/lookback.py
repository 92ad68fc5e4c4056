"""``guardrail dataset lookback``, ``guardrail train lookback``, ``guardrail eval lookback``.

dataset: run the RAG loop (Qdrant + MiniLM + SmolLM2) over the ``fit`` part of a
question file and record chunk-wise and full-context lookback ratios with
NQ-open labels (docs/methods.md §Lookback-ratio factuality), resumably.

train: logistic regression (max_iter=1000, class_weight=balanced) on padded,
per-sample scaled ratios, 3:2 split by question, train/test AUROC, ONNX export
and metadata (docs/methods.md §Lookback-ratio factuality).

eval: the same RAG loop on the held-out ``eval`` part (or, with ``--data``, a
recorded ``dataset lookback --part eval`` directory), each answer scored by the
serving path (:class:`sidecar.lookback.serving.OnnxLookbackScorer`) from its
wire-format ``AttentionSummary``; prints n, AUROC, positive rate, variant.

Heavy imports (torch, transformers, scikit-learn, onnxruntime) happen inside the
run functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from sidecar.cli.groups import add_rag_runtime_args, get_group, progress_enabled
from sidecar.exceptions import ConfigError

__all__ = ["register", "run_dataset", "run_eval", "run_train"]

log = logging.getLogger(__name__)

DEFAULT_K = 3
DEFAULT_CHUNK_WORDS = 64
DEFAULT_MAX_NEW_TOKENS = 24


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``dataset lookback``, ``train lookback`` and ``eval lookback``."""
    dataset = get_group(sub, "dataset", "Build a labelled dataset for a guardrail signal.")
    d = dataset.add_parser(
        "lookback",
        help="Run the RAG loop with SmolLM2 and record lookback ratios with NQ-open labels.",
        description=(
            "Retrieve top-K chunks (Qdrant + MiniLM), answer with SmolLM2 (greedy), record "
            "chunk-wise and full-context lookback ratios "
            "(docs/methods.md §Lookback-ratio factuality) and label each answer against the gold "
            "answers. Resumable: re-run to continue."
        ),
    )
    _rag_args(d, part_default="fit")
    d.add_argument("--out", required=True, type=Path, help="dataset directory (created/resumed)")
    d.add_argument("--shard-size", type=int, default=20, help="questions per committed shard")
    d.set_defaults(func=run_dataset)

    train = get_group(sub, "train", "Train a guardrail model.")
    t = train.add_parser(
        "lookback",
        help="Train the lookback-ratio factuality classifier and export it to ONNX.",
        description=(
            "Logistic regression (max_iter=1000, class_weight=balanced) on padded, per-sample "
            "scaled lookback ratios (docs/methods.md §Lookback-ratio factuality), 3:2 split by "
            "question, train and test AUROC; writes model.onnx + metadata.json."
        ),
    )
    t.add_argument("--data", required=True, type=Path, help="dataset directory")
    t.add_argument("--variant", choices=["cw", "fc"], default="cw", help="feature variant")
    t.add_argument("--out", required=True, type=Path, help="model directory")
    t.add_argument("--name", help="model name (default: the --out directory's name)")
    t.add_argument("--train-fraction", type=float, default=0.6, help="share of questions in train")
    t.add_argument("--seed", type=int, default=0, help="split and solver seed")
    t.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    t.set_defaults(func=run_train)

    evaluate = get_group(sub, "eval", "Evaluate a guardrail signal on held-out data.")
    e = evaluate.add_parser(
        "lookback",
        help="AUROC of a lookback model on held-out questions, through the serving path.",
        description=(
            "Run the RAG loop on the held-out 'eval' part of the question file, score each "
            "answer's attention summary with the ONNX model as the sidecar does, and report "
            "n, AUROC and the positive rate."
        ),
    )
    _rag_args(e, part_default="eval", required=False)
    e.add_argument(
        "--data",
        type=Path,
        help="score a recorded held-out dataset ('dataset lookback --part eval') instead of "
        "running the RAG loop (then --questions and --corpus are not needed)",
    )
    e.add_argument(
        "--model",
        required=True,
        nargs="+",
        type=Path,
        help="lookback model directory; several share one RAG run (JSON: a list)",
    )
    e.add_argument("--json", action="store_true", help="print JSON (one object per model)")
    e.add_argument("--records", type=Path, help="also write per-question results (JSON lines)")
    e.set_defaults(func=run_eval)


def _rag_args(p: argparse.ArgumentParser, *, part_default: str, required: bool = True) -> None:
    p.add_argument(
        "--questions", required=required, type=Path, help="NQ-open-format questions (.jsonl[.gz])"
    )
    p.add_argument(
        "--corpus",
        required=required,
        nargs="+",
        type=Path,
        help="NQ-open-format files whose passages (union) form the retrieval corpus",
    )
    p.add_argument(
        "--k", type=int, default=DEFAULT_K, help=f"chunks per prompt (default {DEFAULT_K})"
    )
    p.add_argument(
        "--chunk-words",
        type=int,
        default=DEFAULT_CHUNK_WORDS,
        help=f"chunk size in words (default {DEFAULT_CHUNK_WORDS})",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help=f"greedy answer length limit (default {DEFAULT_MAX_NEW_TOKENS})",
    )
    p.add_argument(
        "--part",
        choices=["fit", "eval", "all"],
        default=part_default,
        help="which part of the deterministic question split (fit: datasets/training, "
        f"eval: held out for 'eval lookback'; default {part_default})",
    )
    p.add_argument("--limit", type=int, help="only the first N questions of the part")
    add_rag_runtime_args(p)


def _questions(args: argparse.Namespace) -> list[Any]:
    from sidecar.lab.lookback.dataset import select_part  # noqa: PLC0415
    from sidecar.lab.retrieval.corpus import load_questions  # noqa: PLC0415

    records = load_questions(args.questions)
    chosen = select_part(records, args.part, limit=args.limit)
    if not chosen:
        raise ConfigError(f"no questions selected from {args.questions} (part={args.part})")
    return chosen


def _loop(args: argparse.Namespace) -> Any:
    from sidecar.lab.generator.rag import open_rag_loop  # noqa: PLC0415

    return open_rag_loop(
        args.corpus,
        k=args.k,
        chunk_words=args.chunk_words,
        max_new_tokens=args.max_new_tokens,
        qdrant_path=args.qdrant_path,
        qdrant_url=args.qdrant_url,
        threads=args.threads,
        progress=progress_enabled(args),
    )


def run_dataset(args: argparse.Namespace) -> int:
    """``guardrail dataset lookback``."""
    from sidecar.lab.generator.dataset import build_dataset, dataset_meta  # noqa: PLC0415
    from sidecar.lab.lookback.dataset import ShardWriter  # noqa: PLC0415

    questions = _questions(args)
    loop = _loop(args)
    writer = ShardWriter(args.out, dataset_meta(loop, args.questions, args.part))
    report = build_dataset(
        loop, questions, writer, shard_size=args.shard_size, progress=progress_enabled(args)
    )
    summary = {"out": str(args.out), "questions": len(questions), **report.as_dict()}
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


def run_train(args: argparse.Namespace) -> int:
    """``guardrail train lookback``."""
    from sidecar.lab.lookback.training import train_and_export  # noqa: PLC0415

    name = args.name or args.out.name
    card = train_and_export(
        args.data,
        args.out,
        variant=args.variant,
        name=name,
        train_fraction=args.train_fraction,
        seed=args.seed,
    )
    metrics = card.metrics.model_dump()
    if args.json:
        sys.stdout.write(json.dumps({"model": str(args.out), "version": card.version, **metrics}))
        sys.stdout.write("\n")
    else:
        sys.stdout.write(
            f"{card.version}: {card.variant} L={card.layers} H={card.heads} K={card.chunks} "
            f"n_train={metrics['n_train']} n_test={metrics['n_test']} "
            f"train AUROC={metrics['train_auroc']:.3f} test AUROC={metrics['test_auroc']:.3f}\n"
        )
    return 0


def run_eval(args: argparse.Namespace) -> int:
    """``guardrail eval lookback``."""
    models: list[Path] = args.model
    results: list[dict[str, Any]]
    if args.data is not None:
        from sidecar.lab.lookback.evaluation import evaluate_recorded  # noqa: PLC0415

        results = evaluate_recorded(models, args.data)
    else:
        if args.questions is None or args.corpus is None:
            raise ConfigError("eval lookback needs --data, or --questions and --corpus")
        from sidecar.lab.generator.evaluate import evaluate_live  # noqa: PLC0415

        results = evaluate_live(
            models,
            loop_factory=lambda: _loop(args),
            questions_file=args.questions,
            questions=_questions(args),
            part=args.part,
            records_out=args.records,
            progress=progress_enabled(args),
        )
    if args.json:
        payload: Any = results[0] if len(results) == 1 else results
        sys.stdout.write(json.dumps(payload) + "\n")
        return 0
    for r in results:
        auc = "n/a" if r["auroc"] is None else f"{r['auroc']:.3f}"
        sys.stdout.write(
            f"{r['model_version']}: variant={r['variant']} n={r['n']} "
            f"positive_rate={r['positive_rate']:.3f} AUROC={auc}\n"
        )
    return 0
