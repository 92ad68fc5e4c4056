"""Input records that were gone before the sidecar read them, said out loud.

When the consumer's position is out of range — retention or ``kafka-delete-records``
removed records the group had not read yet, or the topic was recreated with fewer
records than the committed offset — aiokafka resets the position
(``GUARDRAIL_KAFKA__AUTO_OFFSET_RESET``) and logs it at INFO, which the sidecar's
logging hides with the rest of aiokafka's INFO lines. The requests whose events were
among those records get no verdict, or an ``incomplete`` one, and nothing said why: an
operator could not tell records skipped by retention from records never sent.

:func:`watch_offset_resets` lets that one line through aiokafka's fetcher logger as a
WARNING of the sidecar's own, counts it (``guardrail.kafka.offset_resets``) and keeps
dropping the fetcher's other INFO lines.
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["OffsetResetWatch", "installed", "watch_offset_resets"]

log = logging.getLogger("sidecar.kafka")

_FETCHER_LOGGER: Final = "aiokafka.consumer.fetcher"
_OUT_OF_RANGE: Final = "Fetch offset %s is out of range for partition %s"


class OffsetResetWatch(logging.Filter):
    """A filter on aiokafka's fetcher logger: counts and re-logs out-of-range resets."""

    def __init__(self, drop_below: int = logging.NOTSET) -> None:
        super().__init__()
        self.resets = 0
        self.drop_below = drop_below  # the level the logger had before it was opened to INFO

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_OUT_OF_RANGE):
            self.resets += 1
            args = record.args if isinstance(record.args, tuple) else ()
            offset, tp = (*args, None, None)[:2]
            log.warning(
                "input %s: offset %s is no longer in Kafka (deleted by retention or "
                "delete-records before it was read, or the topic was recreated); the consumer "
                "resets to the %s offset per GUARDRAIL_KAFKA__AUTO_OFFSET_RESET: the requests "
                "whose events were deleted get no verdict or an incomplete one",
                tp, offset, _reset_strategy(),
            )  # fmt: skip
            return False
        return record.levelno >= self.drop_below  # the fetcher's other lines: as before


_strategy: list[str] = ["earliest"]


def _reset_strategy() -> str:
    return _strategy[0]


_watch: OffsetResetWatch | None = None


def installed() -> OffsetResetWatch | None:
    """The process's watch, once a service has installed it."""
    return _watch


def watch_offset_resets(auto_offset_reset: str) -> OffsetResetWatch:
    """Install the watch on aiokafka's fetcher logger (once a process) and return it."""
    global _watch  # noqa: PLW0603 - one filter for the process's one fetcher logger
    _strategy[0] = auto_offset_reset
    if _watch is None:
        fetcher = logging.getLogger(_FETCHER_LOGGER)
        level = fetcher.getEffectiveLevel()
        _watch = OffsetResetWatch(drop_below=level)
        fetcher.addFilter(_watch)
        if level > logging.INFO:
            fetcher.setLevel(logging.INFO)  # the filter sees the INFO line; it drops the rest
    return _watch
