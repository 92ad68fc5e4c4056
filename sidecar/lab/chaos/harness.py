"""The chaos harness: one broker behind a throttling proxy, fresh topics and sidecars per scenario.

The broker has one extra listener behind a throttling proxy (``proxy.py``): only
the network-stall scenario's sidecar bootstraps there; every other client (the
load generator, the watcher, the other scenarios' sidecars) uses the direct
PLAINTEXT listener and never crosses the proxy.
"""

from __future__ import annotations

import asyncio
import random
import signal
import uuid
from pathlib import Path

import orjson

from sidecar.config import TOPIC_ROLES, JoinSettings, LimitSettings, Settings
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.builder import AttentionShape
from sidecar.lab.chaos.hostile import HostileFactory
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.chaos.proxy import ThrottlingProxy
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port, lib_for

# hostile: limits small enough that records at every limit are cheap to build and send;
# the tenant comes from a trusted header, so another tenant's ids and a missing or
# undecodable header are part of the corpus.
HOSTILE_LIMITS = LimitSettings(
    max_message_bytes=32_768, max_hits=16, max_answer_chars=8_000, max_request_bytes=36_864
)
HOSTILE_JOIN_MAX_BYTES = 262_144  # the join flood (half-requests of ~31 KB) crosses it
TENANT_HEADER = "x-tenant"


def _hostile_env(limits: LimitSettings) -> dict[str, str]:
    env = {f"GUARDRAIL_LIMITS__{k.upper()}": str(v) for k, v in limits.model_dump().items()}
    return env | {"GUARDRAIL_TENANCY__SOURCE": "header", "GUARDRAIL_TENANCY__HEADER": TENANT_HEADER}


def _join_of(env: dict[str, str]) -> JoinSettings:
    """The join settings a sidecar started with ``env`` runs with (for the wedge threshold)."""
    return JoinSettings(
        ttl_ms=int(env["GUARDRAIL_JOIN__TTL_MS"]),
        sweep_interval_ms=int(env["GUARDRAIL_JOIN__SWEEP_INTERVAL_MS"]),
    )


def _attention_shape(settings: Settings) -> AttentionShape | None:
    """The served lookback model's summary shape (its metadata.json), if it is on."""
    if not settings.signals.lookback:
        return None
    meta = Path(settings.models.dir) / settings.signals.lookback_model / "metadata.json"
    try:
        m = orjson.loads(meta.read_bytes())
    except OSError:
        return None
    return AttentionShape(m["generator_model"], m["layers"], m["heads"], m["chunks"])


class Chaos:
    """Owns the broker and runs scenarios, each on fresh topics."""

    def __init__(self, workdir: Path, seed: int = 7, quick: bool = True) -> None:
        self.workdir = workdir
        self.rng = random.Random(seed)  # noqa: S311 - reproducible fault timing
        self.quick = quick
        lib = ensure_jars(lib_for(default_home()))
        proxied = free_port()
        self.proxy = ThrottlingProxy(upstream_port=proxied)
        self.broker = LocalKafka(
            workdir / "broker",
            lib,
            port=free_port(),
            controller_port=free_port(),
            proxied_port=proxied,
            proxied_advertised_port=self.proxy.port,
        )
        self._live: list[SidecarProcess] = []

    def __enter__(self) -> Chaos:
        self.proxy.start()
        try:
            self.broker.start()
        except BaseException:
            self.proxy.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for p in self._live:
                if p.pid is not None:
                    p.signal(signal.SIGKILL)
            self.broker.stop()
        finally:
            self.proxy.close()

    # ------------------------------------------------------------------ plumbing

    def settings(self) -> tuple[Settings, dict[str, str]]:
        """Fresh topics and group: the settings to drive them, and the sidecar's environment."""
        suffix = uuid.uuid4().hex[:8]
        topics = {n: f"chaos.{suffix}.{n}" for n in TOPIC_ROLES}
        settings = Settings.load(
            kafka={
                "bootstrap_servers": self.broker.bootstrap_servers,
                "group_id": f"chaos.{suffix}",
            },
            topics={**topics, "partitions": 3},
        )
        env = {
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": self.broker.bootstrap_servers,
            "GUARDRAIL_KAFKA__GROUP_ID": f"chaos.{suffix}",
            "GUARDRAIL_JOIN__TTL_MS": "3000",
            "GUARDRAIL_JOIN__SWEEP_INTERVAL_MS": "200",
            **{f"GUARDRAIL_TOPICS__{n.upper()}": v for n, v in topics.items()},
        }
        return settings, env

    def sidecar(self, env: dict[str, str], name: str) -> SidecarProcess:
        """A sidecar process (not started) that the harness kills on exit."""
        p = SidecarProcess(env, self.workdir / f"{name}.log")
        self._live.append(p)
        return p

    async def hostile_sidecar(
        self, name: str, join_env: dict[str, str]
    ) -> tuple[Settings, JoinSettings, SidecarProcess, HostileFactory]:
        """Fresh topics and a ready sidecar with the hostile limits and header tenancy."""
        settings, env = self.settings()
        env |= _hostile_env(HOSTILE_LIMITS) | join_env
        await create_topics(settings)
        side = self.sidecar(env, name)
        await asyncio.to_thread(side.start)
        factory = HostileFactory(
            settings.topics,
            HOSTILE_LIMITS,
            tenant_header=TENANT_HEADER,
            attention=_attention_shape(settings),
            seed=self.rng.randrange(2**31),
        )
        return settings, _join_of(env), side, factory
