"""The pairwise ranking term, its group-keeping batches, and starting from a finished run."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the [ml] extra (torch) trains the verifier")
transformers = pytest.importorskip("transformers", reason="the [ml] extra trains the verifier")

from sidecar.exceptions import ConfigError  # noqa: E402
from sidecar.lab.verifier.checkpoints import Checkpoints  # noqa: E402
from sidecar.lab.verifier.settings import TrainConfig  # noqa: E402
from sidecar.lab.verifier.sources import Pair  # noqa: E402
from sidecar.lab.verifier.trainer import (  # noqa: E402
    VerifierTrainer,
    _group_batches,
    pairwise_loss,
)
from tests.lab.verifier.conftest import small_config  # noqa: E402


def _pair(group: str, label: int, claim: str = "a claim", evidence: str = "some evidence") -> Pair:
    return Pair(claim, evidence, label, "k", "test", group, "")


def test_group_batches_keep_every_group_whole_and_every_pair_once() -> None:
    rng = random.Random(0)
    pairs = [
        _pair(f"g{g}", k % 2, claim="x" * rng.randrange(5, 200))
        for g in range(300)
        for k in range(rng.randrange(1, 4))
    ]
    batches = _group_batches(pairs, 8, random.Random(1))
    assert sorted(map(id, (p for b in batches for p in b))) == sorted(map(id, pairs))
    assert all(1 <= len(b) <= 8 for b in batches)
    home = {p.group: i for i, b in enumerate(batches) for p in b}
    assert all(home[p.group] == i for i, b in enumerate(batches) for p in b)
    assert sum(map(len, batches)) / len(batches) > 6  # packed, not one group per batch
    again = _group_batches(pairs, 8, random.Random(1))
    assert [[id(p) for p in b] for b in again] == [[id(p) for p in b] for b in batches]


def test_a_group_larger_than_a_batch_is_cut() -> None:
    pairs = [_pair("big", k % 2) for k in range(11)] + [_pair("small", 1)]
    batches = _group_batches(pairs, 4, random.Random(0))
    assert Counter(p.group for b in batches for p in b) == {"big": 11, "small": 1}
    assert all(len(b) <= 4 for b in batches)


def test_pairwise_loss_is_softplus_of_wrong_minus_right_per_group() -> None:
    batch = [_pair("a", 1), _pair("a", 0), _pair("a", 0), _pair("b", 1), _pair("c", 0)]
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 9.0], requires_grad=True)
    loss = pairwise_loss(logits, batch)
    sp = torch.nn.functional.softplus
    expected = (sp(torch.tensor(-1.0 - 2.0)) + sp(torch.tensor(0.5 - 2.0))) / 2
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6)
    loss.backward()
    grad = logits.grad
    assert grad is not None
    assert grad[0] < 0 and grad[1] > 0 and grad[2] > 0  # descent: right up, wrong down
    assert grad[3] == 0 and grad[4] == 0  # no contrasting partner: untouched


def test_pairwise_loss_without_a_contrasting_group_is_a_zero_that_adds() -> None:
    logits = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = pairwise_loss(logits, [_pair("a", 1), _pair("b", 0)])
    assert float(loss.detach()) == 0.0
    loss.backward()  # still part of the graph


def _pairs() -> list[Pair]:
    facts = [
        ("Paris is the capital of France.", "Paris is the capital and largest city of France."),
        ("The treaty was signed in 1919.", "The Treaty of Versailles was signed in 1919."),
        ("Nolan directed Inception.", "Inception is a 2010 film directed by Christopher Nolan."),
    ]
    out = []
    for k, (claim, evidence) in enumerate(facts * 4):
        wrong = facts[(k + 1) % len(facts)][0]
        out.append(Pair(claim, evidence, 1, "right", "test", f"g{k}", "Which?"))
        out.append(Pair(wrong, evidence, 0, "wrong", "test", f"g{k}", "Which?"))
    return out


def _config(base: Path, work: Path, **changes: object) -> TrainConfig:
    return small_config(base, work, epochs=1, **changes)


def test_a_pairwise_run_starts_from_a_finished_runs_network_and_records_it(
    tiny_base: Path, tmp_path: Path
) -> None:
    first = VerifierTrainer(_config(tiny_base, tmp_path / "one")).fit(_pairs())
    finished = Checkpoints(tmp_path / "one" / "checkpoints").latest()
    assert finished is not None
    config = _config(tiny_base, tmp_path / "two", pairwise_weight=1.0, init_from=finished)
    second = VerifierTrainer(config)
    run = second._prepare(_pairs())
    assert first.model is not None
    for name, value in first.model.state_dict().items():  # the start is the finished network
        assert torch.equal(run.model.state_dict()[name], value), name
    assert run.fingerprint["pairwise_weight"] == "1.0"
    assert run.fingerprint["init_from"] == str(finished)
    assert all(len({p.group for p in b}) * 2 == len(b) for b in run.plan)  # groups kept whole
    second.fit(_pairs())
    assert second.history and second.history[-1]["loss"] > 0
    # the settings are part of the checkpoint: resuming without the pairwise term is refused
    plain = VerifierTrainer(_config(tiny_base, tmp_path / "two", init_from=finished))
    with pytest.raises(ConfigError, match=r"pairwise_weight 1\.0 -> 0\.0"):
        plain.fit(_pairs(), resume=True)


def test_bad_pairwise_settings_fail_at_construction(tiny_base: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pairwise_weight"):
        _config(tiny_base, tmp_path, pairwise_weight=-1.0)
    with pytest.raises(ConfigError, match="init_from"):
        _config(tiny_base, tmp_path, init_from=tmp_path / "missing.pt")
