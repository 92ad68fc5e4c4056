"""What the fast-path sketches' tests share: a verdict's key paths, a batch with one
event rewritten, and the rewrites each sketch must refuse."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from sidecar.pipeline.processor import BatchItem


def keys(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON object (lists: their first element's)."""
    if isinstance(value, list):
        return keys(value[0], prefix + "[]") if value else set()
    if not isinstance(value, dict):
        return set()
    out = set()
    for key, inner in value.items():
        out.add(prefix + key)
        out |= keys(inner, prefix + key + ".")
    return out


def edited(items: list[BatchItem], kind: str, edit: Any) -> list[BatchItem]:
    """``items`` with the record of ``event_type`` ``kind`` rewritten by ``edit``."""
    out: list[BatchItem] = []
    for item_kind, raw, key, ref in items:
        event = orjson.loads(raw or b"{}")
        if event.get("event_type") == kind:
            edit(event)
        out.append((item_kind, orjson.dumps(event), key, ref))
    return out


def absurd_score(event: dict[str, Any]) -> None:
    event["hits"][0]["score"] = 1e300


def nan_attention(event: dict[str, Any]) -> None:
    att = event["attention"]
    values = np.frombuffer(base64.b64decode(att["values"]), dtype=np.float16).copy()
    values[5] = np.nan
    att["values"] = base64.b64encode(values.tobytes()).decode()


def wrong_shape(event: dict[str, Any]) -> None:
    event["attention"]["heads"] += 1


def unknown_type(event: dict[str, Any]) -> None:
    event["event_type"] = "generation.other"


# (event type rewritten, the rewrite, the reason counted, verdicts left for one request)
REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], str, int]] = [
    ("retrieval", absurd_score, "score", 0),
    ("generation.final", nan_attention, "values", 0),
    ("generation.final", wrong_shape, "shape", 0),
    ("generation.delta", unknown_type, "event_type", 1),  # retrieval + final: decided
]
