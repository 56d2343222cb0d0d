"""Operator handlers: everything AutoTailor knows about one operator type, in one object.

A handler is registered for module types, functions or method names (``@register``) and
holds every facet of its operator that a pass needs:

==============  =====================================================================
facet           used by
==============  =====================================================================
``channels``    channel-group analysis: how the op maps its inputs' channel groups to
                its output, and which of its weights index each group (``Member``)
``importance``  importance reordering: the tensors (and axes) that hold a member's channels
``structure``   block parsing: ``dense``, ``dwconv``, ``norm``, ``act`` or ``other``
``role``        template matching: what a template counts (``conv``, ``linear``, ...)
``same_shape``  shape deduction: the output has the input's shape (no meta kernel run)
``kind``        kernel enumeration and fusion rules: the operation's canonical name
``describe``    the kernel signature: attributes that do not change with width
``facts``       what ``costs`` needs of the layer (kernel size, groups, bias, parameters)
``costs``       counted MACs and parameters from the shapes
``dynamic``     how it is sliced: the ``Operator`` class that replaces the layer, or None
==============  =====================================================================

Family bases (``Elementwise``, ...) give the facets a family shares; a handler defines the
rest. ``tests/test_handlers.py`` walks the registry and fails for a handler lacking a facet.
Operators without a handler get ``DEFAULT``: they fix every channel group they touch, so
width changes only where every user of the channels is known to slice consistently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
import torch.fx as fx
import torch.nn as nn

if TYPE_CHECKING:  # the analysis lives in the compiler, a layer above
    from autotailor.compiler.channels import ChannelAnalysis
    from autotailor.ir.operators import Operator

FACETS = ("channels", "importance", "structure", "role", "same_shape", "kind", "describe", "facts", "costs",
          "dynamic")

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Member:
    """One place that indexes a channel group.

    ``role`` is ``out`` (produces the channels: conv/linear output), ``in`` (consumes them:
    conv/linear input), ``inout`` (maps channel i to channel i: BatchNorm, LayerNorm,
    depthwise/grouped conv), ``param`` (a parameter used elementwise, sliced on ``axis``) or
    ``table`` (a layer's outputs that are reordered with a group, never sliced: one per head).
    """

    node: str
    role: str
    axis: int = 0


@dataclass(frozen=True)
class Track:
    """Where a tensor's channels are: which axis, and the channel group (its id) they belong to."""

    axis: int
    gid: int


class OpHandler:
    """Base of every handler. It defines no facet: a handler inherits them from a family base
    or defines them itself (see the module docstring for what each one is)."""

    keys: ClassVar[tuple[object, ...]] = ()

    def __repr__(self) -> str:
        return type(self).__name__


_MODULES: dict[type, OpHandler] = {}
_FUNCTIONS: dict[object, OpHandler] = {}
_METHODS: dict[str, OpHandler] = {}


def register(*keys: object) -> Callable[[type[OpHandler]], type[OpHandler]]:
    """Register one instance of the decorated handler class for ``keys``: module types,
    functions, or method names (strings)."""

    def deco(cls: type[OpHandler]) -> type[OpHandler]:
        handler = cls()
        cls.keys = cls.keys + tuple(keys)
        for key in keys:
            if isinstance(key, str):
                _METHODS[key] = handler
            elif isinstance(key, type) and issubclass(key, nn.Module):
                _MODULES[key] = handler
            else:
                _FUNCTIONS[key] = handler
        return cls

    return deco


Rewrite = Callable[[fx.GraphModule, torch.Tensor], int]
_REWRITES: list[Rewrite] = []


def register_rewrite(fn: Rewrite) -> Rewrite:
    """Register a graph rewrite that turns a subgraph into one operator (multi-head attention):
    ``fn(gm, example)`` changes ``gm`` in place, keeps its output on ``example`` and returns how
    many it rewrote. The compiler runs every rewrite after parsing operators."""
    _REWRITES.append(fn)
    return fn


def rewrites() -> list[Rewrite]:
    return list(_REWRITES)


def registered() -> list[OpHandler]:
    """Every registered handler, once each."""
    seen: dict[int, OpHandler] = {}
    for table in (_MODULES, _FUNCTIONS, _METHODS):
        for h in table.values():
            seen.setdefault(id(h), h)
    return list(seen.values())


def for_module(module: nn.Module) -> OpHandler:
    """The handler of ``module``'s type; subclasses share their base's (a Conv2d subclass is a Conv2d)."""
    for cls in type(module).__mro__:
        if cls in _MODULES:
            return _MODULES[cls]
    return DEFAULT


def for_node(gm: fx.GraphModule, node: fx.Node) -> OpHandler:
    """The handler of the operation ``node`` calls (``DEFAULT`` if none is registered)."""
    if node.op == "call_module":
        return for_module(gm.get_submodule(node.target))
    if node.op == "call_function":
        return _FUNCTIONS.get(node.target, DEFAULT)
    if node.op == "call_method":
        return _METHODS.get(node.target, DEFAULT)
    return DEFAULT


def target_name(target: Any) -> str:
    """The canonical name of a function or method: ``F.relu`` and ``"relu_"`` -> ``relu``."""
    name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    return name.strip("_").lower()


# -- family bases ------------------------------------------------------------------------------------
class _NoWeights:
    """Facets of operations without weights of their own."""

    dynamic = None

    def importance(self, module: nn.Module, role: str) -> list[tuple[torch.Tensor, int]]:
        return []

    def facts(self, module: nn.Module | None) -> dict[str, Any]:
        return {}

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        return 0, 0


class _Named:
    """Kind and description: a module's type name and ``extra_repr``; a function's name."""

    def kind(self, module: nn.Module | None, target: object = None) -> str:
        return type(module).__name__.lower() if module is not None else target_name(target)

    def describe(self, module: nn.Module) -> str:
        return module.extra_repr()


class Default(_NoWeights, _Named, OpHandler):
    """An operator AutoTailor knows nothing about: it fixes the channels it touches and
    counts the parameters it holds."""

    role = ""
    same_shape = False

    def channels(self, a: "ChannelAnalysis", node: fx.Node) -> Track | None:
        a.fix_inputs(node, f"used by {node.name} ({describe_target(node)}), which has no channel rule")
        return None

    def structure(self, module: nn.Module | None) -> str:
        return "other"

    def facts(self, module: nn.Module | None) -> dict[str, Any]:
        return {"params": sum(p.numel() for p in module.parameters())} if module is not None else {}

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        return 0, facts.get("params", 0)


DEFAULT = Default()


class Elementwise(_NoWeights, _Named, OpHandler):
    """Family base of weightless operations on tensors (activations, pooling, arithmetic,
    shape changes); a handler adds ``channels`` (and overrides what differs)."""

    role = ""
    same_shape = False

    def structure(self, module: nn.Module | None) -> str:
        return "other"


def describe_target(node: fx.Node) -> str:
    if node.op == "call_module":
        return type(node.graph.owning_module.get_submodule(node.target)).__name__
    return getattr(node.target, "__name__", str(node.target))


def conv_macs_params(out: Shape, per_out: int, kernel: int, bias: bool) -> tuple[int, int]:
    """MACs and parameters of a 2-D convolution producing ``out`` from ``per_out`` input channels
    per output channel with a ``kernel`` x ``kernel`` window."""
    return math.prod(out) * per_out * kernel * kernel, out[1] * per_out * kernel * kernel + (out[1] if bias else 0)


def weight_importance(module: nn.Module, role: str) -> list[tuple[torch.Tensor, int]]:
    """The channel-indexing tensors of a layer with a ``weight[out, in, ...]`` and an optional
    ``bias[out]`` (convolutions, linear layers): rows and bias for what it produces, columns for
    what it reads."""
    if role == "in":
        return [(module.weight, 1)]
    return [(module.weight, 0)] + ([(module.bias, 0)] if module.bias is not None else [])


def lift(module: nn.Module) -> "Operator":
    """The dynamic operator for ``module`` (its handler's ``dynamic``), sharing its parameters."""
    dyn = for_module(module).dynamic
    if dyn is None:
        from autotailor.errors import GraphError

        raise GraphError(f"{type(module).__name__} has no dynamic operator: its handler cannot slice it")
    return dyn.from_module(module)
