"""The native floor computes what the dict floor does, and refuses what it refuses (#22).

Its drain through the real broker: ``test_bench_floors_kafka.py``, with the other floors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import dict_floor
from sidecar import runtime
from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.lab.bench import native_floor
from sidecar.lab.bench.dict_floor import DictFloor
from sidecar.lab.bench.native_floor import NativeFloor
from sidecar.pipeline.processor import Processor
from tests.jsonclose import same_json
from tests.lab.bench.sketches import REFUSALS, edited, keys


@pytest.fixture(scope="module")
def processor() -> Processor:
    return runtime.build_processor(Settings.load(signals={"claims": False}))


@pytest.fixture(scope="module")
def module(native_library: Path) -> Any:
    return native_floor.load(native_library)


def test_the_native_sketch_gives_the_dict_sketchs_verdicts(
    processor: Processor, module: Any
) -> None:
    slow, fast = DictFloor(processor), NativeFloor(processor, module)
    decisions = set()
    for batch in dict_floor.batches(4, "same"):
        ours, theirs = fast.on_batch(batch), slow.on_batch(batch)
        assert len(ours) == len(theirs) == dict_floor.BATCH
        for (topic, key, value), (topic2, key2, value2) in zip(ours, theirs, strict=True):
            assert (topic, key) == (topic2, key2)
            mine, reference = orjson.loads(value), orjson.loads(value2)
            assert mine.pop("produced_at")[:4] == reference.pop("produced_at")[:4]
            # the attention shares' sums run in float64 here, float32 in numpy
            same_json(mine, reference, key.decode(), rel_tol=1e-6)
            decisions.add(mine["decision"])
    assert fast.refused == {} and fast.sketch.held() == 0
    assert decisions  # every verdict compared above, field by field


def test_the_native_sketch_writes_the_sidecars_verdict_shape(
    processor: Processor, module: Any
) -> None:
    from sidecar.pipeline.outputs import Destination

    batch = dict_floor.batches(1, "shape")[0]
    real = [
        orjson.loads(o.value)
        for o in processor.on_batch(batch, 0.0).outputs
        if o.destination is Destination.VERDICTS
    ]
    ours = orjson.loads(NativeFloor(processor, module).on_batch(batch)[0][2])
    assert keys(ours) == keys(real[0])
    assert ours["produced_at"].endswith("+00:00")


def test_the_native_sketch_refuses_one_record_and_decides_the_rest(
    processor: Processor, module: Any
) -> None:
    batch = dict_floor.batches(1, "bad")[0][:3]  # one whole request
    for kind, edit, reason, verdicts in REFUSALS:
        floor = NativeFloor(processor, module)
        assert len(floor.on_batch(edited(batch, kind, edit))) == verdicts
        assert floor.refused == {reason: 1}
    kind, raw, _key, ref = batch[0]
    floor = NativeFloor(processor, module)
    junk = [(kind, raw, b"another-id", ref), (kind, b"{not json", None, ref)]
    junk.append((kind, b"\xff\xfe not utf-8", None, ref))
    assert floor.on_batch(junk) == []
    assert floor.refused == {"key": 1, "unreadable": 2}
    # a record seen again (the same bytes) is a duplicate: one verdict, not two
    floor = NativeFloor(processor, module)
    assert len(floor.on_batch(batch + batch)) == 1
    assert floor.refused == {}


def test_no_library_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make native-floor"):
        native_floor.load(tmp_path / "missing.so")
