"""The guarded import of torch and transformers for verifier training (names the extra to install).

Every training module imports torch from here, so a runtime image without
the ``[ml]`` extra fails with one :class:`~sidecar.exceptions.ConfigError`
that says what to install, whichever module is imported first.
"""

from __future__ import annotations

from sidecar.exceptions import ConfigError

try:
    import torch
    from torch import nn
    from torch.jit._trace import TracerWarning
    from transformers import BertModel
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ConfigError(
        "verifier training needs torch and transformers: pip install 'rag-guardrail-sidecar[ml]'"
    ) from _exc

__all__ = ["BertModel", "TracerWarning", "nn", "torch"]
