"""An AdaptiveNet-style block-scaling SuperNet (Wen et al., MobiCom 2023), the baseline of
``baselines.py``: built from the same trained base model, in plain PyTorch, on ``block_scaling``.

What carries over from the paper (section 4 and 5), and how it is sized here:

- **Graph expansion**: the base model's residual blocks are the basic blocks ``B_i``. Each gets
  *shrunk* variants (its hidden channels cut to ``SHRINK`` of their number by L1 norm, the way
  structured pruning does) and, where the next block keeps the shape, a *merged* variant that
  replaces ``B_i`` and ``B_i+1`` (a copy of ``B_i``, whose shapes it already has) and a *skip*
  (the identity, for a shape-keeping block). A SubNet is a path: one variant per position, a
  merged one taking two.
- **Training**: the original blocks stay frozen (the base model's accuracy is kept). First
  branch-wise distillation: each step samples a path and trains its new blocks to map the
  teacher's feature entering them to the teacher's feature leaving the last block they
  replace (L2). Then tuning: each step samples a path and trains its new blocks on the labels.
- **Search** (``nearby_search``): the latency model is a table of per-variant latencies
  measured on the device, summed along a path; candidates start and mutate within
  ``[T - dT, T + dT]`` of the budget (NearbyInit, NearbyMutate) and their accuracy is measured
  on validation images; the most accurate within the budget wins.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotailor.tune import CpuTime
from block_scaling import BlockScalingNet, Choice, LatencyTable, Path_, train_variants

SHRINK = (0.75, 0.5)


def supernet(model: nn.Module, name: str) -> BlockScalingNet:
    """The AdaptiveNet-style SuperNet of the trained ``model``: shrunk, merged and skipped blocks."""
    return BlockScalingNet(model, name, SHRINK, depth=True)


def train(net: BlockScalingNet, loader, steps: int, checkpoint: Path, lr: float = 0.03, seed: int = 0,
          checkpoint_every: int = 200, fallback: dict | None = None) -> CpuTime:
    """Half the steps branch-wise distillation, half tuning on the labels, each step one sampled
    path's new blocks (``block_scaling.train_variants``: resumable from ``checkpoint``, else
    ``fallback``). Every step's path and batch are functions of the seed and the step. Returns
    the CPU time over all runs."""
    distill = steps // 2

    def step_loss(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        path = net.sample(random.Random(f"{seed}:{step}"))
        new = [(i, c) for i, c in net.steps(path) if c[0] in ("shrink", "merge")]
        if not new:
            return None
        for i, c in new:
            net.module(i, c).train()
        if step < distill:
            with torch.no_grad():
                feats = net.teacher_features(x)
            loss = sum(F.mse_loss(net.module(i, c)(feats[i]), feats[i + 1 + (c[1] if c[0] == "merge" else 0)])
                       for i, c in new) / len(new)
        else:
            loss = F.cross_entropy(net.subnet(path)(x), y, label_smoothing=0.1)
        for i, c in new:  # BatchNorm statistics gathered in this forward; eval again for the next path
            net.module(i, c).eval()
        return loss

    return train_variants(net, loader, steps, checkpoint, step_loss, lr, checkpoint_every, fallback,
                          lambda step: "distillation" if step < distill else "tuning")


def nearby_search(net: BlockScalingNet, table: LatencyTable, budget_ms: float, accuracy, seed: int = 0,
                  population: int = 8, iterations: int = 5, window: float = 0.1) -> tuple[Path_, float] | None:
    """AdaptiveNet's search for one budget: candidates sampled within ``window`` of the budget
    (NearbyInit), mutated one branch at a time and pulled back into the window by the branch
    change that best restores the latency (NearbyMutate); ``accuracy(path)`` measures. Returns
    the most accurate path within the budget and its accuracy, or None."""
    rng = random.Random(seed)
    lo, hi = budget_ms * (1 - window), budget_ms * (1 + window)
    inside = lambda p: lo <= table.path_ms(net, p) <= hi  # noqa: E731
    seen: list[Path_] = []
    for _ in range(2000):
        p = net.sample(rng)
        if inside(p) and p not in seen:
            seen.append(p)
        if len(seen) == population:
            break
    if not seen:  # nothing lands in the window: the closest of the samples below the budget
        below = [p for p in (net.sample(rng) for _ in range(2000)) if table.path_ms(net, p) <= budget_ms]
        seen = sorted(below, key=lambda p: -table.path_ms(net, p))[:population]
    scored = {p: accuracy(p) for p in seen}
    for _ in range(iterations):
        parents = sorted(scored, key=scored.get, reverse=True)[:population]
        for parent in parents:
            child = _mutate(net, parent, rng)
            if not inside(child):
                child = _pull_back(net, table, child, budget_ms, lo, hi)
            if child is not None and child not in scored:
                scored[child] = accuracy(child)
    feasible = [p for p in scored if table.path_ms(net, p) <= budget_ms]
    if not feasible:
        return None
    best = max(feasible, key=scored.get)
    return best, scored[best]


def _positions(net: BlockScalingNet, path: Path_) -> list[int]:
    return [i for i, _ in net.steps(path)]


def _rebuild(net: BlockScalingNet, path: Path_, at: int, choice: Choice, rng: random.Random) -> Path_:
    """``path`` with the branch starting at position ``at`` replaced by ``choice``; a position
    that a new merge covers is skipped, and one that an undone merge frees gets a random
    non-merging branch."""
    old = dict(net.steps(path))
    out, i = [], 0
    while i < net.n:
        if i == at:
            c = choice
        elif i in old and not (old[i][0] == "merge" and i + 1 == at):
            c = old[i]
        else:
            c = rng.choice([o for o in net.options(i) if o[0] != "merge"])
        out.append(c)
        i += 2 if c[0] == "merge" else 1
    return tuple(out)


def _mutate(net: BlockScalingNet, path: Path_, rng: random.Random) -> Path_:
    at = rng.choice(_positions(net, path))
    return _rebuild(net, path, at, rng.choice(net.options(at)), rng)


def _pull_back(net: BlockScalingNet, table: LatencyTable, path: Path_, budget: float, lo: float,
               hi: float) -> Path_ | None:
    """The single branch change of ``path`` whose latency lands in ``[lo, hi]`` closest to the budget."""
    rng = random.Random(0)
    best, gap = None, float("inf")
    for at in _positions(net, path):
        for choice in net.options(at):
            cand = _rebuild(net, path, at, choice, rng)
            ms = table.path_ms(net, cand)
            if lo <= ms <= hi and abs(ms - budget) < gap:
                best, gap = cand, abs(ms - budget)
    return best
