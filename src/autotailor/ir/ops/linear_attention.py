"""Linear attention over heads (EfficientViT's LiteMLA), found by topology and made one operator
whose heads can be dropped.

EfficientViT projects its input with a 1x1 convolution whose output channels are head-major
(``[head][q, k, v][dim]``), aggregates them at more scales (a depthwise and a grouped
convolution, each mapping a head's channels to the same head's), concatenates the scales and
splits every scale's heads again: ``reshape(B, -1, 3 * dim, H * W)``, ``chunk(3)``. Each head
then attends linearly, ``relu(q) @ (relu(k)^T @ [v, 1])``, normalised by the last column, and
the heads are merged scale-major, ``[scale][head][dim]``, for the output convolution.

``recognise_linear_attention`` replaces that stretch by ``LinearHeadAttention``, which reads the
scales' projections (before the concatenation) and gives its output head-major,
``[head][scale][dim]``; the output convolution's input channels are permuted to match. So the
first ``h`` heads are a leading slice of every tensor around it, and the ``heads`` kind drops
whole heads as it does for softmax attention. The rewrite is checked on the example input and
undone if the model's output changes.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.frontends import without_fixed_inputs
from autotailor.ir.graph import bind, free_name, node_shape, rewrite_checked
from autotailor.ir.graph import calls as _is
from autotailor.ir.handlers import Member, Shape, Track, register, register_rewrite
from autotailor.ir.ops.attention import HeadAttention, HeadAttentionHandler, HeadsSpec
from autotailor.ir.ops.attention_pattern import (last_axis_chunk3, last_axis_span, read_inside, slice_thirds,
                                                 value_readers)
from autotailor.ir.operators import Operator

log = logging.getLogger(__name__)

MAX_SCALES = 4  # inputs the operator takes: the projection and its aggregations


class LinearHeadAttention(HeadAttention):
    """``kernel(q) @ (kernel(k)^T @ [v, 1])``, each head's rows divided by their last column plus
    ``eps``, for each of up to ``MAX_SCALES`` inputs of shape (B, heads * 3 * head_dim, H, W),
    head-major ``[head][q, k, v][dim]``. Returns (B, heads * scales * head_dim, H, W), head-major
    ``[head][scale][dim]``."""

    def __init__(self, num_heads: int, head_dim: int, scales: int, eps: float, kernel: nn.Module):
        super().__init__(num_heads, head_dim, head_dim, None, fused=True)
        self.scales, self.eps, self.kernel = scales, eps, kernel

    def inputs(self) -> list[tuple[str, ...]]:
        return [("q", "k", "v")] * self.scales

    def forward(self, x0: torch.Tensor, x1: torch.Tensor | None = None, x2: torch.Tensor | None = None,
                x3: torch.Tensor | None = None) -> torch.Tensor:
        return self._linear([x for x in (x0, x1, x2, x3) if x is not None], self.num_heads, self.head_dim)

    def _linear(self, xs: list[torch.Tensor], h: int, d: int) -> torch.Tensor:
        outs = []
        for x in xs:
            t = x.flatten(2).unflatten(1, (h, 3 * d)).transpose(-1, -2)  # (B, h, N, 3d)
            q, k, v = t.split([d, d, d], -1)
            q, k = self.kernel(q), self.kernel(k)
            v = F.pad(v, (0, 1), mode="constant", value=1.0)
            o = q @ (k.transpose(-1, -2) @ v)
            outs.append(o[..., :-1] / (o[..., -1:] + self.eps))  # (B, h, N, d)
        merged = torch.stack(outs, 2).transpose(-1, -2).flatten(1, 3)  # (B, h * scales * d, N)
        return merged.unflatten(-1, xs[0].shape[-2:])


class DynLinearHeadAttention(Operator, LinearHeadAttention):
    """``LinearHeadAttention`` over its first ``num_heads`` heads (its inputs arrive sliced)."""

    group_fields = ("num_heads", "num_heads")

    def _meta_spec(self) -> HeadsSpec:
        return HeadsSpec(self.num_heads, self.head_dim, self.v_dim)

    def forward(self, x0, x1=None, x2=None, x3=None) -> torch.Tensor:
        a = self.feature.active
        return self._linear([x for x in (x0, x1, x2, x3) if x is not None], a.num_heads, a.head_dim)

    def infer(self, shape: Shape) -> Shape:
        a = self.feature.active
        return (shape[0], a.num_heads * self.scales * a.head_dim, *shape[2:])

    def build(self) -> fx.GraphModule:
        # Traced, so that the SubNet holds torch code only and loads without AutoTailor.
        a = self.feature.active
        core = LinearHeadAttention(a.num_heads, a.head_dim, self.scales, self.eps, self.kernel)
        unused = {f"x{i}": None for i in range(self.scales, MAX_SCALES)}
        return without_fixed_inputs(fx.symbolic_trace(core, concrete_args=unused or None))


@register(LinearHeadAttention)
class LinearHeadAttentionHandler(HeadAttentionHandler):
    """Channels first: each input's split into heads of 3 x head_dim, the output's into heads of
    scales x head_dim."""

    dynamic = DynLinearHeadAttention

    def channels(self, a, node: fx.Node) -> Track | None:
        core = a.module(node)
        for x in node.args:
            t = a.track(x) if isinstance(x, fx.Node) else None
            if t is None:
                continue
            if t.axis != 1:
                a.fix(t.gid, f"{node.name} reads heads from an axis other than the channels")
                continue
            a.add_member(t.gid, Member(node.name, "in"))
            a.split(t.gid, node.name, 3 * core.head_dim)
        out = a.new_group(core.num_heads * core.scales * core.head_dim)
        a.add_member(out, Member(node.name, "out"))
        a.split(out, node.name, core.scales * core.head_dim)
        return Track(1, out)

    def describe(self, module: LinearHeadAttention) -> str:
        return f"linear d{module.head_dim}x{module.scales} {type(module.kernel).__name__} eps{module.eps}"

    def facts(self, module: LinearHeadAttention) -> dict[str, Any]:
        return {"head_dim": module.head_dim, "params": sum(p.numel() for p in module.parameters())}

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        # Per head and scale: k^T [v, 1] and q times that, each tokens x d x (d + 1).
        b, channels, pixels = out[0], out[1], out[2] * out[3]
        return 2 * b * pixels * channels * (facts["head_dim"] + 1), facts["params"]


# -- recognition ------------------------------------------------------------------------------------
def _sole_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _skip_casts(node: fx.Node, inside: set[fx.Node]) -> fx.Node:
    """Past ``.float()`` / ``.to(dtype)`` (EfficientViT computes the attention in float32)."""
    while _is(_sole_user(node), {"float", "to"}) and len(_sole_user(node).args) <= 2:
        node = _sole_user(node)
        inside.add(node)
    return node


def _thirds(node: fx.Node) -> tuple[fx.Node, dict[int, fx.Node]] | None:
    """``node`` is the value third of a tensor split in three along its last axis: the tensor, and
    the thirds by position (``chunk(3, dim=-1)`` and its items, or three slices: an ONNX import)."""
    if _is(node, {operator.getitem}) and isinstance(node.args[1], int):
        chunk = node.args[0]
        parts = {u.args[1]: u for u in chunk.users if _is(u, {operator.getitem})}
        ok = last_axis_chunk3(chunk) and len(chunk.users) == 3
        return (chunk.args[0], parts) if ok and set(parts) == {0, 1, 2} and node is parts[2] else None
    source = node.args[0] if _is(node, {operator.getitem}) else None
    parts = slice_thirds(list(source.users)) if isinstance(source, fx.Node) else None
    return (source, parts) if parts is not None and node is parts[2] else None


@dataclass
class _Found:
    scales: list[fx.Node]  # the inputs of the concatenation, (B, heads * 3 * d, H, W) each
    merged: fx.Node  # the heads merged again, (B, scales * heads * d, H, W)
    core: LinearHeadAttention
    inside: set[fx.Node]


def _find(gm: fx.GraphModule, pad: fx.Node) -> _Found | None:
    """The linear attention whose values are padded with ones at ``pad``."""
    bound = bind(pad, ("input", "pad", "mode", "value"))
    if tuple(bound.get("pad") or ()) != (0, 1) or bound.get("mode", "constant") != "constant" \
            or bound.get("value") != 1.0:
        return None
    inside = {pad}
    thirds = _thirds(pad.args[0])  # q, k, v: thirds of the last axis
    if thirds is None:
        return None
    split, parts = thirds
    chunk = pad.args[0].args[0]  # the chunk, or one of the slices
    if not _is(split, {"transpose"}) or {a % 4 for a in split.args[1:3]} != {2, 3}:
        return None
    grouped = split.args[0]
    cat = grouped.args[0] if _is(grouped, {"reshape", "view"}) else None
    if not _is(cat, {torch.cat}) or bind(cat, ("tensors", "dim")).get("dim") != 1:
        return None
    scales = list(cat.args[0])
    shape, in_shapes = node_shape(grouped), [node_shape(x) for x in scales]
    if shape is None or len(shape) != 4 or any(s is None or len(s) != 4 for s in in_shapes) or shape[2] % 3:
        return None
    d = shape[2] // 3
    if len(scales) > MAX_SCALES or any(s[1] % (3 * d) or s[1] != in_shapes[0][1] for s in in_shapes):
        return None
    inside.update({chunk, split, grouped, cat, *parts.values()})
    kernels = []
    for i in (0, 1):  # q and k through the kernel function
        user = _sole_user(parts[i])
        kernel = gm.get_submodule(user.target) if user is not None and user.op == "call_module" else None
        if not isinstance(kernel, (nn.ReLU, nn.Identity)):
            return None
        inside.add(user)
        kernels.append((type(kernel), _skip_casts(user, inside)))
    (q, k), v = [n for _, n in kernels], _skip_casts(pad, inside)
    if kernels[0][0] is not kernels[1][0]:
        return None
    kt, kv = _sole_user(k), _sole_user(v)
    if not (_is(kt, {"transpose"}) and {a % 4 for a in kt.args[1:3]} == {2, 3} and _is(kv, {operator.matmul})
            and kv.args == (kt, v)):
        return None
    out = _sole_user(kv)
    if not (_is(out, {operator.matmul}) and out.args == (q, kv)) or len(out.users) != 2:
        return None
    d_v = (node_shape(out) or (0,))[-1]
    head, tail = sorted(out.users, key=lambda u: last_axis_span(u) == (d_v - 1, d_v))
    add, div = _sole_user(tail), _sole_user(head)
    if not (last_axis_span(head) == (0, d_v - 1) and last_axis_span(tail) == (d_v - 1, d_v) and _is(add, {operator.add})
            and isinstance(add.args[1], float) and _is(div, {operator.truediv}) and div.args == (head, add)):
        return None
    inside.update({kt, kv, out, head, tail, add, div})
    merged = _skip_casts(div, inside)
    back = _sole_user(merged)
    readers = value_readers(back) if _is(back, {"transpose"}) else []
    merged = readers[0] if len(readers) == 1 else None  # (an ONNX import reshapes by a size it reads)
    if merged is None or not _is(merged, {"reshape", "view"}) or \
            node_shape(merged) != (shape[0], len(scales) * in_shapes[0][1] // 3, *in_shapes[0][2:]):
        return None
    inside.update({back, merged})
    heads = in_shapes[0][1] // (3 * d)
    return _Found(scales, merged, LinearHeadAttention(heads, d, len(scales), add.args[1], kernels[0][0]()), inside)


def _closed(found: _Found) -> bool:
    """Nothing outside reads what the operator replaces."""
    return all(read_inside(u, found.inside) for n in found.inside if n is not found.merged for u in n.users)


def _head_major_columns(conv: nn.Conv2d, heads: int, scales: int, d: int) -> Callable[[], None]:
    """Permute ``conv``'s input channels from ``[scale][head][dim]`` to ``[head][scale][dim]``;
    returns what undoes it. The weight is rebound, never changed in place (it may be the user's)."""
    before = conv.weight.data
    w = before.unflatten(1, (scales, heads, d)).transpose(1, 2).flatten(1, 3)
    conv.weight.data = w.contiguous()

    def undo() -> None:
        conv.weight.data = before

    return undo


def _output_conv(gm: fx.GraphModule, node: fx.Node) -> nn.Conv2d | None:
    """The plain convolution that alone reads ``node``, through dropout or identities."""
    while (user := _sole_user(node)) is not None and user.op == "call_module":
        module = gm.get_submodule(user.target)
        if type(module) is nn.Conv2d and module.groups == 1:
            return module
        if not isinstance(module, (nn.Dropout, nn.Identity)):
            return None
        node = user
    return None


def _rewrite(gm: fx.GraphModule, pad: fx.Node) -> list[Callable[[], None]] | None:
    found = _find(gm, pad)
    conv = _output_conv(gm, found.merged) if found is not None and _closed(found) else None
    if conv is None:
        return None
    undo = _head_major_columns(conv, found.core.num_heads, found.core.scales, found.core.head_dim)
    first = found.scales[0]
    owner = first.target.rpartition(".")[0] if first.op == "call_module" else ""
    target = free_name(gm, f"{owner}.heads" if owner else "heads")
    gm.add_submodule(target, found.core)
    with gm.graph.inserting_after(found.merged):
        call = gm.graph.call_module(target, tuple(found.scales))
    found.merged.replace_all_uses_with(call)
    return [undo]


@register_rewrite
def recognise_linear_attention(gm: fx.GraphModule, example: torch.Tensor) -> int:
    """Replace every linear attention found (see the module docstring) by ``LinearHeadAttention``,
    in place; checked on ``example`` and undone if the output changes. Returns how many."""
    pads = [n for n in gm.graph.nodes if _is(n, {F.pad})]
    return rewrite_checked(gm, example, pads, _rewrite, "linear attention(s)")
