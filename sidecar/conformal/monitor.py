"""Online exchangeability monitor on mean(m1) (docs/methods.md §Retrieval certification).

Under exchangeability, a question with a correct chunk in its top K has that
chunk trusted with probability >= 1 - alpha (eq. 3), so the rate of retrievals with
at least one trusted chunk, mean(m1) (eq. 5), should not fall below 1 - alpha. The
source shows that it does when the retriever stops ranking correct chunks into the
top K (RB-tatqa, RB-finqa: mean(m1) of 61-76% at alpha = 0.1): the calibration no longer
describes the traffic. The monitor keeps, per calibration key, the last
``window`` values of m1 and their Wilson score interval
(:func:`sidecar.stats.intervals.wilson_interval`); when the interval's *upper*
bound falls below 1 - alpha, the shortfall is not sampling noise and the status
says "exchangeability broken, recalibrate". The alarm then holds until the rolling
mean(m1) itself is back at 1 - alpha (hysteresis, so it does not flap), and
``MonitorStatus.changed`` marks the edges to alert on.

One-sided on purpose: the source's other failure pattern, mean(m1) unexpectedly
high with m2 close to it (incorrect chunks trusted), has no bound to test against,
since m1 counts any trusted chunk, correct or not; without labels it looks like a
good retriever. Labelled feedback measures it (the coverage bound's epsilon).

The check runs after every observation; the stated confidence is per check,
not for the whole stream, so pick a high one (the default is 0.99) and treat
an alarm as a signal to look, not as a proof. Pure: no clock, no I/O.

The sidecar feeds it once per *decided* request (not when a retrieval arrives: a
retrieval whose answer never came, or one read again after a rebalance, is not
traffic the calibration served), and keys the global calibration's stand-ins by
tenant (:func:`monitor_key`): a tenant's own traffic cannot trip or clear another
tenant's alarm. At most ``max_keys`` windows are kept, the least recently fed
forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import StrEnum

from sidecar.conformal.certify import Certification
from sidecar.conformal.quantile import as_alpha
from sidecar.exceptions import ConfigError
from sidecar.stats.intervals import ProportionInterval, normal_quantile, wilson_interval

__all__ = ["MAX_KEYS", "ExchangeabilityMonitor", "MonitorState", "MonitorStatus", "monitor_key"]

MAX_KEYS = 4096
"""Windows kept (as the registry's resolved keys): a producer that invents keys evicts."""


def monitor_key(calibration_key: str, *, fallback: bool, tenant: str | None) -> str:
    """The window a certified retrieval counts in: its calibration key, and for a
    stand-in global calibration the tenant too (``global[acme]``).

    A tenant's own calibration key already names it; the global calibration serves
    every tenant without one, and one window for all of them let one tenant's
    retrievals trip (36 in the audit) or clear (124) the alarm that caveats the others'
    answers.
    """
    if not fallback or not tenant:
        return calibration_key
    return f"{calibration_key}[{tenant}]"


class MonitorState(StrEnum):
    """The monitor's verdict for one calibration key."""

    WARMING_UP = "warming-up"
    OK = "ok"
    BROKEN = "exchangeability-broken"


# one global read each in record_m1 (a member read through its enum class is ~0.09 us)
_WARMING_UP, _OK, _BROKEN = MonitorState.WARMING_UP, MonitorState.OK, MonitorState.BROKEN


@dataclass(frozen=True, slots=True)
class MonitorStatus:
    """The rolling mean(m1) of one key, its Wilson interval and the verdict."""

    key: str
    calibration_id: str
    state: MonitorState
    changed: bool
    """True when ``state`` differs from the previous observation's (alert on edges)."""
    n: int
    m1_mean: float
    interval: ProportionInterval
    target: float
    """1 - alpha: the least mean(m1) exchangeability allows."""
    min_samples: int
    confidence: float
    """Of the Wilson interval."""

    @property
    def broken(self) -> bool:
        """True when the Wilson upper bound of mean(m1) is below 1 - alpha."""
        return self.state is MonitorState.BROKEN

    @property
    def message(self) -> str:
        """The verdict in words (built when read: most observations are never reported)."""
        n, mean, interval, target = self.n, self.m1_mean, self.interval, self.target
        if self.state is MonitorState.WARMING_UP:
            return (
                f"{self.key}: {n} of {self.min_samples} retrievals needed before judging "
                f"exchangeability; mean(m1)={mean:.3f}"
            )
        if self.state is MonitorState.BROKEN:
            return (
                f"{self.key}: exchangeability broken, recalibrate: mean(m1)={mean:.3f} over the "
                f"last {n} retrievals, Wilson {self.confidence:.3g} upper bound "
                f"{interval.high:.3f} < 1 - alpha = {target:.3f}"
            )
        return (
            f"{self.key}: mean(m1)={mean:.3f} over the last {n} retrievals, Wilson "
            f"{self.confidence:.3g} interval [{interval.low:.3f}, {interval.high:.3f}] "
            f"reaches 1 - alpha = {target:.3f}"
        )


@dataclass(slots=True)
class _Window:
    alpha: float
    calibration_id: str
    target: float  # 1 - alpha, computed exactly once per window
    values: deque[bool] = field(default_factory=deque)
    successes: int = 0
    state: MonitorState = MonitorState.WARMING_UP
    changed: bool = False  # the last observation changed ``state``


class ExchangeabilityMonitor:
    """Rolling mean(m1) per calibration key with a Wilson-interval alarm."""

    def __init__(
        self,
        *,
        window: int = 500,
        confidence: float = 0.99,
        min_samples: int = 50,
        max_keys: int = MAX_KEYS,
    ) -> None:
        if isinstance(max_keys, bool) or max_keys < 1:
            raise ConfigError(f"max_keys must be a positive number of keys, got {max_keys!r}")
        if isinstance(window, bool) or window < 1:
            raise ConfigError(f"window must be a positive number of retrievals, got {window!r}")
        if isinstance(min_samples, bool) or not 1 <= min_samples <= window:
            raise ConfigError(f"min_samples must be in [1, window={window}], got {min_samples!r}")
        normal_quantile(confidence)  # validates 0 < confidence < 1
        self.window = window
        self.confidence = confidence
        self.min_samples = min_samples
        self.max_keys = max_keys
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._last: dict[str, _Window] = {}  # observed keys' windows (dict order)

    def observe(self, certification: Certification) -> MonitorStatus:
        """Record one certified retrieval under the key of the calibration that certified it."""
        return self.observe_m1(
            certification.calibration_key,
            certification.m1,
            certification.alpha,
            calibration_id=certification.calibration_id,
        )

    def observe_m1(
        self, key: str, m1: bool, alpha: float, *, calibration_id: str = ""
    ) -> MonitorStatus:
        """Record one m1 value for ``key``; a new alpha or calibration id restarts the window."""
        self.record_m1(key, m1, alpha, calibration_id=calibration_id)
        return self._status(key, self._windows[key])

    def record_m1(self, key: str, m1: bool, alpha: float, *, calibration_id: str = "") -> None:
        """:meth:`observe_m1` without its ``MonitorStatus``: the sidecar feeds the monitor
        once per decided request and reads a status only when a retrieval is certified or
        the metrics are exported (building one per request was ~3 us of the fast path)."""
        win = self._windows.get(key)
        if win is None or win.alpha != alpha or win.calibration_id != calibration_id:
            target = float(1 - as_alpha(alpha))
            win = _Window(alpha=alpha, calibration_id=calibration_id, target=target)
            self._windows[key] = win
        self._windows.move_to_end(key)
        while len(self._windows) > self.max_keys:
            old, _ = self._windows.popitem(last=False)
            self._last.pop(old, None)
        target = win.target
        values = win.values
        m1 = bool(m1)
        values.append(m1)
        successes = win.successes + m1
        if len(values) > self.window:
            successes -= values.popleft()
        win.successes = successes
        n = len(values)
        if n < self.min_samples:
            state = _WARMING_UP
        elif wilson_interval(successes, n, self.confidence).high < target or (
            win.state is _BROKEN and successes / n < target
        ):
            # Hysteresis: once broken, the alarm holds until the rolling mean itself is back
            # at 1 - alpha, so a window hovering at the bound does not flap.
            state = _BROKEN
        else:
            state = _OK
        win.changed = state is not win.state
        win.state = state
        # the key's window, in the order keys were first observed (``statuses``)
        self._last[key] = win

    def resume(self, key: str, *, was_broken: bool) -> MonitorState | None:
        """Judge the window of ``key`` again as :meth:`record_m1` judged its last
        observation, with the state before it given: ``was_broken`` (a warm start refilled
        the window from the fleet's verdicts, and the latest read the alarm on). Without it
        a restart cleared an alarm whose window sits between the Wilson bound and
        1 - alpha (held by hysteresis), and could hold one the fleet had cleared. Not an
        edge (``changed`` is False). ``None`` for a key without a window."""
        win = self._windows.get(key)
        if win is None:
            return None
        n = len(win.values)
        if n < self.min_samples:
            state = _WARMING_UP
        elif wilson_interval(win.successes, n, self.confidence).high < win.target or (
            was_broken and win.successes / n < win.target
        ):
            state = _BROKEN
        else:
            state = _OK
        win.state = state
        win.changed = False
        return state

    def _status(self, key: str, win: _Window) -> MonitorStatus:
        """The status of ``key`` after its window's latest observation."""
        n = len(win.values)
        return MonitorStatus(
            key=key,
            calibration_id=win.calibration_id,
            state=win.state,
            changed=win.changed,
            n=n,
            m1_mean=win.successes / n,
            interval=wilson_interval(win.successes, n, self.confidence),
            target=win.target,
            min_samples=self.min_samples,
            confidence=self.confidence,
        )

    def reading(
        self, key: str, alpha: float, calibration_id: str
    ) -> tuple[MonitorState, float | None]:
        """The state and mean(m1) a new retrieval of ``key`` is judged by, without feeding
        it: warming up with no mean when the key has no window under this calibration."""
        win = self._last.get(key)
        if win is None:
            return MonitorState.WARMING_UP, None
        if win.alpha != alpha or win.calibration_id != calibration_id:
            return MonitorState.WARMING_UP, None  # its next observation restarts the window
        return win.state, win.successes / len(win.values)

    def status(self, key: str) -> MonitorStatus | None:
        """The latest status of ``key`` (``None`` before its first observation)."""
        win = self._last.get(key)
        return None if win is None else self._status(key, win)

    def statuses(self) -> dict[str, MonitorStatus]:
        """Latest status of every key seen."""
        return {key: self._status(key, win) for key, win in self._last.items()}

    def reset(self, key: str | None = None) -> None:
        """Forget one key's window (after recalibration) or all of them."""
        if key is None:
            self._windows.clear()
            self._last.clear()
        else:
            self._windows.pop(key, None)
            self._last.pop(key, None)
