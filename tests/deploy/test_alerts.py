"""The chart's alerts (templates/prometheusrule.yaml) read what the sidecar exports, and fire.

* Every series an alert reads (and every ``guardrail_*`` name its runbook line points
  to) is in a real ``/metrics`` scrape of ``guardrail run``: the sidecar as its own
  process on the session's broker, with the shipped models, policy and leakage probe,
  after it decided the demo recording's requests (one incomplete), dead-lettered its
  broken records and took its feedback labels. Each label an alert matches or groups by
  is one the sidecar writes on that series (``namespace``, ``job``, ``pod`` and
  ``instance`` are the scrape's own).
* ``promtool check rules`` (Prometheus' own parser, built pinned by
  scripts/lib/deploy-tools.sh) accepts the rules as the chart renders them with its
  defaults, in inject mode, with values-prod.yaml and with a selector of one's own.
* ``promtool test rules`` runs tests/deploy/alerts/prometheusrule.test.yaml: each alert
  fires on synthetic series where it should and stays quiet where it should (pending
  within ``for``, below a threshold, another release's series); values that move a
  threshold make those cases fail.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import TOPIC_ROLES, Settings
from sidecar.dlq.reasons import is_known
from sidecar.kafka.topics import create_topics
from sidecar.lab.demo import DEMO_PROBE, bundled_sample, expected_request_ids, wait_http
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from sidecar.lab.replay import load_file, send
from tests.deploy.tools import (
    CHART,
    HELM_BUILD_TIMEOUT_S,
    NAMESPACE,
    ROOT,
    RUN_TIMEOUT_S,
    refusal,
    render,
)
from tests.kafka.harness import settings_for

ALERT_CASES = Path(__file__).parent / "alerts" / "prometheusrule.test.yaml"
# labels Prometheus gives every series of a target (ServiceMonitor / PodMonitor), which
# the sidecar itself never writes; and the scrape's own series
TARGET_LABELS = frozenset({"namespace", "job", "pod", "instance"})
SCRAPE_SERIES = frozenset({"up"})
# exported only with an LLM judge configured (GUARDRAIL_JUDGE__ENDPOINT), which the scraped
# sidecar here has not; their names are read through the real Prometheus exporter in
# tests/claims/test_judge.py (test_the_judges_calls_and_breaker_are_scraped_from_the_sidecar)
JUDGE_SERIES = frozenset({"guardrail_judge_breaker_open", "guardrail_judge_failed_total"})
# label values the sample's traffic cannot give, each pinned where it is made: a verdict
# its topic refuses (tests/kafka/test_publish_errors.py counts guardrail.dead_letters
# {reason="output-too-large"}); any value here must be a dead-letter reason of the catalogue
UNSCRAPED_VALUES = frozenset({("guardrail_dead_letters_total", "reason", "output-too-large")})
# both tools may be built on first use (minutes each)
TOOLS_TIMEOUT_S = 2 * HELM_BUILD_TIMEOUT_S + RUN_TIMEOUT_S
TRAFFIC_TIMEOUT_S = 120.0

_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_BY = re.compile(r"\bby\s*\(([^)]*)\)\s*\(")
_ON = re.compile(r"\bon\s*\(([^)]*)\)")
_NAMED = re.compile(r"\bguardrail_[a-z0-9_]+")


# ------------------------------------------------------------------- the rules


def rules(helm: Path, *args: str) -> list[dict[str, Any]]:
    """The alerting rules of the chart's PrometheusRule, rendered with ``args``."""
    manifests = render(helm, CHART, "--set", "prometheusRule.enabled=true", *args)
    (rule,) = [m for m in manifests if m["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    assert len(groups) == 1, groups
    found: list[dict[str, Any]] = groups[0]["rules"]
    assert found and all("alert" in r for r in found), found
    return found


def write_rules(path: Path, found: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"groups": [{"name": "guardrail", "rules": found}]}))
    return path


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each ``name{matchers}`` of an expression, its matchers as (label, op, value)."""
    return [(name, _MATCHER.findall(body)) for name, body in _SELECTOR.findall(expr)]


def _labels(text: str) -> set[str]:
    return {label.strip() for label in text.split(",") if label.strip()}


def grouped(expr: str) -> list[tuple[set[str], str]]:
    """Each aggregation ``by (labels) (inner)`` of an expression, as (labels, inner).

    A join ``on (labels)`` must join on labels that the aggregations on either side of it
    keep (checked here), so they reach the series as those aggregations' own labels.
    """
    aggregations: list[tuple[int, set[str], str]] = []  # (where, labels, inner)
    for match in _BY.finditer(expr):
        start, depth = match.end() - 1, 0  # the "(" that opens what is aggregated
        for end in range(start, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[end], 0)
            if depth == 0:
                break
        aggregations.append((match.start(), _labels(match.group(1)), expr[start : end + 1]))
    for join in _ON.finditer(expr):
        on = _labels(join.group(1))
        before = [labels for at, labels, _ in aggregations if at < join.start()][-1:]
        after = [labels for at, labels, _ in aggregations if at > join.start()][:1]
        for labels in before + after:
            assert on <= labels, f"joins on {sorted(on)}, an aggregation keeps {labels}: {expr}"
    return [(labels, inner) for _, labels, inner in aggregations]


def promtool_run(promtool: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


# ------------------------------------------------------- a sidecar's real scrape

Scrape = dict[str, list[tuple[dict[str, str], float]]]  # sample name -> (labels, value)


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def sidecar_env(settings: Settings, http_port: int, prometheus_port: int) -> dict[str, str]:
    """``guardrail run``'s environment: the test's topics, metrics on, the demo's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GUARDRAIL_", "OTEL_"))}
    topics = {
        f"GUARDRAIL_TOPICS__{role.upper()}": getattr(settings.topics, role) for role in TOPIC_ROLES
    }
    return env | topics | {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "GUARDRAIL_KAFKA__GROUP_ID": settings.kafka.group_id,
        "GUARDRAIL_HTTP__HOST": "127.0.0.1",
        "GUARDRAIL_HTTP__PORT": str(http_port),
        "GUARDRAIL_METRICS__PROMETHEUS_HOST": "127.0.0.1",
        "GUARDRAIL_METRICS__PROMETHEUS_PORT": str(prometheus_port),
        "GUARDRAIL_JOIN__TTL_MS": "3000",  # the recording's lone retrieval: incomplete soon
        "GUARDRAIL_COVERAGE__REPORT_INTERVAL_S": "1",
        "GUARDRAIL_COVERAGE__PROBE_FILE": str(ROOT / DEMO_PROBE),  # delta for the bound
    }  # fmt: skip


@contextmanager
def running_sidecar(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "run"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, done: Any, what: str) -> Scrape:
    """Scrape until ``done(scrape)``; fail naming ``what`` and the sidecar's log's end."""
    deadline = time.monotonic() + TRAFFIC_TIMEOUT_S
    while True:
        assert proc.poll() is None, f"the sidecar exited:\n{log.read_text()[-4000:]}"
        got = scrape(url)
        if done(got):
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"no scrape showed {what} within {TRAFFIC_TIMEOUT_S:.0f}s")
        time.sleep(0.5)


def final_verdicts(got: Scrape) -> float:
    counts = got.get("guardrail_verdicts_total", [])
    return sum(value for labels, value in counts if labels.get("stage") == "final")


def labelled(got: Scrape) -> float:
    return sum(
        value
        for name in (
            "guardrail_coverage_window_labelled_covered",
            "guardrail_coverage_window_labelled_uncovered",
        )
        for _, value in got.get(name, [])
    )


def _matched(name: str, matchers: list[tuple[str, str, str]], series: list[dict[str, str]]) -> None:
    """Each label an alert matches ``name`` on is on its scraped ``series``, and each value
    it asks for with ``=`` appears (or is one the traffic cannot give, pinned elsewhere)."""
    for label, op, value in matchers:
        if label in TARGET_LABELS:
            continue
        assert any(label in s for s in series), f"{name} has no label {label}: {series}"
        if op == "=" and (name, label, value) in UNSCRAPED_VALUES:
            assert is_known(value), value
        elif op == "=":
            assert any(s.get(label) == value for s in series), (
                f"{name}{{{label}={value!r}}} never appears: {series}"
            )


@pytest.mark.connected
@pytest.mark.timeout(HELM_BUILD_TIMEOUT_S + 2 * TRAFFIC_TIMEOUT_S + RUN_TIMEOUT_S)
def test_every_series_an_alert_reads_is_in_a_real_scrape(
    helm: Path, kafka_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    found = rules(helm)
    wanted: dict[str, list[tuple[str, str, str]]] = {}  # name -> its matchers, all uses
    for rule in found:
        for name, matchers in selectors(rule["expr"]):
            wanted.setdefault(name, []).extend(matchers)
    named = {n for r in found for text in r["annotations"].values() for n in _NAMED.findall(text)}
    exported = (set(wanted) | named) - SCRAPE_SERIES - JUDGE_SERIES

    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    asyncio.run(create_topics(settings))
    records = load_file(bundled_sample(), settings)
    feedback = [r for r in records if r.topic == settings.topics.feedback]
    inputs = [r for r in records if r.topic != settings.topics.feedback]
    requests = len(expected_request_ids(records))
    assert feedback and requests, "the demo recording has no feedback or no requests"
    http_port, prometheus_port = free_port(), free_port()
    url = f"http://127.0.0.1:{prometheus_port}/metrics"
    log = tmp_path / "sidecar.log"
    with running_sidecar(sidecar_env(settings, http_port, prometheus_port), log) as proc:
        wait_http(f"http://127.0.0.1:{http_port}/readyz", proc, "the sidecar", 90)
        asyncio.run(send(settings, inputs))
        wait_for(
            url,
            proc,
            log,
            lambda got: final_verdicts(got) >= requests,
            f"a final verdict for each of the recording's {requests} requests",
        )
        # labels come after the verdicts, as from users: the coverage bound and the
        # certified allow's re-test count them in their windows
        asyncio.run(send(settings, feedback))
        got = wait_for(
            url,
            proc,
            log,
            lambda got: labelled(got) >= len(feedback),
            f"the recording's {len(feedback)} feedback labels in the coverage windows",
        )

    missing = sorted(exported - set(got))
    assert not missing, f"the alerts read series the sidecar does not export: {missing}"
    for name, matchers in wanted.items():
        if name in SCRAPE_SERIES | JUDGE_SERIES:
            continue
        _matched(name, matchers, [labels for labels, _ in got[name]])
    for rule in found:  # a label grouped by is on every series of that aggregation
        for labels, inner in grouped(rule["expr"]):
            for name, _ in selectors(inner):
                if name not in SCRAPE_SERIES | JUDGE_SERIES:
                    for label in labels - TARGET_LABELS:
                        assert all(label in s for s, _ in got[name]), (
                            f"{rule['alert']} groups by {label}, which {name} lacks"
                        )


# ------------------------------------------------------------------ promtool

RENDERINGS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "inject": ("-f", str(CHART / "ci" / "inject-values.yaml")),
    "values-prod": ("-f", str(ROOT / "helm" / "values-prod.yaml")),
    "own-selector": (
        "--set-string",
        'prometheusRule.selector=cluster="eu-1"\\,app_kubernetes_io_instance="guardrail"',
        "--set",
        "prometheusRule.alerts.consumerLag.threshold=50000",
        "--set",
        "prometheusRule.alerts.deadLetters.window=30m",
        # a fraction through --set reaches the chart as a string ("0.25"): the schema
        # refused it (want number), so --set could not move a ratio
        "--set",
        "prometheusRule.alerts.deadLetters.ratio=0.25",
        "--set",
        "prometheusRule.alerts.hallucinationBound.target=.2",
        "--set-json",
        'prometheusRule.alertLabels={"team":"rag","severity":"ignored"}',
    ),
}


@pytest.mark.timeout(TOOLS_TIMEOUT_S)
@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_promtool_accepts_every_rendering_of_the_rules(
    name: str, helm: Path, promtool: Path, tmp_path: Path
) -> None:
    found = rules(helm, *RENDERINGS[name])
    path = write_rules(tmp_path / "rules.yaml", found)
    checked = promtool_run(promtool, "check", "rules", "--lint=all", "--lint-fatal", path)
    assert checked.returncode == 0, f"{checked.stdout}\n{checked.stderr}"
    assert f"SUCCESS: {len(found)} rules found" in checked.stdout, checked.stdout
    for rule in found:
        # every series an alert reads is this release's: no guardrail_* name without the selector
        bare = _SELECTOR.sub("", rule["expr"])
        assert not _NAMED.search(bare) and not re.search(r"\bup\b", bare), rule["expr"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule
        assert rule["annotations"]["summary"], rule
        assert "First:" in rule["annotations"]["description"], (
            f"{rule['alert']}: the description has no runbook line (First: ...)"
        )
    if name == "own-selector":
        for rule in found:
            for _, matchers in selectors(rule["expr"]):
                assert ("cluster", "=", "eu-1") in matchers and not any(
                    label == "job" for label, _, _ in matchers
                ), rule["expr"]
            assert rule["labels"]["team"] == "rag"
        (lag,) = [r for r in found if r["alert"] == "GuardrailConsumerLagGrowing"]
        assert "> 50000" in lag["expr"]
        (dead,) = [r for r in found if r["alert"] == "GuardrailDeadLettersHigh"]
        assert re.search(r"\)\s*> 0\.25\s*$", dead["expr"]), dead["expr"]
        (bound,) = [r for r in found if r["alert"] == "GuardrailHallucinationBoundHigh"]
        assert re.search(r"> \.2\b", bound["expr"]), bound["expr"]


@pytest.mark.timeout(TOOLS_TIMEOUT_S)
@pytest.mark.parametrize(
    "value", ["0", "0.0", "1.5", "abc", "0.3 or vector(1)", "-0.1", "5e-2", "0.3\n"]
)
def test_a_threshold_given_as_a_string_must_spell_a_fraction(helm: Path, value: str) -> None:
    """A string ratio goes into the rule's PromQL as written: only a number in (0, 1] may."""
    said = refusal(
        helm,
        CHART,
        "--set",
        "prometheusRule.enabled=true",
        "--set-string",
        f"prometheusRule.alerts.incompleteVerdicts.ratio={value}",
    )
    assert "/prometheusRule/alerts/incompleteVerdicts/ratio" in said, said


@pytest.mark.timeout(TOOLS_TIMEOUT_S)
@pytest.mark.parametrize("monitor", ["ServiceMonitor", "PodMonitor"])
def test_the_default_selector_is_the_job_of_the_charts_own_monitors(
    helm: Path, monitor: str
) -> None:
    """A ServiceMonitor's targets get job=<Service name>; a PodMonitor's job=<namespace>/<name>.

    The chart renders one of the two (both at once is refused: every pod scraped twice);
    with either, the rules' job matcher must select the job that monitor gives its targets.
    """
    key = {"ServiceMonitor": "serviceMonitor", "PodMonitor": "podMonitor"}[monitor]
    manifests = render(
        helm, CHART, "--set", "prometheusRule.enabled=true", "--set", f"metrics.{key}.enabled=true"
    )
    by_kind = {m["kind"]: m for m in manifests}
    other = ({"ServiceMonitor", "PodMonitor"} - {monitor}).pop()
    assert monitor in by_kind and other not in by_kind
    if monitor == "ServiceMonitor":
        (port,) = [
            p["port"]
            for p in by_kind["Service"]["spec"]["ports"]
            if p["name"] == by_kind["ServiceMonitor"]["spec"]["endpoints"][0]["port"]
        ]
        assert port == 9464
        job = by_kind["Service"]["metadata"]["name"]
    else:
        job = f"{NAMESPACE}/{by_kind['PodMonitor']['metadata']['name']}"
    for rule in by_kind["PrometheusRule"]["spec"]["groups"][0]["rules"]:
        for _, matchers in selectors(rule["expr"]):
            assert ("namespace", "=", NAMESPACE) in matchers, rule["expr"]
            (pattern,) = [v for label, op, v in matchers if label == "job" and op == "=~"]
            # Prometheus anchors =~ matchers at both ends
            assert re.fullmatch(pattern, job), (rule["alert"], pattern, job)
            assert not re.fullmatch(pattern, f"{NAMESPACE}/another-app"), pattern


def unit_test(
    promtool: Path, found: list[dict[str, Any]], where: Path
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` of the cases on ``found``, descriptions left out (the cases
    compare annotations whole: the summaries are checked, the descriptions' templates are
    parsed by ``promtool check rules``)."""
    where.mkdir()
    bare = [r | {"annotations": {"summary": r["annotations"]["summary"]}} for r in found]
    write_rules(where / "rules.yaml", bare)
    shutil.copy(ALERT_CASES, where / ALERT_CASES.name)
    return promtool_run(promtool, "test", "rules", where / ALERT_CASES.name)


@pytest.mark.timeout(TOOLS_TIMEOUT_S)
def test_every_alert_fires_and_stays_quiet_as_its_cases_say(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    found = rules(helm)
    cases = yaml.safe_load(ALERT_CASES.read_text())
    checks = [c for group in cases["tests"] for c in group["alert_rule_test"]]
    names = {r["alert"] for r in found}
    assert {c["alertname"] for c in checks if c["exp_alerts"]} == names, "an alert never fires"
    assert {c["alertname"] for c in checks if not c["exp_alerts"]} == names, "an alert never quiet"
    tested = unit_test(promtool, found, tmp_path / "defaults")
    assert tested.returncode == 0, f"{tested.stdout}\n{tested.stderr}"
    assert "SUCCESS" in tested.stdout, tested.stdout


@pytest.mark.timeout(TOOLS_TIMEOUT_S)
@pytest.mark.parametrize(
    ("value", "alert"),
    [
        ("prometheusRule.alerts.deadLetters.ratio=0.1", "GuardrailDeadLettersHigh"),
        (
            "prometheusRule.alerts.hallucinationBound.minLabelled=200",
            "GuardrailHallucinationBoundHigh",
        ),
        ('prometheusRule.alerts.down.for="15m"', "GuardrailSidecarDown"),
        ('prometheusRule.alerts.judgeBreakerOpen.window="30s"', "GuardrailJudgeBreakerOpen"),
    ],
)
def test_a_moved_threshold_fails_its_cases(
    value: str, alert: str, helm: Path, promtool: Path, tmp_path: Path
) -> None:
    """The cases can fail: the values reach the rules, and a case sits on each side."""
    tested = unit_test(promtool, rules(helm, "--set-json", value), tmp_path / "moved")
    assert tested.returncode != 0, tested.stdout
    assert f"alertname: {alert}" in tested.stderr + tested.stdout, tested.stderr
