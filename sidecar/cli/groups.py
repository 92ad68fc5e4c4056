"""Nested command groups: ``guardrail calibrate ...``, ``guardrail eval ...``.

Several modules contribute sub-commands to the same group (``eval retrieval``,
``eval lookback``, ``eval claims`` ...). Each calls :func:`get_group`, which
creates the group parser on first use and returns the same nested subparsers
action afterwards, so the order of ``COMMAND_MODULES`` does not matter.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sidecar.exceptions import ConfigError

__all__ = ["add_progress_arg", "add_rag_runtime_args", "get_group", "progress_enabled"]


def add_rag_runtime_args(p: argparse.ArgumentParser) -> None:
    """Where Qdrant lives, torch threads and progress bars: shared by the RAG-loop commands."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--qdrant-path", type=Path, help="embedded Qdrant on disk (reused)")
    where.add_argument("--qdrant-url", help="Qdrant server URL (default: embedded, in memory)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    add_progress_arg(p)


def add_progress_arg(p: argparse.ArgumentParser, what: str = "tqdm progress bars") -> None:
    """``--progress`` / ``--no-progress``; unset, :func:`progress_enabled` shows bars only on a
    terminal."""
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"{what} (default: when stderr is a terminal)",
    )


def progress_enabled(args: argparse.Namespace) -> bool:
    """``--progress`` / ``--no-progress``, else progress bars only on a terminal."""
    return bool(args.progress) if args.progress is not None else sys.stderr.isatty()


def get_group(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The subparsers of group ``name`` under ``sub``, created with ``help_text`` if new."""
    existing = sub.choices.get(name)
    if existing is not None:
        for action in existing._actions:
            if isinstance(action, argparse._SubParsersAction):
                return action
        raise ConfigError(f"command {name!r} already exists and is not a command group")
    parser = sub.add_parser(name, help=help_text, description=help_text)
    return parser.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND", required=True)
