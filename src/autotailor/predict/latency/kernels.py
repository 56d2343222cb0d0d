"""Kernels of a SuperNet: what a runtime executes, enumerated over the whole space without
enumerating SubNets.

The SuperNet's graph is flattened (droppable blocks inlined, each node remembering its
block) and its nodes are grouped into *kernels* by a backend's fusion rules (conv + BN +
activation run as one kernel on every runtime here). A kernel's shapes depend only on a few
variables: the input resolution, the width variables of the channel groups it touches and
its own kernel-size variable. So the unique kernels of the space are found per kernel group
over the product of those few variables' choices, and a SubNet's kernels are a lookup per
group; blocks dropped by a depth variable simply contribute nothing, because depth only
removes whole blocks whose input and output shapes are equal.

Shapes come from TailorIR's shape deduction (meta tensors, nothing is computed): once per
resolution and once per width choice, recording how each dimension of each node scales.
"""

from __future__ import annotations

import copy
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.variables import kind
from autotailor.errors import LatencyError
from autotailor.ir import DynParam, Operator
from autotailor.ir.graph import get_attr
from autotailor.ir.handlers import DEFAULT, OpHandler, for_module, for_node, target_name
from autotailor.ir.shapes import run_meta
from autotailor.ir.walk import GraphWalker
from autotailor.supernet import Arch, SuperNet

log = logging.getLogger(__name__)

Shape = tuple[int, ...]




# -- flattened graph ---------------------------------------------------------------------------
@dataclass
class Node:
    """One computation of the flattened SuperNet graph."""

    name: str  # unique: block path + fx node name
    kind: str  # canonical operation: conv2d, batchnorm2d, linear, relu, add, permute, ...
    describe: str  # the width-independent attributes (stride, padding, dims, ...)
    inputs: tuple[str, ...]  # producing nodes of the tensor inputs (constants excluded)
    block: int | None  # droppable block it lives in (None: always present)
    scope: str  # the graph it lives in: fusion never crosses a scope
    kernel_var: str | None = None
    handler: OpHandler = DEFAULT  # what counts its MACs and parameters
    facts: dict[str, Any] = field(default_factory=dict)  # what its handler's ``costs`` reads of the layer
    const: bool = False  # a parameter / constant: no cost, inlined into the kernels that use it
    scalar: bool = False  # a value that is not a tensor (a size read, arithmetic on sizes): folded in
    multi: bool = False  # a value of several tensors (chunk, split): its kernel holds its consumers
    is_param: bool = False  # a constant that is a learned parameter (counted in params)
    fx_node: fx.Node | None = field(default=None, repr=False)
    owner: fx.GraphModule | None = field(default=None, repr=False)
    args_map: dict[fx.Node, str] = field(default_factory=dict, repr=False)  # fx arg -> flattened name


def _literal(value: Any) -> str:
    return "T" if isinstance(value, fx.Node) else repr(value)


class _Flattener(GraphWalker):
    """Walks every block (dropped or not) and records each computation as a ``Node``; the
    values it passes along are the producing nodes' names."""

    inline_disabled = True

    def __init__(self, gm, prefix="", block=None, parent=None):
        super().__init__(gm, prefix, block, parent)
        self.nodes: list[Node] = [] if parent is None else parent.nodes
        self.const_names: set[str] = set() if parent is None else parent.const_names

    def _add(self, kind: str, describe: str, **fields: Any) -> str:
        n = self.node
        name = self.name_of(n)
        args_map = {a: self.env[a] for a in n.all_input_nodes}
        inputs = tuple(dict.fromkeys(v for v in args_map.values() if v not in self.const_names))
        if fields.get("const"):
            self.const_names.add(name)
            inputs = ()
        self.nodes.append(Node(name, kind, describe, inputs, self.block, self.prefix, fx_node=n,
                               owner=self.module, args_map=args_map, **fields))
        return name

    def placeholder(self, target, args, kwargs):
        if self.parent is not None:
            return super().placeholder(target, args, kwargs)
        return self._add("input", "")

    def get_attr(self, target, args, kwargs):
        return self._add("const", "", const=True, is_param=isinstance(get_attr(self.module, target), nn.Parameter))

    def call_layer(self, target, mod, args, kwargs):
        if isinstance(mod, DynParam):
            return self._add("param", "", const=True, is_param=isinstance(mod.value, nn.Parameter))
        handler = for_module(mod)
        return self._add(handler.kind(mod), handler.describe(mod), handler=handler, facts=handler.facts(mod),
                         kernel_var=mod.reads.get("kernel_size") if isinstance(mod, Operator) else None)

    def call_function(self, target, args, kwargs):
        n = self.node
        literals = ",".join(_literal(a) for a in n.args) + "," + ",".join(
            f"{k}={_literal(v)}" for k, v in n.kwargs.items())
        return self._add(target_name(target), literals, handler=for_node(self.module, n))

    call_method = call_function


def flatten(sn: SuperNet) -> list[Node]:
    """The SuperNet's computations in execution order, every block inlined (``ir.walk`` names)."""
    walker = _Flattener(sn.net)
    output = walker.run()
    walker.nodes.append(Node("output", "output", "", (output,), None, ""))
    return walker.nodes


# -- shapes as functions of the architecture ----------------------------------------------------
class ShapeModel:
    """Every node's output shape for any architecture, from a few shape deductions.

    Spatial sizes depend on the resolution only; a channel dimension on the width variable of
    its channel group. Deducing once per resolution and once per width choice gives, per
    dimension, a factor for each choice; a shape is the product of the factors of the
    architecture's choices (exact for dimensions that one variable sets, and for products of
    such, as a flatten of channels x height x width). Where two variables set one dimension as a
    sum (a fused qkv projection's rows per head: 2 x q/k width + value width), a deduction with
    both at their smallest tells, and every pair of their choices is deduced: a correction factor
    per pair.
    """

    def __init__(self, sn: SuperNet):
        top = sn.space.max()
        self.resolutions = list(sn.space["resolution"].choices) if "resolution" in sn.space else [None]
        self.base: dict[Any, dict[str, Shape]] = {}
        self.others: dict[str, str] = {}  # nodes whose value is not one tensor: "scalar" or "multi"
        for r in self.resolutions:
            arch = dict(top) if r is None else {**top, "resolution": r}
            self.base[r] = _deduce(sn, arch, self.others)
        self.r_max = self.resolutions[-1]
        ref = self.base[self.r_max]
        # node -> width variable -> choice -> [(dim, factor)]: how the variable scales its dims
        self.factors: dict[str, dict[str, dict[Any, list[tuple[int, float]]]]] = {name: {} for name in ref}
        for var in sn.space.variables:
            if not kind(var.kind).probe_shapes:
                continue
            for c in var.choices[:-1]:
                probe = _deduce(sn, {**top, var.name: c})
                for name, shape in probe.items():
                    changed = [(d, a / b) for d, (a, b) in enumerate(zip(shape, ref[name])) if a != b]
                    if changed:
                        self.factors[name].setdefault(var.name, {})[c] = changed
        self.res_dep = {name: len({self.base[r][name] for r in self.resolutions}) > 1 for name in ref}
        # node -> (variable a, variable b) -> (choice of a, choice of b) -> [(dim, correction)]
        self.pairs: dict[str, dict[tuple[str, str], dict[tuple, list[tuple[int, float]]]]] = {}
        for a, b in self._shared_dims():
            smallest = {a: sn.space[a].choices[0], b: sn.space[b].choices[0]}
            if self._exact(_deduce(sn, {**top, **smallest}), {**top, **smallest}):
                continue
            for ca in sn.space[a].choices[:-1]:
                for cb in sn.space[b].choices[:-1]:
                    pick = {a: ca, b: cb}
                    for name, shape in _deduce(sn, {**top, **pick}).items():
                        fixes = [(d, x / y) for d, (x, y) in enumerate(zip(shape, self._product(name, {**top, **pick})))
                                 if x != y]
                        if fixes:
                            self.pairs.setdefault(name, {}).setdefault((a, b), {})[(ca, cb)] = fixes

    def _shared_dims(self) -> list[tuple[str, str]]:
        """The pairs of variables that both scale one dimension of some node."""
        pairs: set[tuple[str, str]] = set()
        for per_var in self.factors.values():
            by_dim: dict[int, set[str]] = {}
            for var, per_choice in per_var.items():
                for changes in per_choice.values():
                    for d, _ in changes:
                        by_dim.setdefault(d, set()).add(var)
            for names in by_dim.values():
                pairs.update((a, b) for a in names for b in names if a < b)
        return sorted(pairs)

    def _exact(self, shapes: dict[str, Shape], arch: Arch) -> bool:
        return all(self._product(name, arch) == shape for name, shape in shapes.items())

    def _product(self, name: str, arch: Arch) -> Shape:
        """The shape of ``name`` as the product of single-variable factors."""
        dims = list(self.base[arch.get("resolution") if self.r_max is not None else None][name])
        for var, per_choice in self.factors[name].items():
            for d, f in per_choice.get(arch[var], ()):
                dims[d] *= f
        return tuple(int(round(x)) for x in dims)

    def shape(self, name: str, arch: Arch) -> Shape:
        dims = list(self._product(name, arch))
        for (a, b), per_pair in self.pairs.get(name, {}).items():
            for d, f in per_pair.get((arch[a], arch[b]), ()):
                dims[d] *= f
        return tuple(int(round(x)) for x in dims)

    def variables(self, name: str) -> set[str]:
        """The variables ``name``'s shape depends on."""
        out = set(self.factors.get(name, ()))
        if self.res_dep.get(name):
            out.add("resolution")
        return out


def _deduce(sn: SuperNet, arch: Arch, others: dict[str, str] | None = None) -> dict[str, Shape]:
    """Shapes of every node (flattened names) of ``arch`` with every block kept. The nodes whose
    values are not one tensor go into ``others``, if given: ``scalar`` (no tensor at all: a size)
    or ``multi`` (several tensors: ``chunk``, ``split``, an attention's (output, weights))."""
    shapes: dict[str, Shape] = {}

    def record(name: str, n: fx.Node, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            shapes[name] = tuple(value.shape)
        elif others is not None:
            leaves = torch.utils._pytree.tree_leaves(value)
            others[name] = "multi" if any(isinstance(v, torch.Tensor) for v in leaves) else "scalar"

    with sn.using(arch):
        for b in sn.blocks():
            b.transform(enabled=True)
        run_meta(sn.net, torch.empty(sn.input_shape(), device="meta"), record)
    return shapes


# -- fusion rules ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FusionRules:
    """How a runtime groups operators: an ``anchor`` absorbs the chain of single-consumer
    nodes that follow it while their kinds (their handlers' ``kind``) are in ``follow`` (in
    that order of stages). Each backend holds its own (``Backend.fusion``)."""

    name: str
    anchors: frozenset[str]
    follow: tuple[frozenset[str], ...]  # absorbed in stages, each at most once


POINTWISE_ACTS = frozenset({"relu", "relu6", "hardtanh", "clamp", "sigmoid", "tanh", "leakyrelu", "hardsigmoid"})
# One kernel per operator: PyTorch eager, and the counted costs when no device is given.
NO_FUSION = FusionRules("none", frozenset(), ())


GRANULARITIES = ("operator", "fused", "block")


@dataclass
class KernelGroup:
    """Nodes that run as one kernel, and how its signature varies with the architecture."""

    index: int
    nodes: list[str]
    inputs: list[str]  # external tensor inputs, in order
    outputs: list[str]
    block: int | None
    variables: tuple[str, ...] = ()
    static: str = ""  # the width-independent part of the signature
    table: dict[tuple, int] = field(default_factory=dict)  # choices of ``variables`` -> kernel id


# Operations that do nothing at inference; converters remove them, so they cost nothing.
_NO_OPS = frozenset({"dropout", "dropout2d", "alphadropout", "identity", "stochastic_depth"})


def _group(nodes: list[Node], rules: FusionRules, granularity: str) -> list[list[Node]]:
    compute = [n for n in nodes if not n.const and n.kind not in ("input", "output") and n.kind not in _NO_OPS]
    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n.name)
    by_name = {n.name: n for n in nodes}
    groups: list[list[Node]] = []
    taken: set[str] = set()
    if granularity == "block":
        blocks: dict[int, list[Node]] = {}
        for n in compute:
            if n.block is not None:
                blocks.setdefault(n.block, []).append(n)
                taken.add(n.name)
        groups.extend(blocks.values())
    units = _linear_norms(nodes, consumers) if "linear" in rules.anchors and granularity != "operator" else {}
    for n in compute:
        if n.name in taken:
            continue
        group = [n]
        taken.add(n.name)
        if n.name in units and not any(u.name in taken for u in units[n.name]):
            group += units[n.name]  # one Linear once the exporters fold the BatchNorm in
            taken.update(u.name for u in units[n.name])
        if n.multi:  # a kernel's inputs and outputs are tensors: it takes in the consumers too
            more = [by_name[u] for u in consumers.get(n.name, []) if u not in taken]
            group += more
            taken.update(m.name for m in more)
        elif granularity != "operator" and n.kind in rules.anchors:
            stage = 0
            while stage < len(rules.follow):
                users = consumers.get(group[-1].name, [])
                if len(users) != 1:
                    break
                nxt = by_name[users[0]]
                if nxt.name in taken or nxt.scope != n.scope or nxt.kind not in rules.follow[stage]:
                    stage += 1
                    continue
                group.append(nxt)
                taken.add(nxt.name)
                stage += 1
        groups.append(group)
    order = {n.name: i for i, n in enumerate(nodes)}
    groups.sort(key=lambda g: order[g[0].name])
    return groups


def _linear_norms(nodes: list[Node], consumers: dict[str, list[str]]) -> dict[str, list[Node]]:
    """LeViT's Linear + BatchNorm over tokens (``linear_norm``), which ``fold_linear_norms``
    makes one Linear at export: the Linear's node name -> its flatten, BatchNorm and reshape."""
    from autotailor.ir.ops.attention_pattern import linear_norm

    by_fx = {(id(n.owner), n.fx_node): n for n in nodes if n.fx_node is not None}
    units = {}
    for n in nodes:
        pair = linear_norm(n.owner, n.fx_node) if n.kind == "reshape_as" and n.owner is not None else None
        if pair is None:
            continue
        lin, bn = (by_fx.get((id(n.owner), f)) for f in pair)
        flat = by_fx.get((id(n.owner), pair[1].args[0]))
        if lin is None or bn is None or flat is None:
            continue
        if sorted(consumers.get(lin.name, [])) == sorted([flat.name, n.name]) and \
                consumers.get(flat.name) == [bn.name] and consumers.get(bn.name) == [n.name]:
            units[lin.name] = [flat, bn, n]
    return units


@dataclass
class Kernel:
    """One unique kernel of the space: its signature, and one place that produces it."""

    signature: str
    group: int
    choices: tuple


class KernelPlan:
    """The kernels of every SubNet of ``sn`` for one backend's fusion rules and a granularity.

    ``kernels`` lists the unique kernels of the whole space; ``kernel_ids(arch)`` the kernels
    one SubNet runs; ``build(kernel)`` a small torch module computing that kernel, to profile.
    """

    def __init__(self, sn: SuperNet, rules: str | FusionRules = "ort-cpu", granularity: str = "fused"):
        if granularity not in GRANULARITIES:
            raise LatencyError(f"granularity {granularity!r} is not allowed; expected one of {GRANULARITIES}")
        started = time.perf_counter()
        self.sn = sn
        if not isinstance(rules, FusionRules):
            from autotailor.predict.latency.backends import fusion_rules

            rules = fusion_rules(rules)
        self.rules = rules
        self.granularity = granularity
        self.nodes = flatten(sn)
        self.by_name = {n.name: n for n in self.nodes}
        self.shapes = ShapeModel(sn)
        _classify(self.nodes, self.shapes.others)
        self.groups: list[KernelGroup] = []
        self.kernels: list[Kernel] = []
        self._ids: dict[str, int] = {}
        self._params: dict[int, list[str]] = {}  # group -> learned constants it owns (counted once)
        owned: set[str] = set()
        for i, members in enumerate(_group(self.nodes, self.rules, granularity)):
            self.groups.append(self._enumerate(i, members))
            mine = [c for c in self._consts(members) if self.by_name[c].is_param and c not in owned]
            owned.update(mine)
            self._params[i] = mine
        self.seconds = time.perf_counter() - started
        log.info("%d kernel groups, %d unique kernels in %.2f s", len(self.groups), len(self.kernels), self.seconds)

    # -- enumeration ---------------------------------------------------------------------------
    def _enumerate(self, index: int, members: list[Node]) -> KernelGroup:
        names = {n.name for n in members}
        inputs = list(dict.fromkeys(i for n in members for i in n.inputs if i not in names))
        consumed_outside = {i for n in self.nodes if n.name not in names for i in n.inputs}
        outputs = [n.name for n in members if n.name in consumed_outside] or [members[-1].name]
        consts = self._consts(members)
        variables: set[str] = set()
        for name in [*inputs, *names, *consts]:
            variables |= self.shapes.variables(name)
        variables |= {n.kernel_var for n in members if n.kernel_var}
        ordered = tuple(v.name for v in self.sn.space.variables if v.name in variables)
        local = {n: i for i, n in enumerate([*inputs, *consts, *(m.name for m in members)])}
        static = " ; ".join(
            f"{n.kind}[{n.describe}]({','.join(str(local[i]) for i in n.inputs)})" for n in members)
        group = KernelGroup(index, [n.name for n in members], inputs, outputs, members[0].block, ordered, static)
        choices = [self.sn.space[v].choices for v in ordered]
        top = self.sn.space.max()
        for combo in itertools.product(*choices):
            arch = {**top, **dict(zip(ordered, combo))}
            sig = self._signature(group, members, consts, arch)
            kid = self._ids.get(sig)
            if kid is None:
                kid = self._ids[sig] = len(self.kernels)
                self.kernels.append(Kernel(sig, index, combo))
            group.table[combo] = kid
        return group

    def _consts(self, members: list[Node]) -> list[str]:
        """The tensor constants ``members`` read (scalars are folded in: the shapes show them)."""
        return list(dict.fromkeys(a for n in members for a in n.args_map.values()
                                  if self.by_name.get(a) is not None and self.by_name[a].const
                                  and not self.by_name[a].scalar))

    def _signature(self, group: KernelGroup, members: list[Node], consts: list[str], arch: Arch) -> str:
        shape = self.shapes.shape
        ins = ",".join(str(shape(i, arch)) for i in [*group.inputs, *consts])
        outs = ",".join(str(shape(n.name, arch)) for n in members if not n.multi)
        ks = ",".join(str(arch[n.kernel_var]) for n in members if n.kernel_var)
        return f"{group.static} | in {ins} | out {outs}" + (f" | k {ks}" if ks else "")

    def group_params(self, group: KernelGroup) -> list[str]:
        """The learned constants (layer scales, ...) counted with ``group``'s parameters."""
        return self._params.get(group.index, [])

    # -- SubNets ---------------------------------------------------------------------------------
    def dropped(self, arch: Arch) -> set[int]:
        """The droppable blocks SubNet ``arch`` leaves out."""
        return self.sn.space.dropped_blocks(arch)

    def kernel_ids(self, arch: Arch) -> list[int]:
        """The kernels SubNet ``arch`` runs (with repetition), in execution order."""
        arch = self.sn.space.complete(arch)
        dropped = self.dropped(arch)
        return [g.table[tuple(arch[v] for v in g.variables)] for g in self.groups if g.block not in dropped]

    # -- profiling -------------------------------------------------------------------------------
    def example(self, kernel: Kernel) -> tuple[nn.Module, list[Shape]]:
        """A standalone module computing ``kernel`` (weights copied from the SuperNet) and its input shapes."""
        group = self.groups[kernel.group]
        arch = {**self.sn.space.max(), **dict(zip(group.variables, kernel.choices))}
        with self.sn.using(arch):
            return _extract(self, group, self._scalars(group)), [self.shapes.shape(i, arch) for i in group.inputs]

    def _scalars(self, group: KernelGroup) -> dict[str, Any]:
        """The values of the scalars ``group`` reads, under the active SubNet (every block kept):
        what a static-shape export folds into the model."""
        wanted = {a for name in group.nodes for a in self.by_name[name].args_map.values() if self.by_name[a].scalar}
        if not wanted:
            return {}
        values: dict[str, Any] = {}

        def record(name: str, n: fx.Node, value: Any) -> None:
            if name in wanted:
                values[name] = value

        for b in self.sn.blocks():
            b.transform(enabled=True)
        run_meta(self.sn.net, torch.empty(self.sn.input_shape(), device="meta"), record)
        return values


def _classify(nodes: list[Node], others: dict[str, str]) -> None:
    """Computations whose value holds no tensor (``x.size(0)``, arithmetic on sizes) become
    folded constants: no kernel of their own, not a kernel's input (its shapes show them).
    Those with several tensors are marked ``multi``: their kernel takes in their consumers."""
    scalars = {n.name for n in nodes if not n.const and others.get(n.name) == "scalar"}
    for n in nodes:
        if n.name in scalars:
            n.const = n.scalar = True
        n.multi = others.get(n.name) == "multi"
        n.inputs = tuple(i for i in n.inputs if i not in scalars)


def _extract(plan: KernelPlan, group: KernelGroup, scalars: dict[str, Any]) -> fx.GraphModule:
    root = nn.Module()
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}
    for i, name in enumerate(group.inputs):
        env[name] = graph.placeholder(f"x{i}")
    counter = itertools.count()

    def value(name: str) -> Any:
        if name in scalars:
            return scalars[name]
        if name not in env:  # a constant: a copy of its active slice
            node = plan.by_name[name]
            target = node.fx_node.target
            mod = node.owner.get_submodule(target) if node.kind == "param" else None
            tensor = mod.build() if mod is not None else get_attr(node.owner, target)
            attr = f"c{next(counter)}"
            root.register_buffer(attr, tensor.detach().clone())
            env[name] = graph.get_attr(attr)
        return env[name]

    for name in group.nodes:
        node = plan.by_name[name]
        n = node.fx_node
        args = fx.node.map_arg(n.args, lambda a, m=node.args_map: value(m[a]))
        kwargs = fx.node.map_arg(n.kwargs, lambda a, m=node.args_map: value(m[a]))
        if n.op == "call_module":
            mod = node.owner.get_submodule(n.target)
            attr = f"m{next(counter)}"
            root.add_module(attr, mod.build() if isinstance(mod, Operator) else copy.deepcopy(mod))
            env[name] = graph.call_module(attr, args, kwargs)
        else:
            env[name] = graph.create_node(n.op, n.target, args, kwargs)
    outs = [env[o] for o in group.outputs]
    graph.output(outs[0] if len(outs) == 1 else tuple(outs))
    return fx.GraphModule(root, graph).eval()
