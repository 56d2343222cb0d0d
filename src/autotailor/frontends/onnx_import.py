"""Import an ONNX classifier as a torch.fx GraphModule through onnx2torch."""

from __future__ import annotations

import logging
from pathlib import Path

import torch.fx as fx

from autotailor.errors import ModelLoadError

log = logging.getLogger(__name__)


def import_onnx(path: str | Path) -> fx.GraphModule:
    """Load ``path`` and convert it to an fx GraphModule with onnx2torch."""
    import onnx
    import onnx2torch

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"ONNX file not found: {path}")
    try:
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a valid ONNX model: {exc}") from exc
    if len(proto.graph.input) - len(proto.graph.initializer) > 1:
        names = [i.name for i in proto.graph.input]
        raise ModelLoadError(f"{path} has several inputs {names}; an image classifier takes one image tensor")
    _bypass_identities(proto)
    try:
        gm = onnx2torch.convert(proto)
    except NotImplementedError as exc:
        raise ModelLoadError(
            f"{path}: an operator is not supported by onnx2torch ({exc}). "
            "Export with torch.onnx.export(..., dynamo=False, opset_version=17) or compile the PyTorch module."
        ) from exc
    gm.eval()
    return gm


def _bypass_identities(proto) -> None:
    """Remove Identity nodes, reading their inputs directly.

    ``torch.onnx.export`` emits Identity nodes for initializers shared by several layers,
    which onnx2torch cannot read as weights. (General-purpose ONNX optimizers would also do
    this, but they freeze shapes such as a Flatten's output into constants, which would
    pin the batch size and the channel count.)
    """
    graph = proto.graph
    alias = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity"}
    if not alias:
        return
    outputs = {o.name for o in graph.output}

    def resolve(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    keep = [n for n in graph.node if n.op_type != "Identity" or n.output[0] in outputs]
    for node in keep:
        for i, name in enumerate(node.input):
            node.input[i] = resolve(name)
    del graph.node[:]
    graph.node.extend(keep)
