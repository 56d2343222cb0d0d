"""Learning-free latency prediction: unique kernels profiled once per target, kept in a LUT."""

from autotailor.errors import LatencyError
from autotailor.predict.latency.kernels import KernelPlan
from autotailor.predict.latency.lut import LutStore, Measurement, Target
from autotailor.predict.latency.predictor import (SUBNET_PREFIX, CacheAwarePredictor, CacheModel, CostModel, Costs,
                                                  LatencyPredictor, cache_bytes, calibration_archs, fit_cache_model,
                                                  profile, spread_by_weight, subnet_arch, subnet_key)
from autotailor.predict.latency.backends import (Backend, backend, backend_class, backends, export_formats,
                                                format_backend, fusion_rules, make_backend, parse_device)

__all__ = ["SUBNET_PREFIX", "Backend", "CacheAwarePredictor", "CacheModel", "CostModel", "Costs", "KernelPlan",
           "LatencyError", "backend", "backend_class", "backends", "export_formats", "format_backend", "LatencyPredictor", "LutStore", "Measurement", "Target", "cache_bytes", "calibration_archs",
           "fit_cache_model", "fusion_rules", "make_backend", "parse_device", "profile", "spread_by_weight",
           "subnet_arch", "subnet_key"]
