"""The verifier artifact's metadata (``verifier.json``): a versioned pydantic document.

It says what the ONNX file is (base model, inputs, max length, quantisation,
sha256, whether the first segment carries the user's question), how its logit
becomes a label (Platt scaling with lexical coverage, the uncertain band; see
:mod:`sidecar.claims.calibration`), what it was trained on (sources, split
rule, counts, a hash of the training pairs, seed) and how well it does on
held-out data (the model card's numbers), and the golden outputs: a few
(claim, evidence, question) inputs with the logits the export computed
(:mod:`sidecar.golden`). The serving adapter refuses a file whose sha256
differs from the document, or whose golden logits drift on this CPU. Parsing
is pure; reading the file is in :mod:`sidecar.claims.verifier`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sidecar.claims.calibration import Band, Platt
from sidecar.exceptions import ConfigError
from sidecar.golden import GoldenOutputs

__all__ = [
    "ARTIFACT_KIND",
    "GOLDEN_INPUTS",
    "SCHEMA_VERSION",
    "GoldenPair",
    "PrecisionBand",
    "VerifierArtifact",
    "VerifierData",
]

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


class GoldenPair(_Model):
    """A golden input of the verifier: what :meth:`OnnxVerifier.logits` reads for one pair."""

    claim: str
    evidence: str
    question: str = ""


_LONG_EVIDENCE = (
    "Frankenstein; or, The Modern Prometheus is an 1818 novel written by English author Mary "
    "Shelley. Frankenstein tells the story of Victor Frankenstein, a young scientist who creates "
    "a sapient creature in an unorthodox scientific experiment. Shelley started writing the "
    "story when she was 18, and the first edition was published anonymously in London on 1 "
    "January 1818, when she was 20. Her name first appeared in the second edition, which was "
    "published in Paris in 1821. Shelley travelled through Europe in 1814, journeying along the "
    "river Rhine in Germany, and stopping in Gernsheim, which is 17 kilometres away from "
    "Frankenstein Castle, where, about a century earlier, an alchemist had engaged in "
    "experiments. She then journeyed to the region of Geneva, Switzerland, where much of the "
    "story takes place."
)

# Fixed inputs for the golden logits: supported and unsupported claims, with and without the
# question, one whose evidence is truncated to max_length, and an empty evidence.
GOLDEN_INPUTS: Final = (
    GoldenPair(
        claim="Mary Shelley wrote Frankenstein.",
        evidence="Frankenstein; or, The Modern Prometheus is an 1818 novel written by English "
        "author Mary Shelley.",
        question="who wrote the novel frankenstein",
    ),
    GoldenPair(
        claim="Frankenstein was first published in 1823.",
        evidence=_LONG_EVIDENCE,
        question="when was frankenstein first published",
    ),
    GoldenPair(
        claim="Her name first appeared in the second edition, published in Paris in 1821.",
        evidence=_LONG_EVIDENCE,
    ),
    GoldenPair(
        claim="The Eiffel Tower stands in Berlin.",
        evidence="The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in "
        "Paris, France. It is named after the engineer Gustave Eiffel.",
        question="where is the eiffel tower",
    ),
    GoldenPair(
        claim="Water boils at 100 °C at sea level.",
        evidence="At standard atmospheric pressure, water boils at 100 degrees Celsius (212 °F).",
    ),
    GoldenPair(claim="The treaty was signed by 12 countries.", evidence=""),
)


class PrecisionBand(_Model):
    """The uncertain band fitted on the validation pairs for one target precision."""

    target_precision: float = Field(ge=0.5, lt=1.0)
    unsupported_below: float = Field(ge=0.0, le=1.0)
    supported_from: float = Field(ge=0.0, le=1.0)
    uncertain_share: float = Field(ge=0.0, le=1.0, description="of the validation pairs")

    @property
    def band(self) -> Band:
        return Band(self.unsupported_below, self.supported_from)


class VerifierArtifact(_Model):
    schema_version: Literal[1] = 1
    kind: Literal["claim-verifier"] = "claim-verifier"
    version: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    base_model: str
    onnx_file: str
    onnx_sha256: Sha256
    # int8-weights: int8 weights computed in fp32 (sidecar.lab.verifier.quantization); int8-dynamic:
    # u8 x s8 integer products, whose outputs depend on the CPU (artifacts before that).
    quantization: Literal["none", "int8-weights", "int8-dynamic"]
    tokenizer_file: str
    max_length: int = Field(ge=16, le=512)
    inputs: list[str]
    logit_scale: float = Field(allow_inf_nan=False)
    coverage_weight: float = Field(allow_inf_nan=False)
    bias: float = Field(allow_inf_nan=False)
    unsupported_below: float = Field(ge=0.0, le=1.0)
    supported_from: float = Field(ge=0.0, le=1.0)
    # The target precision the band above was fitted for, and the bands fitted on the same
    # validation pairs for other targets, which GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION
    # chooses from at start (artifacts written before they existed have neither).
    target_precision: float | None = Field(default=None, ge=0.5, lt=1.0)
    bands: list[PrecisionBand] = Field(default_factory=list, max_length=32)
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
    # The logits of GOLDEN_INPUTS-like pairs at export, checked when the model is loaded
    # (None: an artifact written before golden outputs existed; it loads with a warning).
    golden: GoldenOutputs[GoldenPair] | None = None
    created_at: datetime

    @property
    def band(self) -> Band:
        return Band(self.unsupported_below, self.supported_from)

    def band_for(self, target_precision: float | None) -> Band:
        """The band fitted for ``target_precision`` (None: the artifact's own band)."""
        if target_precision is None or target_precision == self.target_precision:
            return self.band
        for entry in self.bands:
            if abs(entry.target_precision - target_precision) < 1e-9:
                return entry.band
        offered = ", ".join(f"{b.target_precision:g}" for b in self.bands)
        raise ConfigError(
            f"GUARDRAIL_SIGNALS__VERIFIER_TARGET_PRECISION={target_precision:g}: the claim "
            f"verifier {self.version} has no band fitted for it; "
            + (
                f"it has bands for {offered} (unset: its own band, fitted for "
                f"{self.target_precision:g})"
                if self.bands and self.target_precision is not None
                else f"it has bands for {offered}"
                if self.bands
                else "it was exported with one band only; unset the setting, or re-export it "
                "with guardrail train verifier --export"
            )
        )

    def served_version(self, target_precision: float | None) -> str:
        """The version claim verdicts name: ``+p<target>`` when another band than its own."""
        if target_precision is None or target_precision == self.target_precision:
            return self.version
        return f"{self.version}+p{target_precision:g}"

    @property
    def platt(self) -> Platt:
        return Platt(self.logit_scale, self.coverage_weight, self.bias)
