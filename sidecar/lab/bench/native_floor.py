"""The dict floor's sketch compiled outside the interpreter: the native floor (#22).

``bench/native_floor/`` (Rust, pyo3) does per record and per batch what
:class:`~sidecar.lab.bench.dict_floor.DictFloor` does in CPython (the JSON read, the
checks, the digest for duplicates, the join; the lookback matrix, the attention shares,
the confidence matrices, one verdict of the sidecar's shape per request), and hands
its matrices to the same served models, one call each a batch. It measures the lever
the README left unmeasured: whether deciding outside the interpreter leaves the drain
near the no-op's. A floor, as the dict floor is: it skips what that one skips.

:func:`build` compiles it with cargo (``make native-floor``; crates from crates.io);
``python -m sidecar.lab.bench.floors native`` serves it in the no-op loop.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from sidecar.confidence.features import ANSWER_FEATURES, CHUNK_FEATURES
from sidecar.exceptions import ConfigError
from sidecar.pipeline.processor import BatchItem, Processor

__all__ = ["CRATE", "LIBRARY", "NativeFloor", "build", "cargo", "library", "load"]

REPO = Path(__file__).resolve().parents[3]
CRATE = REPO / "bench" / "native_floor"
LIBRARY = REPO / ".native" / "native_floor.so"  # built here (git-ignored)
LIBRARY_ENV = "NATIVE_FLOOR_LIBRARY"  # not GUARDRAIL_*: the settings refuse unknown names


def cargo() -> str | None:
    """cargo on PATH, else rustup's (``~/.cargo/bin``, not always on a shell's PATH)."""
    home = Path.home() / ".cargo" / "bin" / "cargo"
    return shutil.which("cargo") or (str(home) if home.is_file() else None)


def build(out: Path = LIBRARY) -> Path:
    """Compile the crate (release) and copy its library to ``out``; returns ``out``."""
    found = cargo()
    if found is None:
        raise ConfigError("the native floor is built with cargo (Rust): no cargo on PATH")
    subprocess.run(
        [found, "build", "--release", "--quiet", "--manifest-path", str(CRATE / "Cargo.toml")],
        check=True,
        # pyo3 builds for the interpreter it is told (else the first python3 on PATH,
        # perhaps another version than the one that will load it)
        env={
            **os.environ,
            "CARGO_TARGET_DIR": str(CRATE / "target"),
            "PYO3_PYTHON": sys.executable,
        },
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CRATE / "target" / "release" / "libnative_floor.so", out)
    return out


def library() -> Path:
    """Where the floor's process loads it from: ``$NATIVE_FLOOR_LIBRARY``, else
    ``.native/native_floor.so``."""
    return Path(os.environ.get(LIBRARY_ENV) or LIBRARY)


def load(path: Path | None = None) -> Any:
    """The compiled module at ``path`` (default: :func:`library`)."""
    where = path or library()
    if not where.is_file():
        raise ConfigError(f"no native floor at {where}: build it with `make native-floor`")
    loader = importlib.machinery.ExtensionFileLoader("native_floor", str(where))
    spec = importlib.util.spec_from_loader("native_floor", loader)
    if spec is None:  # pragma: no cover - a loader always gives a spec
        raise ConfigError(f"{where} is not a Python extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class NativeFloor:
    """:class:`~sidecar.lab.bench.dict_floor.DictFloor`'s interface over the compiled sketch."""

    def __init__(self, processor: Processor, module: Any | None = None) -> None:
        signals = processor.signals
        if signals.lookback is None or signals.confidence is None:
            raise ConfigError(
                "the native floor scores with the served lookback and confidence models: "
                "configure both (GUARDRAIL_SIGNALS__LOOKBACK, GUARDRAIL_SIGNALS__CONFIDENCE)"
            )
        self.lookback = cast(Any, signals.lookback)
        self.confidence = cast(Any, signals.confidence)
        meta = self.lookback.metadata
        self.width = meta.layers * meta.heads * meta.chunks
        self.q_hat = 0.586
        native = module if module is not None else load()
        self.sketch = native.NativeFloor(
            meta.layers, meta.heads, meta.chunks, self.q_hat, list(ANSWER_FEATURES)
        )

    @property
    def refused(self) -> dict[str, int]:
        return cast(dict[str, int], self.sketch.refused())

    def on_batch(self, items: Sequence[BatchItem]) -> list[tuple[str, bytes, bytes]]:
        """The verdicts of the requests ``items`` complete: (topic, key, value)."""
        sketch = self.sketch
        n = sketch.admit_batch(items if type(items) is list else list(items))
        if not n:
            return []
        rows = np.frombuffer(sketch.lookback_rows(), dtype=np.float32).reshape(n, self.width)
        p_factual = np.ascontiguousarray(self.lookback._run(rows), dtype=np.float64)
        answers, chunks = sketch.confidence_rows(p_factual.tobytes())
        p_correct = self.confidence.answer.predict_matrix(
            np.frombuffer(answers, dtype=np.float64).reshape(n, len(ANSWER_FEATURES))
        )
        trusted = np.frombuffer(chunks, dtype=np.float64).reshape(-1, len(CHUNK_FEATURES))
        p_useful = (
            self.confidence.chunks.predict_matrix(trusted)
            if len(trusted)
            else np.empty(0, dtype=np.float64)
        )
        verdicts = sketch.verdicts(
            p_factual.tobytes(),
            np.ascontiguousarray(p_correct, dtype=np.float64).tobytes(),
            np.ascontiguousarray(p_useful, dtype=np.float64).tobytes(),
        )
        return [("rag.verdicts", key, value) for key, value in verdicts]
