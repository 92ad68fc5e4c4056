"""Record keys and partitions: a request's events are keyed by its id, hashed with murmur2."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner, murmur2


def request_key(request_id: str) -> bytes:
    """The Kafka key of every event of a request: its id, UTF-8."""
    return request_id.encode("utf-8")


def partition_for(request_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (Java, aiokafka, librdkafka ``murmur2_random``)
    gives a keyed record: ``(murmur2(key) & 0x7fffffff) % partitions``."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    hashed: int = murmur2(request_key(request_id))
    return (hashed & 0x7FFFFFFF) % partitions


def is_murmur2_partitioner(partitioner: object) -> bool:
    """True for aiokafka's default partitioner (the class or an instance of it)."""
    return partitioner is DefaultPartitioner or isinstance(partitioner, DefaultPartitioner)
