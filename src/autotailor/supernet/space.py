"""The modification space: variables, exact size, sampling and validation of architectures.

An architecture (``Arch``) is a plain JSON-serialisable dict from variable name to choice,
for example ``{"resolution": 192, "stage2.reduce_depth": -1, "block5.expand_ratio": 0.75}``.
Variables missing from an arch take their largest choice.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotailor.compiler.variables import Variable, kind
from autotailor.errors import ArchError

Arch = dict[str, Any]

@dataclass(frozen=True)
class StageInfo:
    """A stage: its anchor block and the droppable blocks after it, in order."""

    anchor: int
    droppable: tuple[int, ...]


class Space:
    """The set of SubNets of a SuperNet."""

    def __init__(self, variables: list[Variable], stages: list[StageInfo]):
        self.variables = list(variables)
        self.stages = list(stages)
        self._by_name = {v.name: v for v in self.variables}
        if len(self._by_name) != len(self.variables):
            dup = sorted({v.name for v in self.variables if sum(w.name == v.name for w in self.variables) > 1})
            raise ArchError(f"duplicate variable names {dup}: every variable of a space needs its own name")

    @functools.cached_property
    def _depths(self) -> list[tuple[Variable, tuple[int, ...]]]:
        """What ``dropped_blocks`` reads on every ``key``: the depth variables and their stages'
        blocks (computed on first use, so that a Space pickled without it loads too)."""
        return [(v, self.stages[v.stage].droppable) for v in self.variables if kind(v.kind).drops_blocks]

    def __getitem__(self, name: str) -> Variable:
        if name not in self._by_name:
            raise ArchError(f"no variable {name!r} in this space; it has {', '.join(list(self._by_name)[:6])}, ...")
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.variables)

    @property
    def num_modifications(self) -> int:
        """Single modifications: for each variable, every choice but the largest."""
        return sum(len(v.choices) - 1 for v in self.variables)

    @property
    def size(self) -> int:
        """Exact number of distinct SubNets (a dropped block's own choices do not count)."""
        depth_var = {v.stage: v for v in self.variables if kind(v.kind).drops_blocks}
        local: dict[int, int] = {}
        total = 1
        counted_blocks = {b for s, st in enumerate(self.stages) if s in depth_var for b in st.droppable}
        for v in self.variables:
            if kind(v.kind).drops_blocks:
                continue
            if v.block is not None and v.block in counted_blocks:
                local[v.block] = local.get(v.block, 1) * len(v.choices)
            else:
                total *= len(v.choices)
        for s, var in depth_var.items():
            blocks = self.stages[s].droppable
            stage_total = 0
            for d in var.choices:
                stage_total += math.prod(local.get(b, 1) for b in blocks[: len(blocks) + var.value(d)])
            total *= stage_total
        return total

    @property
    def log10_size(self) -> float:
        return math.log10(self.size)

    # -- architectures ---------------------------------------------------------------------------
    def max(self) -> Arch:
        """The largest architecture (the original model)."""
        return {v.name: v.choices[-1] for v in self.variables}

    def min(self) -> Arch:
        """The smallest architecture."""
        return {v.name: v.choices[0] for v in self.variables}

    def sample(self, rng: "random.Random | np.random.Generator | int | None" = None) -> Arch:
        """A random architecture: every variable drawn uniformly and independently."""
        if rng is None or isinstance(rng, int):
            rng = random.Random(rng)
        if isinstance(rng, np.random.Generator):
            pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
        else:
            pick = rng.choice
        return {v.name: pick(v.choices) for v in self.variables}

    def complete(self, arch: Arch) -> Arch:
        """Validate ``arch`` and fill in missing variables with their largest choice."""
        if not isinstance(arch, dict):
            raise ArchError(f"an architecture is a dict of variable -> choice, not {type(arch).__name__}")
        unknown = [k for k in arch if k not in self._by_name]
        if unknown:
            sample = ", ".join(list(self._by_name)[:6])
            raise ArchError(f"unknown variable(s) {unknown}; this space has {len(self)} variables, e.g. {sample}")
        full = {}
        for v in self.variables:
            value = arch.get(v.name, v.choices[-1])
            if value not in v.choices:
                raise ArchError(f"{v.name} = {value!r} is not a choice; allowed: {list(v.choices)}")
            full[v.name] = value
        return full

    def key(self, arch: Arch) -> tuple:
        """A hashable key of a complete ``arch`` (what caches key on): its choices in variable
        order, those of the blocks it drops at their largest, so that archs that are one network
        share a key."""
        dropped = self.dropped_blocks(arch)
        return tuple(v.largest if v.block in dropped else arch[v.name] for v in self.variables)

    def dropped_blocks(self, arch: Arch) -> set[int]:
        """The droppable blocks ``arch`` leaves out (a stage's depth choice -d drops its last d
        layers: ``Variable.value`` blocks)."""
        out: set[int] = set()
        for v, droppable in self._depths:
            d = v.value(arch.get(v.name, 0))
            if d:
                out.update(droppable[len(droppable) + d:])
        return out

    def canonical(self, arch: Arch) -> Arch:
        """``arch`` completed, with the variables of the blocks it drops at their largest choice:
        two archs that differ only there are the same SubNet and have the same canonical form."""
        return dict(zip((v.name for v in self.variables), self.key(self.complete(arch))))

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": v.name, "kind": v.kind, "choices": list(v.choices), "targets": list(v.targets)}
            for v in self.variables
        ]
