"""A Kafka-native guardrail sidecar for retrieval-augmented LLM services."""

__version__ = "0.1.0"
