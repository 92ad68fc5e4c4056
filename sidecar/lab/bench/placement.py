"""Where the bench's processes run: all on every CPU, or the process under test apart.

``shared`` (the default) runs the broker, the load generator and the process under
test (the sidecar, a floor) on every CPU this process may use, as the bench always
did. On a 2-core machine they then take turns on both cores, and what one of them
costs the others shows up in the latency of all of them. ``split`` gives the process
under test the first half of the CPUs and the broker and the load generator the rest,
as in a pod whose broker and producers run elsewhere: the sidecar and each floor are
measured on the same CPUs of their own. What the bench measures in its own process (the
stages, the profiles) then runs on the rest.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sidecar.exceptions import ConfigError

PLACEMENTS = ("shared", "split")


@dataclass(frozen=True)
class Placement:
    """``under_test``: the CPUs of the process under test; ``rest``: those of this process
    (the load generator) and of the broker it starts. ``None``: every CPU."""

    name: str = "shared"
    under_test: frozenset[int] | None = None
    rest: frozenset[int] | None = None

    @classmethod
    def of(cls, name: str, cpus: Iterable[int] | None = None) -> Placement:
        """The placement called ``name`` over ``cpus`` (default: those this process may use)."""
        if name == "shared":
            return cls()
        if name != "split":
            raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, got {name!r}")
        usable = sorted(os.sched_getaffinity(0) if cpus is None else set(cpus))
        if len(usable) < 2:
            raise ConfigError(
                f"the split placement needs at least 2 CPUs (one for the process under test, "
                f"one for the broker and the load), this process may use {len(usable)}: "
                "use --placement shared"
            )
        half = len(usable) // 2
        return cls(name, frozenset(usable[:half]), frozenset(usable[half:]))

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Inside it, this process (every thread it has now; threads and children it
        starts inherit) runs on ``rest``: enter before the broker starts. On the way out,
        every thread of it is back on the CPUs the calling thread had before."""
        if self.rest is None:
            yield
            return
        before = frozenset(os.sched_getaffinity(0))
        _pin_process(self.rest)
        try:
            yield
        finally:
            _pin_process(before)

    def report(self) -> dict[str, object]:
        return {
            "placement": self.name,
            "cpus_under_test": None if self.under_test is None else sorted(self.under_test),
            "cpus_broker_and_load": None if self.rest is None else sorted(self.rest),
        }


def _pin_process(cpus: frozenset[int]) -> None:
    """Every thread of this process on ``cpus`` (``sched_setaffinity(0)`` moves only the
    calling thread; Linux, as the rest of the bench)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
