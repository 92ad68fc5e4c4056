"""Secrets read from ``..._FILE`` settings: checked at start, read again while running.

Before, the SASL password and the judge's API key came from environment variables
only, read once: rotating them (a Kubernetes Secret updated, a Vault agent writing
a file) took a pod restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from sidecar import runtime, secretfile
from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.security import sasl_password, sasl_username
from sidecar.secretfile import (
    MAX_SECRET_BYTES,
    SECRET_SETTLE_S,
    SecretFile,
    check_secret_files,
    secret_file,
)

SECRET = "s3cret-Rotating-Pa55"  # noqa: S105 - a test secret, looked for in messages
SASL = {
    "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
    "GUARDRAIL_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
    "GUARDRAIL_KAFKA__SASL_USERNAME": "guardrail",
}
JUDGE = {
    "GUARDRAIL_JUDGE__ENDPOINT": "https://judge.example:8443/v1",
    "GUARDRAIL_JUDGE__MODEL": "judge-7b",
}


def _load(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings.load()


def _secret(tmp_path: Path, text: str = SECRET + "\n", name: str = "secret") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------- settings


def test_the_password_and_the_key_can_be_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = str(_secret(tmp_path))
    settings = _load(
        monkeypatch,
        {
            **SASL,
            **JUDGE,
            "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": path,
            "GUARDRAIL_JUDGE__API_KEY_FILE": path,
        },
    )
    assert settings.kafka.sasl_password_file == path
    assert settings.kafka.sasl_password is None
    assert settings.judge.api_key_file == path


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (
            {
                **SASL,
                "GUARDRAIL_KAFKA__SASL_PASSWORD": SECRET,
                "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": "/run/secrets/kafka",
            },
            "GUARDRAIL_KAFKA__SASL_PASSWORD",
        ),
        (
            {
                **JUDGE,
                "GUARDRAIL_JUDGE__API_KEY": SECRET,
                "GUARDRAIL_JUDGE__API_KEY_FILE": "/run/secrets/judge",
            },
            "GUARDRAIL_JUDGE__API_KEY",
        ),
        (
            {
                **SASL,
                "GUARDRAIL_KAFKA__SASL_PASSWORD": "x",
                "GUARDRAIL_KAFKA__SASL_USERNAME_FILE": "/run/secrets/kafka-user",
            },
            "GUARDRAIL_KAFKA__SASL_USERNAME",
        ),
        (
            {
                "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SSL",
                "GUARDRAIL_KAFKA__SSL_CERTFILE": "/run/tls/tls.crt",
                "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD": SECRET,
                "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE": "/run/tls/key-password",
            },
            "GUARDRAIL_KAFKA__SSL_KEY_PASSWORD",
        ),
    ],
    ids=["sasl-password", "judge-key", "sasl-username", "ssl-key-password"],
)
def test_a_secret_given_both_ways_stops_the_start_and_says_which(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], variable: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(monkeypatch, env)
    message = str(caught.value)
    assert f"{variable} and {variable}_FILE are both set" in message
    assert "unset the other" in message
    assert SECRET not in message


def test_the_username_and_the_key_passphrase_can_be_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = str(_secret(tmp_path))
    sasl = _load(
        monkeypatch,
        {
            **{k: v for k, v in SASL.items() if k != "GUARDRAIL_KAFKA__SASL_USERNAME"},
            "GUARDRAIL_KAFKA__SASL_USERNAME_FILE": path,
            "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": path,
        },
    )
    assert (sasl.kafka.sasl_username_file, sasl.kafka.sasl_username) == (path, None)
    monkeypatch.delenv("GUARDRAIL_KAFKA__SASL_USERNAME_FILE")
    with pytest.raises(ConfigError, match="needs sasl_username") as missing:
        Settings.load()
    assert "GUARDRAIL_KAFKA__SASL_USERNAME_FILE" in str(missing.value)
    for name in SASL:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GUARDRAIL_KAFKA__SASL_PASSWORD_FILE")
    tls = {"GUARDRAIL_KAFKA__SSL_KEY_PASSWORD_FILE": path}
    with pytest.raises(ConfigError, match="ssl_key_password_file set, but security_protocol"):
        _load(monkeypatch, tls)
    monkeypatch.setenv("GUARDRAIL_KAFKA__SECURITY_PROTOCOL", "SSL")
    with pytest.raises(ConfigError, match="ssl_key_password_file set without ssl_certfile"):
        Settings.load()
    settings = _load(monkeypatch, {"GUARDRAIL_KAFKA__SSL_CERTFILE": "/run/tls/tls.crt"})
    assert settings.kafka.ssl_key_password_file == path


@pytest.mark.parametrize("name", ["SASL_USERNAME_FILE", "SASL_PASSWORD_FILE"])
def test_an_unreadable_sasl_file_stops_the_start_before_kafka(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    path = str(_secret(tmp_path))
    env = {
        **{k: v for k, v in SASL.items() if k != "GUARDRAIL_KAFKA__SASL_USERNAME"},
        "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GUARDRAIL_KAFKA__SASL_USERNAME_FILE": path,
        "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": path,
        f"GUARDRAIL_KAFKA__{name}": str(tmp_path / "not-mounted"),
    }
    settings = _load(monkeypatch, env)
    with pytest.raises(ConfigError, match=rf"GUARDRAIL_KAFKA__{name}=.*cannot be read"):
        runtime.check(settings)


def test_a_password_file_counts_for_sasl_and_needs_a_sasl_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="needs sasl_password") as missing:
        _load(monkeypatch, SASL)
    assert "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE" in str(missing.value)
    monkeypatch.delenv("GUARDRAIL_KAFKA__SECURITY_PROTOCOL")
    with pytest.raises(ConfigError, match="sasl_password_file set, but security_protocol"):
        _load(monkeypatch, {"GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": "/run/secrets/kafka"})


# ---------------------------------------------------------------- the file


def test_the_secret_is_the_file_without_its_trailing_line_break(tmp_path: Path) -> None:
    assert SecretFile(str(_secret(tmp_path)), "X_FILE", "users").value() == SECRET
    crlf = _secret(tmp_path, SECRET + " \r\n", "crlf")
    assert SecretFile(str(crlf), "X_FILE", "users").value() == SECRET + " "  # spaces are its own


def test_a_byte_order_mark_is_no_part_of_the_secret(tmp_path: Path) -> None:
    """A file saved by Windows Notepad (or PowerShell's Out-File -Encoding utf8) opens
    with U+FEFF; kept, it was the password's first character: invisible, and every
    SASL authentication failed with no word of why."""
    path = tmp_path / "secret"
    path.write_bytes(b"\xef\xbb\xbf" + SECRET.encode() + b"\r\n")
    assert SecretFile(str(path), "X_FILE", "users").value() == SECRET


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "cannot be read (No such file or directory)"),
        ("", "is empty"),
        ("\n\n", "is empty"),
        (SECRET + "\nsecond line\n", "holds a control character"),
        (b"\xff\xfe" + SECRET.encode(), "is not UTF-8 text"),
    ],
)
def test_a_file_that_holds_no_secret_stops_the_start_without_showing_it(
    tmp_path: Path, content: str | bytes | None, why: str
) -> None:
    path = tmp_path / "secret"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        SecretFile(str(path), "GUARDRAIL_JUDGE__API_KEY_FILE", "the next judge calls")
    message = str(caught.value)
    assert message.startswith(f"GUARDRAIL_JUDGE__API_KEY_FILE={path}: the file {why}")
    assert "it must be a readable file holding the secret" in message
    assert SECRET not in message


def _made_in_a_thread(path: str) -> SecretFile | BaseException | None:
    """``SecretFile(path)`` or what it raised; ``None`` when it has not returned in 5 s."""
    made: list[SecretFile | BaseException] = []

    def make() -> None:
        try:
            made.append(SecretFile(path, "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE", "users"))
        except BaseException as exc:  # handed to the test
            made.append(exc)

    thread = threading.Thread(target=make, daemon=True)  # a hung read must not hold pytest
    thread.start()
    thread.join(5)
    return made[0] if made else None


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (os.mkfifo, "is a pipe (FIFO), not a regular file"),  # its read waited for a writer
        (os.mkdir, "is a directory, not a regular file"),
        (
            lambda path: path.write_bytes(b"x" * (MAX_SECRET_BYTES + 1)),
            f"is larger than {MAX_SECRET_BYTES // 1024} KiB",
        ),
    ],
    ids=["fifo", "directory", "huge"],
)
def test_only_a_regular_file_of_a_secret_s_size_is_read(
    tmp_path: Path, make: Callable[[Path], object], why: str
) -> None:
    """A FIFO's read blocked until a writer came (the start hung for good, holding the
    secret files' lock; at a later look a watch thread never returned and held the
    process's exit), a device such as /dev/zero never ended, a huge file was read whole."""
    path = tmp_path / "secret"
    make(path)
    made = _made_in_a_thread(str(path))
    assert made is not None, "reading the file did not return"
    assert isinstance(made, ConfigError)
    assert str(made).startswith(f"GUARDRAIL_KAFKA__SASL_PASSWORD_FILE={path}: the file {why}")


def test_a_device_is_no_secret_file() -> None:
    made = _made_in_a_thread("/dev/zero")  # read whole, it filled the memory
    assert isinstance(made, ConfigError)
    assert "the file is a device, not a regular file" in str(made)


def test_a_secret_file_that_turns_into_a_pipe_keeps_the_secret(tmp_path: Path) -> None:
    path = _secret(tmp_path)
    secret = SecretFile(str(path), "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE", "new Kafka connections")
    path.unlink()
    os.mkfifo(path)
    said: list[tuple[int, str] | None] = []
    thread = threading.Thread(target=lambda: said.append(secret.check()), daemon=True)
    thread.start()
    thread.join(5)
    assert said, "the look at the file did not return"
    level, line = said[0] or (0, "")
    assert level == logging.ERROR and "is a pipe (FIFO), not a regular file" in line
    assert secret.value() == SECRET


def test_a_rotation_is_read_and_an_outage_is_said_once(tmp_path: Path) -> None:
    path = _secret(tmp_path)
    secret = SecretFile(str(path), "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE", "new Kafka connections")
    assert secret.check() is None  # unchanged: nothing to say
    path.write_text("rotated-Pa55\n")
    level, line = secret.check() or (0, "")
    assert (level, secret.value()) == (logging.INFO, "rotated-Pa55")
    assert "the secret changed on disk; new Kafka connections use it" in line
    path.unlink()  # the kubelet between two versions of the Secret, or a Secret deleted
    level, line = secret.check() or (0, "")
    assert level == logging.ERROR and "cannot be read" in line
    assert "keep using the secret read before" in line
    path.write_text("\n")
    assert [secret.check() for _ in range(5)] == [None] * 5  # one ERROR per outage
    assert secret.value() == "rotated-Pa55"
    path.write_text("rotated-Pa55")
    level, line = secret.check() or (0, "")
    assert level == logging.INFO and "reads again, unchanged" in line
    path.unlink()
    assert (secret.check() or (0, ""))[0] == logging.ERROR  # a new outage is said again
    for said in (line, str(secret.check())):
        assert "rotated-Pa55" not in said and SECRET not in said


# ---------------------------------------------------------------- the running sidecar


def test_a_missing_secret_file_stops_the_start_before_kafka(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = _load(
        monkeypatch,
        {
            **SASL,
            "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9",  # never reached
            "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": str(tmp_path / "not-mounted"),
            "GUARDRAIL_HTTP__ENABLED": "false",
        },
    )
    with pytest.raises(ConfigError, match=r"GUARDRAIL_KAFKA__SASL_PASSWORD_FILE=.*cannot be read"):
        asyncio.run(asyncio.wait_for(runtime.serve(settings), timeout=30))


async def test_the_running_sidecar_reads_its_secret_files_now_and_then(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _secret(tmp_path)
    secret = secret_file(str(path), "GUARDRAIL_JUDGE__API_KEY_FILE", "the next judge calls")
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="sidecar"):
        watching = asyncio.create_task(runtime._watch_secrets(stop, interval_s=0.02))
        path.write_text("rotated-key\n")
        for _ in range(250):
            await asyncio.sleep(0.02)
            if secret.value() == "rotated-key":
                break
        path.unlink()
        for _ in range(500):  # a look takes SECRET_SETTLE_S at least
            await asyncio.sleep(0.02)
            if any(r.levelno == logging.ERROR for r in caplog.records):
                break
        await asyncio.sleep(4 * SECRET_SETTLE_S)  # a few more looks at the missing file
        stop.set()
        await watching
    assert secret.value() == "rotated-key"
    ours = [r for r in caplog.records if str(path) in r.getMessage()]  # other tests' files
    assert [r.levelno for r in ours] == [logging.INFO, logging.ERROR], caplog.text
    assert "the secret changed on disk" in ours[0].getMessage()
    assert "rotated-key" not in caplog.text and SECRET not in caplog.text
    said = [line for _, line in check_secret_files() if str(path) in line]
    assert said == []  # the outage goes on: still nothing more to say


def test_a_secret_rewritten_in_place_is_never_taken_half_written(tmp_path: Path) -> None:
    """``echo new > file``, or a Vault agent rendering its sink in place, truncates the
    file and then writes it: a look in between read an empty file (an ERROR about an
    outage that was none) or the first bytes of the new secret, which new Kafka
    connections (or the next judge calls) then used until the next look."""
    path = _secret(tmp_path)
    secret = SecretFile(str(path), "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE", "new Kafka connections")
    rotated = "rotated-" + "Pa55" * 12
    written = threading.Event()

    def rewrite_in_place() -> None:
        with path.open("w", encoding="utf-8") as file:  # truncated here
            for char in rotated + "\n":
                time.sleep(0.002)
                file.write(char)
                file.flush()
        written.set()

    writer = threading.Thread(target=rewrite_in_place)
    writer.start()
    seen, said = set(), []
    while not written.is_set():
        said.append(secret.check())
        seen.add(secret.value())
    writer.join()
    said.append(secret.check())
    seen.add(secret.value())
    assert seen <= {SECRET, rotated}, f"{len(seen - {SECRET, rotated})} half-written secrets taken"
    assert secret.value() == rotated
    levels = [level for level, _ in filter(None, said)]
    assert levels == [logging.INFO], said  # the change, and no outage


def test_a_start_during_an_in_place_rewrite_waits_for_the_whole_secret(tmp_path: Path) -> None:
    """A pod starting while its secret file is rewritten read it empty (the start
    stopped: 'the file is empty') or half-written (and authenticated with that)."""
    path = _secret(tmp_path)
    rotated = "rotated-" + "Pa55" * 12
    with path.open("w", encoding="utf-8") as file:  # truncated: the writer is at work
        file.write(rotated[:5])
        file.flush()
        finish = threading.Timer(0.1, lambda: path.write_text(rotated + "\n"))
        finish.start()
        secret = SecretFile(str(path), "GUARDRAIL_JUDGE__API_KEY_FILE", "the next judge calls")
    finish.join()
    assert secret.value() == rotated


def test_a_file_that_never_settles_keeps_the_secret_read_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sidecar.secretfile.SECRET_SETTLE_BUDGET_S", 1.0)
    path = _secret(tmp_path)
    secret = SecretFile(str(path), "GUARDRAIL_JUDGE__API_KEY_FILE", "the next judge calls")
    stop = threading.Event()

    def keep_writing() -> None:
        count = 0
        while not stop.is_set():
            count += 1
            path.write_text(f"key-{count}\n")
            time.sleep(0.01)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        level, line = secret.check() or (0, "")
    finally:
        stop.set()
        writer.join()
    assert level == logging.ERROR
    assert "the file kept changing for 1 s (still being written?)" in line
    assert secret.value() == SECRET


def test_the_start_reads_a_username_and_its_password_from_one_moment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The start opened the username file, then the password file, each settled on its
    own (0.25 s at least): a Secret updated between the two (the kubelet swaps both at
    once) gave the new user with the old password, or the old user with the new one, and
    the broker refused the start (exit 2). The two are read together now, as the watch
    reads them."""
    user = _secret(tmp_path, "guardrail-v1\n", "username")
    password = _secret(tmp_path, "pa55-v1\n", "password")
    settings = _load(
        monkeypatch,
        {
            **{k: v for k, v in SASL.items() if k != "GUARDRAIL_KAFKA__SASL_USERNAME"},
            "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "GUARDRAIL_KAFKA__SASL_USERNAME_FILE": str(user),
            "GUARDRAIL_KAFKA__SASL_PASSWORD_FILE": str(password),
        },
    )
    settled = secretfile._settled

    def then_updated(paths: Sequence[str]) -> dict[str, bytes | str]:
        read = settled(paths)
        user.write_text("guardrail-v2\n")  # the Secret changes right after this read
        password.write_text("pa55-v2\n")
        return read

    monkeypatch.setattr(secretfile, "_settled", then_updated)
    runtime.check(settings)
    pair = (str(sasl_username(settings.kafka)), str(sasl_password(settings.kafka)))
    assert pair in {("guardrail-v1", "pa55-v1"), ("guardrail-v2", "pa55-v2")}, pair
