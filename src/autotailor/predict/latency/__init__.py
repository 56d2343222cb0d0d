"""Learning-free latency prediction: unique kernels profiled once per target, kept in a LUT."""

from autotailor.predict.latency.lut import LutStore, Measurement, Target
from autotailor.predict.latency.profilers import Backend, make_backend

__all__ = ["Backend", "LutStore", "Measurement", "Target", "make_backend"]
