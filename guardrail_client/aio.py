"""Ending a background task without losing the caller's own cancellation."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any]) -> BaseException | None:
    """Cancel ``task`` and wait until it has ended; returns the exception it ended with
    (``None`` when it was cancelled or returned).

    A cancellation of the caller meanwhile propagates. ``with suppress(CancelledError):
    await task`` absorbed that one too, so a ``stop()`` bounded by a timeout went on
    past it, and an error the task ended with raised out of the caller's ``stop()``.
    """
    task.cancel()
    await asyncio.wait({task})
    return None if task.cancelled() else task.exception()
