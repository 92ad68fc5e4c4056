"""Credentials out of text: URL passwords and the values of credential query parameters.

``config show``, configuration errors and every log line go through :func:`redact_text`
(audit: a password holding "@" or "/" was shown in part or whole, ``?api_key=`` as is,
and the OpenTelemetry exporter logged its endpoint's ``?token=`` on every failed export).
"""

from __future__ import annotations

import re

__all__ = ["MASK", "redact_text"]

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
