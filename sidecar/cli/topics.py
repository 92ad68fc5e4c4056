"""``guardrail topics create``: explicit topic creation; ``guardrail topics acls``: the Kafka
ACLs the sidecar needs with this configuration, and (``--check``) whether it holds them."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from sidecar.config import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("topics", help="manage the sidecar's Kafka topics")
    cmds = p.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    create = cmds.add_parser(
        "create",
        help="create rag.retrieval, rag.generation, rag.feedback, rag.claims, rag.verdicts "
        "(--partitions each) and rag.dlq, rag.reports, rag.certificates (1 partition)",
    )
    create.add_argument("--bootstrap-servers", help="override GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS")
    create.add_argument("--partitions", type=int, help="override GUARDRAIL_TOPICS__PARTITIONS")
    create.set_defaults(func=run_create)
    acls = cmds.add_parser(
        "acls",
        help="the Kafka ACLs the sidecar needs with this configuration, as kafka-acls.sh lines; "
        "--check asks the cluster which its principal holds (exit 2 when one it needs is not)",
    )
    acls.add_argument("--bootstrap-servers", help="override GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS")
    acls.add_argument(
        "--principal",
        help="the principal in the lines (default: User:<GUARDRAIL_KAFKA__SASL_USERNAME>)",
    )
    acls.add_argument(
        "--check",
        action="store_true",
        help="connect with the sidecar's credentials and say which are granted",
    )
    acls.add_argument("--json", action="store_true", help="one JSON object per ACL")
    acls.set_defaults(func=run_acls)


def run_create(args: argparse.Namespace) -> int:
    from sidecar.kafka.topics import create_topics  # noqa: PLC0415

    overrides: dict[str, Any] = {}
    if args.bootstrap_servers:
        overrides["kafka"] = {"bootstrap_servers": args.bootstrap_servers}
    if args.partitions is not None:  # 0 is refused by the settings, not read as "default"
        overrides["topics"] = {"partitions": args.partitions}
    settings = Settings.load(**overrides)
    result = asyncio.run(create_topics(settings))
    for name, what in result.items():
        sys.stdout.write(f"{name}: {what}\n")
    return 0


def run_acls(args: argparse.Namespace) -> int:
    import orjson  # noqa: PLC0415

    from sidecar.kafka.permissions import (  # noqa: PLC0415
        OPERATION_NAMES,
        lacking_needs,
        needs,
        principal_hint,
        uses,
    )
    from sidecar.kafka.topics import started_admin  # noqa: PLC0415
    from sidecar.runtime import build_processor  # noqa: PLC0415

    overrides: dict[str, Any] = {}
    if args.bootstrap_servers:
        overrides["kafka"] = {"bootstrap_servers": args.bootstrap_servers}
    settings = Settings.load(**overrides)
    processor = build_processor(settings)  # what it will do: the claim check, reports, ...
    try:
        wanted = needs(settings, **uses(processor))
    finally:
        processor.signals.close()
    lacking = None
    if args.check:

        async def ask() -> list[Any]:
            admin = await started_admin(settings.kafka)
            try:
                return await lacking_needs(settings, admin, wanted)
            finally:
                await admin.close()

        lacking = asyncio.run(ask())
    principal = args.principal or principal_hint(settings)
    servers = settings.kafka.bootstrap_servers
    for need in wanted:
        granted = None if lacking is None else need not in lacking
        if args.json:
            row = {
                "resource": need.resource,
                "name": need.name,
                "operation": OPERATION_NAMES[need.operation],
                "why": need.why,
                "essential": need.essential,
                **({} if need.essential else {"without": need.without}),
                "command": need.grant(principal, servers),
                **({} if granted is None else {"granted": granted}),
            }
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
            continue
        note = need.why if need.essential else f"optional: {need.why}"
        if granted is None:
            sys.stdout.write(f"{need.grant(principal, servers)}  # {note}\n")
        else:
            state = "granted" if granted else ("MISSING" if need.essential else "missing")
            sys.stdout.write(f"{state:8} {need.describe()}\n")
    if lacking is not None and any(n.essential for n in lacking):
        essential = sum(n.essential for n in lacking)
        sys.stderr.write(
            f"guardrail topics acls: {essential} ACL(s) the sidecar needs are not granted to "
            f"this client's principal ({principal}); the sidecar would not start\n"
        )
        return 2
    return 0
