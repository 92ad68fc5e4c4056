"""The retrieval-coverage bound on the hallucination rate, with Wilson intervals.

The formula and its source: docs/methods.md §Coverage bound.

A request is *covered* when retrieval gave it at least one trusted (supporting)
chunk. With coverage ``c = P(covered)``, the generator's error rate on covered
requests ``eps`` and its leakage ``delta`` (the rate of confidently wrong, not
abstained, answers when the evidence is absent), Theorem 1 of the source gives::

    H <= H* = c * eps + (1 - c) * delta

Each of ``c``, ``eps`` and ``delta`` is a binomial proportion with a Wilson score
interval (:func:`sidecar.stats.intervals.wilson_interval`). ``delta`` comes from
the leakage probe (questions whose context omits the answer by construction) when
it has trials, else from labelled uncovered traffic. ``H*`` is linear in ``c``, so
over the box ``[c_low, c_high] x [eps_low, eps_high] x [delta_low, delta_high]``::

    bound_high = max_{c in {c_low, c_high}} c * eps_high + (1 - c) * delta_high
    bound_low  = min_{c in {c_low, c_high}} c * eps_low  + (1 - c) * delta_low

The measured rate ``H = (errors_covered + errors_uncovered) / (labelled_covered +
labelled_uncovered)`` gets its own Wilson interval (reported). Labels are rarely drawn
uniformly (users flag bad answers), and that pooled rate then leans to the stratum
labelled more often, so the verdict reads the rate re-weighted by stratum,
``c * eps_hat + (1 - c) * delta_labelled_hat`` with ``delta_labelled`` the error
rate of labelled uncovered answers, over the same kind of box: the bound is
*violated* when even that box's low end is above ``bound_high``. Without a probe
``delta`` is that same labelled rate, so the bound is an estimate from the labels,
not a test of them, and is never violated. Each interval is at
``confidence`` on its own (not a joint statement; for a joint one over the four
intervals use ``1 - (1 - confidence)/4`` per interval, by Bonferroni).

:class:`CoverageTracker` keeps these counts per calibration key over a sliding
window of traffic. Pure stdlib (no numpy), no I/O.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

from sidecar.confidence.errors import ConfidenceDataError
from sidecar.exceptions import ConfigError
from sidecar.stats.intervals import ProportionInterval, normal_quantile, wilson_interval

__all__ = [
    "BoundReport",
    "BoundStatus",
    "CoverageCounts",
    "CoverageTracker",
    "DeltaSource",
    "coverage_bound",
]

DeltaSource = Literal["probe", "labelled-uncovered", "none"]
BoundStatus = Literal["holds", "violated", "insufficient-data"]


@dataclass(frozen=True, slots=True)
class CoverageCounts:
    """Counts behind one bound.

    ``covered`` of ``requests`` had >= 1 trusted chunk. Of the labelled requests,
    ``errors_*`` were wrong and not abstained (hallucinations), split by coverage.
    ``probe_trials`` / ``probe_errors``: the optional leakage probe (uncovered by
    construction; an error is a confidently wrong answer).
    """

    requests: int
    covered: int
    labelled_covered: int = 0
    errors_covered: int = 0
    labelled_uncovered: int = 0
    errors_uncovered: int = 0
    probe_trials: int = 0
    probe_errors: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfidenceDataError(f"{f.name} must be an integer >= 0, got {value!r}")
        for part, whole in (
            ("covered", "requests"),
            ("errors_covered", "labelled_covered"),
            ("errors_uncovered", "labelled_uncovered"),
            ("probe_errors", "probe_trials"),
        ):
            if getattr(self, part) > getattr(self, whole):
                raise ConfidenceDataError(
                    f"{part} must be <= {whole}, got {getattr(self, part)} > {getattr(self, whole)}"
                )


def _interval_dict(ci: ProportionInterval) -> dict[str, float | int | None]:
    return {
        "estimate": _finite_or_none(ci.estimate),
        "low": ci.low,
        "high": ci.high,
        "successes": ci.successes,
        "trials": ci.trials,
    }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class BoundReport:
    """The bound ``H*`` with its interval, the measured rate ``H`` and the verdict.

    ``bound`` and ``slack`` are NaN when a needed count is 0 (``status`` is then
    ``"insufficient-data"``); ``slack = bound_high - H``.
    """

    confidence: float
    coverage: ProportionInterval
    eps: ProportionInterval
    delta: ProportionInterval
    delta_source: DeltaSource
    bound: float
    bound_low: float
    bound_high: float
    measured: ProportionInterval
    status: BoundStatus
    slack: float
    measured_weighted: float = math.nan
    """``c * eps_hat + (1 - c) * delta_labelled_hat``: the measured rate re-weighted by
    stratum, so it does not depend on how often covered vs uncovered answers get labels."""
    measured_weighted_low: float = 0.0
    measured_weighted_high: float = 1.0

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly: intervals as dicts, NaN as None."""
        return {
            "status": self.status,
            "confidence": self.confidence,
            "coverage": _interval_dict(self.coverage),
            "eps": _interval_dict(self.eps),
            "delta": _interval_dict(self.delta),
            "delta_source": self.delta_source,
            "bound": _finite_or_none(self.bound),
            "bound_low": self.bound_low,
            "bound_high": self.bound_high,
            "measured": _interval_dict(self.measured),
            "slack": _finite_or_none(self.slack),
            "measured_weighted": _finite_or_none(self.measured_weighted),
            "measured_weighted_low": self.measured_weighted_low,
            "measured_weighted_high": self.measured_weighted_high,
        }


def _delta(counts: CoverageCounts, confidence: float) -> tuple[ProportionInterval, DeltaSource]:
    """Leakage from the probe if it ran, else from labelled uncovered traffic, else unknown."""
    if counts.probe_trials > 0:
        return wilson_interval(counts.probe_errors, counts.probe_trials, confidence), "probe"
    if counts.labelled_uncovered > 0:
        ci = wilson_interval(counts.errors_uncovered, counts.labelled_uncovered, confidence)
        return ci, "labelled-uncovered"
    return wilson_interval(0, 0, confidence), "none"


def _combine(c: float, eps: float, delta: float) -> float:
    """``c * eps + (1 - c) * delta``."""
    return c * eps + (1.0 - c) * delta


def coverage_bound(counts: CoverageCounts, confidence: float = 0.95) -> BoundReport:
    """``H* = c * eps + (1 - c) * delta`` with its Wilson box interval, against measured ``H``.

    Status: ``"insufficient-data"`` when there are no requests, no labelled covered
    requests or no source for delta; ``"violated"`` when the Wilson low end of the
    measured ``H`` exceeds ``bound_high``; ``"holds"`` otherwise.
    """
    normal_quantile(confidence)  # validates 0 < confidence < 1
    c = wilson_interval(counts.covered, counts.requests, confidence)
    eps = wilson_interval(counts.errors_covered, counts.labelled_covered, confidence)
    delta, source = _delta(counts, confidence)
    measured = wilson_interval(
        counts.errors_covered + counts.errors_uncovered,
        counts.labelled_covered + counts.labelled_uncovered,
        confidence,
    )
    ends = (c.low, c.high)
    high = max(_combine(x, eps.high, delta.high) for x in ends)
    low = min(_combine(x, eps.low, delta.low) for x in ends)
    insufficient = counts.requests == 0 or counts.labelled_covered == 0 or source == "none"
    point = math.nan if insufficient else _combine(c.estimate, eps.estimate, delta.estimate)
    # The measured rate by stratum: labels are rarely drawn uniformly (users flag bad
    # answers), so the pooled rate over labels is biased whenever covered and uncovered
    # answers are labelled at different rates. An unlabelled stratum counts as [0, 1].
    leak = wilson_interval(counts.errors_uncovered, counts.labelled_uncovered, confidence)
    w_low = min(_combine(x, eps.low, leak.low) for x in ends)
    w_high = max(_combine(x, eps.high, leak.high) for x in ends)
    weighted = (
        math.nan
        if insufficient or counts.labelled_uncovered == 0
        else _combine(c.estimate, eps.estimate, leak.estimate)
    )
    status: BoundStatus
    if insufficient:
        status = "insufficient-data"
    elif w_low > high:
        status = "violated"
    else:
        status = "holds"
    return BoundReport(
        confidence=confidence,
        coverage=c,
        eps=eps,
        delta=delta,
        delta_source=source,
        bound=point,
        bound_low=low,
        bound_high=high,
        measured=measured,
        status=status,
        slack=math.nan if insufficient else high - measured.estimate,
        measured_weighted=weighted,
        measured_weighted_low=w_low,
        measured_weighted_high=w_high,
    )


@dataclass(slots=True)
class _Window:
    """One key's recent requests (covered?) and labels (covered?, hallucinated?) per input
    partition."""

    requests: dict[int, deque[bool]] = field(default_factory=dict)
    size: int = 0  # requests over every partition
    labels: dict[int, OrderedDict[object, tuple[bool, bool]]] = field(default_factory=dict)
    unnamed: int = 0  # ids for labels that name no request
    covered: int = 0
    labelled: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    errors: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})


class CoverageTracker:
    """Rolling coverage-bound counts per calibration key over the last ``window`` events.

    Each key keeps two sliding windows with running sums: the last ``window``
    requests (covered or not) and the last ``window`` labels. A label carries its own
    coverage flag, so it needs no matching request: requests and labels age out
    independently, and a label that arrives after its request has left the window
    still counts until ``window`` newer labels push it out. Memory is O(window) per
    key. Probe counts are set, not accumulated: per key, or for every key without
    its own (``key=None``). Not thread-safe (one event loop owns it).

    Both are windowed per input partition (the partition a request's inputs, and its
    labels, are read on): once :meth:`set_partitions` knows the input topics' partition
    count ``P``, each partition keeps the last ``ceil(window / P)`` requests and labels, so
    a replica holding some of them keeps at most ``window`` of each and the fleet's windows
    sum to about the last ``window`` of the key whatever the replicas. A partition moved to
    another replica takes its windows with it: :meth:`drop_partitions` here,
    :meth:`refill` and :meth:`refill_labels` there (from the verdicts and labels read
    back), so a restart or a rebalance neither empties the fleet's counts nor counts one
    twice.
    """

    def __init__(self, *, window: int = 10_000, confidence: float = 0.95) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ConfigError(f"window must be a positive number of requests, got {window!r}")
        normal_quantile(confidence)  # validates 0 < confidence < 1
        self.window = window
        self.confidence = confidence
        self._windows: dict[str, _Window] = {}
        self._probes: dict[str | None, tuple[int, int]] = {}
        # requests and labels kept per partition: the whole window until the partition count
        # is known (one partition, as in memory)
        self._per_partition = window

    def _get(self, key: str) -> _Window:
        win = self._windows.get(key)
        if win is None:
            win = self._windows[key] = _Window()
        return win

    @property
    def per_partition(self) -> int:
        """Requests, and labels, of a key kept per input partition."""
        return self._per_partition

    def set_partitions(self, count: int) -> None:
        """The input topics' partition count: each partition keeps ``ceil(window / count)``
        requests and labels of a key from now (its oldest leave when that is fewer)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"partition count must be a positive integer, got {count!r}")
        self._per_partition = -(-self.window // count)
        for win in self._windows.values():
            for requests in win.requests.values():
                while len(requests) > self._per_partition:
                    win.covered -= requests.popleft()
                    win.size -= 1
            for labels in win.labels.values():
                while len(labels) > self._per_partition:
                    self._forget(win, labels.popitem(last=False)[1])

    def observe_request(self, key: str, covered: bool, partition: int = 0) -> None:
        """Count one served request of ``key`` read on ``partition``; the partition's oldest
        leaves once its window is full."""
        win = self._get(key)
        requests = win.requests.get(partition)
        if requests is None:
            requests = win.requests[partition] = deque()
        covered = bool(covered)
        requests.append(covered)
        win.covered += covered
        win.size += 1
        if len(requests) > self._per_partition:
            win.covered -= requests.popleft()
            win.size -= 1

    def refill(self, key: str, partition: int, covered: Iterable[bool]) -> int:
        """``partition``'s window of ``key`` is ``covered`` (oldest first; the last
        :attr:`per_partition` of them), replacing what it held. Returns how many it holds."""
        kept = deque((bool(c) for c in covered), maxlen=self._per_partition)
        win = self._get(key)
        old = win.requests.pop(partition, None)
        if old is not None:
            win.covered -= sum(old)
            win.size -= len(old)
        if kept:
            win.requests[partition] = deque(kept)  # without maxlen, as observe_request's
            win.covered += sum(kept)
            win.size += len(kept)
        return len(kept)

    def refill_labels(
        self, key: str, partition: int, labels: Iterable[tuple[str, bool, bool]]
    ) -> int:
        """``partition``'s labels of ``key`` are ``labels`` (``(label_id, covered,
        error)``, oldest first, the last of an id winning; the last :attr:`per_partition`),
        replacing what it held. Returns how many it holds."""
        win = self._get(key)
        for old in win.labels.pop(partition, {}).values():
            self._forget(win, old)
        kept: OrderedDict[object, tuple[bool, bool]] = OrderedDict()
        for name, covered, error in labels:
            kept.pop(name, None)
            kept[name] = (bool(covered), bool(error))
        while len(kept) > self._per_partition:
            kept.popitem(last=False)
        if kept:
            win.labels[partition] = kept
            for entry in kept.values():
                win.labelled[entry[0]] += 1
                win.errors[entry[0]] += int(entry[1])
        return len(kept)

    def drop_partitions(self, partitions: Iterable[int]) -> tuple[int, int]:
        """Forget the requests and labels of ``partitions`` (moved to another replica)
        under every key. Returns how many requests and labels were dropped."""
        gone = set(partitions)
        dropped = labels_dropped = 0
        for win in self._windows.values():
            for partition in gone & win.requests.keys():
                requests = win.requests.pop(partition)
                win.covered -= sum(requests)
                win.size -= len(requests)
                dropped += len(requests)
            for partition in gone & win.labels.keys():
                for old in win.labels.pop(partition).values():
                    self._forget(win, old)
                    labels_dropped += 1
        return dropped, labels_dropped

    def partitions(self) -> set[int]:
        """The partitions some key's window holds requests or labels of."""
        return {p for win in self._windows.values() for p in (*win.requests, *win.labels)}

    def observe_label(
        self,
        key: str,
        covered: bool,
        correct: bool,
        abstained: bool = False,
        *,
        label_id: str | None = None,
        partition: int = 0,
    ) -> bool:
        """Count one labelled answer read on ``partition``; it is an error when wrong and
        not abstained.

        ``label_id`` (the request id): one label per request — a second label for
        the same id replaces the first (the last wins) and returns True.
        """
        win = self._get(key)
        entry = (bool(covered), not correct and not abstained)
        name: object = label_id
        if label_id is None:
            win.unnamed += 1
            name = win.unnamed
        labels = win.labels.get(partition)
        if labels is None:
            labels = win.labels[partition] = OrderedDict()
        replaced = labels.pop(name, None)
        if replaced is not None:
            self._forget(win, replaced)
        labels[name] = entry
        win.labelled[entry[0]] += 1
        win.errors[entry[0]] += int(entry[1])
        if len(labels) > self._per_partition:
            _, oldest = labels.popitem(last=False)
            self._forget(win, oldest)
        return replaced is not None

    @staticmethod
    def _forget(win: _Window, label: tuple[bool, bool]) -> None:
        covered, error = label
        win.labelled[covered] -= 1
        win.errors[covered] -= int(error)

    def forget(self, key: str) -> None:
        """Drop ``key``'s windows (its requests and labels); its probe counts stay."""
        self._windows.pop(key, None)

    def set_probe(self, key: str | None, trials: int, errors: int) -> None:
        """Leakage-probe counts for ``key``, or the default for all keys when ``key`` is None."""
        CoverageCounts(requests=0, covered=0, probe_trials=trials, probe_errors=errors)
        self._probes[key] = (trials, errors)

    def counts(self, key: str) -> CoverageCounts:
        """The current window's counts of ``key`` (all zero for a key never seen)."""
        win = self._windows.get(key, _Window())
        trials, errors = self._probes.get(key, self._probes.get(None, (0, 0)))
        return CoverageCounts(
            requests=win.size,
            covered=win.covered,
            labelled_covered=win.labelled[True],
            errors_covered=win.errors[True],
            labelled_uncovered=win.labelled[False],
            errors_uncovered=win.errors[False],
            probe_trials=trials,
            probe_errors=errors,
        )

    def report(self, key: str) -> BoundReport:
        """:func:`coverage_bound` of the current window of ``key``."""
        return coverage_bound(self.counts(key), self.confidence)

    def keys(self) -> list[str]:
        """The keys seen so far, sorted."""
        return sorted(self._windows)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """The counts of every key as plain dicts (for logs and metrics)."""
        return {key: asdict(self.counts(key)) for key in self.keys()}
