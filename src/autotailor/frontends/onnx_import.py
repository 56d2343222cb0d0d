"""Import an ONNX classifier as a torch.fx GraphModule through onnx2torch."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx

from autotailor.errors import ModelLoadError

log = logging.getLogger(__name__)


# Operator versions that only added element types (ONNX's operator changelog), converted as the
# version onnx2torch knows: torch's exporter writes opset 20 by default, and onnx2torch stops at
# 17-18 for these.
_NEW_TYPES_ONLY = {("Shape", 19): 15, ("Shape", 21): 15, ("Reshape", 19): 14, ("Reshape", 21): 14,
                   ("Cast", 19): 13, ("Cast", 21): 13, ("Constant", 19): 13, ("Constant", 21): 13,
                   ("ConstantOfShape", 20): 9, ("ConstantOfShape", 21): 9, ("Equal", 19): 13,
                   ("Identity", 19): 16, ("Identity", 21): 16,
                   ("Flatten", 21): 13, ("Transpose", 21): 13, ("Unsqueeze", 21): 13}
_REDUCTIONS = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceSumSquare", "ReduceProd")
# Versions that added something a node may not use: converted as the older one where it does not.
_NEW_UNLESS_USED = {
    ("Split", 18): (13, lambda node: node.attributes.get("num_outputs", len(node.output_values))
                    == len(node.output_values)),
    ("Pad", 18): (13, lambda node: len(node.input_values) <= 3),  # no axes input
    ("Pad", 19): (13, lambda node: len(node.input_values) <= 3 and node.attributes.get("mode") != "wrap"),
    ("ScatterND", 18): (16, lambda node: node.attributes.get("reduction", "none") in ("none", "add", "mul")),
    ("AveragePool", 19): (11, lambda node: set(node.attributes.get("dilations", [1])) == {1}),
}


@functools.cache
def _register_converters() -> None:
    """Teach onnx2torch the newer versions above, and ``Gelu`` (opset 20), once."""
    from onnx2torch.node_converters.registry import add_converter, get_converter
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    def gelu(node, graph):  # noqa: ARG001 - onnx2torch's converter signature
        return OperationConverterResult(torch_module=torch.nn.GELU(node.attributes.get("approximate", "none")),
                                        onnx_mapping=onnx_mapping_from_node(node=node))

    def unless_used(op: str, old: int, allowed: Callable[[Any], bool]):
        def convert(node, graph):
            if not allowed(node):
                raise NotImplementedError(f"{op} {node.name!r} uses what opset {old} lacks")
            return get_converter(op, old)(node, graph)

        return convert

    def reduce_axes_input(node, graph):  # opset 18 moved a reduction's axes from attribute to input
        from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes
        from onnx2torch.utils.common import OnnxMapping, get_const_value

        axes = None
        if len(node.input_values) > 1:
            try:
                axes = get_const_value(node.input_values[1], graph).tolist()
            except KeyError as exc:
                raise NotImplementedError(f"{node.operation_type} {node.name!r} takes its axes at run time") from exc
        if not axes and node.attributes.get("noop_with_empty_axes", 0):
            raise NotImplementedError(f"{node.operation_type} {node.name!r} reduces nothing")
        return OperationConverterResult(
            torch_module=OnnxReduceStaticAxes(node.operation_type, axes, node.attributes.get("keepdims", 1)),
            onnx_mapping=OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values))

    converters = {(op, new): get_converter(op, old) for (op, new), old in _NEW_TYPES_ONLY.items()}
    converters.update({(op, 18): reduce_axes_input for op in _REDUCTIONS})
    converters.update({(op, new): unless_used(op, old, allowed)
                       for (op, new), (old, allowed) in _NEW_UNLESS_USED.items()})
    converters[("Gelu", 20)] = gelu
    for (op, version), converter in converters.items():
        try:
            add_converter(operation_type=op, version=version)(converter)
        except ValueError:  # a newer onnx2torch has it
            pass


def import_onnx(path: str | Path) -> fx.GraphModule:
    """Load ``path`` and convert it to an fx GraphModule with onnx2torch."""
    import onnx
    import onnx2torch

    _register_converters()

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
    _fill_omitted_clip_bounds(proto)
    try:
        gm = onnx2torch.convert(proto)
    except NotImplementedError as exc:
        raise ModelLoadError(
            f"{path}: an operator is not supported by onnx2torch ({exc}). "
            "Export with torch.onnx.export(..., dynamo=False, opset_version=17) or compile the PyTorch module."
        ) from exc
    for layer in gm.modules():
        # onnx2torch sizes a LayerNorm from its input's recorded shape, which an export leaves
        # unknown after a reshape computed at run time (Swin): its scale has the size.
        if isinstance(layer, torch.nn.LayerNorm) and layer.weight is not None \
                and tuple(layer.normalized_shape) != tuple(layer.weight.shape):
            layer.normalized_shape = tuple(layer.weight.shape)
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


def _fill_omitted_clip_bounds(proto) -> None:
    """onnx2torch reads a ``Clip``'s bounds as constants and fails on an omitted one (an empty
    input name: torchvision's Swin V2 clamps norms from below and its logit scale from above
    only). An omitted upper bound is dropped; an omitted lower one before an upper one becomes
    the lowest float."""
    import numpy as np
    from onnx import numpy_helper

    for node in proto.graph.node:
        if node.op_type != "Clip":
            continue
        while len(node.input) > 1 and node.input[-1] == "":
            del node.input[-1]
        if len(node.input) > 2 and node.input[1] == "":
            name = f"{node.name or node.output[0]}/lowest"
            proto.graph.initializer.append(numpy_helper.from_array(np.array(np.finfo(np.float32).min), name))
            node.input[1] = name
