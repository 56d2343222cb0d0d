"""Block: a droppable sub-graph of the SuperNet, outlined into its own GraphModule."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn

from autotailor.ir.feature import Feature


@dataclass(frozen=True)
class BlockSpec:
    enabled: bool = True


class Block(nn.Module):
    """A residual block with an identity shortcut. Disabled, it passes its input through,
    which is exactly the network without that block (input and output shapes are equal)."""

    def __init__(self, body: fx.GraphModule, index: int, template: str):
        super().__init__()
        self.body = body
        self.index = index
        self.template = template
        self.feature = Feature.of(BlockSpec(True))

    def transform(self, enabled: bool) -> None:
        self.feature.transform(f"block{self.index}", enabled=enabled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) if self.feature.active.enabled else x
