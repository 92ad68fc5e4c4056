"""Records a partition's last owner finished (its handover) are remembered, not held."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps


def test_a_resent_final_after_a_handover_is_after_final_not_a_second_verdict(
    settings_factory: Callable[..., Settings], final_event: EventFactory
) -> None:
    """Audit: the replica that took over skipped the final the last owner had decided; the
    LLM service re-sent it, and it was held alone until its TTL: ``incomplete``, under
    another idempotency key."""
    processor = Processor(settings_factory(), PlaceholderPolicy())
    final = dumps(final_event("req-r"))
    skipped = InputRef("g", 0, 5, finished=True)
    step = processor.on_message(InputKind.GENERATION, final, b"req-r", skipped, 0)
    assert step.outputs == [] and step.done == [skipped]
    assert processor.intake.handed_over == 1 and len(processor.store) == 0
    resent = processor.on_message(InputKind.GENERATION, final, b"req-r", InputRef("g", 0, 9), 10)
    [dead] = resent.outputs
    assert dict(dead.headers)["x-dlq-reason"] == b"after-final"
    assert len(processor.store) == 0  # nothing held: no incomplete verdict at the TTL


def test_a_finished_record_that_is_not_a_final_or_not_valid_costs_nothing(
    settings_factory: Callable[..., Settings], final_event: EventFactory
) -> None:
    processor = Processor(settings_factory(), PlaceholderPolicy())
    for raw in (b"{not json", dumps({**final_event("req-x"), "event_type": "generation.delta",
                                    "seq": 0, "text": "x"})):  # fmt: skip
        step = processor.on_message(
            InputKind.GENERATION, raw, b"req-x", InputRef("g", 0, 1, finished=True), 0
        )
        assert step.outputs == [] and len(step.done) == 1
    assert processor.intake.handed_over == 0 and len(processor.store) == 0
