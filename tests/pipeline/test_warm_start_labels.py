"""Labels for requests decided before a restart (the warm start's coverage half).

A label comes after its answer; the replica that reads it matched it against the
requests its own process decided, so one that came after a restart (or at the replica
its request's partition moved to) was counted unmatched, and a certified allow's label
never re-tested its certificate. ``Processor.warm_start`` hands the coverage monitor the
fleet's final verdicts, parsed from the verdicts topic as ``sidecar.kafka.warmstart``
reads them, for their labels only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiokafka import ConsumerRecord

from sidecar.confidence.fleet import CoverageMonitor, FeedbackOutcome
from sidecar.config import Settings
from sidecar.contracts.events import (
    AnswerVerdict,
    Decision,
    FeedbackEvent,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.kafka.warmstart import decided
from sidecar.pipeline.intake import Intake
from sidecar.pipeline.join import JoinStore
from sidecar.pipeline.ports import DecidedRequest, SignalSuite
from tests.conftest import EventFactory, dumps
from tests.pipeline.test_processor_feedback import KEY, F, decide, feedback_event, make_feed


def as_read(verdicts: list[AnswerVerdict]) -> list[DecidedRequest]:
    """The verdicts as the warm start reads them back from Kafka."""
    out = []
    for offset, v in enumerate(verdicts):
        value = v.model_dump_json().encode()
        record = ConsumerRecord(
            "rag.verdicts", 0, offset, 0, 0, v.request_id.encode(), value, None, 0, len(value), ()
        )
        found = decided(record)
        assert found is not None
        out.append(found.request)
    return out


def test_labels_after_a_restart_reach_the_requests_decided_before_it(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    before = make_feed(settings_factory, coverage=CoverageMonitor())
    verdicts = [
        decide(before, retrieval_event, final_event, f"q-{i}", covered=i % 2 == 0)
        for i in range(20)
    ]
    restarted_monitor, control_monitor = CoverageMonitor(), CoverageMonitor()
    restarted = make_feed(settings_factory, coverage=restarted_monitor)
    control = make_feed(settings_factory, coverage=control_monitor)  # as before: no warm start
    done = restarted.processor.warm_start(as_read(verdicts))
    assert done.remembered == 20 and done.monitor is not None and done.monitor.fed == 0
    for feed in (restarted, control):
        for i in range(20):
            label = feedback_event(f"q-{i}", correct=i % 4 != 0)
            feed(F, dumps(label), key=f"q-{i}".encode())
        feed.processor.on_tick(feed.processor.waiting_labels.max_age_ms + 1.0)

    counts = restarted_monitor.tracker.counts(KEY)
    assert (counts.labelled_covered, counts.errors_covered) == (10, 5)  # q-0, q-4, ... wrong
    assert (counts.labelled_uncovered, counts.errors_uncovered) == (10, 0)
    assert counts.requests == 0  # not counted as requests: the replica that decided them did
    assert restarted.processor.counters.feedback_unmatched == 0
    assert control.processor.counters.feedback_unmatched == 20
    assert control_monitor.tracker.counts(KEY).labelled_covered == 0

    # decided again after the restart (read again): a request of this window, labelled once
    decide(restarted, retrieval_event, final_event, "q-0")
    restarted(F, dumps(feedback_event("q-0", correct=True)), key=b"q-0")
    counts = restarted_monitor.tracker.counts(KEY)
    assert (counts.requests, counts.labelled_covered, counts.errors_covered) == (1, 10, 4)


def certified(request_id: str, policy: str | None, decision: Decision) -> DecidedRequest:
    signal = RetrievalSignal(status=SignalStatus.OK, m1=True, calibration_key=KEY)
    return DecidedRequest(request_id, "acme", decision, signal, "acme/wiki/r", policy)


def test_a_certified_allow_decided_before_re_tests_its_certificate_under_the_same_policy(
    settings_factory: Callable[..., Settings],
) -> None:
    monitor = CoverageMonitor(window=100)
    monitor.certificates.register("acme/wiki/r", 0.2, 0.1)
    feed = make_feed(settings_factory, coverage=monitor)
    policy = feed.processor.policy.fingerprint
    feed.processor.warm_start(
        [
            certified("a", policy, Decision.ALLOW),
            certified("b", policy, Decision.CAVEAT),  # below the threshold: not allowed
            certified("c", "another/1@000000000000", Decision.ALLOW),  # another certificate
        ]
    )
    for rid in ("a", "b", "c"):
        monitor.observe_feedback(FeedbackEvent(request_id=rid, correct=False, source="t"))
    check = monitor.certificates.check("acme/wiki/r")
    assert (check.labelled, check.errors) == (1, 1)


def test_remembered_requests_are_bounded_per_key_and_leave_with_their_key() -> None:
    monitor = CoverageMonitor(window=5, max_keys=1)
    monitor.remember_decided((f"r{i}", certified(f"r{i}", None, Decision.CAVEAT)) for i in range(8))
    wrong = FeedbackEvent(request_id="r0", correct=False, source="t")
    assert monitor.observe_feedback(wrong) is FeedbackOutcome.UNKNOWN  # pushed out: window 5
    assert monitor.observe_feedback(wrong.model_copy(update={"request_id": "r7"}))
    # a live key past max_keys evicts the remembered key's windows with it
    signal = certified("x", None, Decision.CAVEAT).retrieval.model_copy(
        update={"calibration_key": "other/key"}
    )
    monitor.observe_decision("x", Decision.CAVEAT, signal, None)
    late = FeedbackEvent(request_id="r6", correct=True, source="t")
    assert monitor.observe_feedback(late) is FeedbackOutcome.UNKNOWN


def test_the_decided_key_is_the_store_key_under_every_tenancy(
    settings_factory: Callable[..., Settings],
) -> None:
    def intake(**tenancy: str) -> Intake:
        settings = settings_factory(tenancy=tenancy)
        return Intake(
            JoinStore(10, 1000),
            SignalSuite(),
            limits=settings.limits,
            tenancy=settings.tenancy,
            clock_ns=time.monotonic_ns,
        )

    assert intake(source="event").decided_key("r", "acme") == "r"
    assert intake(source="header").decided_key("r", "acme") == "acme/r"
    assert intake(source="fixed", tenant="acme").decided_key("r", "acme") == "acme/r"
