"""The commit cut: no request's records on both sides of it (Hypothesis + the straddle case)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kafka.cut import KeyIndex

R, G = "rag.retrieval", "rag.generation"


def test_a_short_request_inside_a_long_one_is_re_read_whole() -> None:
    keys = KeyIndex((R, G))
    # H (long) starts, R (short) starts and finishes, H still open
    for offset, key in enumerate([b"H", b"S"]):
        keys.note(R, 0, offset, key)
    for offset, key in enumerate([b"S", b"S"]):
        keys.note(G, 0, offset, key)
    low = {(R, 0): 0, (G, 0): 2}  # H's retrieval pending; S's generation all done
    # per partition, S's retrieval would be re-read without its generation
    assert keys.cut(low) == {(R, 0): 0, (G, 0): 0}
    # nothing open: the marks stand
    assert keys.cut({(R, 0): 2, (G, 0): 2}) == {(R, 0): 2, (G, 0): 2}


def test_other_partition_numbers_and_topics_are_left_alone() -> None:
    keys = KeyIndex((R, G))
    keys.note(R, 1, 5, b"x")
    keys.note(G, 0, 3, b"x")  # same key on another partition number: not the same join
    keys.note("rag.feedback", 0, 0, b"x")
    low = {(R, 1): 5, (G, 0): 4, ("rag.feedback", 0): 1}
    assert keys.cut(low) == low
    assert keys.partners({(R, 1)}) == {(R, 1), (G, 1)}


def test_committed_keys_are_forgotten_so_a_cut_never_goes_back() -> None:
    keys = KeyIndex((R, G))
    keys.note(R, 0, 0, b"a")
    keys.note(G, 0, 0, b"a")
    keys.committed({(R, 0): 1, (G, 0): 1})
    assert len(keys) == 0
    keys.note(G, 0, 1, b"a")  # a late event of a committed request
    assert keys.cut({(R, 0): 1, (G, 0): 1}) == {(R, 0): 1, (G, 0): 1}


records = st.lists(
    st.tuples(
        st.sampled_from([R, G]), st.integers(0, 2), st.sampled_from([b"a", b"b", b"c", b"d"])
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(records=records, marks=st.lists(st.integers(0, 40), min_size=6, max_size=6))
def test_no_key_straddles_the_cut_and_marks_only_go_down(
    records: list[tuple[str, int, bytes]], marks: list[int]
) -> None:
    keys = KeyIndex((R, G))
    next_offset: dict[tuple[str, int], int] = {}
    placed: list[tuple[tuple[str, int], int, bytes]] = []
    for topic, p, key in records:
        offset = next_offset.get((topic, p), 0)
        next_offset[(topic, p)] = offset + 1
        keys.note(topic, p, offset, key)
        placed.append(((topic, p), offset, key))
    low = {(t, p): marks[i * 3 + p] for i, t in enumerate((R, G)) for p in range(3)}
    cut = keys.cut(low)
    assert all(cut[tp] <= low[tp] for tp in low)
    for p in range(3):
        above = {k for tp, o, k in placed if tp[1] == p and o >= cut[tp]}
        below = {k for tp, o, k in placed if tp[1] == p and o < cut[tp]}
        assert not above & below
