"""Input records consumed, by input kind and outcome (``guardrail.consumer.records``).

The fast path pays per batch, not per record: the processor counts a batch's records
of each kind in local variables and adds them here once, as accepted unless a rarer
outcome took them, which is counted as it happens (a dead letter, a duplicate). No
dict or attribute is touched per record. Every count only grows, so a collection
between two batches or inside one never reads a counter going back.
"""

from __future__ import annotations

from enum import StrEnum

from sidecar.contracts.codec import InputKind

__all__ = ["InputTally", "Outcome"]


class Outcome(StrEnum):
    """What became of a consumed input record."""

    ACCEPTED = "accepted"  # admitted: held for its request, or a feedback label taken
    DEAD_LETTERED = "dead-lettered"  # sent to the DLQ with its reason
    DUPLICATE = "duplicate"  # read again (decided, handed over) or an identical re-send
    REROUTED = "rerouted"  # off its request's murmur2 partition: sent on to it (join.reroute)


_KINDS = tuple(InputKind)  # the order of the accepted counts
_INDEX = {kind: i for i, kind in enumerate(_KINDS)}


class InputTally:
    """Cumulative counts of consumed input records: ``(kind, outcome) -> n``, every pair
    present from the start (a rate reads 0, not nothing, before the first record)."""

    __slots__ = ("_accepted", "_aside", "_others")

    def __init__(self) -> None:
        self._accepted = [0] * len(_KINDS)  # by kind, in ``InputKind`` order
        self._others: dict[tuple[str, str], int] = {
            (kind.value, outcome.value): 0
            for kind in _KINDS
            for outcome in Outcome
            if outcome is not Outcome.ACCEPTED
        }
        self._aside: list[int] | None = None  # this batch's records of another outcome

    def add(self, kind: InputKind, outcome: Outcome) -> None:
        """One record of the batch in hand had ``outcome`` (not ``ACCEPTED``)."""
        self._others[(kind.value, outcome.value)] += 1
        if self._aside is None:
            self._aside = [0] * len(_KINDS)
        self._aside[_INDEX[kind]] += 1

    def batch(self, retrieval: int, generation: int, feedback: int) -> None:
        """The batch in hand is through, with these many records of each kind: those no
        other outcome took are accepted (three additions: the fast path's whole cost)."""
        accepted, aside = self._accepted, self._aside
        if aside is not None:  # rare: a dead letter or a duplicate in this batch
            self._aside = None
            # max: a record dead-lettered twice (a bug after its dead letter) is one record
            retrieval, generation, feedback = (
                max(0, n - k) for n, k in zip((retrieval, generation, feedback), aside, strict=True)
            )
        accepted[0] += retrieval  # InputKind order: retrieval, generation, feedback
        accepted[1] += generation
        accepted[2] += feedback

    def counts(self) -> dict[tuple[str, str], int]:
        """A copy, ``(kind, outcome) -> n`` (C-level copies: the processor's thread may be
        counting)."""
        accepted = list(self._accepted)
        return {
            **{
                (kind.value, Outcome.ACCEPTED.value): n
                for kind, n in zip(_KINDS, accepted, strict=True)
            },
            **dict(self._others),
        }
