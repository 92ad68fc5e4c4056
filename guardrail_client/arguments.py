"""Checks of the client's call arguments, with messages that say what is allowed."""

from __future__ import annotations

import math

from guardrail_client.exceptions import InvalidArgumentError


def checked_timeout(name: str, value: float, *, allow_zero: bool = True) -> float:
    """``value`` when it is a finite number of seconds ``>= 0`` (``> 0`` without
    ``allow_zero``); else :class:`InvalidArgumentError` naming ``name``.

    ``nan`` and ``inf`` are refused: ``nan`` makes asyncio's deadline undefined, and an
    endless wait never reaches the ``on_timeout`` fallback (nor the end of a flush).
    """
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (is_number and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        allowed = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds {allowed}, got {value!r}"
        )
    return float(value)
