"""``guardrail calibrate scores``: a conformal calibration of *your* retriever's own scores.

``calibrate retrieval`` builds its labelled retrievals itself (MiniLM + Qdrant over an
NQ-open-format corpus). A team with another retriever has its own: for each labelled
question, the scores of the K hits it retrieved (best first, as the events carry them)
and which hits were correct. One JSON object per line::

    {"scores": [0.83, 0.71, 0.40], "labels": [true, false, false],
     "tenant": "acme", "collection": "docs", "retriever": "bm25-v2"}

``tenant``, ``collection`` and ``retriever`` are optional (``--tenant``,
``--collection``, ``--retriever`` fill them in); each (tenant, collection, retriever)
gets its own Mondrian calibration beside the pooled global one. Every line is checked
(numbers, not text; labels true/false or 1/0; as many labels as scores; at most 1,024
hits) and a bad one is named by its line number. The scores must be similarities:
correct hits scoring clearly lower than wrong ones are refused as distances.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sidecar.exceptions import ConfigError, InputError

__all__ = ["ScoresFile", "calibrate_scores", "read_scores"]

MAX_HITS: Final = 1024  # as a retrieval event's hits
MAX_LINE_BYTES: Final = 1 << 20
NAME_FIELDS: Final = ("tenant", "collection", "retriever")


@dataclass(frozen=True, slots=True)
class ScoresFile:
    """The labelled retrievals of a scores file, and the sha256 of its bytes."""

    scores: list[list[float]]
    labels: list[list[bool]]
    keys: list[tuple[str, str, str]]
    sha256: str


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _label(value: object) -> bool:
    return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))


def _row(
    line_no: int, raw: object, defaults: dict[str, str]
) -> tuple[list[float], list[bool], tuple[str, str, str]]:
    where = f"line {line_no}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a JSON object is needed, got {type(raw).__name__}")
    unknown = set(raw) - {"scores", "labels", *NAME_FIELDS, "id"}
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {sorted(unknown)}; the fields are scores, labels, "
            "tenant, collection, retriever, id"
        )
    scores, labels = raw.get("scores"), raw.get("labels")
    if not isinstance(scores, list) or not all(_number(s) for s in scores):
        shown = repr(scores)[:200]
        raise ConfigError(f"{where}: scores must be a list of finite numbers, got {shown}")
    if not isinstance(labels, list) or not all(_label(y) for y in labels):
        raise ConfigError(
            f"{where}: labels must be a list of true/false (or 1/0), got {labels!r}"[:300]
        )
    if len(scores) != len(labels):
        raise ConfigError(f"{where}: {len(scores)} scores but {len(labels)} labels")
    if len(scores) > MAX_HITS:
        raise ConfigError(f"{where}: {len(scores)} hits, more than {MAX_HITS}")
    names = []
    for field in NAME_FIELDS:
        value = raw.get(field, defaults[field])
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: {field} must be a non-empty string, got {value!r}")
        names.append(value)
    return [float(s) for s in scores], [bool(y) for y in labels], (names[0], names[1], names[2])


def read_scores(path: Path, defaults: dict[str, str]) -> ScoresFile:
    """Every line of ``path`` checked; ``ConfigError`` naming the first bad one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--data {path}: {exc.strerror or exc}") from None
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ConfigError(f"--data {path} is UTF-16: save it as UTF-8 (JSON lines)")
    if data.lstrip()[:1] == b"[":
        raise ConfigError(
            f"--data {path} is a JSON array: one JSON object a line is needed (JSON lines), "
            'e.g. {"scores": [0.83, 0.71], "labels": [true, false]}'
        )
    out = ScoresFile([], [], [], hashlib.sha256(data).hexdigest())
    for line_no, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise ConfigError(f"--data {path} line {line_no}: longer than {MAX_LINE_BYTES} bytes")
        try:
            raw = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--data {path} line {line_no}: not JSON ({exc})") from None
        try:
            scores, labels, key = _row(line_no, raw, defaults)
        except ConfigError as exc:
            raise ConfigError(f"--data {path} {exc}") from None
        out.scores.append(scores)
        out.labels.append(labels)
        out.keys.append(key)
    if not out.scores:
        raise ConfigError(f"--data {path} holds no labelled retrieval (one JSON object a line)")
    if not any(out.scores):
        raise ConfigError(f"--data {path}: no line has any hit (every scores list is empty)")
    return out


def _distance_keys(data: ScoresFile) -> str:
    """``"key a/b/c, ...: "`` for the keys whose correct hits score clearly lower."""
    from sidecar.conformal.calibrator import DIRECTION_MAX_AUROC  # noqa: PLC0415
    from sidecar.stats.metrics import auroc  # noqa: PLC0415

    by_key: dict[tuple[str, str, str], tuple[list[float], list[bool]]] = {}
    for scores, labels, key in zip(data.scores, data.labels, data.keys, strict=True):
        pooled = by_key.setdefault(key, ([], []))
        pooled[0].extend(scores)
        pooled[1].extend(labels)
    low = [
        "/".join(key)
        for key, (scores, labels) in sorted(by_key.items())
        if 0 < sum(labels) < len(labels) and auroc(scores, labels) < DIRECTION_MAX_AUROC
    ]
    return f"key {', '.join(low)}: " if low else ""


def calibrate_scores(
    path: Path,
    out: Path,
    *,
    alpha: str,
    defaults: dict[str, str],
    embedding_model_id: str,
    allow_vacuous: bool,
) -> dict[str, Any]:
    """Write the calibration of ``path``'s labelled retrievals to ``out``; the summary."""
    from sidecar.conformal.artifact import build_artifact  # noqa: PLC0415
    from sidecar.conformal.calibrator import alpha_sweep, default_alpha_grid  # noqa: PLC0415
    from sidecar.conformal.mondrian import CalibrationKey, MondrianCalibrator  # noqa: PLC0415
    from sidecar.conformal.quantile import as_alpha  # noqa: PLC0415
    from sidecar.conformal.storage import save_artifact  # noqa: PLC0415
    from sidecar.lab.conformal.recipe import spread_of  # noqa: PLC0415

    level = as_alpha(alpha)
    data = read_scores(path, defaults)
    keys = [CalibrationKey(*k) for k in data.keys]
    global_key = CalibrationKey(*Counter(data.keys).most_common(1)[0][0])
    try:
        mondrian = (
            MondrianCalibrator(level)
            .fit(data.scores, keys)
            .calibrate(data.scores, data.labels, keys)
            .calibration_
        )
    except InputError as exc:
        if exc.reason == "score-direction":  # name the keys: a mixed file holds good ones too
            raise ConfigError(f"--data {path}: {_distance_keys(data)}{exc.detail}") from None
        raise ConfigError(f"--data {path}: {exc.detail}") from None
    g = mondrian.global_calibration
    if not g.certifiable and not allow_vacuous:
        raise ConfigError(
            f"no conformal threshold at alpha={alpha}: {g.explain()}. A sidecar serving this "
            "calibration trusts no chunk. Label more retrievals or use a larger alpha, or pass "
            f"--allow-vacuous to write it anyway; nothing was written to {out}"
        )
    data_hash = hashlib.sha256(f"{data.sha256}\nalpha={level}".encode()).hexdigest()
    artifact = build_artifact(
        mondrian,
        global_key=global_key,
        embedding_model_id=embedding_model_id,
        data_hash=data_hash,
        beta=0.0,
        s_thres=None,
        top_k=max(len(row) for row in data.scores),
        sweep=alpha_sweep(data.scores, data.labels, default_alpha_grid()),
        score_kind="similarity",  # the team's own scores, higher is better (checked above)
    )
    written = save_artifact(artifact, out)
    return {
        "artifact": str(written),
        "calibration_id": artifact.calibration_id,
        "alpha": float(level),
        "retrievals": len(data.scores),
        "n": g.n,
        "k": g.k,
        "q_hat": artifact.q_hat,
        "certifiable": g.certifiable,
        "explain": g.explain(),
        "n1": g.n1,
        "n2": g.n2,
        **spread_of(g),
        "keys": {entry.key.label: entry.fallback_reason or "own" for entry in artifact.mondrian},
        "mixed_scales": _mixed_scales(data),
    }


MIXED_SCALE_SHARE: Final = 0.1  # a key whose scores span under this share of all of them


def _mixed_scales(data: ScoresFile) -> dict[str, list[float]]:
    """Keys whose scores span under a tenth of the pooled range, with their min and max.

    The global calibration, which serves every key without its own (unknown keys, keys
    with too few labels), normalises the pooled scores with one min and max: a key on
    another scale is then certified against a threshold that means nothing for it (audit:
    a 5-line key beside 0..1 and 0..1000 retrievers got 0.744 coverage for a promised 0.9,
    and an unknown 0..1000 key had every chunk trusted). Empty when the scales agree.
    """
    spans: dict[tuple[str, str, str], list[float]] = {}
    for row, key in zip(data.scores, data.keys, strict=True):
        low, high = spans.setdefault(key, [math.inf, -math.inf])
        spans[key] = [min(low, *row), max(high, *row)]
    if len(spans) < 2:
        return {}
    low = min(lo for lo, _ in spans.values())
    high = max(hi for _, hi in spans.values())
    pooled = high - low
    if pooled <= 0:
        return {}
    from sidecar.conformal.mondrian import key_label  # noqa: PLC0415

    return {
        key_label(*key): [round(lo, 6), round(hi, 6)]
        for key, (lo, hi) in sorted(spans.items())
        if hi - lo < MIXED_SCALE_SHARE * pooled
    }
