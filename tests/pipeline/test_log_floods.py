"""A signal that fails on every request logs its traceback once per interval, not per request.

Audit: with the lookback model failing, each request of a batch wrote ``lookback scoring
failed for <id>`` with its traceback (~600 bytes; 1,000 requests a second: 600 KB/s).
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.lograte import report_repeats
from sidecar.pipeline.join import InputRef
from tests.conftest import EventFactory, LogLines, dumps
from tests.pipeline.test_signal_wiring import PickyLookback, make

REQUESTS = 100


def test_a_failing_signal_logs_one_traceback_per_interval_with_a_count(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    log_lines: LogLines,
) -> None:
    p = make(settings_factory, PickyLookback(fail=True))
    batch = []
    for i in range(REQUESTS):
        rid = f"req-{i}"
        batch.append((InputKind.RETRIEVAL, dumps(retrieval_event(rid)), None, InputRef("r", 0, i)))
        final = final_event(rid, generator_model="gen-a")
        batch.append((InputKind.GENERATION, dumps(final), None, InputRef("g", 0, i)))
    p.on_batch(batch, 0.0)
    assert p.counters.verdicts == REQUESTS  # each decided without the signal
    failed = [line for line in log_lines.lines if line.startswith("lookback scoring failed")]
    assert failed == ["lookback scoring failed for req-0"]  # was one per request
    # the batch's traceback and the first request's
    assert sum(text.count("Traceback") for text in log_lines.written) == 2
    assert report_repeats([log_lines], every=True) == 1
    assert log_lines.lines[-1] == (
        f"lookback scoring failed for req-0 ({REQUESTS - 1} more like it (RuntimeError) not "
        "logged, the last 0s ago)"
    )
