"""Small helpers over torch.fx graphs that every layer above uses."""

from __future__ import annotations

import torch
import torch.fx as fx


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
