"""The commit cut: no request's records on both sides of it (Hypothesis + the straddle case).

The cut must also be the *highest* such cut (nothing re-read that need not be): it is
compared with the plain fixpoint below, which rescans the index until no mark moves.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.kafka.cut import KeyIndex

R, G = "rag.retrieval", "rag.generation"


def fixpoint_cut(
    placed: list[tuple[tuple[str, int], int, bytes]], low: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """The reference: lower each mark to the lowest record of any key above a mark, repeat."""
    marks = dict(low)
    while True:
        above = {k for tp, o, k in placed if tp in marks and o >= marks[tp]}
        lowered = False
        for tp, mark in list(marks.items()):
            below = [o for t, o, k in placed if t == tp and o < mark and k in above]
            if below:
                marks[tp] = min(below)
                lowered = True
        if not lowered:
            return marks


def cut_by_partition(
    placed: list[tuple[tuple[str, int], int, bytes]], low: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for p in {tp[1] for tp in low}:
        part = {tp: m for tp, m in low.items() if tp[1] == p}
        out.update(fixpoint_cut([r for r in placed if r[0][1] == p], part))
    return out


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
    assert cut == cut_by_partition(placed, low)  # the highest cut, not merely a safe one
    assert all(cut[tp] <= low[tp] for tp in low)
    for p in range(3):
        above = {k for tp, o, k in placed if tp[1] == p and o >= cut[tp]}
        below = {k for tp, o, k in placed if tp[1] == p and o < cut[tp]}
        assert not above & below


def test_a_staircase_of_keys_is_cut_as_the_fixpoint_cuts_it() -> None:
    """Keys laid so that each lowering uncovers one more key: the mark walks to the bottom.

    (The index's first cut rescanned everything per step: quadratic, 11 s at 16,000
    records, past the session timeout; the worklist visits each record once.)
    """
    n = 300
    top = 2 * n + 2
    keys = KeyIndex((R, G))
    placed: list[tuple[tuple[str, int], int, bytes]] = []

    def note(topic: str, offset: int, key: bytes) -> None:
        keys.note(topic, 0, offset, key)
        placed.append(((topic, 0), offset, key))

    for i in range(n):
        note(R, top - 2 * i - 2, f"k{2 * i}".encode())
        note(R, top - 2 * i - 1, f"k{2 * i + 1}".encode())
        note(G, top - 2 * i - 2, f"k{2 * i + 1}".encode())
        note(G, top - 2 * i - 1, f"k{2 * i + 2}".encode())
    note(G, top, b"k0")  # the open half-request that holds generation's mark
    low = {(R, 0): top, (G, 0): top}
    assert keys.cut(low) == fixpoint_cut(placed, low) == {(R, 0): 2, (G, 0): 2}


def test_a_key_longer_than_any_request_id_is_not_held() -> None:
    """Such a record is dead-lettered (key-mismatch) and can join nothing: held, 1 MiB keys
    would stay in memory while an open request holds the commit back."""
    keys = KeyIndex((R, G))
    keys.note(R, 0, 0, b"k" * 1_000_000)
    keys.note(R, 0, 1, b"r" * 128)  # the longest request id
    assert len(keys) == 1
