"""Credentials read from files that are read again while the sidecar runs.

A ``..._FILE`` setting (``GUARDRAIL_KAFKA__SASL_PASSWORD_FILE``,
``GUARDRAIL_KAFKA__SASL_USERNAME_FILE``, ``GUARDRAIL_JUDGE__API_KEY_FILE``; the
client key's passphrase file is read with the TLS files, sidecar/kafka/security.py)
names a file whose text, trailing line breaks
dropped, is the secret: a mounted Kubernetes Secret, which the kubelet updates in
place when the Secret changes, or a Vault agent's sink. The environment is read
once, so a password given as a variable stayed the one of the pod's start; a
file is read again every ``SECRET_CHECK_INTERVAL_S`` (as the Kafka TLS files are)
and a changed secret is what the next use reads (a new Kafka connection, the
next judge call). A file that cannot be read, or is empty, stops the start; later,
it keeps the secret read before and is said once (ERROR) until it reads again.
No message holds the secret.

A file is taken only once it reads the same twice ``SECRET_SETTLE_S`` apart, its
size, modification time and inode unchanged: a writer that rewrites it in place
(``echo new > file``, a Vault agent's sink) truncates it and then writes it, and a
single read between the two took an empty file, or the first bytes of the new
secret, for the secret. The kubelet's update (a symlink swapped to a whole new
file) reads whole either way. A writer that pauses longer than ``SECRET_SETTLE_S``
in the middle of a secret can still be read half-way: write such files to a
temporary name and rename them into place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Sequence

from sidecar.exceptions import ConfigError

__all__ = [
    "MAX_SECRET_BYTES",
    "SECRET_CHECK_INTERVAL_S",
    "SECRET_SETTLE_BUDGET_S",
    "SECRET_SETTLE_S",
    "SecretFile",
    "SecretReadings",
    "capped_bytes",
    "check_secret_files",
    "read_secret_files",
    "secret_digest",
    "secret_file",
    "secret_files",
    "take_secret_readings",
    "unfit_file",
]

SECRET_CHECK_INTERVAL_S = 30.0
"""How often the running sidecar reads its secret files again."""

MAX_SECRET_BYTES = 64 * 1024
"""A larger file is no secret (a path set wrong): refused, never read whole into memory."""

SECRET_SETTLE_S = 0.25
"""A file's content is taken once it read the same twice this far apart."""

SECRET_SETTLE_BUDGET_S = 5.0
"""How long a look waits for files that keep changing before it gives up until the next."""

_OPEN: dict[tuple[str, str], SecretFile] = {}
_OPEN_LOCK = threading.Lock()


_Stamp = tuple[int, int, int, int]  # device, inode, size, modification time (ns)


def _stamp(st: os.stat_result) -> _Stamp:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _read_bytes(path: str, limit: int = MAX_SECRET_BYTES) -> tuple[bytes | str, _Stamp | None]:
    """The bytes of ``path`` (or why not, a ``str``), with the file's stamp when it did
    not change while read (``None``: it did, or it is no file); more than ``limit`` bytes
    are refused unread.

    Only a regular file (a Secret volume's, behind its symlinks) is read: a FIFO's read
    blocked until a writer came (the start hung, and a watch thread never returned,
    holding the exit), a device such as /dev/zero never ended."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})", None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return f"is {_kind(before.st_mode)}, not a regular file", None
        if before.st_size > limit:
            return f"is larger than {_bytes(limit)}", None
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
        after = _stamp(os.fstat(fd))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})", None
    finally:
        os.close(fd)
    if len(data) > limit:
        return f"is larger than {_bytes(limit)}", after
    return data, after if after == _stamp(before) else None


def _bytes(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count >> 10} KiB"


def unfit_file(path: str, limit: int) -> str | None:
    """Why ``path`` must not be handed to a reader that opens it itself (OpenSSL loading a
    certificate): it is no regular file (a FIFO blocks the read until a writer comes, a
    device never ends) or it is larger than ``limit`` bytes. ``None``: it is fit, or it
    cannot be opened (the reader then says why in its own words). Looked at through a
    non-blocking descriptor: the look itself never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, not a regular file"
    return f"is larger than {_bytes(limit)}" if st.st_size > limit else None


def _settled(paths: Sequence[str]) -> dict[str, bytes | str]:
    """What each file in ``paths`` holds (its bytes, or why not), once every one of them
    read the same twice ``SECRET_SETTLE_S`` apart with its stamp unchanged; a file still
    changing after ``SECRET_SETTLE_BUDGET_S`` is said to be so. The files are read
    together: two that change together (a username and its password, one Secret) are
    taken from the same moment."""
    deadline = time.monotonic() + SECRET_SETTLE_BUDGET_S
    before = {path: _read_bytes(path) for path in paths}
    while True:
        time.sleep(SECRET_SETTLE_S)
        now = {path: _read_bytes(path) for path in paths}
        changing = [
            path
            for path in paths
            if now[path] != before[path]
            or (now[path][1] is None and not isinstance(now[path][0], str))
        ]
        if not changing:
            return {path: read for path, (read, _) in now.items()}
        if time.monotonic() >= deadline:
            out: dict[str, bytes | str] = {path: read for path, (read, _) in now.items()}
            for path in changing:
                out[path] = (
                    f"kept changing for {SECRET_SETTLE_BUDGET_S:.0f} s (still being written?)"
                )
            return out
        before = now


def capped_bytes(path: str, limit: int) -> bytes | None:
    """What ``path`` holds, read as a secret is (a regular file only, never more than
    ``limit`` bytes); None when it is no such file or cannot be read."""
    read, _ = _read_bytes(path, limit)
    return None if isinstance(read, str) else read


def secret_digest(path: str, limit: int = MAX_SECRET_BYTES) -> str:
    """A digest of what ``path`` holds now, to tell when it changed (one read, no waiting
    for it to settle; a file that is none, unreadable, or larger than ``limit`` bytes has
    a digest of its own)."""
    read, _ = _read_bytes(path, limit)
    return read if isinstance(read, str) else hashlib.sha256(read).hexdigest()


def _decode(data: bytes | str) -> str | tuple[None, str]:
    """The secret in a file's ``data``, or ``(None, why not)``: the reason never holds
    the text."""
    if isinstance(data, str):
        return None, data
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


def _read(path: str) -> str | tuple[None, str]:
    """The secret in ``path`` once the file is settled, or ``(None, why not)``."""
    return _decode(_settled([path])[path])


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

    def __init__(
        self,
        path: str,
        setting: str,
        used_by: str,
        *,
        read: str | tuple[None, str] | None = None,
    ) -> None:
        """``setting``: the variable that names the file (for messages); ``used_by``: who
        takes a changed secret ("new Kafka connections"); ``read``: the file's settled
        reading, taken with others (``None``: read it now). ``ConfigError`` when the file
        does not hold a secret now."""
        self.path, self.setting, self._used_by = path, setting, used_by
        if read is None:
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
        return self._take(_read(self.path))

    def _take(self, read: str | tuple[None, str]) -> tuple[int, str] | None:
        """Hold ``read`` (a settled reading of the file); what to say."""
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
    [opened] = secret_files([(path, setting, used_by)])
    return opened


def secret_files(specs: Sequence[tuple[str, str, str]]) -> list[SecretFile]:
    """:func:`secret_file` for each ``(path, setting, used_by)``, the files not opened yet
    read together (settled from one moment, as the watch reads them): opened one after the
    other, a username read before a Secret's update and its password after it were taken
    as a pair at start (an authentication the broker refuses: exit 2)."""
    with _OPEN_LOCK:
        new = [(path, setting) for path, setting, _ in specs if (setting, path) not in _OPEN]
        read = _settled(sorted({path for path, _ in new})) if new else {}
        for path, setting, used_by in specs:
            if (setting, path) not in _OPEN:
                _OPEN[setting, path] = SecretFile(path, setting, used_by, read=_decode(read[path]))
        return [_OPEN[setting, path] for path, setting, _ in specs]


SecretReadings = list[tuple[SecretFile, str | tuple[None, str]]]
"""What :func:`read_secret_files` read: each opened secret with its file's reading."""


def read_secret_files() -> SecretReadings:
    """Read every secret file opened by :func:`secret_file` again, settled (file I/O and
    sleeps: off the event loop); :func:`take_secret_readings` then holds what was read."""
    with _OPEN_LOCK:
        opened = list(_OPEN.values())
    if not opened:
        return []
    read = _settled(sorted({secret.path for secret in opened}))
    return [(secret, _decode(read[secret.path])) for secret in opened]


def take_secret_readings(readings: SecretReadings) -> list[tuple[int, str]]:
    """Hold ``readings`` (of :func:`read_secret_files`) all at once; what to log. Run it on
    the event loop, where the Kafka clients read their credentials: a connection opened
    there sees the username and the password both before or both after. Taken one after
    the other on the watch thread, a connection opened in between paired the new username
    with the old password (a refused authentication, then a retry)."""
    return [said for secret, read in readings if (said := secret._take(read))]


def check_secret_files() -> list[tuple[int, str]]:
    """Read every secret file opened by :func:`secret_file` again and hold what it holds
    (:func:`read_secret_files`, then :func:`take_secret_readings`); what to log."""
    return take_secret_readings(read_secret_files())
