"""The dead-letter topic read back: what is in it (``guardrail dlq inspect``) and what
may be sent again to the topic it came from (``guardrail dlq redrive``). Pure: the
Kafka side is :mod:`sidecar.kafka.dlq`."""
