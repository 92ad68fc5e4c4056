"""The verifier's network read back from its exported ONNX file, and distillation from a
teacher verifier: the shipped file in torch form computes what it serves; a student's
targets are the label and the teacher's probability, mixed by ``distill_weight``; the
teacher scores the training pairs once (kept in the work directory, resumed)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the [ml] extra (torch) trains the verifier")
transformers = pytest.importorskip("transformers", reason="the [ml] extra trains the verifier")

from sidecar.claims.verifier import OnnxVerifier  # noqa: E402
from sidecar.exceptions import ArtifactError, ConfigError  # noqa: E402
from sidecar.lab.verifier import distill  # noqa: E402
from sidecar.lab.verifier.checkpoints import Checkpoints  # noqa: E402
from sidecar.lab.verifier.distill import teacher_logits  # noqa: E402
from sidecar.lab.verifier.ml import BertModel  # noqa: E402
from sidecar.lab.verifier.model import CrossEncoder  # noqa: E402
from sidecar.lab.verifier.recover import state_from_onnx  # noqa: E402
from sidecar.lab.verifier.settings import minilm_dir  # noqa: E402
from sidecar.lab.verifier.trainer import VerifierTrainer  # noqa: E402
from sidecar.lab.verifier.training import export_from_checkpoint  # noqa: E402
from tests.lab.verifier.conftest import small_config  # noqa: E402
from tests.lab.verifier.test_training_resume import _pairs, _write_toy_corpus  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[3] / "models" / "verifier"

CASES = [
    ("The Eiffel Tower is in Paris.", "The Eiffel Tower is a lattice tower in Paris.", "where?"),
    ("It opened in 1850.", "The tower opened in 1889 for the World's Fair.", "when did it open"),
    ("Curie won two Nobel prizes.", "Curie won the Physics prize in 1903, Chemistry in 1911.", ""),
    ("yes", "no idea what you mean", ""),
    ("A" * 300, "b " * 400, "q"),
]


def _torch_logits(model: Any, verifier: OnnxVerifier, cases: list[tuple[str, str, str]]) -> Any:
    texts = verifier.inputs([(c, e) for c, e, _ in cases], [q for _, _, q in cases])
    with torch.no_grad():
        return np.array(
            [
                float(model(**{k: torch.from_numpy(a) for k, a in feed.items()}))
                for feed in verifier._encoder.encode_each(texts)
            ]
        )


def test_the_shipped_verifier_in_torch_form_computes_what_it_serves() -> None:
    served = OnnxVerifier.load(SHIPPED, threads=1)
    bert = BertModel.from_pretrained(str(minilm_dir()), add_pooling_layer=False)
    model = CrossEncoder(bert)
    model.load_state_dict(state_from_onnx(SHIPPED / "model.int8.onnx"), strict=True)
    model.eval()
    want = served.logits([(c, e) for c, e, _ in CASES], [q for _, _, q in CASES])
    got = _torch_logits(model, served, CASES)
    assert np.ptp(want) > 2.0  # the cases are told apart, so agreement is not trivial
    np.testing.assert_allclose(got, want, atol=1e-3)  # measured: 4.3e-6 on an EPYC


def test_an_onnx_file_that_is_not_a_verifier_is_refused() -> None:
    lookback = next((SHIPPED.parent / "lookback").rglob("model.onnx"))
    with pytest.raises(ArtifactError, match="not a verifier"):
        state_from_onnx(lookback)


@pytest.fixture(scope="module")
def tiny_teacher(tiny_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny verifier, trained a few steps and exported as a served directory."""
    work = tmp_path_factory.mktemp("teacher-run")
    pairs = _pairs()
    _write_toy_corpus(pairs, work)
    VerifierTrainer(small_config(tiny_base, work, stop_after=6)).fit(pairs)
    out = work / "out"
    export_from_checkpoint(small_config(tiny_base, work), out, calibration_pairs=30)
    return out


def test_the_teacher_scores_each_pair_once_and_resumes(
    tiny_teacher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = _pairs()
    served = OnnxVerifier.load(tiny_teacher)
    want = served.logits([(p.claim, p.evidence) for p in pairs], [p.question for p in pairs])
    got = teacher_logits(tiny_teacher, pairs, cache_dir=tmp_path, threads=1)
    np.testing.assert_allclose(got, want, atol=1e-6)
    [kept] = tmp_path.glob("teacher-*.npy")
    # a run stopped half way: only the pairs not yet scored are scored again
    partial = np.load(kept)
    partial[5:9] = np.nan
    np.save(kept, partial)
    scored: list[int] = []
    real = OnnxVerifier.logits
    ours = {(p.claim, p.evidence) for p in pairs}

    def counting(self: OnnxVerifier, texts: Any, questions: Any = None) -> Any:
        if set(texts) <= ours:  # not the golden pairs checked at load
            scored.append(len(texts))
        return real(self, texts, questions)

    monkeypatch.setattr(OnnxVerifier, "logits", counting)
    again = teacher_logits(tiny_teacher, pairs, cache_dir=tmp_path, threads=1)
    assert scored == [4]
    np.testing.assert_allclose(again, want, atol=1e-6)
    # other questions (another question dropout) are other pairs: scored anew
    other = [*pairs[:-1], replace(pairs[-1], question="Other?")]
    teacher_logits(tiny_teacher, other, cache_dir=tmp_path, threads=1)
    assert scored == [4, len(pairs)]


def test_the_student_learns_from_labels_and_teacher_mixed(
    tiny_base: Path, tiny_teacher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = _pairs()
    seen: list[tuple[Any, Any]] = []
    real = torch.nn.BCEWithLogitsLoss

    class Recording(real):  # type: ignore[misc, valid-type]
        def forward(self, logits: Any, target: Any) -> Any:
            seen.append((logits.detach().clone(), target.detach().clone()))
            return super().forward(logits, target)

    monkeypatch.setattr(torch.nn, "BCEWithLogitsLoss", Recording)  # the trainer's nn
    config = small_config(
        tiny_base,
        tmp_path,
        teacher=tiny_teacher,
        distill_weight=0.7,
        question_dropout=0.0,
        init_from=tiny_teacher / OnnxVerifier.load(tiny_teacher).artifact.onnx_file,
        stop_after=3,
    )
    student = VerifierTrainer(config).fit(pairs)
    assert student.steps == 3 and len(seen) == 3
    teacher = OnnxVerifier.load(tiny_teacher)
    p_teacher = 1 / (1 + np.exp(-teacher.logits([(p.claim, p.evidence) for p in pairs],
                                                [p.question for p in pairs])))  # fmt: skip
    allowed = {
        (round(0.3 * p.label + 0.7 * float(s), 5)) for p, s in zip(pairs, p_teacher, strict=True)
    }
    targets = [round(float(t), 5) for _, batch in seen for t in batch]
    assert set(targets) <= allowed
    assert not set(targets) <= {0.0, 1.0}  # soft, not the labels
    # the first step reads the teacher's own network: its logits are the teacher's
    first_logits = seen[0][0].numpy()
    assert np.all(np.isfinite(first_logits))
    fingerprint = Checkpoints(tmp_path / "checkpoints").load()["fingerprint"]
    assert fingerprint["distill_weight"] == "0.7"
    assert fingerprint["teacher"] == str(tiny_teacher)
    with pytest.raises(ConfigError, match=r"changed: distill_weight 0\.7 -> 0\.5"):
        VerifierTrainer(
            small_config(tiny_base, tmp_path, teacher=tiny_teacher, distill_weight=0.5,
                         question_dropout=0.0, init_from=config.init_from)
        ).fit(pairs, resume=True)  # fmt: skip
    _write_toy_corpus(pairs, tmp_path)
    out = tmp_path / "out"
    export_from_checkpoint(small_config(tiny_base, tmp_path), out, calibration_pairs=30)
    card = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert f"the targets 0.7 x the teacher's p(supported) (`{tiny_teacher}`)" in card
    assert f"`{config.init_from}`" in card  # the network it started from


def test_distillation_settings_are_checked_at_construction(
    tiny_base: Path, tiny_teacher: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="needs a teacher"):
        small_config(tiny_base, tmp_path, distill_weight=0.5)
    with pytest.raises(ConfigError, match=r"distill_weight must be in \[0, 1\]"):
        small_config(tiny_base, tmp_path, teacher=tiny_teacher, distill_weight=1.5)
    with pytest.raises(ConfigError, match=r"distill_weight is 0 \(the teacher would be ignored"):
        small_config(tiny_base, tmp_path, teacher=tiny_teacher)
    with pytest.raises(ConfigError, match="not an exported verifier directory"):
        small_config(tiny_base, tmp_path, teacher=tmp_path, distill_weight=0.5)


def test_teacher_logits_refuse_a_non_finite_logit(
    tiny_teacher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pairs = _pairs()[:4]
    real = OnnxVerifier.logits

    def broken(self: OnnxVerifier, texts: Any, questions: Any = None) -> Any:
        out = real(self, texts, questions)
        if texts == [(p.claim, p.evidence) for p in pairs]:  # not the golden pairs at load
            out[2] = np.nan
        return out

    monkeypatch.setattr(OnnxVerifier, "logits", broken)
    with pytest.raises(ArtifactError, match="non-finite logit"):
        distill.teacher_logits(tiny_teacher, pairs, cache_dir=None, threads=1)
