"""What a valid policy says that cannot do what it reads as (``guardrail policy check``).

A rule whose action was set but whose condition can never hold (an action for a
trusted fraction below 0), or whose condition holds for nearly every answer (a
probability below 1), is valid YAML and a likely mistake. Each note names the
field by its path, as the validation errors do. Rules at their declared "off"
defaults (``confidence.block_below: 0``) are not noted: they are off on purpose.
"""

from __future__ import annotations

from sidecar.policy.config import ConfidenceRules, LookbackRules, Profile

__all__ = ["inert_rules"]


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
