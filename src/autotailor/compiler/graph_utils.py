"""Small helpers over torch.fx graphs shared by the compiler passes."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from autotailor.errors import GraphError
from autotailor.ir.shapes import run_meta


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
    """The tensor shape recorded by ``propagate_shapes``, or None for non-tensors."""
    if not isinstance(node, fx.Node):
        return None
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return tuple(shape) if shape is not None else None


def _record(prefix: str, n: fx.Node, value: object) -> None:
    # Activations are floating point; integer tensors are shapes and indices (ONNX's Shape op).
    n.meta["has_tensor"] = any(
        isinstance(v, torch.Tensor) and v.is_floating_point() for v in torch.utils._pytree.tree_leaves(value)
    )
    if isinstance(value, torch.Tensor):
        n.meta["tensor_meta"] = _extract_tensor_metadata(value)
    else:
        n.meta.pop("tensor_meta", None)


def carries_tensors(node: fx.Node) -> bool:
    """Whether the node's value holds a floating-point tensor (not only sizes, indices or
    other Python values)."""
    return node.meta.get("has_tensor", True)


class _RealRecorder(fx.Interpreter):
    def run_node(self, n: fx.Node) -> object:
        result = super().run_node(n)
        _record("", n, result)
        return result


def propagate_shapes(gm: fx.GraphModule, example: torch.Tensor) -> None:
    """Record every node's output shape in ``node.meta['tensor_meta']`` without computing anything.

    Runs the graph on meta tensors (shapes only). Graphs that compute shapes from data at
    run time (the Reshapes of some ONNX exports) fall back to one real run of the example.
    """
    try:
        run_meta(gm, example, _record)
        return
    except Exception:
        pass
    try:
        with torch.no_grad():
            _RealRecorder(gm).run(example)
    except Exception as exc:
        raise GraphError(
            f"the traced graph does not run on an input of shape {tuple(example.shape)}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
            "Pass an example input of the shape the model expects (N, C, H, W)."
        ) from exc


def runs_at(gm: fx.GraphModule, example: torch.Tensor) -> bool:
    """Whether ``gm`` accepts ``example``: checked on meta tensors (no arithmetic), or by one
    real run for graphs that compute shapes from data."""
    try:
        run_meta(gm, example)
        return True
    except Exception:
        pass
    try:
        with torch.no_grad():
            gm(example)
        return True
    except Exception:
        return False
