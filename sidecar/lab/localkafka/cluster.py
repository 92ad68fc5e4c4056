"""A KRaft cluster of several combined nodes on this machine, as production runs Kafka.

One :class:`LocalKafka` per node (its own directory, client and controller ports), all
formatted with one cluster id and the same static voter set, every node a voter: with
three, the cluster serves while any two run, so one node at a time can be restarted (a
rolling restart) or killed. Topics and the cluster's internal topics are replicated on
every node (``default.replication.factor``) and a write needs two in-sync replicas
(``min.insync.replicas=2``), a production cluster's usual settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sidecar.exceptions import ConfigError, LocalKafkaError
from sidecar.lab.localkafka.broker import LocalKafka, free_port, new_cluster_id

__all__ = ["LocalKafkaCluster"]


def _replicated(size: int) -> str:
    """Server properties that replicate every topic on ``size`` nodes (later lines of a
    properties file override the single node's defaults above them)."""
    isr = min(2, size)
    return "\n".join(
        (
            f"default.replication.factor={size}",
            f"min.insync.replicas={isr}",
            f"offsets.topic.replication.factor={size}",
            f"transaction.state.log.replication.factor={size}",
            f"transaction.state.log.min.isr={isr}",
            f"share.coordinator.state.topic.replication.factor={size}",
            f"share.coordinator.state.topic.min.isr={isr}",
        )
    )


@dataclass
class LocalKafkaCluster:
    """``size`` combined broker + controller nodes under ``root`` (``node-1`` ...)."""

    root: Path
    lib_dir: Path
    size: int = 3
    heap_mb: int = 512
    extra_properties: str = ""
    nodes: list[LocalKafka] = field(init=False)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"a cluster has at least one node, got size={self.size}")
        ports: list[int] = []
        while len(ports) < 2 * self.size:
            port = free_port()
            if port not in ports:
                ports.append(port)
        client, controller = ports[: self.size], ports[self.size :]
        voters = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(controller))
        cluster_id = new_cluster_id()
        properties = f"{_replicated(self.size)}\n{self.extra_properties}"
        self.nodes = [
            LocalKafka(
                self.root / f"node-{i + 1}",
                self.lib_dir,
                port=client[i],
                controller_port=controller[i],
                heap_mb=self.heap_mb,
                extra_properties=properties,
                node_id=i + 1,
                voters=voters,
                cluster_id=cluster_id,
            )
            for i in range(self.size)
        ]

    @property
    def bootstrap_servers(self) -> str:
        """Every node's client address, as a client of a production cluster lists them."""
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id - 1]

    def start(self, timeout_s: float = 120.0) -> None:
        """Launch every node, then wait for each to serve (no node serves alone: the voters
        elect a leader once a majority runs). On failure, every node is stopped."""
        try:
            launched = [(node, node.launch()) for node in self.nodes]
            for node, before in launched:
                if before is not None:
                    node.await_ready(before, timeout_s)
        except LocalKafkaError:
            self.stop()
            raise

    def restart(self, node_id: int, *, kill: bool = False, timeout_s: float = 120.0) -> None:
        """Stop one node (SIGTERM: a controlled shutdown that hands its leaderships over
        first; ``kill``: SIGKILL) and start it again on its data."""
        node = self.node(node_id)
        node.stop(kill=kill)
        node.start(timeout_s)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
