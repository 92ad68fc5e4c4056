"""The online re-test of allow certificates: per key, a sliding window of feedback labels.

A certificate from :mod:`sidecar.confidence.certify_allow` promises that at most
``risk`` of the answers it allows are wrong (with probability >= 1 - delta over
its calibration draw). Traffic can drift, so the sidecar keeps re-testing the
promise on the labels of the answers it allowed under it: the error among them
with its Clopper-Pearson interval. Pure stdlib, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from sidecar.exceptions import ConfigError
from sidecar.stats.binomial import binomial_cdf, clopper_pearson

__all__ = ["CertificateCheck", "CertificateTracker", "CheckStatus", "check_level"]


def check_level(name: str, value: float) -> float:
    """``value`` as a float in (0, 1) (a risk, a delta, a confidence), else ``ConfigError``."""
    if isinstance(value, bool) or not (0.0 < float(value) < 1.0):
        raise ConfigError(f"{name} must be in (0, 1), got {value!r}")
    return float(value)


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
    reads to withdraw the certified allow: one exact binomial tail per label
    (the Clopper-Pearson low end is above the risk iff ``P(Binomial(n, risk) >=
    errors) < (1 - confidence) / 2``). ``check(key)`` adds the interval for
    reports and gauges, computed once per change. Not thread-safe (one event
    loop owns it).
    """

    def __init__(self, *, window: int = 10_000, confidence: float = 0.95) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError(f"window must be a positive number of labels, got {window!r}")
        self.window = window
        self.confidence = check_level("confidence", confidence)
        self._terms: dict[str, tuple[float, float]] = {}
        self._labels: dict[str, OrderedDict[str, bool]] = {}
        self._errors: dict[str, int] = {}
        self._violated: dict[str, bool] = {}
        self._checks: dict[str, CertificateCheck] = {}

    def register(self, key: str, risk: float, delta: float) -> None:
        """Track the certificate of ``key`` (a second register with other terms is an error)."""
        terms = (check_level("risk", risk), check_level("delta", delta))
        known = self._terms.get(key)
        if known is not None and known != terms:
            raise ConfigError(
                f"two certificates for key {key} with different terms: risk/delta {known} "
                f"and {terms}; one key has one certificate"
            )
        self._terms[key] = terms
        self._labels.setdefault(key, OrderedDict())
        self._errors.setdefault(key, 0)

    def keys(self) -> list[str]:
        return sorted(self._terms)

    def observe_label(self, key: str, request: str, *, wrong: bool) -> bool:
        """Label a certified-allowed answer of ``key``; True when it replaced an earlier label."""
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
        self._violated[key] = errors > 0 and tail < (1.0 - self.confidence) / 2.0
        return old is not None

    def violated(self, key: str) -> bool:
        return self._violated.get(key, False)

    def check(self, key: str) -> CertificateCheck:
        cached = self._checks.get(key)
        if cached is not None:
            return cached
        risk, delta = self._terms[key]
        n, errors = len(self._labels[key]), self._errors[key]
        if n == 0:
            result = CertificateCheck(
                key, risk, delta, 0, 0, None, None, "insufficient-data", self.confidence
            )
        else:
            low, high = clopper_pearson(errors, n, self.confidence)
            status: CheckStatus = "violated" if self.violated(key) else "holds"
            result = CertificateCheck(
                key, risk, delta, n, errors, low, high, status, self.confidence
            )
        self._checks[key] = result
        return result
