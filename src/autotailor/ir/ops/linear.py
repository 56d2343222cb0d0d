"""``nn.Linear``: sliceable input and output features, on the last axis."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.graph import node_shape
from autotailor.ir.handlers import Member, OpHandler, Shape, Track, register, weight_importance
from autotailor.ir.operators import Operator


@dataclass(frozen=True)
class LinearSpec:
    in_features: int
    out_features: int


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


def on_last_axis(node: fx.Node, t: Track) -> bool:
    """Whether the channels ``t`` of ``node``'s first input are its last axis."""
    shape = node_shape(node.args[0])
    return shape is not None and t.axis == len(shape) - 1


@register(nn.Linear)
class LinearHandler(OpHandler):
    dynamic = DynLinear
    role = "linear"
    same_shape = False

    def channels(self, a, node: fx.Node) -> Track | None:
        lin = a.module(node)
        t = a.track(node.args[0])
        if t is not None:
            if on_last_axis(node, t):
                a.add_member(t.gid, Member(node.name, "in"))
            else:
                a.fix(t.gid, f"{node.name} reads features from an axis other than the channels")
        shape = node_shape(node)
        out = a.new_group(lin.out_features)
        a.add_member(out, Member(node.name, "out"))
        return Track(len(shape) - 1, out)

    importance = staticmethod(weight_importance)

    def structure(self, module: nn.Linear) -> str:
        return "dense"

    def kind(self, module: nn.Module | None, target: object = None) -> str:
        return "linear"

    def describe(self, module: nn.Linear) -> str:
        return f"b{module.bias is not None}"

    def facts(self, module: nn.Linear) -> dict[str, Any]:
        return {"bias": module.bias is not None}

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        return math.prod(out) * ins[0][-1], out[-1] * ins[0][-1] + (out[-1] if facts["bias"] else 0)
