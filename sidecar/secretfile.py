"""Credentials read from files that are read again while the sidecar runs.

A ``..._FILE`` setting (``GUARDRAIL_KAFKA__SASL_PASSWORD_FILE``,
``GUARDRAIL_JUDGE__API_KEY_FILE``) names a file whose text, trailing line breaks
dropped, is the secret: a mounted Kubernetes Secret, which the kubelet updates in
place when the Secret changes, or a Vault agent's sink. The environment is read
once, so a password given as a variable stayed the one of the pod's start; a
file is read again every ``SECRET_CHECK_INTERVAL_S`` (as the Kafka TLS files are)
and a changed secret is what the next use reads (a new Kafka connection, the
next judge call). A file that cannot be read, or is empty, stops the start; later,
it keeps the secret read before and is said once (ERROR) until it reads again.
No message holds the secret.
"""

from __future__ import annotations

import logging
import os
import stat
import threading

from sidecar.exceptions import ConfigError

__all__ = [
    "MAX_SECRET_BYTES",
    "SECRET_CHECK_INTERVAL_S",
    "SecretFile",
    "check_secret_files",
    "secret_file",
]

SECRET_CHECK_INTERVAL_S = 30.0
"""How often the running sidecar reads its secret files again."""

MAX_SECRET_BYTES = 64 * 1024
"""A larger file is no secret (a path set wrong): refused, never read whole into memory."""

_OPEN: dict[tuple[str, str], SecretFile] = {}
_OPEN_LOCK = threading.Lock()


def _read_bytes(path: str) -> bytes | tuple[None, str]:
    """The bytes of ``path``, or ``(None, why not)``.

    Only a regular file (a Secret volume's, behind its symlinks) is read: a FIFO's read
    blocked until a writer came (the start hung, and a watch thread never returned,
    holding the exit), a device such as /dev/zero never ended."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or type(exc).__name__})"
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return None, f"is {_kind(mode)}, not a regular file"
        data = b""
        while len(data) <= MAX_SECRET_BYTES:
            chunk = os.read(fd, MAX_SECRET_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or type(exc).__name__})"
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        return None, f"is larger than {MAX_SECRET_BYTES // 1024} KiB"
    return data


def _read(path: str) -> str | tuple[None, str]:
    """The secret in ``path``, or ``(None, why not)``: the reason never holds the text."""
    data = _read_bytes(path)
    if isinstance(data, tuple):
        return data
    try:
        text = data.decode("utf-8-sig")  # a leading BOM (Notepad) is no part of the secret
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    text = text.rstrip("\r\n")
    if not text.strip():
        return None, "is empty"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return None, "holds a control character (a line break inside the secret?)"
    return text


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "no file"


class SecretFile:
    """One secret and the file it is read from: :meth:`value` is the last good reading,
    :meth:`check` reads the file again (file I/O: off the event loop)."""

    def __init__(self, path: str, setting: str, used_by: str) -> None:
        """``setting``: the variable that names the file (for messages); ``used_by``: who
        takes a changed secret ("new Kafka connections"). ``ConfigError`` when the file
        does not hold a secret now."""
        self.path, self.setting, self._used_by = path, setting, used_by
        read = _read(path)
        if isinstance(read, tuple):
            raise ConfigError(
                f"{setting}={path}: the file {read[1]}; it must be a readable file holding "
                "the secret (UTF-8, one line; a trailing line break is dropped)"
            )
        self._value = read
        self._failing = False

    def value(self) -> str:
        """The secret as last read (a ``str`` swap: safe from any thread)."""
        return self._value

    def check(self) -> tuple[int, str] | None:
        """Read the file again; a log level and line when that changed something to say."""
        read = _read(self.path)
        if isinstance(read, tuple):
            if self._failing:
                return None  # said once per outage, not every look
            self._failing = True
            return logging.ERROR, (
                f"{self.setting}={self.path}: the file {read[1]}; {self._used_by} keep using "
                "the secret read before until it holds one again"
            )
        recovered, self._failing = self._failing, False
        if read == self._value:
            if not recovered:
                return None
            return logging.INFO, f"{self.setting}={self.path}: the file reads again, unchanged"
        self._value = read
        return logging.INFO, (
            f"{self.setting}={self.path}: the secret changed on disk; {self._used_by} use it"
        )


def secret_file(path: str, setting: str, used_by: str) -> SecretFile:
    """The process's one :class:`SecretFile` for ``setting`` and ``path`` (read the first
    time: ``ConfigError`` if it holds no secret), which :func:`check_secret_files` keeps
    in step with the file."""
    key = (setting, path)
    with _OPEN_LOCK:
        opened = _OPEN.get(key)
        if opened is None:
            opened = _OPEN[key] = SecretFile(path, setting, used_by)
    return opened


def check_secret_files() -> list[tuple[int, str]]:
    """Read every secret file opened by :func:`secret_file` again; what to log."""
    with _OPEN_LOCK:
        opened = list(_OPEN.values())
    return [said for secret in opened if (said := secret.check()) is not None]
