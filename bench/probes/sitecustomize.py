"""The processor's CPU in a bench process, for ``bench/paired_drains.py --processor-cpu``.

Python imports this module at start-up when its folder is on ``PYTHONPATH`` (the bench
puts it there for the processes under test only). With ``BENCH_PROBE_DIR`` set (not a
``GUARDRAIL_`` name: the sidecar refuses the ones it does not know), every call the
service hands to its processor (``SidecarService._in_worker``: the batches' parts, the
ticks) is timed with ``time.thread_time`` on the thread that runs it, and at exit the
process writes ``processor-cpu.<pid>.json`` there: ``{"processor_cpu_s": ..., "calls":
...}``. The sidecar and the floors go through the same call, so the rest of a process's
CPU is its loop's (consuming, publishing, committing, telemetry).
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_DIR = os.environ.get("BENCH_PROBE_DIR")


def _install(folder: Path) -> None:
    from sidecar.kafka import app  # noqa: PLC0415 - only in the processes probed

    spent = {"processor_cpu_s": 0.0, "calls": 0}
    original = app.SidecarService._in_worker

    async def in_worker(self: app.SidecarService, fn: Callable[..., Any], *args: Any) -> Any:
        def timed(*call_args: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*call_args)
            finally:
                spent["processor_cpu_s"] += time.thread_time() - start
                spent["calls"] += 1

        return await original(self, timed, *args)

    app.SidecarService._in_worker = in_worker  # type: ignore[method-assign]

    def write() -> None:
        (folder / f"processor-cpu.{os.getpid()}.json").write_text(json.dumps(spent))

    atexit.register(write)


if _DIR:
    _install(Path(_DIR))
