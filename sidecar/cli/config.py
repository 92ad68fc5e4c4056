"""``guardrail config show``: the effective configuration, secrets redacted."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from sidecar.config import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="inspect the configuration")
    cmds = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = cmds.add_parser("show", help="print the effective configuration (secrets redacted)")
    show.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    del args
    settings = Settings.load()
    sys.stdout.write(orjson.dumps(settings.redacted(), option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
