"""Channel-group analysis: which channel dimensions can be sliced together, and safely.

A *channel group* is a set of tensor dimensions that must keep the same channels: the output
channels of a convolution, the BatchNorm after it, the depthwise convolution that follows,
the input channels of the next convolution, the other operand of a residual add, and so on.
Each operator kind has one registered rule that says how it maps the channel groups of its
inputs to its output and which of its weights index each group (a *member*). An operator
without a rule fixes every group it touches, so width changes only where every user of the
channels is known to slice consistently: a compiled SuperNet cannot produce a SubNet that
fails to run. Supporting a new operator is one ``@channel_rule`` function.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from autotailor.compiler.graph_utils import node_shape, tensor_inputs


@dataclass(frozen=True)
class Member:
    """One place that indexes a channel group.

    ``role`` is ``out`` (produces the channels: conv/linear output), ``in`` (consumes them:
    conv/linear input), ``inout`` (maps channel i to channel i: BatchNorm, LayerNorm,
    depthwise/grouped conv) or ``param`` (a parameter used elementwise, sliced on ``axis``).
    """

    node: str
    role: str
    axis: int = 0


@dataclass
class ChannelGroup:
    """A set of coupled channel dimensions of ``size`` channels."""

    size: int
    members: list[Member] = field(default_factory=list)
    fixed: str | None = None  # why the group may not change, if it may not
    granularity: int = 1  # channels move in chunks of this size (grouped convolutions)

    @property
    def variable(self) -> bool:
        return self.fixed is None and self.size >= 2 * self.granularity and any(m.role == "out" for m in self.members)


@dataclass(frozen=True)
class _Track:
    axis: int  # which axis of the tensor holds the channels
    gid: int


Rule = Callable[["ChannelAnalysis", fx.Node], "_Track | None"]
_MODULE_RULES: dict[type, Rule] = {}
_FUNCTION_RULES: dict[object, Rule] = {}
_METHOD_RULES: dict[str, Rule] = {}


def channel_rule(*keys: object) -> Callable[[Rule], Rule]:
    """Register ``rule`` for module types, functions or method names (strings)."""

    def deco(rule: Rule) -> Rule:
        for key in keys:
            if isinstance(key, str):
                _METHOD_RULES[key] = rule
            elif isinstance(key, type) and issubclass(key, nn.Module):
                _MODULE_RULES[key] = rule
            else:
                _FUNCTION_RULES[key] = rule
        return rule

    return deco


class ChannelAnalysis:
    """Runs the rules over a shape-annotated GraphModule and collects the channel groups."""

    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        self._parent: list[int] = []
        self._groups: list[ChannelGroup] = []
        self._env: dict[fx.Node, _Track | None] = {}
        self._param_group: dict[str, int] = {}
        self._param_users: dict[str, set[str]] = {}

    # -- union-find over groups -------------------------------------------------------------
    def new_group(self, size: int) -> int:
        gid = len(self._groups)
        self._parent.append(gid)
        self._groups.append(ChannelGroup(size=size, fixed=None if size > 1 else "a single channel"))
        return gid

    def find(self, gid: int) -> int:
        while self._parent[gid] != gid:
            self._parent[gid] = self._parent[self._parent[gid]]
            gid = self._parent[gid]
        return gid

    def union(self, a: int, b: int, where: str) -> int:
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        ga, gb = self._groups[a], self._groups[b]
        self._parent[b] = a
        ga.members += gb.members
        ga.granularity = math.lcm(ga.granularity, gb.granularity)
        if ga.size != gb.size:
            ga.fixed = ga.fixed or f"channel counts {ga.size} and {gb.size} meet at {where}"
        ga.fixed = ga.fixed or gb.fixed
        return a

    def group(self, gid: int) -> ChannelGroup:
        return self._groups[self.find(gid)]

    def fix(self, gid: int, reason: str) -> None:
        g = self.group(gid)
        g.fixed = g.fixed or reason

    def add_member(self, gid: int, member: Member) -> None:
        self.group(gid).members.append(member)

    def add_param_member(self, gid: int, param: fx.Node, axis: int, user: fx.Node) -> int:
        # A parameter used by several ops couples their groups: it can only be sliced one way.
        self._param_users.setdefault(param.name, set()).add(user.name)
        prev = self._param_group.get(param.name)
        if prev is not None:
            return self.union(prev, gid, param.name)
        self._param_group[param.name] = gid
        self.add_member(gid, Member(param.name, "param", axis))
        return gid

    # -- per-node state -------------------------------------------------------------------------
    def track(self, arg: object) -> _Track | None:
        if not isinstance(arg, fx.Node):
            return None
        t = self._env.get(arg)
        return _Track(t.axis, self.find(t.gid)) if t else None

    def fix_inputs(self, node: fx.Node, reason: str) -> None:
        for arg in tensor_inputs(node):
            t = self.track(arg)
            if t is not None:
                self.fix(t.gid, reason)

    # -- driver -------------------------------------------------------------------------------------
    def run(self) -> list[ChannelGroup]:
        for node in self.gm.graph.nodes:
            self._env[node] = _rule_for(self.gm, node)(self, node)
        self._check_params()
        return self.groups()

    def _check_params(self) -> None:
        # A parameter member must be used only by the elementwise ops that registered it.
        nodes = {n.name: n for n in self.gm.graph.nodes}
        for name, gid in self._param_group.items():
            for user in nodes[name].users:
                if user.name not in self._param_users[name]:
                    self.fix(gid, f"parameter {nodes[name].target} is also used by {user.name}")

    def groups(self) -> list[ChannelGroup]:
        roots = sorted({self.find(i) for i in range(len(self._groups))})
        return [self._groups[r] for r in roots if self._groups[r].members]

    def module(self, node: fx.Node) -> nn.Module:
        return self.gm.get_submodule(node.target)


# -- rules --------------------------------------------------------------------------------------------


def _rule_for(gm: fx.GraphModule, node: fx.Node) -> Rule:
    if node.op == "call_module":
        for cls in type(gm.get_submodule(node.target)).__mro__:  # subclasses share their base's rule
            if cls in _MODULE_RULES:
                return _MODULE_RULES[cls]
        return _default_rule
    if node.op == "call_function":
        return _FUNCTION_RULES.get(node.target, _default_rule)
    if node.op == "call_method":
        return _METHOD_RULES.get(node.target, _default_rule)
    if node.op == "output":
        return _output_rule
    return _no_track  # placeholder, get_attr


def _no_track(a: ChannelAnalysis, node: fx.Node) -> None:
    return None


def _default_rule(a: ChannelAnalysis, node: fx.Node) -> None:
    a.fix_inputs(node, f"used by {node.name} ({_describe(node)}), which has no channel rule")
    return None


def _output_rule(a: ChannelAnalysis, node: fx.Node) -> None:
    a.fix_inputs(node, "reaches the model output")
    return None


def _describe(node: fx.Node) -> str:
    if node.op == "call_module":
        return type(node.graph.owning_module.get_submodule(node.target)).__name__
    return getattr(node.target, "__name__", str(node.target))


@channel_rule(nn.Conv2d)
def _conv2d(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    conv = a.module(node)
    t = a.track(node.args[0])
    if t is not None and t.axis != 1:
        a.fix(t.gid, f"{node.name} convolves a tensor whose channels are not on axis 1")
        t = None
    if conv.groups == 1:
        if t is not None:
            a.add_member(t.gid, Member(node.name, "in"))
        out = a.new_group(conv.out_channels)
        a.add_member(out, Member(node.name, "out"))
        return _Track(1, out)
    if conv.in_channels == conv.out_channels and t is not None:
        # Depthwise / grouped: channel i (its conv group) maps to channel i; whole groups are kept.
        a.add_member(t.gid, Member(node.name, "inout"))
        g = a.group(t.gid)
        g.granularity = math.lcm(g.granularity, conv.in_channels // conv.groups)
        return t
    if t is not None:
        a.fix(t.gid, f"{node.name} is a grouped convolution that changes the channel count")
    return None


@channel_rule(nn.BatchNorm2d)
def _batchnorm(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    t = a.track(node.args[0])
    if t is None:
        return None
    if t.axis != 1:
        a.fix(t.gid, f"{node.name} normalises axis 1 but the channels are on axis {t.axis}")
        return None
    a.add_member(t.gid, Member(node.name, "inout"))
    return t


def _last_axis(a: ChannelAnalysis, node: fx.Node, t: _Track) -> bool:
    shape = node_shape(node.args[0])
    return shape is not None and t.axis == len(shape) - 1


@channel_rule(nn.Linear)
def _linear(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    lin = a.module(node)
    t = a.track(node.args[0])
    if t is not None:
        if _last_axis(a, node, t):
            a.add_member(t.gid, Member(node.name, "in"))
        else:
            a.fix(t.gid, f"{node.name} reads features from an axis other than the channels")
    shape = node_shape(node)
    out = a.new_group(lin.out_features)
    a.add_member(out, Member(node.name, "out"))
    return _Track(len(shape) - 1, out)


@channel_rule(nn.LayerNorm)
def _layernorm(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    ln = a.module(node)
    t = a.track(node.args[0])
    if t is None:
        return None
    if len(ln.normalized_shape) == 1 and _last_axis(a, node, t):
        a.add_member(t.gid, Member(node.name, "inout"))
        return t
    a.fix(t.gid, f"{node.name} normalises more than the channel axis")
    return None


def _bind(node: fx.Node, names: tuple[str, ...]) -> dict[str, object]:
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    return bound


_POINTWISE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Hardswish, nn.Hardsigmoid, nn.Sigmoid, nn.Tanh,
    nn.LeakyReLU, nn.ELU, nn.Mish, nn.Hardtanh, nn.Dropout, nn.Dropout2d, nn.Identity,
)
_POINTWISE_FUNCTIONS = (
    F.relu, F.relu6, F.gelu, F.silu, F.hardswish, F.hardsigmoid, F.sigmoid, F.hardtanh, F.leaky_relu,
    F.dropout, F.mish, torch.relu, torch.sigmoid, torch.tanh,
)
_POINTWISE_METHODS = ("relu", "relu_", "sigmoid", "sigmoid_", "tanh", "contiguous", "clone")


@channel_rule(*_POINTWISE_MODULES, *_POINTWISE_FUNCTIONS, *_POINTWISE_METHODS)
def _pointwise(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    return a.track(node.args[0])


def is_pointwise(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether ``node`` applies a channel-blind elementwise function (an activation, dropout)."""
    return _rule_for(gm, node) is _pointwise


def _stochastic_depth_rule() -> None:
    # torchvision's stochastic depth drops whole samples ("row") or the whole batch: channel-blind.
    try:
        from torchvision.ops import stochastic_depth
    except ImportError:  # pragma: no cover - torchvision is a dependency
        return
    channel_rule(stochastic_depth)(_pointwise)


_stochastic_depth_rule()


@channel_rule(nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d,
              F.max_pool2d, F.avg_pool2d, F.adaptive_avg_pool2d, F.adaptive_max_pool2d)
def _spatial_pool(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    t = a.track(node.args[0])
    if t is not None and t.axis != 1:
        a.fix(t.gid, f"{node.name} pools a tensor whose channels are not on axis 1")
        return None
    return t


@channel_rule(nn.ZeroPad2d, nn.ConstantPad2d, nn.ReflectionPad2d, nn.ReplicationPad2d, F.pad)
def _spatial_pad(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    t = a.track(node.args[0])
    if t is None:
        return None
    nd = len(node_shape(node.args[0]))
    if node.op == "call_module":
        padded = len(a.module(node).padding) // 2
    else:
        pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad", ())
        padded = len(pad) // 2
    if t.axis < nd - padded:  # pads only axes after the channels
        return t
    a.fix(t.gid, f"{node.name} pads the channel axis")
    return None


_BINARY = (operator.add, operator.mul, operator.sub, operator.truediv, operator.iadd, operator.imul,
           torch.add, torch.mul, torch.sub, torch.div)
_BINARY_METHODS = ("add", "add_", "mul", "mul_", "sub", "div")


@channel_rule(*_BINARY, *_BINARY_METHODS)
def _binary(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    """Elementwise op with broadcasting: operands holding the channel axis share one group."""
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
    return _Track(axis, a.find(gid))


@channel_rule(nn.Flatten, torch.flatten, "flatten")
def _flatten(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    t = a.track(node.args[0])
    if t is None:
        return None
    if node.op == "call_module":
        mod = a.module(node)
        start, end = mod.start_dim, mod.end_dim
    else:
        bound = _bind(node, ("input", "start_dim", "end_dim"))
        start, end = bound.get("start_dim", 0), bound.get("end_dim", -1)
    shape = node_shape(node.args[0])
    nd = len(shape)
    start, end = start % nd, end % nd
    # Flattening [N, C, 1, 1] keeps C as a whole axis; anything larger mixes channels with space.
    if start == t.axis and all(s == 1 for s in shape[start + 1 : end + 1]):
        return t
    if t.axis < start:
        return t
    a.fix(t.gid, f"{node.name} flattens the channels together with other axes")
    return None


@channel_rule(torch.permute, "permute")
def _permute(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    t = a.track(node.args[0])
    if t is None:
        return None
    dims = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
    if not dims:
        dims = node.kwargs.get("dims", ())
    nd = len(node_shape(node.args[0]))
    dims = [d % nd for d in dims]
    return _Track(dims.index(t.axis), t.gid)


@channel_rule(torch.mean, "mean")
def _mean(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
    t = a.track(node.args[0])
    if t is None:
        return None
    bound = _bind(node, ("input", "dim", "keepdim"))
    nd = len(node_shape(node.args[0]))
    dims = bound.get("dim")
    if dims is None:
        a.fix(t.gid, f"{node.name} averages over the channels")
        return None
    dims = [d % nd for d in ((dims,) if isinstance(dims, int) else dims)]
    return _reduced(a, node, t, dims, bool(bound.get("keepdim", False)))


def _reduced(a: ChannelAnalysis, node: fx.Node, t: _Track, dims: list[int], keep: bool) -> _Track | None:
    """The channels after reducing ``dims``: unchanged unless the channel axis is reduced."""
    if t.axis in dims:
        a.fix(t.gid, f"{node.name} reduces over the channels")
        return None
    return _Track(t.axis if keep else t.axis - sum(d < t.axis for d in dims), t.gid)


@channel_rule(getattr, "size", "dim")
def _reads_shape(a: ChannelAnalysis, node: fx.Node) -> None:
    # Reading a shape does not constrain the channels: code that uses it adapts to any width.
    return None


def _register_onnx2torch_rules() -> None:
    """onnx2torch's own modules, so that an ONNX model gets the same space as its PyTorch source."""
    try:
        from onnx2torch.node_converters import (
            activations, binary_math_operations, global_average_pool, reduce, transpose,
        )
    except ImportError:  # pragma: no cover - onnx2torch is a dependency
        return

    channel_rule(activations.OnnxErf, activations.OnnxHardSigmoid)(_pointwise)

    def onnx_transpose(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
        t = a.track(node.args[0])
        perm = a.module(node).perm
        if t is None:
            return None
        nd = len(node_shape(node.args[0]))
        perm = list(range(nd))[::-1] if perm is None else [d % nd for d in perm]
        return _Track(perm.index(t.axis), t.gid)

    channel_rule(transpose.OnnxTranspose)(onnx_transpose)

    def onnx_reduce(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
        t = a.track(node.args[0])
        mod = a.module(node)
        if t is None:
            return None
        if mod.operation_type not in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum") or not mod.axes:
            a.fix(t.gid, f"{node.name} ({mod.operation_type}) has no channel rule")
            return None
        nd = len(node_shape(node.args[0]))
        return _reduced(a, node, t, [d % nd for d in mod.axes], mod.keepdims)

    channel_rule(reduce.OnnxReduceStaticAxes)(onnx_reduce)

    def onnx_binary(a: ChannelAnalysis, node: fx.Node) -> _Track | None:
        fn = a.module(node).math_op_function
        if fn not in (torch.add, torch.sub, torch.mul, torch.div, binary_math_operations._onnx_div):
            a.fix_inputs(node, f"{node.name} has no channel rule")
            return None
        return _binary(a, node)

    channel_rule(binary_math_operations.OnnxBinaryMathOperation)(onnx_binary)
    for name in dir(global_average_pool):
        cls = getattr(global_average_pool, name)
        if isinstance(cls, type) and issubclass(cls, nn.Module) and name.startswith("OnnxGlobalAveragePool"):
            channel_rule(cls)(_spatial_pool)


_register_onnx2torch_rules()


def analyse_channels(gm: fx.GraphModule) -> list[ChannelGroup]:
    """Channel groups of a GraphModule whose nodes carry ``tensor_meta`` (see ``propagate_shapes``)."""
    return ChannelAnalysis(gm).run()
