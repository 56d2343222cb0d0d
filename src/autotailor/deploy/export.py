"""Export a plain (extracted) module to ONNX or TorchScript, atomically, and run ONNX models."""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from autotailor.errors import ExportError

log = logging.getLogger(__name__)


@contextmanager
def _exporting(net: nn.Module, path: Path, what: str) -> Iterator[Path]:
    """Yield a temporary file next to ``path`` with ``net`` in eval mode; on success move it
    to ``path``, on failure delete it and raise ``ExportError``. Restores the mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    was_training = net.training
    net.eval()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            yield tmp
        os.replace(tmp, path)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"{what} export to {path} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        net.train(was_training)


def export_onnx(net: nn.Module, path: str | Path, input_shape: tuple[int, ...], opset: int = 17) -> Path:
    """Write ``net`` as ONNX with a dynamic batch dimension, input ``input``, output ``logits``.

    The TorchScript-based exporter is tried first (fast; folds BatchNorm into convolutions);
    operators it cannot express (an adaptive pooling whose output size does not divide its
    input, as in VGG below 224 px) fall back to the torch.export-based exporter.
    """
    path = Path(path)
    x = torch.zeros(input_shape)
    with _exporting(net, path, "ONNX") as tmp:
        try:
            torch.onnx.export(
                net, (x,), str(tmp), dynamo=False, opset_version=opset,
                input_names=["input"], output_names=["logits"],
                dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            )
        except torch.onnx.errors.OnnxExporterError as first:
            log.info("TorchScript-based ONNX export failed (%s); using torch.export", first)
            torch.onnx.export(
                net, (x,), str(tmp), dynamo=True, input_names=["input"], output_names=["logits"],
                dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False,
            )
    return path


def export_torchscript(net: nn.Module, path: str | Path, input_shape: tuple[int, ...]) -> Path:
    """Write ``net`` as a traced TorchScript module."""
    path = Path(path)
    with _exporting(net, path, "TorchScript") as tmp:
        torch.jit.trace(net, torch.zeros(input_shape)).save(str(tmp))
    return path


def run_onnx(path: str | Path, x: np.ndarray | torch.Tensor, threads: int = 1) -> np.ndarray:
    """Run an ONNX model on ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return sess.run(None, {sess.get_inputs()[0].name: x.astype(np.float32)})[0]
