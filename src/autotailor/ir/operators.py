"""Dynamic operators: torch layers whose active channels / kernel are a slice of shared weights.

Each operator subclasses the torch layer it replaces, so its parameters keep their names and
the usual initialisation and BatchNorm semantics; ``forward`` slices the first ``k`` channels
(channels were reordered by importance at compile time) and centre-crops kernels. ``infer``
deduces the output shape from the input shape without running anything, and ``build``
returns a plain torch layer holding copies of the active slices.

Supporting another layer is one subclass decorated with ``@register(TorchLayer)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.feature import Feature

Shape = tuple[int, ...]

_REGISTRY: dict[type[nn.Module], type["Operator"]] = {}


def register(torch_type: type[nn.Module]) -> Callable[[type["Operator"]], type["Operator"]]:
    """Declare ``cls`` as the dynamic version of ``torch_type``."""

    def deco(cls: type["Operator"]) -> type["Operator"]:
        _REGISTRY[torch_type] = cls
        return cls

    return deco


def operator_types() -> dict[type[nn.Module], type["Operator"]]:
    """The torch layer types that have a dynamic operator."""
    return dict(_REGISTRY)


def lift_module(module: nn.Module) -> "Operator":
    """Return the dynamic operator for ``module``, sharing its parameters."""
    cls = _REGISTRY[type(module)]
    return cls.from_module(module)


class Operator(nn.Module):
    """Mixin for TailorIR operators. ``feature.active`` drives ``forward``; ``feature.meta`` is fixed."""

    feature: Feature
    # Channel groups (names) the operator's input / output channels belong to; set by the compiler.
    in_group: str | None
    out_group: str | None
    # The feature fields that the input and the output channel group set.
    group_fields: ClassVar[tuple[str, str]]

    @classmethod
    def from_module(cls, module: nn.Module) -> "Operator":
        # Adopt the torch layer's state wholesale (parameters, buffers, hyper-parameters):
        # the operator *is* that layer plus a Feature, so nothing is copied or renamed.
        op = cls.__new__(cls)
        op.__dict__.update(module.__dict__)
        op.__dict__["_parameters"] = dict(module._parameters)
        op.__dict__["_buffers"] = dict(module._buffers)
        op.__dict__["_modules"] = dict(module._modules)
        op.in_group = None
        op.out_group = None
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
class ConvSpec:
    in_channels: int
    out_channels: int
    kernel_size: int
    groups: int


@register(nn.Conv2d)
class DynConv2d(Operator, nn.Conv2d):
    """Conv2d with sliceable in/out channels (groups follow the input) and centre-cropped square kernels."""

    group_fields = ("in_channels", "out_channels")

    def _meta_spec(self) -> ConvSpec:
        return ConvSpec(self.in_channels, self.out_channels, self.kernel_size[0], self.groups)

    def _active_params(self) -> tuple[torch.Tensor, torch.Tensor | None, int, object]:
        m, a = self.feature.meta, self.feature.active
        w = self.weight
        if m.groups == 1:
            w = w[: a.out_channels, : a.in_channels]
            groups = 1
        else:
            w = w[: a.out_channels]
            groups = a.in_channels // (m.in_channels // m.groups)
        padding = self.padding
        if a.kernel_size < m.kernel_size:
            s = (m.kernel_size - a.kernel_size) // 2
            w = w[:, :, s : s + a.kernel_size, s : s + a.kernel_size]
            if not isinstance(padding, str):
                padding = tuple(p - s * d for p, d in zip(padding, self.dilation))
        b = self.bias[: a.out_channels] if self.bias is not None else None
        return w, b, groups, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.feature.active == self.feature.meta:
            return nn.Conv2d.forward(self, x)
        w, b, groups, padding = self._active_params()
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        return F.conv2d(x, w, b, self.stride, padding, self.dilation, groups)

    def _active_kernel(self) -> tuple[int, ...]:
        # Only square kernels are cropped; any other kernel (1x7, ...) keeps its shape.
        a, m = self.feature.active, self.feature.meta
        return self.kernel_size if a.kernel_size == m.kernel_size else (a.kernel_size,) * len(self.kernel_size)

    def infer(self, shape: Shape) -> Shape:
        a = self.feature.active
        padding = self._active_params()[3] if a != self.feature.meta else self.padding
        out = [shape[0], a.out_channels]
        kernel = self._active_kernel()
        for i, size in enumerate(shape[2:]):
            k, s, d = kernel[i], self.stride[i], self.dilation[i]
            if isinstance(padding, str):
                out.append(size if padding == "same" else (size - d * (k - 1) - 1) // s + 1)
            else:
                out.append((size + 2 * padding[i] - d * (k - 1) - 1) // s + 1)
        return tuple(out)

    def build(self) -> nn.Conv2d:
        a = self.feature.active
        w, b, groups, padding = self._active_params()
        conv = nn.Conv2d(
            a.in_channels, a.out_channels, self._active_kernel(), self.stride, padding, self.dilation,
            groups, b is not None, self.padding_mode,
        )
        with torch.no_grad():
            conv.weight.copy_(w)
            if b is not None:
                conv.bias.copy_(b)
        return conv


@dataclass(frozen=True)
class NormSpec:
    num_features: int


@register(nn.BatchNorm2d)
class DynBatchNorm2d(Operator, nn.BatchNorm2d):
    """BatchNorm2d over the first ``num_features`` channels; running statistics are shared slices."""

    group_fields = ("num_features", "num_features")

    def _meta_spec(self) -> NormSpec:
        return NormSpec(self.num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.feature.active.num_features
        if k == self.num_features:
            return nn.BatchNorm2d.forward(self, x)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum
        if momentum is None:  # cumulative moving average, as nn.BatchNorm does
            momentum = 1.0 / float(self.num_batches_tracked) if self.num_batches_tracked is not None else 0.0
        use_batch = self.training or self.running_mean is None
        return F.batch_norm(
            x,
            self.running_mean[:k] if self.running_mean is not None else None,
            self.running_var[:k] if self.running_var is not None else None,
            self.weight[:k] if self.weight is not None else None,
            self.bias[:k] if self.bias is not None else None,
            use_batch,
            momentum,
            self.eps,
        )

    def infer(self, shape: Shape) -> Shape:
        return shape

    def build(self) -> nn.BatchNorm2d:
        k = self.feature.active.num_features
        bn = nn.BatchNorm2d(k, self.eps, self.momentum, self.affine, self.track_running_stats)
        with torch.no_grad():
            for name in ("weight", "bias", "running_mean", "running_var"):
                src = getattr(self, name)
                if src is not None:
                    getattr(bn, name).copy_(src[:k])
            if self.num_batches_tracked is not None:
                bn.num_batches_tracked.copy_(self.num_batches_tracked)
        return bn


@dataclass(frozen=True)
class LinearSpec:
    in_features: int
    out_features: int


@register(nn.Linear)
class DynLinear(Operator, nn.Linear):
    """Linear with sliceable input and output features."""

    group_fields = ("in_features", "out_features")

    def _meta_spec(self) -> LinearSpec:
        return LinearSpec(self.in_features, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        if a == self.feature.meta:
            return F.linear(x, self.weight, self.bias)
        b = self.bias[: a.out_features] if self.bias is not None else None
        return F.linear(x, self.weight[: a.out_features, : a.in_features], b)

    def infer(self, shape: Shape) -> Shape:
        return (*shape[:-1], self.feature.active.out_features)

    def build(self) -> nn.Linear:
        a = self.feature.active
        lin = nn.Linear(a.in_features, a.out_features, self.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(self.weight[: a.out_features, : a.in_features])
            if self.bias is not None:
                lin.bias.copy_(self.bias[: a.out_features])
        return lin


@register(nn.LayerNorm)
class DynLayerNorm(Operator, nn.LayerNorm):
    """LayerNorm over the last dimension, normalising its first ``num_features`` entries."""

    group_fields = ("num_features", "num_features")

    def _meta_spec(self) -> NormSpec:
        return NormSpec(self.normalized_shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.feature.active.num_features
        w = self.weight[:k] if self.weight is not None else None
        b = self.bias[:k] if self.bias is not None else None
        return F.layer_norm(x, (k,), w, b, self.eps)

    def infer(self, shape: Shape) -> Shape:
        return shape

    def build(self) -> nn.LayerNorm:
        k = self.feature.active.num_features
        ln = nn.LayerNorm((k,), self.eps, self.elementwise_affine, bias=self.bias is not None)
        with torch.no_grad():
            if self.weight is not None:
                ln.weight.copy_(self.weight[:k])
            if self.bias is not None:
                ln.bias.copy_(self.bias[:k])
        return ln


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
        self.in_group = None
        self.out_group = None
        self.feature = Feature.of(ParamSpec(value.shape[axis]))

    def forward(self) -> torch.Tensor:
        return self.value.narrow(self.axis, 0, self.feature.active.size)

    def infer(self, shape: Shape = ()) -> Shape:
        s = list(self.value.shape)
        s[self.axis] = self.feature.active.size
        return tuple(s)

    def build(self) -> torch.Tensor:  # a tensor, not a module: extraction emits a get_attr
        return self.forward().detach().clone()
