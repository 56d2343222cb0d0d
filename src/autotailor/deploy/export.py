"""Export a plain (extracted) module to ONNX or TorchScript, atomically, and run ONNX models."""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from autotailor.errors import ExportError

log = logging.getLogger(__name__)


def _atomic_target(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    return Path(tmp)


def export_onnx(net: nn.Module, path: str | Path, input_shape: tuple[int, ...], opset: int = 17) -> Path:
    """Write ``net`` as ONNX (batch dimension dynamic). Uses the TorchScript-based exporter,
    whose graphs keep BatchNorm folded and need no extra packages at run time."""
    path = Path(path)
    tmp = _atomic_target(path)
    was_training = net.training
    net.eval()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                net, (torch.zeros(input_shape),), str(tmp), dynamo=False, opset_version=opset,
                input_names=["input"], output_names=["logits"],
                dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            )
        os.replace(tmp, path)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"ONNX export to {path} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        net.train(was_training)
    return path


def export_torchscript(net: nn.Module, path: str | Path, input_shape: tuple[int, ...]) -> Path:
    """Write ``net`` as a traced TorchScript module."""
    path = Path(path)
    tmp = _atomic_target(path)
    was_training = net.training
    net.eval()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            scripted = torch.jit.trace(net, torch.zeros(input_shape))
            scripted.save(str(tmp))
        os.replace(tmp, path)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"TorchScript export to {path} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        net.train(was_training)
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
