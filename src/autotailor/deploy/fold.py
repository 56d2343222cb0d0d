"""Deploy-time folding of layers that a runtime would otherwise run one by one."""

from __future__ import annotations

import copy

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.ir.ops.attention_pattern import linear_norm


def fold_linear_norms(net: nn.Module) -> nn.Module:
    """``net`` with each Linear + BatchNorm over tokens (LeViT's ``bn(y.flatten(0, 1)).reshape_as(y)``
    after ``y = linear(x)``) folded into one Linear, as inference computes it; ``net`` itself
    when it has none (else a copy: ``net`` is untouched). Exporters keep the flatten, the
    BatchNorm and the reshape as separate operators (ONNX Runtime runs them one by one, NCNN
    cannot fold them either), which made LeViT's SubNets slower than their layers."""
    if not any(_units(gm) for gm in _graphs(net)):
        return net
    net = copy.deepcopy(net)
    for gm in _graphs(net):
        units = _units(gm)
        for lin_node, bn_node, out in units:
            lin, bn = gm.get_submodule(lin_node.target), gm.get_submodule(bn_node.target)
            gm.set_submodule(lin_node.target, _folded(lin, bn))
            flat = bn_node.args[0]
            out.replace_all_uses_with(lin_node)
            for node in (out, bn_node, flat):
                gm.graph.erase_node(node)
        if units:
            gm.graph.lint()
            gm.delete_all_unused_submodules()
            gm.recompile()
    return net


def _graphs(net: nn.Module) -> list[fx.GraphModule]:
    return [m for m in net.modules() if isinstance(m, fx.GraphModule)]


def _units(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node, fx.Node]]:
    """(Linear, BatchNorm, reshape_as) nodes of each foldable unit: plain layers (an extracted
    SubNet's or a kernel's) whose intermediate results nothing else reads."""
    calls: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            calls[n.target] = calls.get(n.target, 0) + 1
    units = []
    for node in gm.graph.nodes:
        pair = linear_norm(gm, node)
        if pair is None:
            continue
        lin_node, bn_node = pair
        lin, bn, flat = gm.get_submodule(lin_node.target), gm.get_submodule(bn_node.target), bn_node.args[0]
        plain = type(lin) is nn.Linear and type(bn) is nn.BatchNorm1d and bn.track_running_stats
        alone = set(lin_node.users) == {flat, node} and set(flat.users) == {bn_node} and \
            set(bn_node.users) == {node} and calls[lin_node.target] == 1 and calls[bn_node.target] == 1
        if plain and alone:
            units.append((lin_node, bn_node, node))
    return units


def _folded(lin: nn.Linear, bn: nn.BatchNorm1d) -> nn.Linear:
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight
    bias = lin.bias if lin.bias is not None else torch.zeros_like(bn.running_mean)
    shift = bn.bias if bn.bias is not None else torch.zeros_like(bn.running_mean)
    folded = nn.Linear(lin.in_features, lin.out_features, bias=True)
    with torch.no_grad():
        folded.weight.copy_(lin.weight * scale[:, None])
        folded.bias.copy_((bias - bn.running_mean) * scale + shift)
    return folded
