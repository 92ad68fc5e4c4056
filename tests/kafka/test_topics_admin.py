"""``verify_topics`` closes its admin client when cancelled while connecting (SIGTERM at start)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

from sidecar.config import Settings
from sidecar.kafka import topics


class HangingAdmin:
    """An admin client whose broker never answers."""

    instances: ClassVar[list[HangingAdmin]] = []

    def __init__(self, **kwargs: Any) -> None:
        del kwargs
        self.closed = False
        HangingAdmin.instances.append(self)

    async def start(self) -> None:
        await asyncio.sleep(3600)

    async def close(self) -> None:
        self.closed = True


async def test_a_cancelled_start_closes_the_admin_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "AIOKafkaAdminClient", HangingAdmin)
    HangingAdmin.instances.clear()
    task = asyncio.create_task(topics.verify_topics(Settings.load()))
    while not HangingAdmin.instances:
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [admin] = HangingAdmin.instances
    assert admin.closed
