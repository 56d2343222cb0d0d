"""The ``qk`` kind: how many features each head's queries and keys keep (AutoFormer's q-k
dimension), the values' width unchanged.

An attention (``HeadAttention``, ``ir/ops/attention.py``) gets one variable,
``blockN.qk_dim``, where its queries and keys come from plain Linear projections (or LeViT's
Linear + BatchNorm over tokens) that feed only it and carry no per-head norm (a LayerNorm over a
head's features would normalise over the features left). ``var.block_vars.TEMPLATE.qk_ratio`` gives the choices as ratios of the model's
width per head. Each projection becomes a ``DynHeadProjection`` that keeps the first ``qk_dim``
q and k rows of every head (its BatchNorm a ``DynHeadBatchNorm1d`` keeping the same channels); the scores keep the model's scale, so the largest SubNet is the
model and a smaller width is a truncated dot product.
"""

from __future__ import annotations

import logging

import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.kinds.heads import add_block_variable, attentions
from autotailor.compiler.variables import Binding, PlanContext, RatioKind, register_kind
from autotailor.ir.ops.attention import DynHeadBatchNorm1d, DynHeadProjection, HeadAttention, linear_norm

log = logging.getLogger(__name__)


@register_kind
class QkDim(RatioKind):
    name = "qk"
    settings = {"block_vars": "qk_ratio"}

    def plan(self, ctx: PlanContext) -> None:
        for node, core in attentions(ctx):
            sources = [a for a in node.args if isinstance(a, fx.Node)]
            projections = sources[:len(core.inputs())][:2]  # those that hold queries or keys
            why = _why_fixed(ctx, node, core, projections)
            if why is not None:
                log.info("%s keeps its q/k width of %d per head: %s", node.name, core.head_dim, why)
                continue
            name = add_block_variable(ctx, node, self.name, "qk_ratio", core.head_dim, "qk_dim")
            if name is None:
                continue
            ctx.bindings.append(Binding(node.name, "head_dim", name))
            for p, (pieces, shrinks) in zip(projections, core.inputs()):
                pair = linear_norm(ctx.gm, p)
                for layer, lifted in zip(pair or (p,), (DynHeadProjection, DynHeadBatchNorm1d)):
                    ctx.lifts[layer.name] = lifted.lifted(pieces, shrinks)
                    ctx.bindings.append(Binding(layer.name, "qk_dim", name))


def _why_fixed(ctx: PlanContext, node: fx.Node, core: HeadAttention, projections: list[fx.Node]) -> str | None:
    """Why the q/k width of the attention at ``node`` cannot vary, or None if it can."""
    if not isinstance(core.q_norm, nn.Identity) or not isinstance(core.k_norm, nn.Identity):
        return "its queries and keys are normalised per head"
    for p in projections:
        pair = linear_norm(ctx.gm, p)
        layers = pair or (p,)
        if pair and (type(ctx.gm.get_submodule(pair[0].target)) is not nn.Linear
                     or type(ctx.gm.get_submodule(pair[1].target)) is not nn.BatchNorm1d
                     or set(pair[0].users) != {pair[1].args[0], p}):
            return f"{p.name} is not a plain Linear and BatchNorm feeding only the attention"
        if not pair and (p.op != "call_module" or type(ctx.gm.get_submodule(p.target)) is not nn.Linear):
            return f"{p.name} is not a plain Linear"
        if len(p.users) != 1 or len(layers[-1].users) != 1:
            return f"{p.name} feeds more than the attention"
    return next((g.fixed for g in ctx.groups if g.split_by == node.name and g.fixed), None)
