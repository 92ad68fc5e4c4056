"""The client's start refusal names the grant; with mutual TLS, where its principal comes from."""

from __future__ import annotations

import pytest

from guardrail_client.authorised import DESCRIBE, READ, WRITE
from guardrail_client.exceptions import MTLS_PRINCIPAL, ClientBrokerError, require_authorised

TOPIC = "rag.generation"
DESCRIBE_ONLY = 1 << DESCRIBE  # the authorised-operations field: Describe, not Write


@pytest.mark.parametrize(
    ("options", "principal", "hint"),
    [
        ({"security_protocol": "SASL_SSL", "sasl_plain_username": "llm"}, "User:llm", False),
        ({"security_protocol": "SSL"}, "User:PRINCIPAL", True),
        ({"security_protocol": "PLAINTEXT"}, "User:PRINCIPAL", False),
    ],
)
def test_a_refusal_names_the_principal_and_with_mtls_where_it_comes_from(
    options: dict[str, str], principal: str, hint: bool
) -> None:
    with pytest.raises(ClientBrokerError) as refused:
        require_authorised(
            {TOPIC: WRITE},
            [TOPIC],
            {TOPIC: DESCRIBE_ONLY},
            {"bootstrap_servers": "b:9093", **options},
        )
    said = str(refused.value)
    assert f"({principal}) Write on topic {TOPIC}" in said
    assert f"--allow-principal {principal} --operation Write --topic {TOPIC}" in said
    assert (MTLS_PRINCIPAL in said) is hint


def test_a_granted_operation_is_not_refused() -> None:
    require_authorised(
        {TOPIC: READ}, [TOPIC], {TOPIC: 1 << READ | 1 << DESCRIBE}, {"bootstrap_servers": "b:9093"}
    )
