"""sha256 of a file or a folder on disk: the one helper behind every artifact and data hash;
and what makes a path unfit to be read as one (a FIFO blocks the reader forever)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

__all__ = ["not_a_regular_file", "sha256_file", "sha256_or_empty", "sha256_tree"]

_BLOCK = 1 << 20


def not_a_regular_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file's bytes (``None``: it can). A FIFO, a device or
    a socket would block its reader, or never end: a start must refuse it, not hang."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read: {exc}"
    if stat.S_ISREG(mode):
        return None
    kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else None
    return f"is not a regular file ({kind or 'a device or socket'})"


def _file_digest(path: Path) -> hashlib._Hash:
    problem = not_a_regular_file(path)
    if problem is not None:
        raise OSError(f"{path} {problem}")
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    return _file_digest(Path(path)).hexdigest()


def sha256_or_empty(path: str | Path) -> str:
    """:func:`sha256_file`, or ``""`` when the file cannot be read (what a watch compares:
    a file gone or unreadable differs from every readable one)."""
    try:
        return sha256_file(path)
    except OSError:
        return ""


def sha256_tree(path: str | Path) -> str:
    """Hex sha256 of a file, or of a folder's files: each relative name, then its bytes' sha256.

    Files are taken in sorted order; a single file contributes its own name. A renamed file
    therefore changes the hash, as a changed byte does.
    """
    root = Path(path)
    digest = hashlib.sha256()
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    for f in files:
        digest.update(str(f.relative_to(root) if f != root else f.name).encode("utf-8"))
        digest.update(_file_digest(f).digest())
    return digest.hexdigest()
