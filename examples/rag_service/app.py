"""The reference RAG service's HTTP side: OpenAI-compatible chat completions with verdicts.

``POST /v1/chat/completions`` answers the last user message: retrieve, publish
the retrieval event, generate (publishing one delta per text piece), publish
the final event, then act on the sidecar's verdict. Events leave through the
kit's :class:`~guardrail_client.GuardrailPublisher` (contract-checked, keyed by
request_id, ``traceparent`` attached); the verdict comes from the kit's
:class:`~guardrail_client.VerdictClient`, whose ``on_timeout`` is the service's
fail-open / fail-closed setting. The header ``x-guardrail-mode`` picks how:

* ``stream`` (default): tokens go to the client as they are generated; the
  verdict follows as a final SSE event ``guardrail.verdict`` (before ``[DONE]``).
* ``hold``: nothing is shown until the verdict arrives; then the answer as the
  verdict allows it (:func:`~examples.rag_service.verdicts.apply_verdict`),
  then the ``guardrail.verdict`` event.

``stream: false`` returns one ``chat.completion`` object with the same text and
a ``guardrail`` field. Generation runs in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from aiohttp import web

from examples.rag_service.config import ServiceSettings
from examples.rag_service.verdicts import apply_verdict
from guardrail_client import (
    AttentionSummary,
    GuardrailPublisher,
    RetrievalHit,
    VerdictClient,
    VerdictResult,
)

__all__ = ["MODE_HEADER", "Answerer", "Generated", "RagService"]

MODE_HEADER = "x-guardrail-mode"
Mode = Literal["stream", "hold"]
_END = object()


@dataclass(frozen=True, slots=True)
class Generated:
    """What the generator knows at the end: the attention summary and log-probability."""

    attention: AttentionSummary | None
    mean_token_logprob: float | None


class Answerer(Protocol):
    """Retrieval plus generation; both blocking (they run in a worker thread)."""

    @property
    def generator_model(self) -> str: ...

    def retrieve(self, question: str, k: int) -> list[RetrievalHit]: ...

    def generate(
        self, question: str, hits: Sequence[RetrievalHit], emit: Callable[[str], None]
    ) -> Generated:
        """Generate, calling ``emit`` with each text piece as it is decoded."""
        ...


class _BadRequest(Exception):
    pass


def _question(body: Any) -> tuple[str, bool]:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise _BadRequest("the body must be a JSON object with a 'messages' list")
    users = [m for m in body["messages"] if isinstance(m, dict) and m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str) or not users[-1]["content"]:
        raise _BadRequest("'messages' needs a user message with non-empty string content")
    return users[-1]["content"], bool(body.get("stream", False))


def _chunk(request_id: str, model: str, content: str | None, finish: str | None) -> bytes:
    delta = {"content": content} if content is not None else {}
    obj = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(obj)}\n\n".encode()


def _verdict_json(result: VerdictResult) -> dict[str, Any]:
    """The decision acted on; ``source`` says whether the sidecar made it or the fallback did."""
    fields: dict[str, Any] = {"decision": result.decision.value, "source": result.source}
    if result.verdict is not None:
        fields |= {
            "reasons": [r.code for r in result.verdict.reasons],
            "confidence": result.verdict.confidence,
            "caveat_text": result.verdict.caveat_text,
            "policy": result.verdict.policy,
        }
    return fields


class RagService:
    """The aiohttp application around an :class:`Answerer` and the kit's publisher and client.

    ``verdicts`` waits ``settings.verdict_timeout_ms`` and falls back to its
    ``on_timeout`` (see :func:`examples.rag_service.server.running`).
    """

    def __init__(
        self,
        settings: ServiceSettings,
        answerer: Answerer,
        publisher: GuardrailPublisher,
        verdicts: VerdictClient,
    ) -> None:
        self.settings = settings
        self.answerer = answerer
        self.publisher = publisher
        self.verdicts = verdicts
        self._generation = asyncio.Lock()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/healthz", self.health)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        mode = request.headers.get(MODE_HEADER, "stream").lower()
        if mode not in ("stream", "hold"):
            return web.json_response(
                {"error": f"{MODE_HEADER} must be 'stream' or 'hold', got {mode!r}"}, status=400
            )
        try:
            question, stream = _question(await request.json())
        except (_BadRequest, json.JSONDecodeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        request_id = f"svc-{uuid.uuid4().hex[:16]}"
        # its verdict may come while the answer still streams: kept for this replica until
        # asked for, whatever the rest of the fleet's verdicts pass through the client meanwhile
        self.verdicts.expect(request_id)
        pieces: asyncio.Queue[object] = asyncio.Queue()
        producing = asyncio.create_task(self._produce(request_id, question, pieces))
        response: web.StreamResponse | None = None
        if stream:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
        shown: list[str] = []
        while (piece := await pieces.get()) is not _END:
            shown.append(str(piece))
            if response is not None and mode == "stream":
                await response.write(
                    _chunk(request_id, self.answerer.generator_model, shown[-1], None)
                )
        await producing
        result = await self.verdicts.verdict(request_id)
        answer = "".join(shown)
        text = answer if mode == "stream" else apply_verdict(answer, result, self.settings)
        model = self.answerer.generator_model
        if response is None:
            return web.json_response(
                {
                    "id": request_id,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "guardrail": {"mode": mode, **_verdict_json(result)},
                }
            )
        if mode == "hold":
            await response.write(_chunk(request_id, model, text, None))
        await response.write(_chunk(request_id, model, None, "stop"))
        payload = json.dumps({"request_id": request_id, "mode": mode, **_verdict_json(result)})
        await response.write(f"event: guardrail.verdict\ndata: {payload}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _produce(self, request_id: str, question: str, pieces: asyncio.Queue[object]) -> None:
        """Retrieve, generate and publish every event; text pieces go to ``pieces``."""
        s, publish = self.settings, self.publisher
        try:
            hits = await asyncio.to_thread(self.answerer.retrieve, question, s.k)
            await publish.retrieval(
                request_id,
                question,
                hits,
                tenant=s.tenant,
                collection=s.collection,
                retriever=s.retriever,
                k=s.k,
                created_at=datetime.now(UTC),
            )
            loop = asyncio.get_running_loop()
            raw: asyncio.Queue[str | None] = asyncio.Queue()
            texts: list[str] = []

            def emit(text: str) -> None:
                loop.call_soon_threadsafe(raw.put_nowait, text)

            async with self._generation:
                job = asyncio.ensure_future(
                    asyncio.to_thread(self.answerer.generate, question, hits, emit)
                )
                job.add_done_callback(lambda _: raw.put_nowait(None))
                while (text := await raw.get()) is not None:
                    pieces.put_nowait(text)  # the client first, then Kafka
                    texts.append(text)
                    await publish.delta(request_id, text)  # queued: never waits on Kafka
                generated = await job
            await publish.final(
                request_id,
                "".join(texts),
                attention=generated.attention,
                logprob=generated.mean_token_logprob,
            )
        finally:
            pieces.put_nowait(_END)
