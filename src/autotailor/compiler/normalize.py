"""Operator parsing: turn functional layers with their own parameters into modules.

Models often call ``F.conv2d(x, self.weight, ...)``, ``F.batch_norm(...)`` or
``F.layer_norm(x, shape, self.weight, self.bias)`` from a custom module's ``forward``
(EfficientNet-Lite's static-same-padding conv, timm's BatchNormAct2d, ConvNeXt's
channels-first LayerNorm). torch.fx traces through those, leaving a function call
fed by parameter reads. This pass rewrites each such call into a call of the equivalent torch
layer that holds the *same* parameter objects, so every later pass sees one kind of operator.
Adding a function is one ``@functional_layer`` builder.

``einsum_as_matmul`` likewise writes a two-operand ``einsum`` that is a batched matrix product
(MaxViT's attention) as ``matmul`` and ``transpose``, which the later passes read.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.graph import get_attr, set_attr

# A builder returns the layer, or None when the call is not one it can express. Weights must be
# nn.Parameter objects (checked here); running statistics may be plain buffers.
Builder = Callable[[dict[str, object], dict[str, torch.Tensor]], nn.Module | None]
_STATISTICS = ("running_mean", "running_var")
_BUILDERS: dict[object, tuple[tuple[str, ...], tuple[str, ...], Builder]] = {}


def functional_layer(fn: object, signature: tuple[str, ...], params: tuple[str, ...]):
    """Register a builder for ``fn``: ``signature`` names its arguments in order and
    ``params`` those that must be parameters of the model."""

    def deco(builder: Builder) -> Builder:
        _BUILDERS[fn] = (signature, params, builder)
        return builder

    return deco


def _pair(v: object) -> tuple[int, int]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)  # type: ignore[return-value]


@functional_layer(F.conv2d, ("input", "weight", "bias", "stride", "padding", "dilation", "groups"), ("weight", "bias"))
def _conv2d(args: dict[str, object], p: dict[str, torch.Tensor]) -> nn.Module | None:
    w, b = p["weight"], p.get("bias")
    groups = args.get("groups", 1)
    padding = args.get("padding", 0)
    conv = nn.Conv2d(
        w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]), _pair(args.get("stride", 1)),
        padding if isinstance(padding, str) else _pair(padding), _pair(args.get("dilation", 1)), groups,
        bias=b is not None, device="meta",
    )
    conv.weight, conv.bias = w, b
    return conv


@functional_layer(F.batch_norm, ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
                                 "eps"), ("running_mean", "running_var", "weight", "bias"))
def _batch_norm(args: dict[str, object], p: dict[str, torch.Tensor]) -> nn.Module | None:
    # Traced in eval mode, a BatchNorm that uses its running statistics (timm's BatchNormAct2d).
    mean, var, w, b = p.get("running_mean"), p.get("running_var"), p.get("weight"), p.get("bias")
    if args.get("training", False) is not False or mean is None or var is None or mean.dim() != 1:
        return None
    bn = nn.BatchNorm2d(mean.shape[0], args.get("eps", 1e-5), args.get("momentum", 0.1), affine=w is not None,
                        device="meta")
    bn.weight, bn.bias = w, b
    bn.running_mean, bn.running_var = mean, var
    bn.num_batches_tracked = torch.zeros((), dtype=torch.long)
    return bn


@functional_layer(F.layer_norm, ("input", "normalized_shape", "weight", "bias", "eps"), ("weight", "bias"))
def _layer_norm(args: dict[str, object], p: dict[str, torch.Tensor]) -> nn.Module | None:
    w, b = p.get("weight"), p.get("bias")
    shape = tuple(args["normalized_shape"])
    ln = nn.LayerNorm(shape, args.get("eps", 1e-5), elementwise_affine=w is not None, bias=b is not None, device="meta")
    ln.weight, ln.bias = w, b
    return ln


@functional_layer(F.linear, ("input", "weight", "bias"), ("weight", "bias"))
def _linear(args: dict[str, object], p: dict[str, torch.Tensor]) -> nn.Module | None:
    w, b = p["weight"], p.get("bias")
    lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
    lin.weight, lin.bias = w, b
    return lin


def _is_copy(ref: object) -> bool:
    """``param.clone()`` read by one call alone."""
    return isinstance(ref, fx.Node) and ref.op == "call_method" and ref.target == "clone" and len(ref.users) == 1 \
        and len(ref.args) == 1 and isinstance(ref.args[0], fx.Node) and ref.args[0].op == "get_attr"


def lift_functional_layers(gm: fx.GraphModule) -> int:
    """Rewrite registered functional calls into module calls, in place. Returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _BUILDERS:
            continue
        signature, param_names, builder = _BUILDERS[node.target]
        args = dict(zip(signature, node.args))
        args.update(node.kwargs)
        params: dict[str, torch.Tensor] = {}
        ok = True
        copies = []
        for name in param_names:
            ref = args.get(name)
            if ref is None:
                continue
            if _is_copy(ref):  # a parameter's copy (Swin V2's qkv bias) holds its values
                copies.append(ref)
                ref = args[name] = ref.args[0]
            # Only parameters read by this call alone: sharing them would need more care.
            if not (isinstance(ref, fx.Node) and ref.op == "get_attr" and len(ref.users) == 1):
                ok = False
                break
            value = get_attr(gm, ref.target)
            if not isinstance(value, nn.Parameter) and not (name in _STATISTICS and isinstance(value, torch.Tensor)):
                ok = False
                break
            params[name] = value
        if not ok or "input" not in args or any(isinstance(v, fx.Node) for k, v in args.items()
                                               if k not in param_names and k != "input"):
            continue
        module = builder(args, params)
        if module is None:
            continue
        target = _module_name(gm, node, [args[n] for n in param_names if args.get(n) is not None])
        set_attr(gm, target, module)
        refs = [args[n] for n in param_names if isinstance(args.get(n), fx.Node)]
        node.op, node.target, node.args, node.kwargs = "call_module", target, (args["input"],), {}
        for ref in copies + refs:
            if not ref.users:
                gm.graph.erase_node(ref)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _module_name(gm: fx.GraphModule, node: fx.Node, refs: list[fx.Node]) -> str:
    """Reuse the parameters' owner path (``blocks.0._depthwise_conv``) when that owner holds
    nothing else, so the state-dict names stay those of the original model."""
    owners = {r.target.rpartition(".")[0] for r in refs}
    if len(owners) == 1:
        (owner,) = owners
        if owner:
            stub = gm.get_submodule(owner)
            names = {r.target.rpartition(".")[2] for r in refs}
            if not list(stub.children()) and set(stub._parameters) | set(stub._buffers) <= names:
                return owner
    name = f"lifted_{node.name}"
    return name


def loosen_reshapes(gm: fx.GraphModule) -> int:
    """Write ``-1`` for the one literal size of a reshape whose other sizes are computed at run
    time (torchvision's ViT: ``x.reshape(n, 768, h * w)``), in place: the same reshape, now also
    right for a narrower tensor. Returns how many."""
    from autotailor.ir.ops.elementwise import reshape_sizes

    count = 0
    for node in gm.graph.nodes:
        if not (node.op == "call_method" and node.target in ("reshape", "view")):
            continue
        sizes = reshape_sizes(node)
        literal = [i for i, v in enumerate(sizes) if isinstance(v, int)]
        if len(literal) != 1 or sizes[literal[0]] == -1 or len(sizes) < 2 or node.kwargs:
            continue
        loose = list(sizes)
        loose[literal[0]] = -1
        node.args = (node.args[0], *loose)
        count += 1
    if count:
        gm.recompile()
    return count


def _matmul_operands(equation: str) -> tuple[bool, bool] | None:
    """For ``"...ic,...cj->...ij"`` with either operand's last two letters swapped: whether to
    transpose the first operand and the second. None for any other equation."""
    inputs, arrow, output = equation.replace(" ", "").partition("->")
    parts = inputs.split(",")
    if not arrow or len(parts) != 2 or "." in equation or any(len(set(p)) != len(p) for p in (*parts, output)):
        return None
    a, b = parts
    batch = output[:-2]
    if len(output) < 2 or a[:-2] != batch or b[:-2] != batch:
        return None
    i, j = output[-2:]
    (shared,) = set(a[-2:]) & set(b[-2:]) or {None}
    if shared is None or {*a[-2:]} != {i, shared} or {*b[-2:]} != {shared, j} or i == j:
        return None
    return a[-2:] != i + shared, b[-2:] != shared + j


def einsum_as_matmul(gm: fx.GraphModule) -> int:
    """Rewrite ``torch.einsum(eq, a, b)`` that is a batched matrix product into ``a @ b`` with the
    transposes it needs, in place. Returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if not (node.op == "call_function" and node.target is torch.einsum and len(node.args) == 3
                and isinstance(node.args[0], str) and not node.kwargs):
            continue
        plan = _matmul_operands(node.args[0])
        if plan is None:
            continue
        with gm.graph.inserting_before(node):
            a, b = (gm.graph.call_method("transpose", (x, -2, -1)) if flip else x
                    for x, flip in zip(node.args[1:], plan))
            product = gm.graph.call_function(torch.matmul, (a, b))
        node.replace_all_uses_with(product)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
