"""``bench/intake_admit.py``: every record of its load is held (the script stops on any
other admission), also with the partition count known, where each record is on its
request's murmur2 partition and intake must not reroute it."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.claims.conftest import REPO


def test_the_paired_run_holds_every_record_and_prints_both_counts() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "bench/intake_admit.py",
            "--passes",
            "2",
            "--requests",
            "20",
            "--partitions",
            "3",
        ],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.fullmatch(
        r"count unknown: [\d.]+ [\d.]+; 3 partitions: [\d.]+ [\d.]+ us/request "
        r"\(best, median\); paired ratio [\d.]+\n",
        run.stdout,
    ), run.stdout
