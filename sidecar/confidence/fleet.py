"""The fleet-level coverage bound inside the sidecar (docs/methods.md §Coverage bound).

Every final verdict counts as one request of its calibration key, covered when
conformal certification trusted at least one chunk (m1). Feedback events
(``rag.feedback``) label requests this instance decided recently; the label's
request must still be in the bounded memory of recent verdicts (same size as
the window), otherwise it is counted as unmatched. Every
``report_interval_s`` the monitor turns each key's window into a
``coverage.report`` event; the latest values also back the
``guardrail.coverage.*`` gauges.

At most ``max_keys`` coverage keys are kept (``GUARDRAIL_COVERAGE__MAX_KEYS``): a key's
tenant is producer text under ``tenancy.source=event``, and a producer that put a new
tenant on every request grew the sidecar by ~2 KB a request without end (a window, a
recent-verdicts map and a report per key; tests/pipeline/test_invented_tenants.py). A
new key past the limit drops the least recently fed key's windows and recent verdicts
(counted in ``evicted_keys``, said once); its later labels count as unmatched, and a key
fed again starts a new window.

The leakage delta comes from a probe file (``guardrail probe leakage``) when one
is configured, else from feedback on uncovered requests.

Certified allow: a final ``allow`` taken under an allow certificate
(``AnswerVerdict.certificate``) is remembered too; its label feeds the
:class:`~sidecar.confidence.certify_allow.CertificateTracker` of that key,
which re-tests the certificate on the window (Clopper-Pearson interval of the
error among allowed answers). The policy reads the same tracker, so a broken
certificate withdraws the allow (reason ``certificate-violated``); the report
carries the re-test and the gauges ``guardrail.coverage.certificate_*``.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from enum import IntEnum
from typing import Generic, TypeVar

from guardrail_client.keys import murmur2
from sidecar import __version__
from sidecar.confidence.bound import BoundReport, CoverageTracker
from sidecar.confidence.certificate_check import CertificateCheck, CertificateTracker
from sidecar.conformal.monitor import monitor_key
from sidecar.contracts.events import (
    AnswerVerdict,
    BoundEstimate,
    CertificateStatus,
    CoverageReport,
    Decision,
    FeedbackEvent,
    RetrievalSignal,
)
from sidecar.exceptions import ConfigError
from sidecar.pipeline.ports import DecidedRequest, HeldPartitions, ReadLabel
from sidecar.stats.intervals import ProportionInterval

__all__ = ["MAX_COVERAGE_KEYS", "UNCERTIFIED_KEY", "CoverageMonitor", "FeedbackOutcome"]

log = logging.getLogger(__name__)

MAX_COVERAGE_KEYS = 64
"""Coverage keys kept by default: a full key holds ~``window`` x 0.35 KB (~3.5 MB at 10,000)."""


class FeedbackOutcome(IntEnum):
    """What became of a label (falsy when it was not counted)."""

    UNKNOWN = 0  # no verdict of this instance within the window: not counted
    MATCHED = 1  # the request's first label
    REPLACED = 2  # a later label for the same request: the last wins


UNCERTIFIED_KEY = "uncertified"
"""Requests without a calibration key (certification off or unavailable)."""
_INSTANCE = socket.gethostname() or None  # the pod's name under Kubernetes


def _estimate(ci: ProportionInterval) -> BoundEstimate:
    if ci.trials == 0:
        return BoundEstimate(value=None, low=None, high=None, successes=0, trials=0)
    return BoundEstimate(
        value=ci.estimate, low=ci.low, high=ci.high, successes=ci.successes, trials=ci.trials
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _certificate_status(check: CertificateCheck) -> CertificateStatus:
    return CertificateStatus(
        risk=check.risk,
        delta=check.delta,
        labelled=check.labelled,
        errors=check.errors,
        error_rate=check.error_rate,
        error_low=check.error_low,
        error_high=check.error_high,
        status=check.status,
    )


class CoverageMonitor:
    """Verdicts and feedback in, periodic ``CoverageReport`` events and gauge values out."""

    def __init__(
        self,
        *,
        window: int = 10_000,
        report_interval_s: float = 60.0,
        confidence: float = 0.95,
        probe: tuple[int, int] | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_keys: int = MAX_COVERAGE_KEYS,
    ) -> None:
        if isinstance(max_keys, bool) or max_keys < 1:
            raise ConfigError(f"max_keys must be a positive number of keys, got {max_keys!r}")
        self.max_keys = max_keys
        # coverage key -> the same string, the least recently fed first: past max_keys the
        # first one leaves; the stored string is the one every request of the key shares
        self._fed: OrderedDict[str, str] = OrderedDict()
        self.evicted_keys = 0
        self.tracker = CoverageTracker(window=window, confidence=confidence)
        if probe is not None:
            self.tracker.set_probe(None, *probe)
        # request key -> (calibration key, covered), the last ``window`` of each key
        self._recent: _RecentPerKey[bool] = _RecentPerKey(window)
        # request key -> certificate key, for final allows taken under a certificate
        self._certified: _RecentPerKey[None] = _RecentPerKey(window)
        # the same two for requests decided before this process started or elsewhere (read
        # back from the verdicts: remember_decided), looked up by labels, and counted when
        # their partition comes here (hold_partitions)
        self._earlier = _ReadBack(window)
        self._earlier_certified: _RecentPerKey[None] = _RecentPerKey(window)
        # request key -> (correct, abstained) of the labels an assignment read back, until
        # consumed again (those past their partition's committed offset are): the same
        # label again is no replacement. The last ``window`` of them
        self._read_back_labels: OrderedDict[str, tuple[bool, bool]] = OrderedDict()
        self._read_back_cap = window
        self.certificates = CertificateTracker(window=window, confidence=confidence)
        self._interval_ms = report_interval_s * 1000.0
        self._next_ms: float | None = None
        self._confidence = confidence
        self._wall_clock = wall_clock
        self._latest: dict[str, BoundReport] = {}
        # the Prometheus exporter reads gauge_values() on its HTTP thread while the
        # event loop counts: without a lock a scrape can read ``covered > requests``
        self._lock = threading.Lock()
        self._held: frozenset[int] = frozenset()  # the input partitions this replica reads

    def observe_verdict(
        self, verdict: AnswerVerdict, request_key: str | None = None, partition: int = 0
    ) -> None:
        """Count a final verdict as a request of its calibration key (a stream verdict is not).

        ``request_key``: the request's key in the join store (scoped by the
        trusted tenant); feedback must name the same key to label it. ``partition``: the
        input partition the request was read on.
        """
        if verdict.stage == "final":
            self.observe_decision(
                request_key or verdict.request_id,
                verdict.decision,
                verdict.signals.retrieval,
                verdict.certificate,
                tenant=verdict.tenant,
                partition=partition,
            )

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
        """:meth:`observe_verdict` from a final verdict's values (the serving path's call).

        A request the global calibration stood in for counts in its tenant's window
        (``global[acme]``, as the m1 monitor counts it): one window for every tenant let
        one tenant's labels set the bound reported for all of them (audit).
        """
        with self._lock:
            name = request_key
            if certificate is not None and decision is Decision.ALLOW:
                self._certified.add(name, certificate, None)
            cert = certification
            if cert.m1 is None:
                return  # not certified: coverage is unknown, not zero
            key = (
                monitor_key(cert.calibration_key, fallback=cert.fallback, tenant=tenant)
                if cert.calibration_key
                else UNCERTIFIED_KEY
            )
            key = self._feed(key)
            seen = self._recent.get(name)
            if seen is None or seen[0] != key:
                # the same request decided again (a replay, a re-send) is counted once
                self.tracker.observe_request(key, cert.m1, partition)
            self._recent.add(name, key, cert.m1)

    def remember_decided(
        self, decided: Iterable[tuple[str, DecidedRequest]], partitions: int | None = None
    ) -> int:
        """Requests decided before this process started, or by another replica on a
        partition just assigned here: the fleet's final verdicts, oldest first, each with
        its request key (:mod:`sidecar.kafka.warmstart`). Remembered for
        their labels only: a label that came after a restart, or at the replica its
        request's partition moved to, found no request and was counted unmatched, and a
        certified allow's label never re-tested its certificate. They are counted as
        requests only when their partition comes to this replica (:meth:`hold_partitions`:
        the replica that decided them dropped that partition's window), and about
        ``window`` are kept per key, by input partition when ``partitions`` (the input
        topics' partition count) is known: the partition holding the most loses its
        oldest first, so each keeps at least what its window holds (:class:`_ReadBack`).
        Returns how many were remembered.
        """
        remembered = 0
        with self._lock:
            for name, request in decided:
                certificate, certified = request.certificate, False
                if certificate is not None and request.decision is Decision.ALLOW:
                    self._earlier_certified.add(name, certificate, None)
                    certified = True
                cert = request.retrieval
                if cert.m1 is not None:  # certified retrieval: its coverage can be labelled
                    key = (
                        monitor_key(
                            cert.calibration_key, fallback=cert.fallback, tenant=request.tenant
                        )
                        if cert.calibration_key
                        else UNCERTIFIED_KEY
                    )
                    home = murmur2(request.request_id.encode("utf-8")) & 0x7FFFFFFF
                    self._earlier.add(name, key, cert.m1, home, partitions)
                remembered += certified or cert.m1 is not None
        return remembered

    def hold_partitions(
        self,
        partitions: frozenset[int],
        count: int,
        labels: Iterable[ReadLabel] = (),
    ) -> HeldPartitions:
        """This replica reads ``partitions`` of the input topics' ``count`` now (a
        rebalance's assignment): the windows of partitions it no longer reads are dropped
        (their new owner counts them), and each partition it did not read before is
        refilled, so a restarted replica, or one given a partition, reports the fleet's
        window, not an empty one: its requests from those decided there before
        (:meth:`remember_decided`: the warm start's and the recalls' read of the verdicts),
        its labels from ``labels`` (oldest first: the feedback topic's tail read back),
        each with the coverage of the request it labels (one not known here is left out,
        returned in ``unknown``, counted in ``labels_unmatched``: its request may not be
        decided yet, ``Processor.wait_for_requests``). A label of a certified allow also
        goes to its certificate's re-test (one label a request: a label it holds is
        replaced), so a restarted replica re-tests on its partitions' labels, not on none."""
        with self._lock:
            tracker = self.tracker
            tracker.set_partitions(count)
            new = partitions - self._held
            gone = (self._held | tracker.partitions()) - partitions
            dropped, labels_dropped = tracker.drop_partitions(gone)
            self._held = partitions
            refilled = 0
            cap = tracker.per_partition
            for known, found in self._earlier.of_partitions(new, count).items():
                key = self._feed(known)
                for partition, named in found.items():
                    kept = named[-cap:]
                    refilled += tracker.refill(key, partition, (c for _, c in kept))
                    for name, covered in kept:  # counted: decided again, it is not counted twice
                        self._recent.add(name, key, covered)
            read: dict[tuple[str, int], list[tuple[str, bool, bool]]] = {}
            unknown: list[ReadLabel] = []
            for label in labels:
                name, partition = label.request_key, label.partition
                if partition not in new:
                    continue
                certificate, seen = self._request_of(name)
                if certificate is not None:
                    self.certificates.observe_label(certificate, name, wrong=not label.correct)
                if seen is None and certificate is None:
                    unknown.append(label)
                    continue
                self._remember_read_back(name, label)
                if seen is None:
                    continue
                error = not label.correct and not label.abstained
                read.setdefault((seen[0], partition), []).append((name, seen[1], error))
            labelled = 0
            for (known, partition), entries in read.items():
                labelled += tracker.refill_labels(self._feed(known), partition, entries)
            return HeldPartitions(
                new=tuple(sorted(new)),
                gone=tuple(sorted(gone)),
                refilled=refilled,
                dropped=dropped,
                labels=labelled,
                labels_dropped=labels_dropped,
                unknown=tuple(unknown),
            )

    def _remember_read_back(self, name: str, label: ReadLabel) -> None:
        marks = self._read_back_labels
        marks.pop(name, None)
        marks[name] = (label.correct, label.abstained)
        if len(marks) > self._read_back_cap:
            marks.popitem(last=False)

    def _request_of(self, name: str) -> tuple[str | None, tuple[str, bool] | None]:
        """What is known here of the request ``name``: the certificate it was allowed under
        (``None``: not a certified allow), and its coverage key and whether it was covered
        (``None``: not known). One known only from the verdicts read back counts its key among
        ``max_keys`` from now."""
        certified = self._certified.get(name) or self._earlier_certified.get(name)
        seen = self._recent.get(name)
        if seen is None and (seen := self._earlier.get(name)) is not None:
            seen = (self._feed(seen[0]), seen[1])
        return (None if certified is None else certified[0]), seen

    def _feed(self, key: str) -> str:
        """``key`` is the most recently fed; past ``max_keys``, the least recent one leaves.

        Returns the key's one string: ``monitor_key`` builds ``global[acme]`` anew for each
        request, and the recent-verdicts map kept every copy (~60 bytes a request, 0.6 MB a
        full window)."""
        fed = self._fed
        known = fed.get(key)
        if known is not None:
            fed.move_to_end(key)
            return known
        fed[key] = key
        while len(fed) > self.max_keys:
            gone, _ = fed.popitem(last=False)
            self.tracker.forget(gone)
            self._recent.forget_key(gone)
            self._earlier.forget_key(gone)
            self._latest.pop(gone, None)
            self.evicted_keys += 1
            if self.evicted_keys == 1:
                log.warning(
                    "coverage: more than %d calibration keys (GUARDRAIL_COVERAGE__MAX_KEYS): "
                    "the least recently fed key's window is dropped for each new one (first: "
                    "%r); a producer that invents tenants (tenancy.source=event) does this. "
                    "Said once; counted in guardrail.coverage.evicted_keys",
                    self.max_keys,
                    gone,
                )
        return key

    def observe_feedback(
        self, feedback: FeedbackEvent, request_key: str | None = None, partition: int = 0
    ) -> FeedbackOutcome:
        """Label a recent request (one label per request, the last wins); ``partition``:
        the input partition the label was read on (its window moves with the partition).

        A certified allow's label also re-tests its certificate (an error is a
        wrong answer, as in the calibration labels).
        """
        with self._lock:
            return self._observe_feedback(feedback, request_key or feedback.request_id, partition)

    def _observe_feedback(
        self, feedback: FeedbackEvent, name: str, partition: int
    ) -> FeedbackOutcome:
        certificate, seen = self._request_of(name)
        # a label read back at an assignment, consumed again (it was past its partition's
        # committed offset): it replaces itself, and is not counted as a replacement
        again = self._read_back_labels.pop(name, None) == (feedback.correct, feedback.abstained)
        cert_replaced = False
        if certificate is not None:
            cert_replaced = self.certificates.observe_label(
                certificate, name, wrong=not feedback.correct
            )
        if seen is None:
            if certificate is None:
                return FeedbackOutcome.UNKNOWN
            return (
                FeedbackOutcome.REPLACED if cert_replaced and not again else FeedbackOutcome.MATCHED
            )
        key, covered = seen
        replaced = self.tracker.observe_label(
            key,
            covered=covered,
            correct=feedback.correct,
            abstained=feedback.abstained,
            label_id=name,
            partition=partition,
        )
        return FeedbackOutcome.REPLACED if replaced and not again else FeedbackOutcome.MATCHED

    def due_reports(self, now_ms: float) -> list[CoverageReport]:
        """One report per key once every interval (the first interval starts at the first call)."""
        if self._next_ms is None:
            self._next_ms = now_ms + self._interval_ms
            return []
        if now_ms < self._next_ms:
            return []
        self._next_ms = now_ms + self._interval_ms
        return self.reports()

    def _keys(self) -> list[str]:
        """Keys with traffic, and keys with a certificate."""
        return sorted({*self.tracker.keys(), *self.certificates.keys()})

    def reports(self) -> list[CoverageReport]:
        """The current report of every key seen (and of every certified key)."""
        with self._lock:
            return self._reports()

    def _reports(self) -> list[CoverageReport]:
        out = []
        for key in self._keys():
            report = self.tracker.report(key)
            self._latest[key] = report
            out.append(self._event(key, report))
        return out

    def _event(self, key: str, r: BoundReport) -> CoverageReport:
        ok = r.status != "insufficient-data"
        by_stratum = not math.isnan(r.measured_weighted)  # both strata labelled
        return CoverageReport(
            calibration_key=key,
            window_requests=r.coverage.trials,
            coverage=_estimate(r.coverage),
            epsilon=_estimate(r.eps),
            delta=_estimate(r.delta),
            delta_source=r.delta_source,
            bound=_finite(r.bound) if ok else None,
            bound_low=r.bound_low if ok else None,
            bound_high=r.bound_high if ok else None,
            measured_hallucination=_estimate(r.measured),
            measured_by_stratum=_finite(r.measured_weighted),
            measured_by_stratum_low=r.measured_weighted_low if by_stratum else None,
            measured_by_stratum_high=r.measured_weighted_high if by_stratum else None,
            status=r.status,
            confidence_level=self._confidence,
            certificate=_certificate_status(self.certificates.check(key))
            if key in self.certificates.keys()
            else None,
            instance=_INSTANCE,
            produced_at=self._wall_clock(),
            sidecar_version=__version__,
        )

    def gauge_values(self) -> dict[str, dict[str, float | None]]:
        """The latest report's numbers per key, for the ``guardrail.coverage.*`` gauges."""
        with self._lock:
            return self._gauge_values()

    def _gauge_values(self) -> dict[str, dict[str, float | None]]:
        out: dict[str, dict[str, float | None]] = {}
        for key in self._keys():
            r = self.tracker.report(key)
            counts = self.tracker.counts(key)
            ok = r.status != "insufficient-data"

            def v(ci: ProportionInterval, part: str) -> float | None:
                if ci.trials == 0:
                    return None
                return _finite(ci.estimate) if part == "value" else getattr(ci, part)

            out[key] = {
                "coverage": v(r.coverage, "value"),
                "coverage_low": v(r.coverage, "low"),
                "coverage_high": v(r.coverage, "high"),
                "epsilon": v(r.eps, "value"),
                "epsilon_high": v(r.eps, "high"),
                "delta": v(r.delta, "value"),
                "delta_high": v(r.delta, "high"),
                "bound": _finite(r.bound) if ok else None,
                "bound_low": r.bound_low if ok else None,
                "bound_high": r.bound_high if ok else None,
                "measured_hallucination": v(r.measured, "value"),
                "measured_hallucination_low": v(r.measured, "low"),
                "measured_hallucination_high": v(r.measured, "high"),
                "violated": float(r.status == "violated"),
                "window_requests": float(r.coverage.trials),
                # this replica's window counts: sum them over replicas (never average the
                # ratios or the bound) and recompute the fleet bound from the sums
                "window_covered": float(r.coverage.successes),
                "window_labelled_covered": float(r.eps.trials),
                "window_errors_covered": float(r.eps.successes),
                "window_labelled_uncovered": float(counts.labelled_uncovered),
                "window_errors_uncovered": float(counts.errors_uncovered),
            }
            if key in self.certificates.keys():
                check = self.certificates.check(key)
                out[key].update(
                    {
                        "certificate_violated": float(check.status == "violated"),
                        "certificate_error": check.error_rate,
                        "certificate_error_high": check.error_high,
                        "certificate_labelled": float(check.labelled),
                    }
                )
        return out


V = TypeVar("V")


class _RecentPerKey(Generic[V]):
    """The last ``window`` request names of each key, with a value each; found by name.

    Bounded per key, not overall: one key's (one tenant's) traffic cannot push another
    key's requests out before their labels come.
    """

    def __init__(self, window: int) -> None:
        self._window = window
        self._by_key: dict[str, OrderedDict[str, V]] = {}
        self._key_of: dict[str, str] = {}

    def add(self, name: str, key: str, value: V) -> None:
        old = self._key_of.get(name)
        if old is not None and old != key:
            self._by_key[old].pop(name, None)
        names = self._by_key.get(key)
        if names is None:  # not setdefault: it built an OrderedDict on every call
            names = self._by_key[key] = OrderedDict()
        names[name] = value
        names.move_to_end(name)
        self._key_of[name] = key
        while len(names) > self._window:
            gone, _ = names.popitem(last=False)
            if self._key_of.get(gone) == key:
                del self._key_of[gone]

    def forget_key(self, key: str) -> None:
        """Drop every name of ``key``."""
        names = self._by_key.pop(key, None)
        for name in names or ():
            if self._key_of.get(name) == key:
                del self._key_of[name]

    def get(self, name: str) -> tuple[str, V] | None:
        key = self._key_of.get(name)
        if key is None:
            return None
        return key, self._by_key[key][name]


class _ReadBack:
    """Requests decided elsewhere or before this start (read back from the verdicts), by
    name: each with its key, coverage and request id's murmur2 (``home``, its partition of
    any count). At most about ``window`` a key (``ceil(window / P) x P`` once the input
    partition count ``P`` is known), kept per input partition: past it, the partition
    holding the most loses its oldest, so the fleet's tail read at a start leaves each
    partition the ``ceil(window / P)`` its window holds, and a partition read back alone
    (given to this replica) keeps up to the whole ``window`` for its labels."""

    def __init__(self, window: int) -> None:
        self._window = window
        # key -> partition (None: the count not known) -> name -> (covered, home)
        self._by_key: dict[str, dict[int | None, OrderedDict[str, tuple[bool, int]]]] = {}
        self._where: dict[str, tuple[str, int | None]] = {}  # name -> (key, partition)
        self._sizes: dict[str, int] = {}  # key -> its requests kept

    def add(self, name: str, key: str, covered: bool, home: int, partitions: int | None) -> None:
        partition = None if not partitions else home % partitions
        old = self._where.get(name)
        if old is not None and old != (key, partition):
            if self._by_key[old[0]][old[1]].pop(name, None) is not None:
                self._sizes[old[0]] -= 1
            old = None
        buckets = self._by_key.get(key)
        if buckets is None:
            buckets = self._by_key[key] = {}
        names = buckets.get(partition)
        if names is None:
            names = buckets[partition] = OrderedDict()
        if old is None:
            self._sizes[key] = self._sizes.get(key, 0) + 1
        names[name] = (covered, home)
        names.move_to_end(name)
        self._where[name] = (key, partition)
        cap = self._window if not partitions else -(-self._window // partitions) * partitions
        while self._sizes[key] > cap:
            fullest_at, fullest = max(buckets.items(), key=lambda b: len(b[1]))
            gone, _ = fullest.popitem(last=False)
            self._sizes[key] -= 1
            if self._where.get(gone) == (key, fullest_at):
                del self._where[gone]

    def get(self, name: str) -> tuple[str, bool] | None:
        """The request's key and coverage."""
        where = self._where.get(name)
        if where is None:
            return None
        return where[0], self._by_key[where[0]][where[1]][name][0]

    def forget_key(self, key: str) -> None:
        """Drop every request of ``key``."""
        self._sizes.pop(key, None)
        for partition, names in self._by_key.pop(key, {}).items():
            for name in names:
                if self._where.get(name) == (key, partition):
                    del self._where[name]

    def of_partitions(
        self, partitions: frozenset[int], count: int
    ) -> dict[str, dict[int, list[tuple[str, bool]]]]:
        """Key -> partition -> its requests (name, covered), oldest first, of those of
        ``partitions`` (of ``count``)."""
        out: dict[str, dict[int, list[tuple[str, bool]]]] = {}
        for key, buckets in self._by_key.items():
            for names in buckets.values():
                for name, (covered, home) in names.items():
                    partition = home % count
                    if partition in partitions:
                        found = out.setdefault(key, {})
                        found.setdefault(partition, []).append((name, covered))
        return out
