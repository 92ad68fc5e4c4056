"""The exchangeability monitor refilled from decided requests (a restart's warm start).

A replica that restarts reads the fleet's final verdicts back
(:mod:`sidecar.kafka.warmstart`) and hands their retrieval signals to
``ConformalCertifier.seed_decided``: with a window's worth of them, its windows and
alarms are those of the replica that decided them, hysteresis included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sidecar.config import Settings
from sidecar.conformal.monitor import ExchangeabilityMonitor, MonitorState
from sidecar.conformal.signal import ConformalCertifier
from sidecar.contracts.events import RetrievalEvent, RetrievalSignal
from sidecar.contracts.verdicts import SCORES_RISING
from sidecar.runtime import build_signals
from tests.conformal.test_signal import _nq_event, _shipped_settings
from tests.conftest import EventFactory

KEY = "default/nq-open/qdrant-minilm-l6"


def certifier(settings_factory: Callable[..., Settings], **signals: Any) -> ConformalCertifier:
    settings = _shipped_settings(settings_factory)
    if signals:
        settings = settings.model_copy(
            update={"signals": settings.signals.model_copy(update=signals)}
        )
    found = build_signals(settings).certifier
    assert isinstance(found, ConformalCertifier)
    return found


def decide(
    c: ConformalCertifier, retrieval_event: EventFactory, pattern: list[bool], tenant: str
) -> list[tuple[str | None, RetrievalSignal]]:
    """Decide one request per entry (m1 as given) the way the processor does: certify,
    then count; returns what the final verdicts carry."""
    out: list[tuple[str | None, RetrievalSignal]] = []
    for i, m1 in enumerate(pattern):
        raw = _nq_event(retrieval_event, f"{tenant}-{i}", tenant, 0.05 if m1 else -0.05)
        event = RetrievalEvent.model_validate(raw)
        signal = c.certify(event)
        assert signal.m1 is m1
        c.observe_decided(event, signal)
        out.append((event.tenant, signal))
    return out


def states(c: ConformalCertifier) -> dict[str, tuple[MonitorState, int, float]]:
    return {k: (s.state, s.n, s.m1_mean) for k, s in c.monitor.statuses().items()}


def spaced(rate_in_25: int, n: int) -> list[bool]:
    """``rate_in_25`` of every 25 requests with a trusted chunk, evenly spread."""
    return [(i % 25) < rate_in_25 for i in range(n)]


def test_a_seeded_replica_holds_the_windows_and_alarms_of_the_one_that_decided(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    a = certifier(settings_factory)
    # default (own calibration key): broken, then recovering into the hysteresis band:
    # mean(m1) 0.88 < 1 - alpha = 0.9 while the Wilson bound (0.99) reaches 0.9
    decided = decide(a, retrieval_event, [False] * 200 + spaced(22, 700), "default")
    # a tenant on the global calibration, healthy; and one broken outright
    decided += decide(a, retrieval_event, [True] * 300, "acme")
    decided += decide(a, retrieval_event, [False] * 80, "evil")
    before = states(a)
    assert before[KEY][0] is MonitorState.BROKEN
    status = a.monitor.status(KEY)
    assert status is not None and status.interval.high >= status.target > status.m1_mean
    assert before["global[acme]"][0] is MonitorState.OK
    assert before["global[evil]"][0] is MonitorState.BROKEN

    b = certifier(settings_factory)
    seed = b.seed_decided(decided)
    assert states(b) == before
    assert seed.keys == 3 and set(seed.broken) == {KEY, "global[evil]"}
    assert seed.fed == 500 + 300 + 80  # each window's last 500 at most
    # the next decision is judged as the first replica would have judged it
    event = RetrievalEvent.model_validate(_nq_event(retrieval_event, "next", "default", 0.05))
    assert b.certify(event).monitor == a.certify(event).monitor == "exchangeability-broken"


def test_without_the_verdicts_reading_the_hysteresis_band_would_read_ok(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    """The state comes from the latest verdict's reading, not from the window alone."""
    a = certifier(settings_factory)
    decided = decide(a, retrieval_event, [False] * 200 + spaced(22, 700), "default")
    unread = [(t, s.model_copy(update={"monitor": "ok"})) for t, s in decided]
    b = certifier(settings_factory)
    assert b.seed_decided(unread).broken == ()
    assert states(b)[KEY][0] is MonitorState.OK
    # and one the fleet had cleared, with the same window, stays cleared
    cleared = [(t, s.model_copy(update={"monitor": "ok"})) for t, s in decided[-500:]]
    c = certifier(settings_factory)
    c.seed_decided(cleared)
    assert states(c)[KEY][0] is MonitorState.OK


def test_only_the_latest_calibration_and_certified_retrievals_are_counted(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    a = certifier(settings_factory)
    decided = decide(a, retrieval_event, [False] * 60, "default")
    older = [
        (t, s.model_copy(update={"calibration_version": "cal-older", "monitor": "ok"}))
        for t, s in decide(certifier(settings_factory), retrieval_event, [True] * 60, "default")
    ]
    vacuous = [(t, s.model_copy(update={"certifiable": False})) for t, s in decided[:10]]
    rising = [(t, s.model_copy(update={"fallback_reason": SCORES_RISING})) for t, s in decided]
    b = certifier(settings_factory)
    # a fleet mid-rollout: the older calibration's decisions interleave with the served one's
    mixed = [x for pair in zip(older, decided, strict=True) for x in pair]
    seed = b.seed_decided([*vacuous, *rising, *mixed])
    assert seed.fed == 60 and seed.keys == 1
    assert states(b) == states(a)
    assert b.monitor.reading(KEY, 0.1, a.version)[0] is MonitorState.BROKEN


def test_a_short_read_leaves_the_window_warming_up(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    a = certifier(settings_factory)
    decided = decide(a, retrieval_event, [False] * 200, "default")
    b = certifier(settings_factory)
    seed = b.seed_decided(decided[-20:])  # fewer than the 50 the monitor judges on
    assert seed.broken == () and states(b)[KEY][:2] == (MonitorState.WARMING_UP, 20)
    assert b.seed_decided([]).keys == 0


def test_resume_is_not_an_edge_and_needs_a_window() -> None:
    monitor = ExchangeabilityMonitor(window=100, min_samples=10)
    assert monitor.resume("none", was_broken=True) is None
    for i in range(100):
        monitor.record_m1("k", i % 10 != 0, 0.05)  # 0.9 < 1 - alpha = 0.95, inside Wilson's
    assert monitor.resume("k", was_broken=False) is MonitorState.OK
    assert monitor.resume("k", was_broken=True) is MonitorState.BROKEN
    status = monitor.status("k")
    assert status is not None and status.broken and not status.changed


@pytest.mark.parametrize("window", [10, 50])
def test_a_smaller_window_takes_the_last_of_them(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory, window: int
) -> None:
    a = certifier(settings_factory, monitor_window=window)
    decided = decide(a, retrieval_event, [True] * 100 + [False] * 30, "default")
    b = certifier(settings_factory, monitor_window=window)
    assert b.seed_decided(decided).fed == window
    assert states(b) == states(a)
