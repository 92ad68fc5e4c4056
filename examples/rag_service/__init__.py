"""A reference RAG service that publishes to the guardrail sidecar and applies its verdicts.

``python -m examples.rag_service`` serves it; ``make demo-service`` runs it with a
real broker and the sidecar (:mod:`examples.rag_service.demo`).
"""
