"""onnx2torch's own modules, so that an ONNX model gets the same space as its PyTorch source."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.ir.graph import node_shape
from autotailor.ir.handlers import Elementwise, Track, register
from autotailor.ir.ops.elementwise import Binary, Pointwise, SpatialPool, reduced

try:
    from onnx2torch.node_converters import activations, binary_math_operations, global_average_pool, reduce, transpose
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
