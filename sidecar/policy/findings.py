"""The rules of the policy: one answer's signals under a risk profile -> findings.

Each signal contributes *findings*: a machine-readable ``Reason`` and the
action the request's risk profile attaches to it (the engine,
:mod:`sidecar.policy.engine`, takes the most severe). Every finding is
reported, also those whose action is ``allow``: a missing signal is always a
reason, never silently fine. Claims follow the reliability tiers (HIGH ->
allow, MEDIUM -> caveat, LOW -> block, configurable per profile) and the
refusal threshold (hallucination rate above the profile's maximum -> block:
medical 0.05, enterprise 0.20, general 0.30) of docs/methods.md §Claim
verification.

Two claim findings do not come from the labels:

* ``stream-final-mismatch`` (caveat in every profile): the final answer is not
  the text the deltas streamed (the same text in another Unicode normal form,
  NFC versus NFD, is; a compatibility form or an invisible character is not).
  The final answer was verified; the claim verdicts published for streamed
  sentences it no longer holds are listed in ``ClaimsSignal.superseded_claims``
  and not counted. Whoever watched the stream saw text this verdict does not
  judge.
* ``claims-over-limit`` (the profile's ``claims.when_missing``): the answer
  holds more claims than the sidecar verifies per answer
  (``sidecar.claims.segment.MAX_CLAIMS_PER_ANSWER``); the rest is counted in
  ``ClaimsSignal.unchecked`` and unverified, like a partly missing signal.
* ``claims-unreadable`` (the profile's ``claims.when_missing``): sentences of
  the answer in a script the claim checker does not read (not Latin), and
  lines of fenced code blocks, gave no claim (``ClaimsSignal.unreadable``):
  unverified, like a partly missing signal, never read as "nothing to check".

Pure logic: no I/O.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

from sidecar.contracts.events import (
    ClaimsSignal,
    LookbackSignal,
    Reason,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.contracts.verdicts import SCORES_RISING
from sidecar.policy.config import Action, ConfidenceRules, LookbackRules, Profile

__all__ = ["Finding", "SignalName", "evaluate_signals", "finding"]

SignalName = Literal["retrieval", "lookback", "claims", "confidence"]
_OK = SignalStatus.OK  # one global read: a member read through its enum class is ~0.09 us


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason for the decision, and the action the profile attaches to it."""

    action: Action
    reason: Reason


@functools.lru_cache(maxsize=4096)
def below(p: float, threshold: float) -> str:
    """``"p < threshold"`` with as many decimals of ``p`` as it takes to read as below it
    (two, unless rounding would print 0.10 < 0.1); the threshold as configured."""
    for places in range(2, 7):
        shown = f"{p:.{places}f}"
        if float(shown) < threshold:
            return f"{shown} < {threshold:g}"
    return f"{p!r} < {threshold:g}"  # the shortest repr that round-trips is below it


@functools.lru_cache(maxsize=4096)
def finding(action: Action, code: str, message: str, signal: SignalName) -> Finding:
    """A ``Finding`` whose reason is ``code`` / ``message`` of ``signal``.

    Frozen, so shared: the messages repeat (numbers are written to 2-3 decimals) and
    a cached one skips the ``Reason`` validation.
    """
    return Finding(action, Reason(code=code, message=message, signal=signal))


@functools.cache
def _missing(signal: SignalName, status: SignalStatus, action: Action) -> Finding:
    """A missing signal's finding: a constant per (signal, status, action), built once."""
    word = "not-configured" if status is SignalStatus.NOT_CONFIGURED else "unavailable"
    text = "is not configured" if word == "not-configured" else "could not be computed"
    return finding(
        action, f"{signal}-{word}", f"the {signal} signal {text} for this request", signal
    )


def _retrieval(sig: RetrievalSignal, profile: Profile) -> list[Finding]:
    rules = profile.retrieval
    if sig.status is not _OK:
        return [_missing("retrieval", sig.status, rules.when_missing)]
    out: list[Finding] = []
    if sig.fallback_reason == SCORES_RISING:
        return [
            finding(
                rules.when_no_trusted_chunk,
                "retrieval-scores-rising",
                "this retriever's scores rise down its hit lists (hits come best first): they "
                "look like distances, which the calibration reads the other way round, so no "
                "chunk is certified; send similarities (e.g. 1 - cosine distance)",
                "retrieval",
            )
        ]
    if sig.certifiable is False:
        out.append(
            finding(
                rules.when_no_trusted_chunk,
                "retrieval-not-certifiable",
                f"no conformal threshold exists at alpha = {sig.alpha} for this calibration "
                "(k > n): nothing is certified",
                "retrieval",
            )
        )
    elif not sig.m1 or not sig.trusted_chunk_ids:
        out.append(
            finding(
                rules.when_no_trusted_chunk,
                "retrieval-no-trusted-chunk",
                "no retrieved chunk passed the conformal threshold (m1 = false)",
                "retrieval",
            )
        )
    elif sig.m2 is not None and sig.m2 < rules.min_trusted_fraction:
        low = _low_trusted_fraction if sig.m2 > 0.0 else _low_trusted_fraction.__wrapped__
        out.append(low(rules.when_low_trusted_fraction, sig.m2, rules.min_trusted_fraction))
    if sig.fallback:
        out.append(_calibration_fallback(sig.fallback_reason))
    if sig.monitor == "exchangeability-broken":
        mean = f"{sig.m1_mean:.3f}" if sig.m1_mean is not None else "?"
        out.append(
            finding(
                rules.when_exchangeability_broken,
                "exchangeability-broken",
                f"rolling mean(m1) = {mean} is significantly below 1 - alpha for "
                f"{sig.calibration_key}: exchangeability broken, recalibrate",
                "retrieval",
            )
        )
    return out


@functools.lru_cache(maxsize=4096)
def _low_trusted_fraction(action: Action, m2: float, min_fraction: float) -> Finding:
    """The ``retrieval-low-trusted-fraction`` finding, cached by its numbers: m2 is a
    count over the depth (a handful of values), and its message's two formatted floats
    and the long text hashed by :func:`finding`'s cache were ~1 us a request. Keys equal
    as numbers write the same text, except ``0.0`` and ``-0.0``: an m2 of zero (no chunk
    trusted, which the branch before reports) is not cached."""
    return finding(
        action,
        "retrieval-low-trusted-fraction",
        f"m2 = {m2:.2f} of the retrieved chunks are trusted, below {min_fraction:.2f}",
        "retrieval",
    )


@functools.lru_cache(maxsize=256)
def _calibration_fallback(reason: str | None) -> Finding:
    """The ``retrieval-calibration-fallback`` finding per fallback reason (a handful)."""
    return finding(
        "allow",
        "retrieval-calibration-fallback",
        "no calibration for this key; the global calibration was used"
        + (f" ({reason})" if reason else ""),
        "retrieval",
    )


def _lookback(sig: LookbackSignal, profile: Profile) -> list[Finding]:
    rules = profile.lookback
    if sig.status is not _OK or sig.p_factual is None:
        status = SignalStatus.UNAVAILABLE if sig.status is _OK else sig.status
        return [_missing("lookback", status, rules.when_missing)]
    return _thresholds(sig.p_factual, rules, "lookback", "p(factual)")


def _thresholds(
    p: float, rules: LookbackRules | ConfidenceRules, signal: SignalName, name: str
) -> list[Finding]:
    """``<signal>-very-low`` (block) below ``block_below``, ``<signal>-low`` (caveat) below
    ``caveat_below``, nothing otherwise."""
    if p < rules.block_below:
        return [_below_finding("block", signal, name, p, rules.block_below)]
    if p < rules.caveat_below:
        return [_below_finding("caveat", signal, name, p, rules.caveat_below)]
    return []


def _below_finding(
    action: Action, signal: SignalName, name: str, p: float, threshold: float
) -> Finding:
    """``finding(action, "<signal>-very-low" | "<signal>-low", f"{name} = {below(p, threshold)}",
    signal)``, found by ``p``'s two decimals: ``p`` is a new float on nearly every answer, so
    ``below``'s cache keyed by it missed (~1.1 us a finding), and two decimals are its text
    unless they read as not below the threshold (then ``below`` writes more)."""
    shown = f"{p:.2f}"
    if float(shown) < threshold:
        return _two_decimals_below(action, signal, name, shown, threshold)
    level = "very-low" if action == "block" else "low"
    return finding(action, f"{signal}-{level}", f"{name} = {below(p, threshold)}", signal)


@functools.lru_cache(maxsize=4096)
def _two_decimals_below(
    action: Action, signal: SignalName, name: str, shown: str, threshold: float
) -> Finding:
    level = "very-low" if action == "block" else "low"
    return finding(action, f"{signal}-{level}", f"{name} = {shown} < {threshold:g}", signal)


def _claims(sig: ClaimsSignal, profile: Profile) -> list[Finding]:
    rules = profile.claims
    if sig.status is not _OK:
        return [_missing("claims", sig.status, rules.when_missing)]
    out: list[Finding] = []
    if sig.evidence_scope == "all-retrieved":
        out.append(
            finding(
                rules.when_untrusted_evidence,
                "claims-evidence-untrusted",
                "claims were checked against all retrieved chunks (none certified as trusted)",
                "claims",
            )
        )
    if sig.stream_mismatch:
        out.append(
            finding(
                "caveat",
                "stream-final-mismatch",
                "the final answer differs from the streamed text; the final answer was verified"
                + (
                    f" and {len(sig.superseded_claims)} streamed claim verdict(s) no longer apply"
                    if sig.superseded_claims
                    else ""
                ),
                "claims",
            )
        )
    if sig.unchecked:
        out.append(
            finding(
                rules.when_missing,
                "claims-over-limit",
                f"{sig.unchecked} claim(s) past the per-answer limit were not verified",
                "claims",
            )
        )
    if sig.unreadable:
        out.append(
            finding(
                rules.when_missing,
                "claims-unreadable",
                f"{sig.unreadable} sentence(s) in a script the claim checker does not read "
                "(not Latin), or line(s) of fenced program code, were not verified",
                "claims",
            )
        )
    if sig.n - sig.irrelevant <= 0:
        out.append(
            finding(
                rules.when_no_claims, "claims-none", "the answer holds no checkable claim", "claims"
            )
        )
        return out
    rate = sig.hallucination_rate or 0.0
    if rate > profile.max_hallucination_rate:
        out.append(
            finding(
                "block",
                "claims-hallucination-rate-exceeded",
                f"hallucination rate {rate:.2f} ({sig.unsupported} of "
                f"{sig.n - sig.irrelevant} claims unsupported) > {profile.max_hallucination_rate}",
                "claims",
            )
        )
    level = sig.reliability_level or "LOW"
    action = rules.reliability_actions[level]
    out.append(
        finding(
            action,
            f"claims-reliability-{level.lower()}",
            f"reliability {sig.reliability or 0.0:.2f} ({level}): {sig.supported} supported, "
            f"{sig.uncertain} uncertain, {sig.unsupported} unsupported",
            "claims",
        )
    )
    if sig.unsupported and rules.caveat_on_any_unsupported:
        out.append(
            finding(
                "caveat", "claims-unsupported-present", f"{sig.unsupported} unsupported", "claims"
            )
        )
    if sig.unsupported and profile.strict:
        out.append(
            finding(
                "block",
                "strict-unsupported-claim",
                "strict profile: an unsupported claim blocks the answer",
                "claims",
            )
        )
    return out


def _confidence(confidence: float | None, profile: Profile, status: SignalStatus) -> list[Finding]:
    rules = profile.confidence
    if rules.block_below == 0.0 and rules.caveat_below == 0.0:
        return []  # the profile does not use the calibrated confidence
    if confidence is None:
        return [_missing("confidence", status, rules.when_missing)]
    return _thresholds(confidence, rules, "confidence", "calibrated p(correct)")


def evaluate_signals(
    signals: Signals,
    profile: Profile,
    confidence: float | None = None,
    confidence_status: SignalStatus = SignalStatus.NOT_CONFIGURED,
) -> list[Finding]:
    """All findings for one answer under ``profile`` (retrieval, lookback, claims, confidence);
    ``confidence_status``: why ``confidence`` is ``None`` (not configured, or unavailable)."""
    out = _retrieval(signals.retrieval, profile)  # a new list: the others join it
    out += _lookback(signals.lookback, profile)
    out += _claims(signals.claims, profile)
    out += _confidence(confidence, profile, confidence_status)
    return out
