"""ONNX operators written as the torch operations a traced PyTorch model has.

onnx2torch turns each ONNX node into a module of its own: ``OnnxReshape`` to a shape that
``Shape``/``Slice``/``Concat`` nodes compute, ``OnnxMatMul`` by a weight and an ``Add`` of its
bias, ``OnnxTranspose``, ``OnnxSplit`` and ``Squeeze``. The passes that find attention heads
and the channel rules read torch's operations (``reshape``, ``transpose``, ``matmul``,
``nn.Linear``), so this pass rewrites each such module into them, with the values the example
input gives it:

- a shape computed from constants and sizes becomes literal sizes, except an axis carried
  through unchanged, which is read from the tensor at run time as a traced model reads it (so a
  narrower SubNet is reshaped right), and a size that grows with the batch (an export with a free
  batch axis: the graph is also run at twice the example's batch to tell), which is read from the
  tensor whose ``Shape`` the export took;
- a number computed from constants and sizes alone (the ``sqrt(1 / sqrt(d))`` that an export of
  ``scaled_dot_product_attention`` multiplies into q and into k) becomes a Python float.

Adding an operator is one ``@lowering``. Each operator's rewrites are checked on the example
input and undone if the model's output changes.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.graph import called_module as _module
from autotailor.ir.graph import calls as _is
from autotailor.ir.graph import free_name, from_input, get_attr, rewrite_checked


@dataclass
class _Values:
    """Every node's value on the example input, which nodes hold constants and sizes alone, and
    every node's value with the example's batch doubled (None where the model's batch is fixed)."""

    values: dict[str, object]
    static: set[str]
    doubled: dict[str, object] | None

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        return tuple(self.values[node.name].shape)

    def batched(self, node: fx.Node, axis: int) -> bool:
        """Whether axis ``axis`` of ``node`` grows with the batch."""
        return self.doubled is not None and self.doubled[node.name].shape[axis] != self.values[node.name].shape[axis]

    def size(self, gm: fx.GraphModule, node: fx.Node, axis: int, given: fx.Node) -> int | fx.Node:
        """Axis ``axis`` of ``node``, whose shape ``given`` computes: its size, or, where it grows
        with the batch, read at run time from the tensor whose ``Shape`` the export took (as the
        model's code read it), scaled as it is at the example."""
        n = self.shape(node)[axis]
        source = self._batch_source(given) if self.batched(node, axis) else None
        if source is None or self.doubled[node.name].shape[axis] != 2 * n:
            return n
        tensor, i = source
        m = self.shape(tensor)[i]
        if n % m and m % n:
            return n
        size = gm.graph.call_method("size", (tensor, i))
        if n == m:
            return size
        return gm.graph.call_function(operator.mul, (size, n // m)) if n > m else \
            gm.graph.call_function(operator.floordiv, (size, m // n))

    def _batch_source(self, given: fx.Node) -> tuple[fx.Node, int] | None:
        """A tensor whose ``Shape`` ``given`` is computed from, and its axis that holds the batch."""
        stack, seen = [given], set()
        while stack:
            n = stack.pop()
            if n in seen or not isinstance(n, fx.Node) or n.name not in self.static:
                continue
            seen.add(n)
            module = n.graph.owning_module.get_submodule(n.target) if n.op == "call_module" else None
            if type(module) is _SHAPE:
                tensor = n.args[0]
                axes = [i for i in range(len(self.shape(tensor))) if self.batched(tensor, i)]
                if axes:
                    return tensor, axes[0]
            stack.extend(n.all_input_nodes)
        return None

    def alias(self, new: fx.Node, old: fx.Node) -> None:
        """``new`` has ``old``'s values (for the operators lowered next)."""
        self.values[new.name] = self.values[old.name]
        if self.doubled is not None:
            self.doubled[new.name] = self.doubled[old.name]

    def number(self, arg: object) -> float | None:
        """``arg`` as a float, if constants and sizes alone compute it and it is one number."""
        value = self.values.get(arg.name) if isinstance(arg, fx.Node) and arg.name in self.static else None
        return float(value.reshape(())) if isinstance(value, torch.Tensor) and value.numel() == 1 else None


Lowering = Callable[[fx.GraphModule, fx.Node, _Values], "list | None"]
_LOWERINGS: dict[type, Lowering] = {}


def lowering(*types: type | None):
    """Register how to write a node calling a module of one of ``types`` as torch operations."""

    def deco(fn: Lowering) -> Lowering:
        for t in types:
            if t is not None:
                _LOWERINGS[t] = fn
        return fn

    return deco


def _onnx(module: str, name: str) -> type | None:
    try:
        return getattr(__import__(f"onnx2torch.node_converters.{module}", fromlist=[name]), name)
    except (ImportError, AttributeError):  # pragma: no cover - onnx2torch is a dependency
        return None


def _replace(node: fx.Node, new: fx.Node, v: _Values) -> list:
    """``new`` read wherever ``node`` was; it has ``node``'s value (for the operators lowered next)."""
    node.replace_all_uses_with(new)
    v.alias(new, node)
    return []


def _carried(before: tuple[int, ...], after: tuple[int, ...], j: int) -> int | None:
    """The input axis that output axis ``j`` of a reshape is: the same size, with as many
    elements before it. Prefers the axis at the same position (size-1 axes are ambiguous)."""
    lead = math.prod(after[:j])
    found = [i for i in range(len(before)) if before[i] == after[j] and math.prod(before[:i]) == lead]
    return j if j in found else (found[0] if found else None)


_SHAPE = _onnx("shape", "OnnxShape")


@lowering(_onnx("reshape", "OnnxReshape"))
def _reshape(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    x, shape = node.args[:2]
    if not isinstance(shape, fx.Node) or shape.name not in v.static:
        return None
    whole = shape.op == "call_module" and type(_module(gm, shape)) is _SHAPE and shape.args[0] is not x
    if whole and _module(gm, shape)._start == 0 and _module(gm, shape)._end is None:
        with gm.graph.inserting_before(node):  # to another tensor's shape (LeViT's bn(y.flatten(0, 1)) back)
            return _replace(node, gm.graph.call_method("reshape_as", (x, shape.args[0])), v)
    before, after = v.shape(x), v.shape(node)
    with gm.graph.inserting_before(node):
        sizes = []
        for j, size in enumerate(after):
            i = _carried(before, after, j)
            if i is not None and v.batched(x, i) != v.batched(node, j):
                i = None  # the same size at the example only: (N * B, C) to (N, B, C) at batch 1
            sizes.append(gm.graph.call_method("size", (x, i)) if i is not None else v.size(gm, node, j, shape))
        return _replace(node, gm.graph.call_method("reshape", (x, *sizes)), v)


@lowering(_onnx("expand", "OnnxExpand"))
def _expand(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    x, shape = node.args[:2]
    if not isinstance(shape, fx.Node) or shape.name not in v.static:
        return None
    before, after = v.shape(x), v.shape(node)
    with gm.graph.inserting_before(node):  # -1 keeps an axis; the batch one grows with is read at run time
        sizes = [-1 if len(before) == len(after) and before[j] == after[j] and not v.batched(node, j)
                 else v.size(gm, node, j, shape) for j in range(len(after))]
        return _replace(node, gm.graph.call_method("expand", (x, *sizes)), v)


@lowering(_onnx("transpose", "OnnxTranspose"))
def _transpose(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    x = node.args[0]
    rank = len(v.shape(x))
    perm = _module(gm, node).perm
    perm = list(range(rank))[::-1] if perm is None else [d % rank for d in perm]
    moved = [i for i, d in enumerate(perm) if d != i]
    with gm.graph.inserting_before(node):
        if len(moved) == 2:  # a swap of two axes, as models write k.transpose(-2, -1)
            return _replace(node, gm.graph.call_method("transpose", (x, *moved)), v)
        return _replace(node, gm.graph.call_method("permute", (x, *perm)), v)


@lowering(_onnx("matmul", "OnnxMatMul"))
def _matmul(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """By a weight matrix (what an export writes for a Linear on tokens): ``nn.Linear``, with the
    bias an ``Add`` after it adds; else ``a @ b``."""
    a, b = node.args[:2]
    weight = get_attr(gm, b.target) if isinstance(b, fx.Node) and b.op == "get_attr" and len(b.users) == 1 else None
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.is_floating_point()):
        with gm.graph.inserting_before(node):
            return _replace(node, gm.graph.call_function(operator.matmul, (a, b)), v)
    bias, out = None, node
    (user,) = node.users if len(node.users) == 1 else (None,)
    if type(_module(gm, user)) is _BINARY and _module(gm, user).math_op_function is torch.add:
        other = user.args[1] if user.args[0] is node else user.args[0]
        # a parameter, or computed from parameters alone (Swin V2 zeroes the keys' part of a copy)
        value = v.values[other.name] if isinstance(other, fx.Node) and not from_input(other) else None
        if isinstance(value, torch.Tensor) and value.shape == (weight.shape[1],) and len(other.users) == 1:
            bias, out = value, user
    linear = nn.Linear(weight.shape[0], weight.shape[1], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach().t().contiguous())
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().clone())
    target = free_name(gm, node.name.replace("mat_mul", "linear"))
    gm.add_submodule(target, linear)
    with gm.graph.inserting_before(node):
        return _replace(out, gm.graph.call_module(target, (a,)), v)


_BINARY = _onnx("binary_math_operations", "OnnxBinaryMathOperation")
_EXPAND, _CLIP, _REDUCE = _onnx("expand", "OnnxExpand"), _onnx("clip", "OnnxClip"), _onnx("reduce", "OnnxReduceStaticAxes")
_ARITHMETIC = {torch.add: operator.add, torch.sub: operator.sub, torch.mul: operator.mul}


@lowering(_BINARY)
def _binary(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    mod = _module(gm, node)
    fn = _ARITHMETIC.get(mod.math_op_function)
    if fn is None and getattr(mod.math_op_function, "__name__", "") == "_onnx_div":
        fn = operator.truediv
    value = v.values[node.name]
    if fn is None or mod.broadcast or not (isinstance(value, torch.Tensor) and value.is_floating_point()):
        return None
    numbers = [v.number(a) for a in node.args[:2]]
    args = [a if number is None else number for a, number in zip(node.args[:2], numbers)]
    eps = _l2_norm_floor(gm, *node.args[:2], v) if fn is operator.truediv else None
    with gm.graph.inserting_before(node):
        if eps is not None:  # what torch exports F.normalize as (Swin V2's cosine attention)
            return _replace(node, gm.graph.call_function(F.normalize, (args[0],), {"dim": -1, "eps": eps}), v)
        return _replace(node, gm.graph.call_function(fn, tuple(args)), v)


def _l2_norm_floor(gm: fx.GraphModule, x: object, den: object, v: _Values) -> float | None:
    """``eps`` where ``den`` is ``x``'s L2 norm over its last axis, floored at ``eps`` and
    expanded to ``x``'s shape (``x / den`` is then ``F.normalize(x, dim=-1, eps=eps)``)."""
    clip = den.args[0] if _is(den, {"expand"}) or type(_module(gm, den)) is _EXPAND else None
    norm = clip.args[0] if type(_module(gm, clip)) is _CLIP and _module(gm, clip).max_val is None else None
    reduce = _module(gm, norm)
    if not (type(reduce) is _REDUCE and reduce.operation_type == "ReduceL2" and reduce.keepdims
            and norm.args[0] is x and [a % len(v.shape(x)) for a in reduce.axes or ()] == [len(v.shape(x)) - 1]):
        return None
    return float(_module(gm, clip).min_val) if _module(gm, clip).min_val is not None else None


_SQUEEZES = tuple(t for t in (_onnx("squeeze", "OnnxSqueezeStaticAxes"), _onnx("squeeze", "OnnxSqueezeDynamicAxes"))
                  if t is not None)


def _squeezed_axes(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list[int] | None:
    """The axes a squeeze node removes (None: not a squeeze, or axes known only at run time)."""
    mod = _module(gm, node)
    if not isinstance(mod, _SQUEEZES):
        return None
    axes = getattr(mod, "axes", None)
    if len(node.args) > 1:
        given = node.args[1]
        axes = v.values[given.name].tolist() if isinstance(given, fx.Node) and given.name in v.static else None
    rank = len(v.shape(node.args[0]))
    return sorted(a % rank for a in axes) if axes else None


@lowering(_onnx("split", "OnnxSplit13"), _onnx("split", "OnnxSplit"))
def _split(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """Into pieces of one along an axis, each squeezed there: ``unbind`` (timm's q, k, v);
    otherwise ``split``."""
    x, axis = node.args[0], _module(gm, node).axis
    rank = len(v.shape(x))
    axis %= rank
    sizes = [piece.shape[axis] for piece in v.values[node.name]]
    users = list(node.users)
    if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
        return None
    squeezes = [w for u in users for w in u.users]
    unbind = set(sizes) == {1} and all(_squeezed_axes(gm, w, v) == [axis] for w in squeezes)
    with gm.graph.inserting_before(node):
        new = gm.graph.call_method("unbind", (x, axis)) if unbind else gm.graph.call_method("split", (x, sizes, axis))
    for u in users:
        u.args = (new, u.args[1])
        if unbind:
            for w in list(u.users):
                w.replace_all_uses_with(u)
                v.alias(u, w)
    return []


@lowering(_onnx("concat", "OnnxConcat"))
def _concat(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_function(torch.cat, (list(node.args), _module(gm, node).axis)), v)


@lowering(_onnx("slice", "OnnxSlice"))
def _slice(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """With constant bounds and positive steps: indexing by slices, the whole of an axis that
    it keeps (the channels) as ``:`` (Swin's windows cropped after padding, its shifts)."""
    x, *bounds = node.args
    if not all(isinstance(b, fx.Node) and b.name in v.static for b in bounds if b is not None):
        return None
    starts, ends = (v.values[b.name].tolist() for b in bounds[:2])
    given = [v.values[b.name].tolist() if b is not None else None for b in bounds[2:4]] + [None, None]
    axes, steps = given[0] or list(range(len(starts))), given[1] or [1] * len(starts)
    dims = v.shape(x)
    rank = len(dims)
    index = [slice(None)] * rank
    if min(steps) < 1:
        return None
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis %= rank
        begin, stop, _ = slice(start, end, step).indices(dims[axis])
        index[axis] = slice(None) if (begin, stop, step) == (0, dims[axis], 1) else slice(begin, stop, step)
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_function(operator.getitem, (x, tuple(index))), v)


@lowering(_onnx("pad", "OnnxPadDynamic"))
def _pad(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """With constant pads: ``F.pad`` (its pads from the last axis back), or nothing if all are zero
    (Swin pads its tokens to whole windows, by zero where they fit)."""
    x, pads, *value = node.args[:3]
    value = [v.number(c) for c in value if c is not None]  # the constant padded with, if given
    if not (isinstance(pads, fx.Node) and pads.name in v.static) or None in value:
        return None
    onnx_pads = [int(p) for p in v.values[pads.name].tolist()]
    rank = len(onnx_pads) // 2
    torch_pads = [p for axis in reversed(range(rank)) for p in (onnx_pads[axis], onnx_pads[axis + rank])]
    if not any(torch_pads):
        return _replace(node, x, v)
    while not any(torch_pads[-2:]):  # leading axes left alone, as a model writes F.pad(v, (0, 1))
        torch_pads = torch_pads[:-2]
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_function(F.pad, (x, tuple(torch_pads)), {
            "mode": _module(gm, node).mode, **({"value": value[0]} if value else {})}), v)


@lowering(_onnx("gather", "OnnxGather"))
def _gather(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """By constant indices: indexing, ``x[:, 0]`` (the class token) or ``x[:, idx]`` (LeViT's
    attention biases by a table of indices, kept as a node)."""
    x, index = node.args[:2]
    if not (isinstance(index, fx.Node) and (index.name in v.static or index.op == "get_attr")):
        return None
    value = v.values.get(index.name)
    if not (isinstance(value, torch.Tensor) and not value.is_floating_point()):
        return None
    axis = _module(gm, node)._axis % len(v.shape(x))
    item = int(value) if value.dim() == 0 else index
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_function(operator.getitem, (x, (slice(None),) * axis + (item,))), v)


@lowering(_onnx("flatten", "OnnxFlatten"))
def _flatten(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """To two axes, those before ``axis`` and the rest: ``flatten`` (LeViT's tokens of a batch
    into one axis for its BatchNorm)."""
    x = node.args[0]
    rank, axis = len(v.shape(x)), _module(gm, node).axis % (len(v.shape(x)) + 1)
    if axis == 0:
        return None
    with gm.graph.inserting_before(node):
        out = gm.graph.call_method("flatten", (x, 0, axis - 1)) if axis > 1 else x
        if rank - axis > 1:
            out = gm.graph.call_method("flatten", (out, 1))
        return _replace(node, out, v)


@lowering(*_SQUEEZES)
def _squeeze(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """With constant axes (those a split into pieces of one leaves are lowered with it)."""
    axes = _squeezed_axes(gm, node, v)
    if axes is None:
        return None
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_method("squeeze", (node.args[0], tuple(axes))), v)


@lowering(_onnx("unsqueeze", "OnnxUnsqueezeStaticAxes"))
def _unsqueeze(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    out = node.args[0]
    with gm.graph.inserting_before(node):
        for axis in _module(gm, node)._axes:  # sorted: each counted in the output's rank, as ONNX does
            out = gm.graph.call_method("unsqueeze", (out, axis))
        return _replace(node, out, v)


@lowering(_onnx("einsum", "OnnxEinsum"))
def _einsum(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """``torch.einsum`` (MaxViT's products), which a later pass writes as ``matmul``."""
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_function(torch.einsum, (_module(gm, node).equation, *node.args)), v)


@lowering(_onnx("functions", "OnnxFunction"))
def _function(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """An elementwise function (Tanh, Exp, Sqrt, ...): the torch function it calls (MaxViT's head's
    ``tanh``)."""
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_function(_module(gm, node).function, tuple(node.args)), v)


@lowering(_onnx("cast", "OnnxCast"))
def _cast(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """``x.to(dtype)`` (EfficientViT computes its attention in float32)."""
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_method("to", (node.args[0], _module(gm, node).torch_dtype)), v)


@lowering(_onnx("gemm", "OnnxGemm"))
def _gemm(gm: fx.GraphModule, node: fx.Node, v: _Values) -> list | None:
    """``a @ B (+ c)`` by a constant matrix and bias: ``nn.Linear`` (onnx2torch makes one itself
    only where both are initializers; an export that shares the bias with another node passes it
    through an ``Identity``)."""
    mod = _module(gm, node)
    a, b, *c = node.args
    consts = [x for x in (b, *c) if isinstance(x, fx.Node) and not from_input(x)]
    if mod.trans_a or len(consts) != 1 + len(c) or v.values[b.name].dim() != 2 or \
            (c and v.values[c[0].name].dim() != 1):
        return None
    weight = v.values[b.name] if mod.trans_b else v.values[b.name].t()
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bool(c), device="meta")
    linear.weight = nn.Parameter((weight.detach() * mod.alpha).contiguous())
    if c:
        linear.bias = nn.Parameter(v.values[c[0].name].detach() * mod.beta)
    target = free_name(gm, node.name.replace("gemm", "linear"))
    gm.add_submodule(target, linear)
    with gm.graph.inserting_before(node):
        return _replace(node, gm.graph.call_module(target, (a,)), v)


def _run(gm: fx.GraphModule, example: torch.Tensor) -> dict[str, object]:
    values: dict[str, object] = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> object:
            values[n.name] = result = super().run_node(n)
            return result

    with torch.no_grad():
        Recorder(gm).run(example)
    return values


def _evaluate(gm: fx.GraphModule, example: torch.Tensor) -> _Values:
    values = _run(gm, example)
    try:  # which sizes an export computes from the batch (a model exported with a dynamic batch)
        doubled = _run(gm, torch.cat([example, example]))
    except Exception:  # a fixed batch
        doubled = None
    static: set[str] = set()
    for n in gm.graph.nodes:
        if n.op == "call_module" and (type(_module(gm, n)) is _SHAPE
                                      or all(a.name in static for a in n.all_input_nodes)):
            static.add(n.name)
        elif n.op == "call_function" and n.all_input_nodes and all(a.name in static for a in n.all_input_nodes):
            static.add(n.name)
    return _Values(values, static, doubled)


def lower_onnx_modules(gm: fx.GraphModule, example: torch.Tensor) -> int:
    """Write onnx2torch's modules in ``gm`` as torch operations where a ``@lowering`` applies, in
    place; each operator's rewrites are kept only if the output on ``example`` stays the same.
    Returns how many nodes were rewritten."""
    if not any(type(_module(gm, n)) in _LOWERINGS for n in gm.graph.nodes):
        return 0
    v = _evaluate(gm, example)
    count = 0
    for kind, lower in _LOWERINGS.items():  # in registration order: a MatMul's bias Add before the Adds
        nodes = [n for n in gm.graph.nodes if type(_module(gm, n)) is kind and n.name not in v.static]
        count += rewrite_checked(gm, example, nodes, lambda g, n, lower=lower: lower(g, n, v),
                                 f"ONNX {kind.__name__} as torch operations")
    gm.delete_all_unused_submodules()
    return count
