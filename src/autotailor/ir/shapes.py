"""Shape deduction (TailorIR's ``update``): every node's output shape for an input shape,
under the active architecture, without running the network.

Operators use their own ``infer`` rule; disabled blocks pass their input through; every
other node (bypassed operators, functions) follows its default rule: it is evaluated on
meta tensors, which carry shapes but hold no data, so nothing is computed.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from autotailor.ir.block import Block
from autotailor.ir.operators import DynParam, Operator


class _Deduce(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, prefix: str, shapes: dict[str, tuple[int, ...]]):
        super().__init__(gm)
        self.prefix = prefix
        self.shapes = shapes

    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        if isinstance(result, torch.Tensor):
            # Module calls are keyed by the module's path in the SuperNet, the rest by node name.
            key = n.target if n.op == "call_module" else n.name
            self.shapes[self.prefix + key] = tuple(result.shape)
        return result

    def get_attr(self, target, args, kwargs):
        return _meta(super().get_attr(target, args, kwargs))

    def call_module(self, target, args, kwargs):
        mod = self.fetch_attr(target)
        if isinstance(mod, Block):
            if not mod.feature.active.enabled:
                return args[0]
            return _Deduce(mod.body, f"{self.prefix}{target}.body.", self.shapes).run(args[0])
        if isinstance(mod, DynParam):
            return torch.empty(mod.infer(), dtype=mod.value.dtype, device="meta")
        if isinstance(mod, Operator):
            x = args[0]
            return torch.empty(mod.infer(tuple(x.shape)), dtype=x.dtype, device="meta")
        state = {k: _meta(v) for k, v in (*mod.named_parameters(), *mod.named_buffers())}
        return torch.func.functional_call(mod, state, args, kwargs)


def _meta(value):
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        return torch.empty_like(value, device="meta")
    return value


def deduce_shapes(net: fx.GraphModule, input_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Output shape of every tensor-valued node of ``net``: module calls under their module
    path in ``net`` (``block3.body.layer1.1.conv1``), other nodes under their node name."""
    shapes: dict[str, tuple[int, ...]] = {}
    with torch.no_grad():
        _Deduce(net, "", shapes).run(torch.empty(input_shape, device="meta"))
    return shapes
