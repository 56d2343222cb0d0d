"""Block templates: topological patterns with default modification choices.

A template is generic over the operators it contains (the paper's *Path* abstraction): it
names a family of blocks by what their paths hold (dense / depthwise convolutions, norms,
gates, attention), not by the classes of one model zoo. Adding a template is one
``@template`` function; the first template that matches wins, specific templates (in
registration order) before the generic fallbacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.structure import BlockInfo, math_target
from autotailor.errors import ConfigError
from autotailor.ir import handlers
from autotailor.ir.ops.elementwise import MUL_TARGETS

@dataclass(frozen=True)
class Template:
    name: str
    match: Callable[["BlockView"], bool]
    defaults: dict[str, tuple]  # block variable -> default choices, where they differ from the kind's
    generic: bool = False  # a fallback, tried after every specific template


@dataclass
class BlockView:
    """What a template matcher sees of a block."""

    kind: str
    identity: bool
    convs: list[nn.Conv2d]
    linears: int
    layer_norms: int
    batch_norms: int
    gates: int
    attention: int

    @property
    def dense_convs(self) -> list[nn.Conv2d]:
        return [c for c in self.convs if c.groups == 1]

    @property
    def depthwise(self) -> list[nn.Conv2d]:
        return [c for c in self.convs if c.groups > 1 and c.groups == c.in_channels == c.out_channels]

    @property
    def residual(self) -> bool:
        return self.kind == "residual"


_TEMPLATES: list[Template] = []


def template(name: str, generic: bool = False, before: str | None = None,
             **defaults: tuple) -> Callable[[Callable[[BlockView], bool]], Callable[[BlockView], bool]]:
    """Register a template ``name`` whose matcher is the decorated function. Specific templates
    are tried in registration order (a template registered ``before`` another is tried ahead of
    it), then the ``generic`` fallbacks (any residual block, ...)."""

    def deco(match: Callable[[BlockView], bool]) -> Callable[[BlockView], bool]:
        names = [t.name for t in _TEMPLATES]
        if before is not None and before not in names:
            raise ConfigError(f"template {name!r}: before={before!r} is not a template; templates are {names}")
        at = names.index(before) if before is not None else len(_TEMPLATES)
        _TEMPLATES.insert(at, Template(name, match, dict(defaults), generic))
        return match

    return deco


def templates() -> list[Template]:
    """Every template, in matching order: the specific ones, then the generic ones."""
    return [t for t in _TEMPLATES if not t.generic] + [t for t in _TEMPLATES if t.generic]


def template_names() -> list[str]:
    return [t.name for t in templates()]


def view(gm: fx.GraphModule, block: BlockInfo) -> BlockView:
    """What ``block`` holds, counted by its operators' handlers' ``role``."""
    convs, counts = [], {"linear": 0, "layernorm": 0, "batchnorm": 0, "attention": 0}
    gates = 0
    for node in block.nodes:
        if node.op in ("call_module", "call_function", "call_method"):
            role = handlers.for_node(gm, node).role
            if role == "conv":
                convs.append(gm.get_submodule(node.target))
            elif role in counts:
                counts[role] += 1
            elif node.op != "call_module" and "attention" in getattr(node.target, "__name__", ""):
                counts["attention"] += 1  # a wrapped attention function (Swin's)
        if node.op != "placeholder" and _is_gate(gm, node):
            gates += 1
    return BlockView(block.kind, block.identity, convs, counts["linear"], counts["layernorm"], counts["batchnorm"],
                     gates, counts["attention"])


def _is_gate(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A multiplication of a tensor by something computed from that same tensor (squeeze-excite)."""
    if math_target(gm, node) not in MUL_TARGETS or len(node.all_input_nodes) != 2:
        return False
    a, b = node.all_input_nodes
    return _depends_on(b, a) or _depends_on(a, b)


def _depends_on(node: fx.Node, ancestor: fx.Node, limit: int = 12) -> bool:
    frontier, seen = [node], set()
    while frontier and limit:
        limit -= 1
        nxt = []
        for n in frontier:
            for p in n.all_input_nodes:
                if p is ancestor:
                    return True
                if p not in seen:
                    seen.add(p)
                    nxt.append(p)
        frontier = nxt
    return False


def match(gm: fx.GraphModule, block: BlockInfo, allowed: set[str] | None) -> Template | None:
    """The first registered template that matches ``block`` (among ``allowed``, if given)."""
    v = view(gm, block)
    for t in templates():
        if (allowed is None or t.name in allowed) and t.match(v):
            return t
    return None


@template("ConvNeXtBlock")
def _convnext(v: BlockView) -> bool:
    return v.residual and len(v.depthwise) == 1 and v.layer_norms >= 1 and v.batch_norms == 0 and not v.attention


@template("InvertedResidualSEBlock")
def _inverted_residual_se(v: BlockView) -> bool:
    return len(v.depthwise) == 1 and v.gates >= 1 and v.batch_norms >= 1 and v.kind != "branch"


@template("InvertedResidualBlock")
def _inverted_residual(v: BlockView) -> bool:
    return len(v.depthwise) == 1 and v.gates == 0 and v.batch_norms >= 1 and v.kind != "branch"


@template("AttentionBlock")
def _attention(v: BlockView) -> bool:
    return v.residual and v.attention >= 1


@template("FFNBlock")
def _ffn(v: BlockView) -> bool:
    return v.residual and v.linears == 2 and not v.convs and v.layer_norms >= 1


@template("BottleneckBlock")
def _bottleneck(v: BlockView) -> bool:
    k1 = [c for c in v.convs if c.kernel_size[0] == 1 and c.groups == 1]
    kx = [c for c in v.convs if c.kernel_size[0] > 1]
    return v.residual and not v.depthwise and len(kx) == 1 and len(k1) >= 2


@template("BasicBlock")
def _basic(v: BlockView) -> bool:
    kx = [c for c in v.dense_convs if c.kernel_size[0] > 1]
    k1 = [c for c in v.dense_convs if c.kernel_size[0] == 1]
    return v.residual and len(kx) == 2 and len(k1) <= 1 and len(v.convs) == len(kx) + len(k1)


@template("ResidualBlock", generic=True)
def _residual(v: BlockView) -> bool:
    return v.residual


@template("BranchBlock", generic=True)
def _branch(v: BlockView) -> bool:
    return v.kind == "branch"


@template("ChainBlock", generic=True)
def _chain(v: BlockView) -> bool:
    return True
