"""Mutual TLS on a broker that authorises: the sidecar names its certificate's principal.

With ``security_protocol=SSL`` the cluster knows a client by its certificate's subject
(``ssl.principal.mapping.rules=DEFAULT``: Java's ``X500Principal.getName()``), and the
start check, ``topics acls`` and every refusal printed ``User:PRINCIPAL`` for the user to
work out. The principal is now read from the certificate; this test grants exactly the
ACLs printed for it, on a real broker, with a subject that needs escaping (a comma, an
equals sign, a ``#``), and the cluster then grants every one.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.permissions import (
    certificate_principal,
    check_permissions,
    lacking_needs,
    needs,
    principal_hint,
)
from sidecar.kafka.topics import create_topics, started_admin
from sidecar.lab.localkafka.acls import AUTHORIZER_PROPERTIES, Acl, Operation, Resource, create_acls
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from tests.conftest import kafka_lib
from tests.kafka.test_tls import _ca, _keystore, _openssl, _signed, broker_tls

pytestmark = pytest.mark.connected

SUBJECT = "/C=US/O=Acme, Inc./OU=rag=ops #1/CN=guardrail-sidecar"
PRINCIPAL = r"User:CN=guardrail-sidecar,OU=rag\=ops \#1,O=Acme\, Inc.,C=US"


@dataclass(frozen=True)
class MtlsBroker:
    broker: LocalKafka
    certs: Path
    mtls: str


@pytest.fixture(scope="module")
def mtls_acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsBroker]:
    certs = tmp_path_factory.mktemp("mtls-acl-certs")
    _ca(certs, "ca")
    _signed(certs, "broker", "IP:127.0.0.1,DNS:localhost")
    _signed(certs, "client", "DNS:guardrail-client", subject=SUBJECT)
    store = _keystore(certs, "broker")
    instance = tmp_path_factory.mktemp("kafka-mtls-acl")
    port, controller, mtls = free_port(), free_port(), free_port()
    listeners = (
        f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},MTLS://127.0.0.1:{mtls}"
    )
    extra = f"""{AUTHORIZER_PROPERTIES}
listeners={listeners}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},MTLS://127.0.0.1:{mtls}
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,MTLS:SSL
{broker_tls(store, certs)}
"""
    broker = LocalKafka(
        instance, kafka_lib(), port=port, controller_port=controller, extra_properties=extra
    )
    broker.start()
    try:
        yield MtlsBroker(broker, certs, f"127.0.0.1:{mtls}")
    finally:
        broker.stop()
        shutil.rmtree(instance, ignore_errors=True)


async def test_the_certificates_principal_is_named_and_its_printed_grants_are_enough(
    mtls_acl_broker: MtlsBroker, unique_topics: dict[str, str]
) -> None:
    certs = mtls_acl_broker.certs
    topics = {k: v for k, v in unique_topics.items() if k != "group"}
    settings = Settings.load(
        kafka={
            "bootstrap_servers": mtls_acl_broker.mtls,
            "security_protocol": "SSL",
            "ssl_cafile": str(certs / "ca.pem"),
            "ssl_certfile": str(certs / "client.pem"),
            "ssl_keyfile": str(certs / "client.key"),
            "group_id": unique_topics["group"],
        },
        topics=topics,
    )
    assert principal_hint(settings) == PRINCIPAL
    plaintext = mtls_acl_broker.broker.bootstrap_servers  # a super user: the operator
    await create_topics(Settings.load(kafka={"bootstrap_servers": plaintext}, topics=topics))
    flags = {"claims": False, "reports": True, "certificates": True, "warm_start": True}
    admin = await started_admin(settings.kafka)
    try:
        with pytest.raises(ConfigError) as refused:
            await check_permissions(settings, admin, **flags)
        assert f"--allow-principal '{PRINCIPAL}' --operation Read --group" in str(refused.value)
        # what the refusal told the operator to grant, granted as it names the principal
        wanted = needs(settings, **flags)
        await create_acls(
            plaintext,
            [
                Acl(PRINCIPAL, Resource[n.resource.upper()], n.name, Operation(n.operation))
                for n in wanted
            ],
        )
        assert await lacking_needs(settings, admin, wanted) == []
        assert await check_permissions(settings, admin, **flags) == []
    finally:
        await admin.close()


def test_a_subject_java_writes_with_an_oid_names_no_principal(tmp_path: Path) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "k.pem", "-out",
             "c.pem", "-days", "1", "-subj", "/CN=x/emailAddress=ops@example.com",
             cwd=tmp_path)  # fmt: skip
    assert certificate_principal(str(tmp_path / "c.pem")) is None
    assert certificate_principal(str(tmp_path / "missing.pem")) is None
    assert certificate_principal(str(tmp_path / "k.pem")) is None  # a key, not a certificate
