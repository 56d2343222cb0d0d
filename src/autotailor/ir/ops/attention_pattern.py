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

import itertools
import operator
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.graph import bind, free_name, from_input, node_shape, rewrite_checked, set_attr
from autotailor.ir.graph import called_module as _module
from autotailor.ir.graph import calls as _is
from autotailor.ir.handlers import register_rewrite
from autotailor.ir.ops.attention import HeadAttention, L2Norm, head_widths


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
