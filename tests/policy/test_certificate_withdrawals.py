"""A withdrawn certified allow holds for the fleet and across restarts (``rag.certificates``).

A replica re-tests a certificate on its own partitions' labels and forgot them when
it restarted: replica A withdrew the allow while replica B went on allowing, and a
restarted A allowed again. The tracker now announces a violation once
(``take_withdrawals``, published by the processor's tick) and applies the fleet's
records (``apply``): sticky until reinstated (a tombstone) or re-certified (other
fingerprints). The real-broker half is ``tests/kafka/test_certificates_real.py``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from sidecar.confidence.certificate_check import CertificateTracker
from sidecar.config import Settings
from sidecar.contracts.events import CertificateWithdrawal, Decision
from sidecar.exceptions import ConfigError
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor
from sidecar.policy.certified import certificate_fingerprint
from sidecar.policy.placeholder import PlaceholderPolicy
from tests.policy.test_certified_allow import FINAL, KEY, SIGNALS, codes, engine, retrieval

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def violate(tracker: CertificateTracker, key: str = KEY, n: int = 50) -> None:
    for i in range(n):
        tracker.observe_label(key, f"r{i}", wrong=i % 2 == 0)  # half wrong vs risk 0.2


def withdrawal(tracker: CertificateTracker, **fields: object) -> CertificateWithdrawal:
    violate(tracker)
    [record] = tracker.take_withdrawals(NOW)
    return record.model_copy(update=fields)


def test_a_violation_is_announced_once_with_its_re_test(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    tracker = CertificateTracker(window=100, instance="pod-a")
    policy.attach_certificates(tracker)
    assert tracker.take_withdrawals(NOW) == []
    violate(tracker)
    [record] = tracker.take_withdrawals(NOW)
    assert record.calibration_key == KEY and record.instance == "pod-a"
    [entry] = policy.certified.values()
    assert record.certificates == [certificate_fingerprint(entry.certificate)]
    assert (record.labelled, record.errors) == (50, 25)
    assert record.error_low > record.risk == pytest.approx(0.2)
    violate(tracker, n=60)  # still violated: not announced again
    assert tracker.take_withdrawals(NOW) == []


def test_another_replica_withdraws_on_the_fleets_record_before_any_label(tmp_path: Path) -> None:
    a, b = engine(tmp_path), engine(tmp_path)  # two replicas serving the same files
    a_tracker, b_tracker = CertificateTracker(window=100), CertificateTracker(window=100)
    a.attach_certificates(a_tracker)
    b.attach_certificates(b_tracker)
    assert b.decide(retrieval(), FINAL, SIGNALS, confidence=0.9).decision is Decision.ALLOW
    b_tracker.apply(KEY, withdrawal(a_tracker, instance="pod-a"))
    outcome = b.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.CAVEAT
    assert "certificate-violated" in codes(outcome)
    [reason] = [r for r in outcome.reasons if r.code == "certificate-violated"]
    assert "withdrawn for the fleet by pod-a" in reason.message
    assert "guardrail certificates reinstate" in reason.message
    check = b_tracker.check(KEY)
    assert (check.status, check.labelled) == ("violated", 0)  # the report says so too
    assert b_tracker.take_withdrawals(NOW) == []  # known to the fleet: nothing to announce
    violate(b_tracker)
    assert b_tracker.take_withdrawals(NOW) == []


def test_a_withdrawal_outlives_a_recovered_window(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    tracker = CertificateTracker(window=60)
    policy.attach_certificates(tracker)
    record = withdrawal(tracker)
    tracker.apply(KEY, record)  # its own record, read back from the topic
    for i in range(100, 200):  # a window of right answers only
        tracker.observe_label(KEY, f"r{i}", wrong=False)
    assert tracker.check(KEY).errors == 0
    assert tracker.violated(KEY)  # sticky: only a tombstone or a new certificate lifts it


def test_a_tombstone_reinstates_and_the_window_starts_afresh(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    tracker = CertificateTracker(window=100)
    policy.attach_certificates(tracker)
    tracker.apply(KEY, withdrawal(tracker))
    tracker.apply(KEY, None)
    assert not tracker.violated(KEY)
    assert tracker.check(KEY).labelled == 0
    assert policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.9).decision is Decision.ALLOW
    violate(tracker)  # broken again: announced again
    assert len(tracker.take_withdrawals(NOW)) == 1


def test_a_new_certificate_is_not_withdrawn_by_the_old_ones_record(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    tracker = CertificateTracker(window=100)
    policy.attach_certificates(tracker)
    old = withdrawal(tracker, certificates=["0123456789abcdef"])  # re-certified since
    fresh = CertificateTracker(window=100)
    policy.attach_certificates(fresh)
    fresh.apply(KEY, old)
    assert not fresh.violated(KEY)
    assert policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.9).decision is Decision.ALLOW


def test_records_for_keys_not_certified_here_change_nothing() -> None:
    tracker = CertificateTracker(window=100)
    tracker.register(KEY, 0.2, 0.1, "f1")
    other = CertificateTracker(window=100)
    other.register("acme/x/y", 0.2, 0.1, "f1")
    violate(other, "acme/x/y")
    [record] = other.take_withdrawals(NOW)
    tracker.apply("acme/x/y", record)
    tracker.apply("acme/x/y", None)
    assert not tracker.violated(KEY) and not tracker.violated("acme/x/y")


def test_the_processor_publishes_a_withdrawal_on_its_tick(settings_factory: object) -> None:
    tracker = CertificateTracker(window=100)
    tracker.register(KEY, 0.2, 0.1, "f1")
    settings: Settings = settings_factory()  # type: ignore[operator]
    processor = Processor(settings, PlaceholderPolicy(), certificates=tracker)
    assert processor.on_tick(0.0).outputs == []
    violate(tracker)
    [out] = processor.on_tick(1.0).outputs
    assert out.destination is Destination.CERTIFICATES
    assert out.key == KEY.encode()
    record = CertificateWithdrawal.model_validate(orjson.loads(out.value))
    assert record.calibration_key == KEY and record.certificates == ["f1"]
    assert processor.on_tick(2.0).outputs == []  # once


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_an_announcement_not_read_back_is_announced_again() -> None:
    """A withdrawal whose publish was lost (or refused) would otherwise hold on this
    replica only, and be forgotten at its restart: announced again until the fleet's
    topic shows it back, and only while it is still violated here."""
    clock = Clock()
    tracker = CertificateTracker(window=100, reannounce_s=60.0, clock=clock)
    tracker.register(KEY, 0.2, 0.1, "f1")
    violate(tracker)
    [first] = tracker.take_withdrawals(NOW)
    clock.now += 59.0
    assert tracker.take_withdrawals(NOW) == []  # not yet: the board may be a tick behind
    clock.now += 2.0
    [again] = tracker.take_withdrawals(NOW)  # the first never came back
    assert (again.calibration_key, again.certificates) == (first.calibration_key, ["f1"])
    tracker.apply(KEY, again)  # read back from the topic
    clock.now += 600.0
    assert tracker.take_withdrawals(NOW) == []
    assert tracker.violated(KEY)


def test_a_record_for_other_certificates_does_not_count_as_read_back() -> None:
    clock = Clock()
    tracker = CertificateTracker(window=100, reannounce_s=60.0, clock=clock)
    tracker.register(KEY, 0.2, 0.1, "f1")
    violate(tracker)
    [mine] = tracker.take_withdrawals(NOW)
    tracker.apply(KEY, mine.model_copy(update={"certificates": ["0123456789abcdef"]}))
    clock.now += 61.0
    [again] = tracker.take_withdrawals(NOW)  # a replica on the old certificate wrote last
    assert again.certificates == ["f1"]


def test_a_window_recovered_before_the_fleet_heard_is_not_announced_again() -> None:
    clock = Clock()
    tracker = CertificateTracker(window=50, reannounce_s=60.0, clock=clock)
    tracker.register(KEY, 0.2, 0.1, "f1")
    violate(tracker)
    assert len(tracker.take_withdrawals(NOW)) == 1  # lost on its way
    for i in range(100, 150):  # a window of right answers only
        tracker.observe_label(KEY, f"r{i}", wrong=False)
    assert not tracker.violated(KEY)
    clock.now += 61.0
    assert tracker.take_withdrawals(NOW) == []
    violate(tracker)  # broken again: a new announcement, at once
    assert len(tracker.take_withdrawals(NOW)) == 1


def test_reannounce_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="reannounce_s must be a positive number"):
        CertificateTracker(reannounce_s=0.0)


def held(clock: Clock) -> tuple[CertificateTracker, CertificateWithdrawal]:
    """A replica holding the fleet's withdrawal of its own certificate (read back)."""
    tracker = CertificateTracker(window=100, reannounce_s=60.0, clock=clock)
    tracker.register(KEY, 0.2, 0.1, "f1")
    violate(tracker)
    [record] = tracker.take_withdrawals(NOW)
    tracker.apply(KEY, record)
    return tracker, record


def test_a_withdrawal_of_other_certificates_does_not_lift_one_held_and_it_is_restored() -> None:
    """A replica on another certificate file publishes its own withdrawal under the key:
    it gave the allow back here (only a tombstone may), and on the compacted topic it
    would be all that is left of the key, so the held one goes out again."""
    clock = Clock()
    tracker, record = held(clock)
    tracker.apply(KEY, record.model_copy(update={"certificates": ["0123456789abcdef"]}))
    assert tracker.violated(KEY) and tracker.withdrawn(KEY) == record
    clock.now += 59.0
    assert tracker.take_withdrawals(NOW) == []
    clock.now += 2.0
    assert tracker.take_withdrawals(NOW) == [record]  # as it was
    clock.now += 600.0
    assert tracker.take_withdrawals(NOW) == []  # once


def test_junk_under_a_withdrawn_key_gets_the_withdrawal_published_again() -> None:
    clock = Clock()
    tracker, record = held(clock)
    tracker.displaced(KEY)
    tracker.displaced(KEY)
    clock.now += 61.0
    assert tracker.take_withdrawals(NOW) == [record]
    tracker.displaced(KEY)
    tracker.apply(KEY, record)  # someone else's copy came first: nothing to do
    clock.now += 61.0
    assert tracker.take_withdrawals(NOW) == []
    tracker.displaced(KEY)
    tracker.apply(KEY, None)  # a tombstone: reinstated, nothing to restore
    clock.now += 61.0
    assert tracker.take_withdrawals(NOW) == [] and not tracker.violated(KEY)


def test_junk_for_a_key_not_withdrawn_here_publishes_nothing() -> None:
    clock = Clock()
    tracker = CertificateTracker(window=100, reannounce_s=60.0, clock=clock)
    tracker.register(KEY, 0.2, 0.1, "f1")
    tracker.displaced(KEY)
    clock.now += 61.0
    assert tracker.take_withdrawals(NOW) == [] and not tracker.violated(KEY)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("instance", "x" * 8_000_000, "at most 253 characters"),  # copied into every verdict
        ("sidecar_version", "v" * 65, "at most 64 characters"),
        ("certificates", ["f" * 65], "at most 64 characters"),
        ("errors", 10**40, "less than or equal to 1000000"),
        ("errors", 51, "errors \\(51\\) exceed labelled \\(50\\)"),
        ("error_low", 0.99, "error_low \\(0.99\\) above error_high"),
    ],
)
def test_a_withdrawal_out_of_bounds_is_not_a_withdrawal(
    field: str, value: object, message: str
) -> None:
    tracker = CertificateTracker(window=100)
    tracker.register(KEY, 0.2, 0.1, "f1")
    record = withdrawal(tracker).model_dump(mode="json")
    record[field] = value
    with pytest.raises(ValidationError, match=message):
        CertificateWithdrawal.model_validate_json(json.dumps(record))
