"""The ``GUARDRAIL_*`` environment: unknown names refused, Kubernetes service links skipped.

:meth:`sidecar.config.Settings.load` calls :func:`check_environment` before it
builds the settings, and words a validation error with :func:`explain`.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import re
from collections.abc import Mapping, Sequence
from typing import get_args

from pydantic import BaseModel, SecretStr, ValidationError

from sidecar.contracts.common import NAME_PATTERN, NAME_RULE
from sidecar.exceptions import ConfigError

PREFIX = "GUARDRAIL_"

_log = logging.getLogger("sidecar.config")  # the configuration's logger, as operators know it


def check_environment(
    environ: Mapping[str, str], sections: Sequence[str], scalars: Sequence[str] = ()
) -> None:
    """Refuse ``GUARDRAIL_*`` names that are no setting (``sections``: top-level field names).

    The kubelet's service links are logged and skipped; a name that only looks
    like one gets a hint in the ``ConfigError``.
    """
    known = set(sections)
    links = kubernetes_service_links(environ, settings=known)
    if links:
        _log.info(
            "ignoring %d Kubernetes service-link variable(s) (enableServiceLinks: false "
            "in the pod spec turns them off): %s",
            len(links),
            ", ".join(sorted(links)),
        )
    flat = {s.lower() for s in scalars}

    def is_unknown(name: str) -> bool:
        parts = name.upper()[len(PREFIX) :].split("__")
        head = parts[0].lower()
        # GUARDRAIL_LOG_LEVEL__X: a plain setting has no fields; pydantic would ignore it
        return head not in known or (head in flat and len(parts) > 1)

    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith(PREFIX) and name not in links and is_unknown(name)
    )
    if unknown:
        look_alike = [name for name in unknown if _LINK_SUFFIX.search(name)]
        hint = (
            f"; {', '.join(look_alike)} look(s) like Kubernetes service links, but not "
            "ones the kubelet writes (no matching <SERVICE>_SERVICE_HOST, or other "
            "values): set enableServiceLinks: false in the pod spec"
            if look_alike
            else ""
        )
        raise ConfigError(
            f"unknown setting(s) {', '.join(unknown)}; top-level sections are "
            + ", ".join(f"{PREFIX}{f.upper()}" for f in sections)
            + hint
        )


def explain(exc: ValidationError, settings: type[BaseModel] | None = None) -> str:
    """A validation error as one line per wrong variable, named as in the environment.

    A check across variables (a model validator) says which ones in its own words,
    after its section's name (nothing in front for the whole settings), without
    pydantic's ``Value error,``.
    An unknown field of a section (``GUARDRAIL_JOIN__TTL``) is answered with the
    section's fields, the closest first, when ``settings`` (the model) is given.
    The value given is shown, but never a secret's (a ``SecretStr`` field) nor that of
    a field the section does not have.
    """
    lines = ["invalid configuration:"]
    for err in exc.errors():
        loc = [str(p) for p in err["loc"] if p != "__root__"]
        where = PREFIX + "__".join(p.upper() for p in loc)
        kind = err["type"]
        said = (
            str(err.get("ctx", {}).get("error", err["msg"]))
            if kind == "value_error"
            else err["msg"]
        )
        if kind == "value_error" and not _is_field(settings, loc):
            lines.append(f"  {where}: {said}" if loc else f"  {said}")
            continue
        if kind == "extra_forbidden":  # its value not shown: it may be a misspelled secret's
            # (audit: GUARDRAIL_KAFKA__SASL_PASWORD printed the password on the way out)
            lines.append(f"  {where}: no such setting{_fields_hint(settings, loc)}")
            continue
        got = err.get("input")
        hidden = isinstance(got, dict) or got is None or _is_secret(settings, loc)
        shown = "" if hidden else f" (got {got!r})"
        if kind == "string_pattern_mismatch":
            said = _PATTERNS.get(str(err.get("ctx", {}).get("pattern")), said)
        lines.append(f"  {where}: {said}{shown}{_ALLOWED.get(kind, '')}")
    return "\n".join(lines)


# what a pattern means, where pydantic would quote the regular expression
_PATTERNS = {
    NAME_PATTERN: f"a name with {NAME_RULE}",
    r"\S": "must not be blank",
}


# what a value of these types may be, where pydantic's message does not say it
_ALLOWED = {
    "bool_parsing": "; allowed: true or false (also 1/0, yes/no, on/off)",
    "bool_type": "; allowed: true or false (also 1/0, yes/no, on/off)",
    "int_parsing": "; allowed: a whole number",
    "float_parsing": "; allowed: a number",
}


def _model_of(model: type[BaseModel] | None, name: str) -> type[BaseModel] | None:
    """The section model that ``model``'s field ``name`` holds (None: no such section)."""
    field = model.model_fields.get(name) if model is not None else None
    annotation = field.annotation if field is not None else None
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _section(settings: type[BaseModel] | None, loc: Sequence[str]) -> type[BaseModel] | None:
    """The model that holds ``loc``'s last part (None when it cannot be told)."""
    model = settings
    for part in loc[:-1]:
        model = _model_of(model, part)
    return model


def _is_field(settings: type[BaseModel] | None, loc: Sequence[str]) -> bool:
    """Does ``loc`` end at a field (not at a section or the whole settings)?"""
    section = _section(settings, loc)
    if not loc or section is None:
        return False
    return loc[-1] in section.model_fields and _model_of(section, loc[-1]) is None


def _is_secret(settings: type[BaseModel] | None, loc: Sequence[str]) -> bool:
    """Is ``loc`` a field that holds a credential (a ``SecretStr``)?"""
    section = _section(settings, loc)
    field = section.model_fields.get(loc[-1]) if section is not None and loc else None
    return field is not None and SecretStr in (field.annotation, *get_args(field.annotation))


def _fields_hint(settings: type[BaseModel] | None, loc: Sequence[str]) -> str:
    section = _section(settings, loc)
    if section is None or not loc:
        return ""
    prefix = PREFIX + "".join(f"{p.upper()}__" for p in loc[:-1])
    names = list(section.model_fields)
    close = difflib.get_close_matches(loc[-1].lower(), names, n=1, cutoff=0.6)
    ordered = close + [n for n in names if n not in close]
    return (
        (f"; did you mean {prefix}{close[0].upper()}?" if close else ";")
        + f" the settings of {prefix.removesuffix('__')} are "
        + ", ".join(prefix + n.upper() for n in ordered)
    )


# ------------------------------------------------------- Kubernetes service links
# With enableServiceLinks (on by default) the kubelet gives every container one
# family of variables per Service of its namespace, named after the Service
# (upper-cased, "-" -> "_"), so a Service called guardrail-... lands in our
# prefix. The family, for ClusterIP 10.0.0.7 and port 8080/TCP named http
# (kubernetes.io/docs/concepts/services-networking/service/#environment-variables):
#   <SVC>_SERVICE_HOST=10.0.0.7           <SVC>_SERVICE_PORT=8080
#   <SVC>_SERVICE_PORT_HTTP=8080          <SVC>_PORT=tcp://10.0.0.7:8080
#   <SVC>_PORT_8080_TCP=tcp://10.0.0.7:8080
#   <SVC>_PORT_8080_TCP_PROTO=tcp  <SVC>_PORT_8080_TCP_PORT=8080  <SVC>_PORT_8080_TCP_ADDR=10.0.0.7
# Real settings put "__" between section and field; a Service name (a DNS label)
# gives no "__" in practice, and a link's value is exactly what the kubelet
# writes, anchored on its family's <SVC>_SERVICE_HOST. So GUARDRAIL_HTTP__PORT is
# always a setting and a typo such as GUARDRAIL_HTTP_PORT=9000 is still refused.
_LINK_SUFFIX = re.compile(
    r"_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_(?P<port>[0-9]+)_(?P<proto>TCP|UDP|SCTP)(?:_(?P<part>PROTO|PORT|ADDR))?)?)$"
)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_port(text: str) -> bool:
    return text.isdigit() and 1 <= int(text) <= 65535


def _host_port(host: str, port: str) -> str:
    """Go's net.JoinHostPort, as the kubelet uses it: IPv6 addresses in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_link_value(rest: str, value: str, host: str) -> bool:
    """Whether ``<SVC><rest>=<value>`` is what the kubelet writes for a Service at ``host``."""
    m = _LINK_SUFFIX.fullmatch(rest)
    if m is None:
        return False
    port, proto, part = m.group("port"), m.group("proto"), m.group("part")
    if rest == "_SERVICE_HOST":
        return value == host
    if port is None:
        if rest != "_PORT":  # <SVC>_SERVICE_PORT[_<PORT NAME>]
            return _is_port(value)
        # <SVC>_PORT: the Service's first port, as a URL
        scheme, _, address = value.partition("://")
        first = address.rpartition(":")[2]
        return (
            scheme in {"tcp", "udp", "sctp"}
            and _is_port(first)
            and address == _host_port(host, first)
        )
    expected = {
        None: f"{proto.lower()}://{_host_port(host, port)}",
        "PROTO": proto.lower(),
        "PORT": port,
        "ADDR": host,
    }
    return _is_port(port) and value == expected[part]


def kubernetes_service_links(environ: Mapping[str, str], settings: set[str]) -> set[str]:
    """The ``GUARDRAIL_*`` names in ``environ`` that are the kubelet's service links.

    A name qualifies when it has no ``__``, is not a top-level setting (one of
    ``settings``, lower-case field names), and is a link of a Service whose
    ``<SVC>_SERVICE_HOST`` (an IP address) is present, with the value the
    kubelet writes for that Service.
    """
    candidates = {
        name: value
        for name, value in environ.items()
        if name.startswith(PREFIX)
        and "__" not in name
        and name[len(PREFIX) :].lower() not in settings
    }
    hosts = {
        name.removesuffix("_SERVICE_HOST"): value
        for name, value in candidates.items()
        if name.endswith("_SERVICE_HOST") and _is_ip(value)
    }
    links: set[str] = set()
    for name, value in candidates.items():
        for svc, host in hosts.items():
            if name.startswith(f"{svc}_") and _is_link_value(name[len(svc) :], value, host):
                links.add(name)
                break
    return links
