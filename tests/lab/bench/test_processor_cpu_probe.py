"""``bench/paired_drains.py --processor-cpu``: the probe times what the service hands its
processor, in the process it is put in, and the bench splits a run's CPU with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.paired_drains import PROBES, probed, processor_cpu, with_rest

REPO = Path(__file__).resolve().parents[3]

# a process started as the bench starts one: the probe's folder first on PYTHONPATH
HANDED_TO_THE_PROCESSOR = """
import asyncio, types
from sidecar.kafka.app import SidecarService

def busy(n):
    return sum(i * i for i in range(n))

service = types.SimpleNamespace(_worker=None)  # the processor on the loop: called in place
print(asyncio.run(SidecarService._in_worker(service, busy, 300_000)))
print(asyncio.run(SidecarService._in_worker(service, busy, 10)))
"""


def test_the_probe_times_every_call_handed_to_the_processor(tmp_path: Path) -> None:
    env = {**os.environ, **probed({}, tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", HANDED_TO_THE_PROCESSOR],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == [str(sum(i * i for i in range(300_000))), "285"]  # results kept
    [written] = tmp_path.glob("processor-cpu.*.json")
    spent = json.loads(written.read_text())
    assert spent["calls"] == 2
    assert spent["processor_cpu_s"] > 0.001  # 300,000 squares: milliseconds of CPU
    report = processor_cpu(tmp_path, requests=1000)
    assert report["processor_calls"] == 2
    assert report["processor_cpu_us_per_request"] == round(spent["processor_cpu_s"] * 1e3, 1)
    assert list(tmp_path.iterdir()) == []  # read once: the next drain's file is its own


def test_without_the_folder_the_probe_changes_nothing(tmp_path: Path) -> None:
    code = "from sidecar.kafka.app import SidecarService as S; print(S._in_worker.__qualname__)"
    env = {**os.environ, "PYTHONPATH": f"{PROBES}:{REPO}"}
    env.pop("BENCH_PROBE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "SidecarService._in_worker"
    assert processor_cpu(tmp_path, requests=10) == {}


def test_a_side_keeps_its_own_path_and_each_run_gets_its_rest(tmp_path: Path) -> None:
    env = probed({"PYTHONPATH": "/elsewhere", "X": "1"}, tmp_path)
    assert env["PYTHONPATH"].split(":") == [str(PROBES), "/elsewhere", str(REPO)]
    assert env["BENCH_PROBE_DIR"] == str(tmp_path) and env["X"] == "1"
    runs = [
        [{"cpu_us_per_request": 60.0, "processor_cpu_us_per_request": 5.5}],
        [{"cpu_us_per_request": 200.0}],
    ]
    with_rest(runs)
    assert runs[0][0]["rest_cpu_us_per_request"] == 54.5
    assert "rest_cpu_us_per_request" not in runs[1][0]
