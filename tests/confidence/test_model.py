"""The calibrated-confidence forecaster: features, fit, held-out quality, the JSON artifact."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sidecar.confidence.calibration import Calibrator, PlattCalibrator, fit_calibrator
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.confidence.model import MODEL_FORMAT, ConfidenceModel
from sidecar.confidence.spec import (
    ANSWER_SPEC,
    FEATURES,
    MISSING_GROUPS,
    SIGNALS,
    FeatureSpec,
    FeatureValues,
    feature_vector,
)
from sidecar.exceptions import ArtifactError, ConfigError
from sidecar.lab.confidence.training import fit_confidence_model, stratified_split
from sidecar.stats.metrics import auroc, ece


def make_rows(n: int, seed: int) -> tuple[list[FeatureValues], np.ndarray]:
    """Rows driven by a latent quality u, P(correct) = sigmoid(1.8 u + 0.3); groups go missing."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=n)
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-(1.8 * u + 0.3)))).astype(np.int64)
    rows: list[FeatureValues] = []
    for i in range(n):
        top = 0.6 + 0.1 * u[i] + 0.05 * rng.normal()
        row: dict[str, float | None] = {
            "retrieval_top_score": top,
            "retrieval_margin": abs(0.05 + 0.02 * u[i] + 0.02 * rng.normal()),
            "retrieval_mean_score": top - 0.1 + 0.03 * rng.normal(),
            "answer_words_log1p": math.log1p(int(rng.integers(1, 40))),
            "lookback_p": None,
            "mean_token_logprob": None,
        }
        if rng.random() < 0.8:
            row["m1"] = float(top > 0.55)
            row["m2"] = float(rng.random())
        if rng.random() < 0.7:
            row["lookback_p"] = 1.0 / (1.0 + math.exp(-(u[i] + rng.normal())))
        if rng.random() < 0.6:
            row["claims_reliability"] = 1.0 / (1.0 + math.exp(-(u[i] + rng.normal())))
            row["claims_hallucination_rate"] = float(rng.random())
        if rng.random() < 0.9:
            row["mean_token_logprob"] = -0.5 + 0.2 * u[i] + 0.2 * rng.normal()
        rows.append(row)
    return rows, labels


@pytest.fixture(scope="module")
def model() -> ConfidenceModel:
    rows, labels = make_rows(3000, seed=1)
    return fit_confidence_model(rows, labels, seed=3)


def full_row() -> dict[str, float | None]:
    return {name: 0.5 for name in SIGNALS}


def test_feature_vector_sets_missing_indicators() -> None:
    row = full_row()
    row["lookback_p"] = None
    del row["claims_hallucination_rate"]  # absent counts as None
    x = feature_vector(row)
    assert x.shape == (len(FEATURES),)
    index = {name: i for i, name in enumerate(FEATURES)}
    assert math.isnan(x[index["lookback_p"]])
    assert math.isnan(x[index["claims_hallucination_rate"]])
    assert x[index["claims_reliability"]] == 0.5
    assert x[index["lookback_missing"]] == 1.0
    assert x[index["claims_missing"]] == 1.0
    assert x[index["logprob_missing"]] == 0.0
    assert x[index["certification_missing"]] == 0.0
    assert FEATURES == SIGNALS + tuple(MISSING_GROUPS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lookbak_p": 0.3}, "unknown features"),
        ({"lookback_missing": 1.0}, "unknown features"),
        ({"m2": math.nan}, "finite"),
        ({"m2": "high"}, "finite"),
    ],
)
def test_feature_vector_rejects_bad_rows(change: dict[str, object], message: str) -> None:
    row: dict[str, object] = {**full_row(), **change}
    with pytest.raises(ConfidenceDataError, match=message):
        feature_vector(row)  # type: ignore[arg-type]


def test_missing_values_are_imputed_with_training_means(model: ConfidenceModel) -> None:
    row = full_row()
    row["mean_token_logprob"] = None
    x = model.features([row])[0]
    j = FEATURES.index("mean_token_logprob")
    assert x[j] == model.imputation_means[j]
    assert x[FEATURES.index("logprob_missing")] == 1.0
    assert not np.isnan(x).any()


def test_an_ungrouped_none_is_imputed_without_an_indicator(model: ConfidenceModel) -> None:
    row = full_row()
    row["retrieval_top_score"] = None
    x = model.features([row])[0]
    j = FEATURES.index("retrieval_top_score")
    assert x[j] == model.imputation_means[j]
    assert x[len(SIGNALS) :].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_held_out_calibration_and_discrimination(model: ConfidenceModel) -> None:
    rows, labels = make_rows(3000, seed=2)
    p = model.predict(rows)
    assert p.shape == (3000,)
    assert np.all((p > 0.0) & (p < 1.0))
    assert ece(p, labels) < 0.04
    assert auroc(p, labels) > 0.75
    assert model.predict_one(rows[0]) == pytest.approx(p[0], rel=0, abs=1e-12)
    metrics = model.training.metrics
    assert metrics["ece"] < 0.05 and metrics["auroc"] > 0.75
    assert set(metrics) >= {"ece", "brier", "nll", "auroc", "raw_ece", "raw_nll", "fit_auroc"}
    assert model.training.n == 3000 and model.training.n_fit + model.training.n_calibration == 3000
    assert model.training.calibration_choice["method"] == model.method


def test_fit_is_deterministic(model: ConfidenceModel) -> None:
    rows, labels = make_rows(3000, seed=1)
    again = fit_confidence_model(rows, labels, seed=3)
    assert again.params_sha256 == model.params_sha256
    assert again.training == model.training


def test_stratified_split_keeps_the_base_rate() -> None:
    labels = np.array([0.0] * 50 + [1.0] * 30)
    fit, cal = stratified_split(labels, 0.6, seed=0)
    assert (labels[fit].sum(), labels[cal].sum()) == (18, 12)  # 0.6 * 30 positives
    assert fit.size == 48 and sorted(np.concatenate([fit, cal]).tolist()) == list(range(80))


def test_json_round_trip_predicts_identically(model: ConfidenceModel, tmp_path: Path) -> None:
    path = model.save(tmp_path / "confidence.json")
    loaded = ConfidenceModel.load(path)
    assert loaded == model
    rows, _ = make_rows(200, seed=5)
    assert np.array_equal(loaded.predict(rows), model.predict(rows))
    assert json.loads(path.read_text("utf-8"))["format"] == MODEL_FORMAT
    assert loaded.version == f"confidence@{loaded.params_sha256[:12]}"


def _edited(model: ConfidenceModel, tmp_path: Path, **changes: object) -> Path:
    data = json.loads(model.model_dump_json())
    data.update(changes)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data), "utf-8")
    return path


def test_wrong_format_is_refused(model: ConfidenceModel, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="format 'lookback-classifier/1'"):
        ConfidenceModel.load(_edited(model, tmp_path, format="lookback-classifier/1"))
    (tmp_path / "list.json").write_text("[]", "utf-8")
    with pytest.raises(ArtifactError, match="not a JSON object"):
        ConfidenceModel.load(tmp_path / "list.json")
    with pytest.raises(ArtifactError, match="cannot read"):
        ConfidenceModel.load(tmp_path / "absent.json")


def test_an_invalid_model_is_described_without_pydantic_dumps(
    model: ConfidenceModel, tmp_path: Path
) -> None:
    """Audit: the error was pydantic's own text, with its links to errors.pydantic.dev."""
    with pytest.raises(ArtifactError) as info:
        ConfidenceModel.load(_edited(model, tmp_path, intercept="nan?", seed_of_doubt=1))
    message = str(info.value)
    assert "intercept: Input should be a valid number" in message
    assert "seed_of_doubt: Extra inputs are not permitted" in message
    assert "errors.pydantic.dev" not in message and "input_value=" not in message


def test_mismatched_features_are_refused(model: ConfidenceModel, tmp_path: Path) -> None:
    dropped = list(FEATURES[:-1])
    with pytest.raises(ArtifactError, match=r"missing \['certification_missing'\]"):
        ConfidenceModel.load(_edited(model, tmp_path, feature_names=dropped))
    swapped = [FEATURES[1], FEATURES[0], *FEATURES[2:]]
    with pytest.raises(ArtifactError, match=r"differ \(order\)"):
        ConfidenceModel.load(_edited(model, tmp_path, feature_names=swapped))


def test_edited_parameters_are_refused(model: ConfidenceModel, tmp_path: Path) -> None:
    tampered = [*model.coefficients[:-1], model.coefficients[-1] + 0.5]
    with pytest.raises(ArtifactError, match="changed after training"):
        ConfidenceModel.load(_edited(model, tmp_path, coefficients=tampered))


def test_inconsistent_models_cannot_be_built(model: ConfidenceModel) -> None:
    with pytest.raises(ValidationError, match="coefficients has 3 values"):
        ConfidenceModel.create(
            imputation_means=model.imputation_means,
            standardisation_mean=model.standardisation_mean,
            standardisation_scale=model.standardisation_scale,
            coefficients=[1.0, 2.0, 3.0],
            intercept=0.0,
            calibrator=PlattCalibrator(a=1.0, b=0.0),
            training=model.training,
        )


def test_fit_needs_both_classes_and_valid_settings() -> None:
    rows, labels = make_rows(60, seed=0)
    with pytest.raises(ConfidenceDataError, match="each class"):
        fit_confidence_model(rows, np.ones(60, dtype=np.int64))
    with pytest.raises(ConfigError, match="l2"):
        fit_confidence_model(rows, labels, l2=0.0)
    with pytest.raises(ConfigError, match="fit_fraction"):
        fit_confidence_model(rows, labels, fit_fraction=1.0)


def test_a_group_never_seen_in_training_is_imputed_with_zero() -> None:
    rows, labels = make_rows(400, seed=4)
    for row in rows:
        assert isinstance(row, dict)
        row["lookback_p"] = None
    fitted = fit_confidence_model(rows, labels, folds=3)
    j = FEATURES.index("lookback_p")
    assert fitted.imputation_means[j] == 0.0
    assert fitted.standardisation_scale[FEATURES.index("lookback_missing")] == 1.0
    with_lookback = {**full_row(), "lookback_p": 0.9}
    assert 0.0 < fitted.predict_one(with_lookback) < 1.0


CHUNK_SPEC = FeatureSpec(
    signals=("score", "inverse_rank", "trusted"),
    missing_groups={"trusted_missing": ("trusted",)},
)


def test_other_feature_specs_round_trip_and_are_checked(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 600
    score = rng.random(n)
    labels = (rng.random(n) < score).astype(np.int64)
    rows: list[FeatureValues] = [
        {
            "score": float(s),
            "inverse_rank": 1.0 / (1 + i % 5),
            "trusted": None if i % 4 == 0 else float(s > 0.5),
        }
        for i, s in enumerate(score)
    ]
    chunk_model = fit_confidence_model(rows, labels, spec=CHUNK_SPEC)
    assert chunk_model.spec == CHUNK_SPEC
    assert chunk_model.feature_names == ("score", "inverse_rank", "trusted", "trusted_missing")
    path = chunk_model.save(tmp_path / "chunks.json")
    loaded = ConfidenceModel.load(path, CHUNK_SPEC)
    assert np.array_equal(loaded.predict(rows), chunk_model.predict(rows))
    with pytest.raises(ArtifactError, match="features differ"):
        ConfidenceModel.load(path)  # the answer-level spec is the default
    with pytest.raises(ConfidenceDataError, match="unknown features"):
        chunk_model.predict([full_row()])
    # Same names, other group membership: refused.
    regrouped = FeatureSpec(
        signals=("score", "inverse_rank", "trusted"),
        missing_groups={"trusted_missing": ("score",)},
    )
    with pytest.raises(ArtifactError, match="missing groups"):
        ConfidenceModel.load(path, regrouped)


@pytest.mark.parametrize(
    ("signals", "groups", "message"),
    [
        (("a", "a"), {}, "unique"),
        (("a", "b"), {"a": ("b",)}, "unique"),
        (("a", "b"), {"g": ("c",)}, "known signals"),
        (("a", "b"), {"g": ()}, "known signals"),
        (("a", "b"), {"g": ("a",), "h": ("a",)}, "at most one"),
    ],
)
def test_bad_feature_specs(
    signals: tuple[str, ...], groups: dict[str, tuple[str, ...]], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        FeatureSpec(signals=signals, missing_groups=groups)
    assert ANSWER_SPEC.names == FEATURES


def _recalibrated(model: ConfidenceModel, calibrator: Calibrator) -> ConfidenceModel:
    """``model`` with another calibrator (same coefficients)."""
    return ConfidenceModel.create(
        imputation_means=model.imputation_means,
        standardisation_mean=model.standardisation_mean,
        standardisation_scale=model.standardisation_scale,
        coefficients=model.coefficients,
        intercept=model.intercept,
        calibrator=calibrator,
        training=model.training,
    )


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_predict_one_is_predict_in_plain_floats(model: ConfidenceModel, method: str) -> None:
    """The serving path (one request, plain floats) gives the vectorised result up to rounding.

    Plain-float sums and numpy's vectorised dot product add in different orders,
    so the two may differ in the last bits (an ulp on some CPUs), never more.
    """
    rows, labels = make_rows(400, seed=11)
    scores = model.raw_scores(rows)
    calibrator = fit_calibrator(method, scores, labels)  # type: ignore[arg-type]
    variant = _recalibrated(model, calibrator)
    assert variant.method == method
    batch = variant.predict(rows)
    one = np.asarray([variant.predict_one(r) for r in rows])
    np.testing.assert_allclose(one, batch, rtol=0, atol=1e-12)
    assert len(set(np.round(one, 6))) > 5  # the rows really differ (not a constant model)
    with pytest.raises(ConfidenceDataError, match="unknown features"):
        variant.predict_one({**full_row(), "bogus": 1.0})
    with pytest.raises(ConfidenceDataError, match="finite"):
        variant.predict_one({**full_row(), "lookback_p": math.nan})


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_predict_many_is_predict_bit_for_bit(model: ConfidenceModel, method: str) -> None:
    """The serving batch builds its rows in plain Python; the numbers are predict's exactly."""
    rows, labels = make_rows(300, seed=12)
    calibrator = fit_calibrator(method, model.raw_scores(rows), labels)  # type: ignore[arg-type]
    variant = _recalibrated(model, calibrator)
    mixed: list[FeatureValues] = [
        *rows,
        {**full_row(), "m1": True, "m2": 1},  # a bool and an int are numbers too
        {},  # every signal missing
    ]
    assert variant.predict_many(mixed).tolist() == variant.predict(mixed).tolist()
    # again, with each pattern of missing signals' indicators remembered from the first pass
    assert len(variant._serving().indicator_values) >= 2  # none missing, all missing, ...
    assert variant.predict_many(mixed[::-1]).tolist() == variant.predict(mixed[::-1]).tolist()
    assert variant.predict_many([]).shape == (0,)
    with pytest.raises(ConfidenceDataError, match="unknown features"):
        variant.predict_many([full_row(), {**full_row(), "bogus": 1.0}])
    with pytest.raises(ConfidenceDataError, match="finite"):
        variant.predict_many([full_row(), {**full_row(), "lookback_p": math.inf}])


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_predict_rows_is_predict_many_bit_for_bit(model: ConfidenceModel, method: str) -> None:
    """A batch's rows as tuples (numpy builds the matrix): predict_many's numbers exactly,
    for every pattern of missing values, absurd but finite values and a lone row; a value
    that is not a finite float goes predict_many's way (the same result or error)."""
    rows, labels = make_rows(200, seed=13)
    calibrator = fit_calibrator(method, model.raw_scores(rows), labels)  # type: ignore[arg-type]
    variant = _recalibrated(model, calibrator)
    rng = np.random.default_rng(14)
    absurd = [1e300, -1e300, 5e-324, -0.0, 0.0, 1e-12]
    dicts: list[dict[str, float | None]] = []
    for row in rows:
        values: dict[str, float | None] = {name: row.get(name) for name in SIGNALS}
        for name in SIGNALS:
            draw = rng.random()
            if draw < 0.15:
                values[name] = None
            elif draw < 0.2:
                values[name] = float(rng.choice(absurd))
        dicts.append(values)
    dicts += [dict.fromkeys(SIGNALS), {**full_row()}]
    tuples = [tuple(d[name] for name in SIGNALS) for d in dicts]
    expected = variant.predict_many(dicts)
    assert variant.predict_rows(tuples, SIGNALS).tobytes() == expected.tobytes()
    assert variant.predict_rows(tuples[-1:], SIGNALS).tobytes() == expected[-1:].tobytes()
    assert variant.predict_rows([], SIGNALS).shape == (0,)
    # other names, or in another order: each row as a dict
    order = SIGNALS[::-1]
    flipped = [row[::-1] for row in tuples]
    assert variant.predict_rows(flipped, order).tobytes() == expected.tobytes()
    # not finite floats: predict_many's way, its result or its error
    with_ints = [(*tuples[0][:3], True, 1, *tuples[0][5:]), *tuples[1:]]
    as_dicts = [dict(zip(SIGNALS, row, strict=True)) for row in with_ints]
    assert (
        variant.predict_rows(with_ints, SIGNALS).tolist() == variant.predict_many(as_dicts).tolist()
    )
    bad_values: list[object] = [math.nan, math.inf, -math.inf, "0.5"]  # numpy parses "0.5"
    for bad in bad_values:
        broken: list[tuple[object, ...]] = [tuples[0], (*tuples[1][:5], bad, *tuples[1][6:])]
        with pytest.raises(ConfidenceDataError, match="finite"):
            variant.predict_rows(broken, SIGNALS)  # type: ignore[arg-type]
