"""The reference RAG service end to end on the real broker: stream and hold modes.

The sidecar runs in-process on the real broker (uuid topics) with a policy that
decides by the question (``block`` / ``caveat`` / anything else: allow); the
service runs with a fake answerer (no model) that streams four text pieces.
Without a sidecar no verdict comes and the service's fail-open / fail-closed
setting (the kit's ``on_timeout``) decides.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from examples.rag_service import demo as demo_service
from examples.rag_service.app import MODE_HEADER, Generated
from examples.rag_service.config import ServiceSettings
from examples.rag_service.server import running
from examples.rag_service.verdicts import apply_verdict
from guardrail_client import VerdictResult
from sidecar.contracts.events import (
    AnswerVerdict,
    Decision,
    GenerationFinal,
    Reason,
    RetrievalEvent,
    RetrievalHit,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome
from tests.kafka.harness import real_harness, settings_for

PIECES = ["Paris", " is the", " capital", " of France."]
ANSWER = "".join(PIECES)
CAVEAT = "CHECK-THE-SOURCES"


class ByQuestionPolicy:
    """block / caveat / allow chosen by a word in the question."""

    name = "by-question/1"
    fingerprint = "by-question/1@test"
    profile_names: tuple[str, ...] = ()

    def decide(
        self,
        retrieval: RetrievalEvent,
        final: GenerationFinal,
        signals: Signals,
        *,
        claims: Sequence[ClaimResult] | None = None,
        confidence: float | None = None,
        confidence_status: SignalStatus = SignalStatus.NOT_CONFIGURED,
    ) -> PolicyOutcome:
        del signals, claims, confidence, confidence_status
        assert final.answer == ANSWER and final.deltas == len(PIECES)
        reason = Reason(code="test-policy", message="decided by the question", signal="policy")
        if "block" in retrieval.query:
            return PolicyOutcome(decision=Decision.BLOCK, reasons=[reason])
        if "caveat" in retrieval.query:
            return PolicyOutcome(decision=Decision.CAVEAT, reasons=[reason], caveat_text=CAVEAT)
        return PolicyOutcome(decision=Decision.ALLOW, reasons=[reason])

    def check_stream(
        self,
        retrieval: RetrievalEvent,
        claims: Sequence[ClaimResult],
        certification: RetrievalSignal | None = None,
    ) -> PolicyOutcome | None:
        del retrieval, claims, certification
        return None


class FakeAnswerer:
    generator_model = "test/fake-generator"

    def retrieve(self, question: str, k: int) -> list[RetrievalHit]:
        return [
            RetrievalHit(chunk_id=f"c{i}", doc_id=f"d{i}", score=0.9 - i / 10, text=f"text {i}")
            for i in range(min(k, 2))
        ]

    def generate(
        self, question: str, hits: Sequence[RetrievalHit], emit: Callable[[str], None]
    ) -> Generated:
        for piece in PIECES:
            emit(piece)
        return Generated(attention=None, mean_token_logprob=-0.5)


def service_settings(broker: LocalKafka, topics: dict[str, str], **extra: Any) -> ServiceSettings:
    return ServiceSettings(
        port=0,
        bootstrap_servers=broker.bootstrap_servers,
        retrieval_topic=topics["retrieval"],
        generation_topic=topics["generation"],
        verdict_topic=topics["verdicts"],
        k=2,
        **extra,
    )


@pytest.fixture
async def service(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> AsyncIterator[tuple[str, ServiceSettings]]:
    sidecar = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    settings = service_settings(kafka_broker, unique_topics)
    async with (
        real_harness(sidecar, policy=ByQuestionPolicy()),
        running(settings, FakeAnswerer()) as url,
    ):
        yield url, settings


async def _sse(url: str, question: str, mode: str) -> list[tuple[str, Any]]:
    """(event name, data) in arrival order; 'message' for unnamed events."""
    body = {"model": "x", "stream": True, "messages": [{"role": "user", "content": question}]}
    events: list[tuple[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body, headers={MODE_HEADER: mode}) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        data = lines["data"]
        events.append(
            (lines.get("event", "message"), data if data == "[DONE]" else json.loads(data))
        )
    return events


def _content(events: list[tuple[str, Any]]) -> list[str]:
    return [
        d["choices"][0]["delta"]["content"]
        for name, d in events
        if name == "message" and d != "[DONE]" and "content" in d["choices"][0]["delta"]
    ]


@pytest.mark.connected
async def test_stream_mode_streams_tokens_then_appends_the_verdict(
    service: tuple[str, ServiceSettings],
) -> None:
    url, _ = service
    for question, decision in (("caveat: capital of France?", "caveat"), ("capital?", "allow")):
        events = await _sse(url, question, "stream")
        assert _content(events) == PIECES  # the raw answer, piece by piece, whatever the verdict
        names = [name for name, _ in events]
        assert names[-2:] == ["guardrail.verdict", "message"] and events[-1][1] == "[DONE]"
        verdict = events[-2][1]
        assert verdict["decision"] == decision and verdict["mode"] == "stream"
        assert verdict["source"] == "sidecar"
        assert verdict["reasons"] == ["test-policy"] and verdict["policy"] == "by-question/1"
        assert verdict["request_id"] == events[0][1]["id"]


@pytest.mark.connected
async def test_hold_mode_shows_only_what_the_verdict_allows(
    service: tuple[str, ServiceSettings],
) -> None:
    url, settings = service
    expected = {
        "block: capital of France?": ("block", [settings.refusal_text]),
        "caveat: capital of France?": ("caveat", [f"{ANSWER}\n\n{CAVEAT}"]),
        "capital of France?": ("allow", [ANSWER]),
    }
    for question, (decision, content) in expected.items():
        events = await _sse(url, question, "hold")
        assert _content(events) == content
        assert events[-2][0] == "guardrail.verdict" and events[-2][1]["decision"] == decision
        assert events[-2][1]["source"] == "sidecar"
    body = {"messages": [{"role": "user", "content": "block this?"}], "stream": False}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=body, headers={MODE_HEADER: "hold"}) as r,
    ):
        reply = await r.json()
    assert reply["choices"][0]["message"]["content"] == settings.refusal_text
    assert reply["guardrail"]["decision"] == "block"


@pytest.mark.connected
async def test_bad_requests_are_refused_with_what_is_allowed(
    service: tuple[str, ServiceSettings],
) -> None:
    url, _ = service
    async with aiohttp.ClientSession() as session:
        ok_body = {"messages": [{"role": "user", "content": "q?"}]}
        async with session.post(
            f"{url}/v1/chat/completions", json=ok_body, headers={MODE_HEADER: "later"}
        ) as r:
            assert r.status == 400
            assert "must be 'stream' or 'hold'" in (await r.json())["error"]
        async with session.post(f"{url}/v1/chat/completions", json={"messages": []}) as r:
            assert r.status == 400
            assert "user message" in (await r.json())["error"]


@pytest.mark.connected
@pytest.mark.parametrize("fail_open", [False, True])
async def test_no_verdict_in_time_withholds_the_answer_unless_configured_open(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], fail_open: bool
) -> None:
    await create_topics(settings_for(unique_topics, kafka_broker.bootstrap_servers))
    settings = service_settings(
        kafka_broker, unique_topics, verdict_timeout_ms=300, fail_open=fail_open
    )
    async with running(settings, FakeAnswerer()) as url:  # no sidecar: no verdict comes
        held = await _sse(url, "capital of France?", "hold")
        streamed = await _sse(url, "capital of France?", "stream")
    shown = f"{ANSWER}\n\n({settings.unverified_text})" if fail_open else settings.unverified_text
    assert _content(held) == [shown]
    assert _content(streamed) == PIECES  # stream mode has shown the tokens already
    for events in (held, streamed):
        name, verdict = events[-2]
        assert name == "guardrail.verdict" and verdict["source"] == "timeout"
        assert verdict["decision"] == ("allow" if fail_open else "block")
        assert "reasons" not in verdict  # no sidecar decision to explain


def test_a_missing_verdict_fails_closed_unless_configured_open() -> None:
    closed, opened = ServiceSettings(), ServiceSettings(fail_open=True)
    assert (closed.on_timeout, opened.on_timeout) == ("block", "allow")
    fallback = {
        decision: VerdictResult("r1", decision, "timeout", verdict=None, waited_s=1.0)
        for decision in (Decision.BLOCK, Decision.ALLOW)
    }
    assert apply_verdict("the answer", fallback[Decision.BLOCK], closed) == closed.unverified_text
    assert apply_verdict("the answer", fallback[Decision.ALLOW], opened) == (
        f"the answer\n\n({opened.unverified_text})"
    )
    verdict = AnswerVerdict(
        request_id="r1",
        idempotency_key="k",
        decision=Decision.BLOCK,
        reasons=[],
        policy="p/1",
        rewritten_answer="Only this is verified.",
        produced_at="2024-01-01T00:00:00Z",  # type: ignore[arg-type]
        sidecar_version="0",
    )
    blocked = VerdictResult("r1", Decision.BLOCK, "sidecar", verdict=verdict, waited_s=0.1)
    assert apply_verdict("the answer", blocked, closed) == "Only this is verified."


def test_demo_service_says_where_its_questions_are_before_it_starts_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make demo-service`` from a checkout without the shared data beside it failed only
    after the broker, the sidecar and the service were up."""

    def no_broker(*args: object, **kwargs: object) -> None:
        raise AssertionError("a broker was started for questions that are not there")

    monkeypatch.setattr(demo_service, "ensure_jars", no_broker)
    monkeypatch.setattr(demo_service, "LocalKafka", no_broker)
    monkeypatch.chdir(tmp_path)
    assert demo_service.main() == 2
    assert "nq-open-oracle.dev.jsonl.gz" in capsys.readouterr().err
