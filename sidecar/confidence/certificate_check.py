"""The online re-test of allow certificates: per key, a sliding window of feedback labels.

A certificate from :mod:`sidecar.confidence.certify_allow` promises that at most
``risk`` of the answers it allows are wrong (with probability >= 1 - delta over
its calibration draw). Traffic can drift, so the sidecar keeps re-testing the
promise on the labels of the answers it allowed under it: the error among them
with its Clopper-Pearson interval.

A replica sees the labels of its own partitions only, and forgets them when it
restarts: a violation found here is therefore announced to the fleet (a
:class:`~sidecar.contracts.reports.CertificateWithdrawal` on ``rag.certificates``,
:meth:`CertificateTracker.take_withdrawals`) and the fleet's withdrawals are applied
here (:meth:`CertificateTracker.apply`): every replica, and every replica started
later, withdraws the certified allow until the certificate is replaced or reinstated.
An announcement counts once the fleet's topic has it: one not read back within
``reannounce_s`` (its publish was lost, the topic refused it) is announced again.
No I/O here.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from sidecar import __version__
from sidecar.contracts.reports import CertificateWithdrawal
from sidecar.exceptions import ConfigError
from sidecar.stats.binomial import binomial_cdf, clopper_pearson

__all__ = ["CertificateCheck", "CertificateTracker", "CheckStatus", "check_level"]


def check_level(name: str, value: float) -> float:
    """``value`` as a float in (0, 1) (a risk, a delta, a confidence), else ``ConfigError``."""
    if isinstance(value, bool) or not (0.0 < float(value) < 1.0):
        raise ConfigError(f"{name} must be in (0, 1), got {value!r}")
    return float(value)


_HOST = socket.gethostname() or None  # the pod's name under Kubernetes

CheckStatus = Literal["holds", "violated", "insufficient-data"]


@dataclass(frozen=True, slots=True)
class CertificateCheck:
    """The certificate of one key re-tested on the labelled allowed answers of the window.

    ``violated``: even the low end of the Clopper-Pearson interval of the error
    among allowed answers is above the certified risk. ``holds``: not violated;
    ``error_high <= risk`` additionally confirms it.
    """

    key: str
    risk: float
    delta: float
    labelled: int
    errors: int
    error_low: float | None
    error_high: float | None
    status: CheckStatus
    confidence: float

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.labelled if self.labelled else None


class CertificateTracker:
    """Per certificate key: a sliding window of labels on certified-allowed answers.

    One label per request (the last wins). ``violated(key)`` is what the policy
    reads to withdraw the certified allow: this replica's window found it broken
    (one exact binomial tail per label: the Clopper-Pearson low end is above the
    risk iff ``P(Binomial(n, risk) >= errors) < (1 - confidence) / 2``), or the
    fleet withdrew it (:meth:`withdrawn`). ``check(key)`` adds the interval for
    reports and gauges, computed once per change.

    The labels come from the processor (a worker thread) and the fleet's
    withdrawals from the event loop: a lock keeps the two apart.
    """

    def __init__(
        self,
        *,
        window: int = 10_000,
        confidence: float = 0.95,
        instance: str | None = _HOST,
        version: str = __version__,
        reannounce_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``reannounce_s``: seconds after which a violation announced here, while still
        violated here, is announced again if the fleet's topic has not shown it back."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError(f"window must be a positive number of labels, got {window!r}")
        if not reannounce_s > 0.0:
            raise ConfigError(f"reannounce_s must be a positive number, got {reannounce_s!r}")
        self.window = window
        self.confidence = check_level("confidence", confidence)
        self._instance = instance
        self._version = version
        self._terms: dict[str, tuple[float, float]] = {}
        self._fingerprints: dict[str, set[str]] = {}
        self._labels: dict[str, OrderedDict[str, bool]] = {}
        self._errors: dict[str, int] = {}
        self._violated: dict[str, bool] = {}
        self._checks: dict[str, CertificateCheck] = {}
        self._fleet: dict[str, CertificateWithdrawal] = {}  # read from rag.certificates
        self._announced: set[str] = set()  # keys whose violation the fleet knows or will
        self._pending: list[str] = []  # violations found here, to announce
        self._announced_at: dict[str, float] = {}  # monotonic; until the topic shows it back
        self._displaced_at: dict[str, float] = {}  # held withdrawals the topic lost the lead of
        self._reannounce_s = reannounce_s
        self._clock = clock
        self._lock = threading.Lock()

    def register(self, key: str, risk: float, delta: float, fingerprint: str = "") -> None:
        """Track the certificate of ``key`` (a second register with other terms is an error).

        ``fingerprint`` names the certificate (a key may have several, one per set of
        served signals): a fleet withdrawal holds while the key's fingerprints are the
        ones it names."""
        terms = (check_level("risk", risk), check_level("delta", delta))
        known = self._terms.get(key)
        if known is not None and known != terms:
            raise ConfigError(
                f"two certificates for key {key} with different terms: risk/delta {known} "
                f"and {terms}; one key has one certificate"
            )
        self._terms[key] = terms
        if fingerprint:
            self._fingerprints.setdefault(key, set()).add(fingerprint)
        self._labels.setdefault(key, OrderedDict())
        self._errors.setdefault(key, 0)

    def keys(self) -> list[str]:
        return sorted(self._terms)

    def fingerprints(self, key: str) -> list[str]:
        """The names of ``key``'s certificates (``["unnamed"]`` when registered without)."""
        return sorted(self._fingerprints.get(key, ())) or ["unnamed"]

    def observe_label(self, key: str, request: str, *, wrong: bool) -> bool:
        """Label a certified-allowed answer of ``key``; True when it replaced an earlier label."""
        with self._lock:
            labels = self._labels.get(key)
            if labels is None:
                return False  # not a tracked certificate
            old = labels.pop(request, None)
            errors = self._errors[key] - int(bool(old)) + int(bool(wrong))
            labels[request] = bool(wrong)
            while len(labels) > self.window:
                _, dropped = labels.popitem(last=False)
                errors -= int(dropped)
            self._errors[key] = errors
            self._checks.pop(key, None)
            n, risk = len(labels), self._terms[key][0]
            tail = 1.0 - binomial_cdf(errors - 1, n, risk)  # P(X >= errors | risk)
            violated = errors > 0 and tail < (1.0 - self.confidence) / 2.0
            self._violated[key] = violated
            if violated and key not in self._announced and self.withdrawn(key) is None:
                self._announced.add(key)
                self._pending.append(key)
            return old is not None

    def violated(self, key: str) -> bool:
        return self._violated.get(key, False) or self.withdrawn(key) is not None

    def withdrawn(self, key: str) -> CertificateWithdrawal | None:
        """The fleet's withdrawal of ``key``'s certified allow, if it holds for the
        certificates served here (the same fingerprints)."""
        record = self._fleet.get(key)
        if record is None or not self._names_ours(key, record):
            return None
        return record

    def apply(self, key: str, withdrawal: CertificateWithdrawal | None) -> None:
        """A record of ``rag.certificates``: a withdrawal, or ``None`` (a tombstone: the
        certificate reinstated, its re-test window here started afresh).

        A withdrawal of other certificates (a replica on an older or newer certificate
        file) never replaces one of the certificates served here: only a tombstone gives
        a withdrawn allow back. It does displace it on the compacted topic, so the one
        held here is published again (:meth:`displaced`)."""
        with self._lock:
            if withdrawal is not None:
                if self.withdrawn(key) is not None and not self._names_ours(key, withdrawal):
                    self._displace(key)
                    return
                self._displaced_at.pop(key, None)
                self._fleet[key] = withdrawal
                self._checks.pop(key, None)
                if self.withdrawn(key) is not None:
                    self._announced.add(key)
                    self._announced_at.pop(key, None)  # the fleet has it: announced for good
                return
            self._displaced_at.pop(key, None)
            if self._fleet.pop(key, None) is None or key not in self._terms:
                return
            self._labels[key] = OrderedDict()
            self._errors[key] = 0
            self._violated[key] = False
            self._checks.pop(key, None)
            self._announced.discard(key)
            self._announced_at.pop(key, None)

    def displaced(self, key: str) -> None:
        """The topic's latest record of ``key`` is not a withdrawal of the certificates
        served here (junk, or other certificates'): once compacted, it would be all that
        is left of the key. A withdrawal held here is published again after
        ``reannounce_s`` (every replica holding it does: duplicates cost nothing on a
        compacted topic), unless a tombstone or the record itself comes back first."""
        with self._lock:
            self._displace(key)

    def _displace(self, key: str) -> None:
        if self.withdrawn(key) is not None and key not in self._displaced_at:
            self._displaced_at[key] = self._clock()

    def _names_ours(self, key: str, withdrawal: CertificateWithdrawal) -> bool:
        return sorted(withdrawal.certificates) == self.fingerprints(key)

    def take_withdrawals(
        self, now: datetime | None = None, *, unconfirmed: bool = False
    ) -> list[CertificateWithdrawal]:
        """The violations found here since the last call, as records for the fleet (once
        per key until it is reinstated; again every ``reannounce_s`` while still violated
        here and not read back from the fleet's topic, or at once with ``unconfirmed``:
        a replica stopping forgets its window, so what the fleet may not have yet goes
        out once more)."""
        with self._lock:
            keys, self._pending = self._pending, []
            at = self._clock()
            for key, since in list(self._announced_at.items()):
                if key in keys or (at - since < self._reannounce_s and not unconfirmed):
                    continue
                if self._violated.get(key, False) and self.withdrawn(key) is None:
                    keys.append(key)  # not read back: lost, or the topic refused it
                else:
                    del self._announced_at[key]  # recovered here before the fleet heard
                    self._announced.discard(key)
            out: list[CertificateWithdrawal] = []
            for key, since in list(self._displaced_at.items()):
                if at - since < self._reannounce_s and not unconfirmed:
                    continue
                del self._displaced_at[key]
                held = self.withdrawn(key)
                if held is not None and key not in keys:
                    out.append(held)  # as it was: the fleet's record, restored
            for key in keys:
                self._announced_at[key] = at
                check = self._compute(key)
                if check.error_low is None or check.error_high is None:
                    continue
                out.append(
                    CertificateWithdrawal(
                        calibration_key=key,
                        certificates=self.fingerprints(key),
                        risk=check.risk,
                        delta=check.delta,
                        labelled=check.labelled,
                        errors=check.errors,
                        error_low=check.error_low,
                        error_high=check.error_high,
                        instance=self._instance,
                        withdrawn_at=now or datetime.now(UTC),
                        sidecar_version=self._version,
                    )
                )
            return out

    def check(self, key: str) -> CertificateCheck:
        with self._lock:
            return self._compute(key)

    def _compute(self, key: str) -> CertificateCheck:
        cached = self._checks.get(key)
        if cached is not None:
            return cached
        risk, delta = self._terms[key]
        n, errors = len(self._labels[key]), self._errors[key]
        if n == 0:  # a fleet withdrawal holds without labels here (a replica started since)
            empty: CheckStatus = "violated" if self.violated(key) else "insufficient-data"
            result = CertificateCheck(key, risk, delta, 0, 0, None, None, empty, self.confidence)
        else:
            low, high = clopper_pearson(errors, n, self.confidence)
            status: CheckStatus = "violated" if self.violated(key) else "holds"
            result = CertificateCheck(
                key, risk, delta, n, errors, low, high, status, self.confidence
            )
        self._checks[key] = result
        return result
