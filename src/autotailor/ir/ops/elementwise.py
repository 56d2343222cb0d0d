"""Weightless operations: activations, dropout, pooling, padding, arithmetic, reshaping and
reductions. None of them is sliced: they pass channel groups on (or fix them)."""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.ir.graph import bind, node_shape
from autotailor.ir.handlers import Default, Elementwise, Track, register

_POINTWISE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh,
    nn.LeakyReLU, nn.ELU, nn.Mish, nn.Hardtanh, nn.Dropout, nn.Dropout2d, nn.Identity,
)
_POINTWISE_FUNCTIONS = (
    F.relu, F.relu6, F.gelu, F.silu, F.hardswish, F.hardsigmoid, F.sigmoid, F.hardtanh, F.leaky_relu,
    F.dropout, F.mish, torch.relu, torch.sigmoid, torch.tanh,
)
_POINTWISE_METHODS = ("relu", "relu_", "sigmoid", "sigmoid_", "tanh", "contiguous", "clone")


def _stochastic_depth() -> tuple[object, ...]:
    # torchvision's stochastic depth drops whole samples ("row") or the whole batch: channel-blind.
    try:
        from torchvision.ops import stochastic_depth
    except ImportError:  # pragma: no cover - torchvision is a dependency
        return ()
    return (stochastic_depth,)


@register(*_POINTWISE_MODULES, *_POINTWISE_FUNCTIONS, *_POINTWISE_METHODS, *_stochastic_depth())
class Pointwise(Elementwise):
    """A channel-blind elementwise function (an activation, dropout): channels pass through."""

    same_shape = True

    def channels(self, a, node: fx.Node) -> Track | None:
        return a.track(node.args[0])

    def structure(self, module: nn.Module | None) -> str:
        return "act"

    def kind(self, module: nn.Module | None, target: object = None) -> str:
        if module is None:
            return super().kind(None, target)
        # A subclass of an activation is that activation (one kernel kind for fusion rules).
        base = next((c for c in type(module).__mro__ if c in self.keys), type(module))
        return base.__name__.lower()


@register(nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d,
          F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d)
class SpatialPool(Elementwise):
    """Pooling over the spatial axes of an NCHW tensor."""

    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is not None and t.axis != 1:
            a.fix(t.gid, f"{node.name} pools a tensor whose channels are not on axis 1")
            return None
        return t


@register(nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d, nn.ReplicationPad2d, F.pad)
class SpatialPad(Elementwise):
    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        nd = len(node_shape(node.args[0]))
        pad = tuple(a.module(node).padding) if node.op == "call_module" else \
            tuple(node.args[1] if len(node.args) > 1 else node.kwargs.get("pad", ()))
        # ``pad`` runs from the last axis backwards, two entries per axis.
        at = 2 * (nd - 1 - t.axis)
        if at >= len(pad) or pad[at:at + 2] == (0, 0):  # the channels are not padded (NHWC: Swin)
            return t
        a.fix(t.gid, f"{node.name} pads the channel axis")
        return None


ADD_TARGETS = (operator.add, operator.iadd, torch.add, "add", "add_")
MUL_TARGETS = (operator.mul, operator.imul, torch.mul, "mul", "mul_")


@register(*ADD_TARGETS, *MUL_TARGETS, operator.sub, operator.truediv, torch.sub, torch.div, "sub", "div")
class Binary(Elementwise):
    """Elementwise op with broadcasting: operands holding the channel axis share one group."""

    def channels(self, a, node: fx.Node) -> Track | None:
        out_shape = node_shape(node)
        operands = [x for x in (*node.args[:2], node.kwargs.get("other")) if isinstance(x, fx.Node)]
        if out_shape is None:
            a.fix_inputs(node, f"{node.name} has no tensor shape")
            return None
        tracked, untracked = [], []
        for x in operands:
            t, s = a.track(x), node_shape(x)
            if t is not None:
                tracked.append((t, t.axis + len(out_shape) - len(s)))
            elif s is not None:
                untracked.append((x, s))
        if not tracked:
            return None
        axis = tracked[0][1]
        if any(ax != axis for _, ax in tracked):
            a.fix_inputs(node, f"{node.name} combines tensors whose channels sit on different axes")
            return None
        gid = tracked[0][0].gid
        for t, _ in tracked[1:]:
            gid = a.union(gid, t.gid, node.name)
        for x, s in untracked:
            pos = axis - (len(out_shape) - len(s))
            if pos < 0 or s[pos] == 1:
                continue  # broadcast along the channels: nothing to slice
            if x.op == "get_attr":
                gid = a.add_param_member(gid, x, pos, node)
            else:
                a.fix(gid, f"{node.name} combines the channels with {x.name}, which the compiler does not track")
        return Track(axis, a.find(gid))


@register(nn.Flatten, torch.flatten, "flatten")
class Flatten(Elementwise):
    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        if node.op == "call_module":
            mod = a.module(node)
            start, end = mod.start_dim, mod.end_dim
        else:
            bound = bind(node, ("input", "start_dim", "end_dim"))
            start, end = bound.get("start_dim", 0), bound.get("end_dim", -1)
        shape = node_shape(node.args[0])
        nd = len(shape)
        start, end = start % nd, end % nd
        # Flattening [N, C, 1, 1] keeps C as a whole axis; anything larger mixes channels with space.
        if start == t.axis and all(s == 1 for s in shape[start + 1 : end + 1]):
            return t
        if t.axis < start:
            return t
        if t.axis > end:  # axes before the channels merged (tokens of a batch: LeViT's BatchNorm)
            return Track(t.axis - (end - start), t.gid)
        a.fix(t.gid, f"{node.name} flattens the channels together with other axes")
        return None


@register(torch.permute, "permute")
class Permute(Elementwise):
    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        dims = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
        if not dims:
            dims = node.kwargs.get("dims", ())
        nd = len(node_shape(node.args[0]))
        dims = [d % nd for d in dims]
        return Track(dims.index(t.axis), t.gid)


@register(torch.roll, "roll")
class Roll(Elementwise):
    """A cyclic shift (Swin's shifted windows): channels stay unless they are rolled."""

    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        bound = bind(node, ("input", "shifts", "dims"))
        dims, nd = bound.get("dims"), len(node_shape(node.args[0]))
        dims = () if dims is None else (dims,) if isinstance(dims, int) else tuple(dims)
        if dims and t.axis not in {d % nd for d in dims}:
            return t
        a.fix(t.gid, f"{node.name} rolls the channels")
        return None


@register(torch.transpose, torch.swapaxes, torch.swapdims, "transpose", "swapaxes", "swapdims")
class Transpose(Elementwise):
    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        bound = bind(node, ("input", "dim0", "dim1"))
        nd = len(node_shape(node.args[0]))
        # torch.swapaxes names them axis0 and axis1
        d0, d1 = bound.get("dim0", bound.get("axis0")) % nd, bound.get("dim1", bound.get("axis1")) % nd
        return Track({d0: d1, d1: d0}.get(t.axis, t.axis), t.gid)


@register(torch.unsqueeze, "unsqueeze", torch.squeeze, "squeeze")
class Squeeze(Elementwise):
    """An axis of one added or removed (an ONNX import's ``Unsqueeze``/``Squeeze``): the channels
    move with the axes before them; squeezing the channels themselves fixes them."""

    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        before, after = node_shape(node.args[0]), node_shape(node)
        kept = [i for i, s in enumerate(before) if s != 1]  # the axes that must survive, in order
        lead = sum(1 for i in kept if i < t.axis)
        found = [j for j, s in enumerate(after) if s == before[t.axis]
                 and sum(1 for x in after[:j] if x != 1) == lead]
        if before[t.axis] == 1 or len(found) != 1:
            a.fix(t.gid, f"{node.name} squeezes or unsqueezes next to the channels")
            return None
        return Track(found[0], t.gid)


@register(torch.reshape, "reshape", "view")
class Reshape(Elementwise):
    """A reshape that merges or splits axes other than the channels keeps them as one axis."""

    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        before, after = node_shape(node.args[0]), node_shape(node)
        sizes = reshape_sizes(node)
        lead = math.prod(before[: t.axis])
        for j in range(len(after)):
            if math.prod(after[:j]) == lead and after[j] == before[t.axis]:
                if len(sizes) == len(after) and isinstance(sizes[j], int) and sizes[j] != -1:
                    break  # the channel count is written into the graph
                return Track(j, t.gid)
        a.fix(t.gid, f"{node.name} reshapes the channels together with other axes")
        return None


def reshape_sizes(node: fx.Node) -> tuple:
    """The sizes a ``reshape``/``view`` call asks for (ints, or nodes computed at run time)."""
    sizes = node.args[1:] if node.target != torch.reshape else node.args[1:2]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = sizes[0]
    return tuple(sizes or node.kwargs.get("shape", ()))


@register("reshape_as", "view_as")
class ReshapeAs(Elementwise):
    """``x.reshape_as(other)`` where both hold the same channels (LeViT: a BatchNorm's output
    back to its linear layer's shape): one group, on ``other``'s channel axis."""

    def channels(self, a, node: fx.Node) -> Track | None:
        t, o = a.track(node.args[0]), a.track(node.args[1])
        if t is None or o is None or node_shape(node.args[0])[t.axis] != node_shape(node.args[1])[o.axis]:
            a.fix_inputs(node, f"{node.name} reshapes the channels like a tensor the compiler does not track")
            return None
        return Track(o.axis, a.union(t.gid, o.gid, node.name))


@register("expand")
class Expand(Elementwise):
    """Broadcasting a tensor to a larger batch (a class token to every image): channels stay."""

    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is not None and len(node_shape(node)) != len(node_shape(node.args[0])):
            a.fix(t.gid, f"{node.name} expands the tensor to more axes")
            return None
        return t


@register(torch.cat, torch.concat, torch.concatenate)
class Concat(Elementwise):
    """Concatenation along an axis other than the channels (tokens: a class token and the patches)
    couples the operands' channels; a parameter among them (through ``expand``) is sliced with
    them. Concatenating channels fixes them: which of them a slice keeps is not one prefix."""

    def channels(self, a, node: fx.Node) -> Track | None:
        bound = bind(node, ("tensors", "dim"))
        parts, out = list(bound["tensors"]), node_shape(node)
        dim = bound.get("dim", 0) % len(out)
        tracked = [a.track(x) for x in parts]
        if not any(tracked):
            return None
        axis = next(t.axis for t in tracked if t is not None)
        if axis == dim or any(t is not None and t.axis != axis for t in tracked):
            a.fix_inputs(node, f"{node.name} concatenates along the channels")
            return None
        gid = None
        for x, t in zip(parts, tracked):
            if t is not None:
                gid = t.gid if gid is None else a.union(gid, t.gid, node.name)
        for x, t in zip(parts, tracked):
            if t is not None:
                continue
            param = x.args[0] if isinstance(x, fx.Node) and x.op == "call_method" and x.target == "expand" else x
            if isinstance(param, fx.Node) and param.op == "get_attr" and len(node_shape(param)) == len(out):
                gid = a.add_param_member(gid, param, axis, param if param is x else x)
            else:
                a.fix(gid, f"{node.name} concatenates the channels with {getattr(x, 'name', x)}, which the "
                           "compiler does not track")
        return Track(axis, a.find(gid))


@register(operator.getitem)
class GetItem(Elementwise):
    """Indexing a tensor (``x[:, 0]``, the class token) keeps all its channels or fixes them."""

    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        nd = len(node_shape(node.args[0]))
        if Ellipsis in index:
            i = index.index(Ellipsis)
            index = index[:i] + (slice(None),) * (nd - len(index) + 1 + index.count(None)) + index[i + 1:]
        axis_in, axis_out = 0, 0
        for item in index:
            if item is None:
                axis_out += 1
                continue
            if axis_in == t.axis:
                if item == slice(None):
                    return Track(axis_out, t.gid)
                break
            axis_in += 1
            axis_out += 0 if isinstance(item, int) else 1
        else:
            return Track(axis_out + t.axis - axis_in, t.gid)
        a.fix(t.gid, f"{node.name} indexes into the channels")
        return None


def reduced(a, node: fx.Node, t: Track, dims: list[int], keep: bool) -> Track | None:
    """The channels after reducing ``dims``: unchanged unless the channel axis is reduced."""
    if t.axis in dims:
        a.fix(t.gid, f"{node.name} reduces over the channels")
        return None
    return Track(t.axis if keep else t.axis - sum(d < t.axis for d in dims), t.gid)


@register(torch.mean, "mean")
class Mean(Elementwise):
    def channels(self, a, node: fx.Node) -> Track | None:
        t = a.track(node.args[0])
        if t is None:
            return None
        bound = bind(node, ("input", "dim", "keepdim"))
        nd = len(node_shape(node.args[0]))
        dims = bound.get("dim")
        if dims is None:
            a.fix(t.gid, f"{node.name} averages over the channels")
            return None
        dims = [d % nd for d in ((dims,) if isinstance(dims, int) else dims)]
        return reduced(a, node, t, dims, bool(bound.get("keepdim", False)))


@register("new_zeros", "new_ones", "new_full", "new_empty")
class NewTensor(Elementwise):
    """A new tensor with the input's dtype and device (torchvision's Swin makes its shift mask
    with ``x.new_zeros((H, W))``): it reads no channels. Sizes it takes from the input are read
    by ``size``, whose rule covers them."""

    def channels(self, a, node: fx.Node) -> None:
        return None


@register(getattr, "size", "dim")
class ReadsShape(Elementwise):
    """Reading a shape. Code that reads the channel count and reshapes with it (torchvision's
    Swin: ``C`` of the input, then ``reshape(B, N, C)`` of the attention's output) ties the
    two tensors' channels: where the count reshapes another tracked tensor, keeping its
    channels on that axis, the two groups are one; any other use of it (arithmetic such as
    ``C // heads``, a guard, a new tensor's size) fixes the channels read."""

    def channels(self, a, node: fx.Node) -> None:
        t = a.track(node.args[0])
        if t is None or node.target == "dim" or (node.target is getattr and node.args[1] != "shape"):
            return None
        counts = _channel_counts(node, t.axis, len(node_shape(node.args[0])))
        if counts is None:
            a.fix(t.gid, f"{node.name} reads the whole shape, channels included, for "
                  + ", ".join(u.name for u in node.users))
        elif counts:
            a.defer(lambda: _tie_channel_counts(a, t.gid, counts))
        return None


def _channel_counts(node: fx.Node, axis: int, nd: int) -> list[fx.Node] | None:
    """The nodes holding the channel count that ``node`` (``x.shape``, ``x.size()``,
    ``x.size(k)``) reads; None when the whole shape is used as one value."""
    if node.target == "size" and (len(node.args) > 1 or "dim" in node.kwargs):
        k = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
        return [node] if k % nd == axis else []
    counts = []
    for user in node.users:
        if not (user.op == "call_function" and user.target is operator.getitem):
            return None
        index = user.args[1]
        if isinstance(index, int) and index % nd == axis:
            counts.append(user)
        elif isinstance(index, slice) and axis in range(nd)[index]:
            return None
    return counts


def _tie_channel_counts(a, gid: int, counts: list[fx.Node]) -> None:
    """Run once every node has its track: see ``ReadsShape``."""
    for count in counts:
        for user in count.users:
            out, src = a.track(user), a.track(user.args[0]) if user.args else None
            if (user.target in ("reshape", "view") and user.op == "call_method" and out is not None
                    and src is not None and reshape_sizes(user)[out.axis] is count):
                a.union(gid, src.gid, user.name)
            else:
                a.fix(gid, f"its channel count is read at run time and used by {user.name}")


@register(F.softmax, torch.softmax, "softmax", F.scaled_dot_product_attention, nn.MultiheadAttention)
class Attention(Default):
    """The mark of attention that templates count. No channel rule yet: it fixes its channels."""

    role = "attention"
