"""``bench/dict_floor.py``: the sketch does the work it claims, on the verdict's shape."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest

from bench import dict_floor
from sidecar import runtime
from sidecar.config import Settings
from sidecar.lab.bench.dict_floor import DictFloor
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.processor import Processor
from tests.lab.bench.sketches import REFUSALS, edited, keys


@pytest.fixture(scope="module")
def processor() -> Processor:
    return runtime.build_processor(Settings.load(signals={"claims": False}))


def test_the_sketch_decides_every_request_on_the_verdicts_shape(processor: Processor) -> None:
    batch = dict_floor.batches(1, "shape")[0]
    real = [
        orjson.loads(o.value)
        for o in processor.on_batch(batch, 0.0).outputs
        if o.destination is Destination.VERDICTS
    ]
    sketch = DictFloor(processor).on_batch(batch)
    assert len(sketch) == len(real) == dict_floor.BATCH
    ours = orjson.loads(sketch[0][2])
    assert ours["request_id"] == real[0]["request_id"]
    # the same object to encode: every key path of the sidecar's verdict, and no other
    assert keys(ours) == keys(real[0])
    assert len(ours["reasons"]) == len(real[0]["reasons"])


def test_the_sketch_checks_what_it_reads(processor: Processor) -> None:
    batch = dict_floor.batches(1, "bad")[0][:3]  # one whole request
    for kind, edit, reason, verdicts in REFUSALS:
        floor = DictFloor(processor)
        # one bad record costs that record, never its batch
        assert len(floor.on_batch(edited(batch, kind, edit))) == verdicts
        assert floor.refused == {reason: 1}
    kind, raw, _key, ref = batch[0]
    floor = DictFloor(processor)
    assert floor.on_batch([(kind, raw, b"another-id", ref), (kind, b"{not json", None, ref)]) == []
    assert floor.refused == {"key": 1, "unreadable": 1}
    # a record seen again (the same bytes) is a duplicate: one verdict, not two
    floor = DictFloor(processor)
    assert len(floor.on_batch(batch + batch)) == 1
    assert floor.refused == {}


def test_measure_reports_both_and_their_ratio() -> None:
    report = dict_floor.measure(1, 1)
    best = report["best_us"]
    assert best["processor"] > 0.0 and best["dict_floor"] > 0.0
    assert report["floor_vs_processor"] == round(best["dict_floor"] / best["processor"], 3)


def test_one_hit_is_decided_and_no_hit_is_refused(processor: Processor) -> None:
    batch = dict_floor.batches(1, "hits")[0][:3]

    def one_hit(event: dict[str, Any]) -> None:
        event["hits"] = event["hits"][:1]

    def no_hit(event: dict[str, Any]) -> None:
        event["hits"] = []

    floor = DictFloor(processor)
    assert len(floor.on_batch(edited(batch, "retrieval", one_hit))) == 1
    floor = DictFloor(processor)
    assert floor.on_batch(edited(batch, "retrieval", no_hit)) == []
    assert floor.refused == {"hits": 1}


def test_the_sketch_refuses_to_start_without_the_models_it_scores_with() -> None:
    bare = runtime.build_processor(Settings.load(signals={"claims": False, "lookback": False}))
    with pytest.raises(ValueError, match="lookback and confidence"):
        DictFloor(bare)


def test_summaries_of_another_model_are_refused_and_mixed_chunk_counts_decided(
    processor: Processor,
) -> None:
    batch = dict_floor.batches(1, "mixed")[0][:6]  # two whole requests

    def other_model(event: dict[str, Any]) -> None:
        event["attention"]["layers"] += 1

    floor = DictFloor(processor)
    assert len(floor.on_batch(edited(batch[:3], "generation.final", other_model))) == 0
    assert floor.refused == {"shape": 1}

    def two_chunks(event: dict[str, Any]) -> None:
        att = event["attention"]
        values = np.frombuffer(base64.b64decode(att["values"]), dtype=np.float16)
        att["values"] = base64.b64encode(
            values[: att["layers"] * att["heads"] * 2].tobytes()
        ).decode()
        att["chunks"] = 2

    def all_trusted(event: dict[str, Any]) -> None:  # the third hit has no column now
        for hit, score in zip(event["hits"], (0.9, 0.8, 0.7), strict=True):
            hit["score"] = score

    first = edited(edited(batch[:3], "generation.final", two_chunks), "retrieval", all_trusted)
    mixed = first + batch[3:]
    floor = DictFloor(processor)
    verdicts = [orjson.loads(value) for _rid, _key, value in floor.on_batch(mixed)]
    assert len(verdicts) == 2 and floor.refused == {}
    assert all(0.0 <= f["p_useful"] <= 1.0 for v in verdicts for f in v["chunk_forecast"])
