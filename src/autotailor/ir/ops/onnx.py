"""onnx2torch's own modules, so that an ONNX model gets the same space as its PyTorch source."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.ir.graph import get_attr, node_shape
from autotailor.ir.handlers import Elementwise, Track, register
from autotailor.ir.ops.elementwise import Binary, Pointwise, SpatialPool, reduced

try:
    from onnx2torch.node_converters import (activations, binary_math_operations, constant, gather,
                                            global_average_pool, reduce, shape, transpose)
    from onnx2torch.node_converters.slice import OnnxSlice
except ImportError:  # pragma: no cover - onnx2torch is a dependency
    activations = None

if activations is not None:

    @register(activations.OnnxErf, activations.OnnxHardSigmoid)
    class OnnxPointwise(Pointwise):
        pass

    @register(transpose.OnnxTranspose)
    class OnnxTranspose(Elementwise):
        def channels(self, a, node: fx.Node) -> Track | None:
            t = a.track(node.args[0])
            perm = a.module(node).perm
            if t is None:
                return None
            nd = len(node_shape(node.args[0]))
            perm = list(range(nd))[::-1] if perm is None else [d % nd for d in perm]
            return Track(perm.index(t.axis), t.gid)

    @register(reduce.OnnxReduceStaticAxes)
    class OnnxReduce(Elementwise):
        def channels(self, a, node: fx.Node) -> Track | None:
            t = a.track(node.args[0])
            mod = a.module(node)
            if t is None:
                return None
            if mod.operation_type not in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum") or not mod.axes:
                a.fix(t.gid, f"{node.name} ({mod.operation_type}) has no channel rule")
                return None
            nd = len(node_shape(node.args[0]))
            return reduced(a, node, t, [d % nd for d in mod.axes], mod.keepdims)

    @register(binary_math_operations.OnnxBinaryMathOperation)
    class OnnxBinary(Binary):
        _ARITHMETIC = (torch.add, torch.sub, torch.mul, torch.div, binary_math_operations._onnx_div)

        def channels(self, a, node: fx.Node) -> Track | None:
            if a.module(node).math_op_function not in self._ARITHMETIC:
                a.fix_inputs(node, f"{node.name} has no channel rule")
                return None
            return super().channels(a, node)

    _pools = [cls for name, cls in vars(global_average_pool).items()
              if isinstance(cls, type) and issubclass(cls, nn.Module) and name.startswith("OnnxGlobalAveragePool")]

    @register(*_pools)
    class OnnxGlobalPool(SpatialPool):
        pass

    @register(shape.OnnxShape)
    class OnnxShape(Elementwise):
        """``Shape`` (an export's shape arithmetic, such as Swin's shift mask from the spatial
        sizes): the channels stay free where every reader takes other axes' sizes, a Gather or a
        Slice by constants; otherwise they are fixed."""

        def channels(self, a, node: fx.Node) -> None:
            t = a.track(node.args[0])
            if t is None:
                return None
            mod = a.module(node)
            axes = list(range(len(node_shape(node.args[0]))))[mod._start: mod._end]
            for user in node.users:
                taken = _entries(a, user, len(axes))
                if taken is None or t.axis in [axes[i] for i in taken]:
                    a.fix(t.gid, f"{node.name} reads the channel count for {user.name}")
                    return None
            return None

    def _constant(a, node: object) -> torch.Tensor | None:
        if isinstance(node, fx.Node) and node.op == "get_attr":
            value = get_attr(a.gm, node.target)
        else:
            value = a.module(node).value if isinstance(node, fx.Node) and node.op == "call_module" \
                and isinstance(a.module(node), constant.OnnxConstant) else None
        return value if isinstance(value, torch.Tensor) else None

    def _entries(a, user: fx.Node, n: int) -> list[int] | None:
        """The entries of a shape of ``n`` that ``user`` takes, or None if not known."""
        mod = a.module(user) if user.op == "call_module" else None
        if isinstance(mod, gather.OnnxGather) and mod._axis == 0:
            index = _constant(a, user.args[1])
            return None if index is None else [int(i) % n for i in index.flatten().tolist()]
        if isinstance(mod, OnnxSlice) and len(user.args) >= 3:
            given = list(user.args[1:5]) + [None] * (5 - len(user.args))
            values = [None if b is None else _constant(a, b) for b in given]
            if any(b is not None and (x is None or x.numel() != 1) for b, x in zip(given, values)) \
                    or (values[2] is not None and int(values[2]) != 0):
                return None  # bounds known at run time only, or a slice of another axis
            step = 1 if values[3] is None else int(values[3])
            return list(range(n))[int(values[0]): int(values[1]): step]
        return None
