"""Shape propagation over a traced graph, shared by the compiler passes."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from autotailor.errors import GraphError
from autotailor.ir.shapes import run_meta
from autotailor.ir.walk import GraphWalker


def _record(name: str, n: fx.Node, value: object) -> None:
    # Activations are floating point; integer tensors are shapes and indices (ONNX's Shape op).
    n.meta["has_tensor"] = any(
        isinstance(v, torch.Tensor) and v.is_floating_point() for v in torch.utils._pytree.tree_leaves(value)
    )
    if isinstance(value, torch.Tensor):
        n.meta["tensor_meta"] = _extract_tensor_metadata(value)
    else:
        n.meta.pop("tensor_meta", None)
    # A number computed from sizes (torchvision's Swin: its attention scale, (C // heads) ** -0.5)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        n.meta["number"] = value
    else:
        n.meta.pop("number", None)


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


def run_error(gm: fx.GraphModule, example: torch.Tensor) -> str | None:
    """Why ``gm`` does not accept ``example`` (the first line of the error), or None if it does:
    checked on meta tensors (no arithmetic), else by one real run for graphs that compute shapes
    from data. Run through the graph walker, so torch.fx prints no traceback of its own and the
    error names the node."""
    try:
        run_meta(gm, example)
        return None
    except Exception:
        pass
    try:
        with torch.no_grad():
            GraphWalker(gm).run(example)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
