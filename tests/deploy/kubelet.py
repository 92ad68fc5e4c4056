"""What the kubelet puts in a container's environment for the Services of its namespace.

A re-statement of Kubernetes' ``pkg/kubelet/envvars`` (``FromServices`` and
``makeLinkVariables``), as documented under "Discovering services /
Environment variables": for each Service with a cluster IP, named ``SVC``
upper-cased with ``-`` -> ``_``:

* ``SVC_SERVICE_HOST`` (the cluster IP), ``SVC_SERVICE_PORT`` (the first port)
  and ``SVC_SERVICE_PORT_<PORT NAME>`` for every named port;
* the Docker-link variables: ``SVC_PORT=<proto>://<ip>:<first port>`` and, per
  port, ``SVC_PORT_<n>_<PROTO>`` (the same URL) with ``_PROTO``, ``_PORT`` and
  ``_ADDR``. IPv6 addresses are bracketed in URLs (Go's ``net.JoinHostPort``).

Written independently of ``sidecar.config`` so the tests check the sidecar
against the kubelet's behaviour, not against itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServicePort:
    port: int
    name: str = ""
    protocol: str = "TCP"


def env_name(name: str) -> str:
    return name.replace("-", "_").upper()


def service_link_env(service: str, cluster_ip: str, ports: Sequence[ServicePort]) -> dict[str, str]:
    """The variables the kubelet injects for one Service."""
    assert ports, "a Service with a cluster IP has at least one port"
    prefix = env_name(service)
    env = {
        f"{prefix}_SERVICE_HOST": cluster_ip,
        f"{prefix}_SERVICE_PORT": str(ports[0].port),
    }
    for sp in ports:
        if sp.name:
            env[f"{prefix}_SERVICE_PORT_{env_name(sp.name)}"] = str(sp.port)
    host = f"[{cluster_ip}]" if ipaddress.ip_address(cluster_ip).version == 6 else cluster_ip
    for i, sp in enumerate(ports):
        proto = sp.protocol or "TCP"
        url = f"{proto.lower()}://{host}:{sp.port}"
        if i == 0:
            env[f"{prefix}_PORT"] = url
        port_prefix = f"{prefix}_PORT_{sp.port}_{proto.upper()}"
        env[port_prefix] = url
        env[f"{port_prefix}_PROTO"] = proto.lower()
        env[f"{port_prefix}_PORT"] = str(sp.port)
        env[f"{port_prefix}_ADDR"] = cluster_ip
    return env


def services_env(manifests: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The kubelet's variables for every Service among rendered ``manifests``.

    Cluster IPs are made up (10.96.0.10, .11, ...), as the API server would
    allocate them; headless Services (``clusterIP: None``) and ExternalName
    Services get no variables, as in the kubelet.
    """
    env: dict[str, str] = {}
    services = [m for m in manifests if m.get("kind") == "Service"]
    for i, svc in enumerate(services):
        spec = svc.get("spec", {})
        if spec.get("type") == "ExternalName" or spec.get("clusterIP") == "None":
            continue
        ports = [
            ServicePort(int(p["port"]), p.get("name", ""), p.get("protocol", "TCP"))
            for p in spec.get("ports", [])
        ]
        env |= service_link_env(svc["metadata"]["name"], f"10.96.0.{10 + i}", ports)
    return env
