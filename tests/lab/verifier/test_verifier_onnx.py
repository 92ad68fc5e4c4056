"""The ONNX export path: parity with torch, the artifact checks, the lifecycle guards.

A tiny randomly initialised BERT (2 layers, 32 wide) goes through the same
``VerifierTrainer.export`` as the real MiniLM model, so CI checks parity in
seconds; the shipped model's own parity numbers are in its card.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

torch = pytest.importorskip("torch", reason="the [ml] extra (torch) exports the verifier")
transformers = pytest.importorskip("transformers", reason="the [ml] extra exports the verifier")

from sidecar.claims.artifact import GOLDEN_INPUTS  # noqa: E402
from sidecar.claims.calibration import Band, Platt  # noqa: E402
from sidecar.claims.verifier import (  # noqa: E402
    GOLDEN_LOGIT_TOLERANCE,
    METADATA_FILE,
    OnnxVerifier,
    PairEncoder,
    first_segment,
    load_artifact,
)
from sidecar.exceptions import ArtifactError, ConfigError, LifecycleError  # noqa: E402
from sidecar.golden import describe_cpu  # noqa: E402
from sidecar.hashing import sha256_file  # noqa: E402
from sidecar.lab.verifier.model import CrossEncoder, claim_tokens  # noqa: E402
from sidecar.lab.verifier.settings import TrainConfig, minilm_dir  # noqa: E402
from sidecar.lab.verifier.sources import Pair  # noqa: E402
from sidecar.lab.verifier.trainer import VerifierTrainer, _drop_questions, _tensors  # noqa: E402
from tests.lab.verifier.conftest import tiny_bert  # noqa: E402

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
    trainer = VerifierTrainer(_config(out))
    trainer.model = CrossEncoder(tiny_bert()).eval()
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


def _copy(out: Path, dest: Path, **changes: object) -> dict[str, object]:
    """The exported artifact in ``dest`` with its metadata changed (``None`` drops a key)."""
    for name in ("model.onnx", "tokenizer.json"):
        (dest / name).write_bytes((out / name).read_bytes())
    meta: dict[str, object] = json.loads((out / METADATA_FILE).read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    (dest / METADATA_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return meta


def test_an_artifact_without_the_question_flag_reads_the_claim_alone(
    exported: tuple[VerifierTrainer, Path], tmp_path: Path
) -> None:
    _, out = exported
    meta = _copy(out, tmp_path, question_in_input=None)
    assert "question_in_input" not in meta  # written before the flag existed
    assert load_artifact(tmp_path).question_in_input is False
    onnx = OnnxVerifier.load(tmp_path)
    questions = ["Who wrote it?"] * len(PAIRS)
    assert onnx.inputs(PAIRS, questions) == PAIRS
    assert np.array_equal(onnx.logits(PAIRS, questions), onnx.logits(PAIRS))


def test_the_question_flag_builds_the_first_segment_as_training_does(
    exported: tuple[VerifierTrainer, Path], tmp_path: Path
) -> None:
    trainer, out = exported
    _copy(out, tmp_path, question_in_input=True)
    # The flag changes what the network reads, so the golden logits (recorded without it) fail.
    with pytest.raises(ConfigError, match="golden inputs"):
        OnnxVerifier.load(tmp_path)
    onnx = OnnxVerifier.load(tmp_path, check_golden=False)
    assert onnx.question_in_input
    questions = ["Who  wrote\nit?", "", "Where is Paris?", "Why?"]
    joined = [
        (first_segment(c, q, question_in_input=True), e)
        for (c, e), q in zip(PAIRS, questions, strict=True)
    ]
    assert joined[0][0] == f"Who wrote it? [SEP] {PAIRS[0][0]}" and joined[1] == PAIRS[1]
    assert onnx.inputs(PAIRS, questions) == joined
    assert np.allclose(onnx.logits(PAIRS, questions), onnx.logits(joined), atol=1e-6)
    assert not np.allclose(onnx.logits(PAIRS, questions), onnx.logits(PAIRS))
    with pytest.raises(ValueError, match="1 questions for 4 pairs"):
        onnx.inputs(PAIRS, ["q"])
    # Training encodes the pairs the same way (torch side of the same network).
    pairs = [Pair(c, e, 1, "x", "x", q, q) for (c, e), q in zip(PAIRS, questions, strict=True)]
    encoder = PairEncoder.from_file(minilm_dir() / "tokenizer.json", 64)
    feed = _tensors(encoder, pairs, question_in_input=True)
    assert np.array_equal(feed["input_ids"].numpy(), encoder.encode(joined)["input_ids"])
    qin = VerifierTrainer(replace(trainer.config, question_in_input=True), model=trainer.model)
    qin.encoder = encoder
    assert np.allclose(qin.logits(PAIRS, questions), onnx.logits(PAIRS, questions), atol=1e-4)


def test_some_training_pairs_go_without_their_question() -> None:
    pairs = [Pair("c", "e", 1, "x", "x", "g", "Who?") for _ in range(1000)]
    dropped = _drop_questions(pairs, 0.1, seed=0)
    share = sum(1 for p in dropped if not p.question) / len(pairs)
    assert 0.07 < share < 0.13
    assert _drop_questions(pairs, 0.1, seed=0) == dropped  # seeded


def test_the_question_is_not_pooled_as_part_of_the_claim() -> None:
    encoder = PairEncoder.from_file(minilm_dir() / "tokenizer.json", 64)
    ids = {"paris": 3000, "france": 2605}
    assert all(encoder.encode([(w, "x")])["input_ids"][0][1] == i for w, i in ids.items())
    with_q = _tensors(
        encoder, [Pair("Paris", "France", 1, "x", "x", "g", "Where?")], question_in_input=True
    )
    without = _tensors(
        encoder, [Pair("Paris", "France", 1, "x", "x", "g", "")], question_in_input=True
    )
    # [CLS] where ? [SEP] paris [SEP] france [SEP]  /  [CLS] paris [SEP] france [SEP]
    assert claim_tokens(**with_q, sep_token_id=102).tolist() == [[0, 0, 0, 0, 1, 1, 0, 0]]
    assert claim_tokens(**without, sep_token_id=102).tolist() == [[1, 1, 1, 0, 0]]


# ------------------------------------------------------------------ golden outputs


def test_the_export_records_golden_logits_that_the_load_checks(
    exported: tuple[VerifierTrainer, Path],
) -> None:
    trainer, out = exported
    golden = load_artifact(out).golden
    assert golden is not None and golden.output == "logit"
    assert golden.tolerance == GOLDEN_LOGIT_TOLERANCE
    assert golden.inputs == list(GOLDEN_INPUTS) and golden.recorded_on == describe_cpu()
    verifier = OnnxVerifier.load(out)  # checks them
    drift = verifier.check_golden(str(out))
    assert drift is not None and drift <= golden.tolerance
    # The references are the torch model's logits (fp32 file, one pair at a time) ...
    pairs = [(c.claim, c.evidence) for c in GOLDEN_INPUTS]
    np.testing.assert_allclose(golden.references, trainer.logits(pairs), atol=1e-4)
    assert len({round(z, 4) for z in golden.references}) == len(GOLDEN_INPUTS)
    # ... and one golden pair is longer than max_length, so truncation is covered.
    long = GOLDEN_INPUTS[1]
    assert verifier._encoder.encode([(long.claim, long.evidence)])["input_ids"].shape[1] == 64


def test_a_drifted_golden_logit_refuses_to_load(
    exported: tuple[VerifierTrainer, Path], tmp_path: Path
) -> None:
    _, out = exported
    golden = json.loads((out / METADATA_FILE).read_text(encoding="utf-8"))["golden"]
    golden["cases"][3]["output"] -= 2 * golden["tolerance"]
    _copy(out, tmp_path, golden=golden)
    with pytest.raises(ConfigError, match="logit moved by up to") as info:
        OnnxVerifier.load(tmp_path)
    assert describe_cpu() in str(info.value) and "claim verifier minilm-ce-" in str(info.value)
    unchecked = OnnxVerifier.load(tmp_path, check_golden=False)  # to record new ones
    with pytest.raises(ConfigError, match="more than the allowed"):
        unchecked.check_golden("here")


def test_a_changed_model_with_a_matching_sha256_refuses_to_load(
    exported: tuple[VerifierTrainer, Path], tmp_path: Path
) -> None:
    """A re-export that changed the network (here its head bias) but kept the golden logits."""
    _, out = exported
    model = onnx.load(str(out / "model.onnx"))
    (bias,) = [i for i in model.graph.initializer if i.name == "head.bias"]
    bias.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(bias) + 0.01, bias.name))
    onnx.save(model, str(tmp_path / "model.onnx"))
    (tmp_path / "tokenizer.json").write_bytes((out / "tokenizer.json").read_bytes())
    meta = json.loads((out / METADATA_FILE).read_text(encoding="utf-8"))
    meta["onnx_sha256"] = sha256_file(tmp_path / "model.onnx")
    (tmp_path / METADATA_FILE).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"other outputs than at export.*most likely changed"):
        OnnxVerifier.load(tmp_path)


def test_the_int8_file_computes_in_fp32_so_a_logit_does_not_depend_on_its_batch(
    exported: tuple[VerifierTrainer, Path],
) -> None:
    """Dynamic u8 x s8 products change with the CPU and with the batch's activation range
    (sidecar.lab.verifier.quantization); the exported int8 file keeps int8 weights and computes
    in fp32."""
    trainer, out = exported
    graph = onnx.load(str(out / "model.int8.onnx")).graph
    ops = {n.op_type for n in graph.node}
    assert not ops & {"MatMulInteger", "DynamicQuantizeLinear"}
    int8_weights = [i for i in graph.initializer if i.data_type == onnx.TensorProto.INT8]
    # Q, K, V, output and two feed-forward matrices per layer; the head (1 x 131) stays fp32
    assert len(int8_weights) == 2 * 6 and not any("head" in i.name for i in int8_weights)
    int8 = OnnxVerifier.load(out, onnx_file="model.int8.onnx")
    batch = int8.logits(PAIRS)
    one_by_one = np.array([int8.logits([p])[0] for p in PAIRS])
    np.testing.assert_allclose(one_by_one, batch, rtol=0, atol=1e-5)
    assert np.max(np.abs(batch - trainer.logits(PAIRS))) < 0.1  # int8 weights, close to fp32
    assert load_artifact(out).quantization == "none"  # the fixture's artifact names model.onnx


def test_the_export_fuses_the_self_attention_of_both_files(
    exported: tuple[VerifierTrainer, Path],
) -> None:
    """One com.microsoft Attention node per layer (sidecar.lab.verifier.fusion), either may ship."""
    _, out = exported
    for name in ("model.onnx", "model.int8.onnx"):
        model = onnx.load(str(out / name))
        ops = [n.op_type for n in model.graph.node]
        assert ops.count("Attention") == 2 and "Softmax" not in ops
        assert any(o.domain == "com.microsoft" for o in model.opset_import)
    assert not list(out.glob("*unfused*")) and not list(out.glob("*dynamic*"))
