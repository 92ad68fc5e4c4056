"""The demo recording with claims on: true claims ``supported``, planted false ones ``unsupported``.

The recording (``sidecar/samples/demo_events.jsonl``) goes through the
processor in process, exactly as ``guardrail demo --claims`` sends it to the
sidecar (same order, same broken messages), with the shipped signals, policy
and verifier (``models/verifier``); no Kafka. req-demo-010 and req-demo-011
each hold one planted false claim that the retrieved chunks contradict (a
wrong opponent, a wrong year); every other claim of the recording is true and
stated by its retrieved chunks.

Where the shipped verifier misses a claim, the case is an ``xfail(strict=True)``
with what it measured: the expectation stays the truth, and a verifier that
gets the claim right makes the test fail until the mark is removed.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from sidecar.claims.evidence import EvidenceChunk
from sidecar.claims.segment import segment_claims
from sidecar.claims.verifier import load_claim_checker
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict, ClaimLabel, ClaimVerdict, Decision
from sidecar.lab.demo import bundled_sample
from sidecar.lab.replay import load_file
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor
from sidecar.runtime import build_policy, build_signals
from tests.claims.conftest import REPO


@dataclass(frozen=True)
class Expected:
    request_id: str
    text: str
    true: bool  # False: a planted false claim, contradicted by the retrieved chunks
    miss: str = ""  # what the shipped verifier measured, when it gets the claim wrong

    @property
    def label(self) -> ClaimLabel:
        return ClaimLabel.SUPPORTED if self.true else ClaimLabel.UNSUPPORTED


_MISS = "the shipped verifier (minilm-ce-eefc049fb611) measured "
EXPECTED = [
    Expected("req-demo-001", "Frankenstein was written by Mary Shelley.", true=True),
    Expected(
        "req-demo-001",
        "It was first published in 1818.",
        true=True,
        miss=_MISS + "p=0.30 (unsupported); the chunk says 'an 1818 novel'",
    ),
    Expected(
        "req-demo-002",
        "The Berlin Wall fell on 9 November 1989.",
        true=True,
    ),
    Expected("req-demo-003", "Water boils at 100 degrees Celsius at sea level.", true=True),
    Expected(
        "req-demo-009",
        "The first Nobel Prize in Physics was awarded to the physicist Wilhelm Conrad Röntgen "
        "in 1901.",
        true=True,
    ),
    Expected(
        "req-demo-010",
        "Herbert Hoover was elected president of the United States in 1928.",
        true=True,
    ),
    Expected(
        "req-demo-010",
        "He defeated the Democratic nominee, Governor Franklin D. Roosevelt of New York.",
        true=False,  # Al Smith in the chunk
    ),
    Expected(
        "req-demo-010",
        "He was the last Republican to win a presidential election until 1952.",
        true=True,
    ),
    Expected(
        "req-demo-011",
        "Celtic became the first British team to win the European Cup in 1968.",
        true=False,  # 1967 in the chunk: the rule tier
    ),
    Expected(
        "req-demo-011",
        "They beat Internazionale 2\u20131 in the Estádio Nacional in Lisbon.",
        true=True,
        miss=_MISS + "p=0.03 (unsupported), the network's own miss: 0.035 with the true "
        "1967 claim as its context, 0.066 as 'Celtic beat ...', 0.33 read without the question",
    ),
    Expected(
        "req-demo-011",
        "The team was managed by Jock Stein.",
        true=True,
    ),
]
MODEL = REPO / "models" / "verifier"


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings.load(models={"dir": str(REPO / "models")}, signals={"claims": True})


Published = tuple[dict[tuple[str, str], ClaimVerdict], dict[str, AnswerVerdict]]


@pytest.fixture(scope="module")
def published(settings: Settings) -> Published:
    """Every claim verdict the processor publishes for the recording, by (request, text),
    and every answer verdict, by request."""
    processor = Processor(settings, build_policy(settings), signals=build_signals(settings))
    kinds = {
        settings.topics.retrieval: InputKind.RETRIEVAL,
        settings.topics.generation: InputKind.GENERATION,
    }
    claims: dict[tuple[str, str], ClaimVerdict] = {}
    answers: dict[str, AnswerVerdict] = {}
    records = load_file(bundled_sample(), settings)
    for offset, record in enumerate(records):
        if record.topic not in kinds:
            continue  # the feedback labels come after the verdicts, on their own topic
        ref = InputRef(record.topic, 0, offset)
        step = processor.on_message(kinds[record.topic], record.value, record.key, ref, 0.0)
        for o in step.outputs:
            if o.destination is Destination.CLAIMS:
                verdict = ClaimVerdict.model_validate(orjson.loads(o.value))
                claims[(verdict.request_id, verdict.text)] = verdict
            elif o.destination is Destination.VERDICTS:
                answer = AnswerVerdict.model_validate(orjson.loads(o.value))
                answers[answer.request_id] = answer
    return claims, answers


@pytest.fixture(scope="module")
def claim_verdicts(published: Published) -> dict[tuple[str, str], ClaimVerdict]:
    return published[0]


def test_every_claim_of_the_recording_is_expected(
    claim_verdicts: dict[tuple[str, str], ClaimVerdict],
) -> None:
    assert set(claim_verdicts) == {(e.request_id, e.text) for e in EXPECTED}
    assert sum(not e.true for e in EXPECTED) == 2  # the planted false claims


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param(
            e,
            id=f"{e.request_id}-{k}-{'true' if e.true else 'planted'}",
            marks=[pytest.mark.xfail(strict=True, reason=e.miss)] if e.miss else [],
        )
        for k, e in enumerate(EXPECTED)
    ],
)
def test_true_claims_are_supported_and_planted_ones_unsupported(
    expected: Expected, claim_verdicts: dict[tuple[str, str], ClaimVerdict]
) -> None:
    verdict = claim_verdicts[(expected.request_id, expected.text)]
    assert verdict.label is expected.label, f"p={verdict.score:.3f}"


CERTIFIED_CODES = {"certified-allow", "confidence-below-certified"}


def test_the_default_policy_allows_the_verified_answers_and_not_the_planted_ones(
    published: Published,
) -> None:
    """With claim checks on, the shipped policy still allows well-supported answers: the
    nq-open profile's certificate fitted with claims on applies (certs/nq-open-claims.json)."""
    _, answers = published
    by_request: dict[str, list[Expected]] = {}
    for e in EXPECTED:
        by_request.setdefault(e.request_id, []).append(e)
    planted = {rid for rid, es in by_request.items() if not all(e.true for e in es)}
    assert planted == {"req-demo-010", "req-demo-011"}
    for rid in by_request:
        verdict = answers[rid]
        codes = {r.code for r in verdict.reasons}
        assert "certificate-not-applicable" not in codes, rid
        [cert] = [r for r in verdict.reasons if r.code in CERTIFIED_CODES]  # it applies
        # taken under the certificate unless another reason decided
        assert (verdict.certified_risk is None) == ("overruled" in cert.message), rid
        if rid in planted:
            assert verdict.decision is not Decision.ALLOW, rid
    # every claim of these answers is true and verified: they are allowed, as certified
    for rid in ("req-demo-002", "req-demo-003", "req-demo-009"):
        assert answers[rid].decision is Decision.ALLOW, rid
        assert "certified-allow" in {r.code for r in answers[rid].reasons}


def test_claims_without_a_leading_pronoun_are_scored_as_before() -> None:
    """The recording's claims that stand alone: the verifier's p of the claim with the question.

    Before claims carried a context, every claim was scored with the user's
    question alone; a claim without a leading pronoun still is (same windows,
    same question), to the float.
    """
    scorer = load_claim_checker(MODEL, threads=1).scorer  # served as the sidecar serves it
    events = [orjson.loads(line) for line in bundled_sample().read_bytes().splitlines()]
    retrievals = {e["request_id"]: e for e in events if e.get("event_type") == "retrieval"}
    finals = [e for e in events if e.get("event_type") == "generation.final"]
    standalone = 0
    for final in finals:
        retrieval = retrievals[final["request_id"]]
        index = scorer.index([EvidenceChunk(h["chunk_id"], h["text"]) for h in retrieval["hits"]])
        query = retrieval["query"]
        claims = segment_claims(final["answer"])
        checks = scorer.check(claims, index, query)
        for claim, check in zip(claims, checks, strict=True):
            if claim.context:
                continue
            standalone += 1
            windows = index.windows(
                claim.text,
                query,
                max_windows=scorer.max_windows,
                max_chars=scorer.max_chars,
            )
            [before] = scorer.verifier.window_probabilities([claim.text], [windows], [query])
            assert check.verifier_p == pytest.approx(before, abs=1e-6), claim.text
    assert standalone == 7
