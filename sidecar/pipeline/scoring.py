"""Scoring complete requests: lookback, claims, confidence — one path for one or many.

``Scoring.score(entries)`` scores every request completed in a consumed batch
(a single message is a batch of one): the lookback model runs once for all of
them, then each request's claims are finished, then the confidence model runs
once for all of them.
``Scoring.stream(entry)`` verifies newly streamed text while the answer is
still being written.

Every signal is guarded on its own: a component that raises, or returns a
value that is not finite, makes that signal ``unavailable`` for that request
(logged with the reason) — never a lost batch, never another request's
problem.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sidecar.contracts.assembled import assembled
from sidecar.contracts.events import (
    ClaimsSignal,
    GenerationFinal,
    LookbackSignal,
    RetrievalEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.lograte import PER_INPUT
from sidecar.pipeline.join import PendingRequest
from sidecar.pipeline.ports import (
    NOT_CONFIGURED_CLAIMS,
    NOT_CONFIGURED_LOOKBACK,
    NOT_CONFIGURED_RETRIEVAL,
    ClaimChecker,
    ClaimResult,
    ClaimSession,
    ConfidenceResult,
    SignalSuite,
)
from sidecar.pipeline.progress import Progress

log = logging.getLogger("sidecar.pipeline")

UNAVAILABLE_CLAIMS = ClaimsSignal(status=SignalStatus.UNAVAILABLE)


@dataclass(frozen=True, slots=True)
class Scored:
    """One complete request's signals, ready for the policy."""

    signals: Signals
    confidence: ConfidenceResult | None
    final_claims: tuple[ClaimResult, ...]  # verified at the final event (not streamed before)
    claims_span_ns: tuple[int, int]


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


def _confidence_is_finite(result: ConfidenceResult) -> bool:
    """Every number of the result finite (``None``: not computed). Plain loops: a
    generator and a call per feature cost ~3 us a request."""
    if not _finite(result.p_correct):
        return False
    isfinite = math.isfinite
    for v in result.features.values():
        if v is not None and not isfinite(v):
            return False
    for chunk in result.chunk_forecast:
        if not isfinite(chunk.p_useful):
            return False
    return True


class Scoring:
    """Runs the configured signals over complete requests."""

    def __init__(
        self,
        signals: SignalSuite,
        *,
        clock_ns: Callable[[], int],
        max_request_bytes: int | None = None,
    ) -> None:
        self.signals = signals
        self._clock_ns = clock_ns
        self._max_request_bytes = max_request_bytes
        self.claims_refused = 0  # sessions not kept: the index alone crossed max_request_bytes
        self.progress = Progress()  # a beat per request scored (health: a long batch moves)

    def _open_claims(
        self, entry: PendingRequest, retrieval: RetrievalEvent, checker: ClaimChecker
    ) -> ClaimSession | None:
        """The request's claim session, or ``None`` when its index outgrows the request's budget.

        The evidence index is held while the answer streams: it may take up to
        ``max_request_bytes`` on its own (beside the request's events, which the
        same limit bounds), and it counts in the join's byte budget. A request
        whose index does not fit is decided without claims (``unavailable``),
        never with part of its evidence. The index depends on the retrieval
        only, so the outcome does not depend on the order events arrive in.
        """
        session = checker.open(retrieval, entry.certification or NOT_CONFIGURED_RETRIEVAL)
        limit = self._max_request_bytes
        if limit is not None and session.held_bytes > limit:
            entry.claims_refused = True
            self.claims_refused += 1
            log.warning(
                "claims not checked for %s: its evidence index (%d bytes) would outgrow "
                "max_request_bytes (%d)",
                entry.request_id,
                session.held_bytes,
                limit,
                extra=PER_INPUT,
            )
            return None
        return session

    def stream(self, entry: PendingRequest) -> tuple[list[ClaimResult], tuple[int, int]]:
        """Feed newly streamed text to the claim checker; the claims it completed."""
        checker = self.signals.claims
        if checker is None or entry.retrieval is None or entry.claims_refused:
            return [], (0, 0)
        if entry.claims is None:
            entry.claims = self._open_claims(entry, entry.retrieval, checker)
            if entry.claims is None:
                return [], (0, 0)
        new_text = entry.take_unfed()
        if not new_text:
            return [], (0, 0)
        t0 = self._clock_ns()
        try:
            results = entry.claims.feed(new_text)
        except Exception:  # one request's verifier failure must not cost the batch
            log.exception(
                "streaming claim verification failed for %s", entry.request_id, extra=PER_INPUT
            )
            return [], (0, 0)
        entry.claim_results.extend(results)
        return results, (t0, self._clock_ns())

    def score(self, entries: Sequence[PendingRequest]) -> list[Scored]:
        """Score complete requests (``retrieval`` and ``final`` held), in order."""
        t0 = self._clock_ns()
        lookbacks = self._lookback(entries)
        t1 = self._clock_ns()
        claimed = []
        for entry, lookback in zip(entries, lookbacks, strict=True):
            entry.stages.append(("score", t0, t1))
            claimed.append(self._claims(entry, lookback))
            self.progress.beat()
        confidences = self._confidences(entries, [signals for signals, _, _ in claimed])
        return [
            Scored(signals=signals, confidence=confidence, final_claims=tail, claims_span_ns=span)
            for (signals, tail, span), confidence in zip(claimed, confidences, strict=True)
        ]

    def _lookback(self, entries: Sequence[PendingRequest]) -> list[LookbackSignal]:
        scorer = self.signals.lookback
        if scorer is None:
            return [NOT_CONFIGURED_LOOKBACK] * len(entries)
        pairs = [(_final(e), e.certification or NOT_CONFIGURED_RETRIEVAL) for e in entries]
        hits = [_hit_ids(e) for e in entries]
        try:
            return [_checked_lookback(s) for s in scorer.score_batch(pairs, hit_ids=hits)]
        except Exception:
            log.warning(
                "batched lookback scoring failed; scoring one by one",
                exc_info=True,
                extra=PER_INPUT,
            )
        out = []
        for entry, (final, certification), ids in zip(entries, pairs, hits, strict=True):
            try:
                out.append(_checked_lookback(scorer.score(final, certification, hit_ids=ids)))
            except Exception:
                log.exception("lookback scoring failed for %s", entry.request_id, extra=PER_INPUT)
                out.append(_unavailable_lookback(scorer.version))
        return out

    def _claims(
        self, entry: PendingRequest, lookback: LookbackSignal
    ) -> tuple[Signals, tuple[ClaimResult, ...], tuple[int, int]]:
        """Finish the request's claims: its signals, the claims verified now, and when."""
        certification: RetrievalSignal = entry.certification or NOT_CONFIGURED_RETRIEVAL
        t_claims = self._clock_ns()
        claims = UNAVAILABLE_CLAIMS if entry.claims_refused else NOT_CONFIGURED_CLAIMS
        tail: list[ClaimResult] = []
        if entry.claims is not None:
            try:
                tail, claims = entry.claims.finish(_final(entry).answer)
            except Exception:
                log.exception("claim verification failed for %s", entry.request_id, extra=PER_INPUT)
                claims = UNAVAILABLE_CLAIMS
            entry.claim_results.extend(tail)
        span = (t_claims, self._clock_ns())
        entry.stages.append(("verify_claims", *span))
        return _signals(certification, lookback, claims), tuple(tail), span

    def _confidences(
        self, entries: Sequence[PendingRequest], signals: Sequence[Signals]
    ) -> list[ConfidenceResult | None]:
        """One batched call for the requests; one by one (each guarded) if it fails."""
        scorer = self.signals.confidence
        if scorer is None:
            return [None] * len(entries)
        if len(entries) > 1:
            try:
                batch = scorer.score_batch(
                    [(_retrieval(e), _final(e), s) for e, s in zip(entries, signals, strict=True)]
                )
            except Exception:
                log.warning(
                    "batched confidence scoring failed; scoring one by one",
                    exc_info=True,
                    extra=PER_INPUT,
                )
            else:
                return [
                    _checked_confidence(entry, result)
                    for entry, result in zip(entries, batch, strict=True)
                ]
        return [self._confidence(e, s) for e, s in zip(entries, signals, strict=True)]

    def _confidence(self, entry: PendingRequest, signals: Signals) -> ConfidenceResult | None:
        scorer = self.signals.confidence
        if scorer is None:
            return None
        try:
            result = scorer.score(_retrieval(entry), _final(entry), signals)
        except Exception:
            log.exception("confidence scoring failed for %s", entry.request_id, extra=PER_INPUT)
            return None
        return _checked_confidence(entry, result)


def _signals(retrieval: RetrievalSignal, lookback: LookbackSignal, claims: ClaimsSignal) -> Signals:
    """``Signals(...)``, built without validation when each value is its field's own class
    (validation keeps such an instance as it is: ``revalidate_instances`` is ``never``)."""
    if (
        type(retrieval) is RetrievalSignal
        and type(lookback) is LookbackSignal
        and type(claims) is ClaimsSignal
    ):
        return assembled(Signals, {"retrieval": retrieval, "lookback": lookback, "claims": claims})
    return Signals(retrieval=retrieval, lookback=lookback, claims=claims)


def _checked_confidence(entry: PendingRequest, result: ConfidenceResult) -> ConfidenceResult | None:
    if not _confidence_is_finite(result):
        log.warning("confidence for %s is not finite; left out", entry.request_id, extra=PER_INPUT)
        return None
    return result


def _retrieval(entry: PendingRequest) -> RetrievalEvent:
    retrieval = entry.retrieval
    if retrieval is None:  # callers score complete requests only
        raise AssertionError(f"request {entry.request_id} has no retrieval event")
    return retrieval


def _hit_ids(entry: PendingRequest) -> tuple[str, ...]:
    """The retrieval's chunk ids in hit order: the attention summary's column order."""
    retrieval = entry.retrieval
    return () if retrieval is None else tuple([h.chunk_id for h in retrieval.hits])


def _final(entry: PendingRequest) -> GenerationFinal:
    final = entry.final
    if final is None:  # callers score complete requests only
        raise AssertionError(f"request {entry.request_id} has no final event")
    return final


def _checked_lookback(signal: LookbackSignal) -> LookbackSignal:
    """A probability that is not finite is no score (the contract also rejects it)."""
    if signal.p_factual is not None and not math.isfinite(signal.p_factual):
        return _unavailable_lookback(signal.model_version)
    return signal


def _unavailable_lookback(model_version: str | None) -> LookbackSignal:
    """Served, but not scored: named by the model that failed, as the scorer's own
    unavailable results are (a scoring error here left ``model_version`` null)."""
    return LookbackSignal(status=SignalStatus.UNAVAILABLE, model_version=model_version)
