"""The coverage windows move with the input partitions (restarts and rebalances).

The fleet's bound is computed from the replicas' window counts summed (README,
*Feedback*). A replica used to count only what it decided, and the labels it read, since
it started: a restarted one reported empty windows, and what its partitions' last owner
had counted was lost to the fleet's sums until traffic refilled them. Each partition now
keeps its own windows (``ceil(window / partitions)`` requests and labels of a key): a
replica that stops reading a partition drops them, and the one that reads it next
refills them from the requests read back from the verdicts topic (``remember_decided``)
and the labels read back from the feedback topic (``hold_partitions``' ``labels``), so
the fleet's sums are those of one replica that held every partition, whatever moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from guardrail_client.keys import partition_for
from sidecar.confidence.bound import CoverageTracker
from sidecar.confidence.fleet import CoverageMonitor, FeedbackOutcome
from sidecar.contracts.events import Decision, RetrievalSignal, SignalStatus
from sidecar.exceptions import ConfigError
from sidecar.pipeline.ports import DecidedRequest, ReadLabel
from tests.confidence.test_fleet import feedback, monitor

KEY = "acme/wiki"
P = 3
WINDOW = 30  # 10 a partition


def test_each_partition_keeps_its_share_of_the_window() -> None:
    tracker = CoverageTracker(window=10)
    assert tracker.per_partition == 10  # one partition until the count is known
    tracker.set_partitions(3)
    assert tracker.per_partition == 4  # ceil(10 / 3): a replica holding all keeps <= 12
    for i in range(9):
        tracker.observe_request(KEY, i % 3 == 0, partition=0)
    tracker.observe_request(KEY, True, partition=1)
    counts = tracker.counts(KEY)
    assert (counts.requests, counts.covered) == (5, 2)  # partition 0's last 4: 5, 6, 7, 8
    assert tracker.drop_partitions([0, 2]) == (4, 0)
    counts = tracker.counts(KEY)
    assert (counts.requests, counts.covered) == (1, 1)
    assert tracker.refill(KEY, 1, [False, True, False, False, True, True]) == 4
    counts = tracker.counts(KEY)
    assert (counts.requests, counts.covered) == (4, 2)  # replaced by the last 4 given
    tracker.set_partitions(5)  # more partitions: each keeps 2, its oldest leave
    counts = tracker.counts(KEY)
    assert (counts.requests, counts.covered) == (2, 2)
    assert tracker.partitions() == {1}
    with pytest.raises(ConfigError, match="partition count"):
        tracker.set_partitions(0)


def test_labels_are_windowed_per_partition_too() -> None:
    tracker = CoverageTracker(window=10)
    tracker.set_partitions(3)
    for i in range(6):  # the last 4 of partition 2 stay: r2..r5, errors at r3 and r5
        tracker.observe_label(KEY, covered=True, correct=i % 2 == 0, label_id=f"r{i}", partition=2)
    tracker.observe_label(KEY, covered=False, correct=False, label_id="u", partition=1)
    counts = tracker.counts(KEY)
    assert (counts.labelled_covered, counts.errors_covered) == (4, 2)
    assert (counts.labelled_uncovered, counts.errors_uncovered) == (1, 1)
    assert tracker.drop_partitions([2]) == (0, 4)
    counts = tracker.counts(KEY)
    assert (counts.labelled_covered, counts.labelled_uncovered) == (0, 1)
    # a refill replaces what the partition held; the last label of an id wins, and the
    # partition keeps its last 4
    kept = tracker.refill_labels(
        KEY,
        1,
        [
            ("a", True, True),
            ("b", True, False),
            ("a", True, False),
            ("c", False, True),
            ("d", True, False),
            ("e", True, True),
        ],
    )
    assert kept == 4  # b, a (its second), c, d, e: the oldest (b) leaves
    counts = tracker.counts(KEY)
    assert (counts.labelled_covered, counts.errors_covered) == (3, 1)  # a, d, e
    assert (counts.labelled_uncovered, counts.errors_uncovered) == (1, 1)  # c; u replaced


def signal(covered: bool) -> RetrievalSignal:
    return RetrievalSignal(status=SignalStatus.OK, m1=covered, calibration_key=KEY)


@dataclass
class Fleet:
    """Replicas' monitors, each holding some partitions; every request decided is kept as
    the verdicts topic keeps it (``topic``), for the reads back."""

    replicas: dict[str, CoverageMonitor] = field(default_factory=dict)
    holds: dict[str, frozenset[int]] = field(default_factory=dict)
    warm: dict[str, bool] = field(default_factory=dict)
    topic: list[DecidedRequest] = field(default_factory=list)
    covered_by_partition: dict[int, list[bool]] = field(default_factory=dict)
    feedback: list[ReadLabel] = field(default_factory=list)  # as the feedback topic has it

    def start(self, name: str, *, warm: bool = True) -> None:
        """A replica (re)starts: a fresh monitor, the verdicts' tail read back."""
        self.replicas[name] = m = monitor(window=WINDOW)
        self.holds[name] = frozenset()
        self.warm[name] = warm
        if warm:
            m.remember_decided(((d.request_id, d) for d in self.topic), P)

    def stop(self, name: str) -> None:
        del self.replicas[name], self.holds[name], self.warm[name]

    def assign(self, plan: dict[str, set[int]]) -> None:
        """A rebalance: every replica gets its partitions; a new one's recall reads the
        verdicts back first (the whole tail here: a read goes on from its marks)."""
        for name, partitions in plan.items():
            new = frozenset(partitions) - self.holds[name]
            if new and self.warm[name]:
                self.replicas[name].remember_decided(
                    (
                        (d.request_id, d)
                        for d in self.topic
                        if partition_for(d.request_id, P) in new
                    ),
                    P,
                )
            labels = [f for f in self.feedback if f.partition in new] if self.warm[name] else []
            self.replicas[name].hold_partitions(frozenset(partitions), P, labels)
            self.holds[name] = frozenset(partitions)

    def decide(self, prefix: str, n: int) -> None:
        for i in range(n):
            rid = f"{prefix}-{i}"
            covered = (i * 7) % 3 != 0
            partition = partition_for(rid, P)
            (owner,) = [r for r, held in self.holds.items() if partition in held]
            self.replicas[owner].observe_decision(
                rid, Decision.ALLOW, signal(covered), None, partition=partition
            )
            self.topic.append(
                DecidedRequest(rid, None, Decision.ALLOW, signal(covered), None, None)
            )
            self.covered_by_partition.setdefault(partition, []).append(covered)

    def label(self, prefix: str, n: int) -> None:
        """Labels for the first ``n`` requests of ``prefix``, each read by its partition's
        owner; every third says wrong."""
        for i in range(n):
            rid = f"{prefix}-{i}"
            partition = partition_for(rid, P)
            (owner,) = [r for r, held in self.holds.items() if partition in held]
            label = feedback(rid, correct=i % 3 != 0)
            assert self.replicas[owner].observe_feedback(label, rid, partition)
            self.feedback.append(ReadLabel(rid, i % 3 != 0, False, partition))

    def sums(self) -> tuple[int, int]:
        counts = [m.tracker.counts(KEY) for m in self.replicas.values()]
        return sum(c.requests for c in counts), sum(c.covered for c in counts)

    def expected(self) -> tuple[int, int]:
        """One replica holding every partition: each partition's last ``WINDOW / P``."""
        last = [c[-(WINDOW // P) :] for c in self.covered_by_partition.values()]
        return sum(map(len, last)), sum(map(sum, last))

    def label_sums(self) -> tuple[int, int]:
        counts = [m.tracker.counts(KEY) for m in self.replicas.values()]
        return (
            sum(c.labelled_covered + c.labelled_uncovered for c in counts),
            sum(c.errors_covered + c.errors_uncovered for c in counts),
        )

    def expected_labels(self) -> tuple[int, int]:
        """One replica holding every partition: each partition's last ``WINDOW / P``
        requests labelled (the last label of each)."""
        by_partition: dict[int, dict[str, bool]] = {}
        for label in self.feedback:
            labels = by_partition.setdefault(label.partition, {})
            labels.pop(label.request_key, None)
            labels[label.request_key] = not label.correct
        last = [list(labels.values())[-(WINDOW // P) :] for labels in by_partition.values()]
        return sum(map(len, last)), sum(map(sum, last))


def test_the_fleets_sums_survive_a_restart_a_rebalance_and_a_kill() -> None:
    fleet = Fleet()
    fleet.start("a")
    fleet.start("b")
    fleet.assign({"a": {0, 1}, "b": {2}})
    fleet.decide("q", 60)  # more than a partition keeps
    assert fleet.sums() == fleet.expected()
    before = fleet.replicas["a"].tracker.counts(KEY)

    fleet.stop("a")  # restarted: its windows come back from the verdicts read back
    fleet.start("a")
    assert fleet.replicas["a"].tracker.counts(KEY).requests == 0  # before its assignment
    fleet.assign({"a": {0, 1}, "b": {2}})
    assert fleet.replicas["a"].tracker.counts(KEY) == before
    fleet.decide("r", 9)
    assert fleet.sums() == fleet.expected()

    fleet.assign({"a": {0}, "b": {1, 2}})  # partition 1 moves: counted once, at b
    assert fleet.sums() == fleet.expected()
    fleet.decide("s", 12)
    assert fleet.sums() == fleet.expected()

    fleet.stop("b")  # killed: a takes every partition over
    fleet.assign({"a": {0, 1, 2}})
    assert fleet.sums() == fleet.expected()
    assert fleet.expected()[0] == WINDOW  # every partition full: the fleet's window


def test_the_fleets_labels_survive_a_restart_a_rebalance_and_a_kill() -> None:
    fleet = Fleet()
    fleet.start("a")
    fleet.start("b")
    fleet.assign({"a": {0, 1}, "b": {2}})
    fleet.decide("q", 30)  # labels find requests among a replica's last WINDOW decided
    fleet.label("q", 30)  # 16, 8 and 6 a partition: the first keeps its last 10
    assert fleet.label_sums() == fleet.expected_labels()
    assert fleet.expected_labels()[0] == 10 + 8 + 6
    before = fleet.replicas["a"].tracker.counts(KEY)

    fleet.stop("a")
    fleet.start("a")
    fleet.assign({"a": {0, 1}, "b": {2}})
    assert fleet.replicas["a"].tracker.counts(KEY) == before  # requests and labels
    fleet.assign({"a": {0}, "b": {1, 2}})
    assert fleet.label_sums() == fleet.expected_labels()
    fleet.label("q", 6)  # later labels for the same requests: they replace the first
    assert fleet.label_sums() == fleet.expected_labels()
    fleet.stop("b")
    fleet.assign({"a": {0, 1, 2}})
    assert fleet.label_sums() == fleet.expected_labels()


def test_a_label_read_back_for_a_request_not_known_here_is_left_out() -> None:
    m = monitor(window=WINDOW)
    held = m.hold_partitions(frozenset({0, 1, 2}), P, [ReadLabel("never-decided", False, False, 0)])
    assert (held.labels, held.labels_unmatched) == (0, 1)
    assert m.tracker.counts(KEY).labelled_covered == 0


def test_without_the_read_back_a_restarted_replica_starts_empty() -> None:
    # the control: what the refill adds is what the verdicts read back hold
    fleet = Fleet()
    fleet.start("a")
    fleet.assign({"a": {0, 1, 2}})
    fleet.decide("q", 20)
    fleet.stop("a")
    fleet.start("a", warm=False)
    fleet.assign({"a": {0, 1, 2}})
    assert fleet.sums() == (0, 0) != fleet.expected()


def restarted_after(decided: int) -> Fleet:
    """One replica holding every partition, restarted after deciding ``decided``."""
    fleet = Fleet()
    fleet.start("a")
    fleet.assign({"a": {0, 1, 2}})
    fleet.decide("q", decided)
    fleet.stop("a")
    fleet.start("a")
    fleet.assign({"a": {0, 1, 2}})
    return fleet


def test_a_refilled_request_decided_again_is_not_counted_twice() -> None:
    fleet = restarted_after(6)
    again = fleet.topic[0]  # its records read again past the last commit, decided again
    fleet.replicas["a"].observe_decision(
        again.request_id,
        Decision.ALLOW,
        again.retrieval,
        None,
        partition=partition_for(again.request_id, P),
    )
    assert (
        fleet.sums()
        == fleet.expected()
        == (6, sum(fleet.topic[i].retrieval.m1 or 0 for i in range(6)))
    )


def test_a_label_for_a_refilled_request_counts_with_its_coverage() -> None:
    fleet = restarted_after(6)
    first = fleet.topic[0]
    assert fleet.replicas["a"].observe_feedback(feedback(first.request_id, correct=False))
    counts = fleet.replicas["a"].tracker.counts(KEY)
    covered = bool(first.retrieval.m1)
    assert (counts.labelled_covered, counts.labelled_uncovered) == (int(covered), int(not covered))


def test_a_partition_read_back_alone_keeps_the_whole_window_for_its_labels() -> None:
    # a partition given to this replica is read back alone: its requests may keep the
    # whole window (labels come late), not only the share its request window counts
    ids = [rid for rid in (f"q-{i}" for i in range(200)) if partition_for(rid, P) == 1][:40]
    m = monitor(window=WINDOW)
    m.remember_decided(
        ((rid, DecidedRequest(rid, None, Decision.ALLOW, signal(True), None, None)) for rid in ids),
        P,
    )
    held = m.hold_partitions(frozenset({1}), P, [ReadLabel(rid, True, False, 1) for rid in ids])
    assert held.refilled == WINDOW // P  # the request window: its share
    assert (held.labels, held.labels_unmatched) == (WINDOW // P, 10)  # the last 30 matched
    m.hold_partitions(frozenset({1, 2}), P)
    assert sum(bool(m.observe_feedback(feedback(rid, True), rid, 1)) for rid in ids) == WINDOW


def test_a_restarted_replica_re_tests_its_certificates_on_the_labels_read_back() -> None:
    # the certificate's re-test window was the replica's memory alone: a restart started
    # it empty, and a certificate near its risk needed as many new labels again to fail
    cert = "acme/wiki/r"
    ids = [f"q-{i}" for i in range(12)]
    allowed = [DecidedRequest(rid, None, Decision.ALLOW, signal(True), cert, None) for rid in ids]
    topic = [ReadLabel(rid, i % 4 != 0, False, partition_for(rid, P)) for i, rid in enumerate(ids)]
    before = monitor(window=WINDOW)
    before.certificates.register(cert, 0.2, 0.1)
    before.hold_partitions(frozenset({0, 1, 2}), P)
    for d, label in zip(allowed, topic, strict=True):
        before.observe_decision(
            d.request_id, Decision.ALLOW, d.retrieval, cert, partition=label.partition
        )
        before.observe_feedback(
            feedback(d.request_id, label.correct), d.request_id, label.partition
        )
    wanted = before.certificates.check(cert)
    assert (wanted.labelled, wanted.errors) == (12, 3)

    for read_back in (topic, []):  # the control: nothing read back, nothing re-tested
        after = monitor(window=WINDOW)
        after.certificates.register(cert, 0.2, 0.1)
        after.remember_decided(((d.request_id, d) for d in allowed), P)
        held = after.hold_partitions(frozenset({0, 1, 2}), P, read_back)
        check = after.certificates.check(cert)
        labelled = (check.labelled, check.errors)
        assert labelled == ((12, 3) if read_back else (0, 0))
        assert held.labels_unmatched == 0


def test_a_label_read_back_and_consumed_again_is_not_counted_as_replaced() -> None:
    # labels past their partition's committed offset are read back at the assignment and
    # consumed again after it: the same record twice, not a producer's second label
    ids = [f"q-{i}" for i in range(8)]
    cert = "acme/wiki/r"
    decided = [
        DecidedRequest(rid, None, Decision.ALLOW, signal(True), cert if i < 4 else None, None)
        for i, rid in enumerate(ids)
    ]
    topic = [ReadLabel(rid, i % 2 == 0, False, partition_for(rid, P)) for i, rid in enumerate(ids)]
    m = monitor(window=WINDOW)
    m.certificates.register(cert, 0.2, 0.1)
    m.remember_decided(((d.request_id, d) for d in decided), P)
    held = m.hold_partitions(frozenset({0, 1, 2}), P, topic)
    assert held.labels == len(ids)
    counts = m.tracker.counts(KEY)
    before = (counts.labelled_covered, counts.labelled_uncovered, counts.errors_covered)
    check = m.certificates.check(cert)
    assert (check.labelled, check.errors) == (4, 2)

    def again(label: ReadLabel, correct: bool) -> FeedbackOutcome:
        return m.observe_feedback(
            feedback(label.request_key, correct), label.request_key, label.partition
        )

    # consumed again: matched, and the windows hold what they held
    assert [again(label, label.correct) for label in topic] == [FeedbackOutcome.MATCHED] * 8
    counts = m.tracker.counts(KEY)
    assert (counts.labelled_covered, counts.labelled_uncovered, counts.errors_covered) == before
    check = m.certificates.check(cert)
    assert (check.labelled, check.errors) == (4, 2)
    # a producer's second label of the same request is a replacement, as before the
    # assignment; so is a different label where one was read back
    assert again(topic[0], topic[0].correct) is FeedbackOutcome.REPLACED
    assert again(topic[5], not topic[5].correct) is FeedbackOutcome.REPLACED
    fresh = monitor(window=WINDOW)
    fresh.remember_decided(((d.request_id, d) for d in decided), P)
    fresh.hold_partitions(frozenset({0, 1, 2}), P, topic)
    assert (
        fresh.observe_feedback(feedback(ids[1], not topic[1].correct), ids[1], topic[1].partition)
        is FeedbackOutcome.REPLACED
    )
