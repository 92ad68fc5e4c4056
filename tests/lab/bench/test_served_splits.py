"""``bench/served_splits.py``: the served check (rule tier included) against the network alone."""

from __future__ import annotations

from bench.served_splits import served_report
from sidecar.claims.verifier import OnnxVerifier
from sidecar.lab.verifier.sources import Pair
from tests.claims.conftest import REPO

EVIDENCE = "Paris is the capital of France. The city is divided into 20 arrondissements."


def test_the_rule_tier_caps_wrong_figures_the_network_lets_through() -> None:
    verifier = OnnxVerifier.load(REPO / "models" / "verifier", threads=1)
    claims = [
        ("Paris is the capital of France.", 1),
        ("Paris is divided into 20 arrondissements.", 1),
        ("Paris is divided into 21 arrondissements.", 0),
        ("Paris is divided into 25 arrondissements.", 0),
    ]
    pairs = [Pair(c, EVIDENCE, y, "t", "t", str(k)) for k, (c, y) in enumerate(claims)]
    report = served_report(verifier, pairs)
    assert report["n"] == 4 and report["rule_capped"] == 2
    assert report["threshold"] == verifier.band.supported_from
    # the shipped network reads "21" and "25" as supported; the rule tier does not
    assert report["network"]["precision"] == 0.5 and report["network"]["recall"] == 1.0
    assert report["served"]["precision"] == 1.0 and report["served"]["recall"] == 1.0
    assert report["served"]["accuracy"] == 1.0 > report["network"]["accuracy"]
