"""``guardrail train confidence --from-kafka``: verdicts joined with feedback refit the model."""

from __future__ import annotations

import asyncio
import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.confidence.model import ConfidenceModel
from sidecar.contracts.codec import encode
from sidecar.contracts.events import AnswerVerdict, Decision, FeedbackEvent
from sidecar.exceptions import ConfigError
from sidecar.kafka.topics import create_topics
from sidecar.lab.confidence.recipe import ANSWER_FILE, CARD_FILE, CHUNKS_FILE, train_from_kafka
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.lab.replay import Record, send
from tests.kafka.harness import settings_for

pytestmark = pytest.mark.connected

SHIPPED = Path("models/confidence/smollm2-135m-nq")


def _verdict(request_id: str, quality: float, rng: random.Random) -> AnswerVerdict:
    features: dict[str, float | None] = {
        "retrieval_top_score": 0.5 + 0.3 * quality,
        "retrieval_margin": 0.1 * quality,
        "retrieval_mean_score": 0.45 + 0.2 * quality,
        "m1": 1.0,
        "m2": 0.33 + 0.33 * (quality > 0.5),
        "lookback_p": min(1.0, max(0.0, quality + rng.gauss(0.0, 0.15))),
        "claims_reliability": None,
        "claims_hallucination_rate": None,
        "mean_token_logprob": -1.5 + quality,
        "answer_words_log1p": math.log1p(5 + rng.randrange(10)),
    }
    return AnswerVerdict(
        request_id=request_id,
        idempotency_key=f"k-{request_id}",
        decision=Decision.CAVEAT,
        reasons=[],
        policy="test/1",
        confidence_features=features,
        produced_at=datetime.now(UTC),
        sidecar_version="test",
    )


async def test_refit_from_verdicts_and_feedback(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    rng = random.Random(3)
    records: list[Record] = []
    n = 240
    for i in range(n):
        rid = f"fb-{i}"
        quality = rng.random()
        records.append(
            Record(settings.topics.verdicts, rid.encode(), encode(_verdict(rid, quality, rng)))
        )
        if i % 4 == 3:
            continue  # a quarter of the verdicts never get feedback
        correct = rng.random() < quality
        fb = FeedbackEvent(request_id=rid, correct=correct, source="test")
        records.append(Record(settings.topics.feedback, rid.encode(), encode(fb)))
    records.append(Record(settings.topics.feedback, b"junk", b"{not json"))
    await send(settings, records)

    out = tmp_path / "refit"
    card = await asyncio.to_thread(train_from_kafka, settings, out, chunks_from=SHIPPED, seed=0)

    assert card["source"]["verdicts"] == n
    assert card["inputs"] == {}  # these verdicts name no calibration or lookback version
    assert card["source"]["feedback"] == n - n // 4
    assert card["source"]["joined"] == n - n // 4
    model = ConfidenceModel.load(out / ANSWER_FILE)
    assert model.training.n == n - n // 4
    # the refit learned the link: better-quality rows get a higher confidence
    low, high = _verdict("a", 0.1, rng), _verdict("b", 0.9, rng)
    assert model.predict_one(high.confidence_features) > model.predict_one(low.confidence_features)
    assert (out / CHUNKS_FILE).read_bytes() == (SHIPPED / CHUNKS_FILE).read_bytes()
    assert (
        json.loads((out / CARD_FILE).read_text())["retrieve_again"]["tau"]
        == card["retrieve_again"]["tau"]
    )


async def test_refit_refuses_too_little_feedback(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    rng = random.Random(4)
    verdicts = [
        Record(settings.topics.verdicts, f"r{i}".encode(), encode(_verdict(f"r{i}", 0.5, rng)))
        for i in range(5)
    ]
    await send(settings, verdicts)
    with pytest.raises(ConfigError, match="only 0 verdicts have feedback"):
        await asyncio.to_thread(
            train_from_kafka, settings, tmp_path / "x", chunks_from=SHIPPED, seed=0
        )
