"""JSON-lines input for the claim tools: one object per line, errors with file and line."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from sidecar.exceptions import InputError

__all__ = ["iter_json_objects"]

GZIP_MAGIC = b"\x1f\x8b"


def iter_json_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` per non-blank line (a ``.gz`` name or gzip's magic bytes:
    read decompressed).

    A line that is not JSON is ``malformed-json``, one that is not an object
    ``schema-violation``; both name ``path:line``.
    """
    with path.open("rb") as probe:
        gzipped = path.suffix == ".gz" or probe.read(2) == GZIP_MAGIC
    handle: IO[bytes] = (
        gzip.open(path, "rb") if gzipped else path.open("rb")  # type: ignore[assignment]
    )
    with handle:
        try:
            for lineno, raw in enumerate(handle, 1):
                try:
                    # a BOM before the first line is read as nothing (utf-8-sig)
                    line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise InputError(
                        "invalid-utf8",
                        f"{path}:{lineno}: not UTF-8 (byte {raw[exc.start]:#04x} at column "
                        f"{exc.start + 1}); JSON lines files must be UTF-8",
                    ) from None
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(
                        "malformed-json", f"{path}:{lineno}: {exc.msg} (column {exc.colno})"
                    ) from None
                except (RecursionError, ValueError) as exc:  # too deep; an int of > 4300 digits
                    raise InputError(
                        "malformed-json", f"{path}:{lineno}: not usable JSON ({exc})"
                    ) from None
                if not isinstance(obj, dict):
                    raise InputError(
                        "schema-violation",
                        f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}",
                    )
                yield lineno, obj
        except (gzip.BadGzipFile, EOFError) as exc:
            raise InputError("malformed-gzip", f"{path}: not a readable .gz file ({exc})") from None
