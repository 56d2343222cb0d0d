"""Profiling backends: time one kernel (a small torch module) on a target runtime.

A backend is one registered class with ``measure(module, input_shape) -> Measurement``. Each
measurement warms up, then times ``repeats`` calls and keeps the median and the median
absolute deviation; ``overhead`` times an identity kernel, the fixed cost of one call into
the runtime, which the predictor accounts for once per model rather than once per kernel.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch
import torch.nn as nn

from autotailor.errors import AutoTailorError
from autotailor.predict.latency.lut import Measurement

_BACKENDS: dict[str, type["Backend"]] = {}


def backend(name: str) -> Callable[[type["Backend"]], type["Backend"]]:
    def deco(cls: type["Backend"]) -> type["Backend"]:
        cls.name = name
        _BACKENDS[name] = cls
        return cls

    return deco


def make_backend(name: str, **settings: object) -> "Backend":
    """The backend ``name`` (``ort-cpu``, ``torch``) with its settings (e.g. ``threads=1``)."""
    if name not in _BACKENDS:
        raise AutoTailorError(f"unknown backend {name!r}; available: {', '.join(sorted(_BACKENDS))}")
    return _BACKENDS[name](**settings)


def _summary(times_ms: list[float]) -> Measurement:
    med = statistics.median(times_ms)
    mad = statistics.median(abs(t - med) for t in times_ms)
    return Measurement(med, mad, len(times_ms), time.time())


class Backend:
    name: ClassVar[str] = ""

    def __init__(self, threads: int = 1, warmup: int = 10, repeats: int = 50):
        if threads < 1 or warmup < 0 or repeats < 1:
            raise AutoTailorError("threads and repeats must be >= 1 and warmup >= 0")
        self.threads, self.warmup, self.repeats = threads, warmup, repeats

    @property
    def settings(self) -> dict[str, object]:
        """What makes measurements comparable: part of the LUT key."""
        return {"threads": self.threads}

    def measure(self, module: nn.Module, input_shape: tuple[int, ...]) -> Measurement:  # pragma: no cover
        raise NotImplementedError

    def overhead(self, input_shape: tuple[int, ...] = (1, 1)) -> Measurement:
        """The cost of calling the runtime with a kernel that does (almost) nothing."""
        return self.measure(_Identity(), input_shape)


class _Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0  # a real node: an empty graph is not a model every runtime accepts


@backend("ort-cpu")
class OrtCpu(Backend):
    """ONNX Runtime, CPU execution provider, ``threads`` intra-op threads, full graph optimisation."""

    def measure(self, module: nn.Module, input_shape: tuple[int, ...]) -> Measurement:
        import onnxruntime as ort

        from autotailor.deploy import export_onnx

        with tempfile.TemporaryDirectory() as tmp:
            path = export_onnx(module, Path(tmp) / "kernel.onnx", input_shape)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        x = {sess.get_inputs()[0].name: np.random.default_rng(0).standard_normal(input_shape).astype(np.float32)}
        for _ in range(self.warmup):
            sess.run(None, x)
        times = []
        for _ in range(self.repeats):
            t = time.perf_counter()
            sess.run(None, x)
            times.append((time.perf_counter() - t) * 1e3)
        return _summary(times)


@backend("torch")
class TorchEager(Backend):
    """PyTorch eager mode on the CPU with ``threads`` intra-op threads."""

    def measure(self, module: nn.Module, input_shape: tuple[int, ...]) -> Measurement:
        module = module.eval()
        x = torch.randn(input_shape, generator=torch.Generator().manual_seed(0))
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                for _ in range(self.warmup):
                    module(x)
                times = []
                for _ in range(self.repeats):
                    t = time.perf_counter()
                    module(x)
                    times.append((time.perf_counter() - t) * 1e3)
        finally:
            torch.set_num_threads(previous)
        return _summary(times)
