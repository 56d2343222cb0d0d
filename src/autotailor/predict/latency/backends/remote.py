"""A backend on another machine: each kernel is exported here with the inner backend's
``deploy`` and timed on the device by its agent (autotailor.agent, docs/agent.md).

``Remote("http://10.0.0.2:8765", "ort-cpu", token_file="token", threads=1)`` profiles as
``ort-cpu:threads=1`` would on that device: same fusion rules, export format and files; the
timing is the agent's wall time of the kernel's file less the fixed cost of a call (an identity
kernel timed on the device, the fastest of three), as ``Backend.measure`` does locally.

The device spec is ``remote:HOST:PORT/BACKEND[:KEY=VALUE,...]`` (``parse_device``); the token is
``token_file=PATH`` among the settings or the environment variable ``AUTOTAILOR_AGENT_TOKEN``.
Differences from profiling on the device itself, recorded in ``settings["timing"]`` so LUT
entries never mix: ONNX Runtime kernels are wall-timed (not by ORT's profiler, without its
reorder-node and consumer exclusions), NCNN inputs are not pre-packed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence
from urllib.parse import urlparse

import numpy as np
import torch.nn as nn

from autotailor.agent import AgentClient, AgentError
from autotailor.errors import LatencyError
from autotailor.predict.latency.backends.base import (REFERENCE_SHAPE, Backend, ReferenceKernel, Shape, _Identity,
                                                      _shapes, backend, make_backend)
from autotailor.predict.latency.lut import Measurement


class _RemoteRun:
    """What ``load`` returns: a deployed file to be timed by the agent (``Remote.time``)."""

    def __init__(self, path: Path, input_shapes: list[Shape]):
        self.path, self.input_shapes = path, input_shapes

    def __call__(self) -> object:
        raise LatencyError("a model on a remote device runs there only; time it with Remote.time(run)")


@backend("remote")
class Remote(Backend):
    options = ("HOST:PORT/BACKEND[:KEY=VALUE,...]", "token_file")

    def __init__(self, url: str, backend: str = "ort-cpu", token: str | None = None, token_file: str | None = None,
                 **settings: object):
        self.inner = make_backend(backend, **settings)
        # Same timing parameters as the inner backend (base.__init__ checks them; no local scratch needed).
        super().__init__(threads=self.inner.threads, warmup=self.inner.warmup, repeats=self.inner.repeats,
                         budget_s=self.inner.budget_s, flush_mb=0)
        self.flush_mb = self.inner.flush_mb  # flushed on the device, by the agent
        self.fusion, self.format, self.suffix = self.inner.fusion, self.inner.format, self.inner.suffix  # type: ignore[misc]
        if token is None:
            token = Path(token_file).read_text().strip() if token_file else os.environ.get("AUTOTAILOR_AGENT_TOKEN")
        if not token:
            raise LatencyError(f"remote device {url}: give its agent's token (token_file=..., or the environment "
                               "variable AUTOTAILOR_AGENT_TOKEN)")
        self.url = url
        self.machine = urlparse(url).netloc  # a LUT's device name: each agent its own entries
        self.client = AgentClient(url, token)
        self._runtime_settings = {k: v for k, v in settings.items()
                                  if k not in ("warmup", "repeats", "budget_s", "flush_mb", *self.inner.file_options)}
        self._node_offset_ms: float | None = None

    @property
    def settings(self) -> dict[str, object]:
        # kernels are timed on the device as the inner backend times them here: by the wall
        # clock, or counted by the runtime's profiler (``count``)
        return {**self.inner.settings, "timing": f"agent-{self.inner.count}:{self.inner.name}"}

    def _measure_file(self, files: Path, input_shapes: list[Shape], flush_mb: int, **counting: object) -> Measurement:
        try:
            r = self.client.measure(files, self.inner.name, inputs=[list(s) for s in input_shapes],
                                    warmup=self.warmup, repeats=self.repeats, budget_s=self.budget_s,
                                    flush_mb=flush_mb, **self._runtime_settings, **counting)
        except AgentError as exc:
            raise LatencyError(f"measuring on the remote device {self.url} failed: {exc}") from exc
        return Measurement(r["median_ms"], r["mad_ms"], r["repeats"], r["measured_at"])

    def _deployed(self, module: nn.Module, input_shapes: list[Shape], tmp: str) -> Path:
        return self.inner.kernel_file(module.eval(), input_shapes, Path(tmp) / "kernel")

    def _kernel(self, module: nn.Module, shapes: list[Shape], flush_mb: int = 0, **counting: object) -> Measurement:
        """``module`` written as the inner backend's kernel file and measured on the device."""
        with tempfile.TemporaryDirectory() as tmp:
            return self._measure_file(self._deployed(module, shapes, tmp), shapes, flush_mb, **counting)

    def measure(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Measurement:
        shapes = _shapes(input_shape)
        if self.inner.count != "wall":  # counted on the device by the runtime's profiler, as here
            if self._node_offset_ms is None:
                self._node_offset_ms = self.inner.counter_offset_ms(
                    lambda m, s: self._kernel(m, s).median_ms,
                    lambda m, s: self._kernel(m, s, count=self.inner.count).median_ms)
            offset = {"node_offset_ms": self._node_offset_ms} if self._node_offset_ms else {}
            return self._kernel(module, shapes, self.flush_mb, count=self.inner.count, **offset)
        m = self._kernel(module, shapes, self.flush_mb)
        if self._overhead is None:
            self._overhead = self.overhead()
        return Measurement(max(0.0, m.median_ms - self._overhead.median_ms), m.mad_ms, m.repeats, m.measured_at)

    def prober(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Callable[[], Measurement]:
        return lambda: self.measure(module, input_shape)

    def overhead(self, input_shape: tuple[int, ...] = (1, 1)) -> Measurement:
        with tempfile.TemporaryDirectory() as tmp:
            path = self._deployed(_Identity(), [input_shape], tmp)
            return min((self._measure_file(path, [input_shape], 0) for _ in range(3)), key=lambda m: m.median_ms)

    def reference_probe(self) -> Callable[[], float]:
        tmp = tempfile.TemporaryDirectory()  # lives as long as the probe
        path = self._deployed(ReferenceKernel(), [REFERENCE_SHAPE], tmp.name)

        def probe(keep: object = tmp) -> float:
            return self._measure_file(path, [REFERENCE_SHAPE], 0).median_ms

        return probe

    def time(self, run: Callable[[], object]) -> Measurement:
        if not isinstance(run, _RemoteRun):
            raise LatencyError("Remote.time times what Remote.load returned (a file on the device)")
        return self._measure_file(run.path, run.input_shapes, 0)

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        raise LatencyError("a remote backend does not run kernels here; use measure()")

    # -- deployed models -----------------------------------------------------------------------
    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape,
               calibration: Sequence[np.ndarray] | None = None) -> Path:
        return self.inner.deploy(net, path, input_shape, calibration)

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        return _RemoteRun(Path(path), [tuple(input_shape)])

    def run_file(self, path: str | Path, x) -> object:
        raise LatencyError("a remote device's agent answers timings, not outputs; check outputs with the "
                           f"{self.inner.name!r} backend here")

    @property
    def quantized(self) -> bool:
        return self.inner.quantized

    def deploy_path(self, path: str | Path) -> Path:  # type: ignore[override]
        return self.inner.deploy_path(path)

    def deployed_files(self, path: Path) -> list[Path]:  # type: ignore[override]
        return self.inner.deployed_files(path)
