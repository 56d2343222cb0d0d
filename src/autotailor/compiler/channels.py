"""Channel-group analysis: which channel dimensions can be sliced together, and safely.

A *channel group* is a set of tensor dimensions that must keep the same channels: the output
channels of a convolution, the BatchNorm after it, the depthwise convolution that follows,
the input channels of the next convolution, the other operand of a residual add, and so on.
Each operator's handler (``ir.handlers``) says how it maps the channel groups of its inputs
to its output and which of its weights index each group (a *member*). An operator without a
handler fixes every group it touches, so width changes only where every user of the channels
is known to slice consistently: a compiled SuperNet cannot produce a SubNet that fails to run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch.fx as fx
import torch.nn as nn

from autotailor.ir import handlers
from autotailor.ir.graph import tensor_inputs
from autotailor.ir.handlers import Member, Track


@dataclass
class ChannelGroup:
    """A set of coupled channel dimensions of ``size`` channels."""

    size: int
    members: list[Member] = field(default_factory=list)
    fixed: str | None = None  # why the group may not change, if it may not
    granularity: int = 1  # channels move in chunks of this size (grouped convolutions, heads)
    split_by: str | None = None  # the attention node that splits these channels into heads

    @property
    def variable(self) -> bool:
        """Whether a width variable may slice it (heads are sliced by the heads variable instead)."""
        return (self.fixed is None and self.split_by is None and self.size >= 2 * self.granularity
                and any(m.role == "out" for m in self.members))


class ChannelAnalysis:
    """Runs the rules over a shape-annotated GraphModule and collects the channel groups."""

    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        self._parent: list[int] = []
        self._groups: list[ChannelGroup] = []
        self._env: dict[fx.Node, Track | None] = {}
        self._param_group: dict[str, int] = {}
        self._param_users: dict[str, set[str]] = {}
        self._deferred: list[Callable[[], None]] = []

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
        if ga.split_by and gb.split_by and ga.split_by != gb.split_by:
            ga.fixed = ga.fixed or f"{ga.split_by} and {gb.split_by} split the same channels into heads"
        ga.split_by = ga.split_by or gb.split_by
        if ga.size != gb.size:
            ga.fixed = ga.fixed or f"channel counts {ga.size} and {gb.size} meet at {where}"
        ga.fixed = ga.fixed or gb.fixed
        return a

    def group(self, gid: int) -> ChannelGroup:
        return self._groups[self.find(gid)]

    def fix(self, gid: int, reason: str) -> None:
        g = self.group(gid)
        g.fixed = g.fixed or reason

    def split(self, gid: int, node: str, per_head: int) -> None:
        """``node`` splits the group's channels into heads of ``per_head`` channels each."""
        g = self.group(gid)
        if g.split_by not in (None, node):
            g.fixed = g.fixed or f"{g.split_by} and {node} split the same channels into heads"
        g.split_by = node
        g.granularity = math.lcm(g.granularity, per_head)

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
    def track(self, arg: object) -> Track | None:
        if not isinstance(arg, fx.Node):
            return None
        t = self._env.get(arg)
        return Track(t.axis, self.find(t.gid)) if t else None

    def fix_inputs(self, node: fx.Node, reason: str) -> None:
        for arg in tensor_inputs(node):
            t = self.track(arg)
            if t is not None:
                self.fix(t.gid, reason)

    def defer(self, rule: Callable[[], None]) -> None:
        """Run ``rule`` once every node has its track (a rule about a node's later users)."""
        self._deferred.append(rule)

    # -- driver -------------------------------------------------------------------------------------
    def run(self) -> list[ChannelGroup]:
        for node in self.gm.graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                self._env[node] = None
            elif node.op == "output":
                self._env[node] = _output_rule(self, node)
            else:
                self._env[node] = handlers.for_node(self.gm, node).channels(self, node)
        for rule in self._deferred:
            rule()
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


def _output_rule(a: ChannelAnalysis, node: fx.Node) -> None:
    a.fix_inputs(node, "reaches the model output")
    return None


def analyse_channels(gm: fx.GraphModule) -> list[ChannelGroup]:
    """Channel groups of a GraphModule whose nodes carry ``tensor_meta`` (see ``propagate_shapes``)."""
    return ChannelAnalysis(gm).run()
