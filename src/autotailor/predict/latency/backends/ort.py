"""ONNX Runtime, CPU execution provider."""

from __future__ import annotations

import io
import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from autotailor.counters import ORT_COUNTS, ort_kernel_ms
from autotailor.errors import LatencyError
from autotailor.predict.latency.backends.base import (
    Backend,
    Shape,
    _shapes,
    _summary,
    backend,
)
from autotailor.predict.latency.kernels import POINTWISE_ACTS, FusionRules
from autotailor.predict.latency.lut import Measurement
from autotailor.timing import time_calls

log = logging.getLogger(__name__)


@backend("ort-cpu")
class OrtCpu(Backend):
    """ONNX Runtime, CPU execution provider, ``threads`` intra-op threads, graph optimisation
    level ``optimization``: ``extended`` (default) or ``all``, which adds the NCHWc layout
    transformation; deployed models must run with the same level as their kernels were profiled.
    ``precision``: ``fp32``, or ``int8``: kernels and SubNets quantized by ONNX Runtime's own
    quantizer (``autotailor.deploy.quantize``), on random inputs for timing and on the data's
    calibration batches for an export."""

    LEVELS = ("basic", "extended", "all")
    PRECISIONS = ("fp32", "int8")
    default_flush_mb = 16
    # BatchNorm is folded into the convolution at export; the CPU provider fuses a following
    # activation (ConvActivationFusion, HardSwish included when its output feeds a node, as
    # inside a model) and, in its NCHWc layout, a residual add + ReLU.
    fusion = FusionRules("ort-cpu", frozenset({"conv2d", "linear"}), (
        frozenset({"batchnorm2d"}), frozenset({"add", "iadd"}), POINTWISE_ACTS | {"gelu", "hardswish"}))
    format = "onnx"
    suffix = ".onnx"
    options = ("threads", "optimization", "precision", "flush_mb")
    file_options = ("precision",)
    # How kernels are timed, part of the LUT key so that entries timed another way are measured
    # again. 2: each kernel's output feeds a node (see ``_Consumed``); 3: less the profiler's
    # own cost per node (see ``node_offset_ms``).
    TIMING = 3

    def __init__(self, optimization: str = "all", precision: str = "fp32", **kwargs: object):
        super().__init__(**kwargs)
        if optimization not in self.LEVELS:
            raise LatencyError(f"ort-cpu optimization={optimization!r} is not allowed; expected one of {self.LEVELS}")
        if precision not in self.PRECISIONS:
            raise LatencyError(f"ort-cpu precision={precision!r} is not allowed; expected one of {self.PRECISIONS}")
        self.optimization, self.precision = optimization, precision
        self._node_offset_ms: float | None = None

    @property
    def settings(self) -> dict[str, object]:
        # fp32 is left out of the key: tables profiled before precision was a setting are fp32
        return {**super().settings, "optimization": self.optimization, "timing": self.TIMING,
                **({"precision": self.precision} if self.precision != "fp32" else {})}

    @property
    def quantized(self) -> bool:
        return self.precision == "int8"

    @property
    def count(self) -> str:
        """Which of its profile's nodes are the kernel's (a rule of ``autotailor.counters``)."""
        return "layout" if self.precision == "fp32" else "own"

    def _model(self, module: nn.Module, input_shapes: list[Shape]) -> bytes:
        """``module`` as the ONNX model this backend runs: quantized on random inputs for int8."""
        model = _onnx_bytes(module, input_shapes)
        if self.precision == "fp32":
            return model
        from autotailor.deploy.quantize import quantize_onnx, random_batches

        with tempfile.TemporaryDirectory() as tmp:
            return quantize_onnx(model, Path(tmp) / "int8.onnx", random_batches(input_shapes)).read_bytes()

    def _session(self, module: nn.Module, input_shapes: list[Shape], profiling: str | None = None):
        import onnxruntime as ort

        opts = self.session_options()
        if profiling is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = profiling
        sess = ort.InferenceSession(self._model(module, input_shapes), opts, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feed = {i.name: rng.standard_normal(s).astype(np.float32) for i, s in zip(sess.get_inputs(), input_shapes)}
        return sess, feed

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        sess, feed = self._session(module, input_shapes)
        return lambda: sess.run(None, feed)

    def measure(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Measurement:
        """The summed time of the kernel's nodes per run, from ONNX Runtime's own profiler.

        A kernel alone pays for converting its input to and its output from the blocked
        (NCHWc) layout, which a whole model does only at its ends; those reorder nodes and the
        call overhead (see ``overhead``) are left out, so that the entry is what the kernel costs
        inside a model. So is the node that consumes the kernel's output (``_Consumed``), and so
        is what the profiler itself adds to each node (``node_offset_ms``). An int8 kernel alone
        also quantizes its input, dequantizes its output and transposes both to and from the
        layout of the integer kernels, which inside a model happen only at its ends: only the
        kernel's own nodes count."""
        if self._node_offset_ms is None:
            self._node_offset_ms = self.node_offset_ms()
        return _summary(self._profiled_ms(_Consumed(module), _shapes(input_shape), self._flush, self._node_offset_ms))

    def prober(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Callable[[], Measurement]:
        return lambda: self.measure(module, input_shape)  # each profiled run needs its own session

    def _profiled_ms(self, module: nn.Module, input_shapes: list[Shape], before: Callable[[], object] | None,
                     node_offset_ms: float) -> list[float]:
        with tempfile.TemporaryDirectory() as tmp:
            sess, feed = self._session(module, input_shapes, profiling=str(Path(tmp) / "kernel"))
            run: Callable[[], object] = lambda: sess.run(None, feed)  # noqa: E731
            time_calls(run, self.warmup, self.repeats, self.budget_s, before)
            events = json.loads(Path(sess.end_profiling()).read_text())
        per_run = ort_kernel_ms(events, self.warmup, node_offset_ms, ORT_COUNTS[self.count])
        if not per_run:
            raise LatencyError("ONNX Runtime's profiler recorded no model runs; is this onnxruntime too old?")
        return per_run

    def node_offset_ms(self) -> float:
        """What ORT's profiler adds to the time of each node it records here (``counter_offset_ms``)."""
        return self.counter_offset_ms(
            lambda m, shapes: statistics.median(time_calls(self.prepare(m, shapes), self.warmup, 200, 1.0)),
            lambda m, shapes: statistics.median(self._profiled_ms(m, shapes, None, 0.0)))

    def counter_offset_ms(self, wall_ms: Callable[[nn.Module, list[Shape]], float],
                          counted_ms: Callable[[nn.Module, list[Shape]], float], nodes: int = 32) -> float:
        """What ORT's profiler adds to the time of each node it records: its own bookkeeping,
        a few microseconds that a model run without the profiler does not pay. Measured on a
        chain of ``nodes`` small convolutions: the profiler's time per node less the chain's
        wall time per node (the slope between the chain and a quarter of it)."""
        def chain(n: int) -> nn.Module:
            return _Consumed(nn.Sequential(*[nn.Sequential(nn.Conv2d(32, 32, 1), nn.ReLU()) for _ in range(n)])).eval()

        shape = [(1, 32, 8, 8)]
        short, long = nodes // 4, nodes
        walls = {n: wall_ms(chain(n), shape) for n in (short, long)}
        slope = (walls[long] - walls[short]) / (long - short)
        return max(0.0, counted_ms(chain(long), shape) / long - slope)

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape,
               calibration: Sequence[np.ndarray] | None = None) -> Path:
        from autotailor.deploy import export_onnx, quantize_onnx
        from autotailor.deploy.quantize import random_batches

        out = export_onnx(net, self.deploy_path(path), input_shape)
        if self.precision == "int8":
            if calibration is None:
                log.info("%s: int8 ranges calibrated on random inputs (fine for timing, not for accuracy)", out.name)
            quantize_onnx(out, out, random_batches([input_shape]) if calibration is None else [[b] for b in calibration])
        return out

    def kernel_file(self, module: nn.Module, input_shapes: list[Shape], path: str | Path) -> Path:
        # as ``measure`` runs it: its output consumed, its nodes named /kernel/... (the counts)
        consumed = module if isinstance(module, _Consumed) else _Consumed(module)
        out = self.deploy_path(path)
        out.write_bytes(self._model(consumed, input_shapes))
        return out

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), self.session_options(), providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: np.random.default_rng(0).standard_normal(input_shape).astype(np.float32)}
        return lambda: sess.run(None, feed)

    def run_file(self, path: str | Path, x: np.ndarray) -> np.ndarray:
        from autotailor.deploy import run_onnx

        return run_onnx(path, x, self.threads)

    def session_options(self):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        if self.quantized:  # errors only: it warns of every float constant its int8 fusions leave unused
            opts.log_severity_level = 3
        opts.graph_optimization_level = {
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.optimization]
        return opts


class _Consumer(nn.Module):
    def forward(self, y: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if isinstance(y, (tuple, list)):  # a kernel with several outputs (a whole block)
            return tuple(t.reshape(-1) for t in y)
        return y.reshape(-1)


class _Consumed(nn.Module):
    """``kernel`` with a node consuming its output, as inside a model. ONNX Runtime fuses some
    activations (HardSwish) into the convolution before them only when their output feeds
    another node, never at a graph output. The consumer's nodes are named ``/consumer/...``."""

    def __init__(self, kernel: nn.Module):
        super().__init__()
        self.kernel, self.consumer = kernel, _Consumer()

    def forward(self, *xs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.consumer(self.kernel(*xs))


def _onnx_bytes(module: nn.Module, input_shapes: list[Shape]) -> bytes:
    """``module`` as an ONNX model with static shapes (BatchNorm folded, as in a deployed SubNet,
    LeViT's BatchNorm over tokens too)."""
    from autotailor.deploy.export import tracing_for_export
    from autotailor.deploy.fold import fold_linear_norms

    buf = io.BytesIO()
    with tracing_for_export():
        torch.onnx.export(fold_linear_norms(module).eval(), tuple(torch.zeros(s) for s in input_shapes), buf,
                          dynamo=False, opset_version=17, input_names=[f"x{i}" for i in range(len(input_shapes))])
    return buf.getvalue()
