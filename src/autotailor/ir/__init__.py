"""TailorIR: operator handlers, dynamic operators and blocks that keep a meta (largest) and an
active architecture."""

from autotailor.ir import ops  # noqa: F401  (registers the operator handlers)
from autotailor.ir.block import Block
from autotailor.ir.feature import Feature
from autotailor.ir.handlers import OpHandler, for_module, for_node, lift, register, registered
from autotailor.ir.operators import DynParam, Operator
from autotailor.ir.ops.conv import DynConv2d
from autotailor.ir.ops.linear import DynLinear
from autotailor.ir.ops.norm import DynBatchNorm2d, DynLayerNorm

__all__ = [
    "Block",
    "DynBatchNorm2d",
    "DynConv2d",
    "DynLayerNorm",
    "DynLinear",
    "DynParam",
    "Feature",
    "OpHandler",
    "Operator",
    "for_module",
    "for_node",
    "lift",
    "register",
    "registered",
]
