"""A LegoDNN-style block-grained scaling baseline (Han et al., MobiCom 2021) for ``baselines.py``:
built from the same trained base model, in plain PyTorch, on ``block_scaling``.

What carries over from the paper, and how it is sized here:

- **Descendant blocks**: each residual block of the base model gets descendants with its hidden
  channels pruned (filter pruning by L1 norm) to each fraction of ``KEEP``, the block's input
  and output shapes kept, so any combination of descendants is a model. No depth change: that
  is AdaptiveNet's addition.
- **Retraining**: block-wise, the originals frozen: each descendant learns to map the original
  block's input feature to its output (L2), every descendant of every block on every batch.
- **Profiling**: each descendant's accuracy drop when it alone replaces its block in the
  original model (validation images, BatchNorm recalibrated), and its latency on the device
  (``block_scaling.LatencyTable``).
- **Selection** (``select``): for a budget, one descendant or the original per block, maximizing
  the original's accuracy minus the sum of the chosen descendants' drops under the summed
  latency: a 0-1 integer program, solved exactly (``scipy.optimize.milp``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from autotailor.tune import CpuTime
from block_scaling import BlockScalingNet, Choice, LatencyTable, Path_, train_variants

KEEP = (0.8, 0.6, 0.4, 0.2)
# ONNX Runtime's x86 convolutions are fast for channel counts in multiples of 8, as NestDNN*'s ROUND_TO
MULTIPLE = 8


def supernet(model: nn.Module, name: str) -> BlockScalingNet:
    """The LegoDNN-style block pool of the trained ``model``: each block and its descendants."""
    return BlockScalingNet(model, name, KEEP, depth=False, multiple=MULTIPLE)


def train(net: BlockScalingNet, loader, steps: int, checkpoint: Path, lr: float = 0.03,
          checkpoint_every: int = 200, fallback: dict | None = None) -> CpuTime:
    """Block-wise retraining of every descendant on every batch (``block_scaling.train_variants``:
    resumable from ``checkpoint``, else ``fallback``). Returns the CPU time over all runs."""
    descendants = [(i, c) for i in range(net.n) for c in net.options(i) if c[0] == "shrink"]

    def step_loss(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        net.variants.train()  # the originals stay in eval mode
        with torch.no_grad():
            feats = net.teacher_features(x)
        return sum(F.mse_loss(net.module(i, c)(feats[i]), feats[i + 1]) for i, c in descendants) / len(descendants)

    try:
        return train_variants(net, loader, steps, checkpoint, step_loss, lr, checkpoint_every, fallback,
                              lambda step: "block-wise retraining")
    finally:
        net.eval()


def replaced(net: BlockScalingNet, i: int, choice: Choice) -> Path_:
    """The original model with block ``i`` replaced by ``choice``."""
    return tuple(choice if j == i else ("orig", 0) for j in range(net.n))


def drops(net: BlockScalingNet, accuracy: Callable[[Path_], float]) -> dict[str, float]:
    """Each descendant's accuracy drop (``accuracy`` of the original minus that with the
    descendant in its block's place), keyed as ``LatencyTable``'s entries."""
    base = accuracy(net.largest())
    return {f"{i}_{c[0]}{c[1]}": base - accuracy(replaced(net, i, c))
            for i in range(net.n) for c in net.options(i) if c[0] != "orig"}


def select(net: BlockScalingNet, table: LatencyTable, drop: dict[str, float], budget_ms: float) -> Path_ | None:
    """The combination of one choice per block with the least summed accuracy drop whose summed
    latency fits ``budget_ms``, or None if not even the smallest does."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    options = [(i, c) for i in range(net.n) for c in net.options(i)]
    cost = np.array([0.0 if c[0] == "orig" else drop[f"{i}_{c[0]}{c[1]}"] for i, c in options])
    ms = np.array([table.choice_ms(i, c) for i, c in options])
    one_each = np.array([[1.0 if i == block else 0.0 for i, _ in options] for block in range(net.n)])
    room = budget_ms - table.ms["prefix"] - table.ms["suffix"]
    result = milp(cost, integrality=np.ones(len(options)), bounds=Bounds(0, 1),
                  constraints=[LinearConstraint(one_each, 1, 1), LinearConstraint(ms[None, :], -np.inf, room)])
    if result.x is None:
        return None
    chosen = {options[k][0]: options[k][1] for k in np.flatnonzero(result.x > 0.5)}
    return tuple(chosen[i] for i in range(net.n))
