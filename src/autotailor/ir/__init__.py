"""TailorIR: operators and blocks that keep a meta (largest) and an active architecture."""

from autotailor.ir.block import Block
from autotailor.ir.feature import Feature
from autotailor.ir.operators import (
    DynBatchNorm2d,
    DynConv2d,
    DynLayerNorm,
    DynLinear,
    DynParam,
    Operator,
    lift_module,
    operator_types,
)

__all__ = [
    "Block",
    "DynBatchNorm2d",
    "DynConv2d",
    "DynLayerNorm",
    "DynLinear",
    "DynParam",
    "Feature",
    "Operator",
    "lift_module",
    "operator_types",
]
