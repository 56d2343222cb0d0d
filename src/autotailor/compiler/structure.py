"""Block parsing and stage division, by graph topology alone.

*Cut* nodes are tensors every input-to-output path goes through. Between two consecutive
cuts lies either a single operator (a chain step) or a fork that joins again (a *unit*).
A unit whose join adds its own input back is a residual unit; one that multiplies (a
squeeze-excite gate) belongs to the chain around it; any other join (concat, ...) makes a
branch unit. Residual and branch units become blocks, absorbing the activations that follow
their join; chain steps are cut into blocks after a linear bottleneck (a dense layer not
followed by an activation), and a branch block takes the dense layer that makes its fork.
A stage starts at every block that is not a droppable residual block (identity shortcut,
same shape in and out), so depth changes drop a stage's last blocks.
Nothing here depends on module names, so a model and its ONNX export get the same structure.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.ir import handlers
from autotailor.ir.graph import carries_tensors, from_input, node_shape
from autotailor.ir.ops.elementwise import ADD_TARGETS, MUL_TARGETS


@dataclass
class BlockInfo:
    """A block: consecutive nodes with one input tensor (``entry``) and one output tensor (``output``)."""

    index: int
    kind: str  # "residual", "branch" or "chain"
    entry: fx.Node
    nodes: list[fx.Node]  # in graph order; the output is not always the last (see satellites)
    identity: bool = False  # the residual join adds the block input itself
    droppable: bool = False
    template: str = ""
    stage: int = -1

    output: fx.Node | None = None

    def __post_init__(self) -> None:
        if self.output is None:
            self.output = self.nodes[-1]


@dataclass
class Structure:
    blocks: list[BlockInfo]
    stages: list[list[int]] = field(default_factory=list)  # block indices per stage, first is the anchor


def _op_kind(gm: fx.GraphModule, node: fx.Node) -> str:
    """Coarse kind of an operator (its handler's ``structure``): dense, dwconv, norm, act, or other."""
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        return handlers.for_module(mod).structure(mod)
    return handlers.for_node(gm, node).structure(None)


def _flow_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """Nodes whose tensors derive from the input, in graph (topological) order.

    Reading the input's shape (``x.size(0)`` for a final ``view``) is not data flow: such
    nodes would otherwise look like a skip connection around the whole network.
    """
    reach: set[fx.Node] = set()
    order = []
    for node in gm.graph.nodes:
        if node.op == "output" or (
            carries_tensors(node) and (node.op == "placeholder" or any(a in reach for a in node.all_input_nodes))
        ):
            reach.add(node)
            order.append(node)
    return order


def _cuts(order: list[fx.Node]) -> list[int]:
    index = {n: i for i, n in enumerate(order)}
    cuts, reach = [], 0
    for i, node in enumerate(order):
        if reach <= i:
            cuts.append(i)
        far = max((index[u] for u in node.users if u in index), default=i)
        reach = max(reach, far)
    return cuts


def parse_structure(gm: fx.GraphModule) -> Structure:
    """Split the graph into blocks and stages (see the module docstring)."""
    order = _flow_nodes(gm)
    if not order or order[0].op != "placeholder":
        from autotailor.errors import GraphError

        raise GraphError("the graph has no input placeholder")
    cuts = _cuts(order)
    # Elements of the main path: (kind, entry, nodes) with kind step | residual | gate | branch.
    elements: list[tuple[str, fx.Node, list[fx.Node], bool]] = []
    for a, b in zip(cuts, cuts[1:]):
        entry, join = order[a], order[b]
        inner = order[a + 1 : b]
        if join.op == "output":
            break
        if not inner:
            elements.append(("step", entry, [join], False))
            continue
        nodes = inner + [join]
        target = math_target(gm, join)
        if target in ADD_TARGETS:
            source = _through_identities(gm, entry)  # the entry may itself pass a tensor on (timm's norm_pre)
            identity = any(_through_identities(gm, a) in (entry, source) for a in join.all_input_nodes)
            elements.append(("residual", entry, nodes, identity))
        elif target in MUL_TARGETS:
            elements.append(("gate", entry, nodes, False))
        else:
            elements.append(("branch", entry, nodes, False))

    blocks: list[BlockInfo] = []
    chain: list[tuple[fx.Node, list[fx.Node], str]] = []  # (entry, nodes, kind of last op)

    def flush() -> None:
        if chain:
            nodes = [n for _, ns, _ in chain for n in ns]
            blocks.append(BlockInfo(len(blocks), "chain", chain[0][0], nodes))
            chain.clear()

    i = 0
    while i < len(elements):
        kind, entry, nodes, identity = elements[i]
        if kind in ("residual", "branch"):
            if kind == "branch":
                # A branch block starts at the layer that makes its fork (SqueezeNet's squeeze
                # conv feeds both expand convs): move it and what follows it out of the chain.
                dense = [j for j, (_, _, k) in enumerate(chain) if k == "dense"]
                if dense:
                    moved = chain[dense[-1]:]
                    del chain[dense[-1]:]
                    entry = moved[0][0]
                    nodes = [n for _, ns, _ in moved for n in ns] + list(nodes)
            flush()
            nodes = list(nodes)
            # Activations right after the join belong to the block (ResNet's ReLU after the add).
            while i + 1 < len(elements) and elements[i + 1][0] == "step" and _op_kind(gm, elements[i + 1][2][0]) == "act":
                i += 1
                nodes += elements[i][2]
            blocks.append(BlockInfo(len(blocks), kind, entry, nodes, identity=identity))
        else:
            last = "gate" if kind == "gate" else _op_kind(gm, nodes[0])
            chain.append((entry, nodes, last))
            nxt = elements[i + 1] if i + 1 < len(elements) else None
            if nxt is not None and _bottleneck_end(gm, chain) and (
                nxt[0] in ("residual", "branch") or (nxt[0] == "step" and _op_kind(gm, nxt[2][0]) == "dense")
            ):
                flush()
        i += 1
    flush()

    flow = set(order)
    _attach_satellites(gm, blocks, flow)
    for blk in blocks:
        shape_in, shape_out = node_shape(blk.entry), node_shape(blk.output)
        inside = set(blk.nodes) | {blk.entry}
        # The block must read nothing computed from the input outside it (a size, say),
        # so that it can be outlined and switched off.
        closed = all(a in inside or not from_input(a, flow) for n in blk.nodes for a in n.all_input_nodes) and all(
            u in inside for n in blk.nodes if n is not blk.output for u in n.users
        )
        blk.droppable = (
            blk.kind == "residual" and blk.identity and shape_in == shape_out and shape_in is not None and closed
        )
    stages: list[list[int]] = []
    for blk in blocks:
        if not blk.droppable or not stages:
            stages.append([])
        blk.stage = len(stages) - 1
        stages[-1].append(blk.index)
    return Structure(blocks, stages)


def _through_identities(gm: fx.GraphModule, node: fx.Node) -> fx.Node:
    """Follow ``nn.Identity`` calls back to the tensor they pass on (timm's ``shortcut``)."""
    while node.op == "call_module" and isinstance(gm.get_submodule(node.target), nn.Identity):
        node = node.args[0]
    return node


def _attach_satellites(gm: fx.GraphModule, blocks: list[BlockInfo], flow: set[fx.Node]) -> None:
    """Give each block the non-tensor nodes computed from its tensors (``x.ndim`` checks,
    sizes for a reshape), so that outlining the block takes them along. A size that only a
    later block uses goes with that block (torchvision's Swin V2 reads its input's shape
    before the attention, from the previous block's output)."""
    owner = {n: b.index for b in blocks for n in b.nodes}
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    loose = [n for n in gm.graph.nodes
             if n not in flow and n not in owner and n.op not in ("placeholder", "output", "get_attr")]
    for node in loose:
        homes = {owner[a] for a in node.all_input_nodes if a in owner}
        if len(homes) == 1:
            (owner[node],) = homes
    for node in reversed(loose):  # users first, so that a chain of sizes moves together
        users = {owner.get(u) for u in node.users}
        if len(users) == 1 and None not in users:
            (owner[node],) = users
    for node in loose:
        if node in owner:
            blocks[owner[node]].nodes.append(node)
    for b in blocks:
        b.nodes.sort(key=position.__getitem__)


def _bottleneck_end(gm: fx.GraphModule, chain: list[tuple[fx.Node, list[fx.Node], str]]) -> bool:
    """The chain so far ends with a dense layer (optionally normalised) and no activation."""
    kinds = [k for _, _, k in chain]
    if kinds[-1] == "dense":
        return True
    return len(kinds) >= 2 and kinds[-1] == "norm" and kinds[-2] == "dense"


def math_target(gm: fx.GraphModule, node: fx.Node) -> object:
    """The function a node applies; onnx2torch's Add/Mul modules map to operator.add/mul."""
    if node.op != "call_module":
        return node.target
    fn = getattr(gm.get_submodule(node.target), "math_op_function", None)
    return {torch.add: operator.add, torch.mul: operator.mul}.get(fn, fn)
