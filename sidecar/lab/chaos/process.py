"""The sidecar as its own OS process (as in a pod), for chaos runs, the demo and tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from sidecar.exceptions import SidecarNotReadyError
from sidecar.lab.localkafka.broker import free_port


class SidecarProcess:
    """``python -m sidecar run`` with its own environment, log file and health port."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        argv: Sequence[str] = ("-m", "sidecar", "run"),
        *,
        cpus: frozenset[int] | None = None,
    ) -> None:
        """``argv``: what the interpreter runs (default ``-m sidecar run``; the bench's
        floors run ``-m sidecar.lab.bench.floors``); it must serve ``/readyz``.
        ``cpus``: the CPUs it runs on (default: this process's)."""
        self.argv = tuple(argv)
        self.cpus = cpus
        self.port = free_port()
        self.env = {
            **os.environ,
            **env,
            "GUARDRAIL_HTTP__PORT": str(self.port),
            "GUARDRAIL_HTTP__HOST": "127.0.0.1",
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self, timeout_s: float = 60.0) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *self.argv],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        if self.cpus is not None:  # at once: threads it starts later inherit the mask
            os.sched_setaffinity(self.proc.pid, self.cpus)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SidecarNotReadyError(
                    f"the sidecar exited with {self.proc.returncode}:\n{self.tail()}"
                )
            if self.ready():
                return
            time.sleep(0.2)
        raise SidecarNotReadyError(
            f"the sidecar was not ready within {timeout_s:.0f}s:\n{self.tail()}"
        )

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def signal(self, sig: int, timeout_s: float = 60.0) -> int:
        assert self.proc is not None  # noqa: S101 - started first
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout_s)

    def tail(self, limit: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-limit:]
        except FileNotFoundError:
            return ""

    def rss_mb(self) -> float | None:
        pid = self.pid
        if pid is None:
            return None
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        except OSError:
            return None
        return None
