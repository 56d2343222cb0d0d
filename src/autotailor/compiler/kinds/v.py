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

import logging

import torch.fx as fx

from autotailor.compiler.kinds.heads import add_block_variable, attentions, lift_projections, projection_fixed, \
    projections
from autotailor.compiler.variables import Binding, PlanContext, RatioKind, register_kind
from autotailor.ir.ops.attention import DynHeadInput, HeadAttention, output_projection

log = logging.getLogger(__name__)


@register_kind
class VDim(RatioKind):
    name = "v"
    settings = {"block_vars": "v_ratio"}

    def plan(self, ctx: PlanContext) -> None:
        for node, core in attentions(ctx):
            out = output_projection(ctx.gm, node)
            why = _why_fixed(ctx, node, core, out)
            if why is not None:
                log.info("%s keeps its value width of %d per head: %s", node.name, core.v_dim, why)
                continue
            name = add_block_variable(ctx, node, self.name, "v_ratio", core.v_dim, "v_dim")
            if name is None:
                continue
            ctx.bindings.append(Binding(node.name, "v_dim", name))
            lift_projections(ctx, node, core, {"v"}, "v_dim", name)
            ctx.lifts[out.name] = DynHeadInput.lifted(core, ("v",))
            ctx.bindings.append(Binding(out.name, "v_dim", name))


def _why_fixed(ctx: PlanContext, node: fx.Node, core: HeadAttention, out: fx.Node | None) -> str | None:
    """Why the value width of the attention at ``node`` cannot vary, or None if it can."""
    if out is None:
        return "its merged heads do not reach one Linear alone"
    why = next((w for p, _ in projections(ctx, node, core, {"v"}) if (w := projection_fixed(ctx, p))), None)
    return why or next((g.fixed for g in ctx.groups if g.split_by == node.name and g.fixed), None)
