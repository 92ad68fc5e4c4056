"""The flow aligner's pause budget: half the join store's share of a real input partition."""

from __future__ import annotations

import pytest

from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy


@pytest.mark.parametrize(("partitions", "budget"), [(None, 1_666), (3, 1_666), (48, 500)])
def test_the_budget_is_taken_from_the_partition_count_kafka_gave(
    partitions: int | None, budget: int
) -> None:
    """Review: the budget used ``topics.partitions`` (what ``topics create`` would make, 3 by
    default) against existing 48-partition topics. The start passes the real count; a
    budget is never under one poll (500)."""
    settings = Settings.load()
    assert (settings.join.max_entries, settings.topics.partitions) == (10_000, 3)
    service = SidecarService(
        settings, Processor(settings, PlaceholderPolicy()), input_partitions=partitions
    )
    aligner = service.intake.aligner
    assert aligner is not None and aligner.max_lead_records == budget
