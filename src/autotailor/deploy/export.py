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
import torch.nn.functional as F

from autotailor.deploy.fold import fold_linear_norms
from autotailor.errors import ExportError
from autotailor.files import atomic_write

log = logging.getLogger(__name__)


@contextmanager
def tracing_for_export() -> Iterator[None]:
    """What every exporter runs under: no gradients, no warnings, and PyTorch's fused attention
    fast path off (``nn.MultiheadAttention`` in eval mode without gradients otherwise calls
    ``_native_multi_head_attention``, which neither ONNX nor TorchScript tracing can express)."""
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


@contextmanager
def _exporting(net: nn.Module, path: Path, what: str) -> Iterator[Path]:
    """Yield a temporary file next to ``path`` with ``net`` in eval mode; on success move it
    to ``path``, on failure delete it and raise ``ExportError``. Restores the mode."""
    was_training = net.training
    net.eval()
    try:
        with atomic_write(path) as tmp, tracing_for_export():
            yield tmp
    except Exception as exc:
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
    net = fold_linear_norms(net)
    with _exporting(net, path, "ONNX") as tmp, _onnx2torch_opset(opset):
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


@contextmanager
def _onnx2torch_opset(opset: int) -> Iterator[None]:
    """onnx2torch's modules left in a SubNet of an ONNX import (the shape arithmetic of
    torchvision's Swin) export themselves reading the opset from
    ``torch.onnx.symbolic_helper._export_onnx_opset_version``, which torch 2.14 lacks: it is
    given for the export's duration, then removed."""
    from torch.onnx import symbolic_helper as helper

    if hasattr(helper, "GLOBALS") or hasattr(helper, "_export_onnx_opset_version"):
        yield
        return
    helper._export_onnx_opset_version = opset
    try:
        yield
    finally:
        del helper._export_onnx_opset_version


def export_torchscript(net: nn.Module, path: str | Path, input_shape: tuple[int, ...]) -> Path:
    """Write ``net`` as a traced TorchScript module."""
    path = Path(path)
    with _exporting(net, path, "TorchScript") as tmp:
        torch.jit.trace(net, torch.zeros(input_shape)).save(str(tmp))
    return path


class _PointwiseLinear(nn.Module):
    """``linear`` on the last dimension of a 3-D or 4-D tensor, as a 1x1 convolution between
    permutes (see ``_for_ncnn``); other inputs go to ``linear`` itself."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = {3: F.conv1d, 4: F.conv2d}.get(x.dim())
        if conv is None:
            return self.linear(x)
        w = self.linear.weight.reshape(self.linear.weight.shape + (1,) * (x.dim() - 2))
        last_to_1 = (0, x.dim() - 1, *range(1, x.dim() - 1))
        back = (0, *range(2, x.dim()), 1)
        return conv(x.permute(last_to_1), w, self.linear.bias).permute(back)


def _for_ncnn(net: nn.Module) -> nn.Module:
    """``net`` with each ``nn.Linear`` wrapped in ``_PointwiseLinear`` (a copy; ``net`` is untouched).

    pnnx turns a linear layer on a tensor of more than two dimensions (ConvNeXt's channels-last
    MLP) into a Gemm between reshapes computed from the input's shape at run time, which NCNN
    runs 40x slower than a 1x1 convolution between permutes (96->384 channels at 56x56:
    107 ms against 2.6 ms). Flattening to two dimensions instead loses the batch dimension
    for pnnx."""
    import copy

    linears = [name for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        return net
    net = copy.deepcopy(net)
    for name in linears:
        net.set_submodule(name, _PointwiseLinear(net.get_submodule(name)))
    return net


def export_ncnn(net: nn.Module, path: str | Path, input_shape: tuple[int, ...] | list[tuple[int, ...]]
                ) -> tuple[Path, Path]:
    """Write ``net`` as an NCNN model ``PATH.param`` + ``PATH.bin`` through pnnx (TorchScript in,
    BatchNorm and activations fused into the convolutions, fp32 weights). Inputs are named
    ``in0, in1, ...`` and the output ``out0``, each without the batch dimension. Linear layers
    on 3-D and 4-D tensors are exported as 1x1 convolutions (see ``_for_ncnn``)."""
    try:
        from pnnx import EXEC_PATH
    except ImportError as exc:
        raise ExportError("NCNN export needs pnnx: pip install pnnx") from exc
    import subprocess

    path = Path(path).resolve()  # pnnx runs in a temporary directory
    shapes = [tuple(input_shape)] if isinstance(input_shape[0], int) else [tuple(s) for s in input_shape]
    param, weights = path.with_suffix(".param"), path.with_suffix(".bin")
    param.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=param.parent, prefix=".pnnx-") as tmp:
        work = Path(tmp)
        with _exporting(net, work / "model.pt", "TorchScript") as ts:
            torch.jit.trace(_for_ncnn(fold_linear_norms(net)), tuple(torch.zeros(s) for s in shapes)).save(str(ts))
        outputs = {k: work / name for k, name in (
            ("ncnnparam", "model.param"), ("ncnnbin", "model.bin"), ("pnnxparam", "model.pnnx.param"),
            ("pnnxbin", "model.pnnx.bin"), ("pnnxpy", "model_pnnx.py"), ("pnnxonnx", "model.pnnx.onnx"),
            ("ncnnpy", "model_ncnn.py"))}
        shape_arg = ",".join("[" + ",".join(map(str, s)) + "]" for s in shapes)
        cmd = [EXEC_PATH, str(work / "model.pt"), f"inputshape={shape_arg}", "fp16=0",
               *(f"{k}={v}" for k, v in outputs.items())]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
        if done.returncode != 0 or not outputs["ncnnparam"].is_file():
            tail = "\n".join((done.stderr or done.stdout).splitlines()[-5:])
            raise ExportError(f"pnnx could not convert the model to NCNN (exit {done.returncode}): {tail}")
        unknown = _unknown_ncnn_layers(outputs["ncnnparam"])
        if unknown:
            raise ExportError(f"pnnx left operators that NCNN has no layer for: {', '.join(unknown)}; this model "
                              "cannot run on NCNN: deploy it with ONNX Runtime (ort-cpu) or OpenVINO instead")
        os.replace(outputs["ncnnparam"], param)
        os.replace(outputs["ncnnbin"], weights)
    return param, weights


def _unknown_ncnn_layers(param: Path) -> list[str]:
    """The layer types of an NCNN ``.param`` file that NCNN does not know (what pnnx could not
    convert, such as a strided slice over two axes: ``Tensor.slice``), sorted."""
    import ncnn

    types = {line.split()[0] for line in param.read_text().splitlines()[2:] if line.strip()}
    return sorted(t for t in types if ncnn.layer_to_index(t) < 0)


def ncnn_net(param: str | Path, threads: int = 1, precision: str = "fp16", winograd: bool = True):
    """An ``ncnn.Net`` loaded from ``PATH.param`` and its ``.bin``, running on ``threads`` CPU
    threads at ``precision`` (``NCNN_PRECISIONS``), with or without Winograd convolutions."""
    import ncnn

    from autotailor.precision import configure_ncnn, ncnn_options_error

    error = ncnn_options_error(precision, winograd)
    if error:
        raise ExportError(error)
    param = Path(param)
    net = ncnn.Net()
    net.opt.num_threads = threads
    configure_ncnn(net.opt, precision, winograd)
    if net.load_param(str(param)) != 0 or net.load_model(str(param.with_suffix(".bin"))) != 0:
        raise ExportError(f"NCNN could not load {param} and {param.with_suffix('.bin')}")
    return net


def run_ncnn(net, *inputs: np.ndarray) -> np.ndarray:
    """Run an NCNN net (see ``ncnn_net``) on batch-1 inputs; returns the output with a batch dimension."""
    import ncnn

    names = net.input_names()
    if len(names) != len(inputs):
        raise ExportError(f"the NCNN model has inputs {names}, but {len(inputs)} arrays were given")
    ex = net.create_extractor()
    for i, x in enumerate(inputs):
        # ncnn.Mat borrows the array's memory, and in-place layers would write into it (or into
        # freed memory): the extractor gets its own copy.
        array = np.ascontiguousarray(x[0], dtype=np.float32)  # alive until cloned
        ex.input(f"in{i}", ncnn.Mat(array).clone())
    ret, out = ex.extract("out0")
    if ret != 0:
        raise ExportError(f"NCNN failed to run the model (code {ret})")
    return np.array(out)[None]


def run_onnx(path: str | Path, x: np.ndarray | torch.Tensor, threads: int = 1) -> np.ndarray:
    """Run an ONNX model on ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # errors only: an int8 model's fusions warn of every float constant they leave
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return sess.run(None, {sess.get_inputs()[0].name: x.astype(np.float32)})[0]
