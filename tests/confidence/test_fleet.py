"""The in-sidecar coverage monitor: verdicts and feedback in, coverage.report events out."""

from __future__ import annotations

import json
import socket
import threading
from datetime import UTC, datetime
from typing import Literal

import pytest

from sidecar import __version__
from sidecar.confidence.fleet import UNCERTIFIED_KEY, CoverageMonitor, FeedbackOutcome
from sidecar.contracts.codec import encode
from sidecar.contracts.events import (
    AnswerVerdict,
    BoundEstimate,
    CoverageReport,
    Decision,
    FeedbackEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import ConfigError
from sidecar.stats.intervals import wilson_interval

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def verdict(
    request_id: str,
    m1: bool | None,
    key: str | None = "acme/wiki",
    stage: Literal["stream", "final"] = "final",
) -> AnswerVerdict:
    status = SignalStatus.OK if m1 is not None else SignalStatus.NOT_CONFIGURED
    return AnswerVerdict(
        request_id=request_id,
        idempotency_key=f"k-{request_id}",
        decision=Decision.ALLOW,
        reasons=[],
        stage=stage,
        policy="test",
        signals=Signals(retrieval=RetrievalSignal(status=status, m1=m1, calibration_key=key)),
        produced_at=NOW,
        sidecar_version="test",
    )


def feedback(request_id: str, correct: bool, abstained: bool = False) -> FeedbackEvent:
    return FeedbackEvent(
        request_id=request_id, correct=correct, abstained=abstained, source="grader"
    )


def monitor(
    *,
    window: int = 10_000,
    report_interval_s: float = 60.0,
    confidence: float = 0.95,
    probe: tuple[int, int] | None = None,
) -> CoverageMonitor:
    return CoverageMonitor(
        window=window,
        report_interval_s=report_interval_s,
        confidence=confidence,
        probe=probe,
        wall_clock=lambda: NOW,
    )


def estimate(successes: int, trials: int, confidence: float = 0.95) -> BoundEstimate:
    ci = wilson_interval(successes, trials, confidence)
    return BoundEstimate(
        value=successes / trials, low=ci.low, high=ci.high, successes=successes, trials=trials
    )


# ------------------------------------------------------------------ verdicts


def test_only_final_certified_verdicts_count() -> None:
    m = monitor()
    m.observe_verdict(verdict("a", True))
    m.observe_verdict(verdict("b", False))
    m.observe_verdict(verdict("c", None))  # certification off: coverage unknown, not zero
    m.observe_verdict(verdict("d", True, stage="stream"))  # a strict early block
    counts = m.tracker.counts("acme/wiki")
    assert (counts.requests, counts.covered) == (2, 1)
    assert m.tracker.keys() == ["acme/wiki"]
    assert not m.observe_feedback(feedback("c", True))
    assert not m.observe_feedback(feedback("d", True))


def test_requests_are_counted_per_calibration_key() -> None:
    m = monitor()
    m.observe_verdict(verdict("a", True, key="acme/wiki"))
    m.observe_verdict(verdict("b", True, key="globex/docs"))
    m.observe_verdict(verdict("c", False, key="globex/docs"))
    m.observe_verdict(verdict("d", False, key=None))
    assert m.tracker.keys() == sorted(["acme/wiki", "globex/docs", UNCERTIFIED_KEY])
    assert m.tracker.counts("globex/docs").requests == 2
    assert m.tracker.counts("globex/docs").covered == 1
    assert m.tracker.counts(UNCERTIFIED_KEY).covered == 0


def test_a_stand_in_global_calibration_counts_each_tenant_in_its_own_window() -> None:
    """Audit: every tenant on the global calibration shared one window, so one tenant's 25
    wrong labels set the bound reported (and alerted on) for all of them."""
    m = monitor()
    for rid, tenant, covered in (("a", "acme", True), ("b", "globex", False), ("c", "acme", True)):
        m.observe_decision(
            rid,
            Decision.CAVEAT,
            RetrievalSignal(
                status=SignalStatus.OK, m1=covered, calibration_key="global", fallback=True
            ),
            None,
            tenant=tenant,
        )
    own = RetrievalSignal(status=SignalStatus.OK, m1=True, calibration_key="acme/wiki")
    m.observe_decision("d", Decision.ALLOW, own, None, tenant="acme")
    assert m.tracker.keys() == ["acme/wiki", "global[acme]", "global[globex]"]
    assert m.tracker.counts("global[acme]").requests == 2
    assert m.tracker.counts("global[globex]").covered == 0
    assert m.observe_feedback(feedback("b", correct=False)) == 1  # labels find their window


# ------------------------------------------------------------------ feedback


def test_feedback_labels_a_recent_request_with_its_own_coverage() -> None:
    m = monitor()
    m.observe_verdict(verdict("cov-ok", True))
    m.observe_verdict(verdict("cov-bad", True))
    m.observe_verdict(verdict("unc-bad", False))
    m.observe_verdict(verdict("unc-abst", False))
    assert m.observe_feedback(feedback("cov-ok", True))
    assert m.observe_feedback(feedback("cov-bad", False))
    assert m.observe_feedback(feedback("unc-bad", False))
    assert m.observe_feedback(feedback("unc-abst", False, abstained=True))
    assert not m.observe_feedback(feedback("never-seen", False))
    c = m.tracker.counts("acme/wiki")
    assert (c.labelled_covered, c.errors_covered) == (2, 1)
    assert (c.labelled_uncovered, c.errors_uncovered) == (2, 1)  # an abstention is no error


def test_recent_memory_is_bounded_by_the_window() -> None:
    m = monitor(window=3)
    for i in range(4):
        m.observe_verdict(verdict(f"r{i}", True))
    assert not m.observe_feedback(feedback("r0", True))  # pushed out by r3
    assert all(m.observe_feedback(feedback(f"r{i}", True)) for i in (1, 2, 3))
    # per key: another key's (another tenant's) traffic pushes none of this key's out
    for i in range(10):
        m.observe_verdict(verdict(f"x{i}", True, key="other"))
    assert all(m.observe_feedback(feedback(f"r{i}", True)) for i in (1, 2, 3))
    assert not m.observe_feedback(feedback("x6", True))  # the other key keeps its own last 3
    assert m.observe_feedback(feedback("x9", True))


def _fallback(m: CoverageMonitor, rid: str, tenant: str, covered: bool = True) -> None:
    """A request the global calibration stood in for, under ``tenant``."""
    signal = RetrievalSignal(
        status=SignalStatus.OK, m1=covered, calibration_key="global", fallback=True
    )
    m.observe_decision(rid, Decision.CAVEAT, signal, None, tenant=tenant)


def test_a_producer_inventing_tenants_keeps_at_most_max_keys_windows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new tenant on every request (tenancy.source=event trusts the event's) grew the
    monitor by a window, a recent-verdicts map and a report per request, without end."""
    m = CoverageMonitor(window=100, max_keys=3, wall_clock=lambda: NOW)
    for i in range(50):
        _fallback(m, f"r{i}", f"t{i}")
    assert m.tracker.keys() == ["global[t47]", "global[t48]", "global[t49]"]
    assert m.evicted_keys == 47
    assert [r.calibration_key for r in m.reports()] == m.tracker.keys()
    assert set(m.gauge_values()) == set(m.tracker.keys())
    assert sum("GUARDRAIL_COVERAGE__MAX_KEYS" in r.getMessage() for r in caplog.records) == 1
    assert not m.observe_feedback(feedback("r10", False))  # its key left: unmatched
    assert m.observe_feedback(feedback("r49", False))
    assert m.tracker.counts("global[t49]").errors_covered == 1


def test_the_least_recently_fed_key_leaves_first() -> None:
    m = CoverageMonitor(window=100, max_keys=2, wall_clock=lambda: NOW)
    _fallback(m, "a1", "acme")
    _fallback(m, "g1", "globex")
    _fallback(m, "a2", "acme")  # acme fed again: globex is now the least recent
    _fallback(m, "i1", "initech")
    assert m.tracker.keys() == ["global[acme]", "global[initech]"]
    assert m.tracker.counts("global[acme]").requests == 2  # kept whole
    assert m.observe_feedback(feedback("a1", True))
    assert not m.observe_feedback(feedback("g1", True))
    _fallback(m, "g2", "globex")  # back: a new window, acme (least recent) leaves
    assert m.tracker.counts("global[globex]").requests == 1
    assert m.tracker.keys() == ["global[globex]", "global[initech]"]
    assert m.evicted_keys == 2


def test_every_request_of_a_key_shares_one_key_string() -> None:
    """``global[acme]`` is built anew for each request; one copy per request was kept."""
    m = monitor()
    for rid in ("a", "b"):
        _fallback(m, rid, "acme")
    a, b = m._recent.get("a"), m._recent.get("b")
    assert a is not None and b is not None
    assert a[0] == "global[acme]" and a[0] is b[0]


def test_max_keys_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max_keys"):
        CoverageMonitor(max_keys=0)


def test_a_repeated_verdict_refreshes_its_place_in_memory() -> None:
    m = monitor(window=2)
    m.observe_verdict(verdict("a", True))
    m.observe_verdict(verdict("b", True))
    m.observe_verdict(verdict("a", True))  # seen again: now the newest
    m.observe_verdict(verdict("c", True))  # evicts b, not a
    assert m.observe_feedback(feedback("a", True))
    assert not m.observe_feedback(feedback("b", True))


# ------------------------------------------------------------------ reports


def test_reports_are_due_once_per_interval_from_the_first_call() -> None:
    m = monitor(report_interval_s=2.0)
    m.observe_verdict(verdict("a", True))
    assert m.due_reports(1_000.0) == []  # the first call starts the clock
    assert m.due_reports(2_999.0) == []
    first = m.due_reports(3_000.0)
    assert [r.calibration_key for r in first] == ["acme/wiki"]
    assert m.due_reports(4_999.0) == []
    m.observe_verdict(verdict("b", False, key="globex/docs"))
    second = m.due_reports(5_000.0)
    assert [r.calibration_key for r in second] == ["acme/wiki", "globex/docs"]


def test_no_keys_no_reports() -> None:
    m = monitor(report_interval_s=0.001)
    m.due_reports(0.0)
    assert m.due_reports(10.0) == []


def test_report_numbers_by_hand() -> None:
    m = monitor(report_interval_s=1.0, confidence=0.9)
    covered = ["c1", "c2", "c3"]
    for rid in covered:
        m.observe_verdict(verdict(rid, True))
    m.observe_verdict(verdict("u1", False))
    m.observe_feedback(feedback("c1", True))
    m.observe_feedback(feedback("c2", False))
    m.observe_feedback(feedback("u1", False))
    [report] = m.reports()
    assert report.calibration_key == "acme/wiki"
    assert report.window_requests == 4
    assert report.coverage == estimate(3, 4, 0.9)
    assert report.epsilon == estimate(1, 2, 0.9)
    assert report.delta == estimate(1, 1, 0.9)
    assert report.delta_source == "labelled-uncovered"
    assert report.measured_hallucination == estimate(2, 3, 0.9)
    # H* = c eps + (1 - c) delta = .75 * .5 + .25 * 1
    assert report.bound == pytest.approx(0.625)
    assert report.bound_low is not None and report.bound_high is not None
    assert report.bound_low <= 0.625 <= report.bound_high
    assert report.status == "holds"
    assert report.confidence_level == 0.9
    assert report.produced_at == NOW
    assert report.sidecar_version == __version__
    json.loads(encode(report))  # serialisable: no NaN reaches the wire


def test_without_labels_the_report_is_insufficient_data() -> None:
    m = monitor()
    m.observe_verdict(verdict("a", True))
    [report] = m.reports()
    assert report.window_requests == 1
    assert report.status == "insufficient-data"
    assert report.bound is None and report.bound_low is None and report.bound_high is None
    assert report.epsilon == BoundEstimate(value=None, low=None, high=None, successes=0, trials=0)
    assert report.delta_source == "none"
    CoverageReport.model_validate_json(encode(report))


def test_probe_delta_is_used_when_given() -> None:
    m = monitor(probe=(200, 10))
    m.observe_verdict(verdict("a", True))
    m.observe_verdict(verdict("b", False))
    m.observe_feedback(feedback("a", True))
    m.observe_feedback(feedback("b", False))  # labelled uncovered: ignored for delta
    [report] = m.reports()
    assert report.delta_source == "probe"
    assert report.delta == estimate(10, 200)
    assert report.status == "holds"
    # H* = .5 * 0 + .5 * .05
    assert report.bound == pytest.approx(0.025)


def test_gauge_values_follow_the_window() -> None:
    m = monitor(probe=(100, 5))
    assert m.gauge_values() == {}
    for rid, m1 in (("a", True), ("b", True), ("c", False), ("d", True)):
        m.observe_verdict(verdict(rid, m1))
    m.observe_feedback(feedback("a", False))
    values = m.gauge_values()["acme/wiki"]
    assert values["window_requests"] == 4.0
    assert values["coverage"] == 0.75
    assert values["epsilon"] == 1.0
    assert values["delta"] == 0.05
    assert values["measured_hallucination"] == 1.0
    assert values["bound"] == pytest.approx(0.75 * 1.0 + 0.25 * 0.05)
    assert values["violated"] == 0.0
    ci = wilson_interval(3, 4)
    assert values["coverage_low"] == ci.low and values["coverage_high"] == ci.high


def test_gauges_are_none_where_nothing_was_observed_and_flag_violation() -> None:
    m = monitor(probe=(1000, 0))  # the probe says the generator never leaks
    for i in range(40):
        m.observe_verdict(verdict(f"r{i}", i < 20))
        m.observe_feedback(feedback(f"r{i}", False))  # yet every answer was wrong
    values = m.gauge_values()["acme/wiki"]
    assert values["violated"] == 1.0
    [report] = m.reports()
    assert report.status == "violated"
    empty = monitor()
    empty.observe_verdict(verdict("a", True))
    none = empty.gauge_values()["acme/wiki"]
    assert none["epsilon"] is None and none["delta"] is None and none["bound"] is None
    assert none["measured_hallucination"] is None and none["violated"] == 0.0


# ------------------------------------------------------------------ certified allow


def test_only_final_certified_allows_re_test_the_certificate() -> None:
    m = monitor(window=10)
    m.certificates.register("acme/wiki/r", 0.2, 0.1)

    def certified(request_id: str, decision: Decision, stage: Literal["stream", "final"]) -> None:
        v = verdict(request_id, m1=True, stage=stage).model_copy(
            update={"decision": decision, "certificate": "acme/wiki/r", "certified_risk": 0.2}
        )
        m.observe_verdict(v)

    certified("a", Decision.ALLOW, "final")
    certified("b", Decision.CAVEAT, "final")  # below the threshold: not an allowed answer
    certified("c", Decision.ALLOW, "stream")
    for rid in ("a", "b", "c"):
        m.observe_feedback(feedback(rid, correct=False))
    check = m.certificates.check("acme/wiki/r")
    assert (check.labelled, check.errors) == (1, 1)
    # a certified key gets a report even without coverage traffic of its own
    reports = {r.calibration_key: r for r in m.reports()}
    assert reports["acme/wiki/r"].certificate is not None
    assert reports["acme/wiki"].certificate is None
    assert m.gauge_values()["acme/wiki/r"]["certificate_labelled"] == 1.0


def test_a_certified_allow_without_coverage_still_counts_its_label() -> None:
    m = monitor()
    m.certificates.register("acme/wiki/r", 0.2, 0.1)
    v = verdict("x", m1=None).model_copy(update={"certificate": "acme/wiki/r"})
    m.observe_verdict(v)
    assert m.observe_feedback(feedback("x", correct=True)) is FeedbackOutcome.MATCHED
    assert m.observe_feedback(feedback("x", correct=False)) is FeedbackOutcome.REPLACED
    assert m.certificates.check("acme/wiki/r").errors == 1


def test_a_request_decided_again_counts_once() -> None:
    # a re-send after decided memory or a replay decides the same request key again: it is
    # one request of the window, not two (5 of 10 covered stayed 0.5, not 5 of 15)
    m = monitor()
    for i in range(10):
        m.observe_verdict(verdict(f"r{i}", i < 5))
    for i in range(5):
        m.observe_verdict(verdict(f"r{i}", True))
    values = m.gauge_values()["acme/wiki"]
    assert values["window_requests"] == 10.0
    assert values["coverage"] == 0.5


def test_window_counts_are_exported_for_summing_over_replicas() -> None:
    replicas = [monitor(), monitor()]
    for r, m in enumerate(replicas):
        for i in range(10 * (r + 1)):
            m.observe_verdict(verdict(f"{r}-{i}", i % 2 == 0))
            m.observe_feedback(feedback(f"{r}-{i}", i % 3 != 0))
    gauges = [m.gauge_values()["acme/wiki"] for m in replicas]
    total = {k: sum(g[k] or 0.0 for g in gauges) for k in gauges[0] if k.startswith("window_")}
    assert total == {
        "window_requests": 30.0,
        "window_covered": 15.0,
        "window_labelled_covered": 15.0,
        "window_errors_covered": 6.0,  # even i with i % 3 == 0: 0, 6 | 0, 6, 12, 18
        "window_labelled_uncovered": 15.0,
        "window_errors_uncovered": 5.0,  # odd i with i % 3 == 0: 3, 9 | 3, 9, 15
    }


def test_a_scrape_waits_for_a_count_in_progress() -> None:
    # the Prometheus exporter reads the gauges on its own thread; a read in the middle of
    # a count saw covered > requests and lost the scrape (88 of 31,140 in the audit)
    m = monitor()
    m.observe_verdict(verdict("a", True))
    inside, go = threading.Event(), threading.Event()
    count = m.tracker.observe_request

    def slow_count(key: str, covered: bool, partition: int = 0) -> None:
        inside.set()
        go.wait(5)
        count(key, covered, partition)

    m.tracker.observe_request = slow_count  # type: ignore[method-assign]
    counting = threading.Thread(target=m.observe_verdict, args=(verdict("b", True),))
    counting.start()
    assert inside.wait(5)
    scraped: list[dict[str, dict[str, float | None]]] = []
    scrape = threading.Thread(target=lambda: scraped.append(m.gauge_values()))
    scrape.start()
    scrape.join(0.3)
    assert scrape.is_alive()  # it waits for the count, not reads half of it
    go.set()
    counting.join(5)
    scrape.join(5)
    assert scraped[0]["acme/wiki"]["window_requests"] == 2.0


def test_the_report_names_its_replica_and_the_rate_its_status_reads() -> None:
    m = monitor(probe=(1000, 500))
    for i in range(40):
        m.observe_verdict(verdict(f"r{i}", i % 2 == 0))
        m.observe_feedback(feedback(f"r{i}", i % 4 != 1))  # uncovered: half wrong
    [report] = m.reports()
    assert report.instance == socket.gethostname()
    assert report.measured_by_stratum == pytest.approx(0.5 * 0.0 + 0.5 * 0.5)
    assert report.measured_by_stratum_low is not None
    assert report.measured_by_stratum_high is not None
    assert report.measured_by_stratum_low <= 0.25 <= report.measured_by_stratum_high
    covered_only = monitor(probe=(1000, 500))
    covered_only.observe_verdict(verdict("a", True))
    covered_only.observe_feedback(feedback("a", True))
    [report] = covered_only.reports()
    assert report.measured_by_stratum is None and report.measured_by_stratum_low is None
