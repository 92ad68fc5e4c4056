"""Nested command groups: ``guardrail calibrate ...``, ``guardrail eval ...``.

Several modules contribute sub-commands to the same group (``eval retrieval``,
``eval lookback``, ``eval claims`` ...). Each calls :func:`get_group`, which
creates the group parser on first use and returns the same nested subparsers
action afterwards, so the order of ``COMMAND_MODULES`` does not matter.
"""

from __future__ import annotations

import argparse

from sidecar.exceptions import ConfigError

__all__ = ["get_group"]


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
