"""A consumed batch in, a ``Step`` out: what to publish, and which inputs are then finished.

The processor orchestrates one request's life and knows nothing of Kafka: the
adapter hands it a batch of messages (a single message is a batch of one),
publishes the step's outputs in order, waits for the broker to confirm them,
and only then marks the step's ``done`` references as finished so that their
offsets may be committed.

    intake.admit ──▶ held / duplicate / rejected / labelled
        held, not complete ──▶ scoring.stream   (claim verdicts as sentences complete)
        held, complete     ──▶ scoring.score    (all requests completed in the batch)
                           ──▶ policy.decide ──▶ outputs (verdict, claim verdicts)

Decisions recorded here (and tested):
  * bad input -> dead letter (original bytes + ``x-dlq-*`` headers), never a crash;
  * a half-request evicted by TTL or capacity -> a ``block`` verdict with reason
    ``incomplete`` (the caller always gets an answer; the inputs stay in Kafka);
  * a failure of one record costs that record only: a message that cannot be
    admitted is dead-lettered, a request that cannot be decided gets a ``block``
    verdict with reason ``internal-error``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sidecar import __version__
from sidecar.config import Settings
from sidecar.contracts.answer_json import answer_verdict_json
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import FeedbackEvent, SignalStatus
from sidecar.exceptions import InputError
from sidecar.lograte import PER_INPUT
from sidecar.pipeline import deadletters, outputs
from sidecar.pipeline.intake import Duplicate, Held, Intake, Labelled, Rejected, Rerouted
from sidecar.pipeline.join import InputRef, JoinStore, PendingRequest
from sidecar.pipeline.labels import WaitingLabels
from sidecar.pipeline.outputs import AttributeValue, Step
from sidecar.pipeline.ports import (
    CertificateLedger,
    ClaimResult,
    CoverageObserver,
    DecidedRequest,
    HeldPartitions,
    Policy,
    ReadLabel,
    RetrievalCertifier,
    SignalSuite,
    WarmStart,
)
from sidecar.pipeline.progress import Progress
from sidecar.pipeline.scoring import Scored, Scoring
from sidecar.pipeline.tally import InputTally, Outcome

log = logging.getLogger("sidecar.pipeline")

BatchItem = tuple[InputKind, bytes | None, bytes | None, InputRef]
_GENERATION, _RETRIEVAL = InputKind.GENERATION, InputKind.RETRIEVAL  # one global read each
_GENERATOR_ATTRIBUTE = outputs.model_attribute("generator")
# the source a label read back waits with (its own is not kept: only correct and abstained
# are read of a label)
READ_BACK_SOURCE = "read-back"


@dataclass(slots=True)
class Counters:
    consumed: int = 0
    verdicts: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    incomplete: int = 0
    claim_verdicts: int = 0
    feedback: int = 0
    feedback_unmatched: int = 0
    feedback_replaced: int = 0
    feedback_early: int = 0
    reports: int = 0
    internal_errors: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    inputs: InputTally = field(default_factory=InputTally)  # by kind and outcome


@dataclass(slots=True)
class _Batch:
    """What the verdicts of one scored batch share (``Processor._batch``)."""

    versions: dict[str, str]  # the signals' and the policy's versions
    models: dict[str, AttributeValue]  # their ``guardrail.model.*`` trace attributes
    policy: str  # the policy's name
    confidence_status: SignalStatus  # a verdict without a confidence: why
    certifier: RetrievalCertifier | None
    coverage: CoverageObserver | None
    # per generator: its verdicts' model versions and model trace attributes (a batch's
    # answers come from one generator or a few: two dict merges a verdict, before)
    by_generator: dict[str, tuple[dict[str, str], dict[str, AttributeValue]]] = field(
        default_factory=dict
    )

    def generator_models(self, generator: str) -> tuple[dict[str, str], dict[str, AttributeValue]]:
        """``{"generator": generator, **versions}`` and its trace attributes, read only: a
        key of the batch's that is also "generator" keeps its place in front and its value,
        as in one literal."""
        known = self.by_generator.get(generator)
        if known is None:
            known = self.by_generator[generator] = (
                {"generator": generator, **self.versions},
                {_GENERATOR_ATTRIBUTE: generator, **self.models},
            )
        return known


def _wall_clock() -> datetime:
    return datetime.now(UTC)


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


class Processor:
    """Joins, decides and dead-letters. Single-threaded; the adapter serialises calls."""

    def __init__(
        self,
        settings: Settings,
        policy: Policy,
        *,
        signals: SignalSuite | None = None,
        certificates: CertificateLedger | None = None,
        wall_clock: Callable[[], datetime] = _wall_clock,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        """``clock_ns``: what the stages are timed on (monotonic: a step of the wall clock
        timed a stage at -1 h or +1 h); ``wall_clock``: the events' ``produced_at``."""
        self._policy = policy
        # the policy's allow certificates, shared with the fleet (the adapter reads
        # rag.certificates into it; withdrawals found here are published on ticks)
        self.certificates = certificates
        self._wall_clock = wall_clock
        self._clock_ns = clock_ns
        join = settings.join
        self.store = JoinStore(
            join.max_entries,
            join.ttl_ms,
            max_bytes=join.max_bytes,
            decided_memory_ms=join.decided_memory_ms,
            decided_max_entries=join.decided_max_entries,
            max_records_behind=join.max_records_behind,
        )
        self.counters = Counters()
        self.waiting_labels = WaitingLabels(max_age_ms=join.decided_memory_ms)
        self.scoring = Scoring(
            signals or SignalSuite(),
            clock_ns=clock_ns,
            max_request_bytes=settings.limits.max_request_bytes,
        )
        self.intake = Intake(
            self.store,
            self.scoring.signals,
            limits=settings.limits,
            tenancy=settings.tenancy,
            clock_ns=clock_ns,
            reroute=settings.join.reroute,
        )

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def progress(self) -> Progress:
        """Beats of the processor thread's work (a record admitted, a request scored)."""
        return self.scoring.progress

    @property
    def signals(self) -> SignalSuite:
        return self.scoring.signals

    # ------------------------------------------------------------------ inputs

    def on_message(
        self, kind: InputKind, raw: bytes | None, key: bytes | None, ref: InputRef, now_ms: float
    ) -> Step:
        """One consumed message: a batch of one."""
        return self.on_batch([(kind, raw, key, ref)], now_ms)

    def on_batch(self, items: Sequence[BatchItem], now_ms: float) -> Step:
        """A consumed batch; the requests it completes are scored together, in order."""
        step, _ = self.on_part(items, 0, now_ms, None)
        return step

    def on_part(
        self, items: Sequence[BatchItem], start: int, now_ms: float, budget_ns: int | None
    ) -> tuple[Step, int]:
        """``items[start:]`` until ``budget_ns`` of work is spent: the step, and where the
        next part starts (``len(items)``: the batch is through).

        A part ends after the record at which the budget ran out, or, with the claim
        check on, after a record that completed a request: its claims not verified yet
        (all of them, when its retrieval came after its answer) are verified as it is
        decided, at the part's end, and its verdict should not wait for more of the
        batch. ``None``: the whole rest, one part. The adapter hands each part's
        step to the producer before the next is worked on, so a batch with claims on streams its
        verdicts instead of holding them all to its end (``bench/batch_parts.py``: a
        backlog of 100 claim-path answers had its first verdict after 11-33 s, often all
        100 at once; in parts, after 1.6-3.4 s).
        """
        step = Step()
        # by identity, in completion order (PendingRequest's dataclass == compares every field)
        completed: dict[int, PendingRequest] = {}
        progress = self.progress
        retrieval = feedback = 0  # records per kind (generation: the rest), tallied once
        clock_ns = self._clock_ns
        deadline = None if budget_ns is None else clock_ns() + budget_ns
        claims_on = self.scoring.signals.claims is not None
        end = len(items)
        index = start
        while index < end:
            item = items[index]
            index += 1
            kind, raw, key, ref = item
            progress.beat()
            if kind is not _GENERATION:  # most records are deltas: one test each
                if kind is _RETRIEVAL:
                    retrieval += 1
                else:
                    feedback += 1
            try:
                self._admit(item, now_ms, step, completed)
            except Exception as exc:  # a bug of ours must cost this message only
                log.exception(
                    "internal error on %s[%d]@%d",
                    ref.topic,
                    ref.partition,
                    ref.offset,
                    extra=PER_INPUT,
                )
                error = InputError("internal-error", _describe(exc))
                step.extend(self.dead_letter(raw, key, ref, error))
                self.counters.inputs.add(kind, Outcome.DEAD_LETTERED)
            if deadline is not None and ((claims_on and completed) or clock_ns() >= deadline):
                break
        self.counters.consumed += index - start
        self.counters.inputs.batch(retrieval, index - start - retrieval - feedback, feedback)
        if completed:
            step.extend(self._decide_all(list(completed.values()), now_ms))
        return step, index

    def _admit(
        self, item: BatchItem, now_ms: float, step: Step, completed: dict[int, PendingRequest]
    ) -> None:
        kind, raw, key, ref = item
        admission = (
            self.intake.finished_before(kind, raw, ref, now_ms)
            if ref.finished
            else self.intake.admit(kind, raw, key, ref, now_ms)
        )
        match admission:  # most records are held: that case is tried first
            case Held(entry, evicted):
                for old in evicted:
                    step.extend(self._incomplete(old, "capacity", now_ms))
                if entry.complete:
                    # decided from now on: out of the store, so that nothing later in this
                    # batch can evict it (an incomplete verdict beside its real one)
                    self.store.close(entry.store_key, now_ms)
                    completed.setdefault(id(entry), entry)
                elif entry.cannot_complete:  # the other half came, and was dead-lettered
                    step.extend(self._incomplete(entry, "dead-lettered", now_ms))
                elif self.scoring.signals.claims is not None:  # else nothing streams
                    step.outputs.extend(self._stream(entry))
                    for old in self._hold_claims(entry):
                        step.extend(self._incomplete(old, "capacity", now_ms))
            case Labelled(feedback, tenant):
                step.extend(self._feedback(feedback, tenant, ref, now_ms))
            case Duplicate():
                self.counters.duplicates += 1
                self.counters.inputs.add(kind, Outcome.DUPLICATE)
                step.done.append(ref)
            case Rejected(error, evicted, request):
                for old in evicted:
                    step.extend(self._incomplete(old, "capacity", now_ms))
                step.extend(self.dead_letter(raw, key, ref, error))
                self.counters.inputs.add(kind, Outcome.DEAD_LETTERED)
                if request is not None and request.cannot_complete:
                    step.extend(self._incomplete(request, "dead-lettered", now_ms))
            case Rerouted(request_id):
                # finished here once the copy is confirmed; the home partition's replica
                # joins it (and counts it consumed, accepted or not)
                step.outputs.append(outputs.rerouted_output(kind, raw, request_id, ref))
                step.done.append(ref)
                self.counters.inputs.add(kind, Outcome.REROUTED)

    def _feedback(
        self, event: FeedbackEvent, tenant: str | None, ref: InputRef, now_ms: float
    ) -> Step:
        """A labelled outcome: folded into the coverage bound; nothing is published.

        One label per request (the last wins); a label for a request still open
        here waits for its verdict; a label for a request none of whose events
        came yet waits for it (:class:`~sidecar.pipeline.labels.WaitingLabels`,
        up to ``join.decided_memory_ms``); a label no request of this instance
        claims is counted as unmatched.
        """
        self.counters.feedback += 1
        request_key = self.intake.store_key(event.request_id, tenant)
        open_entry = self.store.get(request_key)
        if open_entry is not None:
            self.counters.feedback_early += 1
            open_entry.early_label = event
        elif not self._label(
            event, request_key, self.intake.label_partition(event.request_id, ref), final=False
        ):
            self.counters.feedback_early += 1
            self.counters.feedback_unmatched += self.waiting_labels.hold(
                request_key, event, now_ms, owner=tenant or ""
            )
        return Step(done=[ref])

    def _label(
        self, event: FeedbackEvent, request_key: str, partition: int, *, final: bool = True
    ) -> bool:
        """Fold a label into the coverage bound, in ``partition``'s window (its request's);
        whether a decided request took it.

        ``final``: a label no request took is counted unmatched (else the
        caller keeps it waiting).
        """
        coverage = self.signals.coverage
        outcome = (
            coverage.observe_feedback(event, request_key, partition) if coverage is not None else 0
        )
        if outcome == 0:
            if final or coverage is None:
                self.counters.feedback_unmatched += 1
                return True
            return False
        if outcome == 2:
            self.counters.feedback_replaced += 1
        return True

    def _stream(self, entry: PendingRequest) -> list[outputs.Output]:
        """Claim verdicts for newly completed sentences, and a strict-mode block if due."""
        results, span = self.scoring.stream(entry)
        if not results:
            return []
        out = self._claim_outputs(entry, results, span)
        if not entry.stream_blocked and entry.retrieval is not None:
            outcome = self._policy.check_stream(
                entry.retrieval, entry.claim_results, entry.certification
            )
            if outcome is not None:
                entry.stream_blocked = True
                self.counters.verdicts += 1
                out.append(
                    outputs.stream_block_output(
                        entry,
                        outcome,
                        policy=self._policy.name,
                        claims_so_far=len(entry.claim_results),
                        produced_at=self._wall_clock(),
                    )
                )
        return out

    def _hold_claims(self, entry: PendingRequest) -> list[PendingRequest]:
        """Count a streaming request's newly opened claim session in the join's byte budget.

        Once per request, when its session opened (the evidence index does not
        grow); returns the older requests evicted to make room. A decided
        request's session lives only while its batch is decided, so is not counted.
        """
        if entry.claims is None or entry.claims_bytes:
            return []
        entry.claims_bytes = entry.claims.held_bytes
        return self.store.hold_bytes(entry, entry.claims_bytes)

    def _claim_outputs(
        self, entry: PendingRequest, results: Sequence[ClaimResult], span: tuple[int, int]
    ) -> list[outputs.Output]:
        checker = self.signals.claims
        if checker is None or not results:
            return []
        self.counters.claim_verdicts += len(results)
        entry.claims_published += len(results)
        return outputs.claim_outputs(
            entry,
            results,
            verifier_version=checker.version,
            span_ns=span,
            produced_at=self._wall_clock(),
        )

    # ------------------------------------------------------------------ deciding

    def _decide_all(self, entries: list[PendingRequest], now_ms: float) -> Step:
        step = Step()
        started_ns = self._clock_ns()
        for entry in entries:
            entry.stages.append(("join", entry.first_seen_ns, started_ns))
            try:
                step.outputs.extend(self._stream(entry))
            except Exception:
                log.exception(
                    "streaming the last claims failed for %s", entry.request_id, extra=PER_INPUT
                )
        try:
            scored = self.scoring.score(entries)
        except Exception:  # scoring guards each signal; this is a bug of ours
            log.exception("scoring a batch of %d requests failed", len(entries), extra=PER_INPUT)
            for entry in entries:
                step.extend(self._failed(entry, "scoring failed"))
            return step
        signals_ns = self._clock_ns() - started_ns
        batch = self._batch()
        for entry, result in zip(entries, scored, strict=True):
            try:
                step.extend(self._decide(entry, result, now_ms, signals_ns, batch))
            except Exception as exc:  # this request pays, never its batch
                log.exception("deciding %s failed", entry.request_id, extra=PER_INPUT)
                step.extend(self._failed(entry, _describe(exc)))
        return step

    def _batch(self) -> _Batch:
        """What every verdict of a scored batch shares: the same models and policy decide
        it all (a verdict adds its generator in front), read once a batch, not per verdict."""
        signals = self.signals
        versions = {**signals.versions(), "policy": self._policy.fingerprint}
        return _Batch(
            versions=versions,
            models=outputs.model_attributes(versions),
            policy=self._policy.name,
            confidence_status=SignalStatus.NOT_CONFIGURED
            if signals.confidence is None
            else SignalStatus.UNAVAILABLE,  # served, but failed or not finite for this answer
            certifier=signals.certifier,
            coverage=signals.coverage,
        )

    def _decide(
        self, entry: PendingRequest, scored: Scored, now_ms: float, signals_ns: int, batch: _Batch
    ) -> Step:
        """One complete request's verdict (and its last claim verdicts before it)."""
        retrieval, final = entry.retrieval, entry.final
        if retrieval is None or final is None:  # only complete requests are decided
            raise AssertionError(f"request {entry.request_id} is not complete")
        claim_outputs = self._claim_outputs(entry, scored.final_claims, scored.claims_span_ns)
        confidence = scored.confidence
        p_correct = confidence.p_correct if confidence else None
        signals = scored.signals
        t_policy = self._clock_ns()
        outcome = self._policy.decide(
            retrieval,
            final,
            signals,
            claims=entry.claims.results if entry.claims is not None else None,
            confidence=p_correct,
            confidence_status=batch.confidence_status,
        )
        t_done = self._clock_ns()
        entry.stages.append(("policy", t_policy, t_done))
        key = outputs.answer_key(entry)
        model_versions, models = batch.generator_models(final.generator_model)
        policy = batch.policy
        tenant = retrieval.tenant
        decision = outcome.decision
        reasons = outcome.reasons
        value = answer_verdict_json(  # the bytes of the AnswerVerdict, without the model
            request_id=entry.request_id,
            idempotency_key=key,
            tenant=tenant,
            decision=decision,
            reasons=reasons,
            escalate=outcome.escalate,
            policy=policy,
            signals=signals,
            confidence=p_correct,
            confidence_features=confidence.features if confidence else None,
            chunk_forecast=confidence.chunk_forecast if confidence else (),
            advice=confidence.advice if confidence else None,
            certified_risk=outcome.certified_risk,
            certified_delta=outcome.certified_delta,
            certificate=outcome.certificate,
            caveat_text=outcome.caveat_text,
            rewritten_answer=outcome.rewritten_answer,
            model_versions=model_versions,  # {"generator": ..., **signal versions, "policy": ...}
            timings_ms={
                "join_wait": max(0.0, now_ms - entry.first_seen_ms),
                "signals": signals_ns / 1e6,
                "policy": (t_done - t_policy) / 1e6,
            },
            produced_at=self._wall_clock(),
            sidecar_version=__version__,
        )
        if batch.certifier is not None:
            batch.certifier.observe_decided(retrieval, signals.retrieval)
        coverage = batch.coverage
        if coverage is not None:
            store_key = entry.store_key
            partition = next(iter(entry.partitions), 0)  # the input partition it was read on
            coverage.observe_decision(
                store_key,
                decision,
                signals.retrieval,
                outcome.certificate,
                tenant=tenant,
                partition=partition,
            )
            waited = self.waiting_labels.take(store_key)
            label = entry.early_label or waited
            if label is not None:  # on its request's partition (the labels' are keyed alike)
                self._label(label, store_key, partition)
        self.counters.verdicts += 1
        attributes = outputs.answer_attributes(
            request_id=entry.request_id,
            tenant=tenant,
            decision=decision,
            stage="final",
            reasons=reasons,
            policy=policy,
            models=models,
        )
        step = outputs.answer_output(
            entry, value, key, attributes=attributes, end_ns=self._clock_ns()
        )
        if claim_outputs:  # published before the verdict, as they were decided
            step.outputs[:0] = claim_outputs
        return step

    def _failed(self, entry: PendingRequest, detail: str) -> Step:
        self.counters.internal_errors += 1
        self.counters.verdicts += 1
        verdict = outputs.failed_verdict(
            entry, detail, policy=self._policy.name, produced_at=self._wall_clock()
        )
        return outputs.verdict_output(verdict, entry, self._clock_ns())

    def _incomplete(self, entry: PendingRequest, why: str, now_ms: float) -> Step:
        self.counters.incomplete += 1
        # an undecided request takes no label: one that waited for it is unmatched
        waited = self.waiting_labels.take(entry.store_key)
        self.counters.feedback_unmatched += (entry.early_label or waited) is not None
        self.counters.verdicts += 1
        self.store.close(entry.store_key, now_ms)
        self.intake.note_misrouted(entry)  # its halves may be on two replicas: say why
        verdict = outputs.incomplete_verdict(
            entry, why, policy=self._policy.name, produced_at=self._wall_clock()
        )
        return outputs.verdict_output(verdict, entry, self._clock_ns())

    # ------------------------------------------------------------------ time

    def warm_start(
        self, decided: Sequence[DecidedRequest], partitions: int | None = None
    ) -> WarmStart:
        """Requests decided before this process started, oldest first (the fleet's final
        verdicts: :mod:`sidecar.kafka.warmstart`), before the first input: the
        exchangeability monitor's windows are refilled from them, and the coverage monitor
        keeps them for their labels and for the windows of the partitions it will read
        (``partitions``: the input topics' partition count, if known). A certified allow
        counts as one only under the policy (and so the certificates) that decides now:
        another's labels would re-test a certificate that did not allow it."""
        certifier = self.scoring.signals.certifier
        seed = None
        if certifier is not None:
            seed = certifier.seed_decided((d.tenant, d.retrieval) for d in decided)
        return WarmStart(seed, self.recall_decided(decided, partitions))

    def recall_decided(
        self, decided: Sequence[DecidedRequest], partitions: int | None = None
    ) -> int:
        """:meth:`warm_start`'s coverage half, alone: requests another replica decided on
        partitions just assigned here, kept for their labels. Thread-safe (the coverage
        monitor's lock): called between batches, from the rebalance."""
        coverage = self.scoring.signals.coverage
        if coverage is None:
            return 0
        policy = self._policy.fingerprint
        return coverage.remember_decided(
            (
                (
                    self.intake.decided_key(d.request_id, d.tenant),
                    d if d.policy == policy else dataclasses.replace(d, certificate=None),
                )
                for d in decided
            ),
            partitions,
        )

    def hold_partitions(
        self,
        partitions: frozenset[int],
        count: int,
        labels: Iterable[ReadLabel] = (),
    ) -> HeldPartitions | None:
        """The input partitions this replica reads now, of ``count``: the coverage windows
        of those it no longer reads are dropped and those it did not read refilled
        (:meth:`CoverageMonitor.hold_partitions`), their labels from ``labels`` (the
        feedback topic's read back by :meth:`read_back_label`, oldest first); ``None``
        without a coverage monitor. Thread-safe (the monitor's lock): called from the
        rebalance, after the recall."""
        coverage = self.scoring.signals.coverage
        if coverage is None:
            return None
        return coverage.hold_partitions(partitions, count, labels)

    def read_back_label(
        self, raw: bytes | None, key: bytes | None, ref: InputRef
    ) -> ReadLabel | None:
        """A feedback record read back from its topic, as it was taken when consumed, with
        its request's key and the partition whose windows it counts in; ``None`` for one
        intake refuses (dead-lettered when consumed). Counts nothing."""
        found = self.intake.read_back_label(raw, key, ref)
        if found is None:
            return None
        name, label, owner = found
        partition = self.intake.label_partition(label.request_id, ref)
        return ReadLabel(
            name,
            label.correct,
            label.abstained,
            partition,
            label.request_id,
            owner,
            ref.timestamp_ms,
        )

    def move_waiting_labels(
        self, held: HeldPartitions, count: int, now_ms: float, wall_ms: float
    ) -> int:
        """The labels waiting for their requests follow the partitions (an assignment's
        :meth:`hold_partitions` said which moved): those whose request murmur2 puts on a
        partition read elsewhere now leave, not counted unmatched (the new owner reads them
        back and keeps them waiting; here they would wait in vain), and those read back
        whose request is not known here wait for it (:meth:`wait_for_requests`). Returns
        how many of those wait. Called on the processor's thread."""
        if held.gone and count > 1 and len(self.waiting_labels):
            self.waiting_labels.drop_homes(set(held.gone), count)
        return self.wait_for_requests(held.unknown, now_ms, wall_ms)

    def wait_for_requests(self, labels: Sequence[ReadLabel], now_ms: float, wall_ms: float) -> int:
        """Labels read back for partitions just assigned whose requests are not known here
        (:attr:`HeldPartitions.unknown`, oldest first): those read within the decided memory
        (``join.decided_memory_ms``; a timestamp ahead of this clock counts as recent: the
        producer's clock) may have been waiting for their request where they were read
        (the feedback topic ran ahead of the inputs), and wait for it here, the newest
        first, in the room consumed labels leave. Returns how many wait. Called on the
        processor's thread."""
        memory = self.waiting_labels.max_age_ms  # join.decided_memory_ms
        waiting = 0
        for label in reversed(labels):
            stamp = label.timestamp_ms
            if not label.request_id or stamp < 0 or stamp <= wall_ms - memory:
                continue
            event = FeedbackEvent.model_construct(  # read as intake reads it: valid
                request_id=label.request_id,
                correct=label.correct,
                abstained=label.abstained,
                source=READ_BACK_SOURCE,
            )
            waiting += self.waiting_labels.hold_read_back(
                label.request_key, event, now_ms, label.owner
            )
        return waiting

    def on_tick(self, now_ms: float, wall_ms: float | None = None) -> Step:
        """Expire half-requests older than the TTL into ``incomplete`` verdicts; due reports.

        ``now_ms`` is the join's clock (the adapter's may stand still while it is
        behind its input); ``wall_ms`` the monotonic time the reports are due by
        (default: ``now_ms``).
        """
        step = Step()
        for entry in self.store.expire(now_ms):
            step.extend(self._incomplete(entry, "ttl", now_ms))
        for entry in self.store.behind():
            step.extend(self._incomplete(entry, "records-behind", now_ms))
        self.counters.feedback_unmatched += self.waiting_labels.expire(now_ms)
        coverage = self.signals.coverage
        if coverage is not None:
            for report in coverage.due_reports(now_ms if wall_ms is None else wall_ms):
                self.counters.reports += 1
                step.outputs.append(outputs.report_output(report))
        step.extend(self.withdrawals())
        return step

    def withdrawals(self, *, unconfirmed: bool = False) -> Step:
        """The certificate withdrawals to publish for the fleet (``on_tick``; with
        ``unconfirmed``, at shutdown, also those the fleet's topic has not shown back)."""
        step = Step()
        if self.certificates is None:
            return step
        for withdrawal in self.certificates.take_withdrawals(unconfirmed=unconfirmed):
            log.warning(
                "certified allow of %s withdrawn for the fleet: %d of %d labelled allowed "
                "answers wrong, above the certified risk %g",
                withdrawal.calibration_key, withdrawal.errors, withdrawal.labelled,
                withdrawal.risk,
            )  # fmt: skip
            step.outputs.append(outputs.withdrawal_output(withdrawal))
        return step

    # ------------------------------------------------------------------ dead letters

    def dead_letter(
        self, raw: bytes | None, key: bytes | None, ref: InputRef, error: InputError
    ) -> Step:
        self.counters.dead_letters += 1
        reasons = self.counters.dead_letter_reasons
        reasons[error.reason] = reasons.get(error.reason, 0) + 1
        out = deadletters.dead_letter_output(raw, key, ref, error, failed_at=self._wall_clock())
        return Step(outputs=[out], done=[ref])
