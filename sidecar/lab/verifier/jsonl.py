"""JSON-lines input for the claim tools: one object per line, errors with file and line."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from sidecar.exceptions import InputError

__all__ = ["iter_json_objects"]


def iter_json_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` per non-blank line (``.gz`` read decompressed).

    A line that is not JSON is ``malformed-json``, one that is not an object
    ``schema-violation``; both name ``path:line``.
    """
    handle: IO[str]
    handle = (
        gzip.open(path, "rt", encoding="utf-8")
        if path.suffix == ".gz"
        else path.open(encoding="utf-8")
    )
    with handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError("malformed-json", f"{path}:{lineno}: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise InputError("schema-violation", f"{path}:{lineno}: expected an object")
            yield lineno, obj
