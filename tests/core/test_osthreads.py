"""The processor's thread carries a name the system shows (``top -H``, ``/proc``, the bench)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from sidecar.osthreads import MAX_NAME_BYTES, PROCESSOR_THREAD, name_this_thread

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl")


def own_comm() -> str:
    """The calling thread's name as the kernel shows it."""
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def in_a_thread(name: str) -> tuple[bool, str]:
    said: list[tuple[bool, str]] = []
    thread = threading.Thread(target=lambda: said.append((name_this_thread(name), own_comm())))
    thread.start()
    thread.join()
    return said[0]


@linux
def test_a_thread_gets_the_name_and_no_other_thread_does() -> None:
    before = own_comm()
    assert in_a_thread("gr-test") == (True, "gr-test")
    assert own_comm() == before  # the calling thread's own name unchanged


@linux
def test_the_processor_thread_name_fits_the_kernel() -> None:
    assert in_a_thread(PROCESSOR_THREAD) == (True, PROCESSOR_THREAD)
    assert in_a_thread("x" * MAX_NAME_BYTES) == (True, "x" * MAX_NAME_BYTES)


@pytest.mark.parametrize("name", ["", "x" * (MAX_NAME_BYTES + 1)])
def test_a_name_the_kernel_would_cut_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="1 to 15 ASCII bytes"):
        name_this_thread(name)
