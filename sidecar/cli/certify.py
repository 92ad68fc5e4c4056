"""``guardrail calibrate policy``: certify an allow threshold on labelled outcomes.

The outcome rows (``guardrail dataset outcomes``) are replayed through the
sidecar as configured (signals and confidence model from ``GUARDRAIL_*``; the
policy's own certified-allow rules switched off, so a policy that already
names a certificate can be refitted), and Learn then Test
(:mod:`sidecar.confidence.certify_allow`) picks the lowest threshold on the
calibrated confidence whose error among allowed answers is certified at
``--risk`` with probability ``1 - --delta``. With ``--profile`` the certified
set is the answers that profile's other rules would allow (its rules' sha256 is
recorded and checked when the policy loads); without it, all answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.cli.groups import add_progress_arg, get_group, progress_enabled
from sidecar.conformal.mondrian import key_label
from sidecar.exceptions import ConfigError

if TYPE_CHECKING:
    from sidecar.config import Settings
    from sidecar.lab.report.evaluate import Replayed
    from sidecar.policy.config import PolicyConfig, Profile

__all__ = ["register", "run_calibrate_policy"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calibrate policy``."""
    calibrate = get_group(sub, "calibrate", "Calibrate a guardrail signal or decision.")
    p = calibrate.add_parser(
        "policy",
        help="certify an allow threshold on the calibrated confidence (Learn then Test)",
        description=(
            "Replay labelled outcome rows through the sidecar and choose the allow threshold "
            "on the calibrated confidence by fixed-sequence Learn then Test (binomial tail), so "
            "that P(error among allowed <= risk) >= 1 - delta over the calibration draw. "
            "Writes the certificate a policy profile names with allow: {certified: FILE}."
        ),
    )
    p.add_argument("--rows", type=Path, nargs="+", required=True, help="outcome rows (dirs/files)")
    p.add_argument("--risk", type=float, required=True, help="bound on the error among allowed")
    p.add_argument("--delta", type=float, default=0.1, help="failure probability (default 0.1)")
    p.add_argument(
        "--key",
        help="calibration key tenant/collection/retriever (default: the rows' only key)",
    )
    p.add_argument(
        "--profile",
        help="certify the answers this policy profile's other rules allow (default: all answers)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        help="policy file for --profile (default: GUARDRAIL_POLICY__FILE or the shipped one)",
    )
    p.add_argument("--out", type=Path, required=True, help="certificate file to write (JSON)")
    p.add_argument("--json", action="store_true", help="print the certificate as JSON")
    add_progress_arg(p)
    p.set_defaults(func=run_calibrate_policy)


def _row_key(row: dict[str, Any]) -> str:
    r = row["retrieval"]
    return key_label(r["tenant"], r["collection"], r.get("retriever", "default"))


def _select(rows: Sequence[dict[str, Any]], key: str | None) -> tuple[str, list[dict[str, Any]]]:
    keys = sorted({_row_key(r) for r in rows})
    if key is None:
        if len(keys) != 1:
            raise ConfigError(
                f"the rows hold several calibration keys ({', '.join(keys)}); pick one with --key"
            )
        return keys[0], list(rows)
    if key.count("/") != 2:
        raise ConfigError(f"--key must be tenant/collection/retriever, got {key!r}")
    chosen = [r for r in rows if _row_key(r) == key]
    if not chosen:
        raise ConfigError(f"no rows for key {key}; the rows hold {', '.join(keys)}")
    return key, chosen


def _policy_profile(
    args: argparse.Namespace, settings: Settings
) -> tuple[PolicyConfig, Profile | None]:
    """The policy (``--policy``, else the configured or shipped one) and the ``--profile``."""
    from sidecar.policy.config import load_policy  # noqa: PLC0415
    from sidecar.runtime import DEFAULT_POLICY  # noqa: PLC0415

    if args.policy is not None:
        policy_file = args.policy
    elif settings.policy.file:
        policy_file = Path(settings.policy.file)
    else:
        policy_file = Path(settings.models.dir) / DEFAULT_POLICY
    config = load_policy(policy_file)
    if args.profile is None:
        return config, None
    profile = config.profiles.get(args.profile)
    if profile is None:
        raise ConfigError(
            f"--profile {args.profile!r} is not in {policy_file}; "
            f"defined: {', '.join(sorted(config.profiles))}"
        )
    return config, profile


def _eligible(
    replayed: Sequence[Replayed], profile: Profile | None
) -> tuple[list[object], list[float], list[int]]:
    """(qid, confidence, correct) of the answers a certificate could allow.

    Not an answer whose claims the LLM judge was due to label and did not
    (``signals.claims.unjudged``: it failed, was late or paused): a certificate fitted with
    the judge never applies to such an answer when served, so it is left out of the fit
    too (and said on stderr)."""
    from sidecar.contracts.events import Signals  # noqa: PLC0415
    from sidecar.policy.config import SEVERITY  # noqa: PLC0415
    from sidecar.policy.findings import evaluate_signals  # noqa: PLC0415

    qids: list[object] = []
    conf: list[float] = []
    correct: list[int] = []
    unjudged = 0
    for r in replayed:
        p = r.verdict.get("confidence")
        if p is None:
            continue  # never allowed under a certificate: not eligible
        if r.verdict["signals"]["claims"].get("unjudged"):
            unjudged += 1
            continue
        if profile is not None:
            findings = evaluate_signals(Signals.model_validate(r.verdict["signals"]), profile, p)
            if any(SEVERITY[f.action] > SEVERITY["allow"] for f in findings):
                continue
        qids.append(r.row["qid"])
        conf.append(float(p))
        correct.append(int(r.correct))
    if unjudged:
        sys.stderr.write(
            f"left out {unjudged} answer(s) whose claims the LLM judge did not all label "
            "(failed, late or paused calls; served, the certificate does not apply to such "
            "answers either): if the judge failed during this replay, fit again once it answers\n"
        )
    if not conf:
        raise ConfigError(
            "no row is eligible (no confidence, the profile's rules allow none, or the LLM "
            "judge labelled none)"
        )
    return qids, conf, correct


def run_calibrate_policy(args: argparse.Namespace) -> int:
    """``guardrail calibrate policy``."""
    from sidecar.confidence.certify_allow import (  # noqa: PLC0415
        DEFAULT_GRID,
        AllowCertificate,
        ProfileScope,
        certificate_data_hash,
        learn_then_test,
        smallest_certifiable_risk,
    )
    from sidecar.config import Settings  # noqa: PLC0415
    from sidecar.lab.report.collect import load_rows  # noqa: PLC0415
    from sidecar.lab.report.evaluate import replay_rows  # noqa: PLC0415
    from sidecar.pipeline.processor import Processor  # noqa: PLC0415
    from sidecar.policy.engine import PolicyEngine  # noqa: PLC0415
    from sidecar.runtime import build_signals  # noqa: PLC0415

    for name in ("risk", "delta"):
        value = getattr(args, name)
        if not 0.0 < value < 1.0:
            raise ConfigError(f"--{name} must be in (0, 1), got {value}")
    settings = Settings.load()
    config, profile = _policy_profile(args, settings)
    # replay with the certified-allow rules off: the certificate being fitted may not exist yet
    plain = config.model_copy(
        update={
            "profiles": {
                n: p.model_copy(update={"allow": None}) for n, p in config.profiles.items()
            }
        }
    )
    rows = [r for path in args.rows for r in load_rows(path)]
    if not rows:
        raise ConfigError("no outcome rows to calibrate on")
    key, rows = _select(rows, args.key)
    signals = build_signals(settings)
    replayed = replay_rows(
        rows,
        lambda: Processor(settings, PolicyEngine(plain), signals=signals),
        progress=progress_enabled(args),
    )
    versions = dict(replayed[0].verdict.get("model_versions") or {})
    confidence_model = versions.get("confidence")
    if confidence_model is None:
        raise ConfigError(
            "the replayed verdicts carry no confidence: a certified allow needs the calibrated "
            "confidence (GUARDRAIL_SIGNALS__CONFIDENCE=true)"
        )
    qids, conf, correct = _eligible(replayed, profile)
    result = learn_then_test(conf, correct, risk=args.risk, delta=args.delta)
    smallest = smallest_certifiable_risk(conf, correct, delta=args.delta)
    certificate = AllowCertificate.from_result(
        result,
        key=key,
        smallest_risk=smallest,
        grid=DEFAULT_GRID,
        data_hash=certificate_data_hash(qids, conf, correct),
        confidence_model=confidence_model,
        created_at=datetime.now(UTC),
        scope=ProfileScope(profile=args.profile, rules_sha256=profile.rules_sha256())
        if profile is not None
        else None,
        rows=[str(p) for p in args.rows],
        model_versions=versions,
        n_rows=len(rows),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(certificate.model_dump_json(indent=2) + "\n", encoding="utf-8")
    if args.json:
        sys.stdout.write(json.dumps(certificate.model_dump(mode="json")) + "\n")
    else:
        sys.stdout.write(f"{key}: {certificate.summary()}\nwrote {args.out}\n")
    return 0
