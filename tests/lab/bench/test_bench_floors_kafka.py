"""The bench's floors through the real broker: each answers every request once, none incomplete."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.lab.bench.e2e import Bench, LoadShape
from sidecar.lab.localkafka.broker import LocalKafka

pytestmark = pytest.mark.connected

FLOORS = "sidecar.lab.bench.floors"


@pytest.mark.parametrize("floor", ["noop", "parse", "raw"])
async def test_a_floor_drains_every_request_once(
    kafka_broker: LocalKafka, tmp_path: Path, floor: str
) -> None:
    bench = Bench(
        kafka_broker,
        tmp_path,
        {"GUARDRAIL_SIGNALS__CLAIMS": "false"},
        argv=("-m", FLOORS, floor),
    )
    run = await bench.drain(floor, 60, LoadShape())
    assert run.verdicts == 60
    assert run.incomplete == 0
    assert run.throughput_answers_per_s > 0
