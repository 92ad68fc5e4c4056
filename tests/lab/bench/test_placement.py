"""The bench's placements: which CPUs the process under test gets, and that it runs there."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from bench import paired_drains
from sidecar.cli.main import main
from sidecar.exceptions import ConfigError
from sidecar.lab.bench import suite
from sidecar.lab.bench.placement import Placement
from sidecar.lab.chaos.process import SidecarProcess


def test_shared_pins_nothing() -> None:
    shared = Placement.of("shared")
    assert shared.under_test is None
    assert shared.rest is None
    assert shared.report() == {
        "placement": "shared",
        "cpus_under_test": None,
        "cpus_broker_and_load": None,
    }


@pytest.mark.parametrize(
    ("cpus", "under_test", "rest"),
    [
        ([0, 1], {0}, {1}),
        ([1, 0], {0}, {1}),
        ([2, 5, 7], {2}, {5, 7}),
        (range(8), {0, 1, 2, 3}, {4, 5, 6, 7}),
    ],
)
def test_split_gives_the_process_under_test_the_first_half(
    cpus: list[int], under_test: set[int], rest: set[int]
) -> None:
    split = Placement.of("split", cpus)
    assert split.under_test == frozenset(under_test)
    assert split.rest == frozenset(rest)
    assert split.report()["cpus_under_test"] == sorted(under_test)
    assert split.report()["cpus_broker_and_load"] == sorted(rest)


def test_split_needs_two_cpus_and_says_what_to_use() -> None:
    with pytest.raises(ConfigError, match=r"at least 2 CPUs .* may use 1: use --placement shared"):
        Placement.of("split", [3])


def test_an_unknown_placement_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="placement must be one of shared, split, got 'spread'"):
        Placement.of("spread")


def test_applied_moves_every_thread_of_this_process_and_back() -> None:
    before = os.sched_getaffinity(0)
    one = min(before)
    started, stop = threading.Event(), threading.Event()
    native: list[int] = []

    def idle() -> None:
        native.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=idle)
    thread.start()
    started.wait(10)
    placement = Placement("split", frozenset(before), frozenset({one}))
    try:
        with placement.applied():
            assert os.sched_getaffinity(0) == {one}
            assert os.sched_getaffinity(native[0]) == {one}  # started before it applied
        assert os.sched_getaffinity(native[0]) == before  # both moved back
    finally:
        stop.set()
        thread.join()
    assert os.sched_getaffinity(0) == before


# serves /readyz on the port SidecarProcess gives it, after writing the CPUs it may use
READY_ON_CPUS = """
import http.server, os, pathlib
pathlib.Path(os.environ["TEST_CPUS_FILE"]).write_text(
    ",".join(map(str, sorted(os.sched_getaffinity(0))))
)
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
port = int(os.environ["GUARDRAIL_HTTP__PORT"])
http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
"""


def test_the_process_under_test_runs_on_its_cpus(tmp_path: Path) -> None:
    one = min(os.sched_getaffinity(0))
    where = tmp_path / "cpus"
    proc = SidecarProcess(
        {"TEST_CPUS_FILE": str(where)},
        tmp_path / "child.log",
        argv=("-c", READY_ON_CPUS),
        cpus=frozenset({one}),
    )
    proc.start(timeout_s=30)
    try:
        assert where.read_text() == str(one)
    finally:
        proc.signal(signal.SIGTERM, timeout_s=10)


def test_bench_split_on_one_cpu_stops_before_any_run_and_says_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:

    def no_run(*args: object, **kwargs: object) -> dict[str, object]:
        raise AssertionError("a bench ran")

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(suite, "run_bench", no_run)
    assert main(["bench", "--quick", "--placement", "split"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: the split placement needs at least 2 CPUs" in err


def test_paired_drains_split_on_one_cpu_stops_before_any_run_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_broker(*args: object, **kwargs: object) -> dict[str, object]:
        raise AssertionError("a broker started")

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(paired_drains, "on_local_broker", no_broker)
    with pytest.raises(SystemExit, match="--placement: the split placement needs at least 2"):
        paired_drains.main(["--placement", "split", "--pairs", "1"])
