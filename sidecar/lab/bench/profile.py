"""Where a request's processor time goes: a sampling profile of whole requests.

``guardrail bench`` reports per-stage timings; this adds the profile the issue
asks for when a target is missed: whole requests (retrieval, deltas, final)
through the real :class:`~sidecar.pipeline.processor.Processor` with the
configured signals, under ``pyinstrument`` (a sampling profiler, 1 ms
interval), aggregated by function *self* time. The top rows name the hottest
code; ``by_package`` sums self time per top-level package (sidecar,
onnxruntime, pydantic, ...), which says whether the cost is ours or a
library's.

``pyinstrument`` is a development dependency (``pip install -e '.[dev]'``),
never needed by the serving path.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import PurePath
from typing import Any

from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.lab.bench.e2e import LoadShape, answer_events
from sidecar.lab.bench.stages import as_served, request_items
from sidecar.pipeline.ports import Policy, SignalSuite
from sidecar.pipeline.processor import Processor

__all__ = ["package_of", "profile_paths", "profile_requests"]

_SITE = ("site-packages", "dist-packages")


def package_of(file_path: str) -> str:
    """``.../site-packages/onnxruntime/x.py`` -> ``onnxruntime``; our files -> ``sidecar``."""
    parts = PurePath(file_path).parts
    for marker in _SITE:
        if marker in parts:
            k = parts.index(marker)
            return parts[k + 1] if k + 1 < len(parts) else "?"
    if "sidecar" in parts:
        return "sidecar"
    if file_path.startswith("<"):  # <built-in>, <frozen ...>: the interpreter itself
        return "builtins"
    return "stdlib"


def _walk(frame: Any, into: dict[tuple[str, str, int], float], parent: Any = None) -> None:
    """Self time per (function, file, line); built-ins are charged to their caller's file.

    A C extension's time (``InferenceSession.run``, a tokenizer) shows up as a
    built-in frame with no file: naming the Python frame that called it says
    whose it is (``onnxruntime/.../onnxruntime_inference_collection.py``).
    """
    for child in frame.children:
        _walk(child, into, frame)
    if frame.is_synthetic:
        return
    function, path, line = frame.function or "?", frame.file_path or "?", frame.line_no or 0
    if path.startswith("<") and parent is not None and parent.file_path:
        if function.startswith("pybind11"):  # pybind11's mangled class name, then the method
            function = function.rsplit(".", 1)[-1]
        function = f"{function} (from {parent.function})"
        path, line = parent.file_path, parent.line_no or 0
    into[(function, path, line)] += frame.total_self_time


def profile_requests(
    settings: Settings,
    policy: Policy,
    signals: SignalSuite,
    *,
    n: int = 300,
    shape: LoadShape | None = None,
    top: int = 12,
) -> dict[str, Any]:
    """Profile ``n`` whole requests through the processor; self time by function."""
    try:
        from pyinstrument import Profiler  # noqa: PLC0415 - development tool, imported on use
    except ImportError as exc:
        raise ConfigError(
            "profiling needs pyinstrument: pip install -e '.[dev]' (or pip install pyinstrument)"
        ) from exc
    shape = shape or LoadShape()
    processor = Processor(settings, policy, signals=signals)
    events = [answer_events(f"prof-{i}", shape) for i in range(n)]
    profiler = Profiler(interval=0.001)
    with as_served(settings):
        t0 = time.perf_counter()
        profiler.start()
        for i, events_i in enumerate(events):
            processor.on_batch(request_items(events_i, events_i[0]["request_id"], i), 0.0)
        session = profiler.stop()
        wall = time.perf_counter() - t0
    root = session.root_frame()
    self_time: dict[tuple[str, str, int], float] = defaultdict(float)
    if root is not None:
        _walk(root, self_time)
    total = sum(self_time.values()) or 1.0
    packages: dict[str, float] = defaultdict(float)
    for (_, path, _), t in self_time.items():
        packages[package_of(path)] += t
    rows = sorted(self_time.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return {
        "requests": n,
        "shape": {"k": shape.k, "deltas": shape.deltas, "claims": shape.claims},
        "claims_on": signals.claims is not None,
        "wall_s": round(wall, 3),
        "per_request_ms": round(1000.0 * wall / max(1, n), 3),
        "by_package": {
            name: round(t / total, 3)
            for name, t in sorted(packages.items(), key=lambda kv: kv[1], reverse=True)
        },
        "top_self_time": [
            {
                "function": function,
                "where": f"{_short(path)}:{line}",
                "share": round(t / total, 3),
                "ms_per_request": round(1000.0 * t / max(1, n), 3),
            }
            for (function, path, line), t in rows
        ],
    }


def _short(path: str) -> str:
    parts = PurePath(path).parts
    for marker in (*_SITE, "sidecar"):
        if marker in parts:
            k = parts.index(marker)
            return "/".join(parts[k + (1 if marker in _SITE else 0) :])
    return path


def profile_paths(n_fast: int = 1000, n_claims: int = 100) -> dict[str, Any]:
    """Both served paths with the shipped artifacts: the fast path, the claim path."""
    from sidecar import runtime  # noqa: PLC0415 - loads the models

    settings = Settings.load()
    policy, signals = runtime.build_policy(settings), runtime.build_signals(settings)
    claim_settings = Settings.load(signals={"claims": True})
    claim_signals = runtime.build_signals(claim_settings)
    try:  # closed after: an LLM judge's calls in flight are cut off (its threads held the exit)
        return {
            "fast_path": profile_requests(settings, policy, signals, n=n_fast),
            "claim_path": profile_requests(
                claim_settings,
                policy,  # the policy file does not depend on which signals run
                claim_signals,
                n=n_claims,
                shape=LoadShape(k=5, deltas=5, claims=5, attention=None),
            ),
        }
    finally:
        signals.close()
        claim_signals.close()
