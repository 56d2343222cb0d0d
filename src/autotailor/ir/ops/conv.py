"""``nn.Conv2d``: dense, depthwise and grouped convolutions, sliceable in and out channels and
centre-cropped square kernels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.handlers import Member, OpHandler, Shape, Track, conv_macs_params, register, weight_importance
from autotailor.ir.operators import Operator


@dataclass(frozen=True)
class ConvSpec:
    in_channels: int
    out_channels: int
    kernel_size: int
    groups: int


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


@register(nn.Conv2d)
class Conv2dHandler(OpHandler):
    dynamic = DynConv2d
    role = "conv"
    same_shape = False

    def channels(self, a, node: fx.Node) -> Track | None:
        conv = a.module(node)
        t = a.track(node.args[0])
        if t is not None and t.axis != 1:
            a.fix(t.gid, f"{node.name} convolves a tensor whose channels are not on axis 1")
            t = None
        if conv.groups == 1:
            if t is not None:
                a.add_member(t.gid, Member(node.name, "in"))
            out = a.new_group(conv.out_channels)
            a.add_member(out, Member(node.name, "out"))
            return Track(1, out)
        if conv.in_channels == conv.out_channels and t is not None:
            # Depthwise / grouped: channel i (its conv group) maps to channel i; whole groups are kept.
            a.add_member(t.gid, Member(node.name, "inout"))
            g = a.group(t.gid)
            g.granularity = math.lcm(g.granularity, conv.in_channels // conv.groups)
            return t
        if t is not None:
            a.fix(t.gid, f"{node.name} is a grouped convolution that changes the channel count")
        return None

    importance = staticmethod(weight_importance)

    def structure(self, module: nn.Conv2d) -> str:
        return "dense" if module.groups == 1 else "dwconv"

    def kind(self, module: nn.Module | None, target: object = None) -> str:
        return "conv2d"

    def describe(self, module: nn.Conv2d) -> str:
        g = module.groups
        groups = "1" if g == 1 else ("dw" if g == module.in_channels else f"per{module.in_channels // g}")
        return (f"k{tuple(module.kernel_size)} s{tuple(module.stride)} p{module.padding} d{tuple(module.dilation)} "
                f"g{groups} b{module.bias is not None} {module.padding_mode}")

    def facts(self, module: nn.Conv2d) -> dict[str, Any]:
        return {"kernel": module.kernel_size[0], "bias": module.bias is not None,
                "per_group": module.in_channels // module.groups if module.groups > 1 else 0}

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        per_out = facts["per_group"] or ins[0][1]  # input channels each output channel reads
        return conv_macs_params(out, per_out, kernel or facts["kernel"], facts["bias"])
