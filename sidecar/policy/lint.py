"""What a valid policy says that cannot do what it reads as (``guardrail policy check``).

A rule whose action was set but whose condition can never hold (an action for a
trusted fraction below 0), or whose condition holds for nearly every answer (a
probability below 1), is valid YAML and a likely mistake. Each note names the
field by its path, as the validation errors do. Rules at their declared "off"
defaults (``confidence.block_below: 0``) are not noted: they are off on purpose.
"""

from __future__ import annotations

from collections.abc import Collection

from sidecar.policy.config import (
    SEVERITY,
    Action,
    ClaimsRules,
    ConfidenceRules,
    LookbackRules,
    PolicyConfig,
    Profile,
    RetrievalRules,
)

__all__ = ["OFF_SWITCHES", "constant_decisions", "inert_rules", "literal_patterns"]

OFF_SWITCHES = {
    "retrieval": "GUARDRAIL_SIGNALS__RETRIEVAL",
    "lookback": "GUARDRAIL_SIGNALS__LOOKBACK",
    "claims": "GUARDRAIL_SIGNALS__CLAIMS",
    "confidence": "GUARDRAIL_SIGNALS__CONFIDENCE",
}
"""The signals a sidecar can serve with off, and the setting that turns each on."""


def _thresholds(where: str, rules: LookbackRules | ConfidenceRules, what: str) -> list[str]:
    if rules.block_below >= 1.0:
        return [f"{where}.block_below is 1: every answer with a {what} below 1 is blocked"]
    if rules.caveat_below >= 1.0 and "caveat_below" in rules.model_fields_set:
        return [f"{where}.caveat_below is 1: every answer with a {what} below 1 is caveated"]
    return []


def inert_rules(name: str, profile: Profile) -> list[str]:
    """Notes on ``profile``'s rules that never fire or fire on (nearly) every answer."""
    where = f"profiles.{name}"
    notes: list[str] = []
    retrieval = profile.retrieval
    if (
        retrieval.min_trusted_fraction == 0.0
        and "when_low_trusted_fraction" in retrieval.model_fields_set
        and retrieval.when_low_trusted_fraction != "allow"
    ):
        notes.append(
            f"{where}.retrieval.when_low_trusted_fraction never applies: min_trusted_fraction "
            "is 0 (no fraction is below it); set min_trusted_fraction"
        )
    notes += _thresholds(f"{where}.lookback", profile.lookback, "p(factual)")
    notes += _thresholds(f"{where}.confidence", profile.confidence, "confidence")
    if profile.escalate_below_reliability == 0.0:
        notes.append(
            f"{where}.escalate_below_reliability is 0: no answer is ever escalated "
            "(reliability is never below 0)"
        )
    if (
        profile.max_hallucination_rate >= 1.0
        and "max_hallucination_rate" in profile.model_fields_set
    ):
        notes.append(
            f"{where}.max_hallucination_rate is 1: the hallucination-rate block never fires "
            "(a rate is never above 1)"
        )
    claims = profile.claims
    if (
        set(claims.reliability_actions.values()) == {"allow"}
        and not claims.caveat_on_any_unsupported
        and profile.max_hallucination_rate >= 1.0
        and not profile.strict
    ):
        notes.append(
            f"{where}.claims: every reliability level allows and no unsupported claim caveats "
            "or blocks: verified claims never change a decision"
        )
    return notes


def _when_off(profile: Profile, signal: str) -> Action | None:
    """The action every answer gets from ``signal`` being off (``None``: none; a
    confidence rule whose thresholds are both 0 is not used, so not missed)."""
    if signal == "confidence":
        rules = profile.confidence
        return None if rules.block_below == rules.caveat_below == 0.0 else rules.when_missing
    section: RetrievalRules | LookbackRules | ClaimsRules = getattr(profile, signal)
    return section.when_missing


def constant_decisions(config: PolicyConfig, off: Collection[str]) -> list[str]:
    """Profiles that decide (the default, or mapped from a tenant or collection) and that,
    with the signals ``off`` not served, can never allow an answer: a missing signal is a
    finding with the profile's ``when_missing`` action, on every answer."""
    used = {config.default_profile, *config.tenants.values(), *config.collections.values()}
    notes = []
    for name, profile in config.profiles.items():
        if name not in used:
            continue
        floor: list[tuple[Action, str]] = []
        for signal in OFF_SWITCHES:
            action = _when_off(profile, signal) if signal in off else None
            if action is not None and action != "allow":
                floor.append((action, signal))
        if not floor:
            continue
        worst = max(SEVERITY[a] for a, _ in floor)
        because = ", ".join(
            f"{OFF_SWITCHES[s]}=false and profiles.{name}.{s}.when_missing is {a}"
            for a, s in floor
            if SEVERITY[a] == worst
        )
        outcome = "is blocked" if worst == SEVERITY["block"] else "gets at least a caveat"
        notes.append(
            f"profile {name}: every answer {outcome}, none is ever allowed ({because}); "
            "turn the signal on or set its when_missing to allow"
        )
    return notes


def literal_patterns(config: PolicyConfig) -> list[str]:
    """Tenant and collection keys that read as patterns (``acme-*``): a key matches one
    tenant or collection exactly, so such a key maps only a name spelt with the ``*``."""
    return [
        f"{section}.{key!r} is matched literally: keys are exact names, no wildcards, so "
        f"no other {section[:-1]} gets profile {profile} from it; list each name"
        for section, mapping in (("tenants", config.tenants), ("collections", config.collections))
        for key, profile in mapping.items()
        if any(c in key for c in "*?[")
    ]
