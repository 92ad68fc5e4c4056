"""Which calibration certifies an event of (tenant, collection, retriever).

Resolution order, each outcome named in :class:`ResolvedCalibration`:

1. the key has its own certifiable Mondrian calibration -> use it;
2. the key was calibrated but had too few correct chunks for alpha (k > n) or
   degenerate scores -> the global calibration, ``fallback_reason`` says which;
3. the collection is calibrated but this tenant / retriever is not -> global,
   ``unknown-key``;
4. the collection was never calibrated -> depends on ``unknown_collection``:
   ``fallback-global`` certifies with the global calibration (``unknown-collection``),
   ``reject`` raises :class:`InputError` with ``reason="unknown-collection"`` so the
   event goes to the dead-letter topic.

Resolutions are cached per key in an LRU of ``MAX_CACHED_KEYS``; the registry is
immutable after construction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum

from sidecar.conformal.artifact import CalibrationArtifact
from sidecar.conformal.calibrator import ConformalCalibration
from sidecar.conformal.mondrian import GLOBAL_KEY_LABEL, CalibrationKey, FallbackReason
from sidecar.exceptions import ConfigError, InputError

__all__ = ["CalibrationRegistry", "ResolvedCalibration", "UnknownCollectionPolicy"]


MAX_CACHED_KEYS = 4096
"""Resolved (tenant, collection, retriever) keys kept; a producer that invents keys evicts."""


class UnknownCollectionPolicy(StrEnum):
    """What to do with an event whose collection the artifact never saw."""

    FALLBACK_GLOBAL = "fallback-global"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class ResolvedCalibration:
    """The calibration chosen for a key, and why."""

    calibration: ConformalCalibration
    calibration_id: str
    requested: CalibrationKey
    used_key: str
    """``tenant/collection/retriever`` of the calibration used, or ``global``."""
    fallback_reason: FallbackReason | None
    detail: str
    # read by every certification of the key, worked out once per resolution (the registry
    # keeps it per key): the requested key's label, the reason as text, alpha as a float
    # (recomputed, two labels and a Fraction's float cost ~2.5 us a retrieval)
    requested_label: str = field(init=False, repr=False, compare=False)
    reason_text: str | None = field(init=False, repr=False, compare=False)
    alpha: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        reason = None if self.fallback_reason is None else str(self.fallback_reason)
        object.__setattr__(self, "requested_label", self.requested.label)
        object.__setattr__(self, "reason_text", reason)
        object.__setattr__(self, "alpha", float(self.calibration.alpha))

    @property
    def fallback(self) -> bool:
        """True when the global calibration stands in for the event's own key."""
        return self.fallback_reason is not None


class CalibrationRegistry:
    """Resolve (tenant, collection, retriever) to the calibration that certifies it."""

    def __init__(
        self,
        artifact: CalibrationArtifact,
        *,
        unknown_collection: UnknownCollectionPolicy | str = UnknownCollectionPolicy.FALLBACK_GLOBAL,
    ) -> None:
        try:
            self.unknown_collection = UnknownCollectionPolicy(unknown_collection)
        except ValueError as exc:
            allowed = ", ".join(p.value for p in UnknownCollectionPolicy)
            raise ConfigError(
                f"unknown_collection must be one of {allowed}, got {unknown_collection!r}"
            ) from exc
        self.artifact = artifact
        self._global = artifact.global_calibration()
        self._own: dict[CalibrationKey, ConformalCalibration] = {}
        self._fallback: dict[CalibrationKey, tuple[FallbackReason, str]] = {}
        self._details: dict[CalibrationKey, str] = {}
        self.collections: frozenset[str] = frozenset(
            [artifact.collection, *(e.collection for e in artifact.mondrian)]
        )
        for entry in artifact.mondrian:
            key = entry.key
            self._details[key] = entry.detail
            if entry.fallback_reason is not None:
                self._fallback[key] = (FallbackReason(entry.fallback_reason), entry.detail)
            elif entry.calibration is not None:  # guaranteed by KeyEntry's validator
                self._own[key] = entry.calibration.to_calibration()
        # keys come from events (tenant names included): an LRU, never unbounded
        self._cache: OrderedDict[CalibrationKey, ResolvedCalibration] = OrderedDict()
        self.cache_evictions = 0

    @property
    def calibration_id(self) -> str:
        """The artifact's id (retriever@collection:datahash)."""
        return self.artifact.calibration_id

    def resolve(self, tenant: str, collection: str, retriever: str) -> ResolvedCalibration:
        """The calibration for an event's key (see the module docstring for the order).

        Raises :class:`InputError` ``unknown-collection`` under the ``reject`` policy.
        """
        key = CalibrationKey(tenant, collection, retriever)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        resolved = self._resolve(key)
        self._cache[key] = resolved
        if len(self._cache) > MAX_CACHED_KEYS:
            self._cache.popitem(last=False)
            self.cache_evictions += 1
        return resolved

    def _global_for(
        self, key: CalibrationKey, reason: FallbackReason, detail: str
    ) -> ResolvedCalibration:
        return ResolvedCalibration(
            calibration=self._global,
            calibration_id=self.calibration_id,
            requested=key,
            used_key=GLOBAL_KEY_LABEL,
            fallback_reason=reason,
            detail=detail,
        )

    def _resolve(self, key: CalibrationKey) -> ResolvedCalibration:
        own = self._own.get(key)
        if own is not None:
            return ResolvedCalibration(
                calibration=own,
                calibration_id=self.calibration_id,
                requested=key,
                used_key=key.label,
                fallback_reason=None,
                detail=self._details[key],
            )
        fallback = self._fallback.get(key)
        if fallback is not None:
            return self._global_for(key, fallback[0], fallback[1])
        if key.collection in self.collections:
            return self._global_for(
                key,
                FallbackReason.UNKNOWN_KEY,
                f"key {key.label} was not calibrated; collection {key.collection!r} is, "
                "so the global calibration is used",
            )
        known = ", ".join(sorted(self.collections))
        if self.unknown_collection is UnknownCollectionPolicy.REJECT:
            raise InputError(
                "unknown-collection",
                f"collection {key.collection!r} (key {key.label}) has no calibration in "
                f"{self.calibration_id}; calibrated collections: {known}. Calibrate it, or "
                "set unknown_collection='fallback-global' to certify with the global calibration",
            )
        return self._global_for(
            key,
            FallbackReason.UNKNOWN_COLLECTION,
            f"collection {key.collection!r} was not calibrated (known: {known}); "
            "the global calibration is used",
        )
