"""The sidecar's processor thread, named for the operating system.

Python names its threads for itself only: the kernel shows every thread of the
process as ``python`` (``top -H``, ``ps -L``, ``perf``, ``/proc/<pid>/task``).
The one thread that decides (:class:`~sidecar.kafka.app.SidecarService`'s worker)
is named :data:`PROCESSOR_THREAD` there, so that anyone can tell the CPU spent
deciding from the CPU of the Kafka loop around it, from outside the process: an
operator with ``top -H``, and the bench (``guardrail bench``, ``bench/paired_drains.py``),
which reads that thread's CPU from ``/proc/<pid>/task/<tid>/stat``. Inside, the service
reads the same thread's clock for ``guardrail.processor.cpu_time``.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Final

__all__ = ["MAX_NAME_BYTES", "PROCESSOR_THREAD", "name_this_thread"]

log = logging.getLogger(__name__)

PROCESSOR_THREAD: Final = "gr-processor"
MAX_NAME_BYTES: Final = 15  # the kernel's TASK_COMM_LEN (16) less its terminating NUL
_PR_SET_NAME: Final = 15  # <linux/prctl.h>


def name_this_thread(name: str) -> bool:
    """Name the calling thread ``name`` as the kernel shows it (``prctl(PR_SET_NAME)``);
    False where the system has no such call (not Linux, or no C library to ask). Never
    raises for the system: it runs as a thread pool's initializer, whose error would
    break the pool."""
    encoded = name.encode("ascii")
    if not 0 < len(encoded) <= MAX_NAME_BYTES:
        raise ValueError(f"a thread name takes 1 to {MAX_NAME_BYTES} ASCII bytes, got {name!r}")
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(_PR_SET_NAME, ctypes.c_char_p(encoded), 0, 0, 0) != 0:
        log.debug("naming the thread %r failed (errno %d)", name, ctypes.get_errno())
        return False
    return True
