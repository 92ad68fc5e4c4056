"""``guardrail certificates``: the fleet's allow-certificate withdrawals (``rag.certificates``).

``list`` prints the latest record of every calibration key (withdrawn, with the
re-test that withdrew it, or reinstated); ``reinstate KEY`` writes the tombstone that
gives a withdrawn key its certified allow back on every replica (each starts its
re-test window for the key afresh). Re-certifying (``guardrail calibrate policy``,
a new certificate file) also ends a withdrawal: it names the certificates it withdrew.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from sidecar.config import Settings


def register(sub: Any) -> None:
    p = sub.add_parser(
        "certificates", help="the fleet's allow-certificate withdrawals (rag.certificates)"
    )
    cmds = p.add_subparsers(dest="certificates_command", metavar="ACTION", required=True)
    listing = cmds.add_parser("list", help="every calibration key's latest record, as JSON lines")
    listing.add_argument("--bootstrap-servers", help="override GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS")
    listing.set_defaults(func=run_list)
    reinstate = cmds.add_parser(
        "reinstate", help="give KEY its certified allow back on every replica (a tombstone)"
    )
    reinstate.add_argument("key", help="the calibration key, tenant/collection/retriever")
    reinstate.add_argument(
        "--bootstrap-servers", help="override GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS"
    )
    reinstate.set_defaults(func=run_reinstate)


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.bootstrap_servers:
        overrides["kafka"] = {"bootstrap_servers": args.bootstrap_servers}
    return Settings.load(**overrides)


def run_list(args: argparse.Namespace) -> int:
    from sidecar.kafka.withdrawals import read_withdrawals  # noqa: PLC0415

    settings = _settings(args)
    latest = asyncio.run(read_withdrawals(settings))
    if not latest:  # said on stderr: stdout stays JSON lines (none) for a script
        sys.stderr.write(
            f"{settings.topics.certificates}: no certificate withdrawals (no allow "
            "certificate was withdrawn or reinstated)\n"
        )
    for key in sorted(latest):
        record = latest[key]
        row = (
            {"calibration_key": key, "status": "reinstated"}
            if record is None
            else {"status": "withdrawn", **record.model_dump(mode="json")}
        )
        sys.stdout.write(json.dumps(row, sort_keys=True) + "\n")
    return 0


def run_reinstate(args: argparse.Namespace) -> int:
    from sidecar.kafka.withdrawals import read_withdrawals, reinstate  # noqa: PLC0415

    settings = _settings(args)
    latest = asyncio.run(read_withdrawals(settings))
    if latest.get(args.key) is None:  # nothing to give back: a usage error (exit 2)
        known = ", ".join(k for k, v in sorted(latest.items()) if v is not None) or "none"
        sys.stderr.write(
            f"guardrail certificates reinstate: {args.key} is not withdrawn on "
            f"{settings.topics.certificates}, nothing to reinstate (withdrawn keys: {known})\n"
        )
        return 2
    asyncio.run(reinstate(settings, args.key))
    sys.stdout.write(f"{args.key}: reinstated\n")
    return 0
