"""The ``qk`` kind: how many features each head's queries and keys keep (AutoFormer's q-k
dimension).

An attention (``HeadAttention``, ``ir/ops/attention.py``) gets one variable, ``blockN.qk_dim``,
where its queries and keys come from plain Linear projections (or LeViT's Linear + BatchNorm over
tokens) that feed only it and carry no per-head norm (a LayerNorm over a head's features would
normalise over the features left). ``var.block_vars.TEMPLATE.qk_ratio`` gives the choices as
ratios of the model's width per head. Each projection becomes a ``DynHeadProjection`` that keeps
the first ``qk_dim`` q and k rows of every head (its BatchNorm a ``DynHeadBatchNorm1d`` keeping
the same channels); the scores keep the model's scale, so the largest SubNet is the model and a
smaller width is a truncated dot product.
"""

from __future__ import annotations

import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.kinds.heads import AttentionKind, lift_projections, projection_fixed, projections
from autotailor.compiler.variables import PlanContext, register_kind
from autotailor.ir.ops.attention import HeadAttention, L2Norm


@register_kind
class QkDim(AttentionKind):
    name = "qk"
    settings = {"block_vars": "qk_ratio"}
    field, suffix, what = "head_dim", "qk_dim", "q/k width per head"

    def fixed(self, ctx: PlanContext, node: fx.Node, core: HeadAttention) -> str | None:
        if not isinstance(core.q_norm, (nn.Identity, L2Norm)) or not isinstance(core.k_norm, (nn.Identity, L2Norm)):
            return "its queries and keys are normalised per head"
        why = next((w for p, _ in projections(node, core, {"q", "k"}) if (w := projection_fixed(ctx, p))), None)
        return why or next((g.fixed for g in ctx.groups if g.split_by == node.name and g.fixed), None)

    def bind(self, ctx: PlanContext, node: fx.Node, core: HeadAttention, name: str) -> None:
        lift_projections(ctx, node, core, {"q", "k"}, "qk_dim", name)
