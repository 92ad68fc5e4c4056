"""Golden outputs: a shipped model shows at load that it still computes what it computed at export.

The same ONNX file does not give bit-identical outputs on every x86 CPU.
onnxruntime picks its kernels by instruction set (SSE, AVX2, AVX-512, AVX-512
VNNI, AVX-VNNI, AMX), and floating-point sums in another order differ in the
last bits. Dynamic u8 x s8 quantisation differs by much more: without VNNI the
AVX2 / AVX-512BW kernels multiply with ``vpmaddubsw``, whose int16 pair sums
saturate, so an int8 model measured on one node can give other verdicts on
another node of the same cluster.

Each shipped artifact therefore keeps a few inputs with the outputs its export
computed, and the tolerance they must stay within (:class:`GoldenOutputs`,
stored in the artifact's JSON next to the ONNX file's sha256). The loaders run
the cases through the very session they will serve with and refuse to serve
(:class:`~sidecar.exceptions.ConfigError` naming this CPU's features and the
drift) when an output moved by more than the tolerance. How the tolerance was
chosen is in each model card.

Pure pydantic and the standard library: the loaders compute the outputs, this
module only records and compares them.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from sidecar.exceptions import ConfigError

__all__ = [
    "CPUINFO",
    "KERNEL_FEATURES",
    "GoldenCase",
    "GoldenOutputs",
    "cpu_features",
    "describe_cpu",
    "max_drift",
    "record_golden",
]

CPUINFO: Final = Path("/proc/cpuinfo")
# The x86 features that change which onnxruntime (MLAS) kernels run.
KERNEL_FEATURES: Final = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
)

InputT = TypeVar("InputT")


def cpu_features(cpuinfo: Path = CPUINFO) -> tuple[str, ...] | None:
    """The :data:`KERNEL_FEATURES` this CPU has (``/proc/cpuinfo`` flags); ``None``: unknown."""
    try:
        text = cpuinfo.read_text("utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags = set(value.split())
            return tuple(f for f in KERNEL_FEATURES if f in flags)
    return None


def describe_cpu(cpuinfo: Path = CPUINFO) -> str:
    """``"x86_64 with avx2 fma, without avx512f ..."`` for messages and model cards."""
    machine = platform.machine() or "unknown machine"
    have = cpu_features(cpuinfo)
    if have is None:
        return f"{machine} (no CPU flags readable from {cpuinfo})"
    lacking = [f for f in KERNEL_FEATURES if f not in have]
    with_part = " ".join(have) if have else "none of " + " ".join(KERNEL_FEATURES)
    return f"{machine} with {with_part}" + (f", without {' '.join(lacking)}" if lacking else "")


class GoldenCase(BaseModel, Generic[InputT]):
    """One input and the output the export computed for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: InputT
    output: float = Field(allow_inf_nan=False)


class GoldenOutputs(BaseModel, Generic[InputT]):
    """Reference outputs of a model, the tolerance they must keep and where they were recorded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    output: str = Field(min_length=1, description="what the numbers are (logit, p_factual)")
    tolerance: float = Field(gt=0.0, allow_inf_nan=False, description="max |output - reference|")
    recorded_on: str = Field(description="describe_cpu() of the machine that recorded them")
    cases: list[GoldenCase[InputT]] = Field(min_length=1)

    @property
    def inputs(self) -> list[InputT]:
        return [c.input for c in self.cases]

    @property
    def references(self) -> list[float]:
        return [c.output for c in self.cases]

    def check(self, actual: Sequence[float], *, model: str) -> float:
        """The max drift of ``actual`` from the references; ``ConfigError`` past the tolerance.

        ``actual``: the outputs for :attr:`inputs` on this machine, in case order
        (several runs, e.g. one at a time and as one batch, may be concatenated).
        """
        n = len(self.cases)
        if not actual or len(actual) % n:
            raise ValueError(f"{len(actual)} outputs for {n} golden cases")
        drift = max_drift(self.references * (len(actual) // n), actual)
        if not drift <= self.tolerance:  # NaN fails too
            here = describe_cpu()
            moved = (
                f"{model} computes other outputs than at export: its {self.output} moved by up "
                f"to {drift:.3g} on its {n} golden inputs, more than the allowed "
                f"{self.tolerance:.3g}. This CPU: {here}; recorded on: {self.recorded_on}. "
            )
            if here == self.recorded_on:  # the same kernels: not the CPU (audit: blamed it)
                raise ConfigError(
                    moved + "The CPU features are the same, so the model's files were most "
                    "likely changed since export (its metadata's golden outputs or "
                    "parameters, which its ONNX sha256 does not cover): restore them from the "
                    "release, or re-export the model"
                )
            raise ConfigError(
                moved + "Either this CPU computes differently: run it on a node whose CPU "
                "matches, or re-export the model with outputs that hold on this instruction "
                "set (see its model card); or the model's files were changed since export: "
                "restore them from the release"
            )
        return drift


def max_drift(reference: Sequence[float], actual: Sequence[float]) -> float:
    """max |actual - reference| (NaN when any output is not finite)."""
    if len(reference) != len(actual):
        raise ValueError(f"{len(actual)} outputs for {len(reference)} references")
    diffs = [abs(float(a) - float(r)) for r, a in zip(reference, actual, strict=True)]
    if not all(math.isfinite(d) for d in diffs):
        return math.nan
    return max(diffs, default=0.0)


def record_golden(
    inputs: Sequence[InputT], outputs: Sequence[float], *, output: str, tolerance: float
) -> GoldenOutputs[InputT]:
    """Golden outputs of ``inputs`` as computed now, on this machine."""
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(outputs)} outputs for {len(inputs)} inputs")
    return GoldenOutputs[InputT](
        output=output,
        tolerance=tolerance,
        recorded_on=describe_cpu(),
        cases=[
            GoldenCase[InputT](input=i, output=float(o))
            for i, o in zip(inputs, outputs, strict=True)
        ],
    )
