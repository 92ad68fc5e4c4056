"""A real Apache Kafka broker for development, tests, the demo and benchmarks.

Jars come from Maven Central through the project's own pom; the broker runs as a
single KRaft node (broker + controller) with plain ``java``. No Docker.
"""

from sidecar.lab.localkafka.broker import (
    KAFKA_VERSION,
    LocalKafka,
    default_home,
    ensure_jars,
    kafka_version,
    lib_for,
)

__all__ = [
    "KAFKA_VERSION",
    "LocalKafka",
    "default_home",
    "ensure_jars",
    "kafka_version",
    "lib_for",
]
