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

from autotailor.ir.block import Block
from autotailor.ir.handlers import for_module
from autotailor.ir.operators import DynParam, Operator

OnNode = Callable[[str, fx.Node, Any], None]

def to_meta(value: Any) -> Any:
    """A meta tensor of the same shape for floating-point tensors; anything else unchanged
    (integer tensors are shapes or indices that code may read, such as an ONNX Reshape's)."""
    if isinstance(value, torch.Tensor) and value.device.type != "meta" and value.is_floating_point():
        return torch.empty_like(value, device="meta")
    return value


class MetaInterpreter(fx.Interpreter):
    """Runs a graph on meta tensors, calling ``on_node(prefix, node, value)`` after each node."""

    def __init__(self, gm: fx.GraphModule, on_node: OnNode | None = None, prefix: str = ""):
        super().__init__(gm)
        self.on_node = on_node
        self.prefix = prefix

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if self.on_node is not None:
            self.on_node(self.prefix, n, result)
        return result

    def get_attr(self, target, args, kwargs):
        return to_meta(super().get_attr(target, args, kwargs))

    def call_module(self, target, args, kwargs):
        mod = self.fetch_attr(target)
        if isinstance(mod, Block):
            if not mod.feature.active.enabled:
                return args[0]
            return MetaInterpreter(mod.body, self.on_node, f"{self.prefix}{target}.body.").run(args[0])
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
        return MetaInterpreter(net, on_node).run(to_meta(example))


def deduce_shapes(net: fx.GraphModule, input_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Output shape of every tensor-valued node of ``net``: module calls under their module
    path in ``net`` (``block3.body.layer1.1.conv1``), other nodes under their node name."""
    shapes: dict[str, tuple[int, ...]] = {}

    def record(prefix: str, n: fx.Node, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            shapes[prefix + (n.target if n.op == "call_module" else n.name)] = tuple(value.shape)

    run_meta(net, torch.empty(input_shape, device="meta"), record)
    return shapes
