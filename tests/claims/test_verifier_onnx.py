"""The ONNX export path: parity with torch, the artifact checks, the lifecycle guards.

A tiny randomly initialised BERT (2 layers, 32 wide) goes through the same
``VerifierTrainer.export`` as the real MiniLM model, so CI checks parity in
seconds; the shipped model's own parity numbers are in its card.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the [ml] extra (torch) exports the verifier")
transformers = pytest.importorskip("transformers", reason="the [ml] extra exports the verifier")

from sidecar.claims.calibration import Band, Platt  # noqa: E402
from sidecar.claims.datasets import Pair  # noqa: E402
from sidecar.claims.training import (  # noqa: E402
    CrossEncoder,
    TrainConfig,
    VerifierTrainer,
    minilm_dir,
)
from sidecar.claims.verifier import METADATA_FILE, OnnxVerifier, PairEncoder  # noqa: E402
from sidecar.exceptions import ArtifactError, LifecycleError  # noqa: E402

PAIRS = [
    ("Metformin activates AMPK.", "Metformin reduces glucose output by activating AMPK."),
    ("The treaty was signed in 1919.", "The Treaty of Versailles was signed on June 28, 1919."),
    ("Paris is in Germany.", "Paris is the capital and largest city of France."),
    ("A claim.", ""),
]


def _config(tmp_path: Path) -> TrainConfig:
    return TrainConfig(
        halueval_path=tmp_path / "unused.json",
        nq_path=None,
        base_model_dir=minilm_dir(),
        max_length=64,
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[VerifierTrainer, Path]:
    out = tmp_path_factory.mktemp("verifier")
    torch.manual_seed(0)
    tiny = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    trainer = VerifierTrainer(_config(out))
    trainer.model = CrossEncoder(transformers.BertModel(tiny, add_pooling_layer=False)).eval()
    trainer.encoder = PairEncoder.from_file(minilm_dir() / "tokenizer.json", 64)
    trainer.train_sha256 = "0" * 64
    fp32 = trainer.export(out)  # with a provisional identity calibration
    trainer.calibrations[fp32.name] = (Platt(1.0 / 1.5, 0.0, 0.0), Band(0.3, 0.7))
    (out / METADATA_FILE).write_text(trainer.artifact(fp32, {}).model_dump_json(), encoding="utf-8")
    return trainer, out


def test_onnx_fp32_matches_torch(exported: tuple[VerifierTrainer, Path]) -> None:
    trainer, out = exported
    torch_logits = trainer.logits(PAIRS)
    onnx = OnnxVerifier.load(out)
    assert np.max(np.abs(onnx.logits(PAIRS) - torch_logits)) < 1e-4
    probs = onnx.probabilities(PAIRS)  # coverage weight 0 here: plain temperature 1.5
    expected = 1 / (1 + np.exp(-torch_logits / 1.5))
    assert np.allclose(probs, expected, atol=1e-4)
    assert onnx.version.startswith("minilm-ce-")


def test_onnx_int8_stays_close(exported: tuple[VerifierTrainer, Path]) -> None:
    trainer, out = exported
    int8 = OnnxVerifier.load(out, onnx_file="model.int8.onnx")
    assert (out / "model.int8.onnx").stat().st_size < (out / "model.onnx").stat().st_size
    assert np.max(np.abs(int8.logits(PAIRS) - trainer.logits(PAIRS))) < 0.1


def test_a_file_that_does_not_match_its_metadata_is_refused(
    exported: tuple[VerifierTrainer, Path], tmp_path: Path
) -> None:
    _, out = exported
    for name in ("model.onnx", "tokenizer.json"):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    meta = json.loads((out / METADATA_FILE).read_text(encoding="utf-8"))
    meta["onnx_sha256"] = "f" * 64
    (tmp_path / METADATA_FILE).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ArtifactError, match="does not match the sha256"):
        OnnxVerifier.load(tmp_path)
    with pytest.raises(ArtifactError, match="no verifier metadata"):
        OnnxVerifier.load(tmp_path / "missing")


def test_lifecycle_guards(tmp_path: Path) -> None:
    trainer = VerifierTrainer(_config(tmp_path))
    pairs = [Pair("c", "e", k % 2, "x", "x", "x") for k in range(20)]
    with pytest.raises(LifecycleError, match=r"export\(\) called before fit\(\)"):
        trainer.export(tmp_path)
    with pytest.raises(LifecycleError, match=r"calibrate\(\) called before export\(\)"):
        trainer.calibrate(pairs)
    with pytest.raises(LifecycleError, match=r"artifact\(\) called before calibrate\(\)"):
        trainer.artifact(tmp_path / "model.onnx", {})
    with pytest.raises(LifecycleError, match=r"logits\(\) called before fit\(\)"):
        trainer.logits([("a", "b")])


def test_calibration_on_exported_files(exported: tuple[VerifierTrainer, Path]) -> None:
    trainer, out = exported
    pairs = [
        Pair(c, e if k % 2 else "unrelated text about gardening", k % 2, "x", "x", "x")
        for k, (c, e) in enumerate(PAIRS * 5)
    ]
    calibrated = VerifierTrainer(trainer.config, model=trainer.model, encoder=trainer.encoder)
    calibrated.out_dir = out
    calibrated.calibrate(pairs)
    assert set(calibrated.calibrations) == {"model.onnx", "model.int8.onnx"}
    platt, band = calibrated.calibrations["model.onnx"]
    assert platt.coverage_weight > 0  # coverage separates these pairs
    assert band.unsupported_below <= band.supported_from
