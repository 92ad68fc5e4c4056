"""JSON values compared as the tests that hold outputs to a reference compare them."""

from __future__ import annotations

import math
from typing import Any


def same_json(
    got: Any, want: Any, where: str = "", *, rel_tol: float = 1e-9, abs_tol: float = 1e-12
) -> None:
    """Equal, floats to ``rel_tol`` relative or ``abs_tol`` absolute, dict keys in the same
    order, every value of the same type."""
    if isinstance(want, float) and isinstance(got, float):
        close = math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol)
        assert close, f"{where}: {got} != {want}"
        return
    assert type(got) is type(want), f"{where}: {got!r} != {want!r}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            same_json(got[k], want[k], f"{where}.{k}", rel_tol=rel_tol, abs_tol=abs_tol)
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: {len(got)} items != {len(want)}"
        for n, (g, w) in enumerate(zip(got, want, strict=True)):
            same_json(g, w, f"{where}[{n}]", rel_tol=rel_tol, abs_tol=abs_tol)
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"
