"""PyTorch eager mode, deployed as TorchScript."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from autotailor.predict.latency.backends.base import Backend, Shape, backend
from autotailor.predict.latency.kernels import FusionRules


@backend("torch")
class TorchEager(Backend):
    """PyTorch eager mode on the CPU with ``threads`` intra-op threads; every operator is its own
    kernel. Deployed as TorchScript."""

    fusion = FusionRules("torch", frozenset(), ())
    format = "torchscript"
    suffix = ".torchscript.pt"

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        module = module.eval()
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(s, generator=gen) for s in input_shapes]

        def run() -> object:
            previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                with torch.inference_mode():
                    return module(*xs)
            finally:
                torch.set_num_threads(previous)

        return run

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape,
               calibration: Sequence[np.ndarray] | None = None) -> Path:
        from autotailor.deploy import export_torchscript

        return export_torchscript(net, self.deploy_path(path), input_shape)

    def run_file(self, path: str | Path, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return torch.jit.load(str(path))(torch.as_tensor(x)).numpy()

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        return self.prepare(torch.jit.load(str(path)), [input_shape])
