"""Small, dependency-free statistics shared by the conformal monitor and the coverage bound."""

from sidecar.stats.intervals import ProportionInterval, normal_quantile, wilson_interval

__all__ = ["ProportionInterval", "normal_quantile", "wilson_interval"]
