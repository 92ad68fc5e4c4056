"""``guardrail replay FILE.jsonl``: produce recorded events to the input topics."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from sidecar.config import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="produce recorded events (JSON lines) to the input topics")
    p.add_argument("file", type=Path, help="JSON-lines file of events or raw envelopes")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="messages per second (default: as fast as possible)",
    )
    p.add_argument("--bootstrap-servers", help="override GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.lab.replay import iter_file, send  # noqa: PLC0415

    overrides: dict[str, Any] = {}
    if args.bootstrap_servers:
        overrides["kafka"] = {"bootstrap_servers": args.bootstrap_servers}
    settings = Settings.load(**overrides)
    # every line checked before the first is sent; then the file is read again as it goes
    total, topics = 0, set[str]()
    for record in iter_file(args.file, settings):
        total += 1
        topics.add(record.topic)

    def progress(sent: int) -> None:
        sys.stderr.write(f"replay: {sent} of {total} messages ({sent / total:.0%})\n")

    records = iter_file(args.file, settings)
    sent = asyncio.run(send(settings, records, args.rate, progress=progress, topics=topics))
    sys.stdout.write(f"replayed {sent} messages from {args.file}\n")
    return 0
