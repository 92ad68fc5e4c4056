"""A policy file edited under a running sidecar is noticed and said, once per change.

The policy is read once, at start; a ConfigMap the chart does not render
(``policy.existingConfigMap``) changes the mounted file without restarting a
pod. Before the watch, a running sidecar kept the old policy without a word.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.config import Settings
from sidecar.policy import watch as watch_module
from sidecar.policy.config import parse_policy
from sidecar.policy.engine import PolicyEngine
from sidecar.policy.watch import PolicyFileWatch
from sidecar.runtime import _until_stopped, build_processor
from tests.policy import test_certified_allow as certified

POLICY = """\
name: team
version: "3"
default_profile: p
profiles:
  p:
    max_hallucination_rate: 0.2
    lookback: {block_below: 0.1, caveat_below: 0.4}
"""


def _watch(path: Path) -> tuple[PolicyFileWatch, PolicyEngine]:
    engine = PolicyEngine.from_file(path)
    assert engine.source is not None
    return (
        PolicyFileWatch(
            engine.source, engine.fingerprint, lambda: PolicyEngine.from_file(path).fingerprint
        ),
        engine,
    )


def test_an_unchanged_file_says_nothing(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, "utf-8")
    watch, _ = _watch(path)
    assert watch.check() is None
    assert watch.check() is None


def test_a_changed_rule_is_a_warning_naming_both_policies_once(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, "utf-8")
    watch, engine = _watch(path)
    path.write_text(POLICY.replace("caveat_below: 0.4", "caveat_below: 0.6"), "utf-8")
    notice = watch.check()
    assert notice is not None
    assert notice.level == "warning"
    now = PolicyEngine.from_file(path).fingerprint
    assert engine.fingerprint in notice.message
    assert now in notice.message
    assert "restart" in notice.message
    assert watch.check() is None  # once per change
    path.write_text(POLICY, "utf-8")
    back = watch.check()
    assert back is not None
    assert back.level == "info"


def test_a_comment_is_not_a_policy_change(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, "utf-8")
    watch, _ = _watch(path)
    path.write_text("# reviewed\n" + POLICY, "utf-8")
    notice = watch.check()
    assert notice is not None
    assert notice.level == "info"


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p.write_text(POLICY.replace("0.2", "2.0"), "utf-8"),
        lambda p: p.write_bytes(b"\xff" + POLICY.encode()),
        Path.unlink,
    ],
    ids=["invalid", "not-utf8", "deleted"],
)
def test_a_file_that_would_not_load_says_a_restart_would_not_start(
    tmp_path: Path, edit: Callable[[Path], object]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, "utf-8")
    watch, engine = _watch(path)
    edit(path)
    notice = watch.check()
    assert notice is not None
    assert notice.level == "warning"
    assert "would not load" in notice.message
    assert engine.fingerprint in notice.message


def _certified_policy(tmp_path: Path) -> Path:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "nq.json").write_text(certified.certificate().model_dump_json(), "utf-8")
    path = tmp_path / "policy.yaml"
    path.write_text(certified.POLICY.replace("BELOW", "caveat"), "utf-8")
    return path


def test_a_changed_certificate_file_is_a_warning_naming_it(tmp_path: Path) -> None:
    """Audit: the watch read only the policy file, though a start loads its certificates
    and the fingerprint covers them: a re-certified threshold went unnoticed."""
    path = _certified_policy(tmp_path)
    watch, engine = _watch(path)
    cert = tmp_path / "certs" / "nq.json"
    cert.write_text(certified.certificate(risk=0.3).model_dump_json(), "utf-8")
    notice = watch.check()
    assert notice is not None
    assert notice.level == "warning"
    assert f"the certificate file {cert} changed" in notice.message
    assert PolicyEngine.from_file(path).fingerprint in notice.message
    assert engine.fingerprint in notice.message
    assert watch.check() is None  # once per change


def test_a_certificate_rewritten_with_the_same_content_is_not_a_policy_change(
    tmp_path: Path,
) -> None:
    path = _certified_policy(tmp_path)
    watch, engine = _watch(path)
    cert = tmp_path / "certs" / "nq.json"
    cert.write_text(json.dumps(json.loads(cert.read_text("utf-8")), indent=2), "utf-8")
    notice = watch.check()
    assert notice is not None
    assert (notice.level, engine.fingerprint in notice.message) == ("info", True)
    assert "not its rules" in notice.message


def test_a_deleted_certificate_file_says_a_restart_would_not_start(tmp_path: Path) -> None:
    path = _certified_policy(tmp_path)
    watch, _ = _watch(path)
    (tmp_path / "certs" / "nq.json").unlink()
    notice = watch.check()
    assert notice is not None
    assert notice.level == "warning"
    assert "would not load" in notice.message
    assert "nq.json" in notice.message


def test_a_policy_not_read_from_a_file_has_no_source() -> None:
    assert PolicyEngine(parse_policy(POLICY)).source is None


def test_the_running_sidecar_logs_an_edited_policy_file(
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What ``serve`` waits in while it runs re-reads the file (here every 10 ms)."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, "utf-8")
    settings = settings_factory(
        policy={"file": str(path)},
        signals={"retrieval": False, "lookback": False, "confidence": False},
    )
    processor = build_processor(settings)
    monkeypatch.setattr(watch_module, "POLICY_CHECK_INTERVAL_S", 0.01)

    async def scenario() -> None:
        stop = asyncio.Event()
        running = asyncio.create_task(_until_stopped(settings, processor, stop))
        await asyncio.sleep(0.05)
        path.write_text(POLICY.replace('version: "3"', 'version: "4"'), "utf-8")
        for _ in range(200):
            if any("team/4@" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(running, timeout=5)

    with caplog.at_level(logging.INFO, logger="sidecar"):
        asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("team/4@" in m and "still decides with team/3@" in m for m in warnings), warnings
