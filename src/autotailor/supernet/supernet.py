"""SuperNet: the executable weight-sharing network, its space, and SubNet extraction."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.compiler.config import TailorConfig
from autotailor.ir.graph import get_attr
from autotailor.errors import ArchError, AutoTailorError
from autotailor.files import atomic_write
from autotailor.ir import Block, DynParam, Operator
from autotailor.ir.shapes import deduce_shapes
from autotailor.supernet.space import Arch, Space

_FORMAT = "autotailor-supernet/2"  # 2: operator handlers (ir/ops), variable kinds

class SuperNet(nn.Module):
    """A compiled model whose SubNets share its weights.

    ``set_arch(arch)`` selects a SubNet in place; ``forward`` runs it; ``extract(arch)``
    returns it as a plain module; ``space`` describes every SubNet.
    """

    def __init__(self, net: fx.GraphModule, space: Space, block_templates: dict[int, str],
                 example_shape: tuple[int, ...], config: TailorConfig):
        super().__init__()
        self.net = net
        self.space = space
        self.example_shape = example_shape
        self.config = config
        self.block_templates = block_templates
        self.compile_info: dict[str, Any] = {}
        self._arch: Arch = space.max()

    # -- architecture ------------------------------------------------------------------------------
    @property
    def arch(self) -> Arch:
        """The active architecture."""
        return dict(self._arch)

    def input_shape(self, arch: Arch | None = None) -> tuple[int, ...]:
        """Input shape (batch 1) of ``arch`` or of the active architecture."""
        arch = self.space.complete(arch) if arch is not None else self._arch
        r = arch.get("resolution", self.example_shape[-1])
        return (1, self.example_shape[1], r, r)

    def operators(self) -> list[tuple[str, Operator]]:
        return [(n, m) for n, m in self.net.named_modules() if isinstance(m, Operator)]

    def blocks(self) -> list[Block]:
        return [m for m in self.net.modules() if isinstance(m, Block)]

    def set_arch(self, arch: Arch) -> None:
        """Make ``arch`` the active SubNet (missing variables take their largest choice)."""
        arch = self.space.complete(arch)
        for _, op in self.operators():
            op.feature.reset()
            if op.reads:
                op.transform(**{f: self.space[v].value(arch[v]) for f, v in op.reads.items()})
        dropped = self.space.dropped_blocks(arch)
        for block in self.blocks():
            block.transform(enabled=block.index not in dropped)
        self._arch = arch

    @contextmanager
    def using(self, arch: Arch | None) -> Iterator["SuperNet"]:
        """Within the block, ``arch`` is the active SubNet (None: the active one stays); on exit
        the architecture that was active before is restored, whatever happened."""
        previous = self._arch
        if arch is not None:
            self.set_arch(arch)
        try:
            yield self
        finally:
            if arch is not None:
                self.set_arch(previous)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def deduce_shapes(self, arch: Arch | None = None) -> dict[str, tuple[int, ...]]:
        """Every node's output shape for ``arch`` (default: the active one), deduced from the
        input shape by the operators' rules, without running the network."""
        with self.using(arch):
            return deduce_shapes(self.net, self.input_shape())

    # -- extraction ------------------------------------------------------------------------------------
    def extract(self, arch: Arch | None = None) -> fx.GraphModule:
        """The SubNet ``arch`` (default: the active one) as a standalone module.

        The result holds copies of the active weight slices and only torch layers and the
        model's own functions: it runs, exports and pickles without AutoTailor.
        """
        with self.using(arch):
            root = nn.Module()
            graph = fx.Graph()
            used: set[str] = set()

            def unique(name: str) -> str:
                base = name.replace(".", "_") or "m"
                cand, i = base, 1
                while cand in used:
                    cand, i = f"{base}_{i}", i + 1
                used.add(cand)
                return cand

            out = _emit(self.net, graph, root, None, unique)
            graph.output(out)
            net = fx.GraphModule(copy.deepcopy(root), graph, class_name="SubNet")
            net.train(self.training)
            return net

    # -- persistence --------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the SuperNet (weights, space, structure) to ``path`` atomically."""
        with atomic_write(path) as tmp:
            torch.save({"format": _FORMAT, "supernet": self}, tmp)


def load(path: str | Path) -> SuperNet:
    """Load a SuperNet written by ``SuperNet.save``, or the one of a work directory (``WORK/supernet.pt``)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "supernet.pt").is_file():
            raise AutoTailorError(f"{path} holds no supernet.pt; run `autotailor compile MODEL --out {path}` first")
        path = path / "supernet.pt"
    if not path.is_file():
        raise AutoTailorError(f"no SuperNet file at {path}")
    try:
        data = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as exc:
        raise AutoTailorError(f"{path} is not a SuperNet file: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise AutoTailorError(f"{path} is not a SuperNet file of format {_FORMAT}"
                              + (f" but of {found}: compile the model again with this version" if found else ""))
    return data["supernet"]


def _emit(gm: fx.GraphModule, graph: fx.Graph, root: nn.Module, entry: fx.Node | None, unique) -> Any:
    """Copy ``gm``'s graph into ``graph``, inlining enabled blocks and building static layers.

    ``entry`` is the value bound to the placeholder (None at the top level). Returns the
    value of the output node.
    """
    env: dict[fx.Node, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if entry is not None:
                env[node] = entry
            else:  # keep optional inputs optional (timm's ``attn_mask=None``)
                default = node.args[0] if node.args else inspect.Signature.empty
                env[node] = graph.placeholder(node.name, default_value=default)
        elif node.op == "output":
            return fx.node.map_arg(node.args[0], lambda n: env[n])
        elif node.op == "get_attr":
            name = unique(node.target)
            value = get_attr(gm, node.target)
            if isinstance(value, nn.Parameter):
                root.register_parameter(name, nn.Parameter(value.detach().clone(), value.requires_grad))
            elif isinstance(value, torch.Tensor):
                root.register_buffer(name, value.detach().clone())
            else:
                setattr(root, name, copy.deepcopy(value))
            env[node] = graph.get_attr(name)
        elif node.op == "call_module":
            mod = gm.get_submodule(node.target)
            args = fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
            if isinstance(mod, Block):
                env[node] = _emit(mod.body, graph, root, args[0], unique) if mod.feature.active.enabled else args[0]
            elif isinstance(mod, DynParam):
                name = unique(node.target)
                value = mod.build()
                if isinstance(mod.value, nn.Parameter):
                    root.register_parameter(name, nn.Parameter(value, mod.value.requires_grad))
                else:
                    root.register_buffer(name, value)
                env[node] = graph.get_attr(name)
            else:
                name = unique(node.target)
                root.add_module(name, mod.build() if isinstance(mod, Operator) else mod)
                env[node] = graph.call_module(name, args, kwargs)
        else:
            args = fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
            env[node] = graph.create_node(node.op, node.target, args, kwargs, name=node.name)
    raise ArchError("graph without output")  # pragma: no cover

