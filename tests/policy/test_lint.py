"""``policy check`` notes rules that are valid but cannot do what they read as."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli.main import main
from sidecar.policy.config import load_policy, parse_policy
from sidecar.policy.lint import constant_decisions, inert_rules

REPO = Path(__file__).resolve().parents[2]

INERT = """
name: t
default_profile: gen
profiles:
  gen:
    max_hallucination_rate: 1
    escalate_below_reliability: 0
    retrieval: {when_low_trusted_fraction: block}
    confidence: {block_below: 1.0, caveat_below: 1.0}
    claims: {reliability_actions: {HIGH: allow, MEDIUM: allow, LOW: allow}}
"""


def test_every_inert_or_all_firing_rule_is_named_by_its_path() -> None:
    config = parse_policy(INERT)
    notes = inert_rules("gen", config.profiles["gen"])
    assert [n.split(" ", 1)[0] for n in notes] == [
        "profiles.gen.retrieval.when_low_trusted_fraction",
        "profiles.gen.confidence.block_below",
        "profiles.gen.escalate_below_reliability",
        "profiles.gen.max_hallucination_rate",
        "profiles.gen.claims:",
    ]


@pytest.mark.parametrize(
    "profile",
    [
        "{max_hallucination_rate: 0.2}",  # every rule at its default: off on purpose
        "{max_hallucination_rate: 0.2, retrieval: {min_trusted_fraction: 0.5, "
        "when_low_trusted_fraction: block}}",
        "{max_hallucination_rate: 0.2, confidence: {block_below: 0.2, caveat_below: 0.99}}",
        "{max_hallucination_rate: 0.2, escalate_below_reliability: 0.65}",
    ],
)
def test_rules_that_can_fire_and_defaults_are_not_noted(profile: str) -> None:
    config = parse_policy(f"name: t\ndefault_profile: p\nprofiles:\n  p: {profile}\n")
    assert inert_rules("p", config.profiles["p"]) == []


def test_the_shipped_policy_has_no_inert_rule() -> None:
    config = load_policy(REPO / "models" / "policy" / "default.yaml")
    assert {name: inert_rules(name, p) for name, p in config.profiles.items()} == {
        name: [] for name in config.profiles
    }


def test_policy_check_prints_the_notes(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(INERT)
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "policy", "check", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "note: profiles.gen.escalate_below_reliability is 0: no answer is ever escalated" in (
        out.stdout
    )


def test_a_profile_that_the_served_signals_never_let_allow_is_named() -> None:
    """With the shipped settings claim checks are off, and the shipped default profile
    (enterprise) says ``claims.when_missing: caveat``: no answer it decides is ever
    allowed. ``run`` and ``run --check`` said nothing of it."""
    config = load_policy(REPO / "models" / "policy" / "default.yaml")
    assert constant_decisions(config, []) == []
    (note,) = constant_decisions(config, ["claims"])
    assert note.startswith("profile enterprise: every answer gets at least a caveat")
    assert "GUARDRAIL_SIGNALS__CLAIMS=false" in note
    assert "profiles.enterprise.claims.when_missing is caveat" in note


def test_a_mapped_profile_that_blocks_every_answer_is_named_and_unused_ones_are_not() -> None:
    config = parse_policy(
        "name: t\ndefault_profile: open\ntenants: {clinic: med}\nprofiles:\n"
        "  open: {max_hallucination_rate: 0.3, claims: {when_missing: allow},"
        " retrieval: {when_missing: allow}}\n"
        "  med: {max_hallucination_rate: 0.05, claims: {when_missing: block},"
        " lookback: {when_missing: caveat}}\n"
        "  spare: {max_hallucination_rate: 0.05, claims: {when_missing: block}}\n"
    )
    notes = constant_decisions(config, ["claims", "lookback", "retrieval", "confidence"])
    assert [n.split(":", 1)[0] for n in notes] == ["profile med"]
    assert "every answer is blocked" in notes[0]
    assert "claims.when_missing is block" in notes[0]
    assert "lookback" not in notes[0]  # the most severe reason is the one said


def test_run_check_warns_of_a_profile_that_never_allows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="sidecar"):
        assert main(["run", "--check"]) == 0
    assert "profile enterprise: every answer gets at least a caveat" in caplog.text
