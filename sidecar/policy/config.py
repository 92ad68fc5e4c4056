"""The declarative policy: a YAML document validated by pydantic.

Named risk profiles follow the refusal thresholds (medical 0.05, enterprise
0.20, general 0.30), the three reliability tiers (HIGH -> answer as is, MEDIUM
-> remove unsupported claims and add a disclaimer, LOW -> verified facts only
or decline) and the escalation to a human expert when reliability falls below
a threshold (docs/methods.md §Claim verification). Each profile also says what a
missing signal means: a signal that is not configured or could not be
computed is an explicit reason with an explicit action, never "fine".

A request picks its profile by tenant, then by collection, then the default.
Loading: :func:`load_policy` (file) / :func:`parse_policy` (text) raise
``ConfigError`` naming every wrong field by its path and saying what is
allowed (``profiles.medical.max_hallucination_rate: must be <= 1 (got 1.5)``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Final, Literal, Self, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from sidecar.exceptions import ConfigError

__all__ = [
    "Action",
    "AllowRules",
    "ClaimsRules",
    "ConfidenceRules",
    "LookbackRules",
    "PolicyConfig",
    "PolicyTexts",
    "Profile",
    "RetrievalRules",
    "load_policy",
    "parse_policy",
    "read_policy_text",
]

Action = Literal["allow", "caveat", "block"]
Rate = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
ProfileName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9\-]{0,31}$")]

Level = Literal["HIGH", "MEDIUM", "LOW"]


def _tier_actions() -> dict[Level, Action]:
    """The tiers: HIGH -> output as is, MEDIUM -> remove unsupported + caveat, LOW -> decline."""
    return {"HIGH": "allow", "MEDIUM": "caveat", "LOW": "block"}


SEVERITY: Final[dict[Action, int]] = {"allow": 0, "caveat": 1, "block": 2}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RetrievalRules(_Model):
    """Retrieval certification: m1 = |C| > 0, m2 = |C| / K.

    See docs/methods.md §Retrieval certification.
    """

    when_no_trusted_chunk: Action = Field(
        default="caveat",
        description="action when no chunk is trusted: retrieval-no-trusted-chunk, "
        "retrieval-not-certifiable (no threshold at this alpha) and retrieval-scores-rising",
    )
    min_trusted_fraction: Rate = Field(
        default=0.0,
        description="least m2 (share of the k requested chunks that are trusted, 0..1); "
        "below it: when_low_trusted_fraction. 0 turns the rule off",
    )
    when_low_trusted_fraction: Action = Field(
        default="caveat",
        description="action when m2 is below min_trusted_fraction (retrieval-low-trusted-fraction)",
    )
    when_missing: Action = Field(
        default="caveat",
        description="action when the retrieval signal is not ok "
        "(retrieval-not-configured, retrieval-unavailable)",
    )
    # the rolling mean(m1) fell below 1 - alpha: the coverage guarantee no longer holds
    when_exchangeability_broken: Action = Field(
        default="caveat",
        description="action while the key's rolling mean(m1) is significantly below "
        "1 - alpha (exchangeability-broken: recalibrate)",
    )


class _ThresholdRules(_Model):
    """A probability signal: block below one threshold, caveat below another."""

    block_below: Rate = Field(
        default=0.0,
        description="block when the probability is below this (<signal>-very-low); 0: never",
    )
    caveat_below: Rate = Field(
        default=0.0,
        description="caveat when the probability is below this (<signal>-low); at least "
        "block_below",
    )
    when_missing: Action = Field(
        default="allow",
        description="action when the probability is missing (<signal>-not-configured, "
        "<signal>-unavailable)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.block_below > self.caveat_below:
            raise ValueError(
                f"block_below ({self.block_below}) must be <= caveat_below ({self.caveat_below})"
            )
        return self


class LookbackRules(_ThresholdRules):
    """Lookback-ratio p(factual) (docs/methods.md §Lookback-ratio factuality)."""

    caveat_below: Rate = Field(
        default=0.5,
        description="caveat when p_factual is below this (lookback-low); at least block_below",
    )


class ClaimsRules(_Model):
    """Claim verification (docs/methods.md §Claim verification)."""

    reliability_actions: dict[Level, Action] = Field(
        default_factory=_tier_actions,
        description="the action of each reliability tier (claims-reliability-<tier>); needs "
        "HIGH, MEDIUM and LOW",
    )
    caveat_on_any_unsupported: bool = Field(
        default=False,
        description="caveat whenever a claim is unsupported (claims-unsupported-present), "
        "whatever the tier",
    )
    when_missing: Action = Field(
        default="caveat",
        description="action when the claims signal is not ok (claims-not-configured, "
        "claims-unavailable) and when some claims went unverified (claims-over-limit, "
        "claims-unreadable)",
    )
    when_no_claims: Action = Field(
        default="caveat",
        description="action when the answer holds no checkable claim (claims-none)",
    )
    when_untrusted_evidence: Action = Field(
        default="allow",
        description="action when the claims were checked against all retrieved chunks, none "
        "being trusted (claims-evidence-untrusted)",
    )
    verified_only_from_untrusted_evidence: bool = Field(
        default=False,
        description="on a block, show the claims verified against untrusted chunks as the "
        "verified-only answer; false: such a block shows the refusal",
    )

    @model_validator(mode="after")
    def _all_levels(self) -> Self:
        missing = {"HIGH", "MEDIUM", "LOW"} - set(self.reliability_actions)
        if missing:
            raise ValueError(
                f"reliability_actions needs HIGH, MEDIUM and LOW; missing {sorted(missing)}"
            )
        return self


class ConfidenceRules(_ThresholdRules):
    """The calibrated probability that the answer is correct.

    See docs/methods.md §Calibrated confidence.

    Both thresholds default to 0 (the rule never fires); a profile opts in.
    """


CertificateFile = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


def _one_or_more(value: object) -> object:
    return [value] if isinstance(value, str) else value


CertificateFiles = Annotated[
    tuple[CertificateFile, ...],
    # the bounds before the validator: after it, pydantic >= 2.12 writes them into the
    # JSON schema as maxLength/minLength, which no validator applies to an array
    Field(min_length=1, max_length=8),
    BeforeValidator(_one_or_more),
]
"""One certificate file or a list of them (at most 8), kept as a tuple."""


class AllowRules(_Model):
    """Certified allow (``guardrail calibrate policy``): allow only at or above a certified
    confidence threshold.

    ``certified`` is the certificate file, relative to the policy file, or a list
    of them: one per set of served signals (say, one fitted with claim checks
    off and one with them on); the first that applies to the served signals is
    used. An answer whose calibrated confidence is below the certified threshold
    gets ``below``; while the online re-test finds the certificate broken every
    answer of its key gets ``when_violated`` (reason ``certificate-violated``); a
    request of another calibration key than the certificate's, or without a
    confidence, gets ``below``.
    """

    certified: CertificateFiles = Field(
        description="the certificate file ('guardrail calibrate policy'), relative to the "
        "policy file, or a list of up to 8: the first that applies to the served signals is "
        "used"
    )
    below: Literal["caveat", "block"] = Field(
        default="caveat",
        description="action instead of allow when the confidence is below the certified "
        "threshold or missing, the request is of another calibration key, or the "
        "certificate does not apply",
    )
    when_violated: Literal["caveat", "block"] = Field(
        default="caveat",
        description="action for every answer of the key while the re-test finds the "
        "certificate broken or the fleet withdrew it (certificate-violated)",
    )


class Profile(_Model):
    """One risk profile."""

    description: str = Field(default="", description="free text for people; not a rule")
    max_hallucination_rate: Rate = Field(
        description="block when the claims' hallucination_rate is above this, 0..1 "
        "(claims-hallucination-rate-exceeded)"
    )
    strict: bool = Field(
        default=False,
        description="block on any unsupported claim (strict-unsupported-claim), mid-stream "
        "too: a stage=stream verdict as soon as a streamed claim is unsupported",
    )
    escalate_below_reliability: Rate | None = Field(
        default=None,
        description="set escalate (a human should look) when the claims' reliability is "
        "below this; null: never for reliability",
    )
    escalate_on_block: bool = Field(default=False, description="set escalate on every block")
    retrieval: RetrievalRules = Field(
        default=RetrievalRules(), description="rules for the retrieval certification"
    )
    lookback: LookbackRules = Field(
        default=LookbackRules(), description="thresholds on the lookback p_factual"
    )
    claims: ClaimsRules = Field(default=ClaimsRules(), description="rules for claim verification")
    confidence: ConfidenceRules = Field(
        default=ConfidenceRules(),
        description="thresholds on the calibrated confidence (both 0 by default: not used)",
    )
    allow: AllowRules | None = Field(
        default=None,
        description="certified allow: allow only at or above a certified confidence "
        "threshold; null: allow needs no certificate",
    )

    def rules_sha256(self) -> str:
        """sha256 of the rules a certificate's scope depends on (all but ``allow``, texts)."""
        rules = self.model_dump(mode="json", exclude={"allow", "description"})
        return hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()


class PolicyTexts(_Model):
    """User-facing texts (the defaults follow the tiers of docs/methods.md §Claim verification)."""

    caveat_removed: str = Field(
        default=(
            "Note: Some claims in the original answer could not be verified against the "
            "retrieved context and have been removed. Please verify with primary sources "
            "before relying on this answer."
        ),
        description="caveat_text of a caveat whose rewritten_answer has the unsupported "
        "claims removed",
    )
    caveat_unverified: str = Field(
        default=(
            "Note: This answer could not be fully verified against the retrieved context. "
            "Please verify with primary sources before relying on it."
        ),
        description="caveat_text of every other caveat (the answer shown as it is)",
    )
    verified_only_caveat: str = Field(
        default="Answer limited to context-verified claims.",
        description="caveat_text of a block whose rewritten_answer lists the verified claims",
    )
    verified_intro: str = Field(
        default="Based on the retrieved context, the following can be confirmed:",
        description="first line of a block's verified-only rewritten_answer, before the "
        "bulleted claims",
    )
    verified_outro: str = Field(
        default="Additional information could not be verified from the available context.",
        description="last line of a block's verified-only rewritten_answer, after the claims",
    )
    refusal: str = Field(
        default=(
            "The retrieved context does not contain sufficient information to reliably "
            "answer this question. Please consult authoritative sources."
        ),
        description="rewritten_answer of a block with no usable verified claim",
    )


def _version_as_written(value: object) -> object:
    """YAML reads ``version: 2`` as a number: taken as written (audit: refused). It reads
    ``version: 1.10`` as the number 1.1, which is not what was written: refused, saying
    to quote it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        raise ValueError(  # noqa: TRY004 - pydantic reports a ValueError, not a TypeError
            f"YAML reads this version as the number {value!r}, which may not be what was "
            "written (1.10 reads as 1.1): quote it, e.g. version: '1.10'"
        )
    return value


class PolicyConfig(_Model):
    schema_version: Literal[1] = Field(default=1, description="the policy format: 1")
    name: ProfileName = Field(
        description="the policy's name (lower-case letters, digits, '-'; up to 32): the "
        "verdict's policy reads 'name/version'"
    )
    version: Annotated[
        str,
        BeforeValidator(_version_as_written, json_schema_input_type=str | int),
        StringConstraints(min_length=1, max_length=32),
    ] = Field(
        default="1",
        description="the policy's version as written (a whole number is taken as text; "
        "quote one with a dot, e.g. '1.10')",
    )
    default_profile: ProfileName = Field(
        description="the profile of a request whose tenant and collection have no mapping"
    )
    profiles: dict[ProfileName, Profile] = Field(description="the risk profiles, by name")
    tenants: dict[str, ProfileName] = Field(
        default_factory=dict,
        description="tenant -> profile name; looked up first",
    )
    collections: dict[str, ProfileName] = Field(
        default_factory=dict,
        description="collection -> profile name; looked up when the tenant has no mapping",
    )
    texts: PolicyTexts = Field(
        default=PolicyTexts(), description="the user-facing texts of caveats and blocks"
    )

    @model_validator(mode="after")
    def _references(self) -> Self:
        known = set(self.profiles)
        if self.default_profile not in known:
            raise ValueError(
                f"default_profile {self.default_profile!r} is not a profile; "
                f"defined: {', '.join(sorted(known)) or 'none'}"
            )
        for section in ("tenants", "collections"):
            mapping: dict[str, str] = getattr(self, section)
            for key, profile in mapping.items():
                if profile not in known:
                    raise ValueError(
                        f"{section}.{key} names profile {profile!r}, which is not defined; "
                        f"defined: {', '.join(sorted(known))}"
                    )
        return self

    def profile_for(self, tenant: str | None, collection: str | None) -> tuple[str, Profile]:
        """Tenant mapping first, then collection, then the default profile."""
        name = (
            self.tenants.get(tenant or "")
            or self.collections.get(collection or "")
            or self.default_profile
        )
        return name, self.profiles[name]


def _inner(annotation: Any) -> Any:
    """``annotation`` without ``Annotated[...]`` and ``| None``."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else annotation
    return annotation


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model whose fields ``loc`` (an error's location, less its last part) names."""
    current: Any = PolicyConfig
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = _inner(field.annotation)
        elif get_origin(current) in (dict, list):  # a profile's name, a list index
            current = _inner(get_args(current)[-1])
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _no_such_field(loc: tuple[int | str, ...]) -> str:
    """What to say of an unknown field: the closest name, and the names allowed there."""
    model = _model_at(loc[:-1])
    if model is None:
        return "no such field"
    names = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return f"no such field{hint} the fields here are {', '.join(names)}"


_YAML_BOOLEAN = (
    "YAML reads an unquoted yes, no, on, off, true or false (in any case) as a boolean; "
    "quote a name that reads so, e.g. 'NO'"
)


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(document)"
        got = err.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = _no_such_field(tuple(err["loc"]))
        if isinstance(got, bool) and err["type"] == "string_type":
            message += f": {_YAML_BOOLEAN}"
            if err["loc"][-1] == "[key]":  # pydantic names the key by its hash: 0 or 1
                where = f"{err['loc'][0]}: a key"
        lines.append(f"{where}: {message}{shown}")
    return "; ".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (the last would win)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """A mapping whose own keys are unique; merged keys (``<<: *base``) may be overridden."""
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # what it brings in may be overridden here, as YAML's merge keys intend
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _unique_mapping,
)


def parse_policy(text: str, source: str = "<policy>") -> PolicyConfig:
    """Validate a policy document (YAML or JSON) or raise ``ConfigError`` saying what is wrong."""
    try:
        raw: Any = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: a policy must be a mapping, got {type(raw).__name__}")
    try:
        return PolicyConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid policy: {_describe(exc)}") from None


MAX_POLICY_BYTES: Final = 1 << 20  # a policy is a few KB; the audit's 5 MB one took 5 s


def read_policy_text(path: Path) -> str:
    """The policy file's text, or ``ConfigError`` when it is missing, too large or not UTF-8."""
    if not path.is_file():
        raise ConfigError(f"policy file {path} does not exist")
    size = path.stat().st_size
    if size > MAX_POLICY_BYTES:
        raise ConfigError(
            f"policy file {path} is {size} bytes, more than {MAX_POLICY_BYTES}: a policy is a "
            "few kilobytes of profiles and mappings (is this the right file?)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte offset {exc.start})") from None
    return text


def load_policy(path: Path) -> PolicyConfig:
    return parse_policy(read_policy_text(path), str(path))
