"""The ``embedding`` kind: the width of a transformer's residual stream.

The channel group that runs through a transformer's attention blocks, normalised (LayerNorm, or
LeViT's BatchNorm over tokens) and read by their projections (patch embedding, class
and position tokens, every norm and residual add, the q/k/v projections' inputs, the output
and MLP projections' outputs, the head's input) gets ``embed_ratio`` instead of a width: one
variable for the network (``var.global_vars.embed_ratio``) or, for a hierarchical model whose
stages have their own streams, one per stage (``var.stage_vars.embed_ratio``). It plans
before ``width``, which would otherwise take the same group as a plain width.
"""

from __future__ import annotations

from autotailor.compiler.variables import PlanContext, RatioKind, bind_width, register_kind
from autotailor.ir.handlers import for_module


@register_kind(before="width")
class Embedding(RatioKind):
    name = "embedding"
    settings = {"global_vars": "embed_ratio", "stage_vars": "embed_ratio"}

    def plan(self, ctx: PlanContext) -> None:
        attention = {b.index for b in ctx.structure.blocks if b.template == "AttentionBlock"}
        for group in ctx.groups:
            if not group.variable or ctx.claimed(group):
                continue
            layers = [for_module(ctx.gm.get_submodule(ctx.nodes[m.node].target)) if ctx.nodes[m.node].op ==
                      "call_module" else None for m in group.members]
            readers = [m for m, h in zip(group.members, layers) if m.role == "in" and h is not None and h.role == "linear"]
            normed = any(m.role == "inout" and h is not None and h.role in ("layernorm", "batchnorm")
                         for m, h in zip(group.members, layers))
            if not normed or not ctx.blocks_of([m.node for m in readers]) & attention:
                continue  # the stream is normalised; an MLP's hidden width is not
            own = {ctx.structure.blocks[b].stage
                   for b in ctx.blocks_of([m.node for m in group.members if m.role != "in"])}
            scope, name = ("stage_vars", f"stage{own.pop()}.embed_ratio") if len(own) == 1 else \
                ("global_vars", "embed_ratio")
            bind_width(ctx, group, self.name, name, ctx.config.choices(scope, "embed_ratio"), None)
