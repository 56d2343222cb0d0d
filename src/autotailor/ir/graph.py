"""Small helpers over torch.fx graphs that every layer above uses."""

from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.fx as fx

log = logging.getLogger(__name__)


def get_attr(root: torch.nn.Module, target: str) -> object:
    """The attribute at dotted path ``target`` (``layer1.0.conv1.weight``) below ``root``."""
    owner, _, name = target.rpartition(".")
    return getattr(root.get_submodule(owner) if owner else root, name)


def set_attr(root: torch.nn.Module, target: str, value: object) -> None:
    """Set the attribute at dotted path ``target`` below ``root`` (a module, a parameter, ...)."""
    owner, _, name = target.rpartition(".")
    setattr(root.get_submodule(owner) if owner else root, name, value)


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    """Every node among ``node``'s arguments, nested lists and dicts included."""
    found: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda n: found.append(n))
    return found


def node_shape(node: object) -> tuple[int, ...] | None:
    """The tensor shape recorded by shape propagation, or None for non-tensors."""
    if not isinstance(node, fx.Node):
        return None
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return tuple(shape) if shape is not None else None


def called_module(gm: torch.nn.Module, node: object) -> torch.nn.Module | None:
    """The module a ``call_module`` node calls, or None for any other node or value."""
    return gm.get_submodule(node.target) if isinstance(node, fx.Node) and node.op == "call_module" else None


def calls(node: object, targets: set) -> bool:
    """Whether ``node`` calls one of ``targets`` (functions, or method names)."""
    return isinstance(node, fx.Node) and node.op in ("call_function", "call_method") and node.target in targets


def carries_tensors(node: fx.Node) -> bool:
    """Whether the node's value holds a floating-point tensor (not only sizes, indices or
    other Python values)."""
    return node.meta.get("has_tensor", True)


def bind(node: fx.Node, names: tuple[str, ...]) -> dict[str, object]:
    """``node``'s positional arguments named by ``names``, with its keyword arguments."""
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    return bound


def from_input(node: fx.Node, flow: set[fx.Node] | frozenset[fx.Node] = frozenset()) -> bool:
    """Whether ``node`` depends on the graph's input at all (a placeholder, or a node of ``flow``,
    tensors or shapes); False for what parameters and constants alone compute."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in flow or n.op == "placeholder":
            return True
        for a in n.all_input_nodes:
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return False


Undo = Callable[[], None]


def free_name(gm: fx.GraphModule, name: str) -> str:
    """``name``, or ``name1``, ``name2``, ... : the first that is not a submodule of ``gm``."""
    cand, i = name, 1
    while True:
        try:
            gm.get_submodule(cand)
        except AttributeError:
            return cand
        cand, i = f"{name}{i}", i + 1


def rewrite_checked(gm: fx.GraphModule, example: torch.Tensor, candidates: list[fx.Node],
                    rewrite: Callable[[fx.GraphModule, fx.Node], list[Undo] | None], what: str) -> int:
    """Apply ``rewrite(gm, node)`` to each of ``candidates`` (it returns None where it does not
    apply, else what undoes its changes to modules), in place; then run ``gm`` on ``example``,
    and undo it all if the output changed. Returns how many were rewritten."""
    if not candidates:
        return 0
    with torch.no_grad():
        reference = gm(example)
    saved = gm.graph
    gm.graph = _copy_graph(saved)
    nodes = {n.name: n for n in gm.graph.nodes}
    undo: list[Undo] = []
    count = 0
    for c in candidates:
        done = rewrite(gm, nodes[c.name])
        if done is not None:
            undo += done
            count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
        with torch.no_grad():
            result = gm(example)
        if torch.allclose(result, reference, rtol=1e-4, atol=1e-5 * float(reference.abs().max()) + 1e-6):
            gm.graph.lint()
            log.info("recognised %d %s", count, what)
            return count
        log.warning("%s recognised at %s does not reproduce the model (max difference %.3g); left as it is", what,
                    ", ".join(c.name for c in candidates), float((result - reference).abs().max()))
    for step in reversed(undo):
        step()
    gm.graph = saved
    gm.recompile()
    return 0


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph(owning_module=graph.owning_module)
    out = new.graph_copy(graph, {})
    new.output(out)
    return new
