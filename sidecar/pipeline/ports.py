"""The core's ports: where the signals and the policy plug into the processor.

The pipeline owns these protocols; ``policy/`` and the signal packages
implement them (they import ``pipeline``, never the reverse). Each signal is a
small component behind a protocol; the processor calls them
at fixed points of a request's life and knows nothing of their internals:

* ``RetrievalCertifier.certify``  when the retrieval event arrives
  (docs/methods.md §Retrieval certification);
* ``ClaimChecker.open`` once the retrieval event is there, then ``ClaimSession.feed``
  with each newly contiguous piece of streamed text (claim verdicts go out as
  soon as their sentence completes) and ``ClaimSession.finish`` with the final
  answer (docs/methods.md §Claim verification);
* ``LookbackScorer.score`` when the final event arrives
  (docs/methods.md §Lookback-ratio factuality).

A component raises ``InputError`` when the event cannot be scored and must be
dead-lettered (a wrong attention shape, NaN scores); anything it returns with
status ``unavailable`` is carried in the verdict instead. A signal that is not
configured is reported as ``not-configured``, never silently treated as fine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.contracts.events import (
    CertificateWithdrawal,
    ChunkForecast,
    ClaimLabel,
    ClaimsSignal,
    CoverageReport,
    Decision,
    FeedbackEvent,
    GenerationFinal,
    LookbackSignal,
    Reason,
    RetrievalEvent,
    RetrievalSignal,
    RetrieveAgain,
    Signals,
    SignalStatus,
)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """One verified claim; the processor turns it into a ``ClaimVerdict`` event."""

    index: int
    span: tuple[int, int]
    text: str
    label: ClaimLabel
    score: float
    evidence_chunk_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MonitorReading:
    """One calibration key's exchangeability monitor: rolling mean(m1), its interval, broken."""

    m1_mean: float
    low: float
    high: float
    broken: bool


@dataclass(frozen=True, slots=True)
class DecidedRequest:
    """A request decided before this process started, or by another replica, as its final
    verdict tells it (read back from the verdicts topic: ``sidecar.kafka.warmstart``)."""

    request_id: str
    tenant: str | None  # the verdict's: its retrieval event's
    decision: Decision
    retrieval: RetrievalSignal  # without its chunk ids
    certificate: str | None  # the allow certificate's key it was decided under, if any
    policy: str | None  # the fingerprint of the policy that decided (model_versions["policy"])


@dataclass(frozen=True, slots=True)
class MonitorSeed:
    """What a warm start put in the exchangeability monitor (``seed_decided``)."""

    fed: int  # decided retrievals counted into windows
    keys: int  # windows they went to
    broken: tuple[str, ...] = ()  # the windows whose alarm is on afterwards


@dataclass(frozen=True, slots=True)
class WarmStart:
    """What a warm start gave the processor (``Processor.warm_start``)."""

    monitor: MonitorSeed | None  # None: no retrieval certification
    remembered: int  # requests the coverage monitor keeps for their labels


@dataclass(frozen=True, slots=True)
class ReadLabel:
    """A label read back from the feedback topic for a partition's windows."""

    request_key: str  # its request's key in the join store (scoped by the trusted tenant)
    correct: bool
    abstained: bool
    partition: int  # whose windows it counts in: its request's
    # its request's id, its trusted tenant ("" when events name it) and its record's
    # timestamp: a label of a request not decided here yet waits for it (wait_for_requests;
    # not the event itself: 20,000 labels read back held 26 MB with theirs, 3.6 without)
    request_id: str = field(default="", compare=False)
    owner: str = field(default="", compare=False)
    timestamp_ms: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class HeldPartitions:
    """What a rebalance did to the coverage windows (``CoverageObserver.hold_partitions``)."""

    new: tuple[int, ...]  # input partitions read here from now
    gone: tuple[int, ...]  # partitions whose windows were dropped (read elsewhere now)
    refilled: int  # requests decided on the new ones before, counted here now
    dropped: int  # requests of the gone ones, no longer counted here
    labels: int = 0  # labels read back for the new ones, counted here now
    labels_dropped: int = 0  # labels of the gone ones, no longer counted here
    # labels read back whose request is not known here, not counted, oldest first: their
    # requests may not be decided yet (the feedback topic ran ahead of the inputs), and a
    # label waited for one where it was read; the recent ones wait here too
    # (Processor.move_waiting_labels), the others are left out
    unknown: tuple[ReadLabel, ...] = ()

    @property
    def labels_unmatched(self) -> int:
        """How many labels read back found no request here (``unknown``)."""
        return len(self.unknown)


class RetrievalCertifier(Protocol):
    @property
    def version(self) -> str: ...

    def certify(self, event: RetrievalEvent) -> RetrievalSignal: ...

    def observe_decided(self, event: RetrievalEvent, signal: RetrievalSignal) -> None:
        """The request ``certify`` certified was decided: count it in the drift monitor
        (once per request; a retrieval whose answer never came is not counted)."""
        ...

    def monitor_readings(self) -> dict[str, MonitorReading]:
        """The exchangeability monitor per calibration key (empty: this certifier has none)."""
        ...

    def seed_decided(self, decided: Iterable[tuple[str | None, RetrievalSignal]]) -> MonitorSeed:
        """Count requests decided before this process started (``(tenant, the final
        verdict's retrieval signal)``, oldest first) in the drift monitor, as
        ``observe_decided`` counted them then, before the first input is read."""
        ...


class LookbackScorer(Protocol):
    @property
    def version(self) -> str: ...

    def check(self, final: GenerationFinal) -> None:
        """Raise ``InputError`` when the final event's summary cannot be scored by this model
        (wrong generator, wrong shape) and the configuration says dead-letter."""
        ...

    def score(
        self,
        final: GenerationFinal,
        certification: RetrievalSignal,
        *,
        hit_ids: Sequence[str] | None = None,
    ) -> LookbackSignal:
        """``hit_ids``: the retrieval's chunk ids in hit order (the summary's column order),
        so that trusted chunks that are not the first hits pick the right columns."""
        ...

    def score_batch(
        self,
        items: Sequence[tuple[GenerationFinal, RetrievalSignal]],
        *,
        hit_ids: Sequence[Sequence[str]] | None = None,
    ) -> list[LookbackSignal]:
        """Score the answers completed in one consumed batch with one model call."""
        ...


class ClaimSession(Protocol):
    @property
    def results(self) -> Sequence[ClaimResult]:
        """Every result of the answer so far (streamed and final), in claim order."""
        ...

    @property
    def held_bytes(self) -> int:
        """Bytes the session holds beyond the request's events (its evidence index).

        Counted against the request's and the join's byte budgets while the
        answer streams.
        """
        ...

    def feed(self, text: str) -> list[ClaimResult]:
        """Newly streamed text; returns results for claims whose sentence completed."""
        ...

    def finish(self, answer: str) -> tuple[list[ClaimResult], ClaimsSignal]:
        """The final answer: results for the remaining claims, and the summary."""
        ...


class ClaimChecker(Protocol):
    @property
    def version(self) -> str: ...

    def open(self, retrieval: RetrievalEvent, certification: RetrievalSignal) -> ClaimSession: ...


@dataclass(frozen=True, slots=True)
class ConfidenceResult:
    """The calibrated confidence of one answer, its chunk ranking and any advice.

    See docs/methods.md §Calibrated confidence.
    """

    p_correct: float | None
    features: dict[str, float | None]
    chunk_forecast: tuple[ChunkForecast, ...] = ()
    advice: RetrieveAgain | None = None


class ConfidenceScorer(Protocol):
    @property
    def version(self) -> str: ...

    def score(
        self, retrieval: RetrievalEvent, final: GenerationFinal, signals: Signals
    ) -> ConfidenceResult: ...

    def score_batch(
        self, items: Sequence[tuple[RetrievalEvent, GenerationFinal, Signals]]
    ) -> list[ConfidenceResult]:
        """Score the answers decided in one consumed batch together (one model pass)."""
        ...


class CoverageObserver(Protocol):
    """Fleet-level coverage bookkeeping: verdicts in, feedback in, reports out.

    The bound: docs/methods.md §Coverage bound.

    ``request_key`` is the request's key in the join store (scoped by the trusted
    tenant), so a label can only reach a request of its own tenant.
    """

    def observe_decision(
        self,
        request_key: str,
        decision: Decision,
        certification: RetrievalSignal,
        certificate: str | None,
        *,
        tenant: str | None = None,
        partition: int = 0,
    ) -> None:
        """Count a final verdict: its decision, its retrieval certification and the allow
        certificate it was taken under (``AnswerVerdict.certificate``); ``tenant``: the
        request's, whose window a stand-in global calibration counts it in; ``partition``:
        the input partition it was read on (its window moves with the partition)."""
        ...

    def observe_feedback(
        self, feedback: FeedbackEvent, request_key: str | None = None, partition: int = 0
    ) -> int:
        """Fold a label read on ``partition`` in: 0 when its request is unknown here (too
        old, another instance), 1 for the request's first label, 2 when it replaced an
        earlier one."""
        ...

    def remember_decided(
        self, decided: Iterable[tuple[str, DecidedRequest]], partitions: int | None = None
    ) -> int:
        """Requests decided before this process started or by another replica
        (``(request_key, request)``, oldest first), for their labels, and counted as
        requests once their partition is read here (``hold_partitions``). Returns how many."""
        ...

    def hold_partitions(
        self,
        partitions: frozenset[int],
        count: int,
        labels: Iterable[ReadLabel] = (),
    ) -> HeldPartitions:
        """This replica reads ``partitions`` of ``count`` input partitions from now: drop the
        windows of the others, refill those new here from the remembered requests and
        ``labels`` (oldest first: read back)."""
        ...

    def due_reports(self, now_ms: float) -> list[CoverageReport]:
        """Reports to publish now (one per calibration key), or none before the interval."""
        ...

    def gauge_values(self) -> dict[str, dict[str, float | None]]:
        """The latest numbers per calibration key, for the ``guardrail.coverage.*`` gauges."""
        ...


class CertificateLedger(Protocol):
    """The policy's allow certificates as the fleet sees them (``rag.certificates``): the
    withdrawals found here go out, the fleet's come in."""

    def keys(self) -> list[str]:
        """The calibration keys with a certificate in force."""
        ...

    def apply(self, key: str, withdrawal: CertificateWithdrawal | None) -> None:
        """A record of the topic: a withdrawal, or ``None`` (reinstated)."""
        ...

    def displaced(self, key: str) -> None:
        """The topic's latest record of ``key`` is junk (a withdrawal held here for it is
        published again: compaction would leave the junk alone)."""
        ...

    def take_withdrawals(self, *, unconfirmed: bool = False) -> list[CertificateWithdrawal]:
        """Violations found here since the last call, to publish (with ``unconfirmed``,
        also every one announced that the topic has not shown back yet: at shutdown)."""
        ...


@dataclass(frozen=True, slots=True)
class SignalSuite:
    """The configured signal components; ``None`` means not configured."""

    certifier: RetrievalCertifier | None = None
    lookback: LookbackScorer | None = None
    claims: ClaimChecker | None = None
    confidence: ConfidenceScorer | None = None
    coverage: CoverageObserver | None = None

    @property
    def warm_starts(self) -> bool:
        """Whether a start gives the signals the fleet's decided requests (a monitor that
        keeps them: ``Processor.warm_start``)."""
        return self.certifier is not None or self.coverage is not None

    def close(self) -> None:
        """Release what the components hold: an LLM judge's calls in flight are cut off.
        Left open, the judge's pool threads (not daemons) held the process's exit for up to
        its ``timeout_s``. Closing twice is harmless."""
        close = getattr(self.claims, "close", None)
        if callable(close):
            close()

    def versions(self) -> dict[str, str]:
        out = {}
        for name, part in (
            ("certifier", self.certifier),
            ("lookback", self.lookback),
            ("verifier", self.claims),
            ("confidence", self.confidence),
        ):
            if part is not None:
                out[name] = part.version
        return out


NOT_CONFIGURED_RETRIEVAL = RetrievalSignal(status=SignalStatus.NOT_CONFIGURED)
NOT_CONFIGURED_LOOKBACK = LookbackSignal(status=SignalStatus.NOT_CONFIGURED)
NOT_CONFIGURED_CLAIMS = ClaimsSignal(status=SignalStatus.NOT_CONFIGURED)


# --------------------------------------------------------------------------- the policy


# Not frozen: one is built per verdict, and a frozen dataclass's __init__ (an
# object.__setattr__ per field) cost ~1.5 us of it. Nothing changes an outcome once built.
@dataclass(slots=True)
class PolicyOutcome:
    decision: Decision
    reasons: list[Reason]
    caveat_text: str | None = None
    rewritten_answer: str | None = None
    extra_reasons: list[Reason] = field(default_factory=list)
    escalate: bool = False  # route to a human expert or a stronger model
    # certified allow: the certificate the decision was taken under (risk, delta, its key)
    certified_risk: float | None = None
    certified_delta: float | None = None
    certificate: str | None = None


class Policy(Protocol):
    """Decides one complete answer from its events and signals."""

    @property
    def name(self) -> str:
        """Name and version, carried in every verdict."""
        ...

    @property
    def fingerprint(self) -> str:
        """``name@<digest of its rules and certificates>``, the verdict's
        ``model_versions["policy"]``: two files that both say ``version: 1`` differ here."""
        ...

    @property
    def profile_names(self) -> tuple[str, ...]:
        """The risk profiles that can decide (a verdict's ``profile.<name>`` reason)."""
        ...

    def decide(
        self,
        retrieval: RetrievalEvent,
        final: GenerationFinal,
        signals: Signals,
        *,
        claims: Sequence[ClaimResult] | None = None,
        confidence: float | None = None,
        confidence_status: SignalStatus = SignalStatus.NOT_CONFIGURED,
    ) -> PolicyOutcome:
        """``claims``: the per-claim results (texts, spans, labels) for the rewrite;
        ``confidence``: the calibrated p(correct), ``None`` when there is none, and then
        ``confidence_status`` says why (no model served, or none for this answer)."""
        ...

    def check_stream(
        self,
        retrieval: RetrievalEvent,
        claims: Sequence[ClaimResult],
        certification: RetrievalSignal | None = None,
    ) -> PolicyOutcome | None:
        """Strict mode: an outcome (block) as soon as the claims so far demand it."""
        ...
