"""Learning-free latency prediction: unique kernels profiled once per target, kept in a LUT."""

from autotailor.predict.latency.lut import LutStore, Measurement, Target

__all__ = ["LutStore", "Measurement", "Target"]
