"""The versioned calibration artifact and the registry that picks a calibration per event."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sidecar.conformal.artifact import CalibrationArtifact, Provenance, build_artifact
from sidecar.conformal.calibrator import alpha_sweep
from sidecar.conformal.mondrian import CalibrationKey, FallbackReason, MondrianCalibrator
from sidecar.conformal.registry import CalibrationRegistry, UnknownCollectionPolicy
from sidecar.conformal.storage import load_artifact, save_artifact
from sidecar.exceptions import ArtifactError, ConfigError, InputError
from tests.conformal.conftest import SyntheticFactory

WIKI = CalibrationKey("acme", "wiki", "minilm")
TINY = CalibrationKey("acme", "wiki", "bm25")
DOCS = CalibrationKey("beta", "docs", "minilm")
HASH = hashlib.sha256(b"calibration data").hexdigest()


@pytest.fixture
def artifact(make_retrievals: SyntheticFactory) -> CalibrationArtifact:
    wiki = make_retrievals(seed=20, n_questions=100)
    tiny = make_retrievals(seed=21, n_questions=4)
    docs = make_retrievals(seed=22, n_questions=60, correct_mean=0.9, wrong_mean=0.2)
    scores = wiki.scores + tiny.scores + docs.scores
    labels = wiki.labels + tiny.labels + docs.labels
    keys = [WIKI] * 100 + [TINY] * 4 + [DOCS] * 60
    mondrian = (
        MondrianCalibrator(0.1).fit(scores, keys).calibrate(scores, labels, keys).calibration_
    )
    return build_artifact(
        mondrian,
        global_key=WIKI,
        embedding_model_id="sentence-transformers/all-MiniLM-L6-v2",
        data_hash=HASH,
        beta=0.0,
        s_thres=None,
        top_k=5,
        chunk_words=64,
        sweep=alpha_sweep(scores, labels, [0.005, 0.1, 0.5]),
        provenance=Provenance(
            questions_file="q.jsonl.gz",
            questions_sha256=HASH,
            corpus_files=["q.jsonl.gz"],
            corpus_sha256=HASH,
            split="cal",
            split_seed=0,
            cal_fraction=0.5,
            n_questions_total=328,
        ),
        created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )


def test_round_trip(artifact: CalibrationArtifact, tmp_path: Path) -> None:
    path = save_artifact(artifact, tmp_path / "sub" / "cal.json")
    loaded = load_artifact(path)
    assert loaded == artifact
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1
    assert raw["created_at"] == "2026-01-02T03:04:05Z"
    assert raw["calibration_id"] == f"minilm@wiki:{HASH[:12]}"
    assert [e["alpha"] for e in raw["alpha_sweep"]] == [0.005, 0.1, 0.5]
    assert raw["alpha_sweep"][0]["q_hat"] is None  # n = 164: k = ceil(165 * 0.995) = 165 > n
    assert raw["alpha_sweep"][1]["q_hat"] == raw["q_hat"]
    assert loaded.global_calibration() == artifact.global_calibration()
    reasons = {e.key: e.fallback_reason for e in loaded.mondrian}
    assert reasons == {WIKI: None, TINY: "too-few-samples", DOCS: None}
    assert list(tmp_path.joinpath("sub").iterdir()) == [path]  # no temporary file left
    assert path.stat().st_mode & 0o777 == 0o644  # readable by the serving user


def _tamper(tmp_path: Path, artifact: CalibrationArtifact, **changes: Any) -> Path:
    raw = json.loads(artifact.dumps())
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is KeyError:
            del node[leaf]
        else:
            node[leaf] = value
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"q_hat": 0.9}, "q_hat"),
        ({"k": 3}, "k must be"),
        ({"alpha": 1.5}, "alpha"),
        ({"n1": 2.0, "n2": 1.0}, "n2 must be greater than n1"),
        ({"created_at": "2026-01-02T03:04:05"}, "timezone"),
        ({"data_hash": "abc"}, "data_hash"),
        ({"surprise": 1}, "surprise"),
        ({"top_k": KeyError}, "top_k"),
        ({"s_thres": 0.2}, "s_thres must be null exactly when beta = 0"),
        ({"mondrian__0__fallback_reason": None}, "certifiable calibration"),  # TINY sorts first
        ({"mondrian__1__calibration__alpha": 0.2}, "alpha"),
        ({"alpha_sweep__0__q_hat": 0.5}, "null exactly when k > n"),
    ],
)
def test_invalid_artifacts_raise_artifact_error(
    artifact: CalibrationArtifact, tmp_path: Path, changes: dict[str, Any], needle: str
) -> None:
    path = _tamper(tmp_path, artifact, **changes)
    with pytest.raises(ArtifactError, match=str(path.name)) as info:
        load_artifact(path)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"q_hat": 0.95, "threshold": 0.05},  # consistent with each other: only the hash sees it
        {"mondrian__1__calibration__q_hat": 0.95, "mondrian__1__calibration__threshold": 0.05},
        {"n1": 0.0},
        {"score_kind": "distance"},
        {"retriever_id": "bm25"},
        {"created_at": "2027-01-02T03:04:05Z"},
    ],
)
def test_a_calibration_edited_after_it_was_written_is_refused(
    artifact: CalibrationArtifact, tmp_path: Path, changes: dict[str, Any]
) -> None:
    """Audit: q_hat edited to 0.95 loaded under the old calibration_id; every chunk trusted."""
    path = _tamper(tmp_path, artifact, **changes)
    with pytest.raises(ArtifactError, match="edited after calibration"):
        load_artifact(path)


def test_the_hash_ignores_layout_and_a_file_without_one_loads_with_a_warning(
    artifact: CalibrationArtifact, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert artifact.params_sha256 is not None
    raw = json.loads(artifact.dumps())
    reordered = tmp_path / "reordered.json"
    reordered.write_text(json.dumps(dict(reversed(list(raw.items()))), indent=4))
    with caplog.at_level("WARNING", logger="sidecar.conformal"):
        assert load_artifact(reordered) == artifact
    assert not caplog.records
    older = _tamper(tmp_path, artifact, params_sha256=KeyError)
    with caplog.at_level("WARNING", logger="sidecar.conformal"):
        loaded = load_artifact(older)
    assert loaded.params_sha256 is None and loaded.global_calibration() == (
        artifact.global_calibration()
    )
    assert "no params_sha256" in caplog.text


def test_the_shipped_calibration_carries_its_hash() -> None:
    shipped = load_artifact(Path(__file__).parents[2] / "models/conformal/nq-open-minilm.json")
    assert shipped.params_sha256 is not None


def test_unreadable_files(tmp_path: Path, artifact: CalibrationArtifact) -> None:
    with pytest.raises(ArtifactError, match="does not exist"):
        load_artifact(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ArtifactError, match="is not JSON"):
        load_artifact(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ArtifactError, match="must be a JSON object"):
        load_artifact(bad)
    with pytest.raises(ArtifactError, match="schema_version 2; this build reads schema_version 1"):
        load_artifact(_tamper(tmp_path, artifact, schema_version=2))
    with pytest.raises(ArtifactError, match="kind 'lookback'"):
        load_artifact(_tamper(tmp_path, artifact, kind="lookback"))


def test_registry_resolution_order(artifact: CalibrationArtifact) -> None:
    registry = CalibrationRegistry(artifact)
    own = registry.resolve(*WIKI)
    assert (own.used_key, own.fallback, own.fallback_reason) == ("acme/wiki/minilm", False, None)
    entry = next(e for e in artifact.mondrian if e.key == WIKI)
    assert entry.calibration is not None
    assert own.calibration == entry.calibration.to_calibration()
    assert own.calibration != artifact.global_calibration()
    assert own.calibration_id == artifact.calibration_id

    tiny = registry.resolve(*TINY)
    assert (tiny.used_key, tiny.fallback_reason) == ("global", FallbackReason.TOO_FEW_SAMPLES)
    assert tiny.calibration == artifact.global_calibration()
    assert "k=" in tiny.detail

    stranger = registry.resolve("other-tenant", "wiki", "minilm")
    assert stranger.fallback_reason is FallbackReason.UNKNOWN_KEY
    assert stranger.calibration == artifact.global_calibration()

    unknown = registry.resolve("acme", "news", "minilm")
    assert unknown.fallback_reason is FallbackReason.UNKNOWN_COLLECTION
    assert "news" in unknown.detail
    assert registry.resolve("acme", "news", "minilm") is unknown  # cached


def test_registry_can_reject_unknown_collections(artifact: CalibrationArtifact) -> None:
    registry = CalibrationRegistry(artifact, unknown_collection="reject")
    assert registry.unknown_collection is UnknownCollectionPolicy.REJECT
    assert registry.resolve("zed", "docs", "minilm").fallback_reason is FallbackReason.UNKNOWN_KEY
    with pytest.raises(InputError) as info:
        registry.resolve("acme", "news", "minilm")
    assert info.value.reason == "unknown-collection"
    assert info.value.dead_letter
    assert "docs, wiki" in info.value.detail


def test_registry_policy_is_validated(artifact: CalibrationArtifact) -> None:
    with pytest.raises(ConfigError, match="fallback-global, reject"):
        CalibrationRegistry(artifact, unknown_collection="drop")


def test_vacuous_global_calibration_is_stored_as_null(make_retrievals: SyntheticFactory) -> None:
    data = make_retrievals(seed=5, n_questions=3)
    keys = [WIKI] * 3
    m = MondrianCalibrator(0.1).fit(data.scores, keys).calibrate(data.scores, data.labels, keys)
    art = build_artifact(
        m.calibration_, global_key=WIKI, embedding_model_id="m", data_hash=HASH,
        beta=0.0, s_thres=None, top_k=5,
    )  # fmt: skip
    assert (art.q_hat, art.threshold, art.k, art.n) == (None, None, 4, 3)
    assert math.isinf(art.global_calibration().q_hat)
    assert CalibrationArtifact.loads(art.dumps()) == art
