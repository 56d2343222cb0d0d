"""Shape deduction (TailorIR's ``update``): every node's output shape for an input shape,
under the active architecture, without running the network.

Operators use their own ``infer`` rule; disabled blocks pass their input through; every
other node (bypassed operators, functions) follows its default rule: it is evaluated on
meta tensors, which carry shapes but hold no data, so nothing is computed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx as fx

from autotailor.ir.handlers import for_module
from autotailor.ir.operators import DynParam, Operator
from autotailor.ir.walk import GraphWalker

OnNode = Callable[[str, fx.Node, Any], None]

def to_meta(value: Any) -> Any:
    """A meta tensor of the same shape for floating-point tensors; anything else unchanged
    (integer tensors are shapes or indices that code may read, such as an ONNX Reshape's)."""
    if isinstance(value, torch.Tensor) and value.device.type != "meta" and value.is_floating_point():
        return torch.empty_like(value, device="meta")
    return value


class MetaInterpreter(GraphWalker):
    """Runs a graph on meta tensors, blocks inlined, calling ``on_node(name, node, value)`` after
    each node (``name``: the walker's one name of the node)."""

    def __init__(self, gm: fx.GraphModule, prefix: str = "", block: int | None = None,
                 parent: "MetaInterpreter | None" = None, on_node: OnNode | None = None):
        super().__init__(gm, prefix, block, parent)
        self.on_node = on_node if parent is None else parent.on_node

    def visit(self, n: fx.Node, value: Any) -> None:
        if self.on_node is not None:
            self.on_node(self.name_of(n), n, value)

    def get_attr(self, target, args, kwargs):
        return to_meta(super().get_attr(target, args, kwargs))

    def call_layer(self, target, mod, args, kwargs):
        if isinstance(mod, DynParam):
            return torch.empty(mod.infer(), dtype=mod.value.dtype, device="meta")
        if isinstance(mod, Operator):
            x = args[0]
            return torch.empty(mod.infer(tuple(x.shape)), dtype=x.dtype, device="meta")
        # Meta kernels of some layers (hardswish) are slow Python decompositions: a layer whose
        # handler says its output has its input's shape skips them.
        if for_module(mod).same_shape and len(args) == 1 and isinstance(args[0], torch.Tensor):
            return torch.empty_like(args[0], device="meta")
        state = {k: to_meta(v) for k, v in (*mod.named_parameters(), *mod.named_buffers())}
        return torch.func.functional_call(mod, state, args, kwargs)


def run_meta(net: fx.GraphModule, example: torch.Tensor, on_node: OnNode | None = None) -> Any:
    """Run ``net`` on a meta copy of ``example``."""
    with torch.no_grad():
        return MetaInterpreter(net, on_node=on_node).run(to_meta(example))


def deduce_shapes(net: fx.GraphModule, input_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Output shape of every tensor-valued node of ``net``, under the walker's name of the node
    (``block3.body.layer1_1_conv1``: see ``ir.walk``)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def record(name: str, n: fx.Node, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            shapes[name] = tuple(value.shape)

    run_meta(net, torch.empty(input_shape, device="meta"), record)
    return shapes
