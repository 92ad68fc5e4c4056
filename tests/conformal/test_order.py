"""A retriever whose scores rise down its hit lists (distances) is not certified the wrong
way round: per key, once most of its lists rise, none of its chunks is trusted."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import pytest

from sidecar.config import Settings
from sidecar.conformal.order import MAX_KEYS, MIN_LISTS, WINDOW, ScoreOrder
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict
from sidecar.contracts.verdicts import SCORES_RISING, RetrievalSignal, Signals, SignalStatus
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.policy.config import load_policy
from sidecar.policy.findings import evaluate_signals
from sidecar.runtime import build_signals
from tests.conformal.test_signal import _shipped_settings
from tests.conftest import REPO, EventFactory, dumps

RISING = [0.2, 0.35, 0.6]
FALLING = [0.8, 0.6, 0.31]


def test_a_key_is_judged_rising_after_enough_of_its_lists_rose(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order = ScoreOrder()
    with caplog.at_level(logging.WARNING, logger="sidecar.conformal"):
        seen = [order.observe("t/c/l2", RISING) for _ in range(MIN_LISTS)]
        order.observe("t/c/l2", RISING)
    assert seen == [False] * (MIN_LISTS - 1) + [True]
    assert caplog.text.count("look like distances") == 1  # once per key, not per list
    assert order.observe("t/c/l2", [0.5])  # a single hit of a judged key: still not trusted
    assert not order.observe("t/c/cosine", FALLING)


def test_reranked_and_falling_lists_never_judge_a_key_rising() -> None:
    """A reranker reorders the hits: three random scores rise one time in six by chance."""
    order, rng = ScoreOrder(), random.Random(5)
    judged = [order.observe("t/c/rerank", [rng.random() for _ in range(3)]) for _ in range(500)]
    assert not any(judged)
    assert not any(order.observe("t/c/cosine", FALLING) for _ in range(500))
    assert not any(order.observe("t/c/ties", [0.5, 0.5]) for _ in range(100))  # not telling


def test_a_fixed_retriever_is_believed_again(caplog: pytest.LogCaptureFixture) -> None:
    order = ScoreOrder()
    for _ in range(WINDOW):
        order.observe("k", RISING)
    assert order.observe("k", RISING)
    with caplog.at_level(logging.WARNING, logger="sidecar.conformal"):
        after = [order.observe("k", FALLING) for _ in range(2 * WINDOW)]
    assert after[0] and not after[-1]
    assert "fall down the hit list again" in caplog.text


def test_keys_are_bounded_and_new_keys_never_clear_a_judged_one() -> None:
    """Audit: 4,096 other keys seen once each (any tenant can send them) cleared a judged
    key, which was then certified the wrong way round again."""
    order = ScoreOrder()
    for _ in range(MIN_LISTS):
        order.observe("acme/docs/l2", RISING)
    for i in range(MAX_KEYS + 10):
        order.observe(f"k{i}", FALLING)
    assert len(order._counts) == MAX_KEYS
    assert order.observe("acme/docs/l2", [0.5])  # still judged


def test_ties_do_not_hide_a_distance_retriever() -> None:
    """Audit: with a tie in 20 % of its lists (two chunks at one distance), a distance
    retriever was never flagged."""
    order, rng = ScoreOrder(), random.Random(3)
    judged = False
    for i in range(MIN_LISTS * 2):
        scores = sorted(rng.random() for _ in range(4))
        if i % 5 == 0:
            scores[2] = scores[1]  # a tie
        judged = order.observe("acme/docs/l2ties", scores)
    assert judged
    assert not order.observe("acme/docs/cos", [0.8, 0.8, 0.5])  # a tie in a falling list


def test_a_distance_retriever_gets_no_trusted_chunk_and_a_reason_that_says_why(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Audit: a 1 - cosine retriever had only its off-topic hit trusted (its worst)."""
    settings = _shipped_settings(settings_factory)
    processor = Processor(settings, PlaceholderPolicy(), signals=build_signals(settings))
    # the shipped calibration's scale: the best hit is nearest, so its distance is smallest
    distances = [0.28, 0.41, 0.67]
    hits = [
        {"chunk_id": f"c{i}", "doc_id": f"d{i}", "score": d, "text": "t"}
        for i, d in enumerate(distances)
    ]
    got: list[RetrievalSignal] = []
    for i in range(MIN_LISTS + 2):
        event = retrieval_event(
            f"r{i}", collection="nq-open", tenant="default", retriever="l2", hits=hits, k=3
        )
        processor.on_message(InputKind.RETRIEVAL, dumps(event), None, InputRef("r", 0, i), 0.0)
        final = dumps(final_event(request_id=f"r{i}"))
        step = processor.on_message(InputKind.GENERATION, final, None, InputRef("g", 0, i), 0.0)
        [out] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
        got.append(AnswerVerdict.model_validate_json(out.value).signals.retrieval)
    assert "c2" in got[0].trusted_chunk_ids  # before it is judged: the worst hit trusted
    for signal in got[MIN_LISTS - 1 :]:
        assert signal.trusted_chunk_ids == [] and signal.m1 is False
        assert signal.fallback_reason == SCORES_RISING
    policy = load_policy(REPO / "models/policy/default.yaml")
    _, profile = policy.profile_for("default", "nq-open")
    findings = evaluate_signals(Signals(retrieval=got[-1]), profile)
    [rising] = [f for f in findings if f.reason.code == "retrieval-scores-rising"]
    assert rising.action == profile.retrieval.when_no_trusted_chunk
    assert "look like distances" in rising.reason.message
    assert not any(f.reason.code == "retrieval-calibration-fallback" for f in findings)
    assert got[-1].status is SignalStatus.OK
