"""Reorder the channels of a channel group by importance, so that "keep the first k" keeps the best.

The permutation is applied to every member of the group (producers' output rows, consumers'
input columns, norms, depthwise kernels, elementwise parameters), so the largest network
computes exactly what it computed before; only the order of its channels changes.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.channels import ChannelGroup
from autotailor.ir import handlers
from autotailor.ir.graph import get_attr
from autotailor.ir.handlers import Member


def _member_tensors(gm: fx.GraphModule, nodes: dict[str, fx.Node], m: Member) -> list[tuple[torch.Tensor, int]]:
    """(tensor, axis) pairs that index the group's channels for member ``m`` (its handler's ``importance``)."""
    node = nodes[m.node]
    if m.role == "param":
        return [(get_attr(gm, node.target), m.axis)]
    mod = gm.get_submodule(node.target)
    return handlers.for_module(mod).importance(mod, "out" if m.role == "table" else m.role)


def _chunk_scores(gm: fx.GraphModule, nodes: dict[str, fx.Node], group: ChannelGroup) -> torch.Tensor:
    """Each chunk's (``granularity`` channels') importance (see ``importance_order``)."""
    weighted = [m for m in group.members if _member_tensors(gm, nodes, m)]
    role = "out" if any(m.role == "out" for m in weighted) else "in"
    score = torch.zeros(group.size, dtype=torch.float64)
    for m in weighted:
        if m.role != role:
            continue
        w, axis = _member_tensors(gm, nodes, m)[0]
        s = torch.linalg.vector_norm(w.detach(), 1, dim=[d for d in range(w.dim()) if d != axis]).double()
        if role == "out":
            s = s * _bn_scale(gm, nodes[m.node])
        score += s / s.sum().clamp_min(1e-12)
    return score.reshape(-1, group.granularity).sum(1)


def importance_order(gm: fx.GraphModule, group: ChannelGroup | tuple[ChannelGroup, ...]) -> list[torch.Tensor]:
    """Channel order of each group, most important first.

    A channel's importance is the L1 norm of the weights that produce it, scaled by the
    BatchNorm that directly follows the producer (|gamma| / sqrt(var + eps)), summed over the
    group's producers after normalising each. Including the BatchNorm scale makes the order
    the same whether BatchNorm is a separate layer or folded into the convolution, as in an
    ONNX export, so a model and its export get the same SubNets. Groups without weighted
    producers (the output of attention) fall back to their consumers' weights. Channels move in
    chunks of the group's granularity; tied groups (a tuple: the projections into and out of
    the same heads) share one order of chunks, their scores summed.
    """
    groups = group if isinstance(group, tuple) else (group,)
    nodes = {n.name: n for n in gm.graph.nodes}
    scores = [_chunk_scores(gm, nodes, g) for g in groups]
    chunks = scores[0] if len(scores) == 1 else sum(c / c.sum().clamp_min(1e-12) for c in scores)
    order = torch.sort(chunks, descending=True, stable=True).indices
    return [(order[:, None] * g.granularity + torch.arange(g.granularity)[None, :]).reshape(-1) for g in groups]


def _bn_scale(gm: fx.GraphModule, producer: fx.Node) -> torch.Tensor | float:
    users = list(producer.users)
    if len(users) == 1 and users[0].op == "call_module":
        bn = gm.get_submodule(users[0].target)
        if isinstance(bn, nn.BatchNorm2d) and bn.running_var is not None:
            scale = (bn.running_var.detach().double() + bn.eps).rsqrt()
            if bn.weight is not None:
                scale = scale * bn.weight.detach().double().abs()
            return scale
    return 1.0


def reorder_channels(gm: fx.GraphModule, groups: list[ChannelGroup | tuple[ChannelGroup, ...]]) -> None:
    """Permute every member of every group (or tuple of tied groups) in place by its ``importance_order``.

    Orders are computed first (a channel's L1 norm does not depend on the order of the other
    axes), then each tensor is gathered once with all its permutations, so a convolution that
    both reads and writes a group, or reads one group and writes another, costs one copy.
    """
    nodes = {n.name: n for n in gm.graph.nodes}
    plans: dict[int, tuple[torch.Tensor, dict[int, torch.Tensor]]] = {}
    for entry in groups:
        for group, perm in zip(entry if isinstance(entry, tuple) else (entry,), importance_order(gm, entry)):
            if torch.equal(perm, torch.arange(group.size)):
                continue
            for m in group.members:
                for t, axis in _member_tensors(gm, nodes, m):
                    plans.setdefault(id(t), (t, {}))[1][axis] = perm
    with torch.no_grad():
        for t, perms in plans.values():
            index = [slice(None)] * t.dim()
            for axis, perm in perms.items():
                shape = [1] * len(perms)
                shape[sorted(perms).index(axis)] = -1
                index[axis] = perm.reshape(shape)
            if len(perms) > 1 and sorted(perms) != list(range(len(perms))):
                # Advanced indices on non-leading axes: fall back to one gather per axis.
                data = t.data
                for axis, perm in perms.items():
                    data = data.index_select(axis, perm)
            else:
                data = t.data[tuple(index)]
            t.data = data  # rebinding: the old storage may be the user's (see compile)
