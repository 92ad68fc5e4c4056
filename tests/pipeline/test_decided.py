"""Decided request keys: remembered for the decided memory, 12 bytes each."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import Settings
from sidecar.pipeline import decided
from sidecar.pipeline.decided import DecidedKeys
from sidecar.pipeline.join import JoinStore


def test_a_late_event_is_recognised_after_more_decisions_than_the_old_bound() -> None:
    """200,000 keys were an OrderedDict of strings, capped at 200,000: at 5,000 answers/s,
    40 s of memory instead of 10 minutes, and 199,999 + 1 other decisions later a
    straggler opened its request again for a second verdict (helper-15)."""
    join = Settings.load().join
    store = JoinStore(
        join.max_entries,
        join.ttl_ms,
        decided_memory_ms=join.decided_memory_ms,
        decided_max_entries=join.decided_max_entries,
    )
    for i in range(300_000):
        store.close(f"req-{i}", 1_000.0 + i / 5)  # 5,000 a second
    now = 1_000.0 + 300_000 / 5
    assert store.was_closed("req-0", now)
    assert store.was_closed("req-299999", now)
    assert not store.was_closed("req-300000", now)
    assert not store.was_closed("req-0", 1_000.0 + join.decided_memory_ms + 1_001.0)


def test_a_key_costs_twelve_bytes_once_sealed() -> None:
    keys = DecidedKeys(memory_ms=600_000.0, max_entries=3_000_000)
    for i in range(decided.SEAL_EVERY * 3):
        keys.add(f"tenant/req-{i}", 10.0)
    assert keys.nbytes == 12 * decided.SEAL_EVERY * 3 + (1 << 21)  # and the 2 MiB filter


def test_past_max_entries_the_oldest_leave_and_expiry_gives_memory_back() -> None:
    keys = DecidedKeys(memory_ms=10_000.0, max_entries=4)
    for i in range(8):  # seals every 4: the older 4 leave
        keys.add(f"k{i}", 1_000.0 * i)
    assert not keys.contains("k0", 8_000.0) and keys.contains("k7", 8_000.0)
    keys.expire(100_000.0)
    assert len(keys) == 0 and keys.nbytes == 0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "ask", "expire"]), st.integers(0, 20), st.integers(0, 3)),
        max_size=150,
    )
)
def test_membership_is_a_dict_of_last_close_times(ops: list[tuple[str, int, int]]) -> None:
    """Against a plain dict (whole seconds: sealed times keep seconds), sealing every 4."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decided, "SEAL_EVERY", 4)
        _replay(ops)


def _replay(ops: list[tuple[str, int, int]]) -> None:
    memory_ms = 5_000.0
    keys = DecidedKeys(memory_ms=memory_ms, max_entries=1_000)
    model: dict[str, float] = {}
    now = 0.0
    for op, k, step in ops:
        now += step * 1_000.0
        key = f"k{k}"
        if op == "add":
            keys.add(key, now)
            model[key] = now
        elif op == "expire":
            keys.expire(now)
        want = key in model and now - model[key] <= memory_ms
        assert keys.contains(key, now) is want
