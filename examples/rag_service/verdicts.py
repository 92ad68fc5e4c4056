"""Verdicts for the reference service: wait for a request's verdict, apply it to the answer.

:class:`VerdictWaiter` is one consumer (no group: every partition assigned,
positioned at its end at start) with an in-memory map request_id -> future; a
request registers before its events are published, so its verdict cannot be
missed. Only final-stage verdicts resolve a request. :func:`apply_verdict` is
pure: block -> the policy's verified-only text or the refusal, caveat -> the
(rewritten) answer followed by the caveat, allow -> the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer
from pydantic import ValidationError

from examples.rag_service.config import ServiceSettings
from sidecar.contracts.events import AnswerVerdict, Decision

__all__ = ["VerdictWaiter", "apply_verdict"]

log = logging.getLogger(__name__)


def apply_verdict(answer: str, verdict: AnswerVerdict | None, settings: ServiceSettings) -> str:
    """The text a user sees in hold mode."""
    if verdict is None:
        if settings.fail_open:
            return f"{answer}\n\n({settings.unverified_text})"
        return settings.unverified_text
    if verdict.decision is Decision.BLOCK:
        return verdict.rewritten_answer or settings.refusal_text
    if verdict.decision is Decision.CAVEAT:
        body = verdict.rewritten_answer or answer
        return f"{body}\n\n{verdict.caveat_text or settings.caveat_text}"
    return answer


class VerdictWaiter:
    """Reads the verdict topic and hands each final verdict to the request waiting for it."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self.topic = topic
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            enable_auto_commit=False,
            auto_offset_reset="latest",
        )
        self._waiting: dict[str, asyncio.Future[AnswerVerdict]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 30.0) -> None:
        """Every partition assigned (no group), positioned at its end: only new verdicts."""
        await self._consumer.start()
        self._consumer.subscribe([self.topic])
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not self._consumer.assignment():
            if asyncio.get_running_loop().time() > deadline:
                await self._consumer.stop()
                raise TimeoutError(f"no partition of the verdict topic {self.topic!r} assigned")
            await asyncio.sleep(0.05)
        for tp in self._consumer.assignment():
            await self._consumer.position(tp)  # resolves "latest" now, before any request
        self._task = asyncio.create_task(self._run(), name="verdict-waiter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._consumer.stop()

    def expect(self, request_id: str) -> None:
        """Register before publishing the request's events."""
        self._waiting[request_id] = asyncio.get_running_loop().create_future()

    def forget(self, request_id: str) -> None:
        """Stop waiting for ``request_id`` (its events were never all published)."""
        self._waiting.pop(request_id, None)

    async def wait(self, request_id: str, timeout_s: float) -> AnswerVerdict | None:
        """The request's final verdict, or ``None`` after ``timeout_s``."""
        future = self._waiting[request_id]
        try:
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return None
        finally:
            self._waiting.pop(request_id, None)

    async def _run(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    self._deliver(record.value)

    def _deliver(self, value: bytes | None) -> None:
        try:
            verdict = AnswerVerdict.model_validate_json(value or b"")
        except ValidationError as exc:
            log.warning("ignored a record on %s that is not a verdict: %s", self.topic, exc)
            return
        future = self._waiting.get(verdict.request_id)
        if verdict.stage == "final" and future is not None and not future.done():
            future.set_result(verdict)
