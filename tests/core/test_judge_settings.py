"""The optional LLM judge is configured from the environment (GUARDRAIL_JUDGE__*)."""

from __future__ import annotations

import pytest

from sidecar import runtime
from sidecar.claims.checker import VerifierClaimChecker
from sidecar.config import Settings
from sidecar.exceptions import ConfigError


def test_the_judge_is_off_by_default() -> None:
    settings = Settings.load(signals={"claims": True})
    assert settings.judge.endpoint is None
    checker = runtime.build_signals(settings).claims
    assert isinstance(checker, VerifierClaimChecker)
    assert not checker.version.endswith("+judge")


def test_judge_settings_reach_the_claim_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "GUARDRAIL_SIGNALS__CLAIMS": "true",
        "GUARDRAIL_SIGNALS__VERIFIER_THREADS": "2",
        "GUARDRAIL_JUDGE__ENDPOINT": "http://127.0.0.1:9/v1",
        "GUARDRAIL_JUDGE__MODEL": "judge-7b",
        "GUARDRAIL_JUDGE__API_KEY": "sk-very-secret",
        "GUARDRAIL_JUDGE__TIMEOUT_S": "0.5",
        "GUARDRAIL_JUDGE__MAX_CALLS_PER_ANSWER": "2",
        "GUARDRAIL_JUDGE__PROMPT": "three-way",
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings.load()
    assert "sk-very-secret" not in str(settings.redacted())
    checker = runtime.build_signals(settings).claims
    assert isinstance(checker, VerifierClaimChecker)
    assert checker.version.endswith("+judge")
    judge = checker._judge  # the wiring is what is under test
    assert judge is not None
    config = judge.config
    assert (config.endpoint, config.model, config.prompt) == (
        "http://127.0.0.1:9/v1",
        "judge-7b",
        "three-way",
    )
    assert (config.timeout_s, config.max_calls_per_answer) == (0.5, 2)
    assert config.api_key == "sk-very-secret"
    assert "sk-very-secret" not in repr(config)
    checker.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GUARDRAIL_JUDGE__ENDPOINT": "http://llm:8000/v1"}, "GUARDRAIL_JUDGE__MODEL"),
        (
            {"GUARDRAIL_JUDGE__ENDPOINT": "llm:8000", "GUARDRAIL_JUDGE__MODEL": "m"},
            "http(s) URL",
        ),
        ({"GUARDRAIL_JUDGE__TIMEOUT_S": "0"}, "GUARDRAIL_JUDGE__TIMEOUT_S"),
        # loaded, then every call failed ("no host given", a DNS look-up of "bob:pw@llm"):
        # the judge was off, said only by a "failing" warning each cool-down
        *(
            ({"GUARDRAIL_JUDGE__ENDPOINT": url, "GUARDRAIL_JUDGE__MODEL": "m"}, expected)
            for url, expected in [
                ("http://", "no host"),
                ("http://:8000/v1", "no host"),
                ("http://llm:80x/v1", "port"),
                ("http://llm 8000/v1", "space"),
                ("https://bob:pw@llm/v1", "GUARDRAIL_JUDGE__API_KEY"),
                ("https://llm/v1?api-version=1", "query"),
            ]
        ),
    ],
)
def test_bad_judge_settings_fail_at_load(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        Settings.load()


@pytest.mark.parametrize(
    "password",
    # audit: a password with a quote or a space was shown whole (the mask stops at them)
    ["hunter2", 'hun"ter2', "hun'ter2", "hunter2 x", "x\thunter2"],
)
def test_a_bad_endpoint_error_shows_no_password(
    monkeypatch: pytest.MonkeyPatch, password: str
) -> None:
    monkeypatch.setenv("GUARDRAIL_JUDGE__ENDPOINT", f"https://bob:{password}@llm/v1")
    monkeypatch.setenv("GUARDRAIL_JUDGE__MODEL", "m")
    with pytest.raises(ConfigError) as info:
        Settings.load()
    assert "ter2" not in str(info.value)
    assert "GUARDRAIL_JUDGE__API_KEY" in str(info.value)  # what to do instead


@pytest.mark.parametrize(
    ("endpoint", "warned"),
    [
        ("http://llm.example.com/v1", True),
        ("https://llm.example.com/v1", False),
        ("http://localhost:8000/v1", False),
        ("http://127.0.0.1:8000/v1", False),
        ("http://[::1]:8000/v1", False),
    ],
)
def test_an_api_key_sent_in_clear_is_warned_about(
    caplog: pytest.LogCaptureFixture, endpoint: str, warned: bool
) -> None:
    settings = Settings.load(
        judge={"endpoint": endpoint, "model": "m", "api_key": "sk-very-secret"}
    )
    with caplog.at_level("WARNING", logger="sidecar"):
        config = runtime._judge_config(settings)
    assert config is not None
    said = [r.getMessage() for r in caplog.records if "unencrypted" in r.getMessage()]
    assert bool(said) is warned
    assert all("sk-very-secret" not in m for m in said)


def test_a_judge_without_the_claim_check_fails_fast() -> None:
    settings = Settings.load(judge={"endpoint": "http://llm:8000/v1", "model": "m"})
    with pytest.raises(ConfigError, match="GUARDRAIL_SIGNALS__CLAIMS=true"):
        runtime.build_signals(settings)
