"""``bench/processor_batches.py --stages``: every stage is timed, and nothing stays patched."""

from __future__ import annotations

import gc

from bench import processor_batches
from sidecar.contracts.answer_json import answer_verdict_json
from sidecar.contracts.codec import decode_input
from sidecar.pipeline import intake as intake_module
from sidecar.pipeline import processor as processor_module


def test_stage_costs_time_every_stage_and_leave_nothing_patched() -> None:
    report = processor_batches.stage_costs(2)
    assert report["requests"] == 2 * processor_batches.BATCH
    stages = report["stages_us_per_request"]
    assert set(stages) >= {
        "intake",
        "intake.decode",
        "intake.hold",
        "scoring",
        "decide",
        "decide.policy",
        "decide.verdict_json",
    }
    assert all(value > 0.0 for value in stages.values())
    # inclusive: a stage's parts fit inside it, and the stages inside the whole batch
    assert stages["intake.decode"] + stages["intake.hold"] <= stages["intake"]
    assert stages["intake"] + stages["scoring"] + stages["decide"] <= report["total_us_per_request"]
    assert vars(intake_module)["decode_input"] is decode_input  # the functions themselves again
    assert vars(processor_module)["answer_verdict_json"] is answer_verdict_json
    assert gc.get_freeze_count() == 0
