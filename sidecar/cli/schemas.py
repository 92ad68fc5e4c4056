"""``guardrail schemas export|check``: JSON Schemas and AsyncAPI from the models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("schemas", help="generate or check schemas/ (JSON Schema + AsyncAPI)")
    cmds = p.add_subparsers(dest="schemas_command", metavar="ACTION", required=True)
    for name, helptext in (("export", "write schemas/"), ("check", "fail if schemas/ is stale")):
        c = cmds.add_parser(name, help=helptext)
        c.add_argument("--out", type=Path, default=Path("schemas"))
        c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.contracts.schema_export import render, stale_files, write  # noqa: PLC0415

    if args.schemas_command == "export":
        for path in write(args.out):
            sys.stdout.write(f"wrote {path}\n")
        return 0
    stale = stale_files(args.out, render())
    for name in stale:
        sys.stderr.write(f"stale: {args.out / name} (run: guardrail schemas export)\n")
    return 1 if stale else 0
