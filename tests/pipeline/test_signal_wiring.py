"""The processor calls the signal components at the right moments (fake components)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    ClaimLabel,
    ClaimsSignal,
    ClaimVerdict,
    DeadLetterRecord,
    GenerationFinal,
    LookbackSignal,
    RetrievalEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import InputError
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.ports import ClaimResult, SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.policy.engine import PolicyEngine
from tests.conftest import REPO, EventFactory, dumps
from tests.fakes import ThresholdCertifier

R, G = InputKind.RETRIEVAL, InputKind.GENERATION


@dataclass
class SentenceSession:
    """Claims = sentences; supported when a trusted chunk id was certified."""

    trusted: list[str]
    held_bytes: int = 0
    buffer: str = ""
    offset: int = 0
    results: list[ClaimResult] = field(default_factory=list)

    def _cut(self, final: bool) -> list[ClaimResult]:
        out = []
        while True:
            end = self.buffer.find(". ")
            if end < 0:
                if final and self.buffer.strip():
                    end = len(self.buffer) - 1
                else:
                    break
            sentence = self.buffer[: end + 1]
            label = ClaimLabel.SUPPORTED if self.trusted else ClaimLabel.UNSUPPORTED
            r = ClaimResult(
                len(self.results),
                (self.offset, self.offset + len(sentence)),
                sentence.strip(),
                label,
                0.9,
                tuple(self.trusted[:1]),
            )
            self.results.append(r)
            out.append(r)
            self.offset += end + 2
            self.buffer = self.buffer[end + 2 :]
        return out

    def feed(self, text: str) -> list[ClaimResult]:
        self.buffer += text
        return self._cut(final=False)

    def finish(self, answer: str) -> tuple[list[ClaimResult], ClaimsSignal]:
        if not self.results and not self.buffer:
            self.buffer = answer
        tail = self._cut(final=True)
        n = len(self.results)
        s = sum(r.label is ClaimLabel.SUPPORTED for r in self.results)
        return tail, ClaimsSignal(status=SignalStatus.OK, n=n, supported=s, unsupported=n - s)


class SentenceChecker:
    version = "sentences/1"

    def open(self, retrieval: RetrievalEvent, certification: RetrievalSignal) -> SentenceSession:
        del retrieval
        return SentenceSession(list(certification.trusted_chunk_ids))


@dataclass
class PickyLookback:
    version: str = "lookback/1"
    fail: bool = False

    def check(self, final: GenerationFinal) -> None:
        if final.generator_model != "gen-a":
            raise InputError(
                "generator-mismatch", f"model is for gen-a, got {final.generator_model}"
            )

    def score(
        self,
        final: GenerationFinal,
        certification: RetrievalSignal,
        *,
        hit_ids: Sequence[str] | None = None,
    ) -> LookbackSignal:
        del final, certification
        if self.fail:
            raise RuntimeError("onnx session exploded")
        return LookbackSignal(status=SignalStatus.OK, p_factual=0.8, model_version=self.version)

    def score_batch(
        self,
        items: Sequence[tuple[GenerationFinal, RetrievalSignal]],
        *,
        hit_ids: Sequence[Sequence[str]] | None = None,
    ) -> list[LookbackSignal]:
        return [self.score(final, cert) for final, cert in items]


def make(
    settings_factory: Callable[..., Settings], lookback: PickyLookback | None = None
) -> Processor:
    suite = SignalSuite(
        certifier=ThresholdCertifier(),
        lookback=lookback or PickyLookback(),
        claims=SentenceChecker(),
    )
    return Processor(settings_factory(), PlaceholderPolicy(), signals=suite)


def test_claims_stream_before_the_answer_verdict(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
) -> None:
    p = make(settings_factory)
    offsets = iter(range(100))

    def feed(kind: InputKind, raw: bytes) -> list[tuple[Destination, bytes]]:
        step = p.on_message(kind, raw, None, InputRef(kind.value, 0, next(offsets)), 0.0)
        return [(o.destination, o.value) for o in step.outputs]

    # deltas before the retrieval: nothing can be verified yet
    assert feed(G, dumps(delta_event(seq=0, text="Mary Shelley wrote it. It was 18"))) == []
    # the retrieval arrives: the completed first sentence is verified at once
    [(dest, raw)] = feed(R, dumps(retrieval_event()))
    first = ClaimVerdict.model_validate(orjson.loads(raw))
    assert dest is Destination.CLAIMS and first.claim_index == 0
    assert first.text == "Mary Shelley wrote it." and first.label is ClaimLabel.SUPPORTED
    assert first.evidence_chunk_ids == ["c1"]
    assert feed(G, dumps(delta_event(seq=1, text="18. "))) != []
    out = feed(
        G,
        dumps(final_event(answer="Mary Shelley wrote it. It was 1818. ", generator_model="gen-a")),
    )
    assert [d for d, _ in out] == [Destination.VERDICTS]
    verdict = AnswerVerdict.model_validate(orjson.loads(out[-1][1]))
    assert verdict.signals.retrieval.trusted_chunk_ids == ["c1"]
    assert verdict.signals.lookback.p_factual == 0.8
    assert verdict.signals.claims.n == 2 and verdict.signals.claims.supported == 2
    assert verdict.model_versions["verifier"] == "sentences/1"
    assert p.counters.claim_verdicts == 2


def test_unscorable_summary_is_dead_lettered_and_the_request_ends_incomplete(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    p = make(settings_factory)
    p.on_message(R, dumps(retrieval_event()), None, InputRef("r", 0, 0), 0.0)
    step = p.on_message(
        G, dumps(final_event(generator_model="gen-b")), None, InputRef("g", 0, 0), 0.0
    )
    out, ended = step.outputs
    assert out.destination is Destination.DLQ
    assert DeadLetterRecord.from_headers(out.headers).reason == "generator-mismatch"
    # nothing can complete the request now: decided at once, not after the join TTL
    assert ended.destination is Destination.VERDICTS
    v = AnswerVerdict.model_validate(orjson.loads(ended.value))
    assert v.reasons[0].code == "incomplete"
    assert "dead-lettered (generator-mismatch" in v.reasons[0].message
    assert len(p.store) == 0 and p.on_tick(10**9).outputs == []


def test_a_failing_signal_is_reported_unavailable_not_fatal(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    p = make(settings_factory, PickyLookback(fail=True))
    p.on_message(R, dumps(retrieval_event()), None, InputRef("r", 0, 0), 0.0)
    step = p.on_message(
        G, dumps(final_event(generator_model="gen-a")), None, InputRef("g", 0, 0), 0.0
    )
    verdicts = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    v = AnswerVerdict.model_validate(orjson.loads(verdicts[0].value))
    assert v.signals.lookback.status is SignalStatus.UNAVAILABLE
    assert v.signals.lookback.model_version == "lookback/1"  # the model that failed (was null)
    assert len(step.done) == 2


def test_strict_profile_blocks_mid_stream_then_decides_at_the_end(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    delta_event: EventFactory,
    final_event: EventFactory,
    tmp_path: Path,
) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(
        (REPO / "models/policy/default.yaml")
        .read_text()
        .replace("default_profile: enterprise", "default_profile: medical")
    )
    # the copy's relative certificate paths resolve in the shipped policy folder
    engine = PolicyEngine.from_file(policy_file, search=[REPO / "models/policy"])
    suite = SignalSuite(certifier=ThresholdCertifier(), claims=SentenceChecker())
    p = Processor(settings_factory(), engine, signals=suite)
    weak_hits = [{"chunk_id": "c9", "doc_id": "d9", "score": 0.2, "text": "unrelated"}]
    p.on_message(R, dumps(retrieval_event(hits=weak_hits, k=3)), None, InputRef("r", 0, 0), 0.0)
    step = p.on_message(
        G,
        dumps(delta_event(seq=0, text="It cured everyone. And more")),
        None,
        InputRef("g", 0, 0),
        0.0,
    )
    kinds = [o.destination for o in step.outputs]
    assert kinds == [Destination.CLAIMS, Destination.VERDICTS]
    early = AnswerVerdict.model_validate(orjson.loads(step.outputs[1].value))
    assert early.stage == "stream" and early.decision.value == "block"
    assert early.escalate is True  # the medical profile escalates every block
    assert step.done == []  # the request is still open: its final decides
    out = p.on_message(
        G,
        dumps(final_event(answer="It cured everyone. And more.", generator_model="gen-a")),
        None,
        InputRef("g", 0, 1),
        0.0,
    )
    final = AnswerVerdict.model_validate(orjson.loads(out.outputs[-1].value))
    assert final.stage == "final" and final.decision.value == "block"
    assert "retrieval-no-trusted-chunk" in [r.code for r in final.reasons]
    assert len(out.done) == 3


def test_exchangeability_alarm_is_a_reason_on_the_verdict(
    retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    engine = PolicyEngine.from_file(REPO / "models/policy/default.yaml")
    broken = RetrievalSignal(
        status=SignalStatus.OK,
        trusted_chunk_ids=["c1"],
        m1=True,
        m2=0.5,
        alpha=0.1,
        certifiable=True,
        calibration_key="acme/wiki/r",
        monitor="exchangeability-broken",
        m1_mean=0.7,
    )
    retrieval = RetrievalEvent.model_validate(retrieval_event())
    final = GenerationFinal.model_validate(final_event())
    outcome = engine.decide(retrieval, final, Signals(retrieval=broken))
    codes = [r.code for r in outcome.reasons]
    assert "exchangeability-broken" in codes
    assert outcome.decision.value in {"caveat", "block"}
    healthy = engine.decide(
        retrieval, final, Signals(retrieval=broken.model_copy(update={"monitor": "ok"}))
    )
    assert "exchangeability-broken" not in [r.code for r in healthy.reasons]


@dataclass
class CountingLookback(PickyLookback):
    batches: list[int] = field(default_factory=list)
    hit_ids: list[Sequence[str]] = field(default_factory=list)

    def score_batch(
        self,
        items: Sequence[tuple[GenerationFinal, RetrievalSignal]],
        *,
        hit_ids: Sequence[Sequence[str]] | None = None,
    ) -> list[LookbackSignal]:
        self.batches.append(len(items))
        self.hit_ids += hit_ids or []
        return [
            LookbackSignal(
                status=SignalStatus.OK, p_factual=0.1 * (i + 1), model_version=self.version
            )
            for i in range(len(items))
        ]


def test_answers_completed_in_one_batch_are_scored_in_one_call(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    scorer = CountingLookback()
    p = Processor(settings_factory(), PlaceholderPolicy(), signals=SignalSuite(lookback=scorer))
    items = []
    for i in range(3):
        rid = f"req-b{i}"
        items.append((R, dumps(retrieval_event(rid)), None, InputRef("r", 0, i)))
        items.append(
            (G, dumps(final_event(rid, generator_model="gen-a")), None, InputRef("g", 0, i))
        )
    items.append((G, b"{broken", None, InputRef("g", 0, 99)))
    step = p.on_batch(items, 0.0)
    assert scorer.batches == [3]
    # each answer's hit order (the summary's columns), so unsorted hits map right
    hit_order = tuple(h["chunk_id"] for h in retrieval_event("x")["hits"])
    assert len(hit_order) >= 2 and scorer.hit_ids == [hit_order] * 3
    verdicts = [
        AnswerVerdict.model_validate(orjson.loads(o.value))
        for o in step.outputs
        if o.destination is Destination.VERDICTS
    ]
    assert [v.request_id for v in verdicts] == ["req-b0", "req-b1", "req-b2"]
    assert [v.signals.lookback.p_factual for v in verdicts] == pytest.approx([0.1, 0.2, 0.3])
    assert [o.destination for o in step.outputs].count(Destination.DLQ) == 1
    assert len(step.done) == 7
    # a single message takes the same path: a batch of one
    p.on_message(R, dumps(retrieval_event("req-solo")), None, InputRef("r", 0, 9), 0.0)
    solo = p.on_message(
        G, dumps(final_event("req-solo", generator_model="gen-a")), None, InputRef("g", 0, 9), 0.0
    )
    assert AnswerVerdict.model_validate(
        orjson.loads(solo.outputs[-1].value)
    ).signals.lookback.p_factual == pytest.approx(0.1)
    assert scorer.batches == [3, 1]


@dataclass
class FailingBatchLookback(CountingLookback):
    """The batch call fails; one request's own score is poison (not finite), another raises."""

    def score_batch(
        self,
        items: Sequence[tuple[GenerationFinal, RetrievalSignal]],
        *,
        hit_ids: Sequence[Sequence[str]] | None = None,
    ) -> list[LookbackSignal]:
        raise RuntimeError("batch kernel failed")

    def score(
        self,
        final: GenerationFinal,
        certification: RetrievalSignal,
        *,
        hit_ids: Sequence[str] | None = None,
    ) -> LookbackSignal:
        if final.request_id == "req-raise":
            raise RuntimeError("this one is broken")
        return super().score(final, certification)


def test_a_failing_signal_costs_only_its_own_request(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    p = Processor(
        settings_factory(),
        PlaceholderPolicy(),
        signals=SignalSuite(lookback=FailingBatchLookback()),
    )
    items = []
    for i, rid in enumerate(["req-ok", "req-raise", "req-ok2"]):
        items.append((R, dumps(retrieval_event(rid)), None, InputRef("r", 0, i)))
        items.append(
            (G, dumps(final_event(rid, generator_model="gen-a")), None, InputRef("g", 0, i))
        )
    step = p.on_batch(items, 0.0)
    verdicts = {
        v.request_id: v
        for v in (
            AnswerVerdict.model_validate(orjson.loads(o.value))
            for o in step.outputs
            if o.destination is Destination.VERDICTS
        )
    }
    assert set(verdicts) == {"req-ok", "req-raise", "req-ok2"}
    assert verdicts["req-raise"].signals.lookback.status is SignalStatus.UNAVAILABLE
    assert verdicts["req-ok"].signals.lookback.status is SignalStatus.OK
    assert len(step.done) == 6
