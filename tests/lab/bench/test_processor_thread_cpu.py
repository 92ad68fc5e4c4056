"""The bench splits a process's CPU into its processor thread's and the rest's (the loop)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from bench.paired_drains import with_rest
from sidecar.lab.bench.e2e import _proc_cpu_s, _processor_cpu_s, _thread_cpu_s
from sidecar.osthreads import name_this_thread

SPIN_S = 0.3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl")
def test_a_named_thread_cpu_is_read_from_outside_it() -> None:
    done, release = threading.Event(), threading.Event()

    def busy() -> None:
        start = time.thread_time()
        while time.thread_time() - start < SPIN_S:
            sum(range(1000))

    def spin() -> None:
        name_this_thread("gr-bench-spin")
        busy()
        done.set()
        release.wait(30)  # alive while it is read

    process_before = _proc_cpu_s(os.getpid())
    busy()  # this thread's CPU: the process's, not the named thread's
    thread = threading.Thread(target=spin)
    thread.start()
    try:
        assert done.wait(30)
        spent = _thread_cpu_s(os.getpid(), "gr-bench-spin")
        process = _proc_cpu_s(os.getpid()) - process_before
    finally:
        release.set()
        thread.join()
    assert spent is not None
    # clock ticks of 10 ms: the spin's own CPU, within a few ticks, not the process's
    assert SPIN_S - 0.02 <= spent <= SPIN_S + 0.05
    assert process >= 2 * SPIN_S - 0.02
    assert _thread_cpu_s(os.getpid(), "gr-none-such") is None
    assert _thread_cpu_s(2**22 + 7, "gr-bench-spin") is None  # no such process


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_process_without_a_processor_thread_is_not_split() -> None:
    # (not this one: the tests before may have left services' processor threads here)
    other = subprocess.Popen(["sleep", "30"])  # a process with no thread of ours
    try:
        assert _processor_cpu_s({other.pid: 0.0}) is None
    finally:
        other.kill()
        other.wait()


def test_each_run_with_its_processor_cpu_gets_the_rest() -> None:
    runs = [
        [{"cpu_us_per_request": 60.0, "processor_cpu_us_per_request": 5.5}],
        [{"cpu_us_per_request": 200.0}],
    ]
    with_rest(runs)
    assert runs[0][0]["rest_cpu_us_per_request"] == 54.5
    assert "rest_cpu_us_per_request" not in runs[1][0]
