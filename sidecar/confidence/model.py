"""The calibrated-confidence forecaster the sidecar serves (docs/methods.md §Calibrated confidence).

It estimates P(answer correct | the request's signals) from retrieval scores, the
conformal certification (m1, m2), the lookback classifier, the claim verifier,
the generator's token log-probabilities and the answer length::

    x  = features(values)                          (None -> training mean, indicator = 1)
    z  = (x - mean) / scale                        (standardisation of the fit part)
    s  = w . z + b                                 (L2-penalised logistic regression)
    p  = calibrator(s)                             (Platt or isotonic, chosen by CV NLL)

The signals come in optional groups (a request may have no lookback score, no
claims, no log-probabilities or no certification); each group has a
``<group>_missing`` indicator that is 1 when any of its values is ``None``, and
every ``None`` is replaced by its training mean. A signal outside every group
(retrieval scores, answer length) is expected on every request; if it is
``None`` anyway it is imputed the same way but has no indicator.

Which signals and groups a model reads is its
:class:`~sidecar.confidence.spec.FeatureSpec`, stored in the model file.

The model file is JSON, format ``confidence-model/1``, with a sha256 over the
parameters (checked on load) and the training metadata. numpy + pydantic only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from sidecar.confidence.calibration import (
    Calibrator,
    CalibratorDict,
    PlattCalibrator,
    calibrator_from_dict,
)
from sidecar.confidence.errors import ConfidenceDataError
from sidecar.confidence.logistic import FloatArray
from sidecar.confidence.spec import ANSWER_SPEC, FeatureSpec, FeatureValues, signal_value
from sidecar.contracts.codec import summarise_validation
from sidecar.exceptions import ArtifactError
from sidecar.hashing import not_a_regular_file

__all__ = [
    "MODEL_FORMAT",
    "PARAMETER_FIELDS",
    "ConfidenceModel",
    "ConfidenceTraining",
    "params_sha256",
]

MODEL_FORMAT: Final = "confidence-model/1"

PARAMETER_FIELDS: Final = (
    "feature_names",
    "missing_groups",
    "imputation_means",
    "standardisation_mean",
    "standardisation_scale",
    "coefficients",
    "intercept",
    "calibrator",
)
"""The fields :func:`params_sha256` covers: everything ``predict`` reads."""


def _canonical(value: object) -> object:
    """Numbers as floats, sequences as lists, mappings as dicts (so 0 and 0.0 hash alike)."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    raise ConfidenceDataError(f"cannot hash a {type(value).__name__} parameter")


def params_sha256(params: Mapping[str, object]) -> str:
    """sha256 of the :data:`PARAMETER_FIELDS` of ``params`` as canonical JSON.

    Canonical: sorted keys, no spaces, numbers as floats written by ``repr``
    (exact round trip), NaN and infinity refused.
    """
    payload = {name: _canonical(params[name]) for name in PARAMETER_FIELDS}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class _Terms:
    """What :meth:`ConfidenceModel.predict_one` (plain floats) and ``predict_many`` read."""

    signals: tuple[tuple[str, float], ...]  # name, imputed value
    indicators: tuple[frozenset[str], ...]  # the signals whose absence sets each indicator
    weights: tuple[tuple[float, float, float], ...]  # mu, sd, w per column (signals, indicators)
    names: frozenset[str]
    # the standardisation and weights as arrays, for a batch (predict_many); the same
    # numbers as ``signals`` and ``indicators``, so equality leaves them out
    mean: FloatArray = field(compare=False)
    scale: FloatArray = field(compare=False)
    coefficients: FloatArray = field(compare=False)
    intercept: float
    platt: tuple[float, float] | None  # (a, b) of a Platt calibrator, else None
    calibrator: Calibrator
    # the batch path's (predict_rows): the signals' names, each one's imputed value, and
    # which signals each indicator covers (groups[signal, indicator])
    signal_names: tuple[str, ...] = field(compare=False)
    imputed: FloatArray = field(compare=False)
    groups: npt.NDArray[np.bool_] = field(compare=False)
    # the indicator values of each pattern of missing signals seen (at most 2 ** signals
    # patterns; a serving process sees a handful): one lookup a row, not a test per group
    indicator_values: dict[tuple[str, ...], tuple[float, ...]] = field(
        default_factory=dict, compare=False
    )


_FLOAT_OR_NONE: Final = frozenset((float, type(None)))


def _float_matrix(rows: Sequence[Sequence[float | None]], width: int) -> FloatArray | None:
    """``rows`` as a float64 ``(n, width)`` matrix, NaN for each ``None``; ``None`` unless
    every value is ``None`` or a finite float (not an int or a bool, which validation
    converts, a string, which it refuses and numpy would parse, a NaN, an infinity)."""
    if not _FLOAT_OR_NONE.issuperset(map(type, itertools.chain.from_iterable(rows))):
        return None
    try:
        given = np.array(rows, dtype=np.float64)  # None -> NaN
    except ValueError:  # rows of different lengths
        return None
    if given.shape != (len(rows), width) or np.isinf(given).any():
        return None
    if int(np.isnan(given).sum()) != sum(row.count(None) for row in rows):
        return None  # a NaN value besides the Nones
    return given


def row_scores(z: FloatArray, coefficients: FloatArray, intercept: float) -> FloatArray:
    """``z @ coefficients + intercept``, each row summed alone, column by column.

    numpy's matrix-vector product picks its kernel by the matrix's height: a row's score
    moved in its last bits (up to 2.2e-16) with the rows scored beside it, so a
    request's confidence hung on how its consumed batch was cut. Here each row is the
    intercept plus its terms in column order, whatever else the matrix holds, and the
    same operations as :meth:`ConfidenceModel.predict_one`'s plain floats.
    """
    out = np.full(z.shape[0], intercept, dtype=np.float64)
    for j in range(z.shape[1]):
        out += z[:, j] * coefficients[j]
    return out


class ConfidenceTraining(BaseModel):
    """How the model was fit, and its cross-validated metrics on the calibration part."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(ge=2)
    positives: int = Field(ge=1)
    seed: int
    fit_fraction: float = Field(gt=0.0, lt=1.0)
    l2: float = Field(gt=0.0)
    folds: int = Field(ge=2)
    n_fit: int = Field(ge=1)
    n_calibration: int = Field(ge=1)
    calibration_choice: dict[str, str | float | int]
    data_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    metrics: dict[str, float]
    estimator: str = "L2 logistic regression (Newton/IRLS, numpy) + Platt|isotonic calibrator"


class ConfidenceModel(BaseModel):
    """A fitted forecaster: JSON file format ``confidence-model/1``.

    ``predict`` gives calibrated probabilities (that an answer is correct, for the
    answer-level spec); build one with
    :func:`sidecar.lab.confidence.training.fit_confidence_model` and reload it with
    :meth:`load`, which checks the format, the features against the caller's spec
    and the parameter sha256.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["confidence-model/1"] = MODEL_FORMAT
    version: str = Field(pattern=r"^confidence@[0-9a-f]{12}$")
    feature_names: tuple[str, ...]
    missing_groups: dict[str, tuple[str, ...]]
    imputation_means: tuple[float, ...]
    standardisation_mean: tuple[float, ...]
    standardisation_scale: tuple[float, ...]
    coefficients: tuple[float, ...]
    intercept: float
    calibrator: CalibratorDict
    training: ConfidenceTraining
    params_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: datetime

    _spec: FeatureSpec = PrivateAttr()
    _calibrator: Calibrator = PrivateAttr()
    _terms: _Terms = PrivateAttr()

    @model_validator(mode="after")
    def _consistent(self) -> ConfidenceModel:
        d = len(self.feature_names)
        signals = self.feature_names[: d - len(self.missing_groups)]
        spec = FeatureSpec(signals=signals, missing_groups=self.missing_groups)
        if spec.names != self.feature_names:
            raise ValueError(
                f"feature_names must be the signals then the indicators {list(self.missing_groups)}"
                f", got {list(self.feature_names)}"
            )
        for name in (
            "imputation_means",
            "standardisation_mean",
            "standardisation_scale",
            "coefficients",
        ):
            if len(getattr(self, name)) != d:
                raise ValueError(f"{name} has {len(getattr(self, name))} values, expected {d}")
        if not all(math.isfinite(v) and v > 0.0 for v in self.standardisation_scale):
            raise ValueError("standardisation_scale values must be finite and > 0")
        digest = params_sha256({name: getattr(self, name) for name in PARAMETER_FIELDS})
        if digest != self.params_sha256:
            raise ValueError(
                f"parameter sha256 is {digest[:12]}..., the model says "
                f"{self.params_sha256[:12]}...: the parameters were changed after training"
            )
        if self.version != f"confidence@{digest[:12]}":
            raise ValueError(f"version must be confidence@{digest[:12]}, got {self.version!r}")
        self._spec = spec
        # One row: plain floats beat numpy at 14 features; a batch: one numpy pass.
        n_signals = len(self.feature_names) - len(self.missing_groups)
        rows = list(
            zip(
                self.feature_names,
                self.imputation_means,
                self.standardisation_mean,
                self.standardisation_scale,
                self.coefficients,
                strict=True,
            )
        )
        calibrator = self._calibrator
        self._terms = _Terms(
            signals=tuple((name, imputed) for name, imputed, _, _, _ in rows[:n_signals]),
            indicators=tuple(frozenset(members) for members in self.missing_groups.values()),
            weights=tuple((mu, sd, w) for _, _, mu, sd, w in rows),
            names=frozenset(self.feature_names[:n_signals]),
            mean=np.asarray(self.standardisation_mean, dtype=np.float64),
            scale=np.asarray(self.standardisation_scale, dtype=np.float64),
            coefficients=np.asarray(self.coefficients, dtype=np.float64),
            intercept=self.intercept,
            platt=(calibrator.a, calibrator.b) if isinstance(calibrator, PlattCalibrator) else None,
            calibrator=calibrator,
            signal_names=signals,
            imputed=np.asarray(self.imputation_means[:n_signals], dtype=np.float64),
            groups=np.array(
                [[name in members for members in self.missing_groups.values()] for name in signals],
                dtype=np.bool_,
            ).reshape(len(signals), len(self.missing_groups)),
        )
        return self

    def model_post_init(self, context: Any, /) -> None:
        """Rebuild the calibrator once (isotonic thresholds are validated here)."""
        try:
            self._calibrator = calibrator_from_dict(self.calibrator)
        except ArtifactError as exc:
            raise ValueError(str(exc)) from exc

    @classmethod
    def create(
        cls,
        *,
        imputation_means: Sequence[float],
        standardisation_mean: Sequence[float],
        standardisation_scale: Sequence[float],
        coefficients: Sequence[float],
        intercept: float,
        calibrator: Calibrator,
        training: ConfidenceTraining,
        spec: FeatureSpec = ANSWER_SPEC,
        created_at: datetime | None = None,
    ) -> ConfidenceModel:
        """A model over ``spec`` with its sha256 and version filled in."""
        params: dict[str, Any] = {
            "feature_names": spec.names,
            "missing_groups": dict(spec.missing_groups),
            "imputation_means": tuple(float(v) for v in imputation_means),
            "standardisation_mean": tuple(float(v) for v in standardisation_mean),
            "standardisation_scale": tuple(float(v) for v in standardisation_scale),
            "coefficients": tuple(float(v) for v in coefficients),
            "intercept": float(intercept),
            "calibrator": calibrator.to_dict(),
        }
        digest = params_sha256(params)
        return cls(
            **params,
            version=f"confidence@{digest[:12]}",
            training=training,
            params_sha256=digest,
            created_at=created_at or datetime.now(UTC),
        )

    @property
    def spec(self) -> FeatureSpec:
        """The signals and missing groups this model reads."""
        return self._spec

    @property
    def method(self) -> str:
        """``"platt"`` or ``"isotonic"``: the calibrator in use."""
        return self._calibrator.method

    def features(self, values_list: Sequence[FeatureValues]) -> FloatArray:
        """Model input ``(n, len(feature_names))``: ``spec.matrix``, each NaN -> training mean."""
        x = self._spec.matrix(values_list)
        return np.where(np.isnan(x), np.asarray(self.imputation_means, dtype=np.float64), x)

    def raw_scores(self, values_list: Sequence[FeatureValues]) -> FloatArray:
        """The uncalibrated forecast score ``s = w . (x - mean)/scale + b`` per row."""
        mean = np.asarray(self.standardisation_mean, dtype=np.float64)
        scale = np.asarray(self.standardisation_scale, dtype=np.float64)
        z = (self.features(values_list) - mean) / scale
        return row_scores(z, np.asarray(self.coefficients, dtype=np.float64), self.intercept)

    def predict(self, values_list: Sequence[FeatureValues]) -> FloatArray:
        """Calibrated probability per row: ``calibrator(raw_scores)``."""
        return self._calibrator.predict(self.raw_scores(values_list))

    def _serving(self) -> _Terms:
        """``_terms``, read from pydantic's private dict (its ``__getattr__`` costs ~2 us)."""
        terms: _Terms = self.__pydantic_private__["_terms"]  # type: ignore[index]
        return terms

    def _row(self, terms: _Terms, values: FeatureValues) -> list[float]:
        """One row of the model's matrix: each signal (``None`` imputed), then the indicators."""
        if not terms.names.issuperset(values):
            self._spec.vector(values)  # raises the ConfidenceDataError naming the unknown keys
        row: list[float] = []
        missing: list[str] = []
        for name, imputed in terms.signals:
            value = values.get(name)
            if value is None:
                missing.append(name)
                row.append(imputed)
            elif type(value) is float and math.isfinite(value):
                row.append(value)
            else:
                row.append(signal_value(name, value))
        pattern = tuple(missing)
        flags = terms.indicator_values.get(pattern)
        if flags is None:
            flags = tuple(
                0.0 if members.isdisjoint(missing) else 1.0 for members in terms.indicators
            )
            terms.indicator_values[pattern] = flags
        row.extend(flags)
        return row

    def predict_many(self, values_list: Sequence[FeatureValues]) -> FloatArray:
        """:meth:`predict`, bit for bit, with the rows built in plain Python (a serving batch).

        The same matrix (each ``None`` imputed, the indicators set) and the same
        numpy arithmetic as :meth:`predict`, without ``spec.vector``'s per-row arrays.
        """
        terms = self._serving()
        rows = [self._row(terms, values) for values in values_list]
        if not rows:
            return np.empty(0, dtype=np.float64)
        x = np.array(rows, dtype=np.float64)
        z = (x - terms.mean) / terms.scale
        return terms.calibrator.predict(row_scores(z, terms.coefficients, terms.intercept))

    def predict_rows(
        self, rows: Sequence[Sequence[float | None]], names: Sequence[str]
    ) -> FloatArray:
        """:meth:`predict_many` of rows given as the values of ``names`` (``None``: missing).

        When ``names`` are the spec's signals, in order, numpy builds the matrix in one
        pass (``None`` read as NaN, then imputed, the indicators set column by column):
        the matrix of :meth:`predict_many` and its arithmetic, bit for bit. Otherwise, or
        when a value is not a finite number, each row goes :meth:`predict_many`'s way
        (which raises its :class:`ConfidenceDataError` for a bad value).
        """
        if not rows:
            return np.empty(0, dtype=np.float64)
        terms = self._serving()
        width = len(terms.signals)
        given = _float_matrix(rows, width) if tuple(names) == terms.signal_names else None
        if given is None:
            return self.predict_many([dict(zip(names, row, strict=True)) for row in rows])
        return self.predict_matrix(given)

    def predict_matrix(self, given: FloatArray) -> FloatArray:
        """:meth:`predict_rows`' arithmetic on a float64 ``(n, signals)`` matrix already
        built: the spec's signals in order, NaN where one is missing, every other value
        finite (the caller's to check, as :meth:`predict_rows` checks its rows)."""
        terms = self._serving()
        missing = np.isnan(given)
        # an indicator is 1.0 when any signal of its group is missing: a boolean product
        x = np.concatenate((np.where(missing, terms.imputed, given), missing @ terms.groups), 1)
        z = (x - terms.mean) / terms.scale
        return terms.calibrator.predict(row_scores(z, terms.coefficients, terms.intercept))

    def predict_one(self, values: FeatureValues) -> float:
        """Calibrated probability of one row: :meth:`predict` in plain floats.

        :meth:`predict_rows` of the row, bit for bit: :func:`row_scores`' operations in its
        order, and a Platt calibrator's sigmoid as :func:`~sidecar.confidence.logistic.sigmoid`
        computes it.
        """
        terms = self._serving()
        score = terms.intercept
        for x, (mu, sd, w) in zip(self._row(terms, values), terms.weights, strict=True):
            score += (x - mu) / sd * w  # row_scores' operations, in its order
        if terms.platt is not None:
            a, b = terms.platt
            z = a * score + b
            # logistic.sigmoid's formula and numpy's exp: math.exp differs from numpy's
            # (vectorised where the CPU has AVX-512) in the last bit of ~5 % of values
            e = float(np.exp(-abs(z)))
            return 1.0 / (1.0 + e) if z >= 0 else e / (1.0 + e)
        return float(terms.calibrator.predict(np.asarray([score]))[0])

    def save(self, path: str | Path) -> Path:
        """Write the model as JSON (via a temporary file, then an atomic rename)."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(target)
        return target

    @classmethod
    def load(cls, path: str | Path, spec: FeatureSpec = ANSWER_SPEC) -> ConfidenceModel:
        """Read a model file that must read ``spec``'s features.

        :class:`ArtifactError` when the file is unreadable, has another format,
        other features or missing groups than ``spec``, or a parameter sha256 that
        does not match its parameters.
        """
        source = Path(path)
        problem = not_a_regular_file(source)
        if problem is not None:
            raise ArtifactError(f"cannot read confidence model {source}: it {problem}")
        try:
            raw = json.loads(source.read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"cannot read confidence model {source}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ArtifactError(f"{source} is not a confidence model (not a JSON object)")
        if raw.get("format") != MODEL_FORMAT:
            raise ArtifactError(
                f"{source} has format {raw.get('format')!r}, expected {MODEL_FORMAT!r}"
            )
        problem = spec.mismatch(raw.get("feature_names"), raw.get("missing_groups"))
        if problem is not None:
            raise ArtifactError(f"{source}: {problem}")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ArtifactError(
                f"{source} is not a valid confidence model: {summarise_validation(exc, 5)}"
            ) from None
