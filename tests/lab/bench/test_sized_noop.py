"""``bench/sized_noop.py``: the no-op floor publishing the sidecar's own verdicts (#22)."""

from __future__ import annotations

import orjson

from bench.sized_noop import SizedNoop, sidecar_verdict
from sidecar.config import Settings
from sidecar.contracts.events import AnswerVerdict
from sidecar.lab.bench.floors import constant_verdict
from sidecar.pipeline.outputs import IDEMPOTENCY_HEADER, Destination
from tests.lab.bench.test_bench_floors import _requests


def test_the_template_is_the_sidecars_verdict_for_a_request_of_the_load() -> None:
    fields, size = sidecar_verdict(Settings.load())
    verdict = AnswerVerdict.model_validate(fields)
    assert verdict.request_id == "bench-sized-0"
    assert verdict.signals.lookback.p_factual is not None  # decided by the served models
    assert size == len(orjson.dumps(fields)) > 2 * len(constant_verdict("bench-sized-0"))


def test_each_final_gets_the_template_stamped_with_its_request_and_a_key_header() -> None:
    fields, _ = sidecar_verdict(Settings.load())
    step = SizedNoop(Settings.load(), fields).on_batch(_requests("s", 3), 0.0)
    assert [out.destination for out in step.outputs] == [Destination.VERDICTS] * 3
    verdicts = [AnswerVerdict.model_validate_json(out.value) for out in step.outputs]
    assert [v.request_id for v in verdicts] == ["s-0", "s-1", "s-2"]
    assert {v.decision for v in verdicts} == {AnswerVerdict.model_validate(fields).decision}
    headers = [out.headers for out in step.outputs]
    assert all(
        len(h) == 1 and h[0][0] == IDEMPOTENCY_HEADER and len(h[0][1]) == 32 for h in headers
    )
    assert len({h[0][1] for h in headers}) == 3
