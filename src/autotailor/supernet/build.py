"""``compile``: a user's model -> a SuperNet, through the compiler passes.

trace (or import ONNX) -> shape propagation -> channel groups -> blocks and stages ->
templates and variables (from the config) -> importance reordering -> operator lifting ->
outlining droppable blocks -> resolution check.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.channels import analyse_channels
from autotailor.compiler.config import TailorConfig, load_config
from autotailor.compiler.graph_utils import propagate_shapes
from autotailor.compiler.importance import reorder_channels
from autotailor.compiler.normalize import einsum_as_matmul, lift_functional_layers, loosen_reshapes
from autotailor.compiler.onnx_lowering import lower_onnx_modules
from autotailor.compiler.structure import BlockInfo, Structure, parse_structure
from autotailor.compiler.templates import match
from autotailor.compiler.variables import Binding, PlanContext, Variable, kinds
from autotailor.errors import GraphError, ModelLoadError
from autotailor.frontends import import_onnx, load_model, trace
from autotailor.ir import Block, DynParam, Operator, handlers
from autotailor.ir import lift as lift_operator
from autotailor.ir.graph import get_attr, node_shape, set_attr
from autotailor.supernet.space import Space, StageInfo
from autotailor.supernet.supernet import SuperNet

log = logging.getLogger(__name__)


def compile(  # noqa: A001 - the public name the API promises
    model: "nn.Module | str | Path",
    example_input: torch.Tensor | None = None,
    config: "str | Path | dict | TailorConfig | None" = None,
) -> SuperNet:
    """Compile ``model`` into a weight-sharing SuperNet.

    ``model`` is a ``torch.nn.Module``, a path to an ``.onnx`` file, or a model spec
    (``torchvision:NAME``, ``timm:NAME``, ``package.module:factory``). ``example_input`` is
    one input batch at the model's largest resolution (default: the ONNX input's shape, or
    1x3x224x224). ``config`` is a TOML path or string, a dict, or None for the defaults.
    The user's module is not modified.
    """
    started = time.perf_counter()
    cfg = load_config(config)
    example = _example(example_input)
    gm, source = _to_graph(model, example)
    training = model.training if isinstance(model, nn.Module) else False
    gm.eval()  # the passes run the graph's inference path (BatchNorm on running statistics)
    gm.graph.eliminate_dead_code()  # e.g. unused attention weights returned by a MultiheadAttention
    lower_onnx_modules(gm, example)
    lift_functional_layers(gm)
    einsum_as_matmul(gm)
    loosen_reshapes(gm)
    propagate_shapes(gm, example)
    if sum(rewrite(gm, example) for rewrite in handlers.rewrites()):
        propagate_shapes(gm, example)
    _check_classifier(gm)
    groups = analyse_channels(gm)
    structure = parse_structure(gm)
    plan = _plan(gm, groups, structure, cfg, example)
    reorder_channels(gm, plan.reorder)
    _lift(gm, plan)
    _outline(gm, plan)
    _unshare(gm, model)
    space = Space(plan.variables, plan.stages)
    # The SuperNet keeps the space's configuration; step tables ([tune], ...) live in the work directory.
    sn = SuperNet(gm, space, plan.block_templates, example_shape=tuple(example.shape),
                  config=dataclasses.replace(cfg, steps={}))
    sn.train(training)
    sn.compile_info = {
        "source": source,
        "seconds": time.perf_counter() - started,
        "blocks": [
            {"index": b.index, "template": b.template, "kind": b.kind, "stage": b.stage, "droppable": b.droppable,
             "nodes": len(b.nodes)}
            for b in structure.blocks
        ],
        "stages": structure.stages,
        "groups": {"total": len(groups), "variable": len(plan.reorder)},
    }
    log.info("compiled %s in %.2fs: %d variables, 10^%.1f SubNets", source, sn.compile_info["seconds"],
             len(space), space.log10_size)
    return sn


def _to_graph(model: "nn.Module | str | Path", example: torch.Tensor) -> tuple[fx.GraphModule, str]:
    if isinstance(model, (str, Path)):
        resolved = load_model(str(model))
        if isinstance(resolved, Path):
            return import_onnx(resolved), str(resolved)
        return trace(resolved, example), str(model)
    if isinstance(model, nn.Module):
        return trace(_copy_sharing_storage(model), example), type(model).__name__
    raise ModelLoadError(f"cannot compile a {type(model).__name__}; pass an nn.Module, an .onnx path or a model spec")


def _copy_sharing_storage(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose tensors are new objects over the *same* storage.

    Copying data is the slowest part of compiling a large model, and most of it is rewritten
    anyway when channels are reordered (which rebinds ``.data`` to new storage). What is still
    shared at the end is cloned by ``_unshare``, so the user's module is never modified.
    """
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(p.data, requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = b.detach()
    return copy.deepcopy(model, memo)


def _unshare(net: nn.Module, original: "nn.Module | str | Path") -> None:
    if not isinstance(original, nn.Module):
        return
    ptrs = {t.data_ptr() for t in (*original.parameters(), *original.buffers()) if t.numel()}
    for t in (*net.parameters(), *net.buffers()):
        if t.numel() and t.data_ptr() in ptrs:
            t.data = t.data.clone()


def _example(example: torch.Tensor | None) -> torch.Tensor:
    if example is None:
        return torch.zeros(1, 3, 224, 224)
    if not isinstance(example, torch.Tensor) or example.dim() != 4:
        shape = tuple(example.shape) if isinstance(example, torch.Tensor) else type(example).__name__
        raise GraphError(f"the example input must be an image batch of shape (N, C, H, W), got {shape}")
    if example.shape[-1] != example.shape[-2]:
        raise GraphError(f"the example input must be square (H == W), got {tuple(example.shape)}")
    return example.detach()


def _check_classifier(gm: fx.GraphModule) -> None:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    result = out.args[0]
    shape = node_shape(result)
    if shape is None or len(shape) != 2:
        raise GraphError(
            f"the model's output is {'not a single tensor' if shape is None else f'of shape {shape}'}; "
            "AutoTailor compiles image classifiers whose output is one (N, classes) tensor"
        )


@dataclass
class _Plan:
    variables: list[Variable]
    stages: list[StageInfo]
    bindings: list[Binding]
    reorder: list  # channel groups of the width variables
    droppable: list[BlockInfo]  # blocks to outline (in stages that have a depth variable)
    block_templates: dict[int, str]
    lifts: dict[str, Callable[[nn.Module], Operator]]


def _plan(gm: fx.GraphModule, groups: list, st: Structure, cfg: TailorConfig, example: torch.Tensor) -> _Plan:
    """Templates matched to blocks, then every variable kind's variables, in registration order."""
    allowed = set(cfg.blocks) if cfg.blocks is not None else None
    for b in st.blocks:
        t = match(gm, b, allowed)
        b.template = t.name if t else ""
    ctx = PlanContext(gm, groups, st, cfg, example)
    for k in kinds():
        k.plan(ctx)
    stages = [StageInfo(m[0], tuple(m[1:])) for m in st.stages]
    droppable = [b for b in st.blocks if ctx.droppable_block(b.index) is not None]
    return _Plan(ctx.variables, stages, ctx.bindings, ctx.reorder, droppable, {b.index: b.template for b in st.blocks},
                 ctx.lifts)


def _lift(gm: fx.GraphModule, plan: _Plan) -> None:
    """Replace the operators that read a variable by dynamic operators, and record what they
    read (``Operator.reads``), in place. Nodes are mutated rather than replaced so that their
    names, which the plan refers to, stay valid."""
    nodes = {n.name: n for n in gm.graph.nodes}
    lifted: dict[str, Operator] = {}
    for b in plan.bindings:
        op = lifted.get(b.node)
        if op is None:
            node = nodes[b.node]
            if node.op == "get_attr":  # a parameter used elementwise: a module giving its active slice
                target = f"lifted_{node.name}"
                op = DynParam(get_attr(gm, node.target), b.axis)
                owner, _, attr = node.target.rpartition(".")
                delattr(gm.get_submodule(owner) if owner else gm, attr)
                gm.add_module(target, op)
                node.op, node.target = "call_module", target
            elif node.op == "call_module":
                op = plan.lifts.get(b.node, lift_operator)(gm.get_submodule(node.target))
                set_attr(gm, node.target, op)
            else:
                raise GraphError(f"{b.node}: cannot lift {node.op} {node.target}")
            lifted[b.node] = op
        if op.reads.get(b.field, b.var) != b.var:
            raise GraphError(f"{b.node}.{b.field} is read by two variables, {op.reads[b.field]} and {b.var}; "
                             "switch one of them off in the config (a single choice)")
        op.reads[b.field] = b.var
        if b.unit != 1:
            op.units[b.field] = b.unit
    gm.graph.lint()


def _outline(gm: fx.GraphModule, plan: _Plan) -> None:
    """Move each droppable block's nodes into a ``Block`` submodule that can be switched off."""
    flow: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder" or any(a in flow for a in node.all_input_nodes):
            flow.add(node)
    replaced: dict[fx.Node, fx.Node] = {}  # a block's last node -> the call of its Block
    for blk in plan.droppable:
        entry = replaced.get(blk.entry, blk.entry)
        inside = set(blk.nodes)
        needed: set[fx.Node] = set()  # constants (parameters, lifted params) the block reads
        stack = [a for n in blk.nodes for a in n.all_input_nodes if a not in flow and a not in inside]
        while stack:
            c = stack.pop()
            if c not in needed and c not in inside:
                needed.add(c)
                stack.extend(c.all_input_nodes)
        sub = fx.Graph()
        env: dict[fx.Node, fx.Node] = {entry: sub.placeholder("x")}
        for node in gm.graph.nodes:
            if node in inside or node in needed:
                env[node] = sub.node_copy(node, env.__getitem__)
        sub.output(env[blk.output])
        body = fx.GraphModule(gm, sub)
        name = f"block{blk.index}"
        gm.add_module(name, Block(body, blk.index, blk.template))
        last = blk.output
        with gm.graph.inserting_after(last):
            call = gm.graph.call_module(name, (entry,))
        flow.add(call)
        replaced[last] = call
        last.replace_all_uses_with(call)
        for node in reversed(blk.nodes):
            gm.graph.erase_node(node)
        position = {n: i for i, n in enumerate(gm.graph.nodes)}
        for node in sorted(needed, key=lambda n: -position[n]):
            if not node.users:
                gm.graph.erase_node(node)
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()

