"""Layers on an attention's heads: projections (and their BatchNorms) whose rows are head-major
q/k/v pieces, and the output projection's input columns per head. Keeping the first heads and
the first q/k or value features of each is a pattern of rows, not one leading slice; these
operators hold that pattern for the ``heads``, ``qk`` and ``v`` variable kinds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.handlers import Shape
from autotailor.ir.operators import Operator
from autotailor.ir.ops.attention import HeadAttention, head_widths
from autotailor.ir.ops.linear import DynLinear
from autotailor.ir.ops.norm import DynBatchNorm1d


@dataclass(frozen=True)
class HeadProjectionSpec:
    in_features: int
    out_features: int  # heads kept times the model's rows per head (the heads variable's unit)
    qk_dim: int
    v_dim: int


@dataclass(frozen=True)
class HeadNormSpec:
    num_features: int  # as ``HeadProjectionSpec.out_features``
    qk_dim: int
    v_dim: int


@dataclass(frozen=True)
class HeadInputSpec:
    in_features: int  # heads kept times the model's value width (the heads variable's unit)
    out_features: int
    v_dim: int


class _HeadRows:
    """Rows (or columns) of a layer on an attention's heads, head-major: each head's are ``roles``
    (q, k, v of a fused projection; one of them otherwise), ``pieces`` wide in the model; q and k
    keep their first ``qk_dim``, v its first ``v_dim``. Heads and widths are all leading within
    their axis, so what is kept is a pattern rather than one slice."""

    pieces: tuple[int, ...]
    roles: tuple[str, ...]

    @classmethod
    def lifted(cls, core: HeadAttention, roles: tuple[str, ...]) -> Callable[[nn.Module], Operator]:
        """What lifts the layer into this operator (``PlanContext.lifts``): its rows per head are
        ``roles`` of ``core``'s heads."""
        widths = head_widths(core)
        return lambda module: cls.from_module(module, pieces=tuple(widths[r] for r in roles), roles=tuple(roles))

    def _meta(self, *roles: str) -> int:
        """The model's width of the first piece of ``roles`` (0 if there is none)."""
        return next((p for p, r in zip(self.pieces, self.roles) if r in roles), 0)

    def _widths(self, a: Any) -> list[int]:
        return [a.v_dim if r == "v" else a.qk_dim for r in self.roles]

    def _kept(self, total: int, a: Any) -> torch.Tensor:
        """Indices of what is kept of the first ``total`` (whole heads) at the active widths ``a``."""
        within = torch.cat([torch.arange(start, start + w) for start, w in
                            zip(itertools.accumulate((0, *self.pieces)), self._widths(a))])
        block = sum(self.pieces)
        return (torch.arange(total // block)[:, None] * block + within).flatten()

    def _per_head(self, a: Any) -> int:
        return sum(self._widths(a))


class DynHeadProjection(_HeadRows, DynLinear):
    """The Linear that projects tokens into an attention's heads (``_HeadRows``: its rows)."""

    def _meta_spec(self) -> HeadProjectionSpec:
        return HeadProjectionSpec(self.in_features, self.out_features, self._meta("q", "k"), self._meta("v"))

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        return t.index_select(0, self._kept(a.out_features, a).to(t.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        if a == self.feature.meta:
            return F.linear(x, self.weight, self.bias)
        bias = self._rows(self.bias) if self.bias is not None else None
        return F.linear(x, self._rows(self.weight[:, : a.in_features]), bias)

    def infer(self, shape: Shape) -> Shape:
        a = self.feature.active
        return (*shape[:-1], a.out_features // sum(self.pieces) * self._per_head(a))

    def build(self) -> nn.Linear:
        a = self.feature.active
        weight = self._rows(self.weight[:, : a.in_features])
        lin = nn.Linear(a.in_features, weight.shape[0], self.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(weight)
            if self.bias is not None:
                lin.bias.copy_(self._rows(self.bias))
        return lin


class DynHeadBatchNorm1d(_HeadRows, DynBatchNorm1d):
    """The BatchNorm after a ``DynHeadProjection`` (LeViT's Linear + BatchNorm over tokens): its
    per-channel tensors keep the projection's rows."""

    def _meta_spec(self) -> HeadNormSpec:
        return HeadNormSpec(self.num_features, self._meta("q", "k"), self._meta("v"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        if a == self.feature.meta:
            return nn.BatchNorm1d.forward(self, x)
        rows = self._kept(a.num_features, a).to(x.device)
        mean, var = self.running_mean[rows], self.running_var[rows]
        use_batch = self.training
        if use_batch and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        y = F.batch_norm(x, mean, var, self.weight[rows], self.bias[rows], use_batch, momentum, self.eps)
        if use_batch:  # the statistics were updated on copies: write them back to the rows kept
            with torch.no_grad():
                self.running_mean[rows] = mean
                self.running_var[rows] = var
        return y

    def build(self) -> nn.BatchNorm1d:
        a = self.feature.active
        rows = self._kept(a.num_features, a)
        bn = nn.BatchNorm1d(len(rows), self.eps, self.momentum)
        with torch.no_grad():
            for name in ("weight", "bias", "running_mean", "running_var"):
                getattr(bn, name).copy_(getattr(self, name)[rows])
            bn.num_batches_tracked.copy_(self.num_batches_tracked)
        return bn


class DynHeadInput(_HeadRows, DynLinear):
    """The Linear that reads an attention's merged heads (its output projection): its input columns
    keep the first ``v_dim`` value features of each head kept (``_HeadRows``: its columns)."""

    def _meta_spec(self) -> HeadInputSpec:
        return HeadInputSpec(self.in_features, self.out_features, self._meta("v"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        if a == self.feature.meta:
            return F.linear(x, self.weight, self.bias)
        cols = self._kept(a.in_features, a).to(x.device)
        b = self.bias[: a.out_features] if self.bias is not None else None
        return F.linear(x, self.weight[: a.out_features].index_select(1, cols), b)

    def build(self) -> nn.Linear:
        a = self.feature.active
        cols = self._kept(a.in_features, a)
        lin = nn.Linear(len(cols), a.out_features, self.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(self.weight[: a.out_features].index_select(1, cols))
            if self.bias is not None:
                lin.bias.copy_(self.bias[: a.out_features])
        return lin
