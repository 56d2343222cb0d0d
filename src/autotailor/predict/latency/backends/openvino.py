"""OpenVINO on the CPU: kernels and SubNets go through ONNX (BatchNorm folded at export) into
OpenVINO's IR (``.xml`` + ``.bin``), compiled for latency (one stream) in fp32. Kernels are
timed by OpenVINO's own performance counters."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch.nn as nn

from autotailor.counters import openvino_kernel_ms
from autotailor.predict.latency.backends.base import Backend, Shape, _shapes, _summary, backend
from autotailor.predict.latency.kernels import POINTWISE_ACTS, FusionRules
from autotailor.predict.latency.lut import Measurement
from autotailor.timing import time_calls


@backend("openvino")
class OpenVino(Backend):
    """OpenVINO's CPU plugin with ``threads`` inference threads. Its graph transformations fuse
    a convolution or linear layer with the BatchNorm folded into it, a following residual add
    (oneDNN's sum post-op) and an activation."""

    fusion = FusionRules("openvino", frozenset({"conv2d", "linear"}), (
        frozenset({"batchnorm2d"}), frozenset({"add", "iadd"}), POINTWISE_ACTS | {"gelu", "hardswish", "silu"}))
    format = "openvino"
    suffix = ".openvino.xml"  # not .xml: its weights would be subnet.bin, NCNN's name
    # How kernels are timed, part of the LUT key so that entries timed another way are measured
    # again. 2: by the performance counters, layout reorders left out (see ``measure``).
    TIMING = 2
    count = "reorders"

    @property
    def settings(self) -> dict[str, object]:
        return {**super().settings, "timing": self.TIMING}

    def _compiled(self, path: Path, perf_count: bool = False):
        import openvino as ov

        config = {"INFERENCE_NUM_THREADS": self.threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": "f32", **({"PERF_COUNT": True} if perf_count else {})}
        return ov.Core().compile_model(str(path), "CPU", config)

    def measure(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Measurement:
        """The summed time of the kernel's executed nodes per run, from OpenVINO's performance
        counters. A kernel alone converts its input to, and its output from, the CPU plugin's
        blocked layout (``Reorder`` nodes), which a whole model does only at its ends: those
        nodes and the call overhead (see ``overhead``) are left out, so that the entry is what
        the kernel costs inside a model. Timed by the wall clock, a MobileNetV2 depthwise
        convolution at 56x56 took 0.34 ms, half of it in the two reorders."""
        return self.prober(module, input_shape)()

    def prober(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Callable[[], Measurement]:
        shapes = _shapes(input_shape)
        with tempfile.TemporaryDirectory() as tmp:
            request = self._compiled(_to_ir(module, Path(tmp) / "kernel.xml", shapes), perf_count=True
                                     ).create_infer_request()
        rng = np.random.default_rng(0)
        feed = {i: rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
        kernel_ms: list[float] = []

        def run() -> None:
            request.infer(feed)
            kernel_ms.append(openvino_kernel_ms(request.get_profiling_info()))

        def probe() -> Measurement:
            kernel_ms.clear()
            timed = time_calls(run, self.warmup, self.repeats, self.budget_s, self._flush)
            return _summary(kernel_ms[-len(timed):])  # the warm-up's calls left out

        return probe

    def _runner(self, path: Path, input_shapes: list[Shape]) -> Callable[[], object]:
        request = self._compiled(path).create_infer_request()
        rng = np.random.default_rng(0)
        feed = {i: rng.standard_normal(s).astype(np.float32) for i, s in enumerate(input_shapes)}
        return lambda: request.infer(feed)

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        with tempfile.TemporaryDirectory() as tmp:
            return self._runner(_to_ir(module, Path(tmp) / "kernel.xml", input_shapes), input_shapes)

    def kernel_file(self, module: nn.Module, input_shapes: list[Shape], path: str | Path) -> Path:
        return _to_ir(module, self.deploy_path(path), input_shapes)

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape,
               calibration: Sequence[np.ndarray] | None = None) -> Path:
        return _to_ir(net, self.deploy_path(path), [tuple(input_shape)])

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        return self._runner(Path(path), [tuple(input_shape)])

    def run_file(self, path: str | Path, x: np.ndarray) -> np.ndarray:
        return next(iter(self._compiled(Path(path))(np.asarray(x, dtype=np.float32)).values()))

    @classmethod
    def deployed_files(cls, path: Path) -> list[Path]:
        return [path, path.with_suffix(".bin")]


def _to_ir(module: nn.Module, xml: Path, input_shapes: list[Shape]) -> Path:
    """``module`` as OpenVINO IR at ``xml`` (and its ``.bin``), through an ONNX export. Both files
    are written in a temporary folder beside them and moved in place, the weights first."""
    import openvino as ov

    from autotailor.predict.latency.backends.ort import _onnx_bytes

    xml.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=xml.parent, prefix=".openvino-") as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        onnx_path.write_bytes(_onnx_bytes(module, input_shapes))
        ov.save_model(ov.convert_model(onnx_path), Path(tmp) / "model.xml", compress_to_fp16=False)
        os.replace(Path(tmp) / "model.bin", xml.with_suffix(".bin"))
        os.replace(Path(tmp) / "model.xml", xml)
    return xml
