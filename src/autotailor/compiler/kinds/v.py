"""The ``v`` kind: how many features each head's values keep (ElasticViT's value scale; LeViT's
values are wider than its keys).

An attention (``HeadAttention``, ``ir/ops/attention.py``) gets one variable, ``blockN.v_dim``,
where its values come from a plain Linear projection (or LeViT's Linear + BatchNorm over tokens)
that feeds only it, and its merged heads reach one Linear alone (its output projection, through
activations or dropout at most). ``var.block_vars.TEMPLATE.v_ratio`` gives the choices as ratios
of the model's value width per head. The value projection keeps the first ``v_dim`` v rows of
every head (``DynHeadProjection``), the output projection the columns that read them
(``DynHeadInput``); each head's value features were ordered by importance when the attention was
recognised, so the first ``v_dim`` are the best.
"""

from __future__ import annotations

import torch.fx as fx

from autotailor.compiler.kinds.heads import AttentionKind, lift_projections, projection_fixed, projections
from autotailor.compiler.variables import Binding, PlanContext, register_kind
from autotailor.ir.ops.attention import HeadAttention
from autotailor.ir.ops.attention_pattern import output_projection
from autotailor.ir.ops.head_projections import DynHeadInput


@register_kind
class VDim(AttentionKind):
    name = "v"
    settings = {"block_vars": "v_ratio"}
    field = suffix = "v_dim"
    what = "value width per head"

    def fixed(self, ctx: PlanContext, node: fx.Node, core: HeadAttention) -> str | None:
        if output_projection(ctx.gm, node) is None:
            return "its merged heads do not reach one Linear alone"
        why = next((w for p, _ in projections(node, core, {"v"}) if (w := projection_fixed(ctx, p))), None)
        return why or next((g.fixed for g in ctx.groups if g.split_by == node.name and g.fixed), None)

    def bind(self, ctx: PlanContext, node: fx.Node, core: HeadAttention, name: str) -> None:
        lift_projections(ctx, node, core, {"v"}, "v_dim", name)
        out = output_projection(ctx.gm, node)
        ctx.lifts[out.name] = DynHeadInput.lifted(core, ("v",))
        ctx.bindings.append(Binding(out.name, "v_dim", name))
