"""The README's metrics table names every instrument the sidecar creates, and no other.

The instruments are read from the serving wiring itself: a ``SidecarService`` built
offline around a processor with the m̄1 monitor, the claim check with an LLM judge and
the coverage bound (so every instrument the sidecar can register is registered), its
meter a mock that records each ``create_*`` call. The README side is the first cell of
the table headed ``instrument``: each code span naming ``guardrail.<name>``; a span
``.<name>`` after one names a sibling (``guardrail.join.evictions``, ``.misrouted``),
and ``guardrail.feedback.{unmatched,replaced,early}`` names three. The second cell says
the kind: ``counter``, ``gauge`` or ``histogram`` (plural or not).
"""

from __future__ import annotations

import ast
import functools
import re
from unittest.mock import MagicMock

from opentelemetry.metrics import NoOpMeter

from sidecar.claims.checker import VerifierClaimChecker
from sidecar.claims.judge import JudgeConfig, JudgeRunner
from sidecar.claims.scorer import ClaimScorer
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.telemetry import Telemetry
from tests.claims.conftest import LexicalVerifier
from tests.conftest import REPO
from tests.docs.markdown import code_spans, readme_text, table_headed
from tests.fakes import ThresholdCertifier

_NAME = re.compile(r"(guardrail)?(\.[a-z0-9_]+)+")
_BRACES = re.compile(r"^(guardrail(?:\.[a-z0-9_]+)*)\.\{([^}]*)\}$")
_KIND = {
    "create_counter": "counter",
    "create_observable_counter": "counter",
    "create_up_down_counter": "gauge",
    "create_observable_up_down_counter": "gauge",
    "create_gauge": "gauge",
    "create_observable_gauge": "gauge",
    "create_histogram": "histogram",
}


@functools.cache
def code_instruments() -> dict[str, str]:
    """Every instrument the serving wiring creates: name -> counter | gauge | histogram."""
    settings = Settings()
    meter = MagicMock(spec_set=NoOpMeter("readme"))
    judge = JudgeRunner(JudgeConfig(endpoint="http://judge.invalid/v1", model="m"))
    signals = SignalSuite(
        certifier=ThresholdCertifier(calibration_key="t/c/r"),
        claims=VerifierClaimChecker(ClaimScorer(LexicalVerifier()), judge=judge),
        coverage=CoverageMonitor(),
    )
    processor = Processor(settings, PlaceholderPolicy(), signals=signals)
    SidecarService(settings, processor, telemetry=Telemetry(meter=meter))
    judge.close()
    return {args[0]: _KIND[method] for method, args, _ in meter.method_calls}


def readme_instruments() -> dict[str, str]:
    """Every instrument the README's metrics table names: name -> the kind it gives."""
    table = table_headed(readme_text(), "instrument")
    named: dict[str, str] = {}
    for cells in table.rows:
        kind = re.match(r"\s*(counter|gauge|histogram)", cells[1])
        assert kind is not None, f"README metrics row {cells[0]!r}: kind {cells[1]!r}"
        for name in _names(code_spans(cells[0])):
            named[name] = kind.group(1)
    return named


def _names(spans: list[str]) -> list[str]:
    names: list[str] = []
    parent = ""
    for span in spans:
        braces = _BRACES.match(span)
        if braces:
            prefix, items = braces.groups()
            names += [f"{prefix}.{item.strip()}" for item in items.split(",") if item.strip()]
            parent = prefix
        elif _NAME.fullmatch(span) and span.startswith("guardrail."):
            names.append(span)
            parent = span.rsplit(".", 1)[0]
        elif _NAME.fullmatch(span) and span.startswith(".") and parent:
            names.append(parent + span)
    return names


def test_every_instrument_is_in_the_readme() -> None:
    created = code_instruments()
    assert len(created) > 40, created  # the wiring registered the per-key gauges too
    missing = sorted(set(created) - set(readme_instruments()))
    assert missing == [], f"instruments missing from the README's metrics table: {missing}"


def test_every_instrument_the_readme_names_exists_with_its_kind() -> None:
    created = code_instruments()
    named = readme_instruments()
    unknown = sorted(set(named) - set(created))
    assert unknown == [], f"the README's metrics table names no such instrument: {unknown}"
    wrong = {n: f"README {k}, code {created[n]}" for n, k in named.items() if created[n] != k}
    assert wrong == {}, f"instruments of another kind than the README says: {wrong}"


def test_instruments_are_created_only_where_the_wiring_sees_them() -> None:
    """An instrument made outside ``sidecar/telemetry.py`` would escape the tests above."""
    sources = {
        path: text
        for path in sorted((REPO / "sidecar").rglob("*.py"))
        if path != REPO / "sidecar" / "telemetry.py"
        and "create_" in (text := path.read_text(encoding="utf-8"))
    }
    elsewhere = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path, text in sources.items()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _KIND
    ]
    assert elsewhere == [], f"instruments created outside sidecar/telemetry.py: {elsewhere}"


_PROMETHEUS = re.compile(r"\bguardrail_[a-z0-9_]*[a-z0-9]\b(?![/.])")
_SAMPLE_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def test_every_prometheus_name_the_readme_uses_is_exported() -> None:
    """``guardrail_verdicts_total`` in a query or an alert is ``guardrail.verdicts``."""
    created = code_instruments()
    unknown = []
    for sample in sorted(set(_PROMETHEUS.findall(readme_text()))):
        if (REPO / sample).is_dir():
            continue  # a package (guardrail_client)
        base = sample
        for suffix in _SAMPLE_SUFFIXES:
            base = base.removesuffix(suffix)
        base = base.removesuffix("_seconds")  # the unit the exporter appends
        if not any(name.replace(".", "_") == base for name in created):
            unknown.append(sample)
    assert unknown == [], f"Prometheus names in the README that no instrument exports: {unknown}"
