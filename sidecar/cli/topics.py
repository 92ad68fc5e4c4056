"""``guardrail topics create``: explicit topic creation."""

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
