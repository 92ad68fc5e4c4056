"""Evaluating verifiers and claim checkers on held-out data (offline tooling, no torch).

Two levels:

* :func:`evaluate_pairs` - the verifier alone on (claim, evidence, label) pairs
  from :mod:`sidecar.claims.datasets`: AUROC / accuracy / F1 of the supported
  probability, the share of ``uncertain`` labels from the calibrated band, and
  the AUROC of claim length alone (the HaluEval artefact; must be ~0.5 on the
  length-matched sets);
* :func:`evaluate_items` - whole answers (``guardrail eval claims``): each
  HaluEval item (right and hallucinated answer / summary / response) is cut
  into claims and checked with the same :class:`~sidecar.claims.checker.ClaimScorer`
  the sidecar runs (evidence selection, rule tier, verifier). Its hallucination
  score is ``1 - min p(supported)`` over its claims; the item counts as
  detected-hallucinated when any claim is unsupported (seed 002: one
  unverified claim already raises the hallucination rate above 0).

Readers of the three HaluEval formats live here too (one JSON object a line):
QA ``knowledge, question, right_answer, hallucinated_answer``; summarization
``document, right_summary, hallucinated_summary``; dialogue ``knowledge,
dialogue_history, right_response, hallucinated_response``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from sidecar.claims.calibration import Band
from sidecar.claims.checker import ClaimScorer
from sidecar.claims.datasets import Pair, split_of
from sidecar.claims.evidence import EvidenceChunk
from sidecar.claims.jsonl import iter_json_objects
from sidecar.claims.metrics import auroc, binary_report
from sidecar.claims.segment import Claim, segment_claims
from sidecar.contracts.events import ClaimLabel
from sidecar.exceptions import InputError

__all__ = [
    "FORMATS",
    "EvalItem",
    "Format",
    "evaluate_items",
    "evaluate_pairs",
    "held_out",
    "read_items",
    "score_item",
]

Format = Literal["halueval-qa", "halueval-summarization", "halueval-dialogue"]
FORMATS: Final[tuple[Format, ...]] = (
    "halueval-qa",
    "halueval-summarization",
    "halueval-dialogue",
)
_FIELDS: Final[dict[Format, tuple[str, str, str, str | None]]] = {
    # context, right candidate, hallucinated candidate, extra (question / dialogue history)
    "halueval-qa": ("knowledge", "right_answer", "hallucinated_answer", "question"),
    "halueval-summarization": ("document", "right_summary", "hallucinated_summary", None),
    "halueval-dialogue": (
        "knowledge",
        "right_response",
        "hallucinated_response",
        "dialogue_history",
    ),
}


def _rounded(x: float) -> float:
    return round(x, 4)


def evaluate_pairs(
    probabilities: Callable[[Sequence[tuple[str, str]], Sequence[str]], list[float]],
    pairs: Sequence[Pair],
    band: Band,
) -> dict[str, float | int | str]:
    """The verifier's numbers on one pair set (label 1 = supported).

    ``probabilities`` gets the (claim, evidence) texts and each pair's question.
    """
    probs = probabilities([(p.claim, p.evidence) for p in pairs], [p.question for p in pairs])
    labels = [p.label for p in pairs]
    support = binary_report(probs, labels, threshold=0.5)
    halluc = binary_report([1 - q for q in probs], [1 - y for y in labels], threshold=0.5)
    three = [band.label(q) for q in probs]
    decided = [(lab, y) for lab, y in zip(three, labels, strict=True)]
    decided = [(lab, y) for lab, y in decided if lab is not ClaimLabel.UNCERTAIN]
    correct = sum(1 for lab, y in decided if (lab is ClaimLabel.SUPPORTED) == (y == 1))
    return {
        "n": len(pairs),
        "supported": sum(labels),
        "auroc": _rounded(support.auroc),
        "accuracy": _rounded(support.accuracy),
        "f1_hallucinated": _rounded(halluc.f1),
        "length_auroc": _rounded(
            auroc([float(len(p.claim)) for p in pairs], [1 - y for y in labels])
        ),
        "uncertain_share": _rounded(1 - len(decided) / len(pairs)) if pairs else 0.0,
        "accuracy_decided": _rounded(correct / len(decided)) if decided else 0.0,
    }


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One benchmark item: its context, and a candidate that is or is not hallucinated."""

    context: str
    prefix: str | None  # the question (QA) the answer replies to
    candidate: str
    hallucinated: int  # 1 = the hallucinated candidate


def read_items(path: Path, fmt: Format, limit: int | None = None) -> Iterator[tuple[str, EvalItem]]:
    """``(group, item)`` per candidate: two items per line (right, hallucinated)."""
    context_f, right_f, hall_f, extra_f = _FIELDS[fmt]
    count = 0
    for lineno, obj in iter_json_objects(path):
        need = [f for f in (context_f, right_f, hall_f, extra_f) if f is not None]
        missing = [f for f in need if not isinstance(obj.get(f), str)]
        if missing:
            raise InputError(
                "schema-violation",
                f"{path}:{lineno}: format {fmt} needs string fields {', '.join(need)}; "
                f"missing or not a string: {', '.join(missing)}",
            )
        context = str(obj[context_f])
        prefix: str | None = None
        if fmt == "halueval-qa":
            prefix = str(obj["question"])
        elif fmt == "halueval-dialogue":
            context = f"{context}\n{obj['dialogue_history']}"
        group = prefix or context[:200]
        yield group, EvalItem(context, prefix, str(obj[right_f]), 0)
        yield group, EvalItem(context, prefix, str(obj[hall_f]), 1)
        count += 1
        if limit is not None and count >= limit:
            return


def evaluate_items(
    items: Sequence[EvalItem], score_claims: Callable[[EvalItem], list[tuple[ClaimLabel, float]]]
) -> dict[str, float | int]:
    """Detection of the hallucinated candidate: n, accuracy, AUROC, F1 (+ length-only AUROC)."""
    scores: list[float] = []
    flagged: list[int] = []
    labels: list[int] = []
    lengths: list[float] = []
    for item in items:
        results = score_claims(item)
        min_p = min((p for _, p in results), default=1.0)
        scores.append(1.0 - min_p)
        flagged.append(int(any(lab is ClaimLabel.UNSUPPORTED for lab, _ in results)))
        labels.append(item.hallucinated)
        lengths.append(float(len(item.candidate)))
    report = binary_report([float(f) for f in flagged], labels, threshold=0.5)
    return {
        "n": len(items),
        "hallucinated": sum(labels),
        "accuracy": _rounded(report.accuracy),
        "precision": _rounded(report.precision),
        "recall": _rounded(report.recall),
        "f1": _rounded(report.f1),
        "auroc": _rounded(auroc(scores, labels)),
        "length_auroc": _rounded(auroc(lengths, labels)),
    }


def score_item(scorer: ClaimScorer, item: EvalItem) -> list[tuple[ClaimLabel, float]]:
    """Labels and scores of one benchmark candidate, checked like a streamed answer.

    QA answers are read with their question ("question answer."), as in
    training, and the question goes to the scorer (evidence selection, and
    the verifier when it reads questions); summaries and responses are cut
    into claims by the segmenter (the whole candidate is one claim when the
    segmenter finds none).
    """
    whole = (0, len(item.candidate))
    if item.prefix is not None:
        text = f"{item.prefix.strip()} {item.candidate.strip()}"
        text = text if text.endswith((".", "!", "?")) else text + "."
        claims = [Claim(0, text, whole, whole)]
    else:
        claims = segment_claims(item.candidate) or [Claim(0, item.candidate.strip(), whole, whole)]
    index = scorer.index([EvidenceChunk("context", item.context)])
    checks = scorer.check(claims, index, item.prefix or "")
    return [(c.label, c.score) for c in checks]


def held_out(group: str) -> bool:
    """Whether an item's question is in the verifier's test split (never trained on)."""
    return split_of(group) == "test"
