"""Each task form's held-out pairs checked as the sidecar checks a claim: served vs the network.

For every form of ``--split`` (the corpus's pairs of that split, their evidence whole
(:func:`~sidecar.lab.verifier.datasets.form_sets`) or, with ``--corpus``, the corpus's own
single windows), each pair goes through the served claim check
(:func:`~sidecar.lab.verifier.evaluate.check_pair_checks`: evidence windows, the verifier,
the rule tier) as ``guardrail eval claims --format pairs`` runs it, and the report gives,
at the verifier's served threshold, the accuracy and AUROC of the served score and of the
network alone, and how many claims the rule tier capped. Not a timed test: writes JSON.

Usage::

    python bench/served_splits.py --data-dir ../shared/data --out served.json
    python bench/served_splits.py --corpus WORK_DIR/corpus --forms dialogue --out x.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sidecar.claims.scorer import ClaimScorer
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lab.verifier.datasets import FORMS, CorpusConfig, form_sets, read_corpus
from sidecar.lab.verifier.evaluate import (
    PairItem,
    check_pair_checks,
    pair_report,
    served_and_network,
)
from sidecar.lab.verifier.sources import Pair

__all__ = ["main", "served_report"]


def served_report(verifier: OnnxVerifier, pairs: Sequence[Pair]) -> dict[str, Any]:
    """The served check and the network alone on ``pairs``, at the served threshold."""
    scorer = ClaimScorer.served(verifier)
    items = [PairItem(p.claim, p.evidence, p.label, p.question) for p in pairs]
    checks = check_pair_checks(scorer, items)
    served, network = served_and_network(checks)
    keys = ("accuracy", "auroc", "precision", "recall")
    report = pair_report(served, items, verifier.band)
    alone = pair_report(network, items, verifier.band)
    return {
        "n": len(items),
        "threshold": verifier.band.supported_from,
        "served": {k: round(float(report[k]), 4) for k in keys},
        "network": {k: round(float(alone[k]), 4) for k in keys},
        "rule_capped": sum(c.tier == "rule" for c in checks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/verifier"))
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument(
        "--corpus", type=Path, default=None, help="a corpus folder: its windowed test pairs"
    )
    parser.add_argument("--split", choices=("val", "test"), default="test", help="whole only")
    parser.add_argument("--forms", nargs="+", default=None, help="default: every form")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.corpus is not None:
        if args.split != "test":
            parser.error("--corpus scores the corpus's held-out (test) sets only")
        test = read_corpus(args.corpus).test
        unknown = sorted(set(args.forms or ()) - set(test))
        if unknown:
            parser.error(f"--forms {' '.join(unknown)}: the corpus holds {', '.join(test)}")
        sets = {f: list(test[f]) for f in args.forms or test}
        evidence = f"the corpus's windows ({args.corpus})"
    else:
        sets = form_sets(CorpusConfig(args.data_dir, seed=0), args.split, args.forms or FORMS)
        evidence = "whole"
    verifier = OnnxVerifier.load(args.model, threads=1)
    out: dict[str, Any] = {
        "verifier": verifier.version,
        "split": args.split,
        "evidence": evidence,
        "forms": {},
    }
    for form, pairs in sets.items():
        out["forms"][form] = served_report(verifier, pairs)
        print(form, json.dumps(out["forms"][form]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
