"""A verdict's model versions and their trace attributes, built once per decided batch.

``Processor._decide_all`` merges the signals' versions and the policy's fingerprint
once per batch, and their ``guardrail.model.*`` attributes with them; each verdict
puts its generator in front. The verdict's ``model_versions`` must stay the one
literal ``{"generator": ..., **signal versions, "policy": fingerprint}`` it was
(keys in that order, a signal version named ``generator`` or ``policy`` taking that
key's place and value), and its trace attributes must be the ones
``verdict_attributes`` reads from the published verdict, in the same order: the
metrics count them and the spans carry them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, verdict_attributes
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps

SIGNAL_VERSIONS = [
    {},
    {"certifier": "c@1", "lookback": "l@2", "confidence": "k@3"},
    # names the suite never gives, which a literal merge still places and overrides
    {"lookback": "l@2", "generator": "g-from-signals", "verifier": "v@4"},
    {"policy": "p-from-signals", "certifier": "c@1"},
    {"policy": "p", "generator": "g", "lookback": "l"},
]


@pytest.mark.parametrize("signal_versions", SIGNAL_VERSIONS)
def test_model_versions_and_attributes_are_the_verdicts(
    signal_versions: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    policy = PlaceholderPolicy()
    processor = Processor(settings_factory(), policy)
    monkeypatch.setattr(type(processor.signals), "versions", lambda _self: dict(signal_versions))
    generators = {"req-a": "gen-a@1", "req-b": "gen-b@2", "req-c": "gen-a@1"}
    items: list[BatchItem] = []
    for offset, (rid, generator) in enumerate(generators.items()):
        for kind, event in (
            (InputKind.RETRIEVAL, retrieval_event(rid)),
            (InputKind.GENERATION, final_event(rid, generator_model=generator)),
        ):
            ref = InputRef(f"rag.{kind.value}", 0, offset)
            items.append((kind, dumps(event), rid.encode(), ref))
    step = processor.on_batch(items, 0.0)

    verdicts = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    assert len(verdicts) == len(generators)
    for out in verdicts:
        document: dict[str, Any] = orjson.loads(out.value)
        verdict = AnswerVerdict.model_validate(document)
        expected = {
            "generator": generators[verdict.request_id],
            **signal_versions,
            "policy": policy.fingerprint,
        }
        assert list(document["model_versions"].items()) == list(expected.items())
        assert out.trace is not None
        attributes = out.trace.attributes
        assert list(attributes.items()) == list(verdict_attributes(verdict).items())
