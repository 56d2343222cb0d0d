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
from autotailor.errors import AutoTailorError
from autotailor.files import atomic_write
from autotailor.ir import Block, DynParam, Operator
from autotailor.ir.shapes import deduce_shapes
from autotailor.ir.walk import GraphWalker
from autotailor.supernet.space import Arch, Space

_FORMAT = "autotailor-supernet/5"  # 2: operator handlers (ir/ops), variable kinds; 3: heads (Operator.units); 4: q/k width per head; 5: value width per head

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
                op.transform(**{f: self.space[v].value(arch[v]) * op.units.get(f, 1) for f, v in op.reads.items()})
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
            emitter = _Emitter(self.net)
            emitter.out.output(emitter.run())
            net = fx.GraphModule(copy.deepcopy(emitter.root), emitter.out, class_name="SubNet")
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


class _Emitter(GraphWalker):
    """Copies the active SubNet's graph into ``out``: enabled blocks inlined, dynamic operators
    built as static layers, constants copied into ``root`` under unique names."""

    def __init__(self, gm: fx.GraphModule, prefix: str = "", block: int | None = None,
                 parent: "_Emitter | None" = None):
        super().__init__(gm, prefix, block, parent)
        if parent is None:
            self.out, self.root, self.used = fx.Graph(), nn.Module(), set()
        else:
            self.out, self.root, self.used = parent.out, parent.root, parent.used

    def _unique(self, name: str) -> str:
        base = name.replace(".", "_") or "m"
        cand, i = base, 1
        while cand in self.used:
            cand, i = f"{base}_{i}", i + 1
        self.used.add(cand)
        return cand

    def _constant(self, target: str, value: Any, requires_grad: bool | None = None) -> fx.Node:
        name = self._unique(target)
        if isinstance(value, torch.Tensor) and requires_grad is not None:
            self.root.register_parameter(name, nn.Parameter(value.detach().clone(), requires_grad))
        elif isinstance(value, torch.Tensor):
            self.root.register_buffer(name, value.detach().clone())
        else:
            setattr(self.root, name, copy.deepcopy(value))
        return self.out.get_attr(name)

    def placeholder(self, target, args, kwargs):
        if self.parent is not None:
            return super().placeholder(target, args, kwargs)
        n = self.node  # keep optional inputs optional (timm's ``attn_mask=None``)
        return self.out.placeholder(n.name, default_value=n.args[0] if n.args else inspect.Signature.empty)

    def get_attr(self, target, args, kwargs):
        value = get_attr(self.module, target)
        return self._constant(target, value, value.requires_grad if isinstance(value, nn.Parameter) else None)

    def call_layer(self, target, mod, args, kwargs):
        if isinstance(mod, DynParam):
            return self._constant(target, mod.build(),
                                  mod.value.requires_grad if isinstance(mod.value, nn.Parameter) else None)
        name = self._unique(target)
        self.root.add_module(name, mod.build() if isinstance(mod, Operator) else mod)
        return self.out.call_module(name, args, kwargs)

    def call_function(self, target, args, kwargs):
        return self.out.create_node(self.node.op, target, args, kwargs, name=self.node.name)

    call_method = call_function
