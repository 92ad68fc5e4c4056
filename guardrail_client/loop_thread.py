"""An asyncio event loop on a daemon thread of its own: what the sync clients run on.

``SyncGuardrailPublisher`` and ``SyncVerdictClient`` wrap the async clients for
threaded services (Flask, Django, gunicorn's sync workers): each owns one
``LoopThread``, starts the async client on it, and hands coroutines to it from
the callers' threads. The thread belongs to the process that started it: in a
forked child it does not exist (``ended`` says so), and the child leaves the
parent's loop and sockets alone (``close``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("guardrail_client")
JOIN_TIMEOUT_S = 10.0  # how long close() waits for the loop thread to end


def _serve(loop: asyncio.AbstractEventLoop, abandoned: threading.Event) -> None:
    """The thread: run ``loop`` until stopped; close it there when ``close()`` gave up
    waiting for it (it could not close a loop still running)."""
    try:
        loop.run_forever()
    finally:
        if abandoned.is_set():
            _close_stopped(loop)


def _close_stopped(loop: asyncio.AbstractEventLoop) -> None:
    """Close a stopped loop after its tasks: those handed to it while a call blocked it
    are cancelled and run out (destroyed pending, they would warn)."""
    try:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    finally:
        loop.close()


class LoopThread:
    """One event loop running forever on a daemon thread, between ``start`` and ``close``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None  # the process that started the thread
        self._abandoned = threading.Event()  # close() gave up waiting for the thread

    def start(self) -> asyncio.AbstractEventLoop:
        """A new loop, running on a new daemon thread (the caller holds its client's lock)."""
        loop = asyncio.new_event_loop()
        self._abandoned = threading.Event()
        thread = threading.Thread(
            target=_serve, args=(loop, self._abandoned), name=self.name, daemon=True
        )
        thread.start()
        self.loop, self._thread, self._pid = loop, thread, os.getpid()
        return loop

    @property
    def forked(self) -> bool:
        """This process is not the one that started the thread (a fork after ``start``)."""
        return self._pid != os.getpid()

    def ended(self) -> str | None:
        """Why the loop can run nothing more (None while it can)."""
        if self.forked:
            return "the process forked after start(): the child has no loop thread"
        if self.loop is None or not self.loop.is_running():  # cheaper than Thread.is_alive()
            return "its event loop thread has ended (the loop stopped)"
        return None

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and wait (at most ``timeout_s``) for its result."""
        assert self.loop is not None  # noqa: S101 - started
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self, join_timeout_s: float = JOIN_TIMEOUT_S) -> bool:
        """Stop the loop, join its thread and close it; in a forked child, only forget them.

        False when the thread did not end within ``join_timeout_s`` (something blocks the
        loop): it is left to end on its own, a daemon, and the loop is not closed (closing a
        running loop raises); the caller goes on without it."""
        loop, thread, forked = self.loop, self._thread, self.forked
        self.loop = self._thread = self._pid = None
        if loop is None or thread is None or forked:
            return True  # a forked child leaves the parent's loop (and its sockets) alone
        if thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(join_timeout_s)
            if thread.is_alive():
                self._abandoned.set()  # the thread closes its loop when it gets to stop
                if not thread.is_alive():  # ... unless it ended just now
                    _close_stopped(loop)
                    return True
                log.warning(
                    "%s: the event loop thread did not stop within %.0f s (a call blocks it); "
                    "left to end on its own",
                    self.name,
                    join_timeout_s,
                )
                return False
        loop.close()
        return True
