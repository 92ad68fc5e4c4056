"""Checks of the client's call arguments, with messages that say what is allowed."""

from __future__ import annotations

import difflib
import inspect
import math
import re
from collections.abc import Mapping
from typing import Any

from guardrail_client.exceptions import InvalidArgumentError
from sidecar.contracts.common import REQUEST_ID_MAX_CHARS, REQUEST_ID_PATTERN

_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)


def checked_request_id(value: object) -> str:
    """``value`` when it is a request id the contract allows; else
    :class:`InvalidArgumentError` saying what is allowed (such an id's events could never
    be published, so a wait for its verdict would only ever time out)."""
    if (
        not isinstance(value, str)
        or len(value) > REQUEST_ID_MAX_CHARS
        or _REQUEST_ID.fullmatch(value) is None
    ):
        raise InvalidArgumentError(
            f"request_id must be 1 to {REQUEST_ID_MAX_CHARS} characters of A-Z a-z 0-9 . _ : - "
            f"with at least one letter or digit, got {value!r}"
        )
    return value


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


def _keywords(function: Any) -> list[str]:
    """The names ``function`` takes by keyword (not ``self``, not ``**kwargs``)."""
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if name != "self" and parameter.kind in kinds
    ]


def checked_options(owner: type, client: type, options: Mapping[str, Any]) -> None:
    """Every key of ``options`` is a keyword of ``client`` (aiokafka's producer or
    consumer); else :class:`InvalidArgumentError` naming the closest of ``owner``'s own
    arguments and ``client``'s (a misspelt option used to pass the constructor and fail
    only at ``start()`` with a ``TypeError``)."""
    allowed = _keywords(client)
    unknown = [key for key in options if key not in allowed]
    if unknown:
        known = allowed + _keywords(owner)
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise InvalidArgumentError(
            f"{owner.__name__}: unknown option(s) {', '.join(hints)}; besides its own "
            f"arguments it passes these to {client.__name__}: {', '.join(sorted(allowed))}"
        )
