"""sha256 of a file or a folder on disk: the one helper behind every artifact and data hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["sha256_file", "sha256_tree"]

_BLOCK = 1 << 20


def _file_digest(path: Path) -> hashlib._Hash:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    return _file_digest(Path(path)).hexdigest()


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
