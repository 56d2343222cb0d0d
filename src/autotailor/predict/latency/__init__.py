"""Learning-free latency prediction: unique kernels profiled once per target, kept in a LUT."""

from autotailor.predict.latency.kernels import KernelPlan, LatencyError, fusion_rules
from autotailor.predict.latency.lut import LutStore, Measurement, Target
from autotailor.predict.latency.predictor import CostModel, Costs, LatencyPredictor, profile
from autotailor.predict.latency.profilers import Backend, make_backend, parse_device

__all__ = ["Backend", "CostModel", "Costs", "KernelPlan", "LatencyError", "LatencyPredictor", "LutStore",
           "Measurement", "Target", "fusion_rules", "make_backend", "parse_device", "profile"]
