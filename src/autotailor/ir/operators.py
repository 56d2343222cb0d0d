"""Dynamic operators: torch layers whose active channels / kernel are a slice of shared weights.

Each operator subclasses the torch layer it replaces, so its parameters keep their names and
the usual initialisation and BatchNorm semantics; ``forward`` slices the first ``k`` channels
(channels were reordered by importance at compile time) and centre-crops kernels. ``infer``
deduces the output shape from the input shape without running anything, and ``build``
returns a plain torch layer holding copies of the active slices.

The operators themselves live with their handlers (``ir/ops``): a handler's ``dynamic`` is
the operator that slices its layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn

from autotailor.ir.feature import Feature

Shape = tuple[int, ...]


class Operator(nn.Module):
    """Mixin for TailorIR operators. ``feature.active`` drives ``forward``; ``feature.meta`` is fixed."""

    feature: Feature
    # Feature field -> the variable that sets it (``in_channels`` -> ``stage2.width_ratio``),
    # set by the compiler; the variable's kind says what each choice sets (``Variable.value``).
    reads: dict[str, str]
    # Feature field -> how many units it has per unit of its variable (channels per head).
    units: dict[str, int]
    # The feature fields that the input and the output channels set (width variables bind them).
    group_fields: ClassVar[tuple[str, str]]

    @classmethod
    def from_module(cls, module: nn.Module, **attrs: object) -> "Operator":
        """The operator that is ``module``, with ``attrs`` (what the operator knows beyond the
        layer, e.g. a projection's rows per head) set before its feature is read."""
        # Adopt the torch layer's state wholesale (parameters, buffers, hyper-parameters):
        # the operator *is* that layer plus a Feature, so nothing is copied or renamed.
        op = cls.__new__(cls)
        op.__dict__.update(module.__dict__)
        op.__dict__.update(attrs)
        op.__dict__["_parameters"] = dict(module._parameters)
        op.__dict__["_buffers"] = dict(module._buffers)
        op.__dict__["_modules"] = dict(module._modules)
        op.reads, op.units = {}, {}
        op.feature = Feature.of(op._meta_spec())
        return op

    def _meta_spec(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def transform(self, **changes) -> None:
        """Apply a modification to the active feature (e.g. ``out_channels=48``)."""
        self.feature.transform(type(self).__name__, **changes)

    def infer(self, shape: Shape) -> Shape:  # pragma: no cover - abstract
        """Output shape for an input of ``shape`` under the active feature."""
        raise NotImplementedError

    def build(self) -> nn.Module:  # pragma: no cover - abstract
        """A static torch layer equal to this operator's active architecture."""
        raise NotImplementedError


@dataclass(frozen=True)
class ParamSpec:
    size: int


class DynParam(Operator):
    """A parameter (e.g. a layer scale) used elementwise with a channel group; sliced along ``axis``."""

    group_fields = ("size", "size")

    def __init__(self, value: torch.Tensor, axis: int):
        super().__init__()
        if isinstance(value, nn.Parameter):
            self.value = value
        else:
            self.register_buffer("value", value)
        self.axis = axis
        self.reads, self.units = {}, {}
        self.feature = Feature.of(ParamSpec(value.shape[axis]))

    def forward(self) -> torch.Tensor:
        return self.value.narrow(self.axis, 0, self.feature.active.size)

    def infer(self, shape: Shape = ()) -> Shape:
        s = list(self.value.shape)
        s[self.axis] = self.feature.active.size
        return tuple(s)

    def build(self) -> torch.Tensor:  # a tensor, not a module: extraction emits a get_attr
        return self.forward().detach().clone()
