"""Variable kinds: each search dimension (resolution, depth, width, kernel, ...) is one registered
``VariableKind`` that holds everything about it:

* its configuration keys (``var.global_vars.width_ratio``, ...), their validation and defaults
  (``settings``, ``check``, ``default``);
* how it finds its variables in a compiled graph and which operator fields read them
  (``plan``, writing ``Variable``s and ``Binding``s into a ``PlanContext``);
* what a choice sets on an operator field (``value``), whether it drops blocks
  (``drops_blocks``) and whether it scales tensor dimensions by a factor per choice
  (``probe_shapes``: the latency model deduces shapes once per choice of such variables;
  the resolution, the input itself, is deduced per choice anyway).

Operators do not know kinds: an operator's ``reads`` maps its feature fields to variable names,
and ``SuperNet.set_arch`` asks each variable's kind for the value. Adding a dimension is one
subclass decorated with ``@register_kind``, placed after the kinds whose variables it follows.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.errors import ConfigError, GraphError

log = logging.getLogger(__name__)

SCOPES = ("global_vars", "stage_vars", "block_vars")


@dataclass(frozen=True)
class Variable:
    """One modification variable. ``choices`` ascend; the last is the largest architecture.

    ``values`` are what each choice sets on the operators that read the variable (channel
    counts of a width ratio, blocks a depth choice drops), when they differ from the choices. ``block`` is the droppable
    block the variable lives in, if it lives in one: when that block is dropped the variable
    stops mattering, which ``Space.size`` accounts for; ``stage`` the stage a depth variable
    shortens. ``targets`` say what it acts on (channel-group or operator names), for people.
    """

    name: str
    kind: str
    choices: tuple
    targets: tuple[str, ...] = ()
    block: int | None = None
    stage: int | None = None
    values: tuple = ()

    @property
    def largest(self) -> Any:
        return self.choices[-1]

    def value(self, choice: Any) -> Any:
        """What ``choice`` sets on the operators that read this variable."""
        return self.values[self.choices.index(choice)] if self.values else choice


@dataclass(frozen=True)
class Binding:
    """Operator field ``field`` of graph node ``node`` reads variable ``var`` (times ``unit``). A
    ``get_attr`` node (a parameter used elementwise) becomes a ``DynParam`` sliced along ``axis``."""

    node: str
    field: str
    var: str
    axis: int = 0
    unit: int = 1  # the field is the variable's value times this (channels per head)


@dataclass
class PlanContext:
    """What kinds plan from (the traced graph, its channel groups, structure and the config) and
    what they plan (variables, bindings, channel groups to reorder, blocks that can be dropped)."""

    gm: fx.GraphModule
    groups: list
    structure: Any
    config: Any
    example: torch.Tensor
    variables: list[Variable] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)
    reorder: list = field(default_factory=list)  # channel groups to order by importance
    depth_stages: set[int] = field(default_factory=set)  # stages whose last blocks can be dropped
    # Node -> what lifts its layer, where a kind needs another operator than the handler's
    # ``dynamic`` (an attention's projection whose rows per head are sliced).
    lifts: dict[str, Any] = field(default_factory=dict)
    _counters: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes = {n.name: n for n in self.gm.graph.nodes}
        self.block_of = {n.name: b.index for b in self.structure.blocks for n in b.nodes}

    def name_for(self, base: str) -> str:
        """``base``, or ``base#k`` for its k-th repetition (two kernels in one block)."""
        k = self._counters.get(base, 0)
        self._counters[base] = k + 1
        return base if k == 0 else f"{base}#{k}"

    def claimed(self, group) -> bool:
        """Whether a variable planned before already slices ``group``."""
        return any(group is g or (isinstance(g, tuple) and any(group is x for x in g)) for g in self.reorder)

    def droppable_block(self, b: int) -> int | None:
        """``b`` if a depth variable can drop it, else None."""
        blk = self.structure.blocks[b]
        return b if blk.droppable and blk.stage in self.depth_stages else None

    def blocks_of(self, member_nodes: list[str]) -> set[int]:
        """The blocks the nodes belong to. A node outside every block (a parameter, or a constant
        computation such as Swin V2's position-bias MLP) belongs where the values it feeds are used."""
        found = set()
        for name in member_nodes:
            stack, seen = [self.nodes[name]], set()
            while stack:
                node = stack.pop()
                if node.name in self.block_of:
                    found.add(self.block_of[node.name])
                    continue
                for u in node.users:
                    if u not in seen:
                        seen.add(u)
                        stack.append(u)
        return found


class VariableKind:
    """One kind of modification variable (see the module docstring)."""

    name: ClassVar[str] = ""
    settings: ClassVar[dict[str, str]] = {}  # config scope -> key
    drops_blocks: ClassVar[bool] = False
    probe_shapes: ClassVar[bool] = False

    def default(self, scope: str) -> tuple | None:
        """Default choices in ``scope`` (None: derived from the model)."""
        raise NotImplementedError

    def check(self, where: str, key: str, value: object) -> tuple:
        """``value`` validated and sorted, or a ``ConfigError`` naming ``key`` and what is allowed."""
        raise NotImplementedError

    def plan(self, ctx: PlanContext) -> None:
        """Add this kind's variables (and the bindings of the operators that read them) to ``ctx``."""
        raise NotImplementedError


_KINDS: dict[str, VariableKind] = {}


def register_kind(cls: type[VariableKind] | None = None, *, before: str | None = None):
    """Register one instance of ``cls``; kinds plan in registration order, a kind registered
    ``before`` another ahead of it (to claim channel groups that the other would take)."""

    def deco(cls: type[VariableKind]) -> type[VariableKind]:
        if before is not None and before not in _KINDS:
            raise ConfigError(f"kind {cls.name!r}: before={before!r} is not a kind; kinds are {list(_KINDS)}")
        items = list(_KINDS.items())
        at = [k for k, _ in items].index(before) if before is not None else len(items)
        items.insert(at, (cls.name, cls()))
        _KINDS.clear()
        _KINDS.update(items)
        return cls

    return deco(cls) if cls is not None else deco


def kinds() -> list[VariableKind]:
    return list(_KINDS.values())


def kind(name: str) -> VariableKind:
    if name not in _KINDS:
        raise ConfigError(f"unknown variable kind {name!r}; known: {', '.join(_KINDS)}")
    return _KINDS[name]


def setting_kind(scope: str, key: str) -> VariableKind | None:
    """The kind configured by ``var.SCOPE.KEY`` (for block_vars, ``KEY`` without the template)."""
    return next((k for k in _KINDS.values() if k.settings.get(scope) == key), None)


def setting_keys(scope: str) -> tuple[str, ...]:
    return tuple(k.settings[scope] for k in _KINDS.values() if scope in k.settings)


def _invalid(where: str, key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{where}: {key} = {value!r} is not allowed; expected {allowed}")


def numbers(where: str, key: str, value: object, kind: type, check, rule: str) -> tuple:
    """A non-empty list of ``kind`` passing ``check``, as a sorted tuple without repeats."""
    if not isinstance(value, list) or not value:
        raise _invalid(where, key, value, f"a non-empty list of {rule}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            raise _invalid(where, key, value, f"a list of {rule}")
        if not check(v):
            raise _invalid(where, key, value, f"a list of {rule}")
        out.append(kind(v))
    return tuple(sorted(set(out)))


def ratios(where: str, key: str, value: object) -> tuple:
    """A list of ratios in (0, 1]; 1.0 (the original model) is always a choice, said if it is missing."""
    checked = numbers(where, key, value, float, lambda v: 0 < v <= 1, "ratios in (0, 1]")
    if 1.0 not in checked:
        log.warning("%s: %s = %s has no 1.0; the original width is always a choice, so 1.0 is added", where, key,
                    list(value))
    return checked


class RatioKind(VariableKind):
    """A kind configured by ratios of the model's own size (1.0 always a choice), ``DEFAULT`` in
    every scope, that scales tensor dimensions."""

    DEFAULT: ClassVar[tuple[float, ...]] = (0.5, 0.75, 1.0)
    probe_shapes = True

    def default(self, scope: str) -> tuple:
        return self.DEFAULT

    def check(self, where: str, key: str, value: object) -> tuple:
        return ratios(where, key, value)


# -- the kinds AutoTailor ships ---------------------------------------------------------------------
@register_kind
class Resolution(VariableKind):
    """The input resolution. By default 5/7, 6/7 and 7/7 of the example's side; a resolution
    the model does not run at is dropped with a warning."""

    name = "resolution"
    settings = {"global_vars": "resolution"}

    def default(self, scope: str) -> tuple | None:
        return None

    def check(self, where: str, key: str, value: object) -> tuple:
        return numbers(where, key, value, int, lambda v: v > 0, "positive integers")

    def plan(self, ctx: PlanContext) -> None:
        from autotailor.compiler.graph_utils import run_error

        size = ctx.example.shape[-1]
        wanted = ctx.config.choices("global_vars", "resolution")
        if wanted is None:
            q = 8 if size >= 64 else 4
            wanted = tuple(sorted({max(q, round(size * f / 7 / q) * q) for f in (5, 6)} | {size}))
        ok, dropped = [], {}
        for r in wanted:
            error = None if r == size else run_error(ctx.gm, ctx.example[:1].new_zeros(1, ctx.example.shape[1], r, r))
            if error is None:
                ok.append(r)
            else:
                dropped[r] = error
        if dropped:
            log.warning("resolution(s) %s dropped: the model does not run at them (%s)", list(dropped),
                        "; ".join(f"{r}: {e}" for r, e in dropped.items()))
        if not ok:
            raise GraphError(f"the model runs at none of the configured resolutions {list(wanted)}")
        if len(ok) > 1:
            ctx.variables.append(Variable("resolution", "resolution", tuple(ok)))


@register_kind
class Depth(VariableKind):
    """How many trailing layers of a stage are left out (0, -1, -2, ...). A layer is one
    droppable block, or the repeating run of blocks of a transformer (attention and MLP);
    ``Variable.value`` is how many blocks a choice drops."""

    name = "depth"
    settings = {"stage_vars": "reduce_depth"}
    drops_blocks = True

    def default(self, scope: str) -> tuple:
        return (-2, -1, 0)

    def check(self, where: str, key: str, value: object) -> tuple:
        return numbers(where, key, value, int, lambda v: v <= 0, "integers <= 0")

    def plan(self, ctx: PlanContext) -> None:
        wanted = ctx.config.choices("stage_vars", "reduce_depth")
        clipped: dict[int, int] = {}
        for s, members in enumerate(ctx.structure.stages):
            per = layer_period([ctx.structure.blocks[b].template for b in members[1:]])
            n = (len(members) - 1) // per
            choices = tuple(sorted({max(d, -n) for d in wanted} | {0})) if n else (0,)
            if min(wanted) < -n:
                clipped[s] = -n
            if len(choices) > 1:
                ctx.depth_stages.add(s)
                ctx.variables.append(Variable(f"stage{s}.reduce_depth", "depth", choices, (f"stage{s}",), stage=s,
                                              values=tuple(d * per for d in choices) if per > 1 else ()))
        if clipped and "reduce_depth" in ctx.config.stage_vars:
            log.warning("var.stage_vars.reduce_depth = %s goes deeper than stages can drop; limited to %s", list(wanted),
                        ", ".join(f"stage{s}: {d}" for s, d in clipped.items()))


def layer_period(templates: list[str]) -> int:
    """How many consecutive blocks make one layer of a stage: the shortest period of its blocks'
    templates (a transformer layer is an attention block and an MLP block, dropped together)."""
    n = len(templates)
    p = next((p for p in range(1, n + 1) if n % p == 0 and all(t == templates[i % p] for i, t in enumerate(templates))),
             1)
    # No repeating run (p == n) makes one layer only of distinct blocks; otherwise blocks are layers.
    return p if p < n or len(set(templates)) == n else 1


def _channels(ratio: float, size: int, granularity: int) -> int:
    k = round(ratio * size / granularity) * granularity
    return min(size, max(granularity, k))


def width_choices(ratios: tuple[float, ...], size: int, granularity: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Ratios and channel counts, keeping one ratio per distinct channel count; 1.0 is always in."""
    kept: dict[int, float] = {}
    for r in sorted(set(ratios) | {1.0}):
        kept.setdefault(_channels(r, size, granularity), r)
    chans = sorted(kept)
    chans[-1] = size
    return tuple(kept[c] for c in chans[:-1]) + (1.0,), tuple(chans)


@register_kind
class Width(VariableKind):
    """The channels of a channel group, as a ratio of its largest: a block's own
    (``expand_ratio``), a stage's (the residual stream its blocks share) or the network's
    (stems and heads). The first k channels are kept after importance reordering."""

    name = "width"
    settings = {"global_vars": "width_ratio", "stage_vars": "width_ratio", "block_vars": "expand_ratio"}
    probe_shapes = True
    _DEFAULTS = {"global_vars": (0.75, 1.0), "stage_vars": (0.5, 0.75, 1.0), "block_vars": (0.25, 0.5, 0.75, 1.0)}

    def default(self, scope: str) -> tuple:
        return self._DEFAULTS[scope]

    def check(self, where: str, key: str, value: object) -> tuple:
        return ratios(where, key, value)

    def plan(self, ctx: PlanContext) -> None:
        st, cfg = ctx.structure, ctx.config
        for group in ctx.groups:
            if not group.variable or ctx.claimed(group):
                continue
            all_blocks = ctx.blocks_of([m.node for m in group.members])
            own_stages = {st.blocks[b].stage for b in ctx.blocks_of([m.node for m in group.members if m.role != "in"])}
            if len(all_blocks) == 1:
                (b,) = all_blocks
                template = st.blocks[b].template
                ratios = cfg.block_choices(template, "expand_ratio") if template else (1.0,)
                name, block = f"block{b}.expand_ratio", ctx.droppable_block(b)
            elif len(own_stages) == 1:
                (s,) = own_stages
                ratios, name, block = cfg.choices("stage_vars", "width_ratio"), f"stage{s}.width_ratio", None
            else:
                ratios, name, block = cfg.choices("global_vars", "width_ratio"), "width_ratio", None
            bind_width(ctx, group, self.name, name, tuple(ratios), block)


def bind_width(ctx: PlanContext, group, kind: str, name: str, ratios: tuple[float, ...], block: int | None) -> None:
    """A variable of ``kind`` choosing ``group``'s channels by ``ratios`` (if they give two counts or
    more), the group queued for importance reordering and every member bound to it."""
    from autotailor.ir import for_module

    if len(width_choices(tuple(ratios), group.size, group.granularity)[0]) < 2:
        return
    # ordered, one channel at a time, whatever the configured multiple: it sets the counts only,
    # so one SuperNet's tuned weights fit its space with and without a multiple
    ctx.reorder.append(group)
    choices, chans = width_choices(tuple(ratios), group.size, math.lcm(group.granularity, ctx.config.channel_multiple))
    if len(choices) < 2:
        return
    name = ctx.name_for(name)
    ctx.variables.append(Variable(name, kind, choices, (f"g{len(ctx.reorder) - 1}",), block=block, values=chans))
    for m in group.members:
        node = ctx.nodes[m.node]
        if m.role == "param":
            ctx.bindings.append(Binding(m.node, "size", name, m.axis))
            continue
        dyn = for_module(ctx.gm.get_submodule(node.target)).dynamic
        if dyn is None:
            raise GraphError(f"{m.node}: {type(ctx.gm.get_submodule(node.target)).__name__} has a channel "
                             "rule but no dynamic operator")
        in_field, out_field = dyn.group_fields
        if m.role in ("in", "inout"):
            ctx.bindings.append(Binding(m.node, in_field, name))
        if m.role in ("out", "inout"):
            ctx.bindings.append(Binding(m.node, out_field, name))


def croppable_depthwise(conv: object) -> bool:
    """A depthwise conv with a square odd kernel and 'same' padding, which centre-cropping preserves."""
    if not isinstance(conv, nn.Conv2d) or not (conv.groups == conv.in_channels == conv.out_channels > 1):
        return False
    k = conv.kernel_size
    if k[0] != k[1] or k[0] < 3 or k[0] % 2 == 0 or conv.padding_mode != "zeros":
        return False
    if isinstance(conv.padding, str):
        return conv.padding == "same"
    return all(p == (k[0] // 2) * d for p, d in zip(conv.padding, conv.dilation))


@register_kind
class Kernel(VariableKind):
    """The kernel size of a depthwise convolution, centre-cropped (odd sizes up to its own)."""

    name = "kernel"
    settings = {"block_vars": "kernel_size"}

    def default(self, scope: str) -> tuple:
        return (3, 5, 7)

    def check(self, where: str, key: str, value: object) -> tuple:
        return numbers(where, key, value, int, lambda v: v >= 1 and v % 2 == 1, "odd kernel sizes >= 1")

    def plan(self, ctx: PlanContext) -> None:
        too_large: dict[str, set[int]] = {}
        for b in ctx.structure.blocks:
            if not b.template:
                continue
            wanted = ctx.config.block_choices(b.template, "kernel_size")
            for node in b.nodes:
                conv = ctx.gm.get_submodule(node.target) if node.op == "call_module" else None
                if not croppable_depthwise(conv):
                    continue
                k = conv.kernel_size[0]
                choices = tuple(sorted({c for c in wanted if c <= k and c % 2 == 1} | {k}))
                if max(wanted) > k and "kernel_size" in ctx.config.block_vars.get(b.template, {}):
                    too_large.setdefault(b.template, set()).add(k)
                if len(choices) < 2:
                    continue
                name = ctx.name_for(f"block{b.index}.kernel_size")
                ctx.variables.append(Variable(name, "kernel", choices, (node.name,),
                                              block=ctx.droppable_block(b.index)))
                ctx.bindings.append(Binding(node.name, "kernel_size", name))
        for template, kernels in too_large.items():
            log.warning("var.block_vars.%s.kernel_size: sizes above a convolution's own kernel (%s) are left out; "
                        "a kernel is only cropped, never grown", template, ", ".join(map(str, sorted(kernels))))


from autotailor.compiler import kinds as _more_kinds  # noqa: E402,F401  (registers the kinds in compiler/kinds/)
