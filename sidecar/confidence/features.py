"""What the calibrated confidence and the chunk forecast see of a request.

Answer features (one row per answer) come from the events and the signals the
sidecar already computed; a value that does not exist for this request (a
signal not configured or unavailable) is ``None``, which the model imputes and
flags, so a missing signal never reads as a good one.

Chunk features (one row per retrieved chunk) follow Stage 2 of docs/methods.md §Calibrated
confidence: the forecaster sees the query-chunk relation through the retriever's score, its
gap to the best hit, the retrieval rank, whether conformal certification
trusted the chunk, and, when the generator sent a chunk-wise attention
summary, the share of the answer's lookback attention that went to the chunk.

Pure Python + numpy: this module is on the serving path.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

import numpy as np

from sidecar.confidence.spec import SIGNALS, FeatureSpec
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationFinal,
    RetrievalEvent,
    Signals,
    SignalStatus,
)
from sidecar.words import fold

__all__ = [
    "ANSWER_FEATURES",
    "CHUNK_FEATURES",
    "CHUNK_SPEC",
    "answer_features",
    "attention_shares",
    "chunk_features",
    "missing_terms",
    "numpy_mean",
]

ANSWER_FEATURES: Final = SIGNALS
"""The answer model's signals (:data:`sidecar.confidence.spec.SIGNALS`)."""
CHUNK_FEATURES: Final = (
    "score",
    "gap_to_top",
    "inverse_rank",
    "trusted",
    "attention_share",
)
CHUNK_SPEC: Final = FeatureSpec(
    signals=CHUNK_FEATURES,
    missing_groups={"trusted_missing": ("trusted",), "attention_missing": ("attention_share",)},
)
"""The chunk forecaster's input: the chunk features, then their missing indicators."""

_STOPWORDS: Final = frozenset(
    "a an and are as at be by did do does for from had has have how in is it its of on or "
    "the to was were what when where which who whom whose why will with".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_WORD_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_MAX_PROBES: Final = 32  # hits of a query word inside longer chunk words before splitting
# query words x text characters past which the text is split into words once instead of
# searched once per word: a hostile retrieval (5,000 query words, all in the last of
# 1 MB of chunks) took 3.6 s of searching; splitting 1 MB takes ~20 ms
_SCAN_BUDGET: Final = 4_000_000
_PAIRWISE_FROM: Final = 8


def numpy_mean(values: Sequence[float]) -> float:
    """``float(np.mean(values))``, bit for bit, without an array for a handful of floats.

    numpy adds fewer than 8 values one after the other, from the first (its pairwise
    summation starts at 8); beyond that this is ``np.mean`` itself.
    """
    if len(values) >= _PAIRWISE_FROM:
        return float(np.mean(values))
    total = 0.0
    for v in values:
        total += v
    return total / len(values)


def answer_features(
    retrieval: RetrievalEvent, final: GenerationFinal, signals: Signals
) -> dict[str, float | None]:
    """The answer-level feature values of one request (``None``: missing)."""
    scores = sorted([h.score for h in retrieval.hits], reverse=True)
    cert, lookback, claims = signals.retrieval, signals.lookback, signals.claims
    certified = cert.status is SignalStatus.OK and cert.m1 is not None
    claims_ok = claims.status is SignalStatus.OK and claims.n > 0
    words = len(final.answer.split())
    return {
        "retrieval_top_score": scores[0] if scores else None,
        "retrieval_margin": (scores[0] - scores[1])
        if len(scores) > 1
        else (0.0 if scores else None),
        "retrieval_mean_score": numpy_mean(scores) if scores else None,
        "m1": (1.0 if cert.m1 else 0.0) if certified else None,
        "m2": cert.m2 if certified else None,
        "lookback_p": lookback.p_factual if lookback.status is SignalStatus.OK else None,
        "claims_reliability": claims.reliability if claims_ok else None,
        "claims_hallucination_rate": claims.hallucination_rate if claims_ok else None,
        "mean_token_logprob": final.mean_token_logprob,
        "answer_words_log1p": math.log1p(words),
    }


def attention_shares(
    finals: Sequence[GenerationFinal | None], n_hits: Sequence[int]
) -> list[list[float | None]]:
    """Per answer, each chunk's share of its lookback attention (``None``: no usable summary).

    A share is the chunk's column mean over layers and heads over the sum of those
    means; only a chunk-wise summary with one column per hit is used. The summaries
    of one shape are averaged in one numpy pass (the same float32 sums as one at a time).
    """
    out: list[list[float | None]] = [[None] * k for k in n_hits]
    groups: dict[tuple[int, int, int], list[tuple[int, AttentionSummary]]] = {}
    for i, (final, k) in enumerate(zip(finals, n_hits, strict=True)):
        att = final.attention if final is not None else None
        if att is None or att.variant != "cw" or att.chunks != k or k == 0:
            continue
        groups.setdefault((att.layers, att.heads, att.chunks), []).append((i, att))
    for (layers, heads, chunks), members in groups.items():
        n = len(members)
        if n == 1:  # one answer: its (layer*head, chunk) array as it is
            ratios = members[0][1].to_array().reshape(layers * heads, 1, chunks)
        else:
            halves = np.frombuffer(b"".join(att.decoded() for _, att in members), dtype="<f2")
            # (layer*head, answer, chunk): the mean over axis 0 adds each column's values in
            # layer-head order, as one answer's mean over (layer, head) does, in long rows
            ratios = np.empty((layers * heads, n, chunks), dtype=np.float32)
            ratios[...] = halves.reshape(n, layers * heads, chunks).transpose(1, 0, 2)
        means = ratios.mean(axis=0).astype(np.float64)
        totals = means.sum(axis=1).tolist()
        for (i, _), row, total in zip(members, means.tolist(), totals, strict=True):
            if math.isfinite(total) and total > 0.0:
                out[i] = [v / total for v in row]
    return out


def chunk_features(
    retrieval: RetrievalEvent,
    final: GenerationFinal | None,
    trusted_ids: Sequence[str] | None,
    *,
    shares: Sequence[float | None] | None = None,
) -> list[dict[str, float | None]]:
    """One feature row per hit, in retrieval order.

    ``trusted_ids`` is the certified set, or ``None`` when certification did not
    run (the ``trusted`` feature is then missing, not zero). ``shares``: the
    answer's :func:`attention_shares`, when a batch computed them already.
    """
    hits = retrieval.hits
    if not hits:
        return []
    top = max(h.score for h in hits)
    if shares is None:
        shares = attention_shares([final], [len(hits)])[0]
    trusted = set(trusted_ids) if trusted_ids is not None else None
    return [
        {
            "score": h.score,
            "gap_to_top": top - h.score,
            "inverse_rank": 1.0 / (i + 1),
            "trusted": None if trusted is None else float(h.chunk_id in trusted),
            "attention_share": shares[i],
        }
        for i, h in enumerate(hits)
    ]


def missing_terms(query: str, texts: Sequence[str], limit: int = 5) -> list[str]:
    """Content words of ``query`` that appear in none of ``texts`` (a reformulation hint).

    A word appears when it is one of a text's words (``[a-z0-9]+`` runs of the
    folded text, :func:`~sidecar.words.fold`: "Zürich" and "Zurich" are one word).
    Only the query's few words are looked for (``str.find``
    and a look at the characters around each hit) rather than every word of the
    chunks split out; a word found inside longer words more than
    ``_MAX_PROBES`` times falls back to splitting, once per call, and so do
    many words over long texts (past ``_SCAN_BUDGET`` words x characters), so
    the work stays linear in the text.
    """
    words = list(
        dict.fromkeys(w for w in _WORD.findall(fold(query)) if len(w) > 2 and w not in _STOPWORDS)
    )
    if not words:
        return []
    haystack = fold("\n".join(texts))  # "\n" ends a word: none spans two texts
    split: set[str] | None = None
    if len(words) * len(haystack) > _SCAN_BUDGET:  # split once: linear in the text
        split = set(_WORD.findall(haystack))
    out: list[str] = []
    for word in words:
        found = (word in split) if split is not None else _stands_alone(word, haystack)
        if found is None:
            split = split if split is not None else set(_WORD.findall(haystack))
            found = word in split
        if not found:
            out.append(word)
            if len(out) >= limit:
                break
    return out[:limit]


def _stands_alone(word: str, haystack: str) -> bool | None:
    """Whether ``word`` is one of ``haystack``'s words; ``None``: undecided after
    ``_MAX_PROBES`` hits inside longer words (the caller splits instead)."""
    start, end_of, probes = haystack.find(word), len(haystack), 0
    while start != -1:
        end = start + len(word)
        if (start == 0 or haystack[start - 1] not in _WORD_CHARS) and (
            end == end_of or haystack[end] not in _WORD_CHARS
        ):
            return True
        probes += 1
        if probes == _MAX_PROBES:
            return None
        start = haystack.find(word, start + 1)
    return False
