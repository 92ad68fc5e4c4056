"""``guardrail golden record|check DIR...``: golden outputs of shipped ONNX models.

record: run the artifact's golden inputs through its ONNX file on this machine
and store the outputs (with the tolerance) in the artifact's JSON
(``verifier.json`` of a claim verifier, ``metadata.json`` of a lookback model).
The export writes them too; this adds them to artifacts exported before, and
leaves the ONNX file, its sha256 and the model version unchanged.

check: recompute them as the loaders do and print the drift per model as JSON
(a model past its tolerance with the loader's message under ``problem``); exit 2
when one is past it. The model cards show how to run it under an emulated CPU.

onnxruntime is imported inside the run functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.golden import GoldenOutputs, describe_cpu

__all__ = ["register", "run_check", "run_record"]

VERIFIER_METADATA = "verifier.json"
LOOKBACK_METADATA = "metadata.json"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``golden record`` and ``golden check``."""
    p = sub.add_parser(
        "golden",
        help="record or check the golden outputs of shipped ONNX models",
        description="Golden outputs: a few inputs with the outputs a model computed at export, "
        "checked when it loads so a CPU that computes other outputs refuses to serve it.",
    )
    cmds = p.add_subparsers(dest="golden_command", metavar="ACTION", required=True)
    record = cmds.add_parser(
        "record", help="compute the golden outputs on this machine and store them in the JSON"
    )
    record.add_argument("model_dir", nargs="+", type=Path, help="verifier or lookback model dir")
    record.set_defaults(func=run_record)
    check = cmds.add_parser(
        "check", help="recompute the golden outputs as the loaders do; print the drift"
    )
    check.add_argument("model_dir", nargs="+", type=Path, help="verifier or lookback model dir")
    check.set_defaults(func=run_check)


def _kind(model_dir: Path) -> str:
    if (model_dir / VERIFIER_METADATA).is_file():
        return "verifier"
    if (model_dir / LOOKBACK_METADATA).is_file():
        return "lookback"
    raise ArtifactError(
        f"{model_dir} is neither a claim verifier ({VERIFIER_METADATA}) nor a lookback model "
        f"({LOOKBACK_METADATA}) directory"
    )


def run_record(args: argparse.Namespace) -> int:
    from sidecar.claims.verifier import (  # noqa: PLC0415 - onnxruntime on use
        OnnxVerifier,
        record_verifier_golden,
        save_artifact,
    )
    from sidecar.lookback.artifact import save_metadata  # noqa: PLC0415
    from sidecar.lookback.serving import (  # noqa: PLC0415 - onnxruntime on use
        OnnxLookbackScorer,
        record_lookback_golden,
    )

    for model_dir in args.model_dir:
        if _kind(model_dir) == "verifier":
            verifier = OnnxVerifier.load(model_dir, threads=1, check_golden=False)
            golden = record_verifier_golden(verifier)
            path = save_artifact(model_dir, verifier.artifact.model_copy(update={"golden": golden}))
        else:
            scorer = OnnxLookbackScorer.from_dir(model_dir, check_golden=False)
            lookback_golden = record_lookback_golden(scorer)
            path = save_metadata(
                model_dir, scorer.metadata.model_copy(update={"golden": lookback_golden})
            )
        sys.stdout.write(f"golden outputs written to {path}\n")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from sidecar.claims.verifier import OnnxVerifier  # noqa: PLC0415 - onnxruntime on use
    from sidecar.lookback.serving import OnnxLookbackScorer  # noqa: PLC0415

    results: list[dict[str, Any]] = []
    for model_dir in args.model_dir:
        golden: GoldenOutputs[Any] | None
        drift: float | None = None
        problem: str | None = None
        if _kind(model_dir) == "verifier":
            verifier = OnnxVerifier.load(model_dir, threads=1, check_golden=False)
            golden, version = verifier.artifact.golden, verifier.version
            try:
                drift = verifier.check_golden(str(model_dir))
            except ConfigError as exc:  # reported with the others, not instead of them
                problem = str(exc)
        else:
            scorer = OnnxLookbackScorer.from_dir(model_dir, check_golden=False)
            golden, version = scorer.metadata.golden, scorer.version
            try:
                drift = scorer.check_golden()
            except ConfigError as exc:
                problem = str(exc)
        results.append(
            {
                "model": str(model_dir),
                "version": version,
                "output": None if golden is None else golden.output,
                "max_drift": drift,
                "tolerance": None if golden is None else golden.tolerance,
                "recorded_on": None if golden is None else golden.recorded_on,
                "within_tolerance": None if golden is None else problem is None,
                **({"problem": problem} if problem is not None else {}),
            }
        )
    sys.stdout.write(json.dumps({"cpu": describe_cpu(), "models": results}, indent=2) + "\n")
    drifted = [r["model"] for r in results if r.get("problem")]
    if drifted:
        sys.stderr.write(f"guardrail golden check: past the tolerance: {', '.join(drifted)}\n")
        return 2
    return 0
