"""NCNN, models converted by pnnx."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch.nn as nn

from autotailor.errors import LatencyError
from autotailor.predict.latency.backends.base import Backend, Shape, backend
from autotailor.predict.latency.kernels import POINTWISE_ACTS, FusionRules


@backend("ncnn")
class Ncnn(Backend):
    """NCNN on the CPU with ``threads`` threads; kernels and SubNets are converted by pnnx, which
    folds BatchNorm and fuses activations into convolutions. A call creates an extractor, feeds
    the inputs and extracts the output, as an application does."""

    # pnnx folds BatchNorm and fuses activations into Convolution / InnerProduct.
    fusion = FusionRules("ncnn", frozenset({"conv2d", "linear"}), (
        frozenset({"batchnorm2d"}), POINTWISE_ACTS | {"hardswish"}))
    format = "ncnn"
    suffix = ".param"

    options = ("threads", "precision", "winograd", "flush_mb")

    def __init__(self, precision: str = "fp16", winograd: bool = True, **kwargs: object):
        from autotailor.precision import ncnn_options_error

        super().__init__(**kwargs)
        error = ncnn_options_error(precision, winograd)
        if error:
            raise LatencyError(error)
        self.precision, self.winograd = precision, winograd
        self._widest: int | None = None

    @property
    def settings(self) -> dict[str, object]:
        # NCNN's defaults are left out of the key: tables profiled before they were settings
        # were measured at them
        return {**super().settings, **({"precision": self.precision} if self.precision != "fp16" else {}),
                **({"winograd": False} if not self.winograd else {})}

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        from autotailor.deploy import export_ncnn

        with tempfile.TemporaryDirectory() as tmp:
            param, _ = export_ncnn(module, Path(tmp) / "kernel", input_shapes)
            return self._runner(param, input_shapes, packed=True)

    def _runner(self, param: Path, input_shapes: list[Shape], packed: bool = False) -> Callable[[], object]:
        import ncnn

        from autotailor.deploy import ncnn_net

        net = ncnn_net(param, self.threads, self.precision, self.winograd)  # loaded into memory: the files may go
        rng = np.random.default_rng(0)
        # Inputs are NCNN-owned Mats made once, as an application reuses its input buffers, and
        # the output is extracted as computed (type 1: no conversion): copying either would be
        # timed with every kernel. A kernel's inputs come packed, as the layer before it in a
        # model leaves them, so that its time holds no layout conversion.
        arrays = [rng.standard_normal(s[1:]).astype(np.float32) for s in input_shapes]
        # ncnn.Mat borrows an array's memory: the arrays must outlive the clone (a temporary may not)
        mats = [ncnn.Mat(a).clone() for a in arrays]
        if packed:
            mats = [ncnn.convert_packing(m, self._elempack(s[1] if len(s) > 2 else s[-1]))
                    for m, s in zip(mats, input_shapes)]

        def run() -> object:
            ex = net.create_extractor()
            for i, m in enumerate(mats):
                ex.input(f"in{i}", m)
            return ex.extract("out0", 1)

        return run

    def _elempack(self, channels: int) -> int:
        """The packing NCNN's layers give a blob of ``channels`` on this CPU (probed once)."""
        if self._widest is None:
            import ncnn

            from autotailor.deploy import export_ncnn

            with tempfile.TemporaryDirectory() as tmp:
                param, _ = export_ncnn(nn.Conv2d(1, 16, 1), Path(tmp) / "probe", (1, 1, 4, 4))
                run = self._runner(param, [(1, 1, 4, 4)])
            out = run()[1]
            self._widest = out.elempack if isinstance(out, ncnn.Mat) else 1
        return next(p for p in (16, 8, 4, 1) if p <= self._widest and channels % p == 0)

    def kernel_file(self, module: nn.Module, input_shapes: list[Shape], path: str | Path) -> Path:
        from autotailor.deploy import export_ncnn

        return export_ncnn(module, self.deploy_path(path), input_shapes)[0]

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape,
               calibration: Sequence[np.ndarray] | None = None) -> Path:
        from autotailor.deploy import export_ncnn

        return export_ncnn(net, self.deploy_path(path), input_shape)[0]

    @classmethod
    def deployed_files(cls, path: Path) -> list[Path]:
        return [path, path.with_suffix(".bin")]

    def run_file(self, path: str | Path, x: np.ndarray) -> np.ndarray:
        from autotailor.deploy import ncnn_net, run_ncnn

        return run_ncnn(ncnn_net(path, self.threads, self.precision, self.winograd), x)

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        return self._runner(Path(path), [input_shape])
