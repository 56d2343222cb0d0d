"""Multi-head attention: what lies between the q/k/v projections and the output projection,
found by topology and made one operator whose heads can be dropped.

Models write attention in many ways: timm's ViT splits a fused qkv projection with
``reshape``/``permute``/``unbind`` and calls ``scaled_dot_product_attention``; its Swin writes
``softmax(q @ k^T * scale + bias) @ v`` with a per-window mask; LeViT splits a Linear +
BatchNorm projection head-major into keys and values of different widths; torchvision calls
``nn.MultiheadAttention``. ``recognise_attention`` finds each of them by what it computes
(projections whose outputs are split into heads, attention over them, heads merged again)
and replaces it by ``HeadAttention`` reading the projections' outputs, so that every later
pass sees one operator. A fused projection's rows are made head-major
(``[head][q, k, v][dim]``), so the first ``h`` heads are its leading rows: a leading slice,
like every other width. The rewrite is checked on the example input and undone if the model's
output changes.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.frontends import without_fixed_inputs
from autotailor.ir.graph import bind, carries_tensors, free_name, from_input, node_shape, rewrite_checked, set_attr
from autotailor.ir.graph import called_module as _module
from autotailor.ir.graph import calls as _is
from autotailor.ir.handlers import Member, OpHandler, Shape, Track, register, register_rewrite
from autotailor.ir.operators import Operator
from autotailor.ir.ops.linear import DynLinear
from autotailor.ir.ops.norm import DynBatchNorm1d

log = logging.getLogger(__name__)


class HeadAttention(nn.Module):
    """Scaled dot-product attention from projected tokens to merged heads.

    ``fused``: one input of shape (B, N, heads * (2 * head_dim + v_dim)), head-major; ``kv_fused``:
    q (B, N, heads * head_dim) and one input for k and v (B, M, heads * (head_dim + v_dim)),
    head-major (LeViT's subsampling attention); otherwise q (B, N, heads * head_dim), k (B, M,
    heads * head_dim) and v (B, M, heads * v_dim). ``inputs`` names each input's rows per head.
    Returns (B, N, heads * v_dim). ``q_norm``/``k_norm`` act on each head's vectors. ``mask`` is an
    additive bias computed outside (Swin's relative positions), ``window_mask`` one more per
    window (Swin's shifted windows: (1, windows, heads or 1, N, N), the batch holding images
    times windows), ``head_scale`` a learned factor of each head's scores (Swin V2's cosine
    attention: (heads, 1, 1)); each has the model's heads on its third axis from the end, or one
    for all, and the first ``heads`` are used. ``masked``/``windowed``/``scaled`` say which a call
    passes ("": none, "shared": one for all heads, "per_head").
    """

    def __init__(self, num_heads: int, head_dim: int, v_dim: int, scale: float | None, fused: bool,
                 q_norm: nn.Module | None = None, k_norm: nn.Module | None = None, kv_fused: bool = False):
        super().__init__()
        self.num_heads, self.head_dim, self.v_dim, self.scale, self.fused = num_heads, head_dim, v_dim, scale, fused
        self.kv_fused = kv_fused
        self.masked = self.windowed = self.scaled = ""
        self.q_norm = q_norm if q_norm is not None else nn.Identity()
        self.k_norm = k_norm if k_norm is not None else nn.Identity()

    def forward(self, q: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, window_mask: torch.Tensor | None = None,
                head_scale: torch.Tensor | None = None) -> torch.Tensor:
        return self._attend(q, k, v, mask, window_mask, head_scale, self.num_heads, self.head_dim, self.v_dim,
                            self.scale)

    def inputs(self) -> list[tuple[str, ...]]:
        """Each input's rows per head, in order: "q", "k" (``head_dim`` each), "v" (``v_dim``)."""
        if self.fused:
            return [("q", "k", "v")]
        return [("q",), ("k", "v")] if self.kv_fused else [("q",), ("k",), ("v",)]

    def _attend(self, q, k, v, mask, window_mask, head_scale, h: int, d: int, dv: int,
                scale: float | None) -> torch.Tensor:
        # Tokens on the second axis from the end, any axes before them (MaxViT: batch, windows).
        if self.fused:
            parts = q.unflatten(-1, (h, 2 * d + dv)).split([d, d, dv], -1)
            q, k, v = parts[0].transpose(-3, -2), parts[1].transpose(-3, -2), parts[2].transpose(-3, -2)
        elif self.kv_fused:
            q = q.unflatten(-1, (h, d)).transpose(-3, -2)
            kv = k.unflatten(-1, (h, d + dv)).split([d, dv], -1)
            k, v = kv[0].transpose(-3, -2), kv[1].transpose(-3, -2)
        else:
            q = q.unflatten(-1, (h, d)).transpose(-3, -2)
            k = k.unflatten(-1, (h, d)).transpose(-3, -2)
            v = v.unflatten(-1, (h, dv)).transpose(-3, -2)
        if self.masked == "per_head":
            mask = mask[..., :h, :, :]
        q, k = self.q_norm(q), self.k_norm(k)
        if self.scaled:  # (q * s) @ k^T is s * (q @ k^T)
            q = q * (head_scale[..., :h, :, :] if self.scaled == "per_head" else head_scale)
        if not self.windowed:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        else:
            if self.windowed == "per_head":
                window_mask = window_mask[..., :h, :, :]
            s = (q * (scale if scale is not None else d ** -0.5)) @ k.transpose(-2, -1)
            if mask is not None:
                s = s + mask
            windows, n, m = window_mask.shape[-4], s.shape[-2], s.shape[-1]
            s = (s.view(-1, windows, h, n, m) + window_mask).view(-1, h, n, m)
            x = s.softmax(-1) @ v
        return x.transpose(-3, -2).flatten(-2)


@dataclass(frozen=True)
class HeadsSpec:
    num_heads: int
    head_dim: int  # of q and k
    v_dim: int


class DynHeadAttention(Operator, HeadAttention):
    """``HeadAttention`` over its first ``num_heads`` heads, the first ``head_dim`` q/k features and
    the first ``v_dim`` value features of each (its inputs arrive sliced). The scores keep the
    model's scale whatever ``head_dim``."""

    group_fields = ("num_heads", "num_heads")  # heads are bound by the heads variable, never by width

    def _meta_spec(self) -> HeadsSpec:
        return HeadsSpec(self.num_heads, self.head_dim, self.v_dim)

    @property
    def _scale(self) -> float:
        """The model's scale, kept when the q/k width is sliced."""
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    def forward(self, q, k=None, v=None, mask=None, window_mask=None, head_scale=None) -> torch.Tensor:
        a = self.feature.active
        return self._attend(q, k, v, mask, window_mask, head_scale, a.num_heads, a.head_dim, a.v_dim, self._scale)

    def infer(self, shape: Shape) -> Shape:
        a = self.feature.active
        return (*shape[:-1], a.num_heads * a.v_dim)

    def build(self) -> fx.GraphModule:
        # Traced, so that the SubNet holds torch code only and loads without AutoTailor.
        a = self.feature.active
        core = HeadAttention(a.num_heads, a.head_dim, a.v_dim, self._scale, self.fused,
                             copy.deepcopy(self.q_norm), copy.deepcopy(self.k_norm), self.kv_fused)
        core.masked, core.windowed, core.scaled = self.masked, self.windowed, self.scaled
        fixed = {"k": None, "v": None} if self.fused else {"v": None} if self.kv_fused else {}
        fixed.update({name: None for name, on in (("mask", self.masked), ("window_mask", self.windowed),
                                                  ("head_scale", self.scaled)) if not on})
        return without_fixed_inputs(fx.symbolic_trace(core, concrete_args=fixed or None))


@register(HeadAttention)
class HeadAttentionHandler(OpHandler):
    """Its inputs and output are split into heads: the heads variable slices them, a width never."""

    dynamic = DynHeadAttention
    role = "attention"
    same_shape = False

    def channels(self, a, node: fx.Node) -> Track | None:
        core = a.module(node)
        inputs = [x for x in node.args if isinstance(x, fx.Node)]
        for x, roles in zip(inputs, core.inputs()):
            t = a.track(x)
            if t is None:
                continue
            if t.axis != len(node_shape(x)) - 1:
                a.fix(t.gid, f"{node.name} reads heads from an axis other than the channels")
                continue
            a.add_member(t.gid, Member(node.name, "in"))
            a.split(t.gid, node.name, sum(head_widths(core)[r] for r in roles))
        for m in node.kwargs.values():
            t = a.track(m) if isinstance(m, fx.Node) else None
            if t is not None:  # a layer's outputs, one per head (an ONNX import of Swin V2's bias MLP)
                a.fix(t.gid, f"{node.name} adds {m.name} to its scores: one per head, reordered with them")
        out = a.new_group(core.num_heads * core.v_dim)
        a.add_member(out, Member(node.name, "out"))
        a.split(out, node.name, core.v_dim)
        for param, axis in _head_tables(node):
            # A per-head table the mask is computed from (Swin's relative position biases):
            # reordered with the heads, never sliced (the operator takes the mask's first heads).
            table = a.new_group(core.num_heads)
            a.split(table, node.name, 1)
            if axis is None:  # a layer's outputs (Swin V2's bias MLP)
                a.add_member(table, Member(param.name, "table"))
                continue
            for user in param.users:
                a.add_param_member(table, param, axis, user)
        return Track(len(node_shape(node)) - 1, out)

    def importance(self, module: nn.Module, role: str) -> list[tuple[torch.Tensor, int]]:
        return []  # its heads are ranked by the projections around it

    def structure(self, module: nn.Module) -> str:
        return "other"

    def kind(self, module: nn.Module | None, target: object = None) -> str:
        return "attention"

    def describe(self, module: HeadAttention) -> str:
        norms = "".join(type(m).__name__[0] for m in (module.q_norm, module.k_norm))
        layout = "f" if module.fused else "k" if module.kv_fused else "s"
        return (f"d{module.head_dim}v{module.v_dim}{layout}{norms}s{module.scale}m{module.masked}w{module.windowed}"
                + (f"h{module.scaled}" if module.scaled else ""))

    def facts(self, module: HeadAttention) -> dict[str, Any]:
        return {"fused": module.fused, "params": sum(p.numel() for p in module.parameters())}

    def costs(self, facts: dict[str, Any], ins: list[Shape], out: Shape, kernel: int | None) -> tuple[int, int]:
        # Scores and weighted sum: tokens x keys x (q/k + value features, summed over the heads);
        # the sums read off the shapes, whatever the heads, q/k and value widths kept.
        tokens, values = math.prod(out[:-1]), out[-1]
        m = out[-2] if facts["fused"] else ins[1][-2]
        queries = (ins[0][-1] - values) // 2 if facts["fused"] else ins[0][-1]
        return tokens * m * (queries + values), facts["params"]


def head_widths(core: HeadAttention) -> dict[str, int]:
    """The model's width of each role's rows per head."""
    return {"q": core.head_dim, "k": core.head_dim, "v": core.v_dim}


@dataclass(frozen=True)
class HeadProjectionSpec:
    in_features: int
    out_features: int  # heads kept times the model's rows per head (the heads variable's unit)
    qk_dim: int
    v_dim: int


@dataclass(frozen=True)
class HeadNormSpec:
    num_features: int  # as ``HeadProjectionSpec.out_features``
    qk_dim: int
    v_dim: int


@dataclass(frozen=True)
class HeadInputSpec:
    in_features: int  # heads kept times the model's value width (the heads variable's unit)
    out_features: int
    v_dim: int


class _HeadRows:
    """Rows (or columns) of a layer on an attention's heads, head-major: each head's are ``roles``
    (q, k, v of a fused projection; one of them otherwise), ``pieces`` wide in the model; q and k
    keep their first ``qk_dim``, v its first ``v_dim``. Heads and widths are all leading within
    their axis, so what is kept is a pattern rather than one slice."""

    pieces: tuple[int, ...]
    roles: tuple[str, ...]

    @classmethod
    def lifted(cls, core: HeadAttention, roles: tuple[str, ...]) -> Callable[[nn.Module], Operator]:
        """What lifts the layer into this operator (``PlanContext.lifts``): its rows per head are
        ``roles`` of ``core``'s heads."""
        widths = head_widths(core)
        return lambda module: cls.from_module(module, pieces=tuple(widths[r] for r in roles), roles=tuple(roles))

    def _meta(self, *roles: str) -> int:
        """The model's width of the first piece of ``roles`` (0 if there is none)."""
        return next((p for p, r in zip(self.pieces, self.roles) if r in roles), 0)

    def _widths(self, a: Any) -> list[int]:
        return [a.v_dim if r == "v" else a.qk_dim for r in self.roles]

    def _kept(self, total: int, a: Any) -> torch.Tensor:
        """Indices of what is kept of the first ``total`` (whole heads) at the active widths ``a``."""
        within = torch.cat([torch.arange(start, start + w) for start, w in
                            zip(itertools.accumulate((0, *self.pieces)), self._widths(a))])
        block = sum(self.pieces)
        return (torch.arange(total // block)[:, None] * block + within).flatten()

    def _per_head(self, a: Any) -> int:
        return sum(self._widths(a))


class DynHeadProjection(_HeadRows, DynLinear):
    """The Linear that projects tokens into an attention's heads (``_HeadRows``: its rows)."""

    def _meta_spec(self) -> HeadProjectionSpec:
        return HeadProjectionSpec(self.in_features, self.out_features, self._meta("q", "k"), self._meta("v"))

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        return t.index_select(0, self._kept(a.out_features, a).to(t.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        if a == self.feature.meta:
            return F.linear(x, self.weight, self.bias)
        bias = self._rows(self.bias) if self.bias is not None else None
        return F.linear(x, self._rows(self.weight[:, : a.in_features]), bias)

    def infer(self, shape: Shape) -> Shape:
        a = self.feature.active
        return (*shape[:-1], a.out_features // sum(self.pieces) * self._per_head(a))

    def build(self) -> nn.Linear:
        a = self.feature.active
        weight = self._rows(self.weight[:, : a.in_features])
        lin = nn.Linear(a.in_features, weight.shape[0], self.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(weight)
            if self.bias is not None:
                lin.bias.copy_(self._rows(self.bias))
        return lin


class DynHeadBatchNorm1d(_HeadRows, DynBatchNorm1d):
    """The BatchNorm after a ``DynHeadProjection`` (LeViT's Linear + BatchNorm over tokens): its
    per-channel tensors keep the projection's rows."""

    def _meta_spec(self) -> HeadNormSpec:
        return HeadNormSpec(self.num_features, self._meta("q", "k"), self._meta("v"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        if a == self.feature.meta:
            return nn.BatchNorm1d.forward(self, x)
        rows = self._kept(a.num_features, a).to(x.device)
        mean, var = self.running_mean[rows], self.running_var[rows]
        use_batch = self.training
        if use_batch and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        y = F.batch_norm(x, mean, var, self.weight[rows], self.bias[rows], use_batch, momentum, self.eps)
        if use_batch:  # the statistics were updated on copies: write them back to the rows kept
            with torch.no_grad():
                self.running_mean[rows] = mean
                self.running_var[rows] = var
        return y

    def build(self) -> nn.BatchNorm1d:
        a = self.feature.active
        rows = self._kept(a.num_features, a)
        bn = nn.BatchNorm1d(len(rows), self.eps, self.momentum)
        with torch.no_grad():
            for name in ("weight", "bias", "running_mean", "running_var"):
                getattr(bn, name).copy_(getattr(self, name)[rows])
            bn.num_batches_tracked.copy_(self.num_batches_tracked)
        return bn


class DynHeadInput(_HeadRows, DynLinear):
    """The Linear that reads an attention's merged heads (its output projection): its input columns
    keep the first ``v_dim`` value features of each head kept (``_HeadRows``: its columns)."""

    def _meta_spec(self) -> HeadInputSpec:
        return HeadInputSpec(self.in_features, self.out_features, self._meta("v"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.feature.active
        if a == self.feature.meta:
            return F.linear(x, self.weight, self.bias)
        cols = self._kept(a.in_features, a).to(x.device)
        b = self.bias[: a.out_features] if self.bias is not None else None
        return F.linear(x, self.weight[: a.out_features].index_select(1, cols), b)

    def build(self) -> nn.Linear:
        a = self.feature.active
        cols = self._kept(a.in_features, a)
        lin = nn.Linear(len(cols), a.out_features, self.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(self.weight[: a.out_features].index_select(1, cols))
            if self.bias is not None:
                lin.bias.copy_(self.bias[: a.out_features])
        return lin


def _head_tables(node: fx.Node) -> list[tuple[fx.Node, int | None]]:
    """The parameters the masks of ``node`` are computed from that have one axis of the attention's
    head count: (their ``get_attr`` node, that axis), and the Linear layers whose outputs are
    one per head: (their node, None)."""
    heads = node.graph.owning_module.get_submodule(node.target).num_heads
    flow: set[fx.Node] = set()  # tensors computed from the input: the parameters they read are no tables
    for n in node.graph.nodes:
        if n.op == "placeholder" or (carries_tensors(n) and any(a in flow for a in n.all_input_nodes)):
            flow.add(n)
    found, stack, seen = [], [m for m in node.kwargs.values() if isinstance(m, fx.Node)], set()
    while stack:
        n = stack.pop()
        if n in seen or n in flow:
            continue
        seen.add(n)
        if n.op == "get_attr":
            shape = node_shape(n) or ()
            axes = [i for i, size in enumerate(shape) if size == heads]
            if len(axes) > 1 and n in node.kwargs.values() and len(shape) >= 3 and len(shape) - 3 in axes:
                axes = [len(shape) - 3]  # the mask itself (an export folds it): (..., heads, N, M)
            if len(axes) == 1:
                found.append((n, axes[0]))
        elif isinstance(_module(n.graph.owning_module, n), nn.Linear) and (node_shape(n) or (0,))[-1] == heads:
            found.append((n, None))  # a layer whose outputs are per head (Swin V2's bias MLP)
            continue
        stack.extend(n.all_input_nodes)
    return found


# -- recognition ------------------------------------------------------------------------------------
_VIEW_METHODS = {"reshape", "view", "permute", "transpose", "unbind", "contiguous", "flatten", "split", "chunk",
                 "squeeze", "unsqueeze"}
_VIEW_FUNCTIONS = {torch.reshape, torch.permute, torch.transpose, torch.unbind, torch.flatten, torch.chunk,
                   operator.getitem}


def _is_view(node: fx.Node) -> bool:
    return (node.op == "call_method" and node.target in _VIEW_METHODS) or (
        node.op == "call_function" and node.target in _VIEW_FUNCTIONS)


@dataclass
class _Found:
    sources: list[fx.Node]  # the projections' nodes, q (or fused qkv), k, v
    merged: fx.Node  # the heads merged again, (B, N, heads * v_dim)
    core: HeadAttention
    inside: set[fx.Node]  # nodes the operator replaces
    masks: dict[str, fx.Node] = field(default_factory=dict)  # keyword -> node
    qkv_major: bool = False  # a fused projection's rows are [q, k, v][head]: made head-major
    tokens_first: bool = False  # projections (N, B, features) and merged heads (N, B, ...) or (N * B, ...)


def _projection(gm: fx.GraphModule, node: fx.Node) -> bool:
    """A Linear's output, or LeViT's Linear + BatchNorm over tokens (``linear_norm``)."""
    return isinstance(_module(gm, node), nn.Linear) or linear_norm(gm, node) is not None


def linear_norm(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """LeViT's Linear + BatchNorm over tokens, ``bn(y.flatten(0, 1)).reshape_as(y)`` ending at
    ``node``: (the Linear's node, the BatchNorm's), or None."""
    if not _is(node, {"reshape_as"}):
        return None
    bn, y = node.args[:2]
    flat = bn.args[0] if isinstance(_module(gm, bn), nn.BatchNorm1d) else None
    ok = _is(flat, {"flatten"}) and flat.args[0] is y and tuple(flat.args[1:3]) == (0, 1) and \
        isinstance(_module(gm, y), nn.Linear)
    return (y, bn) if ok else None


def _trace_back(gm: fx.GraphModule, node: fx.Node, dim: int, inside: set[fx.Node]) -> tuple[fx.Node | None, nn.Module | None]:
    """The projection that ``node``, one head's q, k or v, is split from (``_projection``), and
    the per-head norm on the way (a LayerNorm over ``dim`` features), if any."""
    norm = None
    while True:
        mod = _module(gm, node)
        if _projection(gm, node):
            return node, norm
        if _is_view(node):
            inside.add(node)
            node = node.args[0]
        elif isinstance(mod, nn.Identity) or (isinstance(mod, nn.LayerNorm) and mod.normalized_shape == (dim,)
                                              and norm is None):
            inside.add(node)
            norm = None if isinstance(mod, nn.Identity) else mod
            node = node.args[0]
        elif _is(node, {F.normalize}) and norm is None and _unit_length(node):
            inside.add(node)
            norm = L2Norm(bind(node, ("input", "p", "dim", "eps")).get("eps", 1e-12))
            node = node.args[0]
        else:
            return None, None


def _find_sdpa(gm: fx.GraphModule, node: fx.Node) -> _Found | None:
    args = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal"), node.args))
    args.update(node.kwargs)
    if args.get("is_causal", False) or args.get("dropout_p", 0.0) or args.get("enable_gqa", False):
        return None
    mask = args.get("attn_mask")
    return _assemble(gm, args["query"], args["key"], args["value"], {"mask": mask} if mask is not None else {},
                     args.get("scale"), node, {node})


_MATMUL = {operator.matmul, torch.matmul, "matmul"}
_ADD = {operator.add, torch.add, "add"}
_SOFTMAX = {F.softmax, torch.softmax, "softmax"}


def _find_softmax(gm: fx.GraphModule, node: fx.Node) -> _Found | None:
    """``softmax(q @ k^T * scale [+ bias]) @ v``, the scale on q or on the scores, dropout allowed."""
    if isinstance(_module(gm, node), nn.Softmax):
        dim = _module(gm, node).dim
    else:
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    shape = node_shape(node)
    if shape is None or len(shape) < 4 or dim is None or dim % len(shape) != len(shape) - 1:
        return None
    rank = len(shape)
    inside, out = {node}, node
    while len(out.users) == 1 and _passes_through(gm, next(iter(out.users))):
        out = next(iter(out.users))
        inside.add(out)
    (product,) = out.users if len(out.users) == 1 else (None,)
    if not _is(product, _MATMUL) or product.args[0] is not out:
        return None
    inside.add(product)
    scores, masks, scale = node.args[0], {}, 1.0
    windowed = _window_add(scores)
    if windowed is not None:
        inside.update(windowed[1:])
        scores, masks["window_mask"] = windowed[0], windowed[1].args[1]
    if _is(scores, _ADD) and all(isinstance(a, fx.Node) for a in scores.args[:2]):
        inside.add(scores)
        a, b = scores.args[:2]
        scores, masks["mask"] = (a, b) if _is(a, _MATMUL) or _is(a, {operator.mul, operator.truediv}) else (b, a)
    if _is(scores, {operator.mul, operator.truediv}) and _float(scores.args[1]) is not None:
        inside.add(scores)
        scale = _float(scores.args[1]) if scores.target is operator.mul else 1 / _float(scores.args[1])
        scores = scores.args[0]
    elif _is(scores, {operator.mul}) and _head_factor(scores.args[1]):
        inside.add(scores)  # Swin V2: a learned scale per head, computed from parameters alone
        scores, masks["head_scale"] = scores.args[0], scores.args[1]
    if not _is(scores, _MATMUL):
        return None
    inside.add(scores)
    q, kt = scores.args[:2]
    # A factor on q, on the keys (MaxViT) or on both (an ONNX export of scaled_dot_product_attention
    # multiplies each by sqrt(scale)) scales the scores: q s @ (k t)^T is s t (q @ k^T).
    q, scale = _scaled(q, scale, inside)
    kt, scale = _scaled(kt, scale, inside)
    transposed = _is(kt, {"transpose", torch.transpose}) and {a % rank for a in kt.args[1:3]} == {rank - 2, rank - 1}
    k, scale = _scaled(kt.args[0] if transposed else kt, scale, inside)
    if transposed:
        inside.add(kt)
    # LeViT keeps its keys transposed (no transpose before the product)
    return _assemble(gm, q, k, product.args[1], masks, scale, product, inside, k_transposed=not transposed)


def _scaled(node: fx.Node, scale: float, inside: set[fx.Node]) -> tuple[fx.Node, float]:
    """``node`` without a constant factor ``x * s`` it applies, and ``scale`` times that factor."""
    if _is(node, {operator.mul}) and _float(node.args[1]) is not None:
        inside.add(node)
        return node.args[0], scale * _float(node.args[1])
    return node, scale


def _head_factor(arg: object) -> bool:
    """A tensor of one number per head, (heads, 1, 1) or (1, heads, 1, 1), computed from
    parameters alone (no input reaches it)."""
    shape = node_shape(arg) if isinstance(arg, fx.Node) else None
    if shape is None or len(shape) not in (3, 4) or any(s != 1 for s in (*shape[:-3], *shape[-2:])):
        return False
    return not from_input(arg)


class L2Norm(nn.Module):
    """Each head's vectors scaled to unit length (Swin V2's cosine attention). On fewer q/k
    features it normalises those kept, as a model with fewer would."""

    def __init__(self, eps: float = 1e-12):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1, eps=self.eps)


def _unit_length(node: fx.Node) -> bool:
    """``F.normalize`` to unit L2 length over the last axis."""
    bound = bind(node, ("input", "p", "dim", "eps"))
    shape = node_shape(node)
    return bound.get("p", 2.0) == 2 and shape is not None and bound.get("dim", 1) % len(shape) == len(shape) - 1


def _passes_through(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Dropout or an identity: a module, or ``F.dropout`` traced with ``training=False``."""
    if _is(node, {F.dropout}):
        return bind(node, ("input", "p", "training")).get("training", True) is False
    return isinstance(_module(gm, node), (nn.Dropout, nn.Identity))


def _float(arg: object) -> float | None:
    """A float the graph holds or computes from sizes alone (``head_dim ** -0.5`` with
    ``head_dim = C // heads``): the number at the compiled shapes. The operator that replaces
    the attention keeps it, as models that store their scale do."""
    value = arg.meta.get("number") if isinstance(arg, fx.Node) else arg
    return float(value) if isinstance(value, float) else None


def _window_add(scores: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node, fx.Node] | None:
    """``view(view(s, 5-D) + m, 4-D)`` (Swin's shifted-window mask): (s, the add, both views)."""
    if not (_is(scores, {"view", "reshape"}) and _is(scores.args[0], _ADD)):
        return None
    add = scores.args[0]
    inner, m = add.args[:2]
    if not (_is(inner, {"view", "reshape"}) and isinstance(m, fx.Node)):
        return None
    s = inner.args[0]
    shapes = [node_shape(x) for x in (s, inner, m, scores)]
    if any(x is None for x in shapes) or shapes[0] != shapes[3] or len(shapes[1]) != 5 or len(shapes[2]) != 5 \
            or shapes[1][2:] != shapes[0][1:] or shapes[2][0] != 1 or shapes[2][1] != shapes[1][1]:
        return None
    return s, add, inner, scores


def _assemble(gm: fx.GraphModule, q: fx.Node, k: fx.Node, v: fx.Node, masks: dict[str, fx.Node],
              scale: float | None, out: fx.Node, inside: set[fx.Node], k_transposed: bool = False) -> _Found | None:
    """The attention with per-head ``q``, ``k``, ``v`` (..., heads, N, dim; ``k`` (..., heads, dim,
    N) if ``k_transposed``) whose result is ``out``: its projections, the heads merged again, and
    the operator that replaces it all."""
    shapes = [node_shape(x) for x in (q, k, v)]
    if any(s is None or len(s) < 4 for s in shapes):
        return None
    if k_transposed:
        shapes[1] = (*shapes[1][:-2], shapes[1][-1], shapes[1][-2])
    lead = shapes[0][:-3]  # the batch, and the windows where a model keeps them apart (MaxViT)
    (heads, n, d), (_, m, _), (_, _, dv) = (s[-3:] for s in shapes)
    if not all(isinstance(m, fx.Node) and (node_shape(m) or ())[-3:-2] in ((1,), (heads,)) for m in masks.values()):
        return None
    found = [_trace_back(gm, x, dim, inside) for x, dim in ((q, d), (k, d), (v, dv))]
    sources = [s for s, _ in found]
    if any(s is None for s in sources) or found[2][1] is not None:
        return None
    fused, kv_fused = len(set(sources)) == 1, len(set(sources)) == 2 and sources[1] is sources[2]
    qkv_major = False
    if kv_fused:
        sources = sources[:2]
        split = [node_shape(u) for u in value_readers(sources[1])]  # [head][k, v] (LeViT: view(B, M, H, -1))
        if len(split) != 1 or len(split[0]) != 4 or split[0][2] != heads or \
                [node_shape(x)[-1] for x in sources] != [heads * d, heads * (d + dv)]:
            return None
    elif fused:
        sources = sources[:1]
        users = value_readers(sources[0])
        split = [node_shape(u) for u in users]
        # Rows [q, k, v][head][dim] (timm, split by reshape(B, N, 3, H, d); MaxViT, chunked in three
        # along the features) are put head-major below; LeViT's are [head][q, k, v] already
        # (view(B, N, H, -1)). An ONNX import of nn.MultiheadAttention splits by reshape(N, B, 3, features).
        qkv_major = d == dv and isinstance(_module(gm, sources[0]), nn.Linear) and (_thirds(users) or (
            len(split) == 1 and split[0] is not None and ((len(split[0]) >= 5 and split[0][-3:-1] == (3, heads))
                                                          or split[0][-2:] == (3, heads * d))))
        head_major = len(split) == 1 and split[0] is not None and len(split[0]) == 4 and split[0][2] == heads
        if not (qkv_major or head_major) or node_shape(sources[0])[-1] != heads * (2 * d + dv) or n != m:
            return None
    elif len(set(sources)) != 3 or [node_shape(s)[-1] for s in sources] != [heads * d, heads * d, heads * dv]:
        return None
    # nn.MultiheadAttention (its ONNX export) runs on (N, B, features) and merges the heads to (N * B, ...)
    tokens_first = len(lead) == 1 and node_shape(sources[0])[:-1] == (n, *lead) != (*lead, n)
    if tokens_first and not all(isinstance(_module(gm, s), nn.Linear) and len(s.args) == 1 for s in sources):
        return None
    merged_shapes = [(n, *lead, heads * dv), (n * lead[0], heads * dv)] if tokens_first else [(*lead, n, heads * dv)]
    merged = out
    while node_shape(merged) not in merged_shapes:
        users = value_readers(merged)
        if len(users) != 1 or not _is_view(users[0]):
            return None
        merged = users[0]
        inside.add(merged)
    core = HeadAttention(heads, d, dv, scale, fused, found[0][1], found[1][1], kv_fused)
    kind = {name: "shared" if node_shape(m)[-3] == 1 else "per_head" for name, m in masks.items()}
    core.masked, core.windowed, core.scaled = (kind.get(k, "") for k in ("mask", "window_mask", "head_scale"))
    return _Found(sources, merged, core, inside, masks, qkv_major, tokens_first)


def value_readers(node: fx.Node) -> list[fx.Node]:
    """The nodes that read ``node``'s values, not only its sizes."""
    return [u for u in node.users if not _is(u, {"size"})]


def _thirds(users: list[fx.Node]) -> bool:
    """Three equal parts of the features: ``chunk(x, 3, dim=-1)``, or three slices of the last
    axis (an ONNX import of it)."""
    return (len(users) == 1 and last_axis_chunk3(users[0])) or slice_thirds(users) is not None


def last_axis_chunk3(node: object) -> bool:
    """``node`` is ``chunk(x, 3, dim=-1)``."""
    if not _is(node, {torch.chunk, "chunk"}):
        return False
    shape = node_shape(node.args[0])
    bound = bind(node, ("input", "chunks", "dim"))
    return shape is not None and bound.get("chunks") == 3 and bound.get("dim", 0) % len(shape) == len(shape) - 1


def last_axis_span(node: object) -> tuple[int, int] | None:
    """(start, stop) of ``x[..., a:b]``, a slice of the last axis only, or None."""
    if not _is(node, {operator.getitem}) or not isinstance(node.args[1], tuple):
        return None
    *rest, last = node.args[1]
    shape = node_shape(node.args[0])
    if shape is None or not isinstance(last, slice) or last.step not in (None, 1) or any(
            r is not Ellipsis and r != slice(None) for r in rest) or (Ellipsis not in rest and len(rest) != len(shape) - 1):
        return None
    start, stop, _ = last.indices(shape[-1])
    return start, stop


def slice_thirds(readers: list[fx.Node]) -> dict[int, fx.Node] | None:
    """``readers`` of one tensor, by position, if they are three slices of its last axis in equal
    thirds (an ONNX import's ``chunk(3, dim=-1)``); else None."""
    shape = node_shape(readers[0].args[0]) if readers and readers[0].args else None
    if shape is None or len(readers) != 3:
        return None
    third = shape[-1] // 3
    spans = {last_axis_span(u): u for u in readers}
    parts = {i: spans.get((i * third, (i + 1) * third)) for i in range(3)}
    return None if None in parts.values() else parts


def read_inside(user: fx.Node, inside: set[fx.Node]) -> bool:
    """``user`` is one of ``inside``, or reads a size for them alone (an ONNX import reshapes ``x``
    by ``x.size(0)``)."""
    return user in inside or (_is(user, {"size"}) and all(w in inside for w in user.users))


def _closed(found: _Found) -> bool:
    """Nothing outside reads what the operator replaces, and the projections feed only it."""
    ok = all(read_inside(u, found.inside) for n in found.inside if n is not found.merged for u in n.users)
    return ok and all(read_inside(u, found.inside) for s in found.sources for u in s.users)


def _head_major(linear: nn.Linear, heads: int) -> Callable[[], None]:
    """Reorder a fused qkv projection's rows from [q, k, v][head][dim] to [head][q, k, v][dim];
    returns what undoes it. The tensors are rebound, never changed in place: the storage may be
    the user's model's."""
    params = [p for p in (linear.weight, linear.bias) if p is not None]
    before = [p.data for p in params]
    for p in params:
        p.data = _rows_head_major(p.data, heads)

    def undo() -> None:
        for p, data in zip(params, before):
            p.data = data

    return undo


def _rows_head_major(t: torch.Tensor, heads: int) -> torch.Tensor:
    rest = t.shape[1:]
    return t.reshape(3, heads, -1, *rest).transpose(0, 1).reshape(t.shape).contiguous()


def _rewrite(gm: fx.GraphModule, node: fx.Node) -> list[Callable[[], None]] | None:
    found = _find_sdpa(gm, node) if node.target is F.scaled_dot_product_attention else _find_softmax(gm, node)
    if found is None or not _closed(found):
        return None
    first = found.sources[0]
    owner = (first if first.op == "call_module" else first.args[1]).target.rpartition(".")[0]
    target = free_name(gm, f"{owner}.heads" if owner else "heads")
    gm.add_submodule(target, found.core)
    if found.tokens_first:  # the projections made to read (B, N, features), as the operator does
        for s in found.sources:
            with gm.graph.inserting_before(s):
                s.args = (gm.graph.call_method("transpose", (s.args[0], 0, 1)),)
    with gm.graph.inserting_before(found.merged.next):  # nodes made here follow one another
        call = gm.graph.call_module(target, tuple(found.sources), dict(found.masks))
        result = call
        if found.tokens_first:  # back to the layout the model reads the merged heads in
            result = gm.graph.call_method("transpose", (call, 0, 1))
            if len(node_shape(found.merged)) == 2:
                result = gm.graph.call_method("flatten", (result, 0, 1))
    found.merged.replace_all_uses_with(result)
    undo = []
    if found.qkv_major:
        lin = gm.get_submodule(found.sources[0].target)
        undo.append(_head_major(lin, found.core.num_heads))
    layers = [_layers(gm, s) for s in found.sources]
    if all(layers):
        out = output_projection(gm, result)
        undo.append(_widths_by_importance(layers, found.core, _module(gm, out) if out is not None else None))
    return undo


def _layers(gm: fx.GraphModule, source: fx.Node) -> tuple[nn.Linear, nn.BatchNorm1d | None] | None:
    """The plain Linear a projection's rows come from, and LeViT's BatchNorm after it."""
    pair = linear_norm(gm, source)
    lin, bn = (_module(gm, pair[0]), _module(gm, pair[1])) if pair else (_module(gm, source), None)
    plain = type(lin) is nn.Linear and (bn is None or (type(bn) is nn.BatchNorm1d and bn.affine
                                                         and bn.track_running_stats))
    return (lin, bn) if plain else None


# Layers that act on each feature alone between an attention and its output projection.
_ELEMENTWISE = (nn.Identity, nn.Dropout, nn.Hardswish, nn.GELU, nn.ReLU, nn.SiLU)


def output_projection(gm: fx.GraphModule, node: fx.Node) -> fx.Node | None:
    """The Linear that alone reads the merged heads of the attention at ``node``, through
    activations or dropout (LeViT's Hardswish), or views that keep the features last (an ONNX
    import of ``nn.MultiheadAttention`` merges the tokens and the batch): its node, or None."""
    while len(node.users) == 1:
        user = next(iter(node.users))
        mod = _module(gm, user)
        if isinstance(mod, nn.Linear) and user.args[0] is node:
            return user
        if not (isinstance(mod, _ELEMENTWISE) or _keeps_features(user)):
            return None
        node = user
    return None


def _keeps_features(node: fx.Node) -> bool:
    """``transpose`` or ``flatten`` of two axes before the last."""
    shape, axes = node_shape(node.args[0]) if node.args else None, node.args[1:3]
    return _is(node, {"transpose", "flatten"}) and shape is not None and len(axes) == 2 and all(
        isinstance(a, int) and a % len(shape) < len(shape) - 1 for a in axes)


def _widths_by_importance(layers: list[tuple[nn.Linear, nn.BatchNorm1d | None]], core: HeadAttention,
                          out: nn.Linear | None) -> Callable[[], None]:
    """Order each head's features by importance, most important first, so that keeping the first
    ones (the ``qk`` and ``v`` kinds) keeps the best. Queries and keys: by the product of the norms
    of the q row and the k row that make a feature; a score sums q_i * k_i over the features, so
    one permutation of a head's q and k rows leaves it unchanged. Values: by the norm of the v row
    times that of the output projection's column that reads it (``out``; values keep their order
    without one), the same permutation of both. A row's norm is times its BatchNorm's scale where
    one follows. ``layers``: the projections (``core.inputs()``), each with its BatchNorm or None.
    Returns what undoes it; the tensors are rebound, as ``_head_major`` does."""
    h, widths = core.num_heads, head_widths(core)
    spans: dict[str, tuple[tuple, int, int]] = {}  # role -> (its projection, rows per head, offset)
    for pair, roles in zip(layers, core.inputs()):
        sizes = [widths[r] for r in roles]
        for r, off in zip(roles, itertools.accumulate((0, *sizes))):
            spans[r] = (pair, sum(sizes), off)

    def norms(role: str) -> torch.Tensor:
        (lin, bn), block, off = spans[role]
        n = lin.weight.detach().norm(dim=-1)
        n = n if bn is None else n * (bn.weight.detach() / (bn.running_var + bn.eps).sqrt()).abs()
        return n.reshape(h, block)[:, off: off + widths[role]]

    def order(score: torch.Tensor) -> torch.Tensor:  # (heads, width)
        return score.argsort(dim=1, descending=True, stable=True)

    orders = {"q": order(norms("q") * norms("k"))}
    orders["k"] = orders["q"]
    if out is not None:
        orders["v"] = order(norms("v") * out.weight.detach().norm(dim=0).reshape(h, widths["v"]))
    owners = {pair: block for pair, block, _ in spans.values()}  # a fused projection once
    tensors = [(m, name, pair) for pair in owners for m, names in ((pair[0], ("weight", "bias")),
               (pair[1], ("weight", "bias", "running_mean", "running_var"))) if m is not None
               for name in names if getattr(m, name) is not None]
    before = [getattr(m, name).data for m, name, _ in tensors]
    for pair, block in owners.items():
        rows = torch.arange(block).repeat(h, 1)  # within each head, then offset by the head
        for role, (p2, _, off) in spans.items():
            if p2 is pair and role in orders:
                rows[:, off: off + widths[role]] = orders[role] + off
        rows = (rows + block * torch.arange(h)[:, None]).flatten()
        for m, name, owner in tensors:
            if owner is pair:
                getattr(m, name).data = getattr(m, name).data[rows].contiguous()
    if out is not None:
        before.append(out.weight.data)
        cols = (orders["v"] + widths["v"] * torch.arange(h)[:, None]).flatten()
        out.weight.data = out.weight.data[:, cols].contiguous()

    def undo() -> None:
        for (m, name, _), data in zip(tensors, before):
            getattr(m, name).data = data
        if out is not None:
            out.weight.data = before[-1]

    return undo


def _rewrite_mha(gm: fx.GraphModule, node: fx.Node) -> list[Callable[[], None]] | None:
    """``nn.MultiheadAttention(x, x, x)`` (batch first, no masks) -> qkv Linear, heads, out_proj."""
    mha = gm.get_submodule(node.target)
    args = list(node.args) + [node.kwargs.get(k) for k in ("query", "key", "value") if k in node.kwargs]
    extra = {k: v for k, v in node.kwargs.items() if k not in ("query", "key", "value", "need_weights")}
    if len(args) != 3 or len(set(args)) != 1 or any(v is not None for v in extra.values()) or not mha.batch_first \
            or not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        return None
    users = list(node.users)
    if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
        return None
    if any(u.args[1] != 0 and u.users for u in users):
        return None  # the attention weights are used
    e, heads = mha.embed_dim, mha.num_heads
    qkv = nn.Linear(e, 3 * e, bias=mha.in_proj_bias is not None)
    qkv.weight = nn.Parameter(_rows_head_major(mha.in_proj_weight.detach(), heads))
    if mha.in_proj_bias is not None:
        qkv.bias = nn.Parameter(_rows_head_major(mha.in_proj_bias.detach(), heads))
    block = nn.Module()
    block.qkv, block.heads, block.out_proj = qkv, HeadAttention(heads, e // heads, e // heads, None, True), mha.out_proj
    undo = _widths_by_importance([(qkv, None)], block.heads, block.out_proj)  # out_proj's columns, too
    set_attr(gm, node.target, block)
    with gm.graph.inserting_after(node):
        a = gm.graph.call_module(f"{node.target}.qkv", (args[0],))
        with gm.graph.inserting_after(a):
            h = gm.graph.call_module(f"{node.target}.heads", (a,))
            with gm.graph.inserting_after(h):
                out = gm.graph.call_module(f"{node.target}.out_proj", (h,))
    for u in users:
        if u.args[1] == 0:
            u.replace_all_uses_with(out)
    return [undo, lambda: set_attr(gm, node.target, mha)]


def _candidate(gm: fx.GraphModule, node: fx.Node) -> bool:
    return _is(node, {F.scaled_dot_product_attention, *_SOFTMAX}) or isinstance(
        _module(gm, node), (nn.MultiheadAttention, nn.Softmax))


@register_rewrite
def recognise_attention(gm: fx.GraphModule, example: torch.Tensor) -> int:
    """Replace every multi-head attention found (see the module docstring) by ``HeadAttention``,
    in place; checked on ``example`` and undone if the output changes. Returns how many."""

    def rewrite(gm: fx.GraphModule, node: fx.Node) -> list[Callable[[], None]] | None:
        return _rewrite_mha(gm, node) if isinstance(_module(gm, node), nn.MultiheadAttention) else _rewrite(gm, node)

    candidates = [n for n in gm.graph.nodes if _candidate(gm, n)]
    return rewrite_checked(gm, example, candidates, rewrite, "multi-head attention(s)")
