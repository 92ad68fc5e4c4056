"""A Kafka-native guardrail sidecar for retrieval-augmented LLM services."""

import os

__version__ = "0.1.0"

# onnxruntime (1.32 measured) starts its usage telemetry with its first session: a device
# id and an event database written under $HOME/.cache/Microsoft/DeveloperTools/. A
# sidecar writes nothing of the sort and reports to no one but its own telemetry, so it
# is off unless the deployment sets the variable itself. It is read when onnxruntime
# is imported: here, before any module of the package imports it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
