"""Does a retriever send similarities (higher is better) or distances (lower is better)?

The calibration reads a hit's raw score as "higher is more relevant": it normalises
with the calibrated ``n1, n2`` and trusts the chunks at or above the threshold. A
retriever whose scores are distances (Qdrant's Euclid and Manhattan metrics, pgvector's
``<->``, FAISS L2) is certified the wrong way round: its best hit looks worst and its
worst hit is trusted (audit: a 1 - cosine retriever had only its off-topic hit trusted,
and nothing said so but a ``retrieval-calibration-fallback`` note).

The events say nothing about the direction, but their hits are in retrieval order,
best first (the contract): a similarity retriever's scores fall down the list, a
distance retriever's rise. One list proves little (a reranker reorders the hits, and
two or three hits rise by chance), so :class:`ScoreOrder` counts, per requested key
(tenant/collection/retriever), the lists whose scores rise (no score below the one
before, some above) and the lists that do not, and calls a key's scores rising once
``MIN_LISTS`` lists were counted and at least ``RISING_SHARE`` of them rose. Counts are
halved past ``WINDOW`` lists, so a retriever that is fixed is believed again after a while.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

__all__ = ["MAX_KEYS", "MIN_LISTS", "RISING_SHARE", "ScoreOrder", "score_direction"]

log = logging.getLogger("sidecar.conformal")

MIN_LISTS: Final = 20  # lists of two or more hits with distinct scores before a key is judged
RISING_SHARE: Final = 0.9  # share of them rising that says "distances"
WINDOW: Final = 200  # counts are halved past this many lists: recent lists weigh most
MAX_KEYS: Final = 4096  # keys remembered (least recently seen forgotten first)


def score_direction(scores: Sequence[float]) -> int | None:
    """+1 rising (no score below the one before, and some above), -1 not rising, None: not
    telling (fewer than two hits, or all equal). Ties do not break a rise: two chunks at
    the same distance are common (audit: with a tie in 20 % of its lists, a distance
    retriever was never flagged when only strict rises counted)."""
    if len(scores) < 2:
        return None
    if scores[0] > scores[1]:  # a similarity retriever's list, falling from its first pair:
        return -1  # two unequal scores, and a pair that does not rise (no min, max or scan)
    if min(scores) == max(scores):
        return None
    rising = all(a <= b for a, b in itertools.pairwise(scores))
    return 1 if rising else -1


class ScoreOrder:
    """Per key, whether its hit lists' scores rise down the list (distances)."""

    def __init__(self) -> None:
        self._counts: OrderedDict[str, list[int]] = OrderedDict()  # key -> [rising, other]
        self._said: set[str] = set()  # keys whose rising scores were logged

    def observe(self, key: str, scores: Sequence[float]) -> bool:
        """Count one hit list of ``key``; True when the key's scores rise (read as distances)."""
        direction = score_direction(scores)
        counts = self._counts.get(key)
        if direction is not None:
            if counts is None:
                if len(self._counts) >= MAX_KEYS:
                    self._forget_one()
                counts = self._counts[key] = [0, 0]
            counts[0 if direction > 0 else 1] += 1
            if counts[0] + counts[1] > WINDOW:
                counts[0] //= 2
                counts[1] //= 2
        if counts is None:
            return False
        self._counts.move_to_end(key)
        rising, other = counts
        judged = rising + other >= MIN_LISTS and rising >= RISING_SHARE * (rising + other)
        if judged and key not in self._said:
            self._said.add(key)
            log.warning(
                "retriever %s: the scores rise down the hit list in %d of its last %d "
                "retrievals; hits come best first, so these look like distances (lower is "
                "better), which the calibration reads the other way round. Its chunks are not "
                "certified until its scores fall down the list: send similarities (for a "
                "cosine distance, 1 - distance; else -distance)",
                key,
                rising,
                rising + other,
            )
        elif not judged and key in self._said:
            self._said.discard(key)
            log.warning("retriever %s: its scores fall down the hit list again", key)
        return judged

    def _forget_one(self) -> None:
        """Room for a key: the least recently seen key not judged rising (keys are producer
        text: another tenant's 4,096 new keys must not clear a judged key, audit), else
        the least recently seen of all."""
        victim = next((k for k in self._counts if k not in self._said), None)
        if victim is None:
            victim = next(iter(self._counts))
        del self._counts[victim]
        self._said.discard(victim)
