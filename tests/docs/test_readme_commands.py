"""Every ``guardrail …`` command line the README shows is one the CLI takes.

A command is a code span, or a line of a code block, that begins with ``guardrail``
(or ``$ guardrail``). Its words name sub-commands down the ``argparse`` tree of
``sidecar.cli.main.build_parser`` (``list|reinstate`` and ``dataset/train`` name
several at one level) until a command that has none; every ``--option`` written in
the line must be one of the options of the commands on that path. Bracketed parts
(``[--partitions N]``) are optional, and only their options are checked.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from sidecar.cli.main import build_parser
from tests.docs.markdown import code_spans, fenced_lines, readme_text

_COMMAND = re.compile(r"^(?:\$\s+)?guardrail(\s.*)?$")
_WORDS = re.compile(r"^[a-z][a-z0-9-]*(?:[|/][a-z][a-z0-9-]*)*$")
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@functools.cache
def parser() -> argparse.ArgumentParser:
    return build_parser()


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {s for action in p._actions for s in action.option_strings}


def _takes_value(p: argparse.ArgumentParser, option: str) -> bool:
    return any(option in action.option_strings and action.nargs != 0 for action in p._actions)


@dataclass(frozen=True)
class Problem:
    line: str
    what: str


def readme_commands() -> Iterator[str]:
    text = readme_text()
    for candidate in [*code_spans(text), *fenced_lines(text)]:
        line = candidate.split("  #", 1)[0].replace("\\|", "|").strip()
        if _COMMAND.match(line):
            yield line.removeprefix("$").strip()


def check(line: str) -> list[Problem]:
    """What in ``line`` the CLI does not take."""
    words = line.split()[1:]
    path = [[parser()]]  # the parsers at each level (several for a|b)
    problems = []
    depth, skip, descending = 0, False, True
    for word in words:
        current = path[-1]
        if depth or word.startswith("["):
            depth += word.count("[") - word.count("]")
            continue
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            skip = any(_takes_value(p, word) for p in current)
            continue
        subcommands = {k: v for p in current for k, v in _subcommands(p).items()}
        if not descending or not subcommands or not _WORDS.match(word):
            descending = False  # the command's own arguments from here on
            continue
        names = re.split(r"[|/]", word)
        unknown = [n for n in names if n not in subcommands]
        if unknown:
            where = " ".join(["guardrail", *words[: words.index(word)]])
            problems.append(Problem(line, f"{where} has no sub-command {unknown}"))
            return problems
        path.append([subcommands[n] for n in names])
    known = {o for level in path for p in level for o in _options(p)}
    problems += [
        Problem(line, f"no option {option}")
        for option in _OPTION.findall(line)
        if option not in known
    ]
    return problems


def test_the_readme_shows_commands() -> None:
    lines = list(readme_commands())
    assert len(lines) > 40, lines  # the table of commands, the examples


def test_every_command_in_the_readme_exists() -> None:
    problems = [p for line in readme_commands() for p in check(line)]
    assert problems == [], "README command lines the CLI does not take:\n" + "\n".join(
        f"{p.line!r}: {p.what}" for p in problems
    )


def test_the_check_tells_a_wrong_command() -> None:
    """The checker itself: a sub-command, an alternative or an option that does not exist."""
    assert check("guardrail topics create --partitions 3") == []
    assert check("guardrail kafka [--port 9092] start") == []
    assert len(check("guardrail topics delete")) == 1
    assert len(check("guardrail kafka fetch|restart")) == 1
    assert len(check("guardrail topics create --partitons 3")) == 1


def _leaves(p: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    subcommands = _subcommands(p)
    if not subcommands:
        yield " ".join(prefix)
    for name, sub in subcommands.items():
        yield from _leaves(sub, (*prefix, name))


def _named(line: str) -> set[str]:
    """The commands ``line`` names (each alternative spelled out), and their groups."""
    paths: list[list[str]] = [[]]
    for word in line.split()[1:]:
        if not _WORDS.match(word):
            break
        paths = [[*path, name] for path in paths for name in re.split(r"[|/]", word)]
    return {" ".join(path[:i]) for path in paths for i in range(len(path) + 1)}


def test_every_command_of_the_cli_is_in_the_readme() -> None:
    shown = {name for line in readme_commands() for name in _named(line)}
    missing = sorted(set(_leaves(parser())) - shown)
    assert missing == [], f"commands the README never shows: {missing}"
