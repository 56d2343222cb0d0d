"""The ``heads`` kind: how many heads of a multi-head attention are kept.

Each ``HeadAttention`` operator (``ir/ops/attention.py``) whose projections feed only it and
whose output feeds only linear layers gets one variable, ``blockN.num_heads``, choosing a head
count (``var.block_vars.TEMPLATE.heads_ratio`` gives the counts as ratios of the model's). It
slices whole heads: the rows of the q/k/v projections, the columns of the output projection
and the operator's head count, after the heads were reordered by importance (one order for
all of them), so the first ``h`` heads are the best ``h``.

It also holds what the attention kinds share (``qk``, ``v``): ``AttentionKind``, one variable
per attention, and the projections whose rows they slice within heads.
"""

from __future__ import annotations

import logging
from typing import Iterator

import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.variables import Binding, PlanContext, RatioKind, Variable, register_kind
from autotailor.ir.handlers import for_module
from autotailor.ir.ops.attention import HeadAttention
from autotailor.ir.ops.attention_pattern import linear_norm
from autotailor.ir.ops.head_projections import DynHeadBatchNorm1d, DynHeadProjection

log = logging.getLogger(__name__)


class AttentionKind(RatioKind):
    """A kind with one variable per attention, ``blockN.SUFFIX``, whose choices are ratios (under
    ``settings``' key) of a size of the attention's; ``fixed`` says why an attention gets none,
    ``bind`` ties the variable to the operators it sets besides the attention."""

    field: str  # the attention operator's feature field the variable sets
    suffix: str  # the variable's name in its block
    what: str  # what the size is, for the log

    def size(self, core: HeadAttention) -> int:
        return getattr(core, self.field)

    def fixed(self, ctx: PlanContext, node: fx.Node, core: HeadAttention) -> str | None:
        raise NotImplementedError

    def bind(self, ctx: PlanContext, node: fx.Node, core: HeadAttention, name: str) -> None:
        raise NotImplementedError

    def plan(self, ctx: PlanContext) -> None:
        for node, core in attentions(ctx):
            why = self.fixed(ctx, node, core)
            if why is not None:
                log.info("%s keeps its %s of %d: %s", node.name, self.what, self.size(core), why)
                continue
            name = add_block_variable(ctx, node, self.name, self.settings["block_vars"], self.size(core), self.suffix)
            if name is not None:
                ctx.bindings.append(Binding(node.name, self.field, name))
                self.bind(ctx, node, core, name)


@register_kind
class Heads(AttentionKind):
    name = "heads"
    settings = {"block_vars": "heads_ratio"}
    field = suffix = "num_heads"
    what = "heads"

    def _members(self, ctx: PlanContext, node: fx.Node) -> tuple[tuple, list]:
        groups = tuple(g for g in ctx.groups if g.split_by == node.name)
        # Per-head tables (roles "param", "table") are reordered with the heads, not sliced.
        return groups, [(g, m) for g in groups for m in g.members
                        if m.node != node.name and m.role not in ("param", "table")]

    def fixed(self, ctx: PlanContext, node: fx.Node, core: HeadAttention) -> str | None:
        groups, members = self._members(ctx, node)
        return next((g.fixed for g in groups if g.fixed), None) or next(
            (f"{m.node} cannot be sliced" for _, m in members if ctx.nodes[m.node].op != "call_module"
             or for_module(ctx.gm.get_submodule(ctx.nodes[m.node].target)).dynamic is None), None)

    def bind(self, ctx: PlanContext, node: fx.Node, core: HeadAttention, name: str) -> None:
        groups, members = self._members(ctx, node)
        ctx.reorder.append(groups)
        for g, m in members:
            in_field, out_field = for_module(ctx.gm.get_submodule(ctx.nodes[m.node].target)).dynamic.group_fields
            fields = {in_field} if m.role == "in" else {out_field} if m.role == "out" else {in_field, out_field}
            ctx.bindings += [Binding(m.node, f, name, unit=g.granularity) for f in sorted(fields)]


def attentions(ctx: PlanContext) -> Iterator[tuple[fx.Node, HeadAttention]]:
    """The graph's attention operators: (node, its ``HeadAttention``)."""
    for node in ctx.gm.graph.nodes:
        core = ctx.gm.get_submodule(node.target) if node.op == "call_module" else None
        if isinstance(core, HeadAttention):
            yield node, core


def add_block_variable(ctx: PlanContext, node: fx.Node, kind: str, key: str, size: int, field: str) -> str | None:
    """A variable ``blockN.field`` of ``kind`` for the attention at ``node``: counts out of ``size``
    from its block template's ratios under ``key`` (1.0 always among them). Its name, or None
    when the ratios leave a single count."""
    (b,) = ctx.blocks_of([node.name]) or (None,)
    template = ctx.structure.blocks[b].template if b is not None else ""
    ratios = ctx.config.block_choices(template, key) if template else (1.0,)
    counts = tuple(sorted({max(1, round(r * size)) for r in ratios} | {size}))
    if len(counts) < 2:
        return None
    name = ctx.name_for(f"block{b}.{field}")
    ctx.variables.append(Variable(name, kind, counts, (node.name,),
                                  block=ctx.droppable_block(b) if b is not None else None))
    return name


def projections(node: fx.Node, core: HeadAttention, roles: set[str]) -> list[tuple[fx.Node, tuple[str, ...]]]:
    """The projections of the attention at ``node`` whose rows hold one of ``roles`` ("q", "k",
    "v"): (the node the attention reads, the roles of its rows per head)."""
    sources = [a for a in node.args if isinstance(a, fx.Node)]
    return [(p, held) for p, held in zip(sources, core.inputs()) if roles & set(held)]


def projection_fixed(ctx: PlanContext, p: fx.Node) -> str | None:
    """Why the rows of projection ``p`` cannot be sliced within heads, or None: it must be a plain
    Linear (or LeViT's Linear + BatchNorm over tokens) that feeds only the attention."""
    pair = linear_norm(ctx.gm, p)
    types = [type(ctx.gm.get_submodule(n.target)) if n.op == "call_module" else None for n in pair or (p,)]
    if types != ([nn.Linear, nn.BatchNorm1d] if pair else [nn.Linear]):
        return f"{p.name} is not a plain Linear" + (" and BatchNorm" if pair else "")
    if len(p.users) != 1 or (pair and (set(pair[0].users) != {pair[1].args[0], p} or len(pair[1].users) != 1)):
        return f"{p.name} feeds more than the attention"
    return None


def lift_projections(ctx: PlanContext, node: fx.Node, core: HeadAttention, roles: set[str], field: str,
                     name: str) -> None:
    """Make each projection holding ``roles`` a ``DynHeadProjection`` (LeViT's BatchNorm after it a
    ``DynHeadBatchNorm1d``) whose ``field`` reads variable ``name``. The qk and v kinds lift the
    same projection alike, each binding its own field."""
    for p, held in projections(node, core, roles):
        pair = linear_norm(ctx.gm, p)
        for layer, dynamic in zip(pair or (p,), (DynHeadProjection, DynHeadBatchNorm1d)):
            ctx.lifts[layer.name] = dynamic.lifted(core, held)
            ctx.bindings.append(Binding(layer.name, field, name))
