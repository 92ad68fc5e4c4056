"""``guardrail policy check FILE``: validate a policy YAML and list its profiles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sidecar.cli.groups import get_group

__all__ = ["register", "run_check"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    group = get_group(sub, "policy", "Work with the declarative decision policy.")
    p = group.add_parser(
        "check",
        help="Validate a policy file; exit 2 with what is wrong.",
        description="Validate a policy YAML (profiles, thresholds, actions, texts).",
    )
    p.add_argument("file", type=Path)
    p.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    from sidecar.policy.engine import PolicyEngine  # noqa: PLC0415
    from sidecar.policy.lint import inert_rules, literal_patterns  # noqa: PLC0415

    engine = PolicyEngine.from_file(args.file)
    config = engine.config
    sys.stdout.write(f"{args.file}: ok ({engine.name}, default profile {config.default_profile})\n")
    for name, profile in config.profiles.items():
        sys.stdout.write(
            f"  {name}: max hallucination rate {profile.max_hallucination_rate}, "
            f"strict={str(profile.strict).lower()}\n"
        )
        certified = engine.certified.get(name)
        for entry in certified.listed if certified is not None else ():
            cert = entry.certificate
            sys.stdout.write(
                f"    certified allow at confidence >= {cert.threshold:g} (risk {cert.risk:g}, "
                f"delta {cert.delta:g}, {cert.key}; fitted with "
                f"{', '.join(entry.signals) or 'no signals'}): {entry.path}\n"
            )
    used = {config.default_profile, *config.tenants.values(), *config.collections.values()}
    for name in config.profiles:
        if name not in used:
            sys.stdout.write(
                f"  note: profile {name} is mapped from no tenant or collection and is not the "
                "default: it decides nothing until one is\n"
            )
    for name, profile in config.profiles.items():
        for note in inert_rules(name, profile):
            sys.stdout.write(f"  note: {note}\n")
    for note in literal_patterns(config):
        sys.stdout.write(f"  note: {note}\n")
    shadowed = sorted(set(config.tenants) & set(config.collections))
    if shadowed:
        sys.stdout.write(
            f"  note: {', '.join(shadowed)} named as a tenant and as a collection: the tenant's "
            "profile wins\n"
        )
    return 0
