"""``guardrail config show``: the effective configuration, secrets redacted.

``--sources``: instead, one line per setting that is not at its default, with the
variable it came from (``GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS``; a section's JSON
variable, ``GUARDRAIL_KAFKA``; or ``derived`` for a value a check computed), so an
operator can tell what the pod's environment changed; ``--all`` lists the defaults too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel

from sidecar.config import Settings
from sidecar.environment import PREFIX


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="inspect the configuration")
    cmds = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = cmds.add_parser("show", help="print the effective configuration (secrets redacted)")
    show.add_argument(
        "--sources",
        action="store_true",
        help="one line per setting not at its default, with the variable that set it",
    )
    show.add_argument(
        "--all", action="store_true", help="--sources, and the settings at their defaults too"
    )
    show.set_defaults(func=run_show)


@dataclass(frozen=True, slots=True)
class Source:
    path: tuple[str, ...]  # ("kafka", "bootstrap_servers")
    value: Any  # as config show prints it (JSON, secrets redacted)
    source: str  # the variable's name as set, "GUARDRAIL_KAFKA (JSON)", "derived" or "default"


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _leaves(kind, (*prefix, name))
        else:
            yield (*prefix, name)


def _at(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = tree
    for part in path:
        value = value[part]
    return value


def _json_section(
    path: tuple[str, ...], names: Mapping[str, str], environ: Mapping[str, str]
) -> str | None:
    """The section variable whose JSON object sets ``path`` (``GUARDRAIL_KAFKA='{"group_id":
    ...}'`` sets ``kafka.group_id``), innermost first."""
    for i in range(len(path) - 1, 0, -1):
        name = names.get(PREFIX + "__".join(p.upper() for p in path[:i]))
        if name is None:
            continue
        try:
            given: Any = orjson.loads(environ[name])
        except orjson.JSONDecodeError:
            continue
        for part in path[i:]:
            if not isinstance(given, dict) or part not in given:
                break
            given = given[part]
        else:
            return name
    return None


def sources(settings: Settings, environ: Mapping[str, str]) -> list[Source]:
    """Every setting with its value and where the value came from."""
    shown = settings.redacted()
    defaults = Settings.model_construct().redacted()  # the declared defaults, no environment
    names = {name.upper(): name for name in environ if name.upper().startswith(PREFIX)}
    out = []
    for path in _leaves(Settings):
        value = _at(shown, path)
        variable = PREFIX + "__".join(p.upper() for p in path)
        if variable in names:
            source = names[variable]
        elif section := _json_section(path, names, environ):
            source = f"{section} (JSON)"
        elif value != _at(defaults, path):
            source = "derived"
        else:
            source = "default"
        out.append(Source(path, value, source))
    return out


def run_show(args: argparse.Namespace) -> int:
    settings = Settings.load()
    if not (args.sources or args.all):
        dumped = orjson.dumps(settings.redacted(), option=orjson.OPT_INDENT_2).decode()
        sys.stdout.write(dumped + "\n")
        return 0
    listed = [s for s in sources(settings, os.environ) if args.all or s.source != "default"]
    if not listed:
        sys.stdout.write("every setting is at its default\n")
    width = max((len(".".join(s.path)) for s in listed), default=0)
    for s in listed:
        value = orjson.dumps(s.value).decode()
        sys.stdout.write(f"{'.'.join(s.path):<{width}}  {value}  <- {s.source}\n")
    return 0
