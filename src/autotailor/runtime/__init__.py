"""On-device runtime adaptation: serve inferences from a bundle of SubNets and switch among them
as the device's conditions change (AdaptiveNet's runtime switching, AdaScale's resource monitor
and forecast, Mistify's plug-in policies). Needs numpy and onnxruntime, never torch.

>>> from autotailor.runtime import Runtime
>>> rt = Runtime("bundle/", slo_ms=8, memory_mb=64, policy="forecast")
>>> y = rt.infer(x)

- ``bundle``: :class:`Bundle` (``manifest.json``, schema ``autotailor-bundle/1``) and :class:`SubNetEntry`
- ``loaders``: one registered loader per file format (:func:`register_loader`; ONNX built in)
- ``monitor``: :class:`Monitor` and its :class:`Reading` (CPU, quota, memory, frequency, temperature,
  the observed slowdown of our own inferences)
- ``forecast``: :class:`SlowdownForecast`, the short-term forecast of the slowdown with its error
- ``policies``: :class:`Policy`, :func:`register_policy`; built in: ``static``, ``reactive``, ``forecast``
- ``runtime``: :class:`Runtime`, :class:`InferenceRecord`
- ``load``: :class:`LoadHarness`, :class:`CpuSchedule`, :class:`ArrivalTrace`, :func:`run_trace`
- ``serving``: :func:`serve`, an HTTP inference endpoint (``POST /infer``, ``GET /metrics``, ``GET /health``)
- ``replay``: :func:`replay`, an arrival trace played against a runtime, one JSON line per request

Errors (in ``autotailor.errors``): :class:`BundleError`,
:class:`ServingError`, :class:`PolicyError`, :class:`LoadHarnessError`, all :class:`AutoTailorError`.
"""

from autotailor.errors import BundleError, LoadHarnessError, PolicyError, ServingError
from autotailor.runtime.bundle import MANIFEST, SCHEMA, Bundle, SubNetEntry
from autotailor.runtime.forecast import ForecastState, SlowdownForecast
from autotailor.runtime.load import ArrivalTrace, CpuSchedule, LoadHarness, Served, run_trace
from autotailor.runtime.loaders import Loader, formats, register_loader
from autotailor.runtime.monitor import Monitor, Overhead, Reading
from autotailor.runtime.policies import (
    Goal,
    Policy,
    PolicyState,
    best_fitting,
    fastest,
    make_policy,
    policies,
    register_policy,
)
from autotailor.runtime.replay import replay
from autotailor.runtime.runtime import InferenceRecord, Runtime, resize_bilinear
from autotailor.runtime.serving import serve

__all__ = [
    "MANIFEST",
    "SCHEMA",
    "ArrivalTrace",
    "Bundle",
    "BundleError",
    "CpuSchedule",
    "ForecastState",
    "Goal",
    "InferenceRecord",
    "LoadHarness",
    "LoadHarnessError",
    "Loader",
    "Monitor",
    "Overhead",
    "Policy",
    "PolicyError",
    "PolicyState",
    "Reading",
    "Runtime",
    "Served",
    "ServingError",
    "SlowdownForecast",
    "SubNetEntry",
    "best_fitting",
    "fastest",
    "formats",
    "make_policy",
    "policies",
    "register_loader",
    "register_policy",
    "replay",
    "run_trace",
    "resize_bilinear",
    "serve",
]
