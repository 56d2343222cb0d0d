"""Multi-head attention as one operator: ``HeadAttention`` (what it computes), its dynamic
operator (heads, q/k and value widths kept) and its handler.

How it is found in a traced graph is ``attention_pattern.py``; the layers around it whose rows
are sliced per head (projections, their norms, the output projection's input) are
``head_projections.py``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.frontends import without_fixed_inputs
from autotailor.ir.graph import carries_tensors, node_shape
from autotailor.ir.graph import called_module as _module
from autotailor.ir.handlers import Member, OpHandler, Shape, Track, register
from autotailor.ir.operators import Operator


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



class L2Norm(nn.Module):
    """Each head's vectors scaled to unit length (Swin V2's cosine attention). On fewer q/k
    features it normalises those kept, as a model with fewer would."""

    def __init__(self, eps: float = 1e-12):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1, eps=self.eps)
