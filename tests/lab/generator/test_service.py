"""Token-by-token delta streaming of the demo service."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.lab.generator.service import stream_deltas

PIECES = {1: " The", 2: " caf", 3: "\xc3", 4: "\xa9", 5: " is", 6: " open."}


def decode(ids: Sequence[int]) -> str:
    raw = "".join(PIECES[i] for i in ids).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


def test_deltas_concatenate_to_the_answer_and_never_split_a_character() -> None:
    ids = [1, 2, 3, 4, 5, 6]
    pieces = stream_deltas(decode, ids)
    assert "".join(pieces) == decode(ids).lstrip() == "The café is open."
    assert all("\ufffd" not in p for p in pieces)
    assert pieces == ["The", " caf", "é", " is", " open."]
    assert stream_deltas(decode, []) == []
