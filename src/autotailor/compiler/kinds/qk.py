"""The ``qk`` kind: how many features each head's queries and keys keep (AutoFormer's q-k
dimension).

An attention (``HeadAttention``, ``ir/ops/attention.py``) gets one variable, ``blockN.qk_dim``,
where its queries and keys come from plain Linear projections (or LeViT's Linear + BatchNorm over
tokens) that feed only it and carry no per-head norm (a LayerNorm over a head's features would
normalise over the features left). ``var.block_vars.TEMPLATE.qk_ratio`` gives the choices as
ratios of the model's width per head. Each projection becomes a ``DynHeadProjection`` that keeps
the first ``qk_dim`` q and k rows of every head (its BatchNorm a ``DynHeadBatchNorm1d`` keeping the
same channels); the scores keep the model's scale, so the largest SubNet is the model and a
smaller width is a truncated dot product.
"""

from __future__ import annotations

import logging

import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.kinds.heads import add_block_variable, attentions, lift_projections, projection_fixed, \
    projections
from autotailor.compiler.variables import Binding, PlanContext, RatioKind, register_kind
from autotailor.ir.ops.attention import HeadAttention

log = logging.getLogger(__name__)


@register_kind
class QkDim(RatioKind):
    name = "qk"
    settings = {"block_vars": "qk_ratio"}

    def plan(self, ctx: PlanContext) -> None:
        for node, core in attentions(ctx):
            why = _why_fixed(ctx, node, core)
            if why is not None:
                log.info("%s keeps its q/k width of %d per head: %s", node.name, core.head_dim, why)
                continue
            name = add_block_variable(ctx, node, self.name, "qk_ratio", core.head_dim, "qk_dim")
            if name is None:
                continue
            ctx.bindings.append(Binding(node.name, "head_dim", name))
            lift_projections(ctx, node, core, {"q", "k"}, "qk_dim", name)


def _why_fixed(ctx: PlanContext, node: fx.Node, core: HeadAttention) -> str | None:
    """Why the q/k width of the attention at ``node`` cannot vary, or None if it can."""
    if not isinstance(core.q_norm, nn.Identity) or not isinstance(core.k_norm, nn.Identity):
        return "its queries and keys are normalised per head"
    why = next((w for p, _ in projections(ctx, node, core, {"q", "k"}) if (w := projection_fixed(ctx, p))), None)
    return why or next((g.fixed for g in ctx.groups if g.split_by == node.name and g.fixed), None)
