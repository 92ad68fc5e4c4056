"""The one file / folder sha256 helper."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sidecar.hashing import sha256_file, sha256_tree


def test_a_file_hash_is_the_sha256_of_its_bytes_across_read_blocks(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # > 1 MiB: more than one read block
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(path)) == sha256_file(path)


def test_a_tree_hash_covers_names_and_contents_in_sorted_order(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_text("two")
    (root / "sub" / "a.txt").write_text("one")
    expected = hashlib.sha256()
    for name, body in (("b.txt", b"two"), ("sub/a.txt", b"one")):
        expected.update(name.encode())
        expected.update(hashlib.sha256(body).digest())
    assert sha256_tree(root) == expected.hexdigest()
    before = sha256_tree(root)
    (root / "b.txt").rename(root / "c.txt")
    assert sha256_tree(root) != before


def test_a_tree_hash_of_one_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text("{}\n")
    expected = hashlib.sha256(b"one.jsonl" + hashlib.sha256(b"{}\n").digest()).hexdigest()
    assert sha256_tree(path) == expected
