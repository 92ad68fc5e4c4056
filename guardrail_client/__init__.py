"""The LLM service's side of the guardrail: what a service imports to feed the sidecar.

- :mod:`guardrail_client.hf` -- ``LookbackRecorder``: the ``AttentionSummary`` of a
  Hugging Face causal LM's ``generate()`` (needs the ``ml`` extra: torch, transformers).

Nothing is imported here eagerly, so ``import guardrail_client`` never pulls torch.
"""
