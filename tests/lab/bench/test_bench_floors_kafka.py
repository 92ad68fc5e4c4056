"""The bench's floors through the real broker: each answers every request once, none incomplete."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.lab.bench import native_floor
from sidecar.lab.bench.e2e import Bench, LoadShape, warmup_requests
from sidecar.lab.localkafka.broker import LocalKafka

pytestmark = pytest.mark.connected

FLOORS = "sidecar.lab.bench.floors"


@pytest.mark.parametrize("floor", ["noop", "parse", "dict", "native", "raw"])
async def test_a_floor_drains_every_request_once(
    kafka_broker: LocalKafka, tmp_path: Path, floor: str, request: pytest.FixtureRequest
) -> None:
    env = {"GUARDRAIL_SIGNALS__CLAIMS": "false"}
    if floor == "native":  # the dict sketch in Rust, compiled for this session
        env[native_floor.LIBRARY_ENV] = str(request.getfixturevalue("native_library"))
    bench = Bench(kafka_broker, tmp_path, env, argv=("-m", FLOORS, floor))
    run = await bench.drain(floor, 60, LoadShape())
    assert run.verdicts == 60
    assert run.incomplete == 0
    assert run.throughput_answers_per_s > 0


async def test_an_open_loop_times_only_the_requests_after_its_warm_up(
    kafka_broker: LocalKafka, tmp_path: Path
) -> None:
    bench = Bench(
        kafka_broker,
        tmp_path,
        {"GUARDRAIL_SIGNALS__CLAIMS": "false"},
        argv=("-m", FLOORS, "noop"),
    )
    run = await bench.open_loop("warm", 50.0, 2.0, LoadShape())
    assert run.config["warmup_requests"] == warmup_requests(50.0, 2.0) == 20
    assert run.requests == 100 and run.verdicts == 100  # the warm-up's 20 are not timed
    assert run.incomplete == 0 and run.latency_ms["p50"] > 0
