"""Certified allow in the policy: load each profile's certificate, check it, decide with it.

A profile with ``allow: {certified: FILE}`` allows an answer only when its
calibrated confidence is at or above the certificate's threshold
(:mod:`sidecar.confidence.certify_allow`); the verdict then carries the
certificate's risk and delta. Checked once, at load, with a ``ConfigError``
saying what is wrong:

* the file is a certificate that certifies something (else: the smallest
  certifiable risk, and the command to refit);
* its calibration key is one this profile serves (tenant / collection routing);
* the confidence model it was fitted on is the one being served;
* when it was fitted for a profile, it is this profile and its other rules are
  unchanged (their sha256).

A profile may list several certificates, one per set of served signals (claims
off and claims on); every one is checked as above, and the first that applies
to the served signals is used. A certificate fitted with other signals than the
served ones (claims on vs off: the confidence depends on them), with another
claim verifier, or with the confidence off, loads but does not apply: a warning
at load, and every answer of its profile gets reason
``certificate-not-applicable`` with the ``below`` action, so the default policy
still starts with any switch set.

While serving, a request of another calibration key than the certificate's is
not certified (reason ``certificate-key-mismatch``, the profile's ``below``
action), and a certificate the online re-test found broken
(:class:`~sidecar.confidence.certify_allow.CertificateTracker`) withdraws the
allow for its key (reason ``certificate-violated``). A certificate fitted with an LLM
judge's labels does not apply to an answer whose claims the judge was due to label and
did not (``ClaimsSignal.unjudged``: its breaker open, a failed or late call): the labels,
hence the confidence, are not those it was fitted on (reason
``certificate-not-applicable``). Pure logic after loading.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sidecar.confidence.certificate_check import CertificateTracker
from sidecar.confidence.certify_allow import AllowCertificate, load_certificate
from sidecar.conformal.mondrian import key_label, split_label
from sidecar.contracts.events import Reason, RetrievalEvent
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.policy.config import Action, AllowRules, PolicyConfig, Profile
from sidecar.policy.findings import below

__all__ = [
    "Certified",
    "CertifiedAllow",
    "certificate_fingerprint",
    "load_certificates",
    "request_key",
]

log = logging.getLogger(__name__)


SIGNAL_MODELS = ("certifier", "lookback", "verifier", "confidence")
"""Signal components named in a verdict's ``model_versions`` (the generator is not one)."""


def certificate_fingerprint(certificate: AllowCertificate) -> str:
    """What names a certificate in the fleet's withdrawals: sha256 of its JSON, 16 hex digits
    (every replica serving the same file computes the same)."""
    return hashlib.sha256(certificate.model_dump_json().encode("utf-8")).hexdigest()[:16]


def request_key(retrieval: RetrievalEvent) -> str:
    """The calibration key of a request: ``tenant/collection/retriever`` (escaped parts)."""
    return key_label(retrieval.tenant, retrieval.collection, retrieval.retriever)


@dataclass(frozen=True, slots=True)
class Certified:
    """What the certified-allow rule concluded for one answer."""

    action: Action
    reason: Reason
    in_force: bool  # the decision was taken under the certificate (its risk goes in the verdict)


@dataclass(frozen=True, slots=True)
class CertifiedAllow:
    """One profile's certificate and its rules."""

    profile: str
    rules: AllowRules
    certificate: AllowCertificate
    path: Path
    inactive: str | None = None  # why the certificate does not apply to the served signals
    listed: tuple[CertifiedAllow, ...] = ()  # every certificate the profile lists, in order

    @property
    def signals(self) -> list[str]:
        """The signal components the certificate was fitted with."""
        return sorted(set(self.certificate.model_versions) & set(SIGNAL_MODELS))

    @property
    def fitted_with_judge(self) -> bool:
        """Whether the certificate's claim labels came through an LLM judge."""
        verifier = self.certificate.model_versions.get("verifier") or ""
        return "judge" in verifier.split("+")

    @property
    def threshold(self) -> float:
        if self.certificate.threshold is None:  # refused at load; keeps mypy honest
            raise ConfigError(f"{self.path} certifies nothing")
        return self.certificate.threshold

    def decide(
        self,
        retrieval: RetrievalEvent,
        confidence: float | None,
        tracker: CertificateTracker,
        *,
        unjudged: int = 0,
    ) -> Certified:
        """``unjudged``: the answer's claims the LLM judge was due to label and did not
        (``ClaimsSignal.unjudged``)."""
        cert = self.certificate
        terms = f"risk {cert.risk:g}, delta {cert.delta:g}"
        withheld = self._withheld(request_key(retrieval), tracker, unjudged)
        if withheld is not None:
            return withheld
        if confidence is None:
            return Certified(
                self.rules.below,
                _reason(
                    "certificate-no-confidence",
                    "no calibrated confidence for this answer: it cannot be certified",
                ),
                in_force=True,
            )
        if confidence < self.threshold:
            return Certified(
                self.rules.below,
                _reason(
                    "confidence-below-certified",
                    f"calibrated p(correct) = {below(confidence, self.threshold)} "
                    f"(certified threshold; {terms})",
                ),
                in_force=True,
            )
        return Certified(
            "allow",
            _reason(
                "certified-allow",
                f"calibrated p(correct) = {confidence:.2f} >= {self.threshold:g}: among answers "
                f"allowed at this threshold at most {cert.risk:g} are wrong, with probability "
                f">= {1 - cert.delta:g} (n = {cert.n})",
            ),
            in_force=True,
        )

    def _withheld(self, key: str, tracker: CertificateTracker, unjudged: int) -> Certified | None:
        """The certificate not in force for this answer, and why; None: it decides."""
        cert = self.certificate
        if self.inactive is not None:
            why = f"does not apply: {self.inactive}"
        elif key != cert.key:
            return Certified(
                self.rules.below,
                _reason(
                    "certificate-key-mismatch",
                    f"the certificate of profile {self.profile} is for {cert.key}, this request "
                    f"is {key}: no certified allow",
                ),
                in_force=False,
            )
        elif tracker.violated(key):
            return Certified(
                self.rules.when_violated,
                _reason("certificate-violated", _violation(tracker, key, cert.risk)),
                in_force=False,
            )
        elif unjudged and self.fitted_with_judge:
            why = (
                f"was fitted with the LLM judge's labels, and the judge did not label "
                f"{unjudged} of this answer's claims (its breaker open, its pool saturated, "
                "the call failed or came too late): no certified allow"
            )
        else:
            return None
        return Certified(
            self.rules.below,
            _reason(
                "certificate-not-applicable", f"the certificate of profile {self.profile} {why}"
            ),
            in_force=False,
        )


def _violation(tracker: CertificateTracker, key: str, risk: float) -> str:
    fleet = tracker.withdrawn(key)
    if fleet is not None:
        by = f" by {fleet.instance}" if fleet.instance else ""
        return (
            f"withdrawn for the fleet{by} at {fleet.withdrawn_at:%Y-%m-%dT%H:%M:%SZ}: re-tested "
            f"on {fleet.labelled} labelled allowed answers, the error among allowed "
            f"({fleet.errors}/{fleet.labelled}) is significantly above the certified {risk:g}: "
            f"recalibrate (guardrail calibrate policy), or reinstate "
            f"(guardrail certificates reinstate {key})"
        )
    check = tracker.check(key)
    return (
        f"re-tested on {check.labelled} labelled allowed answers, the error among "
        f"allowed ({check.errors}/{check.labelled}) is significantly above the "
        f"certified {risk:g}: recalibrate (guardrail calibrate policy)"
    )


def _reason(code: str, message: str) -> Reason:
    return Reason(code=code, message=message, signal="confidence")


def _check(
    entry: CertifiedAllow, config: PolicyConfig, profile: Profile, models: Mapping[str, str] | None
) -> str | None:
    """Raise ``ConfigError`` for a certificate that must not load; return why it does not
    apply to the served signals (it loads, but certifies nothing here), else None."""
    cert, path, name = entry.certificate, entry.path, entry.profile
    where = f"profiles.{name}.allow.certified ({path})"
    if not cert.certified or cert.threshold is None:
        smallest = cert.smallest_certifiable_risk
        hint = (
            f"the smallest certifiable risk is {smallest:g}: refit with --risk {smallest:g} or "
            "collect more labels"
            if smallest is not None
            else "no risk below 1 is certifiable with these labels"
        )
        raise ConfigError(
            f"{where}: certifies nothing at risk {cert.risk:g} with {cert.n} labels; {hint}"
        )
    parts = split_label(cert.key)
    if parts is None:
        raise ConfigError(f"{where}: key must be tenant/collection/retriever, got {cert.key!r}")
    served, _ = config.profile_for(parts[0], parts[1])
    if served != name:
        raise ConfigError(
            f"{where}: the certificate is for {cert.key}, which this policy routes to profile "
            f"{served!r}, not {name!r}; map its tenant or collection to {name!r}"
        )
    if cert.scope is not None:
        if cert.scope.profile != name:
            raise ConfigError(
                f"{where}: fitted for the rules of profile {cert.scope.profile!r}, used by {name!r}"
            )
        if cert.scope.rules_sha256 != profile.rules_sha256():
            raise ConfigError(
                f"{where}: the profile's rules changed since the certificate was fitted "
                "(rules sha256 differs); refit it with guardrail calibrate policy"
            )
    if models is None:
        return None
    return _served_mismatch(entry, models, where)


def _served_mismatch(entry: CertifiedAllow, models: Mapping[str, str], where: str) -> str | None:
    """Against the served models: raise for another confidence model; say why the
    certificate does not apply to the served signals, conformal calibration, lookback
    model or claim verifier, else None."""
    cert = entry.certificate
    served_model = models.get("confidence")
    if served_model is None:
        return (
            "a certified allow needs the calibrated confidence, which is off "
            "(GUARDRAIL_SIGNALS__CONFIDENCE=false)"
        )
    if served_model != cert.confidence_model:
        raise ConfigError(
            f"{where}: fitted on confidence model {cert.confidence_model}, the sidecar "
            f"serves {served_model}; refit it with guardrail calibrate policy"
        )
    served_signals = models.get("signals")
    if served_signals is not None:
        fitted = entry.signals
        enabled = sorted(s for s in served_signals.split(",") if s)
        if fitted != enabled:
            return (
                f"fitted with the signals {', '.join(fitted) or 'none'}, the sidecar serves "
                f"{', '.join(enabled) or 'none'} (the confidence depends on them)"
            )
    for name, what in (("certifier", "conformal calibration"), ("lookback", "lookback model")):
        fitted_model, served_as = cert.model_versions.get(name), models.get(name)
        if fitted_model is not None and served_as is not None and fitted_model != served_as:
            return (
                f"fitted with {what} {fitted_model}, the sidecar serves {served_as} "
                "(the confidence depends on its scores)"
            )
    fitted_verifier = cert.model_versions.get("verifier")
    served_verifier = models.get("verifier")
    if fitted_verifier is not None and served_verifier is not None:
        # "+rules" / "+judge" say how it was served (the judge: compared below); "+p0.9":
        # another band than its own
        fitted_as = "+".join(p for p in fitted_verifier.split("+") if p not in ("rules", "judge"))
        if fitted_as != served_verifier:
            return (
                f"fitted with claim verifier {fitted_as}, the sidecar serves {served_verifier} "
                "(the confidence depends on its labels)"
            )
        fitted_judge = entry.fitted_with_judge
        if fitted_judge != ("judge" in models):
            return (
                f"fitted {'with' if fitted_judge else 'without'} an LLM judge, the sidecar "
                f"{'serves none' if fitted_judge else 'serves one'} (the judge relabels the "
                "uncertain claims, and the confidence depends on the labels); fit one with the "
                "judge's settings as served"
            )
    return None


def _resolve(certified: str, base_dirs: Sequence[Path]) -> Path | None:
    """The certificate's path; None: relative, and the policy was not read from a file."""
    path = Path(certified)
    if path.is_absolute():
        return path
    if not base_dirs:
        return None
    for base in base_dirs:
        if (base / path).is_file():
            return base / path
    return base_dirs[0] / path  # missing: load_certificate says so, naming the first place


def load_certificates(
    config: PolicyConfig,
    base_dirs: Sequence[Path] = (),
    models: Mapping[str, str] | None = None,
) -> dict[str, CertifiedAllow]:
    """Every profile's certificate, checked; ``models``: the served versions (None: unchecked).

    A relative certificate path is looked up in ``base_dirs`` in order (the policy
    file's folder first, then the models' ``policy/`` folder: a policy mounted from
    a ConfigMap still finds the shipped certificates). Without any (a policy built
    in code, not read from a file) the profile has no certified allow and its
    answers get the ``below`` action (reason ``certificate-not-applicable``).

    A profile that lists several certificates (one per set of served signals)
    gets the first that applies to ``models``; every one of them is loaded and
    checked. When none applies, the first is kept, inactive, with each one's reason.
    """
    out: dict[str, CertifiedAllow] = {}
    keys: dict[str, str] = {}
    for name, profile in config.profiles.items():
        rules = profile.allow
        if rules is None:
            continue
        entries = []
        for certified in rules.certified:
            path = _resolve(certified, base_dirs)
            if path is None:
                log.warning(
                    "profiles.%s.allow.certified (%s) is relative and the policy was not read "
                    "from a file: the certified allow is off",
                    name,
                    certified,
                )
                break
            try:
                certificate = load_certificate(path)
            except ArtifactError as exc:
                raise ConfigError(f"profiles.{name}.allow.certified: {exc}") from None
            entry = CertifiedAllow(name, rules, certificate, path)
            inactive = _check(entry, config, profile, models)
            if inactive is not None:
                entry = CertifiedAllow(name, rules, certificate, path, inactive=inactive)
            if keys.get(certificate.key, name) != name:
                raise ConfigError(
                    f"profiles {keys[certificate.key]!r} and {name!r} both certify "
                    f"{certificate.key}; one key has one profile's certificates"
                )
            keys[certificate.key] = name
            entries.append(entry)
        else:
            out[name] = _pick(entries)
    return out


def _pick(entries: Sequence[CertifiedAllow]) -> CertifiedAllow:
    """The first certificate that applies; else the first, inactive, saying why none does."""
    listed = tuple(entries)
    for entry in entries:
        if entry.inactive is None:
            return replace(entry, listed=listed)
    first = entries[0]
    why = "; ".join(
        f"{e.path.name}: {e.inactive}" if len(entries) > 1 else str(e.inactive) for e in entries
    )
    log.warning(
        "profiles.%s.allow.certified (%s) does not apply: %s",
        first.profile,
        ", ".join(str(e.path) for e in entries),
        why,
    )
    return replace(first, inactive=why, listed=listed)
