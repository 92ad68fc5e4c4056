"""Credentials out of text: URL passwords and the values of credential query parameters.

``config show``, configuration errors and every log line go through :func:`redact_text`
(audit: a password holding "@" or "/" was shown in part or whole, ``?api_key=`` as is,
and the OpenTelemetry exporter logged its endpoint's ``?token=`` on every failed export).
A value that is one URL (a setting) goes through :func:`redact_url` first: in text, the
mask of a password stops at a quote or a space, so one holding them was shown (audit).
"""

from __future__ import annotations

import re

__all__ = ["MASK", "redact_text", "redact_url"]

MASK = "**********"
# the password of a URL's user info, up to the last "@" of the URL (a password may hold "@"
# or "/": audit, "https://bob:s3cr@tPW@llm" showed "tPW", "bob:ab/cd@llm" showed all)
_URL_PASSWORD_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/@:\s'\"]*:)[^\s'\"]*@")
# query parameters that carry credentials (?api_key=, &token=, &sig=, ...)
_SECRET_PARAM_RE = re.compile(
    r"([?&][^=&#\s'\"]*(?:token|key|secret|passw|pwd|sig|auth|credential)[^=&#\s'\"]*=)"
    r"[^&#\s'\"]*",
    re.IGNORECASE,
)


def redact_text(text: str) -> str:
    """``text`` with URL passwords and credential query values replaced by the mask."""
    if "://" not in text and "=" not in text:
        return text
    return _SECRET_PARAM_RE.sub(rf"\1{MASK}", _URL_PASSWORD_RE.sub(rf"\1{MASK}@", text))


def redact_url(url: str) -> str:
    """``url``, one URL as configured, with all of its user info's password masked (whatever
    it holds: a quote, a space, "/" or "@"), or all of a user info without a password (a
    token given as the user: ``https://<token>@host``); then as :func:`redact_text`."""
    scheme, sep, rest = url.partition("://")
    user_info, at, host = rest.rpartition("@")  # the last "@": a password may hold one
    user, colon, _ = user_info.partition(":")
    if sep and at and colon:
        url = f"{scheme}://{user}:{MASK}@{host}"
    elif sep and at and "/" not in user_info:  # not an "@" in the path
        url = f"{scheme}://{MASK}@{host}"
    return redact_text(url)
