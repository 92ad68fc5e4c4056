"""Training: split by question, lifecycle guards, ONNX export and parity, metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.exceptions import ArtifactError, ConfigError, LifecycleError
from sidecar.lab.lookback.dataset import ShardWriter, load_dataset
from sidecar.lab.lookback.training import (
    PARITY_TOLERANCE,
    LookbackClassifier,
    onnx_probabilities,
    split_by_question,
)
from sidecar.lookback.artifact import load_metadata
from tests.lookback.conftest import HEADS, LAYERS, K, make_meta, synthetic_rows


@given(st.lists(st.integers(0, 10_000), min_size=2, max_size=200), st.integers(0, 9))
def test_split_by_question_keeps_each_question_on_one_side(qids: list[int], seed: int) -> None:
    rows = np.array(qids + qids[: len(qids) // 2])  # some questions have two rows
    train = split_by_question(rows, 0.6, seed)
    sides: dict[int, set[bool]] = {}
    for q, t in zip(rows, train, strict=True):
        sides.setdefault(int(q), set()).add(bool(t))
    assert all(len(s) == 1 for s in sides.values())
    n_train_q = sum(1 for s in sides.values() if True in s)
    assert n_train_q == round(len(sides) * 0.6)
    assert np.array_equal(train, split_by_question(rows, 0.6, seed))  # deterministic


def test_split_fraction_must_be_a_proportion() -> None:
    with pytest.raises(ConfigError, match=r"train_fraction must be in \(0, 1\)"):
        split_by_question([1, 2, 3], 1.0)


def test_predict_and_export_before_fit_raise_lifecycle_error() -> None:
    clf = LookbackClassifier(chunks=K)
    with pytest.raises(LifecycleError, match="predict_proba called before fit"):
        clf.predict_proba(np.zeros((1, LAYERS, HEADS, K)))
    with pytest.raises(LifecycleError, match="to_onnx called before fit"):
        clf.to_onnx()


def test_onnx_matches_sklearn_on_held_out_rows() -> None:
    train, test = synthetic_rows(200, seed=1), synthetic_rows(80, seed=2, start=500)
    clf = LookbackClassifier(chunks=K).fit(train.cw, train.label)
    expected = clf.predict_proba(test.cw)
    got = onnx_probabilities(clf.to_onnx(), clf.features(test.cw))
    assert np.max(np.abs(got - expected)) <= PARITY_TOLERANCE
    # A padded input (fewer chunk columns) goes through the same path.
    short = test.cw[:, :, :, :2]
    np.testing.assert_allclose(
        onnx_probabilities(clf.to_onnx(), clf.features(short)),
        clf.predict_proba(short),
        atol=PARITY_TOLERANCE,
    )


def test_onnx_graph_outputs_plain_probabilities() -> None:
    rows = synthetic_rows(120)
    model = onnx.load_from_string(LookbackClassifier(chunks=K).fit(rows.cw, rows.label).to_onnx())
    outputs = {o.name for o in model.graph.output}
    assert "probabilities" in outputs
    assert not any(n.op_type == "ZipMap" for n in model.graph.node)
    (inp,) = model.graph.input
    assert inp.name == "features"
    assert inp.type.tensor_type.shape.dim[1].dim_value == LAYERS * HEADS * K


def test_the_same_fit_exports_the_same_bytes() -> None:
    """Audit: skl2onnx named the graph with a random uuid, so an identical retrain changed
    the served model version, and the confidence model fitted on it was refused."""
    rows = synthetic_rows(120)
    exports = [LookbackClassifier(chunks=K).fit(rows.cw, rows.label).to_onnx() for _ in range(2)]
    assert exports[0] == exports[1]


def test_train_and_export_writes_consistent_metadata(cw_model: Path, dataset_dir: Path) -> None:
    meta, onnx_bytes = load_metadata(cw_model)
    data = load_dataset(dataset_dir)
    assert meta.variant == "cw"
    assert (meta.layers, meta.heads, meta.chunks) == (LAYERS, HEADS, K)
    assert meta.generator_model == data.meta.generator_model
    assert meta.training.data_sha256 == data.sha256()
    assert meta.training.estimator.startswith("LogisticRegression(max_iter=1000")
    m = meta.metrics
    assert m.n == len(data) == m.n_train + m.n_test
    assert m.n_train == round(m.n * 0.6)
    assert 0.75 < m.test_auroc <= 1.0  # the synthetic pattern is learnable
    assert m.train_auroc >= m.test_auroc - 0.05
    assert meta.version.startswith("tiny-cw@")
    assert len(onnx_bytes) < 50_000


def test_fc_model_has_one_chunk_column(fc_model: Path) -> None:
    meta, _ = load_metadata(fc_model)
    assert (meta.variant, meta.chunks) == ("fc", 1)
    assert meta.metrics.test_auroc > 0.6


def test_tampered_model_file_is_rejected(cw_model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "m"
    copy.mkdir()
    (copy / "metadata.json").write_text((cw_model / "metadata.json").read_text())
    (copy / "model.onnx").write_bytes((cw_model / "model.onnx").read_bytes() + b"\0")
    with pytest.raises(ArtifactError, match="changed after training"):
        load_metadata(copy)
    (copy / "metadata.json").write_text(json.dumps({"format": "lookback-classifier/1"}))
    with pytest.raises(ArtifactError, match="not valid lookback model metadata"):
        load_metadata(copy)


def test_dataset_resumes_and_refuses_other_settings(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path, make_meta())
    rows = synthetic_rows(5, start=10)
    writer.write(rows, [{"qid": int(q)} for q in rows.qid])
    # An interrupted shard: records written, npz never committed.
    (tmp_path / "shards" / "part-00001.jsonl").write_text('{"qid": 99}\n')
    again = ShardWriter(tmp_path, make_meta())
    assert again.done_qids() == set(range(10, 15))
    more = synthetic_rows(3, start=2)
    again.write(more, [{"qid": int(q)} for q in more.qid])
    data = load_dataset(tmp_path)
    assert data.rows.qid.tolist() == [2, 3, 4, *range(10, 15)]
    assert [r["qid"] for r in data.records] == data.rows.qid.tolist()
    with pytest.raises(ConfigError, match="k differ"):
        ShardWriter(tmp_path, make_meta(k=5))
