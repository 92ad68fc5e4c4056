"""Read what the Dockerfile's default build puts in the runtime image, without Docker.

Enough of the Dockerfile language for this project's file: ``ARG`` defaults
(global and per stage), ``FROM <image or stage> [AS name]`` with ``${VAR}``
substitution, ``COPY [--from=stage] src... dst``, ``RUN mkdir``, ``ENV``.
Anything it cannot follow raises ``DockerfileError``, so a change of layout
fails the tests that rely on it instead of passing them by accident.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


class DockerfileError(AssertionError):
    """The Dockerfile does something this reader does not model."""


@dataclass
class Stage:
    base: str
    name: str | None
    args: dict[str, str] = field(default_factory=dict)
    instructions: list[tuple[str, str]] = field(default_factory=list)


def _substitute(text: str, variables: dict[str, str]) -> str:
    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise DockerfileError(f"${name} has no default in the Dockerfile ({text!r})")
        return variables[name]

    return _VAR.sub(value, text)


def _norm(path: str) -> str:
    return posixpath.normpath("/" + path.strip().lstrip("/"))


def _instructions(path: Path) -> list[str]:
    """One line per instruction: comments dropped, continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):  # comments inside a RUN included
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return lines


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @classmethod
    def read(cls, path: Path) -> Dockerfile:
        global_args: dict[str, str] = {}
        stages: list[Stage] = []
        for line in _instructions(path):
            keyword, _, rest = line.partition(" ")
            keyword = keyword.upper()
            rest = rest.strip()
            if keyword == "ARG":
                name, has_default, default = rest.partition("=")
                scope = stages[-1].args if stages else global_args
                if has_default:
                    scope[name] = default.strip().strip("\"'")
                elif stages and name in global_args:
                    scope[name] = global_args[name]
            elif keyword == "FROM":
                words = rest.split()
                if len(words) == 3 and words[1].upper() == "AS":
                    stages.append(Stage(_substitute(words[0], global_args), words[2]))
                elif len(words) == 1:
                    stages.append(Stage(_substitute(words[0], global_args), None))
                else:
                    raise DockerfileError(f"cannot read FROM {rest!r}")
            elif stages:
                stages[-1].instructions.append((keyword, rest))
        if not stages:
            raise DockerfileError(f"{path} has no FROM")
        return cls(global_args, stages)

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def runtime_env(self) -> dict[str, str]:
        """The final stage's ``ENV`` (values as written, ``$VAR`` left alone)."""
        env: dict[str, str] = {}
        for keyword, rest in self.stages[-1].instructions:
            if keyword == "ENV":
                for word in shlex.split(rest):
                    name, eq, value = word.partition("=")
                    if not eq:
                        raise DockerfileError(f"ENV without '=' is not modelled: {rest!r}")
                    env[name] = value
        return env

    def runtime_user(self) -> str | None:
        users = [rest for keyword, rest in self.stages[-1].instructions if keyword == "USER"]
        return users[-1] if users else None

    def baked_source(self, path: str, stage: Stage | None = None) -> str | None:
        """The build-context path the default build copies to ``path`` of the final image.

        None when the image holds nothing there but an empty directory.
        """
        stage = stage or self.stages[-1]
        target = _norm(path)
        found: str | None = None
        known = False
        variables = self.global_args | stage.args
        for keyword, rest in stage.instructions:
            if keyword == "COPY":
                words = shlex.split(_substitute(rest, variables))
                flags = [w for w in words if w.startswith("--")]
                paths = [w for w in words if not w.startswith("--")]
                if len(paths) != 2:
                    continue
                src, dst = paths
                if _norm(dst) != target:
                    continue
                known = True
                source = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
                if source is None:
                    found = src.rstrip("/") or "."
                elif (other := self.stage(source)) is not None:
                    found = self.baked_source(src, other)
                else:
                    raise DockerfileError(f"COPY --from={source}: an image, not a stage")
            elif keyword == "RUN" and re.search(rf"\bmkdir( -p)? {re.escape(target)}\b", rest):
                known, found = True, None
        if known:
            return found
        base = self.stage(stage.base)
        if base is not None:
            return self.baked_source(path, base)
        raise DockerfileError(f"cannot tell what the image holds at {path} (stage {stage.name})")
