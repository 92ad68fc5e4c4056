from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import orjson
import pytest
from pydantic import ValidationError

from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind, decode_input
from sidecar.contracts.events import CertificateWithdrawal, Decision, RetrievalSignal, SignalStatus
from sidecar.contracts.schema_export import render, stale_files
from sidecar.kafka.records import input_kinds
from sidecar.lab.demo import bundled_sample
from sidecar.lab.replay import load_file
from sidecar.pipeline.outputs import report_output, withdrawal_output
from sidecar.policy.config import AllowRules
from tests.conftest import REPO, EventFactory


def test_checked_in_schemas_match_the_models() -> None:
    stale = stale_files(REPO / "schemas", render())
    assert stale == [], f"schemas/ is stale, run `guardrail schemas export`: {stale}"


def test_drift_is_detected(tmp_path: Path) -> None:
    rendered = render()
    for name, text in rendered.items():
        (tmp_path / name).write_text(text)
    assert stale_files(tmp_path, rendered) == []
    (tmp_path / "retrieval.schema.json").write_text("{}")
    assert stale_files(tmp_path, rendered) == ["retrieval.schema.json"]


@pytest.mark.parametrize("name", ["retrieval", "generation.final", "generation.delta"])
def test_json_schema_accepts_what_the_decoder_accepts(
    name: str, retrieval_event: EventFactory, final_event: EventFactory, delta_event: EventFactory
) -> None:
    schema = json.loads((REPO / "schemas" / f"{name}.schema.json").read_text())
    event = {
        "retrieval": retrieval_event,
        "generation.final": final_event,
        "generation.delta": delta_event,
    }[name]()
    jsonschema.validate(event, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**event, "schema_version": 2}, schema)


def test_bundled_demo_recording_is_well_formed() -> None:
    settings = Settings.load()
    records = load_file(bundled_sample(), settings)
    valid = 0
    kinds = input_kinds(settings.topics)
    feedback = [r for r in records if r.topic == settings.topics.feedback]
    assert len(feedback) == 4  # the demo's labels go to the feedback topic
    for r in feedback:
        decode_input(InputKind.FEEDBACK, r.value, max_bytes=10**6, max_depth=32)
    for r in records:
        kind = kinds[r.topic]
        try:
            decode_input(kind, r.value, max_bytes=10**6, max_depth=32)
            valid += 1
        except Exception:
            assert orjson  # broken on purpose: the recording carries bad input too
    assert 0 < valid < len(records)


def test_asyncapi_names_every_topic() -> None:
    doc = json.loads((REPO / "schemas" / "asyncapi.json").read_text())
    t = Settings.load().topics
    addresses = {c["address"] for c in doc["channels"].values()}
    assert addresses == {
        t.retrieval,
        t.generation,
        t.claims,
        t.verdicts,
        t.dlq,
        t.feedback,
        t.reports,
        t.certificates,
    }


@pytest.mark.parametrize(
    "field",
    ["tenant", "decision", "reasons", "stage", "escalate", "caveat_text", "rewritten_answer"],
)
def test_the_verdict_fields_a_ui_acts_on_are_described(field: str) -> None:
    # a team writing its UI from schemas/ alone must learn what to show: a caveat's
    # rewritten_answer is the answer without its unsupported claims, and caveat_text says so
    schema = json.loads((REPO / "schemas" / "answer.verdict.schema.json").read_text())
    description = schema["properties"][field].get("description", "")
    assert description, f"answer.verdict.schema.json: {field} has no description"
    if field in ("decision", "caveat_text"):
        assert "rewritten_answer" in description


def test_asyncapi_names_the_key_each_output_is_published_under() -> None:
    # a consumer compacting or partitioning by the record key reads it from asyncapi.json:
    # reports and withdrawals are keyed by their calibration key, never by a request id
    doc = json.loads((REPO / "schemas" / "asyncapi.json").read_text())

    def key_of(channel: str) -> str:
        (message,) = doc["channels"][channel]["messages"].values()
        description: str = message["bindings"]["kafka"]["key"]["description"]
        return description.split(":", 1)[0].split(" ", 1)[0]

    monitor = CoverageMonitor()
    trusted = RetrievalSignal(status=SignalStatus.OK, m1=True, calibration_key="acme/docs/default")
    monitor.observe_decision("r-1", Decision.ALLOW, trusted, None, tenant="acme")
    (report,) = monitor.reports()
    withdrawal = CertificateWithdrawal(
        calibration_key="acme/docs/default",
        certificates=["0123456789abcdef"],
        risk=0.1,
        delta=0.05,
        labelled=10,
        errors=6,
        error_low=0.3,
        error_high=0.85,
        withdrawn_at=datetime.now(UTC),
        sidecar_version="test",
    )
    assert report_output(report).key == b"acme/docs/default"
    assert withdrawal_output(withdrawal).key == b"acme/docs/default"
    assert key_of("reports") == key_of("certificates") == "calibration_key"
    assert {key_of(c) for c in ("retrieval", "feedback", "claims", "verdicts")} == {"request_id"}


@pytest.mark.parametrize("count", [0, 1, 8, 9])
def test_the_policy_schema_bounds_the_certificate_list_as_the_model_does(count: int) -> None:
    """The bounds are on an array: maxLength/minLength there (pydantic >= 2.12 wrote them
    after the validator) were ignored, and a list of 9 passed an editor's check."""
    schema = json.loads((REPO / "schemas" / "policy.schema.json").read_text())
    allow = {**schema["$defs"]["AllowRules"], "$defs": schema["$defs"]}
    certified = [f"c{i}.json" for i in range(count)]
    errors = list(jsonschema.Draft202012Validator(allow).iter_errors({"certified": certified}))
    try:
        AllowRules.model_validate({"certified": certified})
    except ValidationError:
        model_accepts = False
    else:
        model_accepts = True
    assert model_accepts == (0 < count <= 8)
    assert (errors == []) == model_accepts, [e.message for e in errors]
