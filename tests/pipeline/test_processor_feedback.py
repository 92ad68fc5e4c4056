"""Feedback events, coverage reports and the calibrated confidence inside the processor."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.confidence.fleet import CoverageMonitor
from sidecar.confidence.scorer import CalibratedConfidenceScorer
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    ChunkForecast,
    CoverageReport,
    DeadLetterRecord,
    Decision,
    FeedbackEvent,
    GenerationFinal,
    RetrievalEvent,
    RetrieveAgain,
    Signals,
)
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.labels import WaitingLabels
from sidecar.pipeline.outputs import Destination, Step
from sidecar.pipeline.ports import ConfidenceResult, ConfidenceScorer, SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.policy.config import load_policy
from sidecar.policy.engine import PolicyEngine
from tests.confidence.factories import fit_models
from tests.conftest import REPO, EventFactory, dumps
from tests.fakes import ThresholdCertifier

R, G, F = InputKind.RETRIEVAL, InputKind.GENERATION, InputKind.FEEDBACK
FIXED = datetime(2026, 1, 1, tzinfo=UTC)
KEY = "acme/wiki"


FIXED_RESULT = ConfidenceResult(
    p_correct=0.42,
    features={"retrieval_top_score": 0.71, "lookback_p": None},
    chunk_forecast=(ChunkForecast(chunk_id="c1", p_useful=0.6, retrieval_rank=0),),
    advice=RetrieveAgain(best_forecast=0.6, tau=0.7, hint="try again", missing_terms=["x"]),
)


@dataclass
class StubScorer:
    version: str = "stub-confidence/1"
    fail: bool = False
    calls: int = 0

    def score(
        self, retrieval: RetrievalEvent, final: GenerationFinal, signals: Signals
    ) -> ConfidenceResult:
        del retrieval, final, signals
        self.calls += 1
        if self.fail:
            raise RuntimeError("confidence model exploded")
        return FIXED_RESULT

    def score_batch(
        self, items: Sequence[tuple[RetrievalEvent, GenerationFinal, Signals]]
    ) -> list[ConfidenceResult]:
        return [self.score(*item) for item in items]


class Feed:
    """Feeds a processor with consecutive offsets per topic."""

    def __init__(self, processor: Processor) -> None:
        self.processor = processor
        self.offsets: dict[str, int] = {}

    def ref(self, kind: InputKind) -> InputRef:
        topic = f"rag.{kind.value}"
        off = self.offsets.get(topic, 0)
        self.offsets[topic] = off + 1
        return InputRef(topic, 0, off)

    def __call__(
        self, kind: InputKind, raw: bytes | None, now_ms: float = 0.0, key: bytes | None = None
    ) -> Step:
        return self.processor.on_message(kind, raw, key, self.ref(kind), now_ms)


def make_feed(
    settings_factory: Callable[..., Settings],
    *,
    coverage: CoverageMonitor | None = None,
    confidence: ConfidenceScorer | None = None,
) -> Feed:
    suite = SignalSuite(
        certifier=ThresholdCertifier(calibration_key=KEY), coverage=coverage, confidence=confidence
    )
    settings = settings_factory(join={"max_entries": 10, "ttl_ms": 1000})
    return Feed(Processor(settings, PlaceholderPolicy(), signals=suite, wall_clock=lambda: FIXED))


def feedback_event(request_id: str = "req-1", **overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "schema_version": 1,
        "event_type": "feedback",
        "request_id": request_id,
        "correct": False,
        "source": "reviewer",
    }
    event.update(overrides)
    return event


def verdict_of(step: Step) -> AnswerVerdict:
    [out] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    return AnswerVerdict.model_validate(orjson.loads(out.value))


def dlq_reason(step: Step) -> str:
    [out] = step.outputs
    assert out.destination is Destination.DLQ
    return DeadLetterRecord.from_headers(out.headers).reason


def decide(
    feed: Feed,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    request_id: str,
    *,
    covered: bool = True,
    now_ms: float = 0.0,
) -> AnswerVerdict:
    hits = None if covered else [{"chunk_id": "c9", "doc_id": "d9", "score": 0.1, "text": "no"}]
    overrides = {} if hits is None else {"hits": hits}
    feed(R, dumps(retrieval_event(request_id, **overrides)), now_ms, request_id.encode())
    return verdict_of(feed(G, dumps(final_event(request_id)), now_ms, request_id.encode()))


# ------------------------------------------------------------------ feedback


def test_feedback_finishes_its_input_and_publishes_nothing(
    settings_factory: Callable[..., Settings],
) -> None:
    feed = make_feed(settings_factory)
    step = feed(F, dumps(feedback_event()), key=b"req-1")
    assert step.outputs == []
    assert step.done == [InputRef("rag.feedback", 0, 0)]
    c = feed.processor.counters
    assert (c.consumed, c.feedback, c.feedback_unmatched, c.dead_letters) == (1, 1, 1, 0)
    assert len(feed.processor.store) == 0  # feedback never opens a join entry


def test_feedback_for_a_decided_request_labels_the_coverage_bound(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    monitor = CoverageMonitor()
    feed = make_feed(settings_factory, coverage=monitor)
    assert decide(feed, retrieval_event, final_event, "req-a").signals.retrieval.m1 is True
    assert (
        decide(feed, retrieval_event, final_event, "req-b", covered=False).signals.retrieval.m1
        is False
    )
    assert feed(F, dumps(feedback_event("req-a", correct=False)), key=b"req-a").outputs == []
    feed(F, dumps(feedback_event("req-b", correct=True)), key=b"req-b")
    feed(F, dumps(feedback_event("req-unknown")), key=b"req-unknown")
    counts = monitor.tracker.counts(KEY)
    assert (counts.requests, counts.covered) == (2, 1)
    assert (counts.labelled_covered, counts.errors_covered) == (1, 1)
    assert (counts.labelled_uncovered, counts.errors_uncovered) == (1, 0)
    assert feed.processor.counters.feedback == 3
    # the unknown request's label waits for it, then leaves unmatched
    assert feed.processor.counters.feedback_unmatched == 0
    assert len(feed.processor.waiting_labels) == 1
    feed.processor.on_tick(feed.processor.waiting_labels.max_age_ms + 1.0)
    assert feed.processor.counters.feedback_unmatched == 1
    assert len(feed.processor.waiting_labels) == 0


def test_feedback_before_the_decision_waits_for_it_and_does_not_disturb_the_join(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    coverage = CoverageMonitor()
    feed = make_feed(settings_factory, coverage=coverage)
    feed(R, dumps(retrieval_event("req-x")), key=b"req-x")
    step = feed(F, dumps(feedback_event("req-x")), key=b"req-x")
    assert step.outputs == [] and len(step.done) == 1
    counters = feed.processor.counters
    assert (counters.feedback_early, counters.feedback_unmatched) == (1, 0)
    assert (
        coverage.tracker.counts(KEY).labelled_covered
        + coverage.tracker.counts(KEY).labelled_uncovered
        == 0
    )
    v = verdict_of(feed(G, dumps(final_event("req-x")), key=b"req-x"))
    assert v.request_id == "req-x"
    # the held label is counted once the verdict exists
    counts = coverage.tracker.counts(KEY)
    assert counts.labelled_covered + counts.labelled_uncovered == 1
    # feedback after the decision is not "after-final": it is what feedback is for;
    # a second label for the same request replaces the first (one label per request)
    late = feed(F, dumps(feedback_event("req-x", correct=True)), now_ms=10, key=b"req-x")
    assert late.outputs == []
    assert (counters.feedback_unmatched, counters.feedback_replaced) == (0, 1)
    counts = coverage.tracker.counts(KEY)
    assert counts.labelled_covered + counts.labelled_uncovered == 1
    assert counts.errors_covered + counts.errors_uncovered == 0  # the last label wins


def test_a_flood_of_labels_for_one_request_counts_as_one(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    coverage = CoverageMonitor(window=100)
    feed = make_feed(settings_factory, coverage=coverage)
    for i in range(5):
        rid = f"req-{i}"
        feed(R, dumps(retrieval_event(rid)), key=rid.encode())
        feed(G, dumps(final_event(rid)), key=rid.encode())
        feed(F, dumps(feedback_event(rid, correct=True)), key=rid.encode())
    for _ in range(1000):  # a sloppy or hostile reviewer repeats one label
        feed(F, dumps(feedback_event("req-0", correct=False)), key=b"req-0")
    counts = coverage.tracker.counts(KEY)
    assert counts.labelled_covered + counts.labelled_uncovered == 5  # genuine labels kept
    assert counts.errors_covered + counts.errors_uncovered == 1
    assert feed.processor.counters.feedback_replaced == 1000


def test_feedback_with_a_mismatching_key_is_dead_lettered(
    settings_factory: Callable[..., Settings],
) -> None:
    feed = make_feed(settings_factory, coverage=CoverageMonitor())
    raw = dumps(feedback_event("req-1"))
    step = feed(F, raw, key=b"req-2")
    assert dlq_reason(step) == "key-mismatch"
    [out] = step.outputs
    assert out.value == raw and out.key == b"req-2"
    assert DeadLetterRecord.from_headers(out.headers).source_topic == "rag.feedback"
    assert step.done == [InputRef("rag.feedback", 0, 0)]
    c = feed.processor.counters
    assert (c.feedback, c.feedback_unmatched, c.dead_letters) == (0, 0, 1)
    assert c.dead_letter_reasons == {"key-mismatch": 1}


def test_feedback_without_a_key_is_accepted(settings_factory: Callable[..., Settings]) -> None:
    feed = make_feed(settings_factory)
    assert feed(F, dumps(feedback_event()), key=None).outputs == []
    assert feed.processor.counters.feedback == 1


@pytest.mark.parametrize(
    ("kind", "raw", "reason"),
    [
        (F, b'{"schema_version": 1, "event_type": "feedb', "malformed-json"),
        (F, None, "malformed-json"),
        (
            F,
            dumps({k: v for k, v in feedback_event().items() if k != "source"}),
            "schema-violation",
        ),
        (F, dumps(feedback_event(correct=None)), "schema-violation"),
        (F, dumps(feedback_event(extra_field=1)), "schema-violation"),
        (F, dumps(feedback_event(schema_version=2)), "unknown-schema-version"),
        (F, dumps(feedback_event(event_type="retrieval")), "wrong-event-type"),
        (R, dumps(feedback_event()), "wrong-event-type"),
        (G, dumps(feedback_event()), "wrong-event-type"),
    ],
    ids=[
        "broken-json",
        "tombstone",
        "no-source",
        "null-label",
        "unknown-field",
        "schema-v2",
        "retrieval-on-feedback-topic",
        "feedback-on-retrieval-topic",
        "feedback-on-generation-topic",
    ],
)
def test_malformed_feedback_is_dead_lettered(
    settings_factory: Callable[..., Settings], kind: InputKind, raw: bytes | None, reason: str
) -> None:
    feed = make_feed(settings_factory, coverage=CoverageMonitor())
    step = feed(kind, raw, key=b"req-1")
    assert dlq_reason(step) == reason
    assert len(step.done) == 1
    assert feed.processor.counters.feedback == 0


def test_feedback_inside_a_batch(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    monitor = CoverageMonitor()
    feed = make_feed(settings_factory, coverage=monitor)
    p = feed.processor
    items = [
        (R, dumps(retrieval_event("req-b")), b"req-b", feed.ref(R)),
        (G, dumps(final_event("req-b")), b"req-b", feed.ref(G)),
        (F, dumps(feedback_event("req-old")), b"req-old", feed.ref(F)),
        (F, dumps(feedback_event("req-b")), b"wrong", feed.ref(F)),
    ]
    step = p.on_batch(items, 0.0)
    assert [o.destination for o in step.outputs] == [Destination.DLQ, Destination.VERDICTS]
    assert len(step.done) == 4
    assert (p.counters.feedback, p.counters.feedback_unmatched) == (1, 0)
    assert len(p.waiting_labels) == 1  # req-old's label waits for req-old


def test_a_label_before_any_event_of_its_request_labels_it_when_decided(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    monitor = CoverageMonitor()
    feed = make_feed(settings_factory, coverage=monitor)
    feed(F, dumps(feedback_event("req-a", correct=False)), key=b"req-a")
    assert len(feed.processor.waiting_labels) == 1
    decide(feed, retrieval_event, final_event, "req-a", now_ms=5_000.0)
    counts = monitor.tracker.counts(KEY)
    assert (counts.labelled_covered, counts.errors_covered) == (1, 1)
    c = feed.processor.counters
    assert (c.feedback, c.feedback_early, c.feedback_unmatched) == (1, 1, 0)
    assert len(feed.processor.waiting_labels) == 0


def test_a_label_whose_request_ends_incomplete_is_counted_unmatched(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
) -> None:
    feed = make_feed(settings_factory, coverage=CoverageMonitor())
    feed(F, dumps(feedback_event("req-a")), key=b"req-a")  # waits: no event yet
    feed(R, dumps(retrieval_event("req-a")), key=b"req-a")
    feed(F, dumps(feedback_event("req-b")), key=b"req-b")  # waits
    feed(R, dumps(retrieval_event("req-b")), key=b"req-b")
    feed(F, dumps(feedback_event("req-b")), key=b"req-b")  # rides on the open request
    assert feed.processor.counters.feedback_unmatched == 0
    expired = feed.processor.on_tick(feed.processor.store.ttl_ms + 1.0)
    assert len(expired.outputs) == 2  # two incomplete verdicts
    assert feed.processor.counters.feedback_unmatched == 2
    assert len(feed.processor.waiting_labels) == 0


def test_waiting_labels_are_bounded_oldest_first() -> None:
    labels = WaitingLabels(max_age_ms=1_000.0, max_entries=2)
    one, two, three = (
        FeedbackEvent(request_id=r, correct=True, source="user") for r in ("a", "b", "c")
    )
    assert labels.hold("a", one, 0.0) == 0
    assert labels.hold("b", two, 10.0) == 0
    assert labels.hold("a", one, 20.0) == 0  # a later label for "a" replaces it (and is newest)
    assert labels.hold("c", three, 30.0) == 1  # "b" leaves for room
    assert labels.take("b") is None and labels.take("a") is one
    assert labels.expire(1_029.0) == 0 and labels.expire(1_030.0) == 1
    assert len(labels) == 0


def test_one_tenants_label_flood_evicts_its_own_labels_not_anothers() -> None:
    """With header tenancy, tenant evil's 10,001 labels for ids that never come erased
    acme's waiting label (oldest first, one pool): its error never reached the coverage
    bound or the certificate re-test (helper-15). Room is made from the richest tenant."""
    labels = WaitingLabels(max_age_ms=60_000.0, max_entries=100)
    wrong = FeedbackEvent(request_id="req-acme", correct=False, source="user")
    labels.hold("acme/req-acme", wrong, 0.0, owner="acme")
    flood = FeedbackEvent(request_id="x", correct=True, source="bot")
    dropped = sum(labels.hold(f"evil/x{i}", flood, 1.0, owner="evil") for i in range(10_001))
    assert dropped == 10_001 + 1 - 100
    assert labels.take("acme/req-acme") is wrong
    assert len(labels) == 99


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["hold", "hold", "hold", "take", "expire"]),
            st.integers(0, 30),  # key
            st.sampled_from(["", "a", "b", "c"]),  # owner
        ),
        max_size=120,
    )
)
def test_waiting_labels_evict_from_a_tenant_that_holds_the_most(
    ops: list[tuple[str, int, str]],
) -> None:
    labels = WaitingLabels(max_age_ms=50.0, max_entries=6)
    owner_of: dict[str, str] = {}
    label = FeedbackEvent(request_id="r", correct=True, source="user")

    def counts() -> dict[str, int]:
        return dict(Counter(owner_of.values()))

    for now, (op, k, owner) in enumerate(ops):
        key = f"k{k}"
        if op == "hold":
            owner_of.pop(key, None)
            owner_of[key] = owner
            full = counts()  # with the new label, before room is made (at most one leaves)
            labels.hold(key, label, float(now), owner=owner)
            for lost in set(owner_of) - set(labels._held):
                assert full[owner_of.pop(lost)] == max(full.values())
        elif op == "take":
            assert (labels.take(key) is not None) is (owner_of.pop(key, None) is not None)
        else:
            labels.expire(float(now))
            for gone in set(owner_of) - set(labels._held):
                owner_of.pop(gone)
        assert set(labels._held) == set(owner_of)
        assert len(labels) <= 6
        assert labels._owners.most == max(counts().values(), default=0)


# ------------------------------------------------------------------ coverage reports


def test_on_tick_publishes_coverage_reports_on_the_reports_destination(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    monitor = CoverageMonitor(report_interval_s=1.0, wall_clock=lambda: FIXED)
    feed = make_feed(settings_factory, coverage=monitor)
    assert feed.processor.on_tick(0.0).outputs == []  # the first tick starts the interval
    decide(feed, retrieval_event, final_event, "req-a", now_ms=100.0)
    decide(feed, retrieval_event, final_event, "req-b", covered=False, now_ms=100.0)
    decide(feed, retrieval_event, final_event, "req-c", now_ms=100.0)
    feed(F, dumps(feedback_event("req-a", correct=True)), key=b"req-a")
    feed(F, dumps(feedback_event("req-b", correct=False)), key=b"req-b")
    assert feed.processor.on_tick(999.0).outputs == []
    step = feed.processor.on_tick(1000.0)
    [out] = step.outputs
    assert out.destination is Destination.REPORTS
    assert out.key == KEY.encode()
    assert step.done == []
    report = CoverageReport.model_validate(orjson.loads(out.value))
    assert report.calibration_key == KEY
    assert report.window_requests == 3
    assert (report.coverage.successes, report.coverage.trials) == (2, 3)
    assert (report.epsilon.successes, report.epsilon.trials) == (0, 1)
    assert (report.delta.successes, report.delta.trials) == (1, 1)
    assert report.delta_source == "labelled-uncovered"
    assert report.produced_at == FIXED
    assert feed.processor.counters.reports == 1
    assert feed.processor.on_tick(1500.0).outputs == []
    assert len(feed.processor.on_tick(2000.0).outputs) == 1
    assert feed.processor.counters.reports == 2


def test_incomplete_verdicts_do_not_count_as_requests(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    monitor = CoverageMonitor(report_interval_s=1.0)
    feed = make_feed(settings_factory, coverage=monitor)
    feed(R, dumps(retrieval_event("req-half")), 0.0)
    step = feed.processor.on_tick(1000.0)  # TTL: block "incomplete"
    v = verdict_of(step)
    assert v.decision is Decision.BLOCK and v.confidence is None
    assert monitor.tracker.keys() == []
    assert [o.destination for o in step.outputs] == [Destination.VERDICTS]


# ------------------------------------------------------------------ confidence on verdicts


def test_verdicts_carry_the_confidence_result(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    scorer = StubScorer()
    feed = make_feed(settings_factory, confidence=scorer)
    v = decide(feed, retrieval_event, final_event, "req-1")
    assert v.confidence == 0.42
    assert v.confidence_features == {"retrieval_top_score": 0.71, "lookback_p": None}
    assert v.chunk_forecast == list(FIXED_RESULT.chunk_forecast)
    assert v.advice == FIXED_RESULT.advice
    assert v.model_versions["confidence"] == "stub-confidence/1"
    assert scorer.calls == 1


def test_without_a_scorer_the_verdict_has_no_confidence(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    v = decide(make_feed(settings_factory), retrieval_event, final_event, "req-1")
    assert v.confidence is None and v.confidence_features == {}
    assert v.chunk_forecast == [] and v.advice is None
    assert "confidence" not in v.model_versions


def test_a_failing_scorer_gives_no_confidence_never_a_crash(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    scorer = StubScorer(fail=True)
    feed = make_feed(settings_factory, confidence=scorer)
    feed(R, dumps(retrieval_event("req-1")))
    step = feed(G, dumps(final_event("req-1")))
    assert [o.destination for o in step.outputs] == [Destination.VERDICTS]
    assert len(step.done) == 2
    v = verdict_of(step)
    assert scorer.calls == 1
    assert v.confidence is None and v.confidence_features == {}
    assert v.chunk_forecast == [] and v.advice is None
    assert v.decision is Decision.CAVEAT  # the policy still decides
    assert feed.processor.counters.dead_letters == 0


def test_verdicts_carry_the_calibrated_scorer_output(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    scorer = CalibratedConfidenceScorer(*fit_models(), tau=0.99)
    feed = make_feed(settings_factory, confidence=scorer)
    v = decide(feed, retrieval_event, final_event, "req-1")
    expected = scorer.score(
        RetrievalEvent.model_validate(retrieval_event("req-1")),
        GenerationFinal.model_validate(final_event("req-1")),
        v.signals,
    )
    assert v.confidence == pytest.approx(expected.p_correct)
    assert v.confidence_features == expected.features
    # only c1 (score .71) is trusted by the certifier; c2 (.33) is not ranked
    assert [f.chunk_id for f in v.chunk_forecast] == ["c1"]
    assert v.advice is not None and v.advice.tau == 0.99
    assert v.model_versions["confidence"] == scorer.version


@dataclass
class BatchFailingScorer(StubScorer):
    """Its batch call fails; one by one, request ``fail_id`` fails and the others score."""

    fail_id: str = ""

    def score(
        self, retrieval: RetrievalEvent, final: GenerationFinal, signals: Signals
    ) -> ConfidenceResult:
        if final.request_id == self.fail_id:
            raise RuntimeError("confidence model exploded on this one")
        return super().score(retrieval, final, signals)

    def score_batch(
        self, items: Sequence[tuple[RetrievalEvent, GenerationFinal, Signals]]
    ) -> list[ConfidenceResult]:
        raise RuntimeError("the batched pass exploded")


def test_a_failing_confidence_batch_is_scored_one_by_one_and_costs_one_request(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    scorer = BatchFailingScorer(fail_id="req-2")
    feed = make_feed(settings_factory, confidence=scorer)
    items = []
    for rid in ("req-1", "req-2", "req-3"):
        items.append((R, dumps(retrieval_event(rid)), None, feed.ref(R)))
        items.append((G, dumps(final_event(rid)), None, feed.ref(G)))
    step = feed.processor.on_batch(items, 0.0)
    verdicts = {
        v.request_id: v
        for v in (
            AnswerVerdict.model_validate(orjson.loads(o.value))
            for o in step.outputs
            if o.destination is Destination.VERDICTS
        )
    }
    assert sorted(verdicts) == ["req-1", "req-2", "req-3"]
    assert verdicts["req-1"].confidence == verdicts["req-3"].confidence == 0.42
    assert verdicts["req-2"].confidence is None and verdicts["req-2"].chunk_forecast == []
    assert len(step.done) == 6


@pytest.mark.parametrize("served", [True, False])
def test_a_missing_confidence_says_whether_the_model_is_served(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    served: bool,
) -> None:
    """Audit: an answer the served confidence model failed on read ``confidence-not-configured``,
    as if no model were loaded; ``confidence-unavailable`` was never produced."""
    config = load_policy(REPO / "models/policy/default.yaml")
    engine = PolicyEngine(config.model_copy(update={"default_profile": "medical"}))
    scorer = BatchFailingScorer(fail_id="req-2") if served else None
    suite = SignalSuite(certifier=ThresholdCertifier(calibration_key=KEY), confidence=scorer)
    processor = Processor(settings_factory(), engine, signals=suite, wall_clock=lambda: FIXED)
    feed = Feed(processor)
    items = []
    for rid in ("req-1", "req-2"):
        items.append((R, dumps(retrieval_event(rid)), None, feed.ref(R)))
        items.append((G, dumps(final_event(rid)), None, feed.ref(G)))
    verdicts = {
        v.request_id: {r.code for r in v.reasons}
        for v in (
            AnswerVerdict.model_validate(orjson.loads(o.value))
            for o in processor.on_batch(items, 0.0).outputs
            if o.destination is Destination.VERDICTS
        )
    }
    missing = {"confidence-unavailable", "confidence-not-configured"}
    if served:  # req-1 scored 0.42, below medical's caveat_below 0.6
        assert verdicts["req-1"] & missing == set() and "confidence-low" in verdicts["req-1"]
        assert verdicts["req-2"] & missing == {"confidence-unavailable"}
    else:
        assert (
            verdicts["req-1"] & missing
            == verdicts["req-2"] & missing
            == {"confidence-not-configured"}
        )
