"""The graph walker: a SuperNet's graph in execution order, droppable blocks inlined.

``GraphWalker`` is a ``torch.fx.Interpreter`` whose values can be anything a pass computes
(meta tensors for shape deduction, nodes of a new graph for extraction, names for kernel
enumeration). A ``Block`` call is not a call: the walker runs the block's body in its place
(or passes its input on when the block is disabled and ``inline_disabled`` is off). Every node
has one name, ``prefix + node.name``, where a block's body has the prefix ``blockN.body.``; all
passes use it. A pass overrides ``visit`` (and, if it needs, the opcode methods); errors are
re-raised with the name of the node that failed.
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

from autotailor.errors import GraphError
from autotailor.ir.block import Block


class GraphWalker(fx.Interpreter):
    """Walks ``gm`` (a SuperNet's graph or a block's body). ``block`` is the index of the
    droppable block being walked (None at the top level)."""

    inline_disabled = False  # walk disabled blocks too (every block kept)

    def __init__(self, gm: fx.GraphModule, prefix: str = "", block: int | None = None, parent: "GraphWalker | None" = None):
        super().__init__(gm, garbage_collect_values=False)
        self.prefix, self.block, self.parent = prefix, block, parent
        self.node: fx.Node | None = None

    def name_of(self, n: fx.Node) -> str:
        """The node's one name across the inlined graph."""
        return self.prefix + n.name

    def child(self, body: fx.GraphModule, prefix: str, block: int) -> "GraphWalker":
        """The walker of a block's body: the same pass, state shared through ``parent``."""
        return type(self)(body, prefix, block, self)

    def run_node(self, n: fx.Node) -> Any:
        self.node = n
        try:
            value = super().run_node(n)
        except GraphError:
            raise
        except Exception as exc:
            raise GraphError(f"at node {self.name_of(n)} ({n.op} {n.target}): {type(exc).__name__}: {exc}") from exc
        self.visit(n, value)
        return value

    def visit(self, n: fx.Node, value: Any) -> None:
        """Called after each node of the inlined graph with its value (a block's call too, after
        the nodes of its body)."""

    def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
        mod = self.fetch_attr(target)
        if isinstance(mod, Block):
            if not (mod.feature.active.enabled or self.inline_disabled):
                return args[0]
            return self.child(mod.body, f"{self.prefix}{target}.body.", mod.index).run(args[0])
        return self.call_layer(target, mod, args, kwargs)

    def call_layer(self, target: str, mod: Any, args: tuple, kwargs: dict) -> Any:
        """A module call that is not a block."""
        return super().call_module(target, args, kwargs)
