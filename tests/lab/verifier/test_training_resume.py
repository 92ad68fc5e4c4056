"""Resumable verifier training: a killed run continues exactly where its checkpoint left off,
and one command turns a checkpoint into a served artifact with its card.

A tiny randomly initialised BERT (2 layers, 32 wide) saved like the MiniLM
folder (config, safetensors, tokenizer.json) goes through the same
``VerifierTrainer.fit`` as the real run, so the test takes seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the [ml] extra (torch) trains the verifier")
transformers = pytest.importorskip("transformers", reason="the [ml] extra trains the verifier")

from sidecar.claims.verifier import OnnxVerifier  # noqa: E402
from sidecar.exceptions import ConfigError  # noqa: E402
from sidecar.lab.verifier.calibration import BAND_TARGETS  # noqa: E402
from sidecar.lab.verifier.checkpoints import Checkpoints  # noqa: E402
from sidecar.lab.verifier.datasets import Corpus, baselines, pairs_digest, write_corpus  # noqa: E402
from sidecar.lab.verifier.settings import TrainConfig  # noqa: E402
from sidecar.lab.verifier.sources import Pair  # noqa: E402
from sidecar.lab.verifier.trainer import VerifierTrainer  # noqa: E402
from sidecar.lab.verifier.training import export_from_checkpoint  # noqa: E402
from tests.lab.verifier.conftest import small_config  # noqa: E402

FACTS = [
    ("Paris is the capital of France.", "Paris is the capital and largest city of France."),
    ("The treaty was signed in 1919.", "The Treaty of Versailles was signed on June 28, 1919."),
    ("Metformin activates AMPK.", "Metformin lowers glucose output by activating AMPK."),
    ("Nolan directed Inception.", "Inception is a 2010 film directed by Christopher Nolan."),
    ("The river is 300 km long.", "The river flows for 300 km before reaching the sea."),
]


def _pairs() -> list[Pair]:
    out = []
    for k, (claim, evidence) in enumerate(FACTS * 4):
        other = FACTS[(k + 1) % len(FACTS)][1]
        q = "Which?" if k % 2 else ""
        out.append(Pair(claim, evidence, 1, "sent-in", "test", f"g{k}", q))
        out.append(Pair(claim, other, 0, "sent-out", "test", f"g{k}", q))
    return out


def _config(base: Path, work: Path, **changes: object) -> TrainConfig:
    return small_config(base, work, **changes)


def _weights(trainer: VerifierTrainer) -> dict[str, object]:
    assert trainer.model is not None
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _write_toy_corpus(pairs: list[Pair], work_dir: Path) -> None:
    """``pairs`` as a corpus in ``work_dir/corpus`` (train, val and the one test set)."""
    manifest: dict[str, object] = {
        "seed": 0,
        "window_chars": 300,
        "split_rule": "by group",
        "files_sha256": {"toy": "0" * 64},
        "train": {**baselines(pairs), "sha256": pairs_digest(pairs)},
        "test": {"toy": baselines(pairs)},
    }
    write_corpus(Corpus(pairs, pairs, {"toy": pairs}, manifest), work_dir / "corpus")


def test_a_killed_run_resumes_to_the_same_weights(tiny_base: Path, tmp_path: Path) -> None:
    pairs = _pairs()
    straight = VerifierTrainer(_config(tiny_base, tmp_path / "a")).fit(pairs)
    assert straight.steps == 20  # 40 pairs / batch 4 x 2 epochs
    reference = _weights(straight)

    first = VerifierTrainer(_config(tiny_base, tmp_path / "b", stop_after=7)).fit(pairs)
    assert first.steps == 7
    saved = Checkpoints(tmp_path / "b" / "checkpoints")
    assert [p.name for p in saved.all()] == [
        "step-0000003.pt",
        "step-0000006.pt",
        "step-0000007.pt",
    ]
    saved.all()[-1].unlink()  # killed after step 7, before its checkpoint was written
    resumed = VerifierTrainer(_config(tiny_base, tmp_path / "b")).fit(pairs, resume=True)
    assert resumed.steps == 20
    after = _weights(resumed)
    assert after.keys() == reference.keys()
    for name, value in reference.items():
        assert torch.allclose(after[name], value, atol=1e-6), name
    # the untouched weights really moved, so equality is not trivially true
    untrained = VerifierTrainer(_config(tiny_base, tmp_path / "c", stop_after=1)).fit(pairs)
    moved = _weights(untrained)["head.weight"]
    assert not torch.allclose(moved, reference["head.weight"], atol=1e-4)


def test_resume_refuses_other_pairs_or_settings(tiny_base: Path, tmp_path: Path) -> None:
    pairs = _pairs()
    VerifierTrainer(_config(tiny_base, tmp_path, stop_after=3)).fit(pairs)
    with pytest.raises(ConfigError, match="trained on other pairs"):
        VerifierTrainer(_config(tiny_base, tmp_path)).fit(pairs[:-2], resume=True)
    with pytest.raises(ConfigError, match="changed: batch_size 4 -> 2"):
        VerifierTrainer(_config(tiny_base, tmp_path, batch_size=2)).fit(pairs, resume=True)
    with pytest.raises(ConfigError, match="needs a work_dir"):
        VerifierTrainer(_config(tiny_base, tmp_path, work_dir=None)).fit(pairs, resume=True)


def test_one_command_exports_a_checkpoint_with_its_card(tiny_base: Path, tmp_path: Path) -> None:
    pairs = _pairs()
    _write_toy_corpus(pairs, tmp_path)
    VerifierTrainer(_config(tiny_base, tmp_path, stop_after=4)).fit(pairs)
    (tmp_path / "command.txt").write_text("guardrail train verifier --work-dir W\n")
    out = tmp_path / "out"
    artifact = export_from_checkpoint(
        _config(tiny_base, tmp_path, max_windows=2, max_length=16), out, calibration_pairs=30
    )
    assert artifact.max_length == 48  # from the checkpoint, not from the export's settings
    assert artifact.evidence_max_windows == 2 and artifact.evidence_max_chars == 300
    assert artifact.coverage_excludes_question and artifact.question_in_input
    assert artifact.metrics["training"]["steps"] == 4
    assert {"fp32/toy", "int8/toy", "parity"} <= artifact.metrics.keys()
    card = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "| toy | 40 |" in card and "guardrail train verifier --work-dir W" in card
    assert artifact.metrics["training"]["device"] == "cpu"
    assert "below 0.8 (empty when both reach it at one point" in card
    assert "s of training on CPU (1 threads)" in card
    loaded = OnnxVerifier.load(out)
    assert loaded.version == artifact.version
    probs = loaded.window_probabilities(["Paris is in France."], [["Paris is in France.", "x"]])
    assert len(probs) == 1 and 0.0 < probs[0] < 1.0
    # a band for each target precision, fitted on the same validation pairs as its own
    assert artifact.target_precision == 0.8
    assert [b.target_precision for b in artifact.bands] == list(BAND_TARGETS)
    [own] = [b for b in artifact.bands if b.target_precision == 0.8]
    assert own.band == artifact.band
    assert all(b.unsupported_below <= b.supported_from for b in artifact.bands)
    strict = OnnxVerifier.load(out, target_precision=0.95)
    assert strict.band == artifact.band_for(0.95)
    assert strict.version == f"{artifact.version}+p0.95"


def test_the_card_names_the_gpu_a_checkpoint_was_trained_on(
    tiny_base: Path, tmp_path: Path
) -> None:
    """A run on a GPU (``--device cuda``) keeps that in its checkpoint; the card says it."""
    pairs = _pairs()
    _write_toy_corpus(pairs, tmp_path)
    VerifierTrainer(_config(tiny_base, tmp_path, stop_after=2)).fit(pairs)
    saved = Checkpoints(tmp_path / "checkpoints")
    path = saved.latest()
    assert path is not None
    state = saved.load(path)
    assert state["device"] == "cpu"
    state["device"] = "cuda (NVIDIA H100 80GB HBM3)"  # as a GPU run writes it
    torch.save(state, path)
    out = tmp_path / "out"
    artifact = export_from_checkpoint(_config(tiny_base, tmp_path), out, calibration_pairs=30)
    assert artifact.metrics["training"]["device"] == "cuda (NVIDIA H100 80GB HBM3)"
    card = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "s of training on cuda (NVIDIA H100 80GB HBM3)." in card
    assert "on CPU" not in card


def test_device_is_cpu_or_cuda_and_cuda_needs_a_gpu(tiny_base: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="device must be cpu or cuda, got 'gpu'"):
        _config(tiny_base, tmp_path, device="gpu")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU message cannot be reached")
    trainer = VerifierTrainer(_config(tiny_base, tmp_path, device="cuda"))
    with pytest.raises(ConfigError, match="torch sees no CUDA device here"):
        trainer.fit(_pairs())


def test_a_shallower_network_starts_from_a_deeper_runs_lowest_layers(
    tiny_base: Path, tmp_path: Path
) -> None:
    """``layers=1``: the lowest layer of a finished 2-layer run, trained on; export keeps 1."""
    pairs = _pairs()
    deep = VerifierTrainer(_config(tiny_base, tmp_path / "deep", stop_after=2)).fit(pairs)
    finished = Checkpoints(tmp_path / "deep" / "checkpoints").latest()
    assert finished is not None and deep.model is not None
    work = tmp_path / "shallow"
    config = _config(tiny_base, work, layers=1, freeze_layers=0, init_from=finished)
    shallow = VerifierTrainer(config).fit(pairs)
    assert shallow.model is not None
    assert len(shallow.model.encoder.encoder.layer) == 1
    start = deep.model.state_dict()
    got = shallow.model.state_dict()
    assert not any(".layer.1." in k for k in got)
    assert torch.equal(
        got["encoder.embeddings.word_embeddings.weight"],
        start["encoder.embeddings.word_embeddings.weight"],
    )  # frozen, as loaded
    saved = Checkpoints(work / "checkpoints")
    assert saved.load()["fingerprint"]["layers"] == "1"
    _write_toy_corpus(pairs, work)
    out = tmp_path / "out"
    artifact = export_from_checkpoint(_config(tiny_base, work), out, calibration_pairs=30)
    card = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "the lowest 1 of the 6 encoder layers" in card
    loaded = OnnxVerifier.load(out)
    assert loaded.version == artifact.version
    probs = loaded.window_probabilities(["Paris is in France."], [["Paris is in France."]])
    assert len(probs) == 1 and 0.0 < probs[0] < 1.0
    # resuming the shallow run with all layers is another network: refused
    with pytest.raises(ConfigError, match="changed: layers 1 -> None"):
        VerifierTrainer(_config(tiny_base, work, init_from=finished, freeze_layers=0)).fit(
            pairs, resume=True
        )


def test_bad_depth_or_band_settings_fail_at_construction(tiny_base: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"layers must be in 1\.\.6"):
        _config(tiny_base, tmp_path, layers=7)
    with pytest.raises(ConfigError, match=r"freeze_layers \(2\) must not exceed layers \(1\)"):
        _config(tiny_base, tmp_path, layers=1, freeze_layers=2)
    with pytest.raises(ConfigError, match=r"target_precision must be in \[0\.5, 1\), got 1\.0"):
        _config(tiny_base, tmp_path, target_precision=1.0)
