"""Normalisations: ``nn.BatchNorm2d``, ``nn.BatchNorm1d`` and ``nn.LayerNorm`` slice their per-channel tensors;
other norms are known for their structure and shape only, and fix their channels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.handlers import Default, Member, OpHandler, Shape, Track, register
from autotailor.ir.ops.linear import on_last_axis
from autotailor.ir.operators import Operator


@dataclass(frozen=True)
class NormSpec:
    num_features: int


class _SlicedBatchNorm(Operator):
    """A BatchNorm (``_layer``) over the first ``num_features`` channels; running statistics are
    shared slices."""

    group_fields = ("num_features", "num_features")
    _layer: type[nn.modules.batchnorm._BatchNorm]

    def _meta_spec(self) -> NormSpec:
        return NormSpec(self.num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.feature.active.num_features
        if k == self.num_features:
            return self._layer.forward(self, x)
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

    def build(self) -> nn.modules.batchnorm._BatchNorm:
        k = self.feature.active.num_features
        bn = self._layer(k, self.eps, self.momentum, self.affine, self.track_running_stats)
        with torch.no_grad():
            for name in ("weight", "bias", "running_mean", "running_var"):
                src = getattr(self, name)
                if src is not None:
                    getattr(bn, name).copy_(src[:k])
            if self.num_batches_tracked is not None:
                bn.num_batches_tracked.copy_(self.num_batches_tracked)
        return bn


class DynBatchNorm2d(_SlicedBatchNorm, nn.BatchNorm2d):
    _layer = nn.BatchNorm2d


class DynBatchNorm1d(_SlicedBatchNorm, nn.BatchNorm1d):
    """On (N, C) or (N, C, L): LeViT's Linear + BatchNorm over tokens."""

    _layer = nn.BatchNorm1d


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


class _PerChannel(OpHandler):
    """A norm with one value per channel in each of its tensors, all sliced alike."""

    same_shape = True
    kind_name = ""

    def importance(self, module: nn.Module, role: str) -> list[tuple[torch.Tensor, int]]:
        out = []
        for name in ("weight", "bias", "running_mean", "running_var"):
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor) and t.dim() >= 1:
                out.append((t, 0))
        return out

    def structure(self, module: nn.Module) -> str:
        return "norm"

    def kind(self, module: nn.Module | None, target: object = None) -> str:
        return self.kind_name

    def describe(self, module: nn.Module) -> str:
        return ""

    def facts(self, module: nn.Module) -> dict[str, Any]:
        return {}


@register(nn.BatchNorm2d)
class BatchNorm2dHandler(_PerChannel):
    dynamic = DynBatchNorm2d
    role = "batchnorm"
    kind_name = "batchnorm2d"

    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        if t.axis != 1:
            a.fix(t.gid, f"{node.name} normalises axis 1 but the channels are on axis {t.axis}")
            return None
        a.add_member(t.gid, Member(node.name, "inout"))
        return t

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        return 0, 2 * out[1]


@register(nn.BatchNorm1d)
class BatchNorm1dHandler(BatchNorm2dHandler):
    dynamic = DynBatchNorm1d
    kind_name = "batchnorm1d"


@register(nn.LayerNorm)
class LayerNormHandler(_PerChannel):
    dynamic = DynLayerNorm
    role = "layernorm"
    kind_name = "layernorm"

    def channels(self, a, node: fx.Node) -> Track | None:
        ln = a.module(node)
        t = a.track(node.args[0])
        if t is None:
            return None
        if len(ln.normalized_shape) == 1 and on_last_axis(node, t):
            a.add_member(t.gid, Member(node.name, "inout"))
            return t
        a.fix(t.gid, f"{node.name} normalises more than the channel axis")
        return None

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        return 0, 2 * out[-1]


@register(nn.modules.batchnorm._BatchNorm, nn.GroupNorm)
class OtherNorm(Default):
    """Norms without a dynamic version (BatchNorm3d, GroupNorm): they fix their channels and
    count their own parameters; their output has their input's shape. GroupNorm closes a dense
    layer as BatchNorm2d does (block parsing)."""

    same_shape = True

    def structure(self, module: nn.Module) -> str:
        return "norm" if isinstance(module, nn.GroupNorm) else "other"
