"""The policy engine: an answer's findings -> the decision, its texts and any rewrite.

The decision is the most severe action of the findings
(:mod:`sidecar.policy.findings`; allow < caveat < block). Outcome texts
(docs/methods.md §Claim verification):

* **caveat**: the caveat text, and when unsupported claims are known the
  answer rewritten without them (:func:`~sidecar.policy.rewrite.remove_unsupported`);
* **block**: the verified-facts-only answer, or the refusal when nothing is
  verified (:func:`~sidecar.policy.rewrite.verified_only`);
* ``escalate`` (routed to a human) when reliability is below the profile's
  ``escalate_below_reliability`` or, if configured, on every block.

Certified allow (``allow: {certified: FILE}`` in a profile;
:mod:`sidecar.policy.certified`): an answer is allowed only when its calibrated
confidence reaches the threshold a certificate from ``guardrail calibrate
policy`` certified; the outcome then carries the certificate's risk and delta.
Below the threshold, for another calibration key, or while the online re-test
finds the certificate broken (``certificate-violated``), the profile's action
applies instead.

Per-claim results (texts, labels, spans) come in through ``decide(...,
claims=...)``; without them a rewrite is impossible and the outcome says so
(``claims-detail-unavailable``). Strict mode (a strict profile refuses an
answer with an unsupported claim): :meth:`PolicyEngine.check_stream` blocks as
soon as a streamed claim is unsupported under a strict profile. Pure logic: no I/O.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sidecar.confidence.certificate_check import CertificateTracker
from sidecar.contracts.events import (
    ClaimLabel,
    Decision,
    GenerationFinal,
    Reason,
    RetrievalEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.contracts.reasons import PROFILE_REASON_PREFIX
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome
from sidecar.policy.certified import CertifiedAllow, certificate_fingerprint, load_certificates
from sidecar.policy.config import (
    SEVERITY,
    Action,
    PolicyConfig,
    PolicyTexts,
    Profile,
    parse_policy,
    read_policy_text,
)
from sidecar.policy.findings import Finding, evaluate_signals, finding
from sidecar.policy.rewrite import remove_unsupported, verified_only

__all__ = ["PolicyEngine", "PolicySource", "strict_outcome"]

_DECISION = {"allow": Decision.ALLOW, "caveat": Decision.CAVEAT, "block": Decision.BLOCK}
_OK = SignalStatus.OK  # one global read: a member read through its enum class is ~0.09 us
# reasons are frozen: the constant ones are built once
_CHECKS_PASSED = Reason(code="checks-passed", message="every signal passed")
_ESCALATE = Reason(code="escalate", message="routed for human review")
_VERIFIED_ONLY = Reason(
    code="answer-verified-only", message="only context-verified claims are returned"
)
_REFUSED = Reason(
    code="answer-refused", message="nothing verifiable: the answer is replaced by a refusal"
)


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


@dataclass(frozen=True, slots=True)
class PolicySource:
    """The file a policy was read from and the sha256 of the text that was read (what
    :class:`~sidecar.policy.watch.PolicyFileWatch` compares the file on disk with)."""

    path: Path
    sha256: str
    certificates: tuple[Path, ...] = ()  # the certificate files it lists, as resolved


@functools.cache
def _profile_reason(name: str) -> Reason:
    """``profile.<name>``: one frozen reason per profile, built once."""
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
        self.source: PolicySource | None = None  # set by from_file

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
        text = read_policy_text(path)
        engine = cls(
            parse_policy(text, str(path)), base_dir=path.parent, models=models, search=search
        )
        listed = (e for entry in engine.certified.values() for e in entry.listed or (entry,))
        engine.source = PolicySource(
            path,
            hashlib.sha256(text.encode("utf-8")).hexdigest(),
            tuple(dict.fromkeys(e.path for e in listed)),
        )
        return engine

    def attach_certificates(self, tracker: CertificateTracker) -> None:
        """Re-test the certificates with ``tracker`` (the coverage monitor's, fed by feedback)."""
        for entry in self.certified.values():
            cert = entry.certificate  # the one in force (of those its profile lists)
            tracker.register(cert.key, cert.risk, cert.delta, certificate_fingerprint(cert))
        self.certificates = tracker

    @property
    def name(self) -> str:
        return f"{self.config.name}/{self.config.version}"

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.config.profiles))

    @functools.cached_property
    def fingerprint(self) -> str:
        """``name@<12 hex>`` of the parsed rules and every listed certificate: replicas on two
        policy files that both say ``version: 1`` decided differently, and their verdicts
        could not tell which file decided them."""
        digest = hashlib.sha256(self.config.model_dump_json().encode("utf-8"))
        for profile in sorted(self.certified):
            entry = self.certified[profile]
            for listed in entry.listed or (entry,):
                digest.update(certificate_fingerprint(listed.certificate).encode("utf-8"))
        return f"{self.name}@{digest.hexdigest()[:12]}"

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
        confidence_status: SignalStatus = SignalStatus.NOT_CONFIGURED,
    ) -> PolicyOutcome:
        name, profile = self.profile(retrieval)
        findings = evaluate_signals(signals, profile, confidence, confidence_status)
        entry = self.certified.get(name)
        certified = None
        if entry is not None:
            certified = entry.decide(
                retrieval, confidence, self.certificates, unjudged=signals.claims.unjudged
            )
            findings.append(Finding(certified.action, certified.reason))
        elif profile.allow is not None:  # never an uncertified allow under a certified profile
            findings.append(
                finding(
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
        if certified is None or not certified.in_force or entry is None:
            return outcome
        if outcome.decision.value != certified.action:
            # another finding decided (claims blocked an answer the certificate would allow):
            # the verdict was not taken under the certificate and must not read as if it was
            overruled = f"; overruled: the answer is {outcome.decision.value}ed for another reason"
            reasons = [
                r.model_copy(update={"message": r.message + overruled})
                if r.code == certified.reason.code
                else r
                for r in outcome.reasons
            ]
            return replace(outcome, reasons=reasons)
        cert = entry.certificate
        return replace(
            outcome, certified_risk=cert.risk, certified_delta=cert.delta, certificate=cert.key
        )

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
        severity = 0  # SEVERITY["allow"]
        reasons = [_profile_reason(name)]
        for found in findings:  # one pass: the most severe action, and every reason in order
            reasons.append(found.reason)
            if SEVERITY[found.action] > severity:
                action = found.action
                severity = SEVERITY[action]
        if len(reasons) == 1:
            reasons.append(_CHECKS_PASSED)
        sig = signals.claims
        claims_ok = sig.status is _OK
        escalate = (
            profile.escalate_below_reliability is not None
            and claims_ok
            and sig.reliability is not None
            and sig.reliability < profile.escalate_below_reliability
        ) or (action == "block" and profile.escalate_on_block)
        if escalate:
            reasons.append(_ESCALATE)
        unsupported = claims_ok and sig.unsupported > 0
        if unsupported and claims is None:
            reasons.append(
                Reason(
                    code="claims-detail-unavailable",
                    message="per-claim results were not passed to the policy; no rewrite",
                )
            )
        decision = _DECISION[action]
        if action == "allow":
            return PolicyOutcome(decision, reasons, escalate=escalate)
        if action == "caveat":
            if unsupported and claims:
                rewritten = remove_unsupported(final.answer, claims)
                return PolicyOutcome(
                    decision, reasons, texts.caveat_removed, rewritten, escalate=escalate
                )
            return PolicyOutcome(decision, reasons, texts.caveat_unverified, escalate=escalate)
        usable = (
            claims is not None
            and claims_ok
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
        reasons.append(_VERIFIED_ONLY if verified else _REFUSED)
        return PolicyOutcome(
            decision,
            reasons,
            texts.verified_only_caveat if verified else None,
            text,
            escalate=escalate,
        )
