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
    assert decide(a, r0=500, g0=500).pause == {(R, 0)}  # both sides have a backlog
    for i in range(19):  # the partner is read, and stays 10 minutes behind
        a.observe(G, 0, 1_000_000 - skew + i)
    assert not decide(a, g0=481)  # within the budget: the pause holds
    a.observe(G, 0, 1_000_000 - skew + 19)
    d = decide(a, g0=480)
    assert d.resume == {(R, 0)} and not d.pause
    assert a.skews == 1
    # generation runs behind: the median of its last WINDOW stamps (+4 .. +19) is +12
    assert a.skew_ms(0) == -(skew - 12)
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
    assert decide(a, r0=500, g0=500).pause == {(R, 0)}  # both sides have a backlog
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


def drain(
    a: InputAligner,
    requests: int,
    per_answer: int,
    fetch: int,
    poll: int,
    gen_skew_ms: int = 0,
    junk: range = range(0),
) -> int:
    """A backlog of ``requests`` on partition 0, read the way the consumer reads it: a
    retrieval fetch of ``fetch`` records (big records, one per request), a generation poll
    of ``poll`` (``per_answer`` small records per request, stamped 3 s after its retrieval,
    plus ``gen_skew_ms``), then a decision. Returns the most requests that retrieval ran
    ahead of generation beyond those 3 s, i.e. the half-requests the store held."""
    start = 1_700_000_000_000
    ret = [start + i * 20 for i in range(requests)]  # 50 requests/s
    gen = [t + 3_000 + gen_skew_ms for t in ret for _ in range(per_answer)]
    for i in junk:  # retrieval records stamped 4 minutes ahead (after gen is stamped)
        ret[i] += 240_000
    r = g = most = 0
    while r < len(ret) or g < len(gen):
        if (R, 0) not in a.paused:
            for ts in ret[r : r + fetch]:
                a.observe(R, 0, ts)
            r = min(len(ret), r + fetch)
        if (G, 0) not in a.paused:
            for ts in gen[g : g + poll]:
                a.observe(G, 0, ts)
            g = min(len(gen), g + poll)
        left = {(R, 0): len(ret) - r, (G, 0): len(gen) - g}
        a.decide({(R, 0), (G, 0)}, left.__getitem__)
        most = max(most, abs(r - g // per_answer - 3_000 // 20))
    return most


def test_a_streaming_backlog_is_not_taken_for_clock_skew() -> None:
    """101 generation records per answer (100 deltas and the final), identical clocks, a
    retrieval fetch of 40 records: generation needs 4,040 records to level one fetch, more
    than a budget of 500. Every pause ran out, its gap was taken for skew and added to the
    last, and retrieval ran further ahead at each (audit, real broker, 3,000 requests,
    store 1,000: skew "learned" -35 s, 1,561 incomplete; base 0)."""
    a = InputAligner(R, G, min_backlog=500, max_lead_records=500)
    most = drain(a, requests=3_000, per_answer=101, fetch=40, poll=500)
    assert a.pauses > 20
    assert a.skews == 0
    assert a.skew_ms(0) == 0
    b = InputAligner(R, G, min_backlog=500)  # no budget at all: as far apart
    assert most == drain(b, requests=3_000, per_answer=101, fetch=40, poll=500) <= 500


def test_a_few_records_per_answer_stay_level() -> None:
    a = InputAligner(R, G, min_backlog=500, max_lead_records=500)
    most = drain(a, requests=3_000, per_answer=2, fetch=40, poll=500)
    assert a.skews == 0
    b = InputAligner(R, G, min_backlog=500)
    assert most == drain(b, requests=3_000, per_answer=2, fetch=40, poll=500)


@pytest.mark.parametrize("gen_skew_ms", [-10 * 60_000, 4 * 60_000])
def test_a_skewed_streaming_producer_is_still_learned(gen_skew_ms: int) -> None:
    """Generation's clock 10 minutes behind (or 4 minutes ahead), 101 records per answer:
    the skew is learned once, less what the partner closed while it read its budget, and
    the sides stay level from then on (2ff24ff: 60-75 exhausted pauses, the skew off by
    40 s, retrieval 2,100 requests ahead)."""
    a = InputAligner(R, G, min_backlog=500, max_lead_records=500, wall_ms=lambda: 2e12)
    most = drain(a, 3_000, 101, fetch=40, poll=500, gen_skew_ms=gen_skew_ms)
    assert a.skews == 1
    assert abs(a.skew_ms(0) - gen_skew_ms) < 10_000  # a budget of retrievals: 500 x 20 ms
    # the partner may have read up to a budget past level when the gap is taken for skew
    assert most <= 500


def test_a_skewed_producer_of_whole_answers_is_still_learned() -> None:
    """One generation record per answer, its clock 10 minutes behind: learned once."""
    a = InputAligner(R, G, min_backlog=500, max_lead_records=500, wall_ms=lambda: 2e12)
    drain(a, 3_000, 1, fetch=40, poll=500, gen_skew_ms=-10 * 60_000)
    assert a.skews == 1
    assert abs(a.skew_ms(0) + 10 * 60_000) < 30_000  # less what generation read past level


def test_a_partner_with_no_more_records_keeps_the_plain_budget() -> None:
    """Retrieval's clock 10 minutes behind, one final per answer, generation a poll of 500
    records ahead: the budget stays ``max_lead_records``. Scaled by the lead (1,000) it let
    retrieval read further past level before the gap was taken for skew, and the store
    held that many more half-requests (audit, store 300: 5-32 incomplete instead of 0)."""
    a = InputAligner(R, G, min_backlog=1, max_lead_records=50)
    for i in range(500):
        a.observe(G, 0, 1_000_000 + i)
    observe(a, R, 0, 400_000)
    assert decide(a, r0=2_000, g0=2_000).pause == {(G, 0)}
    for i in range(49):
        a.observe(R, 0, 400_000 + i)
    assert not decide(a, r0=1_951, g0=2_000)
    a.observe(R, 0, 400_049)
    assert decide(a, r0=1_950, g0=2_000).resume == {(G, 0)}
    assert a.skews == 1


@pytest.mark.parametrize("at", [1_024, 1_030, 1_064])
def test_a_burst_of_junk_stamps_is_not_learned_as_skew(at: int) -> None:
    """Identical clocks, 101 records per answer, four consecutive retrievals stamped 4
    minutes ahead, held in the paused side's window for a whole budget: the CONFIRMING-th
    highest stamp saw a 4-minute gap and learned it as skew, which stayed until revocation
    (review: skew -33 s after correcting, retrieval 1,709 requests ahead; 150 without the
    burst). The median of the window learns nothing, and the drain stays as level."""
    a = InputAligner(R, G, min_backlog=500, max_lead_records=1_666, wall_ms=lambda: 2e12)
    most = drain(a, 6_000, 101, fetch=40, poll=500, junk=range(at, at + 4))
    assert (a.skews, a.skew_ms(0)) == (0, 0)
    clean = InputAligner(R, G, min_backlog=500, max_lead_records=1_666, wall_ms=lambda: 2e12)
    assert most == drain(clean, 6_000, 101, fetch=40, poll=500) <= 200


F = "rag.feedback"
WITH_LABELS = PAIRS | {(F, 0), (F, 1)}


def decide_with_labels(aligner: InputAligner, **lag: int) -> FlowDecision:
    table = backlog_of(**lag)
    return aligner.decide(WITH_LABELS, lambda tp: table.get(tp, 0))


def test_labels_ahead_of_the_inputs_wait_while_the_inputs_have_a_backlog() -> None:
    """Re-deciding yesterday: the labels, all in Kafka already, were read far ahead of the
    requests they label and overflowed the pool that waits for them."""
    a = InputAligner(R, G, labels=F)
    observe(a, R, 0, 1_000)
    observe(a, G, 0, 1_000)
    observe(a, F, 0, 61_000)  # labelled a minute after the answers read so far
    assert decide_with_labels(a, r0=50, g0=50).pause == {(F, 0)}
    observe(a, R, 0, 61_000)
    decide_with_labels(a, r0=50, g0=50)
    assert (F, 0) in a.paused  # retrieval caught up, generation (the finals) not yet
    observe(a, G, 0, 61_000)
    assert decide_with_labels(a, r0=50, g0=50).resume == {(F, 0), (R, 0)}  # level: read on


def test_labels_never_wait_for_inputs_with_nothing_left_to_read() -> None:
    """Live traffic (a label's request long decided) or a producer clock far ahead: the
    labels are held only while the inputs have a backlog to level."""
    a = InputAligner(R, G, labels=F, min_backlog=10)
    observe(a, R, 0, 1_000)
    observe(a, G, 0, 1_000)
    observe(a, F, 0, 3_600_000)
    assert not decide_with_labels(a, r0=9, g0=9)
    assert decide_with_labels(a, g0=10).pause == {(F, 0)}
    assert decide_with_labels(a, g0=0).resume == {(F, 0)}


def test_labels_wait_for_inputs_not_read_yet_and_partitions_are_independent() -> None:
    a = InputAligner(R, G, labels=F)
    observe(a, R, 1, 1_000)
    observe(a, G, 1, 1_000)
    observe(a, F, 1, 500)  # labels of partition 1 behind its inputs: read on
    observe(a, F, 0, 500)  # partition 0's inputs: a backlog, nothing read yet
    assert decide_with_labels(a, r0=5, g0=5, r1=5, g1=5).pause == {(F, 0)}


def test_without_a_labels_topic_labels_are_never_paused() -> None:
    a = InputAligner(R, G)
    observe(a, R, 0, 1_000)
    observe(a, G, 0, 1_000)
    observe(a, F, 0, 61_000)
    assert not decide_with_labels(a, r0=50, g0=50)


def test_the_labels_topic_must_differ_from_the_inputs() -> None:
    with pytest.raises(ValueError, match="differ"):
        InputAligner(R, G, labels=G)
