"""The policy engine: retrieval certification + lookback p(factual) + claim scores -> a decision.

Each signal contributes *findings*: a machine-readable ``Reason`` and the
action the request's risk profile attaches to it. The decision is the most
severe action (allow < caveat < block); every finding is reported, also those
whose action is ``allow`` (a missing signal is always a reason, never
silently fine). Claims follow seed 001's tiers (HIGH -> allow, MEDIUM ->
caveat, LOW -> block, configurable per profile) and seed 002's refusal
threshold (hallucination rate above the profile's maximum -> block:
medical 0.05, enterprise 0.20, general 0.30).

Outcome texts (seed 001 ``make_reliability_decision``):

* **caveat**: the caveat text, and when unsupported claims are known the
  answer rewritten without them (:func:`~sidecar.policy.rewrite.remove_unsupported`);
* **block**: the verified-facts-only answer, or the refusal when nothing is
  verified (:func:`~sidecar.policy.rewrite.verified_only`);
* ``escalate`` (seed 001 pattern 3) when reliability is below the profile's
  ``escalate_below_reliability`` or, if configured, on every block.

Two claim findings do not come from the labels:

* ``stream-final-mismatch`` (caveat in every profile): the final answer is not
  the text the deltas streamed. The final answer was verified; the claim
  verdicts published for streamed sentences it no longer holds are listed
  in ``ClaimsSignal.superseded_claims`` and not counted. Whoever watched the
  stream saw text this verdict does not judge.
* ``claims-over-limit`` (the profile's ``claims.when_missing``): the answer
  holds more claims than the sidecar verifies per answer
  (``sidecar.claims.segment.MAX_CLAIMS_PER_ANSWER``); the rest is counted in
  ``ClaimsSignal.unchecked`` and unverified, like a partly missing signal.

Certified allow (``allow: {certified: FILE}`` in a profile;
:mod:`sidecar.policy.certified`): an answer is allowed only when its calibrated
confidence reaches the threshold a certificate from ``guardrail calibrate
policy`` certified; the outcome then carries the certificate's risk and delta.
Below the threshold, for another calibration key, or while the online re-test
finds the certificate broken (``certificate-violated``), the profile's action
applies instead.

Per-claim results (texts, labels, spans) come in through ``decide(...,
claims=...)``; without them a rewrite is impossible and the outcome says so
(``claims-detail-unavailable``). Strict mode (seed 002: "in strict mode,
refuses to return it"): :meth:`PolicyEngine.check_stream` blocks as soon as a
streamed claim is unsupported under a strict profile. Pure logic: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from sidecar.confidence.certify_allow import CertificateTracker
from sidecar.contracts.events import (
    ClaimLabel,
    ClaimsSignal,
    Decision,
    GenerationFinal,
    LookbackSignal,
    Reason,
    RetrievalEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.pipeline.outputs import PROFILE_REASON_PREFIX
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome
from sidecar.policy.certified import CertifiedAllow, load_certificates
from sidecar.policy.config import (
    SEVERITY,
    Action,
    ConfidenceRules,
    LookbackRules,
    PolicyConfig,
    PolicyTexts,
    Profile,
    load_policy,
)
from sidecar.policy.rewrite import remove_unsupported, verified_only

__all__ = ["Finding", "PolicyEngine", "evaluate_signals", "strict_outcome"]

SignalName = Literal["retrieval", "lookback", "claims", "confidence"]
_DECISION = {"allow": Decision.ALLOW, "caveat": Decision.CAVEAT, "block": Decision.BLOCK}


@dataclass(frozen=True, slots=True)
class Finding:
    action: Action
    reason: Reason


def _f(action: Action, code: str, message: str, signal: SignalName) -> Finding:
    return Finding(action, Reason(code=code, message=message, signal=signal))


def _missing(signal: SignalName, status: SignalStatus, action: Action) -> Finding:
    word = "not-configured" if status is SignalStatus.NOT_CONFIGURED else "unavailable"
    text = "is not configured" if word == "not-configured" else "could not be computed"
    return _f(action, f"{signal}-{word}", f"the {signal} signal {text} for this request", signal)


def _retrieval(sig: RetrievalSignal, profile: Profile) -> list[Finding]:
    rules = profile.retrieval
    if sig.status is not SignalStatus.OK:
        return [_missing("retrieval", sig.status, rules.when_missing)]
    out: list[Finding] = []
    if sig.certifiable is False:
        out.append(
            _f(
                rules.when_no_trusted_chunk,
                "retrieval-not-certifiable",
                f"no conformal threshold exists at alpha = {sig.alpha} for this calibration "
                "(k > n): nothing is certified",
                "retrieval",
            )
        )
    elif not sig.m1 or not sig.trusted_chunk_ids:
        out.append(
            _f(
                rules.when_no_trusted_chunk,
                "retrieval-no-trusted-chunk",
                "no retrieved chunk passed the conformal threshold (m1 = false)",
                "retrieval",
            )
        )
    elif sig.m2 is not None and sig.m2 < rules.min_trusted_fraction:
        out.append(
            _f(
                rules.when_low_trusted_fraction,
                "retrieval-low-trusted-fraction",
                f"m2 = {sig.m2:.2f} of the retrieved chunks are trusted, "
                f"below {rules.min_trusted_fraction:.2f}",
                "retrieval",
            )
        )
    if sig.fallback:
        out.append(
            _f(
                "allow",
                "retrieval-calibration-fallback",
                "no calibration for this key; the global calibration was used"
                + (f" ({sig.fallback_reason})" if sig.fallback_reason else ""),
                "retrieval",
            )
        )
    if sig.monitor == "exchangeability-broken":
        mean = f"{sig.m1_mean:.3f}" if sig.m1_mean is not None else "?"
        out.append(
            _f(
                rules.when_exchangeability_broken,
                "exchangeability-broken",
                f"rolling mean(m1) = {mean} is significantly below 1 - alpha for "
                f"{sig.calibration_key}: exchangeability broken, recalibrate",
                "retrieval",
            )
        )
    return out


def _lookback(sig: LookbackSignal, profile: Profile) -> list[Finding]:
    rules = profile.lookback
    if sig.status is not SignalStatus.OK or sig.p_factual is None:
        status = SignalStatus.UNAVAILABLE if sig.status is SignalStatus.OK else sig.status
        return [_missing("lookback", status, rules.when_missing)]
    return _thresholds(sig.p_factual, rules, "lookback", "p(factual)")


def _thresholds(
    p: float, rules: LookbackRules | ConfidenceRules, signal: SignalName, name: str
) -> list[Finding]:
    """``<signal>-very-low`` (block) below ``block_below``, ``<signal>-low`` (caveat) below
    ``caveat_below``, nothing otherwise."""
    if p < rules.block_below:
        return [
            _f("block", f"{signal}-very-low", f"{name} = {p:.2f} < {rules.block_below}", signal)
        ]
    if p < rules.caveat_below:
        return [_f("caveat", f"{signal}-low", f"{name} = {p:.2f} < {rules.caveat_below}", signal)]
    return []


def _claims(sig: ClaimsSignal, profile: Profile) -> list[Finding]:
    rules = profile.claims
    if sig.status is not SignalStatus.OK:
        return [_missing("claims", sig.status, rules.when_missing)]
    out: list[Finding] = []
    if sig.evidence_scope == "all-retrieved":
        out.append(
            _f(
                rules.when_untrusted_evidence,
                "claims-evidence-untrusted",
                "claims were checked against all retrieved chunks (none certified as trusted)",
                "claims",
            )
        )
    if sig.stream_mismatch:
        out.append(
            _f(
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
            _f(
                rules.when_missing,
                "claims-over-limit",
                f"{sig.unchecked} claim(s) past the per-answer limit were not verified",
                "claims",
            )
        )
    if sig.n - sig.irrelevant <= 0:
        out.append(
            _f(rules.when_no_claims, "claims-none", "the answer holds no checkable claim", "claims")
        )
        return out
    rate = sig.hallucination_rate or 0.0
    if rate > profile.max_hallucination_rate:
        out.append(
            _f(
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
        _f(
            action,
            f"claims-reliability-{level.lower()}",
            f"reliability {sig.reliability or 0.0:.2f} ({level}): {sig.supported} supported, "
            f"{sig.uncertain} uncertain, {sig.unsupported} unsupported",
            "claims",
        )
    )
    if sig.unsupported and rules.caveat_on_any_unsupported:
        out.append(
            _f("caveat", "claims-unsupported-present", f"{sig.unsupported} unsupported", "claims")
        )
    if sig.unsupported and profile.strict:
        out.append(
            _f(
                "block",
                "strict-unsupported-claim",
                "strict profile: an unsupported claim blocks the answer",
                "claims",
            )
        )
    return out


def _confidence(confidence: float | None, profile: Profile) -> list[Finding]:
    rules = profile.confidence
    if rules.block_below == 0.0 and rules.caveat_below == 0.0:
        return []  # the profile does not use the calibrated confidence
    if confidence is None:
        return [_missing("confidence", SignalStatus.NOT_CONFIGURED, rules.when_missing)]
    return _thresholds(confidence, rules, "confidence", "calibrated p(correct)")


def evaluate_signals(
    signals: Signals, profile: Profile, confidence: float | None = None
) -> list[Finding]:
    """All findings for one answer under ``profile`` (retrieval, lookback, claims, confidence)."""
    return [
        *_retrieval(signals.retrieval, profile),
        *_lookback(signals.lookback, profile),
        *_claims(signals.claims, profile),
        *_confidence(confidence, profile),
    ]


def strict_outcome(
    profile_name: str,
    profile: Profile,
    texts: PolicyTexts,
    claims: Sequence[ClaimResult],
    *,
    trusted_evidence: bool,
) -> PolicyOutcome | None:
    """Strict mode mid-stream: BLOCK as soon as a claim is unsupported, else ``None``.

    ``claims`` are the results streamed so far. The outcome carries the
    verified facts so far as the rewritten answer (only when they were checked
    against trusted chunks, unless the profile allows otherwise), or the refusal.
    """
    if not profile.strict:
        return None
    first = next((c for c in claims if c.label is ClaimLabel.UNSUPPORTED), None)
    if first is None:
        return None
    usable = trusted_evidence or profile.claims.verified_only_from_untrusted_evidence
    text, verified = verified_only(
        claims if usable else (), texts.verified_intro, texts.verified_outro, texts.refusal
    )
    reason = Reason(
        code="strict-unsupported-claim",
        message=f"profile {profile_name} is strict: claim {first.index} is unsupported "
        f"({first.text[:120]!r})",
        signal="claims",
    )
    return PolicyOutcome(
        decision=Decision.BLOCK,
        reasons=[_profile_reason(profile_name), reason],
        caveat_text=texts.verified_only_caveat if verified else None,
        rewritten_answer=text,
        escalate=profile.escalate_on_block,
    )


def _profile_reason(name: str) -> Reason:
    return Reason(
        code=f"{PROFILE_REASON_PREFIX}{name}", message=f"risk profile {name}", signal="policy"
    )


class PolicyEngine:
    """The declarative policy (``sidecar.policy.config``) as a ``Policy``.

    Profiles with ``allow: {certified: FILE}`` load their certificate
    (:mod:`sidecar.policy.certified`; relative to ``base_dir``, the policy
    file's folder, then to the ``search`` folders) and check it against
    ``models`` (the served model versions; ``None`` skips that check, e.g.
    ``guardrail policy check``).
    """

    def __init__(
        self,
        config: PolicyConfig,
        *,
        base_dir: Path | None = None,
        models: Mapping[str, str] | None = None,
        search: Sequence[Path] = (),
    ) -> None:
        self.config = config
        dirs = [*([base_dir] if base_dir is not None else []), *search]
        self.certified: dict[str, CertifiedAllow] = load_certificates(config, dirs, models)
        self.certificates = CertificateTracker()
        self.attach_certificates(self.certificates)

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        models: Mapping[str, str] | None = None,
        search: Sequence[Path] = (),
    ) -> PolicyEngine:
        """Load and validate a policy YAML file (``ConfigError`` says what is wrong).

        Relative certificate paths: the file's folder first, then ``search``.
        """
        return cls(load_policy(path), base_dir=path.parent, models=models, search=search)

    def attach_certificates(self, tracker: CertificateTracker) -> None:
        """Re-test the certificates with ``tracker`` (the coverage monitor's, fed by feedback)."""
        for entry in self.certified.values():
            tracker.register(entry.certificate.key, entry.certificate.risk, entry.certificate.delta)
        self.certificates = tracker

    @property
    def name(self) -> str:
        return f"{self.config.name}/{self.config.version}"

    def profile(self, retrieval: RetrievalEvent) -> tuple[str, Profile]:
        return self.config.profile_for(retrieval.tenant, retrieval.collection)

    def check_stream(
        self,
        retrieval: RetrievalEvent,
        claims: Sequence[ClaimResult],
        certification: RetrievalSignal | None = None,
    ) -> PolicyOutcome | None:
        """Strict mode: call after each ``ClaimSession.feed`` with all results so far.

        ``certification`` tells whether the claims were checked against trusted
        chunks (as the claim checker decides it: status ok and trusted ids).
        """
        name, profile = self.profile(retrieval)
        trusted = (
            certification is not None
            and certification.status is SignalStatus.OK
            and bool(certification.trusted_chunk_ids)
        )
        return strict_outcome(name, profile, self.config.texts, claims, trusted_evidence=trusted)

    def decide(
        self,
        retrieval: RetrievalEvent,
        final: GenerationFinal,
        signals: Signals,
        *,
        claims: Sequence[ClaimResult] | None = None,
        confidence: float | None = None,
    ) -> PolicyOutcome:
        name, profile = self.profile(retrieval)
        findings = evaluate_signals(signals, profile, confidence)
        entry = self.certified.get(name)
        certified = None
        if entry is not None:
            certified = entry.decide(retrieval, confidence, self.certificates)
            findings.append(Finding(certified.action, certified.reason))
        elif profile.allow is not None:  # never an uncertified allow under a certified profile
            findings.append(
                _f(
                    profile.allow.below,
                    "certificate-not-applicable",
                    f"the certificate of profile {name} was not loaded (a policy not read from "
                    "a file cannot resolve its relative path)",
                    "confidence",
                )
            )
        outcome = self._outcome(
            name, profile, findings, final=final, signals=signals, claims=claims
        )
        if certified is not None and certified.in_force and entry is not None:
            cert = entry.certificate
            return replace(
                outcome, certified_risk=cert.risk, certified_delta=cert.delta, certificate=cert.key
            )
        return outcome

    def _outcome(
        self,
        name: str,
        profile: Profile,
        findings: list[Finding],
        *,
        final: GenerationFinal,
        signals: Signals,
        claims: Sequence[ClaimResult] | None,
    ) -> PolicyOutcome:
        texts = self.config.texts
        action: Action = "allow"
        for finding in findings:
            if SEVERITY[finding.action] > SEVERITY[action]:
                action = finding.action
        reasons = [_profile_reason(name), *(f.reason for f in findings)]
        if len(reasons) == 1:
            reasons.append(Reason(code="checks-passed", message="every signal passed"))
        sig = signals.claims
        escalate = (
            profile.escalate_below_reliability is not None
            and sig.status is SignalStatus.OK
            and sig.reliability is not None
            and sig.reliability < profile.escalate_below_reliability
        ) or (action == "block" and profile.escalate_on_block)
        if escalate:
            reasons.append(Reason(code="escalate", message="routed for human review"))
        unsupported = sig.status is SignalStatus.OK and sig.unsupported > 0
        if unsupported and claims is None:
            reasons.append(
                Reason(
                    code="claims-detail-unavailable",
                    message="per-claim results were not passed to the policy; no rewrite",
                )
            )
        decision = _DECISION[action]
        if decision is Decision.ALLOW:
            return PolicyOutcome(decision, reasons, escalate=escalate)
        if decision is Decision.CAVEAT:
            if unsupported and claims:
                rewritten = remove_unsupported(final.answer, claims)
                return PolicyOutcome(
                    decision, reasons, texts.caveat_removed, rewritten, escalate=escalate
                )
            return PolicyOutcome(decision, reasons, texts.caveat_unverified, escalate=escalate)
        usable = (
            claims is not None
            and sig.status is SignalStatus.OK
            and (
                sig.evidence_scope == "trusted"
                or profile.claims.verified_only_from_untrusted_evidence
            )
        )
        text, verified = verified_only(
            claims if usable and claims is not None else (),
            texts.verified_intro,
            texts.verified_outro,
            texts.refusal,
        )
        reasons.append(
            Reason(
                code="answer-verified-only" if verified else "answer-refused",
                message="only context-verified claims are returned"
                if verified
                else "nothing verifiable: the answer is replaced by a refusal",
            )
        )
        return PolicyOutcome(
            decision,
            reasons,
            texts.verified_only_caveat if verified else None,
            text,
            escalate=escalate,
        )
