"""Learning-free latency prediction: unique kernels profiled once per target, kept in a LUT."""

from autotailor.predict.latency.kernels import KernelPlan, LatencyError, fusion_rules
from autotailor.predict.latency.lut import LutStore, Measurement, Target
from autotailor.predict.latency.predictor import (CacheAwarePredictor, CostModel, Costs, LatencyPredictor, cache_bytes,
                                                  profile)
from autotailor.predict.latency.profilers import Backend, make_backend, parse_device

__all__ = ["Backend", "CacheAwarePredictor", "CostModel", "Costs", "KernelPlan", "LatencyError", "LatencyPredictor", "LutStore",
           "Measurement", "Target", "cache_bytes", "fusion_rules", "make_backend", "parse_device", "profile"]
