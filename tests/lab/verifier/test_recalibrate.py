"""``guardrail calibrate verifier``: the split, the fit, the written verifier, the command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sidecar.claims.calibration import Band, Platt
from sidecar.claims.verifier import OnnxVerifier, load_artifact
from sidecar.cli.main import main
from sidecar.exceptions import ConfigError
from sidecar.hashing import sha256_file
from sidecar.lab.verifier.evaluate import PairItem, score_pair_items
from sidecar.lab.verifier.recalibrate import (
    PairFeatures,
    pair_features,
    recalibrate,
    split_by_evidence,
    write_recalibrated,
)
from tests.claims.conftest import REPO

MODEL = REPO / "models" / "verifier"

FACTS = [
    ("The bridge opened in 1932.", "The bridge opened to traffic in 1932 after six years of work."),
    ("The bridge opened in 1952.", "The bridge opened to traffic in 1932 after six years of work."),
    ("Marie Curie won two Nobel prizes.", "Marie Curie won the Nobel Prize in 1903 and in 1911."),
    ("Marie Curie won no Nobel prize.", "Marie Curie won the Nobel Prize in 1903 and in 1911."),
    ("The river flows into the North Sea.", "The Rhine flows north and enters the North Sea."),
    ("The river flows into the Black Sea.", "The Rhine flows north and enters the North Sea."),
    ("The lake is 300 m deep.", "Its deepest point lies 300 metres below the surface of the lake."),
    ("The lake is 30 m deep.", "Its deepest point lies 300 metres below the surface of the lake."),
]


def _pairs(n_docs: int) -> list[dict[str, object]]:
    """True and false claims about ``n_docs`` variants of the documents above."""
    rows: list[dict[str, object]] = []
    for d in range(n_docs):
        for k, (claim, evidence) in enumerate(FACTS):
            rows.append(
                {"claim": claim, "evidence": f"{evidence} (Record {d}.)", "label": 1 - k % 2}
            )
    return rows


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _features(logits: np.ndarray, labels: np.ndarray) -> PairFeatures:
    return PairFeatures(
        logits=logits.astype(np.float64),
        coverages=np.zeros(len(logits)),
        scored=np.ones(len(logits), dtype=np.bool_),
        labels=labels.astype(np.int64),
    )


def test_the_split_keeps_each_document_on_one_side() -> None:
    items = [PairItem(f"c{k}", f"Document {k // 4}.", k % 2) for k in range(400)]
    fit, held = split_by_evidence(items, 0.25)
    assert {i.evidence for i in fit}.isdisjoint({i.evidence for i in held})
    assert 0.1 < len(held) / len(items) < 0.4  # 100 documents, a quarter in expectation
    # whitespace and case do not move a document to the other side
    again = [PairItem(i.claim, f"  {i.evidence.upper()} ", i.label) for i in items]
    assert [i.claim for i in split_by_evidence(again, 0.25)[1]] == [i.claim for i in held]
    assert split_by_evidence(items, 0.0) == (items, [])
    with pytest.raises(ConfigError, match=r"--holdout must be in \[0, 1\)"):
        split_by_evidence(items, 1.0)


class _Served:
    """The parts of an OnnxVerifier that :func:`recalibrate` reads."""

    def __init__(self, platt: Platt) -> None:
        self.calibration = platt
        self.band = Band(0.5, 0.5)


def test_the_fit_recovers_a_known_calibration_and_holds_the_target() -> None:
    # logits of a network that is right but over-confident by 3x, shifted by +1
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 3.0, 4000)
    truth = 1 / (1 + np.exp(-(z / 3.0 - 1 / 3.0)))
    y = (rng.random(4000) < truth).astype(np.int64)
    fit, held = _features(z[:3000], y[:3000]), _features(z[3000:], y[3000:])
    items = [PairItem("c", "e", int(v)) for v in y[3000:]]
    cal = recalibrate(_Served(Platt()), fit, held, items, target_precision=0.9)
    assert cal.platt.logit_scale == pytest.approx(1 / 3, abs=0.05)
    assert cal.platt.bias == pytest.approx(-1 / 3, abs=0.15)
    p = cal.platt.probability(fit.logits, fit.coverages)
    supported = p >= cal.band.supported_from
    unsupported = p < cal.band.unsupported_below
    assert fit.labels[supported].mean() >= 0.9
    assert (1 - fit.labels[unsupported]).mean() >= 0.9
    # calibrated on held-out pairs: the new ECE beats the identity calibration's
    assert cal.report["after"]["ece"] < cal.report["before"]["ece"]
    assert cal.report["after"]["n"] == 1000
    assert [b.target_precision for b in cal.bands] == [0.7, 0.75, 0.8, 0.85, 0.9, 0.95]


def test_pairs_without_evidence_are_left_out_of_the_fit() -> None:
    z = np.array([-2.0, 2.0] * 10 + [5.0, 5.0])
    y = np.array([0, 1] * 10 + [0, 0])
    scored = np.array([True] * 20 + [False, False])
    fit = PairFeatures(z, np.zeros(22), scored, y)
    cal = recalibrate(
        _Served(Platt()), fit, fit, [PairItem("c", "e", int(v)) for v in y], target_precision=0.8
    )
    assert cal.n_fit == 22 and cal.n_fit_scored == 20
    assert fit.probabilities(cal.platt)[-2:] == [0.0, 0.0]  # as served: no window, p = 0
    one_class = PairFeatures(z[:5], np.zeros(5), scored[:5], np.ones(5, dtype=np.int64))
    with pytest.raises(ConfigError, match=">= 10 fitted pairs of both labels"):
        recalibrate(_Served(Platt()), one_class, one_class, [], target_precision=0.8)


def test_the_written_verifier_is_the_same_network_under_a_new_version(tmp_path: Path) -> None:
    verifier = OnnxVerifier.load(MODEL)
    items = [PairItem(str(r["claim"]), str(r["evidence"]), int(r["label"])) for r in _pairs(3)]  # type: ignore[call-overload]
    feats = pair_features(verifier, items)
    assert feats.scored.all()
    artifact = verifier.artifact
    direct = score_pair_items(
        verifier,
        items[:4],
        max_windows=artifact.evidence_max_windows,
        window_chars=artifact.evidence_max_chars,
    )
    # the features give back what the sidecar serves with the old calibration
    assert feats.probabilities(verifier.calibration)[:4] == pytest.approx(direct, abs=1e-9)
    cal = recalibrate(verifier, feats, feats, items, target_precision=0.8)
    data = _write(tmp_path / "pairs.jsonl", _pairs(3))
    out = tmp_path / "mine"
    summary = write_recalibrated(verifier, MODEL, out, cal, data=data, holdout=0.2)
    written = load_artifact(out)
    shipped = load_artifact(MODEL)
    assert written.version == summary["verifier_out"]
    assert written.version.startswith(f"{shipped.version}+cal-")
    assert written.onnx_sha256 == shipped.onnx_sha256 == sha256_file(out / written.onnx_file)
    assert written.golden == shipped.golden
    assert (written.logit_scale, written.bias) == (cal.platt.logit_scale, cal.platt.bias)
    assert written.metrics["recalibration"]["data_sha256"] == sha256_file(data)
    assert written.metrics["recalibration"]["from_version"] == shipped.version
    assert (
        (out / "MODEL_CARD.md")
        .read_text(encoding="utf-8")
        .startswith(f"# Re-calibrated claim verifier `{written.version}`")
    )
    served = OnnxVerifier.load(out)  # the golden logits still hold: the network is unchanged
    assert served.version == written.version
    assert served.band.supported_from == cal.band.supported_from
    with pytest.raises(ConfigError, match="exists and is not an empty directory"):
        write_recalibrated(verifier, MODEL, out, cal, data=data, holdout=0.2)


def test_the_command_writes_a_verifier_the_eval_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _write(tmp_path / "pairs.jsonl", _pairs(6))
    out = tmp_path / "mine"
    argv = ["calibrate", "verifier", "--data", str(data), "--out", str(out)]
    assert main([*argv, "--model", str(MODEL), "--holdout", "0.3", "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["n_fit"] + summary["n_holdout"] == 48
    assert summary["held_out"]["after"]["n"] == summary["n_holdout"]
    assert "fitted pairs: the band's ends rest on few pairs" in captured.err
    assert "repeat an earlier line" not in captured.err
    assert (
        main(
            [
                "eval",
                "claims",
                "--format",
                "pairs",
                "--data",
                str(data),
                "--model",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["verifier"] == summary["verifier_out"]
    assert report["threshold"] == summary["band"][1]
    # an existing --out is refused before any pair is scored
    assert main([*argv, "--model", str(MODEL)]) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["flag", "served-setting"])
def test_before_is_the_old_calibration_at_the_same_target_precision(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    # audit: at --target-precision 0.9 the held-out "before" was the shipped verifier at its
    # own 0.8 band (threshold 0.54), not at its 0.9 band (0.75): the comparison was skewed
    data = _write(tmp_path / "pairs.jsonl", _pairs(6))
    argv = ["calibrate", "verifier", "--data", str(data), "--model", str(MODEL)]
    argv += ["--out", str(tmp_path / "mine"), "--holdout", "0.5", "--json"]
    if how == "flag":
        argv += ["--target-precision", "0.9"]
    else:  # no flag: the served band's precision, as `eval claims` measures it
        monkeypatch.setenv("GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION", "0.9")
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    shipped = load_artifact(MODEL)
    assert summary["held_out"]["before"]["threshold"] == shipped.band_for(0.9).supported_from
    assert summary["held_out"]["after"]["threshold"] == summary["band"][1]


def test_out_inside_the_model_or_unwritable_is_refused_before_scoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # audit: --out models/verifier/mine wrote a verifier inside the served one; --out under
    # a file failed only after the scoring (exit 1), and /proc/x with a traceback
    model = tmp_path / "verifier"
    model.mkdir()
    for f in MODEL.iterdir():
        (model / f.name).symlink_to(f)
    data = _write(tmp_path / "pairs.jsonl", _pairs(6))
    (tmp_path / "a-file").write_text("x", encoding="utf-8")

    def no_scoring(*_: object, **__: object) -> None:
        raise AssertionError("scored before refusing --out")

    monkeypatch.setattr("sidecar.lab.verifier.recalibrate.pair_features", no_scoring)
    argv = ["calibrate", "verifier", "--data", str(data), "--model", str(model), "--out"]
    for out, says in (
        (model / "mine", "is the verifier being calibrated or inside it"),
        (tmp_path / "a-file" / "mine", "is a file, not a directory"),
        (Path("/proc/guardrail-out"), "cannot write a directory there"),
    ):
        assert main([*argv, str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        # one error line (after the warning about repeated lines, where they repeat)
        assert says in lines[-1] and all("warning" in line for line in lines[:-1]), lines
    assert sorted(p.name for p in model.iterdir()) == sorted(p.name for p in MODEL.iterdir())


def test_a_long_network_name_is_cut_and_a_failed_write_leaves_no_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    verifier = OnnxVerifier.load(MODEL)
    items = [PairItem(str(r["claim"]), str(r["evidence"]), int(r["label"])) for r in _pairs(3)]  # type: ignore[call-overload]
    feats = pair_features(verifier, items)
    cal = recalibrate(verifier, feats, feats, items, target_precision=0.8)
    data = _write(tmp_path / "pairs.jsonl", _pairs(3))
    # audit: a 60-character network name gave a 73-character version: a traceback after
    # the ONNX file was copied, and the half-written --out refused the rerun
    long = verifier.artifact.model_copy(update={"version": "n" * 60})
    monkeypatch.setattr(verifier, "artifact", long)
    summary = write_recalibrated(verifier, MODEL, tmp_path / "long", cal, data=data, holdout=0)
    assert len(summary["verifier_out"]) == 64
    assert summary["verifier_out"].startswith("n" * 51 + "+cal-")
    assert load_artifact(tmp_path / "long").version == summary["verifier_out"]

    def broken(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sidecar.lab.verifier.recalibrate.save_artifact", broken)
    out = tmp_path / "mine"
    with pytest.raises(OSError, match="No space"):
        write_recalibrated(verifier, MODEL, out, cal, data=data, holdout=0)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_recalibrated_verifier_keeps_no_numbers_of_the_calibration_it_replaces(
    tmp_path: Path,
) -> None:
    verifier = OnnxVerifier.load(MODEL)
    items = [PairItem(str(r["claim"]), str(r["evidence"]), int(r["label"])) for r in _pairs(3)]  # type: ignore[call-overload]
    feats = pair_features(verifier, items)
    data = _write(tmp_path / "pairs.jsonl", _pairs(3))
    first = recalibrate(verifier, feats, feats, items, target_precision=0.8)
    write_recalibrated(verifier, MODEL, tmp_path / "one", first, data=data, holdout=0.5)
    assert "recalibration/held-out/after" in load_artifact(tmp_path / "one").metrics
    again = OnnxVerifier.load(tmp_path / "one")
    empty = _features(np.zeros(0), np.zeros(0))
    second = recalibrate(again, feats, empty, [], target_precision=0.8)  # --holdout 0
    summary = write_recalibrated(
        again, tmp_path / "one", tmp_path / "two", second, data=data, holdout=0
    )
    written = load_artifact(tmp_path / "two")
    assert summary["verifier_out"].count("+cal-") == 1
    assert written.metrics["recalibration"]["from_version"] == again.version
    assert not [k for k in written.metrics if k.startswith("recalibration/")]


def test_a_fit_part_that_cannot_be_fitted_is_refused_before_scoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_scoring(*_: object, **__: object) -> None:
        raise AssertionError("scored pairs that cannot be fitted")

    monkeypatch.setattr("sidecar.lab.verifier.recalibrate.pair_features", no_scoring)
    monkeypatch.setattr("sidecar.claims.verifier.OnnxVerifier.load", no_scoring)
    one_label = [r for r in _pairs(6) if r["label"] == 1]
    no_evidence = [dict(r, evidence=" ") for r in _pairs(6)]
    for rows, holdout, says in (
        (one_label, "0", "24 with evidence (24 supported): add pairs of both labels"),
        (no_evidence, "0", "0 with evidence (0 supported) and 48 with empty evidence"),
        (_pairs(2), "0.9", "or lower --holdout"),
    ):
        data = _write(tmp_path / "pairs.jsonl", rows)
        argv = ["calibrate", "verifier", "--data", str(data), "--model", str(MODEL)]
        assert main([*argv, "--out", str(tmp_path / "mine"), "--holdout", holdout]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        # one error line (after the warning about repeated lines, where they repeat)
        assert says in lines[-1] and all("warning" in line for line in lines[:-1]), lines


def test_repeated_lines_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _pairs(2)
    data = _write(tmp_path / "pairs.jsonl", rows + rows[:5])
    argv = ["calibrate", "verifier", "--data", str(data), "--out", str(tmp_path / "o")]
    assert main([*argv, "--model", str(MODEL), "--holdout", "0", "--json"]) == 0
    assert "5 of 21 pairs repeat an earlier line" in capsys.readouterr().err


def test_out_as_the_current_directory_is_refused_before_scoring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--out .`` in an empty directory passed the check, then failed after the scoring:
    the staging directory was made inside "." and renamed onto it (OSError EBUSY)."""
    from sidecar.lab.verifier.recalibrate import check_out

    here = tmp_path / "empty"
    here.mkdir()
    monkeypatch.chdir(here)
    for out in (Path(), here):
        with pytest.raises(ConfigError, match="current directory"):
            check_out(out, MODEL)
    assert list(here.iterdir()) == []
