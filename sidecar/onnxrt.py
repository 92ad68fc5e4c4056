"""onnxruntime as the sidecar imports it: with its usage telemetry off.

onnxruntime (1.32 measured) starts usage telemetry at import: its first session writes
a device id and an event database under ``$HOME/.cache/Microsoft/DeveloperTools/`` and a
session file into the working directory. The sidecar reports to no one but its own
telemetry and writes nothing of the sort (a pod's only writable path is its ``/tmp``), so
every module of the project imports onnxruntime through :func:`onnxruntime`, which turns
it off unless the environment already says (``ORT_DISABLE_TELEMETRY``). It is read at
import, so it works when this is the process's first import of onnxruntime: the sidecar's
own processes. Importing the package does not set it: the guardrail client, which imports
the contracts into an LLM service's process, leaves that process's environment alone.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["TELEMETRY_VARIABLE", "onnxruntime"]

TELEMETRY_VARIABLE = "ORT_DISABLE_TELEMETRY"


def onnxruntime() -> Any:
    """The ``onnxruntime`` module, its telemetry off unless ``ORT_DISABLE_TELEMETRY`` is set."""
    os.environ.setdefault(TELEMETRY_VARIABLE, "1")
    import onnxruntime as ort  # noqa: PLC0415 - after the variable

    return ort
