"""TLS against a real broker: SASL_SSL (SCRAM-SHA-512), mutual TLS, and the refusals.

The broker (``LocalKafka``) gets three TLS listeners beside its PLAINTEXT one, from a CA
made here with openssl: SASL_SSL, MTLS (SSL, client certificate required) and BADHOST
(SSL, a certificate that names another host).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.helpers import create_ssl_context

from guardrail_client import GuardrailPublisher, RetrievalHit, VerdictClient
from sidecar.config import TOPIC_ROLES, Settings
from sidecar.exceptions import BrokerError, ConfigError, SidecarNotReadyError
from sidecar.kafka.topics import create_topics, verify_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import (
    KAFKA_VERSION,
    LocalKafka,
    free_port,
    jars_version,
    major_version,
)
from tests.conftest import kafka_lib

pytestmark = pytest.mark.connected

USER, PASSWORD = "guardrail", "s3cret-Tls-Scram-Pa55"
STORE_PASSWORD = "changeit"  # noqa: S105 - the test broker's PKCS12 keystores
KEY_PASSWORD = "client-Key-Pa55"  # noqa: S105 - an encrypted client key's passphrase


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl is needed to make the test CA"
    subprocess.run([openssl, *args], cwd=cwd, check=True, capture_output=True)


def _signed(d: Path, name: str, san: str, ca: str = "ca", subject: str | None = None) -> None:
    """``name``.pem / .key signed by ``ca``, subject ``/CN=name`` unless ``subject``."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", subject or f"/CN={name}", cwd=d)  # fmt: skip
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
             cwd=d)  # fmt: skip


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=d)  # fmt: skip


def _keystore(d: Path, name: str) -> Path:
    _openssl("pkcs12", "-export", "-in", f"{name}.pem", "-inkey", f"{name}.key", "-certfile",
             "ca.pem", "-name", name, "-out", f"{name}.p12", "-passout",
             f"pass:{STORE_PASSWORD}", cwd=d)  # fmt: skip
    return d / f"{name}.p12"


def broker_tls(store: Path, certs: Path) -> str:
    """The broker's TLS properties: its keystore, the test CA, and client certificates
    required on the MTLS listener."""
    return f"""ssl.keystore.type=PKCS12
ssl.keystore.location={store}
ssl.keystore.password={STORE_PASSWORD}
ssl.truststore.type=PEM
ssl.truststore.location={certs / "ca.pem"}
listener.name.mtls.ssl.client.auth=required"""


@dataclass(frozen=True)
class TlsBroker:
    broker: LocalKafka
    certs: Path
    sasl_ssl: str
    mtls: str
    badhost: str


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    certs = tmp_path_factory.mktemp("tls-certs")
    _ca(certs, "ca")
    _ca(certs, "other-ca")
    _signed(certs, "broker", "IP:127.0.0.1,DNS:localhost")
    _signed(certs, "badhost", "DNS:not-this-host.example")
    _signed(certs, "client", "DNS:guardrail-client")
    broker_store, badhost_store = _keystore(certs, "broker"), _keystore(certs, "badhost")
    instance = tmp_path_factory.mktemp("kafka-tls")
    port, controller = free_port(), free_port()
    ports = {"SASL_SSL": free_port(), "MTLS": free_port(), "BADHOST": free_port()}
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}," + ",".join(
        f"{name}://127.0.0.1:{p}" for name, p in ports.items()
    )
    lib = kafka_lib()
    advertised = listeners
    if (
        major_version(jars_version(lib) or KAFKA_VERSION) < 4
    ):  # 3.7 refuses an advertised controller
        advertised = listeners.replace(f"CONTROLLER://127.0.0.1:{controller},", "")
    module = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    # later keys win in a .properties file: these replace LocalKafka's listener lines
    extra = f"""
listeners={listeners}
advertised.listeners={advertised}
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,BADHOST:SSL
{broker_tls(broker_store, certs)}
listener.name.badhost.ssl.keystore.type=PKCS12
listener.name.badhost.ssl.keystore.location={badhost_store}
listener.name.badhost.ssl.keystore.password={STORE_PASSWORD}
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={module}
"""
    broker = LocalKafka(
        instance,
        lib,
        port=port,
        controller_port=controller,
        extra_properties=extra,
        scram_users={USER: PASSWORD},
    )
    broker.start()
    try:
        at = {name: f"127.0.0.1:{p}" for name, p in ports.items()}
        yield TlsBroker(broker, certs, at["SASL_SSL"], at["MTLS"], at["BADHOST"])
    finally:
        broker.stop()
        shutil.rmtree(instance, ignore_errors=True)


def sasl_ssl_env(tls: TlsBroker, topics: dict[str, str], cafile: Path) -> dict[str, str]:
    return {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": tls.sasl_ssl,
        "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "GUARDRAIL_KAFKA__SSL_CAFILE": str(cafile),
        "GUARDRAIL_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "GUARDRAIL_KAFKA__SASL_USERNAME": USER,
        "GUARDRAIL_KAFKA__SASL_PASSWORD": PASSWORD,
        "GUARDRAIL_KAFKA__GROUP_ID": topics["group"],
        **{f"GUARDRAIL_TOPICS__{n.upper()}": topics[n] for n in TOPIC_ROLES},
    }


async def test_sasl_ssl_sidecar_and_mtls_clients_decide(
    tls_broker: TlsBroker, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """The sidecar on SASL_SSL/SCRAM-SHA-512; the topics, the publisher and the verdict
    client on mutual TLS: every client reaches the broker only through its TLS listeners."""
    certs = tls_broker.certs
    topics = {n: unique_topics[n] for n in TOPIC_ROLES}
    # the topics are made through the mTLS listener with the client key encrypted and its
    # passphrase in the setting (GUARDRAIL_KAFKA__SSL_KEY_PASSWORD)
    _openssl("pkey", "-in", "client.key", "-aes256", "-passout", f"pass:{KEY_PASSWORD}",
             "-out", str(tmp_path / "client-encrypted.key"), cwd=certs)  # fmt: skip
    mtls = {
        "bootstrap_servers": tls_broker.mtls,
        "security_protocol": "SSL",
        "ssl_cafile": str(certs / "ca.pem"),
        "ssl_certfile": str(certs / "client.pem"),
        "ssl_keyfile": str(tmp_path / "client-encrypted.key"),
        "ssl_key_password": KEY_PASSWORD,
    }
    await create_topics(Settings.load(kafka=mtls, topics=topics))
    env = sasl_ssl_env(tls_broker, unique_topics, certs / "ca.pem")
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    await asyncio.to_thread(sidecar.start)
    context = create_ssl_context(
        cafile=str(certs / "ca.pem"),
        certfile=str(certs / "client.pem"),
        keyfile=str(certs / "client.key"),
    )
    client = {"security_protocol": "SSL", "ssl_context": context}
    hits = [RetrievalHit(chunk_id="c1", doc_id="d1", score=0.8, text="Mary Shelley wrote it.")]
    try:
        async with (
            GuardrailPublisher(
                tls_broker.mtls,
                generator_model="m",
                retrieval_topic=topics["retrieval"],
                generation_topic=topics["generation"],
                **client,
            ) as publisher,
            VerdictClient(
                tls_broker.mtls,
                verdicts_topic=topics["verdicts"],
                claims_topic=None,
                on_timeout="raise",
                **client,
            ) as verdicts,
        ):
            verdicts.expect("req-tls")
            await publisher.retrieval(
                "req-tls", "who wrote it", hits, tenant="default", collection="nq-open"
            )
            await publisher.final("req-tls", "Mary Shelley.")
            result = await verdicts.verdict("req-tls", timeout=30)
        assert result.from_sidecar
    finally:
        assert sidecar.signal(signal.SIGTERM) == 0
    consumer = AIOKafkaConsumer(  # the commits went through the TLS listener too
        bootstrap_servers=tls_broker.broker.bootstrap_servers, group_id=None
    )
    await consumer.start()
    try:
        assert await consumer.topics() >= set(topics.values())
    finally:
        await consumer.stop()
    assert PASSWORD not in (tmp_path / "sidecar.log").read_text()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong-ca", "the TLS certificate of Kafka at"),
        ("other-host", "IP address mismatch"),
        ("no-client-cert", "refused this client's TLS certificate"),
        ("untrusted-client-cert", "refused this client's TLS certificate"),
    ],
)
async def test_tls_refusals_are_configuration_errors(
    tls_broker: TlsBroker, case: str, expected: str
) -> None:
    """Refused certificates, either way, say so (audit: 'cannot reach Kafka', retried)."""
    certs = tls_broker.certs
    kafka: dict[str, str] = {"security_protocol": "SSL", "ssl_cafile": str(certs / "ca.pem")}
    if case == "wrong-ca":
        kafka |= {"bootstrap_servers": tls_broker.mtls, "ssl_cafile": str(certs / "other-ca.pem")}
    elif case == "other-host":
        kafka |= {"bootstrap_servers": tls_broker.badhost}
    elif case == "no-client-cert":
        kafka |= {"bootstrap_servers": tls_broker.mtls}
    else:
        kafka |= {
            "bootstrap_servers": tls_broker.mtls,
            "ssl_certfile": str(certs / "other-ca.pem"),
            "ssl_keyfile": str(certs / "other-ca.key"),
        }
    settings = Settings.load(kafka=kafka)
    with pytest.raises(ConfigError, match=expected) as caught:
        await verify_topics(settings)
    assert "GUARDRAIL_KAFKA__SSL_C" in str(caught.value)
    with pytest.raises(ConfigError, match=expected):  # guardrail topics create
        await create_topics(settings)


def test_wrong_ca_ends_the_start_even_when_waiting_for_kafka(
    tls_broker: TlsBroker, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    env = sasl_ssl_env(tls_broker, unique_topics, tls_broker.certs / "other-ca.pem")
    env["GUARDRAIL_KAFKA__WAIT_AT_START"] = "true"  # the chart's inject mode
    sidecar = SidecarProcess(env, tmp_path / "bad.log")
    with pytest.raises(SidecarNotReadyError):
        sidecar.start(timeout_s=30)
    if sidecar.pid is not None:
        sidecar.signal(signal.SIGKILL)
    log = (tmp_path / "bad.log").read_text()
    assert "CERTIFICATE_VERIFY_FAILED" in log and "GUARDRAIL_KAFKA__SSL_CAFILE" in log, log
    assert "trying again" not in log, log
    assert sidecar.proc is not None and sidecar.proc.returncode == 2  # a configuration error


async def test_a_plaintext_client_at_a_tls_listener_is_told_which_protocol_it_spoke(
    tls_broker: TlsBroker,
) -> None:
    """The listener closes the connection without a word (audit: "Connection ... closed",
    nothing naming the protocol): the error says which one this client spoke."""
    settings = Settings.load(
        kafka={"bootstrap_servers": tls_broker.mtls, "request_timeout_ms": 3000}
    )
    with pytest.raises(BrokerError, match="__SECURITY_PROTOCOL=PLAINTEXT: the listener"):
        await verify_topics(settings)
    with pytest.raises(BrokerError, match="__SECURITY_PROTOCOL=PLAINTEXT: the listener"):
        await create_topics(settings)
