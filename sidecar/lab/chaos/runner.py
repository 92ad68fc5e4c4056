"""The chaos suite: the scenarios by name, run in order against one broker, and their report.

Scenarios live in :mod:`~sidecar.lab.chaos.faults` (restarts, broker restart,
network stall, bad input), :mod:`~sidecar.lab.chaos.hostile_scenario` and
:mod:`~sidecar.lab.chaos.soak`; :mod:`~sidecar.lab.chaos.harness` owns the
broker and the sidecars, :mod:`~sidecar.lab.chaos.watch` reads what came out.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sidecar.exceptions import ConfigError
from sidecar.lab.chaos.faults import bad_input, broker_restart, network_stall, restarts
from sidecar.lab.chaos.harness import Chaos
from sidecar.lab.chaos.hostile_scenario import hostile
from sidecar.lab.chaos.watch import ScenarioResult
from sidecar.lab.localkafka.broker import default_home

SCENARIOS = (
    "sigkill-restart",
    "sigterm-restart",
    "broker-restart",
    "bad-input",
    "hostile",
    "network-stall",
)


def run_chaos(
    quick: bool = True, seed: int = 7, only: Iterable[str] | None = None
) -> dict[str, Any]:
    """The suite (``SCENARIOS``, in that order), or the named subset of it."""
    chosen = set(SCENARIOS if only is None else only)
    unknown = chosen - set(SCENARIOS)
    if unknown:
        raise ConfigError(
            f"unknown chaos scenario(s) {sorted(unknown)}; known: {', '.join(SCENARIOS)}"
        )
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="chaos-", dir=home) as tmp,
        Chaos(Path(tmp), seed, quick) as chaos,
    ):
        scenarios: dict[str, Callable[[], Awaitable[ScenarioResult]]] = {
            "sigkill-restart": lambda: restarts(chaos, signal.SIGKILL),
            "sigterm-restart": lambda: restarts(chaos, signal.SIGTERM),
            "broker-restart": lambda: broker_restart(chaos),
            "bad-input": lambda: bad_input(chaos),
            "hostile": lambda: hostile(chaos),
            "network-stall": lambda: network_stall(chaos),
        }

        async def all_scenarios() -> list[ScenarioResult]:
            return [await scenarios[name]() for name in SCENARIOS if name in chosen]

        results = asyncio.run(all_scenarios())
    return {"quick": quick, "seed": seed, "scenarios": [asdict(r) for r in results]}
