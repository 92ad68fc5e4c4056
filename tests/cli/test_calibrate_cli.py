"""``guardrail calibrate policy``: which rows and which answers a certificate is fitted on."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.cli.certify import _eligible, _select
from sidecar.cli.main import build_parser
from sidecar.exceptions import ConfigError
from sidecar.lab.report.evaluate import Replayed
from sidecar.policy.config import parse_policy

POLICY = """
schema_version: 1
name: t
default_profile: p
profiles:
  p:
    max_hallucination_rate: 0.3
    retrieval: {when_no_trusted_chunk: caveat, when_missing: allow}
    lookback: {caveat_below: 0.0, when_missing: allow}
    claims: {when_missing: allow}
    confidence: {block_below: 0.1, caveat_below: 0.1}
"""


def row(qid: int, collection: str = "nq-open") -> dict[str, Any]:
    return {
        "qid": qid,
        "correct": qid % 2 == 0,
        "retrieval": {"tenant": "default", "collection": collection, "retriever": "r"},
    }


def replayed(qid: int, confidence: float | None, m1: bool = True) -> Replayed:
    verdict = {
        "confidence": confidence,
        "signals": {
            "retrieval": {"status": "ok", "m1": m1, "trusted_chunk_ids": ["c"] if m1 else []},
            "lookback": {"status": "not-configured"},
            "claims": {"status": "not-configured"},
        },
    }
    return Replayed(row(qid), verdict, [])


def test_rows_of_one_key_or_the_chosen_key() -> None:
    rows = [row(1), row(2)]
    assert _select(rows, None) == ("default/nq-open/r", rows)
    mixed = [*rows, row(3, "docs")]
    with pytest.raises(ConfigError, match=r"several calibration keys.*--key"):
        _select(mixed, None)
    key, chosen = _select(mixed, "default/docs/r")
    assert (key, [r["qid"] for r in chosen]) == ("default/docs/r", [3])
    with pytest.raises(ConfigError, match="no rows for key"):
        _select(mixed, "default/none/r")
    with pytest.raises(ConfigError, match="tenant/collection/retriever"):
        _select(mixed, "nq-open")


def test_eligible_answers_are_those_the_profiles_other_rules_allow() -> None:
    profile = parse_policy(POLICY).profiles["p"]
    rows = [
        replayed(1, 0.8),
        replayed(2, 0.05),  # blocked by confidence.block_below: never allowed
        replayed(3, 0.9, m1=False),  # no trusted chunk: caveat, never allowed
        replayed(4, None),  # no confidence: cannot be certified
        replayed(5, 0.4),
    ]
    qids, conf, correct = _eligible(rows, profile)
    assert (qids, conf, correct) == ([1, 5], [0.8, 0.4], [0, 0])
    all_qids, _, _ = _eligible(rows, None)  # without a profile: every answer with a confidence
    assert all_qids == [1, 2, 3, 5]
    with pytest.raises(ConfigError, match="no row is eligible"):
        _eligible([replayed(4, None)], profile)


def test_answers_the_judge_did_not_fully_label_are_left_out_and_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Served, a certificate fitted with the judge does not apply to an answer whose claims
    the judge was due to label and did not (``signals.claims.unjudged``): the fit leaves
    such answers out too, and says how many."""
    rows = [replayed(1, 0.8), replayed(2, 0.7), replayed(3, 0.6)]
    rows[1].verdict["signals"]["claims"] = {"status": "ok", "n": 2, "unjudged": 1}
    rows[2].verdict["signals"]["claims"] = {"status": "ok", "n": 2, "unjudged": 0}
    qids, _, _ = _eligible(rows, None)
    assert qids == [1, 3]
    assert "left out 1 answer(s) whose claims the LLM judge did not all label" in (
        capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match="no row is eligible"):
        _eligible([rows[1]], None)


def test_the_command_is_registered_with_its_options() -> None:
    args = build_parser().parse_args(
        ["calibrate", "policy", "--rows", "r", "--risk", "0.2", "--out", "c.json"]
    )
    assert (args.risk, args.delta, args.key, args.profile) == (0.2, 0.1, None, None)
