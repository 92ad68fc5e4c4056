"""The README's runnable Python, run as a service runs it, against a real broker and sidecar.

A block is runnable when the line before its fence is ``<!-- runnable -->`` (invisible
once rendered). It runs as written, top-level ``await`` included: only what the README
leaves to the service is given (``retrieve``, ``generate``, the attention ``summary`` …),
and ``"kafka:9092"`` reaches the test's broker and topics through the client classes the
block imports. Then its ``answer()`` is asked one question, and the verdict it waited for
must be the sidecar's, not its ``on_timeout`` fallback.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import textwrap
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import guardrail_client
from guardrail_client import VerdictResult
from sidecar.config import Settings
from tests.client.conftest import SidecarFactory
from tests.docs.markdown import readme_text

_RUNNABLE = re.compile(r"^[ \t]*<!-- runnable -->\n([ \t]*)```python\n(.*?)^\1```", re.M | re.S)
README_BOOTSTRAP = "kafka:9092"
QUESTION = "who wrote frankenstein"
HITS = [
    {
        "chunk_id": "c1",
        "doc_id": "d1",
        "score": 0.83,
        "text": "Frankenstein is an 1818 novel by Mary Shelley.",
    }
]
PIECES = ("Frankenstein was written ", "by Mary Shelley.")


def runnable_blocks(text: str) -> list[str]:
    return [textwrap.dedent(body) for _, body in _RUNNABLE.findall(text)]


def _service() -> dict[str, Any]:
    """What the README's blocks leave to the service: its retriever, its generator, …"""

    async def generate(question: str, hits: list[dict[str, Any]]) -> AsyncIterator[str]:
        for piece in PIECES:
            yield piece

    return {
        "__name__": "readme",
        "retrieve": lambda question: HITS,
        "generate": generate,
        "summary": None,  # a service that cannot return attentions
        "mean_logprob": -0.4,
        "REFUSAL": "I cannot answer that.",
        "hits": HITS,
        "text": "".join(PIECES),
    }


def _route(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> list[VerdictResult]:
    """The client classes, as the blocks import them, on the test's broker and topics;
    every ``verdict()`` result they return is listed."""
    bootstrap, t = settings.kafka.bootstrap_servers, settings.topics
    inputs = {"retrieval_topic": t.retrieval, "generation_topic": t.generation}
    outputs = {"verdicts_topic": t.verdicts, "claims_topic": t.claims}
    results: list[VerdictResult] = []

    def routed(cls: type[Any], topics: dict[str, str]) -> type[Any]:
        class Routed(cls):  # type: ignore[misc]
            def __init__(self, bootstrap_servers: str, **options: Any) -> None:
                assert bootstrap_servers == README_BOOTSTRAP
                super().__init__(bootstrap, **topics, **options)

        if inspect.iscoroutinefunction(cls.__dict__.get("verdict")):

            async def verdict(self: Any, *args: Any, **kwargs: Any) -> VerdictResult:
                results.append(await cls.verdict(self, *args, **kwargs))
                return results[-1]

            Routed.verdict = verdict
        elif "verdict" in cls.__dict__:

            def sync_verdict(self: Any, *args: Any, **kwargs: Any) -> VerdictResult:
                results.append(cls.verdict(self, *args, **kwargs))
                return results[-1]

            Routed.verdict = sync_verdict
        return Routed

    for name, topics in (
        ("GuardrailPublisher", inputs),
        ("SyncGuardrailPublisher", inputs),
        ("VerdictClient", outputs),
        ("SyncVerdictClient", outputs),
    ):
        monkeypatch.setattr(guardrail_client, name, routed(getattr(guardrail_client, name), topics))
    return results


def test_the_readme_marks_its_service_code_runnable() -> None:
    blocks = runnable_blocks(readme_text())
    assert len(blocks) == 2, blocks  # the async service, the threaded one
    assert all(README_BOOTSTRAP in block for block in blocks)


def test_the_runnable_pattern_needs_the_marker() -> None:
    text = "<!-- runnable -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n"
    text += "- item:\n\n  <!-- runnable -->\n  ```python\n  z = 3\n  ```\n"
    assert runnable_blocks(text) == ["x = 1\n", "z = 3\n"]


@pytest.mark.connected
async def test_the_readme_service_code_gets_the_sidecars_verdict(
    client_settings: Settings,
    start_sidecar: SidecarFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_sidecar()
    results = _route(monkeypatch, client_settings)
    for number, block in enumerate(runnable_blocks(readme_text())):
        namespace = _service()
        code = compile(
            block, f"README.md runnable block {number}", "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        if code.co_flags & inspect.CO_COROUTINE:
            await eval(code, namespace)  # noqa: S307 - the README's own code
        else:
            await asyncio.to_thread(exec, code, namespace)
        answer, publisher, verdicts = (namespace[k] for k in ("answer", "publisher", "verdicts"))
        request_id = f"readme-{number}-{uuid.uuid4().hex[:8]}"
        before = len(results)
        try:
            if inspect.iscoroutinefunction(answer):
                shown = await answer(request_id, QUESTION)
                assert isinstance(shown, str) and shown.startswith("".join(PIECES))
            else:
                await asyncio.to_thread(answer, request_id, QUESTION)
        finally:
            for client in (publisher, verdicts):
                stopped = client.stop() if inspect.iscoroutinefunction(client.stop) else None
                if stopped is not None:
                    await stopped
                else:
                    await asyncio.to_thread(client.stop)
        waited = results[before:]
        assert [(r.request_id, r.source) for r in waited] == [(request_id, "sidecar")], number
        assert publisher.stats.delivered == publisher.stats.queued
