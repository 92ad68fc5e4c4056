"""Build the serving sidecar from settings and run it until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError, StopTimeoutError
from sidecar.health import HealthServer
from sidecar.heaptrim import HeapTrim
from sidecar.kafka.app import SidecarService
from sidecar.kafka.permissions import READ, Need, check_permissions, uses
from sidecar.kafka.readiness import LoopState
from sidecar.kafka.security import (
    TLS_CHECK_INTERVAL_S,
    TlsFilesWatch,
    sasl_password,
    sasl_username,
    ssl_context,
)
from sidecar.kafka.topics import format_counts, started_admin, verify_topics
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import Policy
from sidecar.secretfile import (
    SECRET_CHECK_INTERVAL_S,
    read_secret_files,
    secret_file,
    take_secret_readings,
)
from sidecar.telemetry import Telemetry
from sidecar.telemetry_setup import configure_from_env, describe_env

if TYPE_CHECKING:
    from sidecar.claims.judge import JudgeConfig
    from sidecar.confidence.fleet import CoverageMonitor
    from sidecar.policy.watch import PolicyFileWatch

log = logging.getLogger("sidecar")
MAX_START_RETRY_S = 30.0  # the longest pause between attempts to reach Kafka at start
# telemetry's last export gets what is left of the shutdown grace, and at least this much
# (a live collector takes milliseconds; a silent one held the process 42-49 s, audit)
MIN_TELEMETRY_STOP_S = 0.5


def _artifact(settings: Settings, relative: str, what: str, switch: str) -> Path:
    path = Path(settings.models.dir) / relative
    if not path.exists():
        raise ConfigError(
            f"{what} not found at {path} (GUARDRAIL_MODELS__DIR={settings.models.dir}); "
            f"mount the models there, or set {switch}=false to run without this signal"
        )
    return path


def _served_artifact(settings: Settings, relative: str, what: str, switch: str) -> Path:
    """:func:`_artifact` for a model :func:`build_signals` loads and serves, checked for
    writers other than its owner (here only: the versions read for the policy resolve the
    same paths again, and each warning came twice)."""
    path = _artifact(settings, relative, what, switch)
    warn_if_others_can_write(path, what)
    return path


def warn_if_others_can_write(path: Path, what: str) -> bool:
    """Log a warning when ``path`` (or, for a folder, a file in it) is writable by anyone:
    whoever can write a model or the policy decides what is allowed (audit: a
    world-writable policy loaded without a word). Whether it warned. Group-writable files
    (a umask of 002) are left alone."""
    files = [path, *(p for p in path.iterdir() if p.is_file())] if path.is_dir() else [path]
    loose = []
    for file in files:
        try:
            mode = file.stat().st_mode
        except OSError:
            continue
        if mode & stat.S_IWOTH:
            loose.append(f"{file} ({stat.filemode(mode)})")
    if loose:
        log.warning(
            "%s can be changed by any user: %s; mount it read-only or chmod o-w",
            what,
            ", ".join(loose[:5]) + (f" and {len(loose) - 5} more" if len(loose) > 5 else ""),
        )
    return bool(loose)


def build_signals(settings: Settings) -> SignalSuite:
    """Load every enabled signal's artifact; a missing or corrupt one stops the start."""
    sig = settings.signals
    certifier = None
    if sig.retrieval:
        from sidecar.conformal import (  # noqa: PLC0415
            CalibrationRegistry,
            ExchangeabilityMonitor,
            load_artifact,
        )
        from sidecar.conformal.signal import ConformalCertifier  # noqa: PLC0415

        path = _served_artifact(
            settings, sig.calibration, "the conformal calibration", "GUARDRAIL_SIGNALS__RETRIEVAL"
        )
        registry = CalibrationRegistry(
            load_artifact(path), unknown_collection=sig.unknown_collection
        )
        monitor = ExchangeabilityMonitor(
            window=sig.monitor_window,
            confidence=sig.monitor_confidence,
            min_samples=min(50, sig.monitor_window),
        )
        certifier = ConformalCertifier(registry, monitor)
    lookback = None
    if sig.lookback:
        from sidecar.lookback import OnnxLookbackScorer  # noqa: PLC0415

        model_dir = _served_artifact(
            settings, sig.lookback_model, "the lookback classifier", "GUARDRAIL_SIGNALS__LOOKBACK"
        )
        lookback = OnnxLookbackScorer.from_dir(
            model_dir, providers="auto", on_mismatch=sig.lookback_mismatch
        )
    claims = None
    if sig.claims:
        from sidecar.claims.verifier import load_claim_checker  # noqa: PLC0415

        verifier_dir = _served_artifact(
            settings, sig.verifier, "the claim verifier", "GUARDRAIL_SIGNALS__CLAIMS"
        )
        claims = load_claim_checker(
            verifier_dir,
            threads=sig.verifier_threads,
            judge=_judge_config(settings),
            target_precision=sig.verifier_target_precision,
            answer_pairs=sig.claim_pairs_per_answer,
            answer_budget_s=sig.claim_seconds_per_answer,
        )
    elif settings.judge.endpoint is not None:
        raise ConfigError(
            "GUARDRAIL_JUDGE__ENDPOINT is set but the claim check is off: the judge only "
            "refines the verifier's claim labels; set GUARDRAIL_SIGNALS__CLAIMS=true or unset "
            "the endpoint"
        )
    confidence = None
    if sig.confidence:
        from sidecar.confidence.scorer import CalibratedConfidenceScorer  # noqa: PLC0415

        confidence_dir = _served_artifact(
            settings,
            sig.confidence_model,
            "the calibrated-confidence model",
            "GUARDRAIL_SIGNALS__CONFIDENCE",
        )
        confidence = CalibratedConfidenceScorer.from_dir(confidence_dir, tau=sig.retrieve_again_tau)
    return SignalSuite(
        certifier=certifier,
        lookback=lookback,
        claims=claims,
        confidence=confidence,
        coverage=build_coverage(settings),
    )


def _judge_config(settings: Settings) -> JudgeConfig | None:
    judge = settings.judge
    if judge.endpoint is None or judge.model is None:
        return None
    from sidecar.claims.judge import JudgeConfig  # noqa: PLC0415

    url = urlsplit(judge.endpoint)
    keyed = judge.api_key is not None or judge.api_key_file is not None
    if keyed and url.scheme == "http" and not _loopback(url.hostname):
        log.warning(
            "GUARDRAIL_JUDGE__ENDPOINT is plain http to %s: the judge's API key crosses the "
            "network unencrypted (use https, or a judge on this host)",
            url.hostname,
        )
    return JudgeConfig(
        endpoint=judge.endpoint,
        model=judge.model,
        prompt=judge.prompt,
        timeout_s=judge.timeout_s,
        max_calls_per_answer=judge.max_calls_per_answer,
        failure_threshold=judge.failure_threshold,
        cooldown_s=judge.cooldown_s,
        max_workers=judge.max_workers,
        api_key=_judge_api_key(settings),
    )


def _judge_api_key(settings: Settings) -> str | Callable[[], str] | None:
    """The judge's API key: the value of ``api_key``, or the reader of ``api_key_file``'s
    current key (read now: ``ConfigError`` when the file holds none)."""
    judge = settings.judge
    if judge.api_key_file is not None:
        return secret_file(
            judge.api_key_file, "GUARDRAIL_JUDGE__API_KEY_FILE", "the next judge calls"
        ).value
    return judge.api_key.get_secret_value() if judge.api_key is not None else None


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def build_coverage(settings: Settings) -> CoverageMonitor:
    """The fleet coverage-bound monitor, with the leakage probe's delta when configured."""
    from sidecar.confidence.fleet import CoverageMonitor  # noqa: PLC0415

    cov = settings.coverage
    probe = None
    if cov.probe_file:
        from sidecar.confidence.probe_result import load_probe  # noqa: PLC0415

        result = load_probe(Path(cov.probe_file))
        probe = (result.trials, result.errors)
    return CoverageMonitor(
        window=cov.window,
        report_interval_s=cov.report_interval_s,
        confidence=cov.confidence,
        probe=probe,
        max_keys=cov.max_keys,
    )


def serving_imports_torch() -> bool:
    """Does loading everything ``run`` loads pull torch, transformers or sklearn? (subprocess)"""
    code = (
        "import sys; from sidecar.config import Settings; from sidecar import runtime; "
        "runtime.check(Settings.load()); "
        "print(any(m in sys.modules for m in ('torch', 'transformers', 'sklearn')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip().endswith("True")


DEFAULT_POLICY = "policy/default.yaml"


def build_policy(settings: Settings) -> Policy:
    """The declarative policy engine: ``GUARDRAIL_POLICY__FILE`` or the shipped default."""
    from sidecar.policy.engine import PolicyEngine  # noqa: PLC0415

    if settings.policy.file:
        path = Path(settings.policy.file)
        if not path.exists():
            raise ConfigError(f"GUARDRAIL_POLICY__FILE={path} does not exist")
    else:
        path = Path(settings.models.dir) / DEFAULT_POLICY
        if not path.exists():
            raise ConfigError(
                f"the default policy is not at {path} (GUARDRAIL_MODELS__DIR="
                f"{settings.models.dir}); mount the models there or set GUARDRAIL_POLICY__FILE"
            )
    warn_if_others_can_write(path, "the policy")
    # a policy mounted elsewhere (a ConfigMap) still finds the shipped certificates
    shipped = Path(settings.models.dir) / Path(DEFAULT_POLICY).parent
    return PolicyEngine.from_file(path, models=_served_models(settings), search=[shipped])


UPSTREAM_OF_CONFIDENCE = ("certifier", "lookback", "verifier")  # the models it reads


def served_model_versions(settings: Settings) -> dict[str, str]:
    """The served versions of the models whose outputs the confidence reads (the conformal
    calibration, the lookback model, the claim verifier with its band), enabled ones only."""
    served = _served_models(
        settings.model_copy(
            update={"signals": settings.signals.model_copy(update={"confidence": False})}
        )
    )
    return {name: served[name] for name in UPSTREAM_OF_CONFIDENCE if name in served}


def check_confidence_inputs(
    fitted_on: dict[str, str] | None, served: dict[str, str], where: Path
) -> None:
    """``ConfigError`` when a model the confidence was fitted on is served in another
    version: its features then come from other scores, and its probabilities are no longer
    calibrated (audit: a retrained lookback model moved one answer's confidence from 0.51
    to 0.095, under the enterprise profile's block at 0.1, and nothing was said)."""
    if fitted_on is None:
        log.warning(
            "the calibrated-confidence model %s does not say which models it was fitted on "
            "(its card has no inputs): a change of the lookback model, the calibration or "
            "the verifier cannot be detected; refit it with `guardrail train confidence`",
            where,
        )
        return
    moved = [
        f"{name} {fitted_on[name]} -> {served[name]}"
        for name in UPSTREAM_OF_CONFIDENCE
        if name in fitted_on and name in served and _model(fitted_on[name]) != _model(served[name])
    ]
    if moved:
        raise ConfigError(
            f"the calibrated-confidence model {where} was fitted on other models than those "
            f"served ({'; '.join(moved)}): its features come from their scores, so its "
            "probabilities would not be calibrated. Refit it (`guardrail dataset outcomes`, "
            "then `guardrail train confidence`), serve the models it was fitted on, or set "
            "GUARDRAIL_SIGNALS__CONFIDENCE=false"
        )


def _model(version: str) -> str:
    """A served version without the verifier's band (``+p0.9``: a served option, as the
    claims switch is; the network and its calibration are what the features come from)."""
    return version.split("+p", 1)[0]


def _served_models(settings: Settings) -> dict[str, str]:
    """What a policy's allow certificates are checked against: the confidence model's
    version, the enabled signals (a certificate fitted with claims off is not one
    for claims on) and the versions of the enabled signals' models (the conformal
    calibration, the lookback model, the claim verifier): the confidence reads their
    outputs, so a certificate fitted under one says nothing under another. ``judge``: an
    LLM judge refines the claim labels (a certificate fitted without one does not apply
    with one, nor the reverse)."""
    sig = settings.signals
    enabled = [
        name
        for name, on in (
            ("certifier", sig.retrieval),
            ("lookback", sig.lookback),
            ("verifier", sig.claims),
            ("confidence", sig.confidence),
        )
        if on
    ]
    served = {"signals": ",".join(enabled)}
    if sig.retrieval:
        from sidecar.conformal import load_artifact as load_calibration  # noqa: PLC0415

        path = _artifact(
            settings, sig.calibration, "the conformal calibration", "GUARDRAIL_SIGNALS__RETRIEVAL"
        )
        served["certifier"] = load_calibration(path).calibration_id
    if sig.lookback:
        from sidecar.lookback.artifact import load_metadata  # noqa: PLC0415

        model_dir = _artifact(
            settings, sig.lookback_model, "the lookback classifier", "GUARDRAIL_SIGNALS__LOOKBACK"
        )
        served["lookback"] = load_metadata(model_dir)[0].version
    if sig.claims:
        from sidecar.claims.verifier import load_artifact  # noqa: PLC0415

        verifier_dir = _artifact(
            settings, sig.verifier, "the claim verifier", "GUARDRAIL_SIGNALS__CLAIMS"
        )
        artifact = load_artifact(verifier_dir)
        artifact.band_for(sig.verifier_target_precision)  # a band it lacks: fail here, say which
        served["verifier"] = artifact.served_version(sig.verifier_target_precision)
        if settings.judge.endpoint is not None:  # (a model name is required with it)
            served["judge"] = "on"  # its labels replace the verifier's uncertain ones
    if not sig.confidence:
        return served
    from sidecar.confidence.scorer import CalibratedConfidenceScorer  # noqa: PLC0415

    path = _artifact(
        settings,
        sig.confidence_model,
        "the calibrated-confidence model",
        "GUARDRAIL_SIGNALS__CONFIDENCE",
    )
    scorer = CalibratedConfidenceScorer.from_dir(path)
    check_confidence_inputs(scorer.fitted_on, served, path)
    served["confidence"] = scorer.version
    return served


def _signals_off(settings: Settings) -> list[str]:
    """The signals this sidecar does not serve (verdict reason ``<signal>-not-configured``)."""
    sig = settings.signals
    served = {
        "retrieval": sig.retrieval,
        "lookback": sig.lookback,
        "claims": sig.claims,
        "confidence": sig.confidence,
    }
    return [name for name, on in served.items() if not on]


def build_processor(settings: Settings) -> Processor:
    """The processor ``run`` serves: the settings' policy and signals, wired together.

    Certified allow: a policy engine's allow certificates are re-tested on the
    coverage monitor's feedback (the composition root knows both concrete types;
    the pipeline does not).
    """
    from sidecar.confidence.fleet import CoverageMonitor  # noqa: PLC0415
    from sidecar.policy.engine import PolicyEngine  # noqa: PLC0415
    from sidecar.policy.lint import constant_decisions  # noqa: PLC0415

    policy = build_policy(settings)
    if isinstance(policy, PolicyEngine):
        for note in constant_decisions(policy.config, _signals_off(settings)):
            log.warning("%s", note)
    signals = build_signals(settings)
    if isinstance(policy, PolicyEngine) and isinstance(signals.coverage, CoverageMonitor):
        policy.attach_certificates(signals.coverage.certificates)
    # the fleet's withdrawals (rag.certificates) apply wherever the policy reads them
    certificates = policy.certificates if isinstance(policy, PolicyEngine) else None
    if certificates is not None and not certificates.keys():
        certificates = None  # no certified allow: nothing to withdraw
    return Processor(settings, policy, signals=signals, certificates=certificates)


def unread_settings(settings: Settings) -> list[str]:
    """Settings that are accepted but that nothing in the serving path reads, each with
    why; ``run`` and ``run --check`` log them as warnings."""
    out = []
    qdrant = settings.qdrant
    if qdrant.url or qdrant.path or qdrant.api_key is not None:
        out.append(
            "GUARDRAIL_QDRANT__* is set, but the sidecar never queries Qdrant: the retrieval "
            "events carry the hits and their scores (the calibration and dataset commands "
            "take --qdrant-url / --qdrant-path)"
        )
    judge = settings.judge
    if judge.endpoint is None and (judge.api_key is not None or judge.api_key_file is not None):
        # the chart's judge.apiKeySecret mounts the key; the endpoint is set apart
        out.append(
            "GUARDRAIL_JUDGE__API_KEY"
            + ("_FILE" if judge.api_key_file is not None else "")
            + " is set, but no LLM judge is (GUARDRAIL_JUDGE__ENDPOINT is unset): the key "
            "is never sent; set the endpoint and model, with GUARDRAIL_SIGNALS__CLAIMS=true"
        )
    return out


# How long a dead Kafka broker's partitions are away: the controller fences it after
# broker.session.timeout.ms (9 s by default) and elects new leaders (measured: 10-15 s from
# SIGKILL to fully replicated on a three-node cluster, tests/kafka/test_cluster_restarts_real)
BROKER_FAILOVER_MS: Final = 10_000


def short_join_ttl(settings: Settings) -> str | None:
    """Why ``join.ttl_ms`` is too short to outwait a partition that is away for a while
    (None when it is not): a request whose other half is on it is decided ``incomplete``
    though both halves are in Kafka. ``run`` and ``run --check`` log it as a warning."""
    ttl, session = settings.join.ttl_ms, settings.kafka.session_timeout_ms
    if ttl >= max(session, BROKER_FAILOVER_MS):
        return None
    return (
        f"GUARDRAIL_JOIN__TTL_MS={ttl} is shorter than a partition may be away: a replica "
        f"that died holds its partitions until its group session ends "
        f"(GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS={session}), a Kafka broker that died until "
        f"the cluster fences it (broker.session.timeout.ms, 9 s by default); a request whose "
        f"other half waits there is decided incomplete though both halves are in Kafka. "
        f"Keep it above {max(session, BROKER_FAILOVER_MS)} (the default is 30000)"
    )


def _preflight(settings: Settings) -> dict[str, str]:
    """Before anything slow (models, Kafka): warn of unread settings and of a join TTL too
    short for a failover, and check the OTLP environment (``ConfigError`` when the SDK
    would misread it); what goes out."""
    for note in unread_settings(settings):
        log.warning("%s", note)
    if (short := short_join_ttl(settings)) is not None:
        log.warning("%s", short)
    _read_secret_files(settings)
    return describe_env()


def _read_secret_files(settings: Settings) -> None:
    """Read the ``..._FILE`` secrets that will be used: a file that holds none stops the
    start here (``ConfigError``, naming the setting and the file, never the secret)."""
    if settings.kafka.security_protocol.startswith("SASL"):
        sasl_username(settings.kafka)
        sasl_password(settings.kafka)
    if settings.judge.endpoint is not None:
        _judge_api_key(settings)


def check(settings: Settings) -> dict[str, object]:
    """Everything ``run`` would load, loaded and validated, without touching Kafka."""
    otlp = _preflight(settings)
    ssl_context(settings.kafka)  # the TLS files load (ConfigError naming the one that does not)
    processor = build_processor(settings)
    processor.signals.close()  # an LLM judge is built, never called
    return {
        "config": "ok",
        "policy": processor.policy.name,
        "models": processor.signals.versions(),
        "otlp": otlp,
    }


def collect_young_after(objects: int) -> int:
    """Walk the youngest generation once ``objects`` more tracked objects are alive
    (``GUARDRAIL_GC_YOUNG_THRESHOLD``); the older generations keep their thresholds.
    Returns the threshold it replaces.

    A consumed batch's events, entries and outputs live until its verdicts are out:
    with CPython's 700, each batch set off young collections that walked them, and
    promoted them to be walked again in the next generation (measured with
    ``gc.callbacks``: 14 us a request in batches of 50 requests, 26 us in batches of 200).
    """
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(objects, older, oldest)
    return young


def collect_as_served(settings: Settings) -> int:
    """The garbage collector as ``guardrail run`` serves with it: what is loaded now frozen
    (``GUARDRAIL_GC_FREEZE``), the young generation walked past ``gc_young_threshold``.
    Returns the young-generation threshold it replaces."""
    if settings.gc_freeze:
        freeze_startup_objects()
    return collect_young_after(settings.gc_young_threshold)


def freeze_startup_objects() -> int:
    """Collect once, then exempt every object alive now from later cyclic collections.

    The models, calibrations and imported modules are ~70,000 tracked objects;
    a full (generation 2) collection walks them all, ~40 ms on this machine,
    and at 500 answers/s one happens every few seconds: a latency tail made of
    garbage collector pauses. Frozen, they are never scanned again (they live
    as long as the process anyway). Returns how many objects were frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class _Started:
    """What the health endpoints read while the sidecar starts, then the service's state."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.service: SidecarService | None = None

    def readiness(self) -> dict[str, bool]:
        service = self.service
        if service is None:
            return {"started": False}
        return service.state.readiness_checks(self.settings.http.ready_requires_assignment)

    def liveness(self) -> dict[str, bool]:
        """The loop's liveness checks (all pass while it starts), once an output topic
        missing too long has been judged fatal."""
        state = self.service.state if self.service is not None else None
        if state is None:
            return LoopState().liveness_checks()
        state.check_missing()  # an output topic missing too long: fatal from now on
        return state.liveness_checks()


async def _reach_kafka(settings: Settings, stop: asyncio.Event) -> dict[str, int] | None:
    """The input topics' partition counts, once Kafka answers; ``None`` when stopped first.

    Without ``kafka.wait_at_start`` the first ``BrokerError`` ends the start (exit 1).
    A wrong layout (``ConfigError``) always does.
    """
    delay_s = 1.0
    while True:
        check = asyncio.ensure_future(verify_topics(settings))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({check, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not check.done():
            check.cancel()
            return None
        try:
            return check.result()
        except BrokerError as exc:
            if not settings.kafka.wait_at_start:
                raise
            log.warning("%s; trying again in %.0f s (GUARDRAIL_KAFKA__WAIT_AT_START)", exc, delay_s)
        try:
            async with asyncio.timeout(delay_s):
                await stop.wait()
        except TimeoutError:
            delay_s = min(delay_s * 2, MAX_START_RETRY_S)
        else:
            return None


async def _load_while_reaching_kafka(
    settings: Settings, stop: asyncio.Event, processor: Processor | None
) -> tuple[dict[str, int], Processor] | None:
    """:func:`_reach_kafka` and :func:`build_processor` (on a thread) side by side: the
    input topics' partition counts and the processor, or ``None`` when stopped first.
    The first of the two to fail ends the start with its error."""
    reaching = asyncio.ensure_future(_reach_kafka(settings, stop))
    if processor is not None:
        counts = await reaching
        return None if counts is None else (counts, processor)
    building = asyncio.ensure_future(asyncio.to_thread(build_processor, settings))
    try:
        await asyncio.wait({building, reaching}, return_when=asyncio.FIRST_EXCEPTION)
        if building.done():
            building.result()  # a policy or model error: raised now, Kafka or not
        try:
            counts = await reaching
        except BrokerError as exc:  # no broker, and no waiting for it: a configuration
            try:  # error found meanwhile is what is said (exit 2), the broker's logged too
                await building
            except Exception:
                log.error("%s", exc)  # noqa: TRY400 - the broker's error, not this one
                raise
            raise
        if counts is None:
            return None  # stopped: the build thread finishes on its own
        return counts, await building
    finally:
        reaching.cancel()


def _policy_watch(settings: Settings, processor: Processor) -> PolicyFileWatch | None:
    """A watch on the served policy's file (``None``: a policy not read from a file)."""
    from sidecar.policy.engine import PolicyEngine  # noqa: PLC0415
    from sidecar.policy.watch import PolicyFileWatch  # noqa: PLC0415

    policy = processor.policy
    if not isinstance(policy, PolicyEngine) or policy.source is None:
        return None
    return PolicyFileWatch(
        policy.source, policy.fingerprint, lambda: build_policy(settings).fingerprint
    )


async def _every(interval_s: float, stop: asyncio.Event) -> AsyncIterator[None]:
    """Once every ``interval_s`` until ``stop`` is set (at once when it is)."""
    while True:
        try:
            async with asyncio.timeout(interval_s):
                await stop.wait()
        except TimeoutError:
            yield
        else:
            return


async def _watch_policy(
    watch: PolicyFileWatch, stop: asyncio.Event, interval_s: float | None = None
) -> None:
    """Until ``stop``: re-read the policy file every ``interval_s`` (default
    ``POLICY_CHECK_INTERVAL_S``) and log what changed."""
    from sidecar.policy.watch import POLICY_CHECK_INTERVAL_S  # noqa: PLC0415

    async for _ in _every(POLICY_CHECK_INTERVAL_S if interval_s is None else interval_s, stop):
        try:
            notice = await asyncio.to_thread(watch.check)
        except Exception:  # a watch must never stop the sidecar
            log.exception("checking the policy file failed")
            continue
        if notice is not None:
            log.log(
                logging.WARNING if notice.level == "warning" else logging.INFO, "%s", notice.message
            )


async def _watch_tls(
    watch: TlsFilesWatch, stop: asyncio.Event, interval_s: float | None = None
) -> None:
    """Until ``stop``: every ``interval_s`` (default ``TLS_CHECK_INTERVAL_S``), load the Kafka
    TLS files again when they changed on disk (a renewed client certificate, a CA bundle
    with a new CA), and say so."""
    async for _ in _every(TLS_CHECK_INTERVAL_S if interval_s is None else interval_s, stop):
        try:
            said = await asyncio.to_thread(watch.changed)
            said = said or watch.apply()  # on the loop, where the clients connect
        except Exception:  # a watch must never stop the sidecar
            log.exception("checking the Kafka TLS files failed")
            continue
        if said is not None:
            log.log(*said)


async def _watch_secrets(stop: asyncio.Event, interval_s: float | None = None) -> None:
    """Until ``stop``: every ``interval_s`` (default ``SECRET_CHECK_INTERVAL_S``), read the
    secret files again (the SASL password, the judge's key), and say what changed."""
    async for _ in _every(SECRET_CHECK_INTERVAL_S if interval_s is None else interval_s, stop):
        try:
            readings = await asyncio.to_thread(read_secret_files)
            said = take_secret_readings(readings)  # on the loop, where the clients connect
        except Exception:  # a watch must never stop the sidecar
            log.exception("checking the secret files failed")
            continue
        for level, line in said:
            log.log(level, "%s", line)


def _secret_watch(settings: Settings, stop: asyncio.Event) -> asyncio.Task[None] | None:
    """The secret files' watch (``None``: no secret is read from a file)."""
    files = (settings.kafka.sasl_username_file, settings.kafka.sasl_password_file)
    if files == (None, None) and settings.judge.api_key_file is None:
        return None
    return asyncio.create_task(_watch_secrets(stop), name="sidecar-secret-watch")


async def _until_stopped(settings: Settings, processor: Processor, stop: asyncio.Event) -> None:
    """Wait for SIGTERM / SIGINT, re-reading the policy file meanwhile."""
    watch = _policy_watch(settings, processor)
    if watch is None:
        await stop.wait()
        return
    watching = asyncio.create_task(_watch_policy(watch, stop), name="sidecar-policy-watch")
    try:
        await stop.wait()
    finally:
        watching.cancel()


def _tls_watch(settings: Settings, stop: asyncio.Event) -> asyncio.Task[None] | None:
    """The Kafka TLS files' watch (``None``: no TLS), from before Kafka is first reached:
    a start that waits for the brokers (``kafka.wait_at_start``) retries with the shared
    context, which read the files at the first try (each try read them again before it
    was shared): a certificate that expired while the brokers were away ended the start
    (a refused certificate is a configuration error) with its renewal on disk."""
    if not settings.kafka.security_protocol.endswith("SSL"):
        return None
    watch = TlsFilesWatch(settings.kafka)
    return asyncio.create_task(_watch_tls(watch, stop), name="sidecar-tls-watch")


def _heap_trims(settings: Settings, stop: asyncio.Event) -> asyncio.Task[None] | None:
    """The periodic heap trim (``None``: turned off, or no ``malloc_trim`` here)."""
    if settings.heap_trim_interval_s <= 0:
        return None
    trim = HeapTrim()
    if not trim.available:
        log.debug("no malloc_trim in this C library: the heap is not trimmed")
        return None
    return asyncio.create_task(
        _trim_heap(trim, stop, settings.heap_trim_interval_s), name="sidecar-heap-trim"
    )


async def _trim_heap(trim: HeapTrim, stop: asyncio.Event, interval_s: float) -> None:
    """Until ``stop``: every ``interval_s``, free heap pages back to the kernel (~1 ms, on
    the loop: a thread would only move the pause to whichever thread next takes the
    allocator's lock)."""
    async for _ in _every(interval_s, stop):
        try:
            done = trim()
        except Exception:  # a trim must never stop the sidecar
            log.exception("trimming the heap failed")
            continue
        if done is not None:
            log.debug(
                "heap trim: %.1f MB released in %.2f ms (%d trims, %.1f MB in all)",
                done.released / 2**20,
                done.seconds * 1e3,
                trim.calls,
                trim.released_bytes / 2**20,
            )


def _release(processor: Processor | None, young: int, *watches: asyncio.Task[None] | None) -> None:
    """At exit: the file watches end, and the claim checker is closed (after the service
    stopped: the last batch's claims are decided), cutting off an LLM judge's calls still in
    flight. Left open, the judge's pool threads (not daemons) held the exit for up to its
    ``timeout_s`` after the final commit. The young generation's threshold is ``young``
    again (a process that served in-process, a test or the bench, collects as before)."""
    collect_young_after(young)
    for watch in watches:
        if watch is not None:
            watch.cancel()
    if processor is not None:
        processor.signals.close()


def _log_levels(settings: Settings) -> None:
    logging.getLogger().setLevel(settings.log_level)
    if settings.log_level == "DEBUG":
        for name in ("aiokafka", "faststream"):
            logging.getLogger(name).setLevel(logging.DEBUG)


async def _start_unless_stopped(
    service: SidecarService, stop: asyncio.Event, grace_s: float
) -> bool:
    """``service.start()``, unless SIGTERM / SIGINT comes first (False): the start is cut
    short and what it opened is closed within ``grace_s``. Not watched, a SIGTERM waited
    for each client's start in turn against a broker that did not answer (audit: 59.7 s
    with a 4 s grace, the topic limits' read then the producer's bootstrap, each
    ``request_timeout_ms``), past the kubelet's SIGKILL."""
    starting = asyncio.ensure_future(service.start())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if starting.done():
        starting.result()  # a start that failed says why
        return True
    starting.cancel()
    deadline = time.monotonic() + grace_s
    await asyncio.wait({starting}, timeout=grace_s or None)
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            await service.close_unstarted()
    except Exception as exc:  # noqa: BLE001 - exiting anyway: say it, do not hold the exit
        log.warning("closing the Kafka clients of a start cut short: %r", exc)
    return False


def _unfinished_stop(service: SidecarService, grace_s: float) -> str:
    """The one line said when stopping outlasts the shutdown grace: the step it was at,
    whether the final commit was confirmed, and what the next owner does again."""
    held = service.state.processing_for()
    pending = service.tracker.pending_count()
    if service.final_commit_confirmed:
        commit = "the final commit was confirmed"
    else:
        commit = (
            "the final commit was not confirmed: what was decided since the last one is "
            "decided again by the next owner (same idempotency keys)"
        )
    return (
        f"stopping took longer than the shutdown grace ({grace_s:g} s, "
        f"GUARDRAIL_SHUTDOWN_GRACE_MS), at {service.stop_step or 'its end'}"
        + (f"; the processor has made no progress for {held:.0f} s" if held else "")
        + f": exiting now; {commit}; {pending} input record(s) not finished are left to "
        "the next owner"
    )


async def _check_permissions(settings: Settings, processor: Processor) -> list[Need]:
    """End the start (``ConfigError``) when the cluster's ACLs refuse this principal an
    operation the sidecar needs (``sidecar.kafka.permissions``); returns the optional ones
    refused (warned about). A cluster that does not answer the question (moments after it
    answered the topic check) leaves it unchecked, with a warning: a refusal still ends
    the loop when it comes."""
    try:
        admin = await started_admin(settings.kafka)
        try:
            return await check_permissions(settings, admin, **uses(processor))
        finally:
            await admin.close()
    except BrokerError as exc:
        log.warning("the Kafka ACLs were not checked at start: %s", exc)
        return []


async def serve(settings: Settings, processor: Processor | None = None) -> None:
    """Run until SIGTERM / SIGINT. ``processor``: replaces the one built from the
    settings' signals and policy (the bench's constant-verdict floor); ``None``
    in production.

    The signal handlers and the health endpoints come first: a pod deleted while it
    starts stops at once, and its probes answer (live; ready once the service runs).
    """
    _log_levels(settings)
    _preflight(settings)
    stop = asyncio.Event()
    # a TLS file that does not load stops here
    watches = (
        _tls_watch(settings, stop),
        _secret_watch(settings, stop),
        _heap_trims(settings, stop),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = _Started(settings)
    health: HealthServer | None = None
    if settings.http.enabled:
        health = HealthServer(
            settings.http.host, settings.http.port, started.readiness, started.liveness
        )
        await health.start()
        log.info("health endpoints on %s:%d", settings.http.host, health.port)
    setup = None
    grace_s = settings.shutdown_grace_ms / 1000.0
    stopping_at: float | None = None  # when SIGTERM / SIGINT came (monotonic)
    young = gc.get_threshold()[0]  # CPython's young-generation threshold, given back at exit
    try:
        # the models and the policy load while Kafka is reached: a wrong topic layout does
        # not wait for the models, and a policy typo or a broken model is not hidden behind
        # a broker that does not answer yet (audit: only "cannot reach Kafka" retries)
        loaded = await _load_while_reaching_kafka(settings, stop, processor)
        if loaded is None:
            log.info("stopped while starting")
            return
        counts, processor = loaded
        log.info("input topics: %s", format_counts(counts))
        refused = await _check_permissions(settings, processor)
        setup = configure_from_env(
            settings.metrics.prometheus_port, settings.metrics.prometheus_host
        )
        service = SidecarService(
            settings,
            processor,
            telemetry=Telemetry.from_setup(setup, stage_spans=settings.tracing.stage_spans),
            # the real count (review: topics.partitions is what `topics create` would make)
            input_partitions=counts.get(settings.topics.retrieval),
            # refused: warned about by the check, not tried (aiokafka logs each refusal)
            warm_start=not any(
                n.same_acl(Need("topic", settings.topics.verdicts, READ, "")) for n in refused
            ),
        )
        collect_as_served(settings)
        if stop.is_set():
            log.info("stopped while starting")
            return
        if not await _start_unless_stopped(service, stop, grace_s):
            log.info("stopped while starting")
            return
        started.service = service
        log.info(
            "sidecar consuming %s + %s as group %s on %s",
            settings.topics.retrieval,
            settings.topics.generation,
            settings.kafka.group_id,
            settings.kafka.bootstrap_servers,
        )
        await _until_stopped(settings, processor, stop)
        stopping_at = time.monotonic()
        log.info("stopping: finishing in-flight work and committing")
        try:
            async with asyncio.timeout(grace_s or None):
                await service.stop()
        except TimeoutError:
            raise StopTimeoutError(_unfinished_stop(service, grace_s)) from None
    finally:
        _release(processor, young, *watches)
        if health is not None:
            await health.stop()
        if setup is not None:
            spent = 0.0 if stopping_at is None else time.monotonic() - stopping_at
            setup.shutdown(max(MIN_TELEMETRY_STOP_S, grace_s - spent))
    log.info("stopped")
