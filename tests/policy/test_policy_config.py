"""The policy YAML: the shipped default loads; wrong documents say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli.main import main
from sidecar.exceptions import ConfigError
from sidecar.policy.config import load_policy, parse_policy

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "models" / "policy" / "default.yaml"

MINIMAL = """
name: test
default_profile: general
profiles:
  general: {max_hallucination_rate: 0.3}
"""


def test_the_shipped_default_has_the_seed002_profiles() -> None:
    config = load_policy(DEFAULT)
    rates = {name: p.max_hallucination_rate for name, p in config.profiles.items()}
    assert rates == {"medical": 0.05, "enterprise": 0.20, "general": 0.30, "nq-open": 0.30}
    assert config.profiles["medical"].strict
    assert config.default_profile == "enterprise"


def test_the_shipped_nq_open_profile_uses_its_certificate() -> None:
    from sidecar.policy.engine import PolicyEngine

    engine = PolicyEngine.from_file(DEFAULT)
    assert engine.config.collections == {"nq-open": "nq-open"}
    cert = engine.certified["nq-open"].certificate
    assert cert.certified and cert.key == "default/nq-open/qdrant-minilm-l6"
    assert cert.scope is not None and cert.scope.profile == "nq-open"
    # the profile decides as fitted: the error among the calibration answers it allows
    # is below the certified risk (Learn then Test rejected H0 there)
    assert cert.error_rate_allowed is not None and cert.error_rate_allowed < cert.risk
    assert cert.allowed > 0 and cert.p_value is not None and cert.p_value <= cert.delta


def test_the_shipped_nq_open_profile_has_a_certificate_for_claims_on_and_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The default policy still allows certified answers with claim checks switched on."""
    from sidecar.policy.engine import PolicyEngine

    engine = PolicyEngine.from_file(DEFAULT)
    listed = engine.certified["nq-open"].listed
    assert [e.path.name for e in listed] == ["nq-open.json", "nq-open-claims.json"]
    off, on = (e.certificate for e in listed)
    assert "verifier" not in off.model_versions and "verifier" in on.model_versions
    assert off.confidence_model == on.confidence_model  # one confidence model serves both
    for signals, name in (
        ("certifier,confidence,lookback", "nq-open.json"),
        ("certifier,confidence,lookback,verifier", "nq-open-claims.json"),
    ):
        models = {"confidence": off.confidence_model, "signals": signals}
        served = PolicyEngine.from_file(DEFAULT, models=models).certified["nq-open"]
        assert (served.path.name, served.inactive) == (name, None)
    assert main(["policy", "check", str(DEFAULT)]) == 0
    out = capsys.readouterr().out
    assert "fitted with certifier, confidence, lookback):" in out
    assert "fitted with certifier, confidence, lookback, verifier):" in out


def test_profile_selection_tenant_then_collection_then_default() -> None:
    config = parse_policy(
        MINIMAL
        + """
  medical: {max_hallucination_rate: 0.05}
  enterprise: {max_hallucination_rate: 0.2}
tenants: {clinic: medical}
collections: {handbook: enterprise}
"""
    )
    assert config.profile_for("clinic", "handbook")[0] == "medical"
    assert config.profile_for("acme", "handbook")[0] == "enterprise"
    assert config.profile_for("acme", "wiki")[0] == "general"
    assert config.profile_for(None, None)[0] == "general"


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            "  general: {max_hallucination_rate: 1.5}",
            "profiles.general.max_hallucination_rate: Input should be less than or equal to 1 "
            "(got 1.5)",
        ),
        (
            "  general: {max_hallucination_rate: 0.3, claims: {when_missing: deny}}",
            "profiles.general.claims.when_missing: Input should be 'allow', 'caveat' or 'block' "
            "(got 'deny')",
        ),
        (
            "  general: {max_hallucination_rate: 0.3, strictness: true}",
            "profiles.general.strictness: no such field; did you mean 'strict'? the fields "
            "here are description, max_hallucination_rate, strict,",
        ),
        (
            "  general: {max_hallucination_rate: 0.3, lookbak: {caveat_below: 0.5}}",
            "profiles.general.lookbak: no such field; did you mean 'lookback'?",
        ),
        (
            "  general: {max_hallucination_rate: 0.3, lookback: {caveat_belw: 0.5}}",
            "profiles.general.lookback.caveat_belw: no such field; did you mean 'caveat_below'? "
            "the fields here are block_below, caveat_below, when_missing (got 0.5)",
        ),
        (
            "  general: {max_hallucination_rate: 0.3}\nxyzzy: 1",
            "xyzzy: no such field; the fields here are schema_version, name, version,",
        ),
        (
            "  general: {max_hallucination_rate: 0.3, lookback: {block_below: 0.6, "
            "caveat_below: 0.4}}",
            "block_below (0.6) must be <= caveat_below (0.4)",
        ),
        ("  general: {strict: true}", "profiles.general.max_hallucination_rate: Field required"),
        (
            "  general: {max_hallucination_rate: 0.3}\ntenants: {acme: medical}",
            "tenants.acme names profile 'medical', which is not defined; defined: general",
        ),
        (
            "  General: {max_hallucination_rate: 0.3}",
            "profiles.General.[key]: String should match pattern",
        ),
    ],
)
def test_validation_errors_say_what_is_wrong(patch: str, expected: str) -> None:
    text = MINIMAL.replace("  general: {max_hallucination_rate: 0.3}", patch)
    with pytest.raises(ConfigError) as info:
        parse_policy(text, "p.yaml")
    assert str(info.value).startswith("p.yaml: invalid policy: ")
    assert expected in str(info.value)


def test_default_profile_must_exist() -> None:
    with pytest.raises(ConfigError, match="default_profile 'medical' is not a profile"):
        parse_policy(MINIMAL.replace("default_profile: general", "default_profile: medical"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [("- a list", "a policy must be a mapping, got list"), ("a: [", "not valid YAML")],
)
def test_not_a_policy_document(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_policy(text)


def test_policy_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(DEFAULT)]) == 0
    assert "medical: max hallucination rate 0.05, strict=true" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("0.3", "3"), encoding="utf-8")
    assert main(["policy", "check", str(bad)]) == 2
    assert "max_hallucination_rate" in capsys.readouterr().err


def test_policy_check_warns_of_a_profile_nothing_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "check", str(DEFAULT)]) == 0
    shipped = capsys.readouterr().out  # its risk profiles wait for a tenant to be mapped
    assert "note: profile medical is mapped from no tenant" in shipped
    assert "note: profile nq-open" not in shipped
    unused = tmp_path / "unused.yaml"
    unused.write_text(
        MINIMAL.replace(
            "  general: {max_hallucination_rate: 0.3}",
            "  general: {max_hallucination_rate: 0.3}\n  orphan: {max_hallucination_rate: 0.1}",
        )
        + "tenants: {wiki: general}\ncollections: {wiki: general}\n",
        encoding="utf-8",
    )
    assert main(["policy", "check", str(unused)]) == 0
    out = capsys.readouterr().out
    assert "note: profile orphan is mapped from no tenant or collection" in out
    assert "wiki named as a tenant and as a collection" in out


def test_a_policy_file_of_megabytes_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(MINIMAL + "#" + "x" * (2 << 20) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="more than 1048576"):
        load_policy(big)


def test_a_version_written_as_a_whole_number_is_taken_as_written() -> None:
    assert parse_policy(MINIMAL + "version: 2\n").version == "2"
    with pytest.raises(ConfigError, match=r"reads this version as the number 1\.1.*quote it"):
        parse_policy(MINIMAL + "version: 1.10\n")
    schema = json.loads((REPO / "schemas/policy.schema.json").read_text())
    assert {"type": "integer"} in schema["properties"]["version"]["anyOf"]  # as it is read


def test_a_tenant_key_yaml_reads_as_a_boolean_says_to_quote_it() -> None:
    """A tenant called NO (Norway) or a collection called off: YAML 1.1 reads them as
    booleans, and the error named the key ``tenants.0.[key]``, ``(got False)``."""
    with pytest.raises(ConfigError) as caught:
        parse_policy(MINIMAL + "tenants: {NO: general}\ncollections: {docs: yes}\n")
    said = str(caught.value)
    assert "tenants: a key: Input should be a valid string: YAML reads an unquoted" in said
    assert "quote" in said
    assert "collections.docs: Input should be a valid string: YAML reads" in said
    assert "tenants.0" not in said


def test_policy_check_notes_a_mapping_key_that_reads_as_a_wildcard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``acme-*`` maps only a tenant spelt ``acme-*``; ``acme-eu`` got the default
    profile while ``policy check`` said ok and nothing else."""
    path = tmp_path / "wild.yaml"
    path.write_text(
        MINIMAL + "  med: {max_hallucination_rate: 0.05}\ntenants: {'acme-*': med}\n",
        encoding="utf-8",
    )
    config = load_policy(path)
    assert config.profile_for("acme-*", None)[0] == "med"
    assert config.profile_for("acme-eu", None)[0] == "general"
    assert main(["policy", "check", str(path)]) == 0
    assert "note: tenants.'acme-*' is matched literally" in capsys.readouterr().out
