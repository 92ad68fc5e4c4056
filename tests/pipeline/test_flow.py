"""Input alignment: which co-partition the consumer pauses while it catches up."""

from __future__ import annotations

import pytest

from sidecar.pipeline.flow import (
    CONFIRMING,
    FUTURE_TOLERANCE_MS,
    WINDOW,
    FlowDecision,
    InputAligner,
)

R, G = "rag.retrieval", "rag.generation"
PAIRS = {(R, 0), (G, 0), (R, 1), (G, 1)}


def backlog_of(**lag: int) -> dict[tuple[str, int], int]:
    """``r0=5, g1=2`` -> {(R, 0): 5, (G, 1): 2}."""
    topic = {"r": R, "g": G}
    return {(topic[name[0]], int(name[1:])): n for name, n in lag.items()}


def observe(aligner: InputAligner, topic: str, partition: int, timestamp_ms: int) -> None:
    """Records of ``topic[partition]`` at ``timestamp_ms``: enough of them to be its time."""
    for _ in range(CONFIRMING):
        aligner.observe(topic, partition, timestamp_ms)


def decide(aligner: InputAligner, **lag: int) -> FlowDecision:
    table = backlog_of(**lag)
    return aligner.decide(PAIRS, lambda tp: table.get(tp, 0))


def test_the_side_ahead_in_time_pauses_while_its_partner_has_a_backlog() -> None:
    a = InputAligner(R, G, slack_ms=1000)
    observe(a, R, 0, 10_000)
    observe(a, G, 0, 8_500)  # generation[0] is 1.5 s behind and has records to read
    d = decide(a, g0=40)
    assert d.pause == {(R, 0)}
    assert not d.resume
    assert a.paused == {(R, 0)}
    assert a.pauses == 1
    # nothing changes while the gap stays over half the slack (hysteresis) ...
    observe(a, G, 0, 9_400)
    assert not decide(a, g0=20)
    # ... and the partition resumes once the partner is within half the slack
    observe(a, G, 0, 9_600)
    d = decide(a, g0=10)
    assert d.resume == {(R, 0)}
    assert not d.pause
    assert a.paused == frozenset()


def test_generation_ahead_pauses_generation() -> None:
    a = InputAligner(R, G, slack_ms=500)
    observe(a, G, 1, 5_000)
    observe(a, R, 1, 1_000)
    assert decide(a, r1=3).pause == {(G, 1)}


def test_a_caught_up_partner_never_holds_the_other_side() -> None:
    """A request whose other half never comes must not stall its partition."""
    a = InputAligner(R, G, slack_ms=1000)
    observe(a, R, 0, 60_000)
    observe(a, G, 0, 1_000)
    assert not decide(a)  # generation[0] has nothing left to read: no pause
    assert decide(a, g0=1).pause == {(R, 0)}
    assert decide(a, g0=0).resume == {(R, 0)}  # partner drained: resume at once


def test_a_partner_with_a_backlog_and_nothing_consumed_is_behind() -> None:
    a = InputAligner(R, G, slack_ms=1000)
    observe(a, R, 0, 5)
    assert decide(a, g0=100).pause == {(R, 0)}


def test_within_the_slack_nothing_pauses() -> None:
    a = InputAligner(R, G, slack_ms=1000)
    observe(a, R, 0, 2_000)
    observe(a, G, 0, 1_000)  # exactly the slack: not beyond it
    assert not decide(a, g0=10, r0=10)


def test_partitions_are_independent() -> None:
    a = InputAligner(R, G, slack_ms=100)
    observe(a, R, 0, 1_000)
    observe(a, G, 0, 0)
    observe(a, R, 1, 0)
    observe(a, G, 1, 1_000)
    d = decide(a, g0=1, r1=1)
    assert d.pause == {(R, 0), (G, 1)}


def test_only_assigned_pairs_count_and_revoked_state_is_forgotten() -> None:
    a = InputAligner(R, G, slack_ms=100)
    observe(a, R, 0, 1_000)
    observe(a, G, 0, 0)
    assert decide(a, g0=5).pause == {(R, 0)}
    # generation[0] went to another instance: the pair is incomplete here, no decision
    d = a.decide({(R, 0)}, lambda tp: 5)
    assert d.resume == {(R, 0)}
    a.forget({(R, 0), (G, 0)})
    assert a.paused == frozenset()
    assert not decide(a, g0=5)  # nothing consumed on either side any more
    # a partition this consumer lost while paused leaves the paused set without a resume
    observe(a, R, 1, 1_000)
    observe(a, G, 1, 0)
    assert decide(a, g1=5).pause == {(R, 1)}
    assert not a.decide({(R, 0), (G, 0)}, lambda tp: 5)
    assert a.paused == frozenset()


def test_observe_ignores_other_topics_and_missing_timestamps() -> None:
    a = InputAligner(R, G, slack_ms=100)
    a.observe("rag.feedback", 0, 10_000)
    a.observe(R, 0, None)
    a.observe(R, 0, -1)  # Kafka's "no timestamp"
    a.observe(G, 0, 0)
    assert not decide(a, g0=5)  # retrieval[0] has no clock: feedback and bad stamps are ignored
    observe(a, R, 0, 500)
    a.observe(R, 0, 200)  # an older record does not move the clock back
    assert decide(a, g0=5).pause == {(R, 0)}


@pytest.mark.parametrize(
    ("left", "right", "slack", "backlog"), [(R, R, 100, 1), (R, G, -5, 1), (R, G, 0, 0)]
)
def test_invalid_construction(left: str, right: str, slack: int, backlog: int) -> None:
    with pytest.raises(ValueError, match=r"differ|slack_ms|min_backlog"):
        InputAligner(left, right, slack_ms=slack, min_backlog=backlog)


def test_by_default_any_lead_pauses_the_leading_side_until_level() -> None:
    """A burst packs a whole backlog into a second: the default keeps the sides level."""
    a = InputAligner(R, G)
    observe(a, R, 0, 1_001)
    observe(a, G, 0, 1_000)
    assert decide(a, g0=10).pause == {(R, 0)}
    observe(a, G, 0, 1_001)  # level: resume
    assert decide(a, g0=10).resume == {(R, 0)}


def test_a_partner_must_be_a_batch_behind() -> None:
    """A live stream's few records in flight never cause a pause."""
    a = InputAligner(R, G, min_backlog=50)
    observe(a, R, 0, 1_300)
    observe(a, G, 0, 1_000)
    assert not decide(a, g0=49)
    assert decide(a, g0=50).pause == {(R, 0)}
    assert decide(a, g0=49).resume == {(R, 0)}


def test_one_record_cannot_move_a_side() -> None:
    """A junk record stamped 59 minutes ahead (Kafka 4 accepts up to an hour) made its side
    ahead for the rest of a catch-up: 970 of 1,500 backlog requests came out incomplete.
    Now a side's time is where CONFIRMING of its last WINDOW records are, and a record more
    than FUTURE_TOLERANCE_MS ahead of the wall clock is not event time at all."""
    now = 1_800_000_000_000
    a = InputAligner(R, G, slack_ms=1000, wall_ms=lambda: now)
    observe(a, R, 0, now - 60_000)
    observe(a, G, 0, now - 60_000)
    a.observe(G, 0, now + 59 * 60_000)  # junk from the future: ignored
    a.observe(G, 0, now + FUTURE_TOLERANCE_MS + 1)
    assert a.future == 2
    for _ in range(CONFIRMING - 1):  # in range, but fewer than CONFIRMING records
        a.observe(R, 0, now)
    assert not decide(a, g0=500, r0=500)
    assert a.event_time((R, 0)) == now - 60_000
    a.observe(R, 0, now)  # the CONFIRMING-th: retrieval[0] is a minute ahead now
    assert decide(a, g0=500).pause == {(R, 0)}
    for _ in range(WINDOW):  # the window moves on: older records take its place again
        a.observe(R, 0, now - 60_000)
    assert decide(a, g0=500).resume == {(R, 0)}
    # a flood from the future is ignored however long it lasts
    for _ in range(10 * WINDOW):
        a.observe(G, 0, now + 3_600_000)
    assert a.event_time((G, 0)) == now - 60_000


def test_a_skewed_clock_cannot_hold_a_side_for_the_partners_whole_backlog() -> None:
    """Generation's producer clock 10 minutes behind retrieval's: retrieval was "ahead" and
    stayed paused until generation's whole backlog was read, so the join store filled with
    final-only halves (audit: 1,177 of 1,500 backlog requests incomplete, as with alignment
    off). After ``max_lead_records`` partner records the gap is taken for skew."""
    skew = 10 * 60_000
    a = InputAligner(R, G, min_backlog=1, max_lead_records=20)
    observe(a, R, 0, 1_000_000)
    observe(a, G, 0, 1_000_000 - skew)
    assert decide(a, g0=500).pause == {(R, 0)}
    for i in range(19):  # the partner is read, and stays 10 minutes behind
        a.observe(G, 0, 1_000_000 - skew + i)
    assert not decide(a, g0=481)  # within the budget: the pause holds
    a.observe(G, 0, 1_000_000 - skew + 19)
    d = decide(a, g0=480)
    assert d.resume == {(R, 0)} and not d.pause
    assert a.skews == 1
    assert a.skew_ms(0) == -(skew - 19 + CONFIRMING - 1)  # generation runs behind
    # from now on the sides are compared net of the skew: a real lead still pauses
    observe(a, R, 0, 1_000_000 + 5_000)
    assert decide(a, g0=480).pause == {(R, 0)}
    observe(a, G, 0, 1_000_000 + 5_000 - skew + 19)
    assert decide(a, g0=400).resume == {(R, 0)}
    a.forget({(R, 0), (G, 0)})
    assert a.skew_ms(0) == 0


def test_a_partner_without_any_usable_timestamp_leaves_the_pair_unaligned() -> None:
    """Every generation record stamped beyond the tolerance (a clock 10 minutes ahead, or
    year 2100): generation has no event time and counted as behind for its whole backlog."""
    now = 1_800_000_000_000
    a = InputAligner(R, G, min_backlog=1, max_lead_records=10, wall_ms=lambda: now)
    observe(a, R, 0, now)
    assert decide(a, g0=500).pause == {(R, 0)}
    for _ in range(10):
        a.observe(G, 0, now + 10 * 60_000)
    assert a.event_time((G, 0)) is None
    assert decide(a, g0=490).resume == {(R, 0)}
    assert not decide(a, g0=480)  # and it is not paused again
    observe(a, G, 0, now - 1_000)  # generation has a time again: aligned as before
    observe(a, R, 0, now + 1_000)
    assert decide(a, g0=480).pause == {(R, 0)}


def test_without_a_budget_a_pause_holds_while_the_partner_has_a_backlog() -> None:
    a = InputAligner(R, G, min_backlog=1)
    observe(a, R, 0, 1_000_000)
    observe(a, G, 0, 400_000)
    assert decide(a, g0=5_000).pause == {(R, 0)}
    for _ in range(1_000):
        a.observe(G, 0, 400_000)
    assert not decide(a, g0=4_000)
    assert a.paused == {(R, 0)}
    with pytest.raises(ValueError, match="max_lead_records"):
        InputAligner(R, G, max_lead_records=0)
