"""``guardrail run``: the sidecar itself."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

import orjson

from sidecar.config import Settings
from sidecar.exceptions import StopTimeoutError

log = logging.getLogger("sidecar")


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run the sidecar (consume, decide, publish verdicts)")
    p.add_argument(
        "--check",
        action="store_true",
        help="validate configuration and load models, then exit without connecting to Kafka",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecar import runtime  # noqa: PLC0415 - keeps --help light

    settings = Settings.load()
    if args.check:
        sys.stdout.write(orjson.dumps(runtime.check(settings)).decode() + "\n")
        return 0
    try:
        asyncio.run(runtime.serve(settings))
    except StopTimeoutError as exc:
        # the processor thread is held by a call that never returns, and the interpreter
        # joins it at exit: the process would never end (audit: 10 minutes after SIGTERM)
        log.error("%s", exc)  # noqa: TRY400 - the message says it all, no traceback
        logging.shutdown()
        os._exit(1)
    return 0
