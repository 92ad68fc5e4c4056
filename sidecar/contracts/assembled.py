"""Contract models built from values their caller has checked: a third of a validated build.

pydantic's validating ``__init__`` cost ~7 us for the 14 fields of a retrieval signal
on the serving path (a few fields need checking; the rest are typed by the code that
computes them), and ``model_construct`` more (it is Python). Where the caller has
checked that every value is what validation would return unchanged (its exact type,
its range, finite), :func:`assembled` builds the instance validation would have built:
the same ``__dict__`` in field order, every field set, no extras, no private state.
Values that fail the caller's check are built validated, which coerces or raises as
before.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["assembled", "unit_float"]

M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


def assembled(cls: type[M], values: dict[str, Any]) -> M:
    """``cls(**values)`` without validation: ``values`` holds every field of ``cls``, in its
    order, each already what validation returns for it (the caller has checked)."""
    model = cls.__new__(cls)
    _set(model, "__dict__", values)
    _set(model, "__pydantic_fields_set__", set(values))
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)
    return model


def unit_float(value: object) -> bool:
    """A float in [0, 1] (not NaN): what a ``Probability`` field returns unchanged."""
    return type(value) is float and 0.0 <= value <= 1.0
