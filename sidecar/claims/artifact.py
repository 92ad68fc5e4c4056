"""The verifier artifact's metadata (``verifier.json``): a versioned pydantic document.

It says what the ONNX file is (base model, inputs, max length, quantisation,
sha256, whether the first segment carries the user's question), how its logit
becomes a label (Platt scaling with lexical coverage, the uncertain band; see
:mod:`sidecar.claims.calibration`), what it was trained on (sources, split
rule, counts, a hash of the training pairs, seed) and how well it does on
held-out data (the model card's numbers). The serving adapter refuses a file
whose sha256 differs from the document. Parsing is pure; reading the file is
in :mod:`sidecar.claims.verifier`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sidecar.claims.calibration import Band, Platt

__all__ = ["ARTIFACT_KIND", "SCHEMA_VERSION", "VerifierArtifact", "VerifierData"]

SCHEMA_VERSION: Final = 1
ARTIFACT_KIND: Final = "claim-verifier"

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VerifierData(_Model):
    sources: list[str]
    split_rule: str
    n_train: int = Field(ge=0)
    n_val: int = Field(ge=0)
    pairs_sha256: Sha256
    length_auroc_train: float | None = None
    seed: int


class VerifierArtifact(_Model):
    schema_version: Literal[1] = 1
    kind: Literal["claim-verifier"] = "claim-verifier"
    version: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    base_model: str
    onnx_file: str
    onnx_sha256: Sha256
    quantization: Literal["none", "int8-dynamic"]
    tokenizer_file: str
    max_length: int = Field(ge=16, le=512)
    inputs: list[str]
    logit_scale: float = Field(allow_inf_nan=False)
    coverage_weight: float = Field(allow_inf_nan=False)
    bias: float = Field(allow_inf_nan=False)
    unsupported_below: float = Field(ge=0.0, le=1.0)
    supported_from: float = Field(ge=0.0, le=1.0)
    evidence_max_sentences: int = Field(default=3, ge=1)
    evidence_max_chars: int = Field(default=450, ge=50)
    # Long evidence: the claim is scored against up to this many windows of
    # evidence_max_chars each (EvidenceIndex.windows), the best window wins.
    evidence_max_windows: int = Field(default=1, ge=1)
    # Coverage counts only the claim's terms the question does not state
    # (artifacts written before the flag existed count them all).
    coverage_excludes_question: bool = False
    # The network reads "question [SEP] claim" as its first segment (False: the claim alone;
    # artifacts written before the flag existed read the claim alone).
    question_in_input: bool = False
    data: VerifierData
    metrics: dict[str, dict[str, float | int | str]] = Field(default_factory=dict)
    created_at: datetime

    @property
    def band(self) -> Band:
        return Band(self.unsupported_below, self.supported_from)

    @property
    def platt(self) -> Platt:
        return Platt(self.logit_scale, self.coverage_weight, self.bias)
