"""``compile``: a user's model -> a SuperNet, through the compiler passes.

trace (or import ONNX) -> shape propagation -> channel groups -> blocks and stages ->
templates and variables (from the config) -> importance reordering -> operator lifting ->
outlining droppable blocks -> resolution check.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.channels import ChannelGroup, analyse_channels
from autotailor.compiler.config import TailorConfig, load_config
from autotailor.compiler.graph_utils import propagate_shapes, runs_at
from autotailor.ir.graph import get_attr, node_shape, set_attr
from autotailor.compiler.importance import reorder_channels
from autotailor.compiler.normalize import lift_functional_layers
from autotailor.compiler.structure import BlockInfo, Structure, parse_structure
from autotailor.compiler.templates import match
from autotailor.errors import GraphError, ModelLoadError
from autotailor.frontends import import_onnx, load_model, trace
from autotailor.ir import Block, DynParam, for_module
from autotailor.ir import lift as lift_operator
from autotailor.supernet.space import Space, StageInfo, Variable
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
    gm, source = _to_graph(model)
    training = model.training if isinstance(model, nn.Module) else False
    gm.eval()  # the passes run the graph's inference path (BatchNorm on running statistics)
    example = _example(gm, example_input, source)
    gm.graph.eliminate_dead_code()  # e.g. unused attention weights returned by a MultiheadAttention
    lift_functional_layers(gm)
    propagate_shapes(gm, example)
    _check_classifier(gm)
    groups = analyse_channels(gm)
    structure = parse_structure(gm)
    plan = _plan(gm, groups, structure, cfg, example)
    reorder_channels(gm, list(plan.variable_groups.values()))
    _lift(gm, plan)
    _outline(gm, plan)
    _unshare(gm, model)
    space = Space(plan.variables, plan.stages)
    sn = SuperNet(gm, space, plan.widths, plan.block_templates, example_shape=tuple(example.shape), config=cfg)
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
        "groups": {"total": len(groups), "variable": len(plan.variable_groups)},
    }
    log.info("compiled %s in %.2fs: %d variables, 10^%.1f SubNets", source, sn.compile_info["seconds"],
             len(space), space.log10_size)
    return sn


def _to_graph(model: "nn.Module | str | Path") -> tuple[fx.GraphModule, str]:
    if isinstance(model, (str, Path)):
        resolved = load_model(str(model))
        if isinstance(resolved, Path):
            return import_onnx(resolved), str(resolved)
        return trace(resolved), str(model)
    if isinstance(model, nn.Module):
        return trace(_copy_sharing_storage(model)), type(model).__name__
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


def _example(gm: fx.GraphModule, example: torch.Tensor | None, source: str) -> torch.Tensor:
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
    variable_groups: dict[str, ChannelGroup]  # group name -> group
    widths: dict[str, tuple[tuple, tuple[int, ...]]]  # width variable -> (ratios, channels)
    kernel_ops: dict[str, str]  # conv node name -> kernel variable
    droppable: list[BlockInfo]  # blocks to outline (in stages that have a depth variable)
    block_templates: dict[int, str]


def _channels(ratio: float, size: int, granularity: int) -> int:
    k = round(ratio * size / granularity) * granularity
    return min(size, max(granularity, k))


def _width_choices(ratios: tuple[float, ...], group: ChannelGroup) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Ratios and channel counts, keeping one ratio per distinct channel count; 1.0 is always in."""
    kept: dict[int, float] = {}
    for r in sorted(set(ratios) | {1.0}):
        k = _channels(r, group.size, group.granularity)
        kept.setdefault(k, r)
    chans = sorted(kept)
    chans[-1] = group.size
    return tuple(kept[c] for c in chans[:-1]) + (1.0,), tuple(chans)


def _resolutions(cfg: TailorConfig, gm: fx.GraphModule, example: torch.Tensor) -> tuple[int, ...]:
    size = example.shape[-1]
    if cfg.resolution is not None:
        wanted = cfg.resolution
    else:
        q = 8 if size >= 64 else 4
        wanted = tuple(sorted({max(q, round(size * f / 7 / q) * q) for f in (5, 6)} | {size}))
    ok = []
    for r in wanted:
        probe = example[:1].new_zeros(1, example.shape[1], r, r)
        if r == size or runs_at(gm, probe):
            ok.append(r)
        else:
            log.warning("resolution %d dropped: the model does not run at %dx%d", r, r, r)
    if not ok:
        raise GraphError(f"the model runs at none of the configured resolutions {list(wanted)}")
    return tuple(ok)


def _plan(gm: fx.GraphModule, groups: list[ChannelGroup], st: Structure, cfg: TailorConfig,
          example: torch.Tensor) -> _Plan:
    allowed = set(cfg.blocks) if cfg.blocks is not None else None
    block_of: dict[str, int] = {n.name: b.index for b in st.blocks for n in b.nodes}
    for b in st.blocks:
        t = match(gm, b, allowed)
        b.template = t.name if t else ""
    nodes = {n.name: n for n in gm.graph.nodes}
    depth_choices = {}
    for s, members in enumerate(st.stages):
        n = len(members) - 1
        choices = tuple(sorted({max(d, -n) for d in cfg.reduce_depth} | {0})) if n else (0,)
        depth_choices[s] = choices
    has_depth = {s for s, c in depth_choices.items() if len(c) > 1}

    def blocks_of(member_nodes: list[str]) -> set[int]:
        found = set()
        for name in member_nodes:
            # A node outside every block (a parameter, or a constant computation such as Swin
            # V2's position-bias MLP) belongs where the values it feeds are used.
            stack, seen = [nodes[name]], set()
            while stack:
                node = stack.pop()
                if node.name in block_of:
                    found.add(block_of[node.name])
                    continue
                for u in node.users:
                    if u not in seen:
                        seen.add(u)
                        stack.append(u)
        return found

    variables: list[Variable] = []
    resolutions = _resolutions(cfg, gm, example)
    if len(resolutions) > 1:
        variables.append(Variable("resolution", "resolution", resolutions))
    for s, choices in depth_choices.items():
        if s in has_depth:
            variables.append(Variable(f"stage{s}.reduce_depth", "depth", choices, (f"stage{s}",), stage=s))

    widths: dict[str, tuple[tuple, tuple[int, ...]]] = {}
    variable_groups: dict[str, ChannelGroup] = {}
    counters: dict[str, int] = {}

    def name_for(base: str) -> str:
        k = counters.get(base, 0)
        counters[base] = k + 1
        return base if k == 0 else f"{base}#{k}"

    def droppable_block(b: int) -> int | None:
        blk = st.blocks[b]
        return b if blk.droppable and blk.stage in has_depth else None

    for group in groups:
        if not group.variable:
            continue
        all_blocks = blocks_of([m.node for m in group.members])
        own_blocks = blocks_of([m.node for m in group.members if m.role != "in"])
        own_stages = {st.blocks[b].stage for b in own_blocks}
        if len(all_blocks) == 1:
            (b,) = all_blocks
            template = st.blocks[b].template
            ratios = cfg.block_choices(template, "expand_ratio") if template else (1.0,)
            name, block = f"block{b}.expand_ratio", droppable_block(b)
        elif len(own_stages) == 1:
            (s,) = own_stages
            ratios, name, block = cfg.stage_width, f"stage{s}.width_ratio", None
        else:
            ratios, name, block = cfg.global_width, "width_ratio", None
        choices, chans = _width_choices(tuple(ratios), group)
        if len(choices) < 2:
            continue
        name = name_for(name)
        gname = f"g{len(variable_groups)}"
        variable_groups[gname] = group
        widths[name] = (choices, chans)
        variables.append(Variable(name, "width", choices, (gname,), block=block))

    kernel_ops: dict[str, str] = {}
    for b in st.blocks:
        if not b.template:
            continue
        wanted = cfg.block_choices(b.template, "kernel_size")
        for node in b.nodes:
            conv = gm.get_submodule(node.target) if node.op == "call_module" else None
            if not _croppable_depthwise(conv):
                continue
            k = conv.kernel_size[0]
            choices = tuple(sorted({c for c in wanted if c <= k and c % 2 == 1} | {k}))
            if len(choices) < 2:
                continue
            name = name_for(f"block{b.index}.kernel_size")
            kernel_ops[node.name] = name
            variables.append(Variable(name, "kernel", choices, (node.name,), block=droppable_block(b.index)))

    stages = [StageInfo(m[0], tuple(m[1:])) for m in st.stages]
    droppable = [b for b in st.blocks if droppable_block(b.index) is not None]
    return _Plan(variables, stages, variable_groups, widths, kernel_ops, droppable,
                 {b.index: b.template for b in st.blocks})


def _croppable_depthwise(conv: object) -> bool:
    """A depthwise conv with a square odd kernel and 'same' padding, which centre-cropping preserves."""
    if not isinstance(conv, nn.Conv2d) or not (conv.groups == conv.in_channels == conv.out_channels > 1):
        return False
    k = conv.kernel_size
    if k[0] != k[1] or k[0] < 3 or k[0] % 2 == 0 or conv.padding_mode != "zeros":
        return False
    if isinstance(conv.padding, str):
        return conv.padding == "same"
    return all(p == (k[0] // 2) * d for p, d in zip(conv.padding, conv.dilation))


def _lift(gm: fx.GraphModule, plan: _Plan) -> None:
    """Replace the operators that a variable touches by dynamic operators, in place.

    Nodes are mutated rather than replaced so that their names, which the plan refers to,
    stay valid.
    """
    nodes = {n.name: n for n in gm.graph.nodes}
    lifted: dict[str, nn.Module] = {}

    def lift(name: str) -> nn.Module:
        if name in lifted:
            return lifted[name]
        node = nodes[name]
        if node.op == "call_module":
            mod = gm.get_submodule(node.target)
            if for_module(mod).dynamic is None:
                raise GraphError(f"{name}: {type(mod).__name__} has a channel rule but no dynamic operator")
            op = lift_operator(mod)
            set_attr(gm, node.target, op)
        else:
            raise GraphError(f"{name}: cannot lift {node.op} {node.target}")
        lifted[name] = op
        return op

    for var in plan.variables:
        if var.kind != "width":
            continue
        (gname,) = var.targets
        for m in plan.variable_groups[gname].members:
            node = nodes[m.node]
            if m.role == "param":
                target = f"lifted_{node.name}"
                op = DynParam(get_attr(gm, node.target), m.axis)
                owner, _, attr = node.target.rpartition(".")
                delattr(gm.get_submodule(owner) if owner else gm, attr)
                gm.add_module(target, op)
                node.op, node.target = "call_module", target
                op.out_group = gname
                continue
            op = lift(m.node)
            if m.role in ("in", "inout"):
                op.in_group = gname
            if m.role in ("out", "inout"):
                op.out_group = gname
    for node_name, var in plan.kernel_ops.items():
        op = lift(node_name)
        op.kernel_var = var
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
        stack = [a for n in blk.nodes for a in n.all_input_nodes if a not in flow]
        while stack:
            c = stack.pop()
            if c not in needed:
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

