"""When the processor thread last finished a unit of work: a long batch from a hung call.

A consumed batch is one call to the processor thread, and with claims on it can
legitimately take long (every completed request's claims are verified in it: a batch of
125 answers of 9 claim-window pairs is ~20 s here, more on a slower CPU). The health
checks (``LoopState.processing``) therefore count the time since the processor last
showed progress (a record admitted, a request scored), not the time since
the call began: a hung call stops the beats, a long batch keeps them coming.
"""

from __future__ import annotations

import time

__all__ = ["Progress"]


class Progress:
    """The monotonic time of the processor's last unit of work (written by the processor
    thread, read by the event loop: one float, assigned whole)."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = 0.0

    def beat(self) -> None:
        self.at = time.monotonic()
