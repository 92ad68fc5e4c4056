"""The periodic heap trim: glibc's free heap pages go back to the kernel."""

from __future__ import annotations

import asyncio

import pytest

from sidecar import runtime
from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.heaptrim import HeapTrim, Trimmed, rss_bytes


def test_a_fragmented_heap_gives_pages_back() -> None:
    """1 KB objects come from malloc (over pymalloc's 512 bytes): keep one in 64 and free
    the rest, and the heap holds ~60 MB of free chunks between live ones that its top
    cannot give back; the trim returns their pages."""
    trim = HeapTrim()
    assert trim.available  # glibc (Linux CI, the image)
    trim()  # what earlier tests left
    blocks = [bytes(1024) for _ in range(64_000)]
    kept = blocks[::64]
    del blocks
    done = trim()
    assert done is not None
    assert done.rss_before is not None and done.rss_after is not None
    assert done.released > 20 * 2**20, done
    assert trim.calls == 2 and trim.released_bytes >= done.released
    assert len(kept) == 1_000


def test_without_malloc_trim_it_does_nothing() -> None:
    trim = HeapTrim(probe=False)
    assert not trim.available
    assert trim() is None
    assert trim.calls == 0


def _recording(calls: list[int]) -> HeapTrim:
    def fake(pad: int) -> int:
        calls.append(pad)
        return 1

    return HeapTrim(fake)


def test_an_injected_trim_is_called_with_zero_padding() -> None:
    calls: list[int] = []
    trim = _recording(calls)
    done = trim()
    assert calls == [0]
    assert isinstance(done, Trimmed) and done.seconds >= 0.0
    assert rss_bytes() is not None


def test_released_is_never_negative() -> None:
    assert Trimmed(100, 200, 0.0).released == 0
    assert Trimmed(None, 200, 0.0).released == 0
    assert Trimmed(300, 200, 0.0).released == 100


async def _run_trims(trim: HeapTrim, calls: list[int], until: int) -> None:
    """``runtime._trim_heap`` every 10 ms until ``calls`` has ``until`` entries (or 2 s)."""
    stop = asyncio.Event()
    task = asyncio.create_task(runtime._trim_heap(trim, stop, 0.01))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(calls) >= until:
            break
    stop.set()
    await asyncio.wait_for(task, 1.0)


async def test_the_runtime_trims_every_interval_until_stopped() -> None:
    calls: list[int] = []
    trim = _recording(calls)
    await _run_trims(trim, calls, 3)
    assert len(calls) >= 3 and trim.calls == len(calls)


async def test_a_failing_trim_never_stops_the_sidecar(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def broken(pad: int) -> int:
        calls.append(pad)
        raise OSError("no")

    await _run_trims(HeapTrim(broken), calls, 2)
    assert len(calls) >= 2
    assert "trimming the heap failed" in caplog.text


async def test_interval_zero_turns_it_off() -> None:
    stop = asyncio.Event()
    off = runtime._heap_trims(Settings.load(heap_trim_interval_s=0), stop)
    assert off is None
    on = runtime._heap_trims(Settings.load(), stop)
    assert on is not None and on.get_name() == "sidecar-heap-trim"
    stop.set()
    await asyncio.wait_for(on, 1.0)


@pytest.mark.parametrize("value", ["-1", "nan", "100000", "often"])
def test_a_bad_interval_stops_the_start(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("GUARDRAIL_HEAP_TRIM_INTERVAL_S", value)
    with pytest.raises(ConfigError, match=r"heap_trim_interval_s|HEAP_TRIM_INTERVAL_S"):
        Settings.load()
