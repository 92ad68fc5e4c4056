"""A request's deltas: the stream they grow and the duplicate checks of each, in any order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.pipeline.join import PendingRequest

_TEXTS = st.sampled_from(["", "a", "ab", "b", "é", "\ud800", "The value 0 is 1000. "])


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    sends=st.lists(st.tuples(st.integers(0, 6), _TEXTS), max_size=20),
    probes=st.lists(st.tuples(st.integers(0, 7), _TEXTS), max_size=10),
)
def test_deltas_in_any_order_stream_and_compare_as_their_texts(
    sends: list[tuple[int, str]], probes: list[tuple[int, str]]
) -> None:
    """Whatever order deltas come in, and whether a delta is kept as its text or as a
    digest once appended, ``same_delta`` answers as comparing the texts would, and the
    stream is the contiguous texts joined."""
    entry = PendingRequest(request_id="r-1", first_seen_ms=0.0)
    held: dict[int, str] = {}  # what a reference keeps: every delta's text
    for seq, text in sends:
        if seq in held:  # intake holds a seq once (a second copy is a duplicate or a conflict)
            assert entry.same_delta(seq, text) == (held[seq] == text)
            continue
        assert entry.same_delta(seq, text) is None
        entry.add_delta(seq, text)
        held[seq] = text
    contiguous = 0
    while contiguous in held:
        contiguous += 1
    assert entry.next_seq == contiguous
    assert entry.streamed == "".join(held[s] for s in range(contiguous))
    assert entry.held_chars == sum(len(t) for s, t in held.items() if s >= contiguous)
    for seq, text in probes:
        want = None if seq not in held else held[seq] == text
        assert entry.same_delta(seq, text) == want


def test_a_delta_that_is_a_piece_by_itself_is_held_once_without_a_digest() -> None:
    """In order, each delta is the stream's piece: ``deltas`` keeps that very object (no
    copy, no digest); deltas that fill a gap are joined into one piece and kept as
    digests (their texts are not held twice)."""
    entry = PendingRequest(request_id="r-1", first_seen_ms=0.0)
    entry.add_delta(0, "The value ")
    assert entry.deltas[0] is entry.parts[0]
    entry.add_delta(2, "1000.")  # ahead of a gap: its text, not streamed yet
    assert entry.deltas[2] == "1000." and entry.held_chars == 5
    assert entry.add_delta(1, "is ") == "is 1000."
    kept: dict[int, str | bytes] = dict(entry.deltas)
    assert isinstance(kept[1], bytes) and isinstance(kept[2], bytes)
    assert entry.same_delta(1, "is ") and not entry.same_delta(1, "is")
    assert entry.same_delta(2, "1000.") and entry.same_delta(0, "The value ")
    assert entry.streamed == "The value is 1000."
