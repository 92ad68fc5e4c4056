"""Notice that the policy file changed on disk after the process read it.

The policy is read once, at start. Mounted from a ConfigMap the chart does not
render (``policy.existingConfigMap``), an edit reaches the mounted file within a
minute or so, but no pod restarts: every running replica keeps deciding with the
old policy, while a replica that starts later (a crash, an eviction, a scale-out)
decides with the new one. :class:`PolicyFileWatch` re-reads the file now and
then and says so, once per change: which policy is in force, which one the file
now holds (or why it would not load, so a restart would not start), and that a
restart applies it. The certificate files the policy lists (``allow.certified``)
are part of what a start loads, so they are watched too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sidecar.exceptions import ConfigError
from sidecar.hashing import sha256_or_empty
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
    the bytes of the file, or of a certificate file the policy in force lists, changed.
    """

    def __init__(
        self, source: PolicySource, in_force: str, fingerprint_of_file: Callable[[], str]
    ) -> None:
        self._source = source
        self._in_force = in_force
        self._fingerprint_of_file = fingerprint_of_file
        # the certificates as they are now: the engine keeps no bytes of what it loaded
        self._loaded = {source.path: source.sha256} | {
            path: sha256_or_empty(path) for path in source.certificates
        }
        self._seen = self._loaded

    def check(self) -> PolicyNotice | None:
        """What changed since the last check, or ``None``."""
        path = self._source.path
        unreadable: str | None = None
        try:
            digests = {path: hashlib.sha256(read_policy_text(path).encode("utf-8")).hexdigest()}
        except (ConfigError, OSError) as exc:
            digests, unreadable = {path: ""}, str(exc)
        for certificate in self._source.certificates:  # whether it loads: a start says
            digests[certificate] = sha256_or_empty(certificate)
        if digests == self._seen:
            return None
        self._seen = digests
        changed = [p for p, digest in digests.items() if digest != self._loaded[p]]
        if not changed:
            files = "and its certificate files are" if self._source.certificates else "is"
            return PolicyNotice(
                "info", f"the policy file {path} {files} again the one in force ({self._in_force})"
            )
        what = _named(changed, path)
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
                        "info", f"{what} changed on disk, but not its rules: still {now}"
                    )
                return PolicyNotice(
                    "warning",
                    f"{what} changed on disk and the policy file {path} now loads as {now}; "
                    f"{still}: restart the pods to apply it (kubectl rollout restart); until "
                    "then a replica that starts decides with the new one and the others with "
                    "the old",
                )
        return PolicyNotice(
            "warning",
            f"{what} changed on disk and the policy would not load: {unreadable}; "
            f"{still}, and a restarted replica would not start until the file is fixed",
        )


def _named(changed: list[Path], policy: Path) -> str:
    """``the policy file P``, ``the certificate file C``, or both, as they changed."""
    names = [
        f"the policy file {p}" if p == policy else f"the certificate file {p}" for p in changed
    ]
    return " and ".join(names)
