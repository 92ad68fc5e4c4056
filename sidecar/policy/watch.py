"""Notice that the policy file changed on disk after the process read it.

The policy is read once, at start. Mounted from a ConfigMap the chart does not
render (``policy.existingConfigMap``), an edit reaches the mounted file within a
minute or so, but no pod restarts: every running replica keeps deciding with the
old policy, while a replica that starts later (a crash, an eviction, a scale-out)
decides with the new one. :class:`PolicyFileWatch` re-reads the file now and
then and says so, once per change: which policy is in force, which one the file
now holds (or why it would not load, so a restart would not start), and that a
restart applies it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sidecar.exceptions import ConfigError
from sidecar.policy.config import read_policy_text
from sidecar.policy.engine import PolicySource

__all__ = ["POLICY_CHECK_INTERVAL_S", "PolicyFileWatch", "PolicyNotice"]

POLICY_CHECK_INTERVAL_S = 30.0
"""How often the running sidecar re-reads its policy file (a few KB)."""


@dataclass(frozen=True, slots=True)
class PolicyNotice:
    level: Literal["info", "warning"]
    message: str


class PolicyFileWatch:
    """Compares the policy file on disk with the one the process decides with.

    ``in_force`` is the running policy's fingerprint (``name/version@hex``);
    ``fingerprint_of_file`` loads the file as a start would and returns its
    fingerprint (``ConfigError`` when it would not load). It is called only when
    the file's bytes changed.
    """

    def __init__(
        self, source: PolicySource, in_force: str, fingerprint_of_file: Callable[[], str]
    ) -> None:
        self._source = source
        self._in_force = in_force
        self._fingerprint_of_file = fingerprint_of_file
        self._seen = source.sha256

    def check(self) -> PolicyNotice | None:
        """What changed since the last check, or ``None``."""
        path = self._source.path
        unreadable: str | None = None
        try:
            digest = hashlib.sha256(read_policy_text(path).encode("utf-8")).hexdigest()
        except (ConfigError, OSError) as exc:
            digest, unreadable = "", str(exc)
        if digest == self._seen:
            return None
        self._seen = digest
        if digest == self._source.sha256:
            return PolicyNotice(
                "info", f"the policy file {path} is again the one in force ({self._in_force})"
            )
        still = (
            f"this process still decides with {self._in_force} (the policy is read once, at start)"
        )
        if unreadable is None:
            try:
                now = self._fingerprint_of_file()
            except ConfigError as exc:
                unreadable = str(exc)
            else:
                if now == self._in_force:
                    return PolicyNotice(
                        "info",
                        f"the policy file {path} changed on disk, but not its rules: still {now}",
                    )
                return PolicyNotice(
                    "warning",
                    f"the policy file {path} changed on disk and now holds {now}; {still}: "
                    "restart the pods to apply it (kubectl rollout restart); until then a "
                    "replica that starts decides with the new one and the others with the old",
                )
        return PolicyNotice(
            "warning",
            f"the policy file {path} changed on disk and would not load: {unreadable}; "
            f"{still}, and a restarted replica would not start until the file is fixed",
        )
