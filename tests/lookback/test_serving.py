"""The serving path: OnnxLookbackScorer against the trainer, checks, trusted-chunk padding."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from sidecar.config import Settings
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationFinal,
    LookbackSignal,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.exceptions import ArtifactError, ConfigError, InputError
from sidecar.golden import describe_cpu
from sidecar.lab.lookback.dataset import load_dataset
from sidecar.lab.lookback.training import LookbackClassifier, split_by_question
from sidecar.lookback.artifact import GOLDEN_CASES, GOLDEN_TOLERANCE, golden_features, load_metadata
from sidecar.lookback.features import feature_rows, feature_vector
from sidecar.lookback.serving import LookbackRequest, OnnxLookbackScorer, lookback_ok
from sidecar.pipeline.ports import LookbackScorer
from tests.lookback.conftest import GENERATOR, HEADS, LAYERS, K, synthetic_rows

NO_CERT = RetrievalSignal(status=SignalStatus.NOT_CONFIGURED)


def final(array: np.ndarray, *, variant: str = "cw", generator: str = GENERATOR) -> GenerationFinal:
    return GenerationFinal(
        request_id="r-1",
        answer="an answer",
        generator_model=generator,
        attention=AttentionSummary.from_array(array, variant=variant),  # type: ignore[arg-type]
    )


def trusted(*ids: str) -> RetrievalSignal:
    return RetrievalSignal(status=SignalStatus.OK, trusted_chunk_ids=list(ids), m1=bool(ids))


def test_scorer_satisfies_the_pipeline_protocol(cw_model: Path) -> None:
    scorer: LookbackScorer = OnnxLookbackScorer.from_dir(cw_model)
    assert scorer.version.startswith("tiny-cw@")


def test_serving_scores_recorded_summaries_like_the_trainer(
    cw_model: Path, dataset_dir: Path
) -> None:
    """Refit the trainer's model (same data, split, seed) and compare on held-out rows."""
    data = load_dataset(dataset_dir)
    train = split_by_question(data.rows.qid, 0.6, 0)
    clf = LookbackClassifier(chunks=K, seed=0).fit(
        data.rows.cw[train].astype(np.float32), data.rows.label[train]
    )
    scorer = OnnxLookbackScorer.from_dir(cw_model)
    held_out = data.rows.cw[~train][:25]
    expected = clf.predict_proba(held_out.astype(np.float32))
    got = [scorer.score(final(row), NO_CERT).p_factual for row in held_out]
    np.testing.assert_allclose(np.array(got, dtype=np.float64), expected, atol=1e-5)


def test_serving_equals_the_exported_logistic_regression(cw_model: Path) -> None:
    """p = sigmoid(w . v + b) with the ONNX file's own weights, computed in numpy."""
    graph = onnx.load(str(cw_model / "model.onnx")).graph
    (node,) = [n for n in graph.node if n.op_type == "LinearClassifier"]
    attrs = {a.name: a for a in node.attribute}
    # Binary classifiers store two rows (class 0 = -w, class 1 = w) and a logistic transform.
    coef = np.array(attrs["coefficients"].floats, dtype=np.float64).reshape(2, -1)[1]
    intercept = np.array(attrs["intercepts"].floats, dtype=np.float64)[1:]
    assert attrs["post_transform"].s == b"LOGISTIC"
    assert coef.size == LAYERS * HEADS * K
    scorer = OnnxLookbackScorer.from_dir(cw_model)
    for row in synthetic_rows(10, seed=7).cw:
        v = feature_vector(row.astype(np.float32), K).astype(np.float64)
        p = 1.0 / (1.0 + np.exp(-(coef.ravel() @ v + intercept.ravel()[0])))
        signal = scorer.score(final(row), NO_CERT)
        assert signal.status == SignalStatus.OK
        assert signal.p_factual == pytest.approx(p, abs=1e-5)
        assert signal.model_version == scorer.version


def test_score_many_equals_score(cw_model: Path) -> None:
    scorer = OnnxLookbackScorer.from_dir(cw_model)
    rows = synthetic_rows(9, seed=3).cw
    requests = [
        LookbackRequest(final(r), trusted("a", "b") if i % 2 else NO_CERT)
        for i, r in enumerate(rows)
    ]
    requests.append(LookbackRequest(final(rows[0], generator="other/model"), NO_CERT))
    scorer_soft = OnnxLookbackScorer.from_dir(cw_model, on_mismatch="unavailable")
    batch = scorer_soft.score_many(requests)
    single = [scorer_soft.score(r.final, r.certification) for r in requests]
    assert [s.status for s in batch] == [SignalStatus.OK] * 9 + [SignalStatus.UNAVAILABLE]
    for a, b in zip(batch, single, strict=True):
        assert a.status == b.status
        assert a.p_factual == b.p_factual  # bit for bit (tests/lookback/test_batch_cuts.py)
    assert scorer.score_many([]) == []


def _score_many_per_request(
    scorer: OnnxLookbackScorer, requests: list[LookbackRequest]
) -> list[LookbackSignal]:
    """The reference: score_many as it was, each request prepared on its own, its rows
    built by feature_rows, each result validated."""
    prepared = [scorer._prepare(r.final, r.certification, r.chunk_ids, r.hit_ids) for r in requests]
    scorable = [p for p in prepared if p.ratios is not None]
    probs = np.zeros(0)
    if scorable:
        ratios = [p.ratios for p in scorable if p.ratios is not None]
        probs = scorer._run(feature_rows(ratios, K, [p.keep for p in scorable]))
    out, j = [], 0
    for p in prepared:
        if p.signal is not None:
            out.append(p.signal)
        else:
            out.append(
                LookbackSignal(
                    status=SignalStatus.OK, p_factual=float(probs[j]), model_version=scorer.version
                )
            )
            j += 1
    return out


def test_score_many_is_the_per_request_path_bit_for_bit(cw_model: Path) -> None:
    """Varied batches (no summary, a mismatch, short summaries, every kind of trusted set,
    -0.0 and 65504 in the ratios): the same signals, p_factual equal as floats."""
    scorer = OnnxLookbackScorer.from_dir(cw_model, on_mismatch="unavailable")
    rng = np.random.default_rng(11)
    ids = ("c1", "c2", "c3")
    certs = [NO_CERT, trusted(), trusted("c1"), trusted("c1", "c2"), trusted("c3", "c1")]
    certs += [trusted("c2"), trusted("a", "b", "c", "d")]
    certs.append(RetrievalSignal(status=SignalStatus.UNAVAILABLE))
    for _ in range(30):
        requests = []
        for _ in range(int(rng.integers(1, 12))):
            width = int(rng.integers(1, K + 1))
            array = rng.gamma(2.0, 0.5, size=(LAYERS, HEADS, width))
            array[rng.uniform(size=array.shape) < 0.1] = -0.0
            array[rng.uniform(size=array.shape) < 0.02] = 65504.0
            event = final(array)
            kind = rng.integers(0, 10)
            if kind == 0:
                event = GenerationFinal(request_id="r", answer="x", generator_model=GENERATOR)
            elif kind == 1:
                event = final(array, generator="other/model")
            cert = certs[int(rng.integers(0, len(certs)))]
            how = rng.integers(0, 3)  # the columns by position, by chunk ids, by hit ids
            chunk_ids = ids[:width] if how == 1 else None
            hit_ids = ids if how == 2 else None
            requests.append(LookbackRequest(event, cert, chunk_ids, hit_ids))
        expected = _score_many_per_request(scorer, requests)
        got = scorer.score_many(requests)
        assert got == expected
        assert [s.p_factual for s in got] == [s.p_factual for s in expected]
        assert [s.model_fields_set for s in got] == [s.model_fields_set for s in expected]
        assert [s.model_dump_json() for s in got] == [s.model_dump_json() for s in expected]
        assert scorer.score_batch(
            [(r.final, r.certification) for r in requests], hit_ids=[ids] * len(requests)
        ) == _score_many_per_request(
            scorer, [LookbackRequest(r.final, r.certification, None, ids) for r in requests]
        )


def test_a_scored_signal_is_built_as_validation_builds_it() -> None:
    for p in (0.0, 1e-300, 0.5, 1.0):
        built = lookback_ok(p, "m@1")
        assert built == LookbackSignal(status=SignalStatus.OK, p_factual=p, model_version="m@1")
        assert built.model_fields_set == {"status", "p_factual", "model_version"}
        assert (
            built.model_dump_json()
            == LookbackSignal.model_validate_json(built.model_dump_json()).model_dump_json()
        )
    for bad in (float("nan"), 1.5, -0.1):
        with pytest.raises(ValueError, match="p_factual"):
            lookback_ok(bad, "m@1")


def test_trusted_chunks_select_columns_then_pad(cw_model: Path) -> None:
    scorer = OnnxLookbackScorer.from_dir(cw_model)
    row = synthetic_rows(1, seed=5).cw[0].astype(np.float32)
    ids = ("c1", "c2", "c3")
    prefix = scorer.features(final(row), trusted("c1", "c2"))
    explicit = scorer.features(final(row), trusted("c2", "c1"), chunk_ids=ids)
    manual = feature_vector(np.concatenate([row[:, :, :2], np.zeros((LAYERS, HEADS, 1))], 2), K)
    assert prefix is not None
    np.testing.assert_array_equal(prefix, manual)
    np.testing.assert_array_equal(explicit, manual)
    # A non-prefix trusted set keeps retrieval order: columns 1 and 3, then zeros.
    gap = scorer.features(final(row), trusted("c3", "c1"), chunk_ids=ids)
    np.testing.assert_array_equal(gap, feature_vector(row, K, keep=[0, 2]))
    # Hits in retrieval order with the trusted ones not first (a reranked list): the
    # processor passes the hit order, and the trusted hits' own columns are kept.
    reranked = scorer.features(final(row), trusted("c1", "c3"), hit_ids=ids)
    np.testing.assert_array_equal(reranked, feature_vector(row, K, keep=[0, 2]))
    # fewer summary columns than hits: the first hits are the columns
    np.testing.assert_array_equal(
        scorer.features(final(row[:, :, :2]), trusted("c2"), hit_ids=ids),
        feature_vector(np.concatenate([row[:, :, 1:2], np.zeros((LAYERS, HEADS, 2))], 2), K),
    )
    # a trusted hit with no column in the summary: unavailable, not a wrong column
    assert scorer.score(final(row[:, :, :2]), trusted("c3"), hit_ids=ids).status == "unavailable"
    # Without an ok certification every column counts; a full summary is not padded.
    np.testing.assert_array_equal(scorer.features(final(row), NO_CERT), feature_vector(row, K))
    # Fewer chunks than K in the summary: zero padding, same as the trainer's.
    short = row[:, :, :2]
    np.testing.assert_array_equal(scorer.features(final(short), NO_CERT), manual)
    # Inconsistent certification: unavailable, not an exception.
    assert scorer.score(final(row), trusted("a", "b", "c", "d")).status == "unavailable"
    assert scorer.score(final(row), trusted("c1"), chunk_ids=ids[:2]).status == "unavailable"
    # No trusted chunk: the all-zero vector is still scored.
    assert scorer.score(final(row), trusted()).status == SignalStatus.OK


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (lambda: final(np.ones((LAYERS, HEADS, K)), generator="other/model"), "generator-mismatch"),
        (lambda: final(np.ones((LAYERS + 1, HEADS, K))), "attention-shape"),
        (lambda: final(np.ones((LAYERS, HEADS - 1, K))), "attention-shape"),
        (lambda: final(np.ones((LAYERS, HEADS, K + 1))), "attention-shape"),
        (lambda: final(np.ones((LAYERS, HEADS, 1)), variant="fc"), "attention-shape"),
    ],
)
def test_mismatch_raises_input_error_or_reports_unavailable(
    cw_model: Path, event: object, reason: str
) -> None:
    ev: GenerationFinal = event()  # type: ignore[operator]
    strict = OnnxLookbackScorer.from_dir(cw_model)
    with pytest.raises(InputError) as info:
        strict.check(ev)
    assert info.value.reason == reason
    assert info.value.dead_letter
    with pytest.raises(InputError):
        strict.score(ev, NO_CERT)
    soft = OnnxLookbackScorer.from_dir(cw_model, on_mismatch="unavailable")
    soft.check(ev)
    assert soft.score(ev, NO_CERT).status == SignalStatus.UNAVAILABLE
    assert soft.mismatches == 1


def test_mismatches_scored_unavailable_are_counted_and_warned_once_a_minute(
    cw_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default: a rollout of another lookback model (or generator) made every final
    event a dead letter and every answer ``incomplete`` at the join TTL (helper-14: 80
    requests blocked, the reason only in the DLQ headers); now the answer is scored
    without the signal, and the operator is told why, once a minute, with a count."""
    assert Settings.load().signals.lookback_mismatch == "unavailable"
    scorer = OnnxLookbackScorer.from_dir(cw_model, on_mismatch="unavailable")
    other = final(np.ones((LAYERS, HEADS, 1)), variant="fc")
    with caplog.at_level(logging.WARNING, logger="sidecar.lookback.serving"):
        for _ in range(5):
            assert scorer.score(other, NO_CERT).status == SignalStatus.UNAVAILABLE
    assert scorer.mismatches == 5
    [warned] = [r.getMessage() for r in caplog.records if "lookback signal" in r.getMessage()]
    assert "for 1 answer(s)" in warned and "attention-shape" in warned and "'fc'" in warned


def test_missing_summary_is_unavailable_not_an_error(cw_model: Path) -> None:
    scorer = OnnxLookbackScorer.from_dir(cw_model)
    ev = GenerationFinal(request_id="r", answer="x", generator_model=GENERATOR)
    scorer.check(ev)
    assert scorer.score(ev, NO_CERT).status == SignalStatus.UNAVAILABLE


def test_fc_model_scores_fc_summaries_only(fc_model: Path) -> None:
    scorer = OnnxLookbackScorer.from_dir(fc_model)
    fc = synthetic_rows(1, seed=2).fc[0][:, :, None]
    signal = scorer.score(final(fc, variant="fc"), trusted())  # certification is irrelevant
    assert signal.status == SignalStatus.OK
    again = scorer.score(final(fc, variant="fc"), NO_CERT).p_factual
    assert signal.p_factual == pytest.approx(again, rel=0, abs=1e-9)
    with pytest.raises(InputError, match="variant 'cw'"):
        scorer.check(final(np.ones((LAYERS, HEADS, 1))))


def test_serving_imports_neither_torch_nor_sklearn(cw_model: Path) -> None:
    code = (
        "import sys; from sidecar.lookback.serving import OnnxLookbackScorer; "
        f"OnnxLookbackScorer.from_dir({str(cw_model)!r}); "
        "bad = [m for m in ('torch', 'transformers', 'sklearn', 'skl2onnx') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


# ------------------------------------------------------------------ golden outputs


def _copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("model.onnx", "metadata.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


@pytest.mark.parametrize("variant", ["cw", "fc"])
def test_the_export_writes_golden_outputs_the_scorer_checks_at_load(
    variant: str, cw_model: Path, fc_model: Path
) -> None:
    model = cw_model if variant == "cw" else fc_model
    meta = load_metadata(model)[0]
    golden = meta.golden
    assert golden is not None and golden.output == "p_factual"
    assert golden.tolerance == GOLDEN_TOLERANCE and len(golden.cases) == GOLDEN_CASES
    assert golden.recorded_on == describe_cpu()
    assert golden.inputs == golden_features(meta.layers, meta.heads, meta.chunks)
    assert golden.inputs[0] == [0.0] * meta.n_features  # no trusted chunk: all zeros
    assert len({tuple(x) for x in golden.inputs}) > 1  # the cases really differ
    scorer = OnnxLookbackScorer.from_dir(model)
    drift = scorer.check_golden()
    assert drift is not None and drift <= golden.tolerance
    # The references are what serving computes for those vectors, one at a time.
    for case in golden.cases:
        served = scorer._run(np.asarray([case.input], dtype=np.float32))[0]
        assert served == pytest.approx(case.output, abs=golden.tolerance)


def test_a_drifted_golden_output_refuses_to_load(cw_model: Path, tmp_path: Path) -> None:
    model = _copy_model(cw_model, tmp_path / "m")
    meta = json.loads((model / "metadata.json").read_text("utf-8"))
    meta["golden"]["cases"][2]["output"] += 3 * meta["golden"]["tolerance"]
    (model / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ConfigError, match="p_factual moved by up to") as info:
        OnnxLookbackScorer.from_dir(model)
    assert describe_cpu() in str(info.value) and "tiny-cw@" in str(info.value)
    unchecked = OnnxLookbackScorer.from_dir(model, check_golden=False)  # to record new ones
    with pytest.raises(ConfigError, match="more than the allowed"):
        unchecked.check_golden()


def test_a_changed_model_with_a_matching_sha256_refuses_to_load(
    cw_model: Path, tmp_path: Path
) -> None:
    """The sha256 says the file is the one the JSON names; the golden outputs say it still
    computes what it computed at export (here: other weights, as a bad re-export would)."""
    model = _copy_model(cw_model, tmp_path / "m")
    graph = onnx.load(str(model / "model.onnx"))
    (node,) = [n for n in graph.graph.node if n.op_type == "LinearClassifier"]
    (intercepts,) = [a for a in node.attribute if a.name == "intercepts"]
    intercepts.floats[:] = [x + 0.5 * (1 if k else -1) for k, x in enumerate(intercepts.floats)]
    data = graph.SerializeToString()
    (model / "model.onnx").write_bytes(data)
    meta = json.loads((model / "metadata.json").read_text("utf-8"))
    meta["onnx_sha256"] = hashlib.sha256(data).hexdigest()
    (model / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"other outputs than at export.*most likely changed"):
        OnnxLookbackScorer.from_dir(model)


def test_a_model_without_golden_outputs_loads_with_a_warning(
    cw_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = _copy_model(cw_model, tmp_path / "m")
    meta = json.loads((model / "metadata.json").read_text("utf-8"))
    del meta["golden"]
    (model / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="sidecar.lookback.serving"):
        scorer = OnnxLookbackScorer.from_dir(model)
    assert scorer.check_golden() is None
    assert "has no golden outputs" in caplog.text and "guardrail golden record" in caplog.text


def test_golden_check_reports_every_model_and_exits_2_when_one_drifted(
    cw_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: ``golden check`` of an edited model exited 2 without the report it exists for."""
    from sidecar.cli.main import main

    good = _copy_model(cw_model, tmp_path / "good")
    edited = _copy_model(cw_model, tmp_path / "edited")
    meta = json.loads((edited / "metadata.json").read_text("utf-8"))
    meta["golden"]["cases"][0]["output"] += 0.2
    (edited / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    assert main(["golden", "check", str(edited), str(good)]) == 2
    out = capsys.readouterr()
    report = json.loads(out.out)
    by_model = {m["model"]: m for m in report["models"]}
    assert by_model[str(good)]["within_tolerance"] is True
    assert by_model[str(good)]["max_drift"] <= by_model[str(good)]["tolerance"]
    assert by_model[str(edited)]["within_tolerance"] is False
    assert "files were most likely changed" in by_model[str(edited)]["problem"]
    assert str(edited) in out.err


def test_invalid_metadata_is_described_without_pydantic_dumps(
    cw_model: Path, tmp_path: Path
) -> None:
    model = _copy_model(cw_model, tmp_path / "m")
    meta = json.loads((model / "metadata.json").read_text("utf-8"))
    meta["layers"] = "thirty"
    (model / "metadata.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ArtifactError) as info:
        OnnxLookbackScorer.from_dir(model)
    assert "layers: Input should be a valid integer" in str(info.value)
    assert "errors.pydantic.dev" not in str(info.value)
