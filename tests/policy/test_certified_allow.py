"""Certified allow in the policy: loading and checking certificates, deciding, the re-test."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from sidecar.confidence.certificate_check import CertificateTracker
from sidecar.confidence.certify_allow import (
    DEFAULT_GRID,
    AllowCertificate,
    ProfileScope,
    learn_then_test,
)
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    ClaimsSignal,
    Decision,
    GenerationFinal,
    LookbackSignal,
    RetrievalEvent,
    RetrievalHit,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import ConfigError
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, Step
from sidecar.pipeline.ports import ConfidenceResult, SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy.config import parse_policy
from sidecar.policy.engine import PolicyEngine
from tests.conftest import EventFactory, dumps
from tests.fakes import ThresholdCertifier

KEY = "default/nq-open/qdrant-minilm-l6"
MODEL = "confidence@abc+confidence@def"
POLICY = """
schema_version: 1
name: test
default_profile: general
collections: {nq-open: certified}
profiles:
  general:
    max_hallucination_rate: 0.3
  certified:
    max_hallucination_rate: 0.3
    retrieval: {when_missing: allow}
    lookback: {caveat_below: 0.0, when_missing: allow}
    claims: {when_missing: allow}
    allow: {certified: certs/nq.json, below: BELOW}
"""


def certificate(
    *,
    key: str = KEY,
    model: str = MODEL,
    risk: float = 0.2,
    scope: ProfileScope | None = None,
    certifiable: bool = True,
) -> AllowCertificate:
    """100 answers at 0.9 (5 wrong) and 300 at 0.3 (200 wrong): threshold 0.31."""
    conf = np.array([0.9] * 100 + [0.3] * 300)
    correct = np.array([1] * 95 + [0] * 5 + [1] * 100 + [0] * 200)
    result = learn_then_test(conf, correct, risk=risk if certifiable else 0.01, delta=0.1)
    return AllowCertificate.from_result(
        result,
        key=key,
        smallest_risk=None if certifiable else 0.1,
        grid=DEFAULT_GRID,
        data_hash="0" * 64,
        confidence_model=model,
        created_at=datetime(2026, 3, 1, tzinfo=UTC),
        scope=scope,
    )


def engine(
    tmp_path: Path,
    cert: AllowCertificate | None = None,
    *,
    below: str = "caveat",
    models: dict[str, str] | None = None,
    policy: str = POLICY,
) -> PolicyEngine:
    certs = tmp_path / "certs"
    certs.mkdir(exist_ok=True)
    (certs / "nq.json").write_text((cert or certificate()).model_dump_json(), encoding="utf-8")
    config = parse_policy(policy.replace("BELOW", below))
    return PolicyEngine(
        config, base_dir=tmp_path, models={"confidence": MODEL} if models is None else models
    )


def retrieval(collection: str = "nq-open", retriever: str = "qdrant-minilm-l6") -> RetrievalEvent:
    hit = RetrievalHit(chunk_id="c1", doc_id="d1", score=0.8, text="context")
    return RetrievalEvent(
        request_id="r",
        tenant="default",
        collection=collection,
        retriever=retriever,
        query="q",
        k=1,
        hits=[hit],
    )


FINAL = GenerationFinal(request_id="r", answer="Paris.", generator_model="gen")
SIGNALS = Signals(
    retrieval=RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=["c1"], m1=True, m2=1.0),
    lookback=LookbackSignal(status=SignalStatus.OK, p_factual=0.9),
    claims=ClaimsSignal(status=SignalStatus.NOT_CONFIGURED),
)


@dataclass
class Stub:
    """A confidence scorer that is always 0.9 sure."""

    version: str = "stub"

    def score(
        self, retrieval: RetrievalEvent, final: GenerationFinal, signals: Signals
    ) -> ConfidenceResult:
        del retrieval, final, signals
        return ConfidenceResult(p_correct=0.9, features={})

    def score_batch(
        self, items: Sequence[tuple[RetrievalEvent, GenerationFinal, Signals]]
    ) -> list[ConfidenceResult]:
        return [self.score(*item) for item in items]


def codes(outcome: object) -> set[str]:
    return {r.code for r in outcome.reasons}  # type: ignore[attr-defined]


def test_above_the_threshold_is_a_certified_allow(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    outcome = policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.5)
    assert outcome.decision is Decision.ALLOW
    assert "certified-allow" in codes(outcome)
    assert outcome.certified_risk == pytest.approx(0.2)
    assert outcome.certified_delta == pytest.approx(0.1)
    assert outcome.certificate == KEY


@pytest.mark.parametrize("below", ["caveat", "block"])
def test_below_the_threshold_gets_the_profiles_action(tmp_path: Path, below: str) -> None:
    policy = engine(tmp_path, below=below)
    outcome = policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.2)
    assert outcome.decision is Decision(below)
    assert "confidence-below-certified" in codes(outcome)
    assert outcome.certified_risk == pytest.approx(0.2)  # still decided under the certificate
    missing = policy.decide(retrieval(), FINAL, SIGNALS, confidence=None)
    assert missing.decision is Decision(below)
    assert "certificate-no-confidence" in codes(missing)


def test_other_rules_can_still_take_an_answer_out(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    broken = Signals(
        retrieval=RetrievalSignal(status=SignalStatus.OK, m1=False, m2=0.0),
        lookback=SIGNALS.lookback,
        claims=SIGNALS.claims,
    )
    outcome = policy.decide(retrieval(), FINAL, broken, confidence=0.9)
    assert outcome.decision is Decision.CAVEAT
    assert {"certified-allow", "retrieval-no-trusted-chunk"} <= codes(outcome)
    # not decided under the certificate: a caveat that read "certified allow, risk 0.2"
    # confused every reader of the demo's blocks
    [cert] = [r for r in outcome.reasons if r.code == "certified-allow"]
    assert cert.message.endswith("; overruled: the answer is caveated for another reason")
    assert (outcome.certified_risk, outcome.certified_delta, outcome.certificate) == (
        None,
        None,
        None,
    )


def test_a_request_of_another_key_is_not_certified(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    outcome = policy.decide(retrieval(retriever="bm25"), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.CAVEAT
    assert "certificate-key-mismatch" in codes(outcome)
    assert outcome.certified_risk is None


def test_a_broken_certificate_withdraws_the_allow(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    tracker = CertificateTracker(window=100)
    policy.attach_certificates(tracker)
    for i in range(50):
        tracker.observe_label(KEY, f"r{i}", wrong=i % 2 == 0)  # half wrong vs risk 0.2
    assert tracker.violated(KEY)
    outcome = policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.CAVEAT
    assert "certificate-violated" in codes(outcome)
    assert outcome.certified_risk is None


def test_other_profiles_are_unchanged(tmp_path: Path) -> None:
    policy = engine(tmp_path)
    outcome = policy.decide(retrieval(collection="docs"), FINAL, SIGNALS, confidence=0.9)
    assert outcome.certified_risk is None
    assert not {"certified-allow", "certificate-key-mismatch"} & codes(outcome)


# ------------------------------------------------------------------ refused at load


def test_a_certificate_for_another_model_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fitted on confidence model confidence@old"):
        engine(tmp_path, certificate(model="confidence@old"))


def test_a_certificate_fitted_with_other_signals_does_not_apply(tmp_path: Path) -> None:
    cert = certificate().model_copy(
        update={"model_versions": {"generator": "g", "lookback": "l", "confidence": MODEL}}
    )
    same = engine(tmp_path, cert, models={"confidence": MODEL, "signals": "confidence,lookback"})
    assert same.decide(retrieval(), FINAL, SIGNALS, confidence=0.9).decision is Decision.ALLOW
    claims_on = {"confidence": MODEL, "signals": "confidence,lookback,verifier"}
    for models in (claims_on, {}):  # claims switched on; the confidence switched off
        policy = engine(tmp_path, cert, models=models)  # loads (the default policy must start)
        outcome = policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
        assert outcome.decision is Decision.CAVEAT
        assert "certificate-not-applicable" in codes(outcome)
        assert outcome.certified_risk is None


def test_a_profile_lists_one_certificate_per_signal_set(tmp_path: Path) -> None:
    """Claims off and claims on each get their own certificate; the served signals pick."""
    off = certificate().model_copy(
        update={"model_versions": {"lookback": "l", "confidence": MODEL}}
    )
    on = certificate(risk=0.3).model_copy(
        update={"model_versions": {"lookback": "l", "verifier": "v+rules", "confidence": MODEL}}
    )
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "off.json").write_text(off.model_dump_json(), encoding="utf-8")
    (certs / "on.json").write_text(on.model_dump_json(), encoding="utf-8")
    listed = POLICY.replace("BELOW", "caveat").replace(
        "certified: certs/nq.json", "certified: [certs/off.json, certs/on.json]"
    )

    def served(signals: str) -> PolicyEngine:
        models = {"confidence": MODEL, "signals": signals}
        return PolicyEngine(parse_policy(listed), base_dir=tmp_path, models=models)

    claims_off = served("confidence,lookback")
    assert claims_off.certified["certified"].path == certs / "off.json"
    outcome = claims_off.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.ALLOW
    assert outcome.certified_risk == pytest.approx(0.2)
    claims_on = served("confidence,lookback,verifier")
    assert claims_on.certified["certified"].path == certs / "on.json"
    outcome = claims_on.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.ALLOW
    assert outcome.certified_risk == pytest.approx(0.3)
    neither = served("confidence")  # lookback off: no certificate applies, each says why
    outcome = neither.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.CAVEAT
    [reason] = [r for r in outcome.reasons if r.code == "certificate-not-applicable"]
    assert "off.json: fitted with the signals confidence, lookback" in reason.message
    assert "on.json: fitted with the signals confidence, lookback, verifier" in reason.message
    # claims on with another claim verifier than the one it was fitted with: not applicable
    other = PolicyEngine(
        parse_policy(listed),
        base_dir=tmp_path,
        models={"confidence": MODEL, "signals": "confidence,lookback,verifier", "verifier": "w"},
    )
    outcome = other.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.CAVEAT
    [reason] = [r for r in outcome.reasons if r.code == "certificate-not-applicable"]
    assert "on.json: fitted with claim verifier v, the sidecar serves w" in reason.message
    # another lookback model (a rollout to the fc variant): its scores are not the ones
    # the confidence was fitted on; the same one applies (helper-14 found it unchecked)
    for lookback, applies in (("m", False), ("l", True)):
        models = {"confidence": MODEL, "signals": "confidence,lookback", "lookback": lookback}
        outcome = PolicyEngine(parse_policy(listed), base_dir=tmp_path, models=models).decide(
            retrieval(), FINAL, SIGNALS, confidence=0.9
        )
        assert (outcome.decision is Decision.ALLOW) is applies
        if not applies:
            [reason] = [r for r in outcome.reasons if r.code == "certificate-not-applicable"]
            assert "off.json: fitted with lookback model l, the sidecar serves m" in reason.message
    same = {"confidence": MODEL, "signals": "confidence,lookback,verifier", "verifier": "v"}
    served_v = PolicyEngine(parse_policy(listed), base_dir=tmp_path, models=same)
    assert served_v.certified["certified"].path == certs / "on.json"
    # every listed certificate is checked at load, not only the one that applies
    (certs / "on.json").write_text(
        on.model_copy(update={"confidence_model": "confidence@old"}).model_dump_json(),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="fitted on confidence model confidence@old"):
        served("confidence,lookback")


@pytest.mark.parametrize("certified", ["[]", "''", str([f"c{i}.json" for i in range(9)])])
def test_the_certificate_list_is_bounded(certified: str) -> None:
    policy = POLICY.replace("BELOW", "caveat").replace("certs/nq.json", certified)
    with pytest.raises(ConfigError, match=r"profiles\.certified\.allow\.certified"):
        parse_policy(policy)


def test_a_certificate_for_another_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="routes to profile 'general', not 'certified'"):
        engine(tmp_path, certificate(key="default/other/qdrant-minilm-l6"))
    with pytest.raises(ConfigError, match="tenant/collection/retriever"):
        engine(tmp_path, certificate(key="nq-open"))


def test_a_certificate_that_certifies_nothing_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"certifies nothing.*smallest certifiable risk is 0\.1"):
        engine(tmp_path, certificate(certifiable=False))


def test_a_missing_or_foreign_file_is_a_config_error(tmp_path: Path) -> None:
    policy = POLICY.replace("certs/nq.json", "certs/none.json")
    with pytest.raises(ConfigError, match="does not exist"):
        engine(tmp_path, policy=policy)
    (tmp_path / "certs").mkdir(exist_ok=True)
    (tmp_path / "certs" / "none.json").write_text('{"format": "other"}', encoding="utf-8")
    with pytest.raises(ConfigError, match="is not an allow certificate"):
        PolicyEngine(parse_policy(policy.replace("BELOW", "caveat")), base_dir=tmp_path)


def test_a_profile_scoped_certificate_must_match_the_profiles_rules(tmp_path: Path) -> None:
    config = parse_policy(POLICY.replace("BELOW", "caveat"))
    rules = config.profiles["certified"].rules_sha256()
    ok = certificate(scope=ProfileScope(profile="certified", rules_sha256=rules))
    engine(tmp_path, ok)  # loads
    stale = certificate(scope=ProfileScope(profile="certified", rules_sha256="f" * 64))
    with pytest.raises(ConfigError, match="rules changed since the certificate was fitted"):
        engine(tmp_path, stale)
    # the allow rules themselves (below, the file) are not part of the hash
    assert config.profiles["certified"].model_copy(update={"allow": None}).rules_sha256() == rules


def test_without_a_model_check_the_policy_still_loads(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "nq.json").write_text(certificate(model="x").model_dump_json(), encoding="utf-8")
    policy = PolicyEngine(parse_policy(POLICY.replace("BELOW", "caveat")), base_dir=tmp_path)
    assert set(policy.certified) == {"certified"}


# ------------------------------------------------------------------ in the processor


def test_processor_re_tests_the_certificate_on_feedback(
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Certified allows are labelled wrong on rag.feedback until the re-test breaks the
    certificate: then the allow is withdrawn, the report and the gauge say so."""
    key = "acme/wiki/qdrant-minilm-l6"
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "nq.json").write_text(
        certificate(key=key, model="stub").model_dump_json(), encoding="utf-8"
    )
    config = parse_policy(POLICY.replace("BELOW", "caveat").replace("nq-open:", "wiki:"))
    policy = PolicyEngine(config, base_dir=tmp_path, models={"confidence": "stub"})
    monitor = CoverageMonitor(window=100, report_interval_s=1.0)
    suite = SignalSuite(
        certifier=ThresholdCertifier(calibration_key=key), coverage=monitor, confidence=Stub()
    )
    settings = settings_factory(join={"max_entries": 10, "ttl_ms": 1000})
    policy.attach_certificates(monitor.certificates)  # what runtime.build_processor wires
    processor = Processor(settings, policy, signals=suite)
    offsets = iter(range(10_000))

    def send(kind: InputKind, event: dict[str, Any]) -> Step:
        rid = event["request_id"]
        ref = InputRef(f"rag.{kind.value}", 0, next(offsets))
        return processor.on_message(kind, dumps(event), rid.encode(), ref, 0.0)

    def decide(rid: str) -> AnswerVerdict:
        send(InputKind.RETRIEVAL, retrieval_event(rid))
        step = send(InputKind.GENERATION, final_event(rid))
        [out] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
        return AnswerVerdict.model_validate(orjson.loads(out.value))

    first = decide("req-0")
    assert first.decision is Decision.ALLOW
    assert (first.certified_risk, first.certified_delta, first.certificate) == (0.2, 0.1, key)
    assert "certified-allow" in {r.code for r in first.reasons}
    for i in range(1, 20):
        assert decide(f"req-{i}").decision is Decision.ALLOW
    feedback = {"schema_version": 1, "event_type": "feedback", "source": "grader"}
    for i in range(5):  # right answers: the certificate holds
        send(InputKind.FEEDBACK, {**feedback, "request_id": f"req-{i}", "correct": True})
    assert monitor.certificates.check(key).status == "holds"
    assert decide("req-still").decision is Decision.ALLOW
    for i in range(5, 20):  # then 15 wrong ones
        send(InputKind.FEEDBACK, {**feedback, "request_id": f"req-{i}", "correct": False})
    assert monitor.certificates.check(key).labelled == 20
    assert monitor.certificates.violated(key)  # 15 of 20 wrong vs a certified 0.2
    after = decide("req-after")
    assert after.decision is Decision.CAVEAT
    assert "certificate-violated" in {r.code for r in after.reasons}
    assert after.certified_risk is None
    [report] = [r for r in monitor.reports() if r.calibration_key == key]
    assert report.certificate is not None
    assert report.certificate.status == "violated"
    assert (report.certificate.errors, report.certificate.labelled) == (15, 20)
    assert report.certificate.error_low is not None and report.certificate.error_low > 0.2
    assert monitor.gauge_values()[key]["certificate_violated"] == 1.0


def test_a_policy_mounted_elsewhere_finds_the_shipped_certificate(tmp_path: Path) -> None:
    shipped = tmp_path / "models" / "policy"
    (shipped / "certs").mkdir(parents=True)
    (shipped / "certs" / "nq.json").write_text(certificate().model_dump_json(), encoding="utf-8")
    mounted = tmp_path / "configmap"
    mounted.mkdir()
    (mounted / "policy.yaml").write_text(POLICY.replace("BELOW", "caveat"), encoding="utf-8")
    with pytest.raises(ConfigError, match="does not exist"):
        PolicyEngine.from_file(mounted / "policy.yaml")
    policy = PolicyEngine.from_file(mounted / "policy.yaml", search=[shipped])
    assert policy.certified["certified"].path == shipped / "certs" / "nq.json"
    # the policy's own folder wins
    (mounted / "certs").mkdir()
    (mounted / "certs" / "nq.json").write_text(certificate().model_dump_json(), encoding="utf-8")
    own = PolicyEngine.from_file(mounted / "policy.yaml", search=[shipped])
    assert own.certified["certified"].path == mounted / "certs" / "nq.json"


def test_a_policy_built_in_code_never_allows_uncertified(tmp_path: Path) -> None:
    del tmp_path
    policy = PolicyEngine(parse_policy(POLICY.replace("BELOW", "block")))  # no folder to look in
    assert policy.certified == {}
    outcome = policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.99)
    assert outcome.decision is Decision.BLOCK
    assert "certificate-not-applicable" in codes(outcome)


def test_the_runtime_checks_certificates_against_the_served_models() -> None:
    from sidecar.runtime import _served_models

    repo = Path(__file__).resolve().parents[2] / "models"
    served = _served_models(Settings.load(models={"dir": str(repo)}, signals={"claims": True}))
    card = (repo / "confidence" / "smollm2-135m-nq" / "card.json").read_text(encoding="utf-8")
    assert served["confidence"] in card
    assert served["signals"] == "certifier,lookback,verifier,confidence"
    # the shipped certificate names the calibration and lookback model served by default
    shipped = json.loads((repo / "policy" / "certs" / "nq-open.json").read_text("utf-8"))
    for name in ("certifier", "lookback"):
        assert served[name] == shipped["model_versions"][name]
    off = _served_models(Settings.load(models={"dir": str(repo)}, signals={"confidence": False}))
    assert off == {k: served[k] for k in ("certifier", "lookback")} | {
        "signals": "certifier,lookback"
    }


@pytest.mark.parametrize(("fitted", "served_judge"), [("v+rules", True), ("v+rules+judge", False)])
def test_a_certificate_fitted_with_or_without_the_judge_applies_only_so(
    tmp_path: Path, fitted: str, served_judge: bool
) -> None:
    """The judge relabels the verifier's uncertain claims and the confidence reads the
    labels: a certificate fitted without it applied with it (the suffix was dropped), and
    the reverse. The same judge setting as fitted applies."""
    cert = certificate().model_copy(
        update={"model_versions": {"lookback": "l", "verifier": fitted, "confidence": MODEL}}
    )
    models = {"confidence": MODEL, "signals": "confidence,lookback,verifier", "verifier": "v"}
    judged = models | {"judge": "on"}
    policy = engine(tmp_path, cert, models=judged if served_judge else models)
    outcome = policy.decide(retrieval(), FINAL, SIGNALS, confidence=0.9)
    assert outcome.decision is Decision.CAVEAT
    [reason] = [r for r in outcome.reasons if r.code == "certificate-not-applicable"]
    said = "fitted without an LLM judge" if served_judge else "fitted with an LLM judge"
    assert said in reason.message
    as_fitted = engine(tmp_path, cert, models=models if served_judge else judged)
    assert as_fitted.decide(retrieval(), FINAL, SIGNALS, confidence=0.9).decision is Decision.ALLOW


@pytest.mark.parametrize("fitted", ["v+rules+judge", "v+rules"])
def test_an_answer_the_judge_did_not_fully_label_is_not_certified(
    tmp_path: Path, fitted: str
) -> None:
    """A certificate fitted on the judge's labels, served with the judge: an answer whose
    uncertain claims kept the verifier's label because the judge failed, was late or
    paused (``ClaimsSignal.unjudged``) is not the answer it was fitted on. Its confidence
    allowed it before."""
    cert = certificate().model_copy(
        update={"model_versions": {"lookback": "l", "verifier": fitted, "confidence": MODEL}}
    )
    models = {"confidence": MODEL, "signals": "confidence,lookback,verifier", "verifier": "v"}
    if "judge" in fitted:
        models["judge"] = "on"
    policy = engine(tmp_path, cert, models=models)
    claims = ClaimsSignal(
        status=SignalStatus.OK,
        n=10,
        supported=9,
        uncertain=1,
        reliability=0.95,
        reliability_level="HIGH",
        hallucination_rate=0.0,
        evidence_scope="trusted",
        unjudged=1,
    )
    signals = SIGNALS.model_copy(update={"claims": claims})
    outcome = policy.decide(retrieval(), FINAL, signals, confidence=0.9)
    if "judge" not in fitted:  # no judge fitted, none served: the count cannot matter
        assert outcome.decision is Decision.ALLOW
        return
    assert outcome.decision is Decision.CAVEAT and outcome.certified_risk is None
    [reason] = [r for r in outcome.reasons if r.code == "certificate-not-applicable"]
    assert "did not label 1 of this answer's claims" in reason.message
    judged = signals.model_copy(update={"claims": claims.model_copy(update={"unjudged": 0})})
    assert policy.decide(retrieval(), FINAL, judged, confidence=0.9).decision is Decision.ALLOW


def test_the_runtime_says_when_it_serves_a_judge() -> None:
    from sidecar.runtime import _served_models

    repo = Path(__file__).resolve().parents[2] / "models"
    judge = {"endpoint": "http://127.0.0.1:9/v1", "model": "m"}
    on = Settings.load(models={"dir": str(repo)}, signals={"claims": True}, judge=judge)
    assert _served_models(on)["judge"] == "on"
    assert "judge" not in _served_models(Settings.load(models={"dir": str(repo)}))
