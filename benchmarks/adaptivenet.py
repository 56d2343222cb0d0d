"""An AdaptiveNet-style block-scaling SuperNet (Wen et al., MobiCom 2023), the baseline of
``baselines.py``: built from the same trained base model, in plain PyTorch.

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

import copy
import logging
import math
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from autotailor.tune import CpuTime

log = logging.getLogger("adaptivenet")

SHRINK = (0.75, 0.5)
Choice = tuple[str, int]  # ("orig", 0), ("shrink", k), ("merge", 1), ("skip", 0)
Path_ = tuple[Choice, ...]


def split(model: nn.Module, name: str) -> tuple[nn.Module, list[nn.Module], nn.Module]:
    """``model`` as (prefix, residual blocks, suffix) for the CIFAR models of ``cifar_models``."""
    if name == "resnet18":
        prefix = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
        blocks = [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4) for b in layer]
        suffix = nn.Sequential(model.avgpool, nn.Flatten(1), model.fc)
    elif name == "mobilenet_v2":
        prefix, blocks = model.features[0], list(model.features[1:18])
        suffix = nn.Sequential(model.features[18], nn.AdaptiveAvgPool2d(1), nn.Flatten(1), model.classifier)
    else:
        raise ValueError(f"no block split for {name}")
    return prefix, blocks, suffix


def _keeps_shape(block: nn.Module) -> bool:
    if hasattr(block, "use_res_connect"):  # torchvision InvertedResidual
        return bool(block.use_res_connect)
    return getattr(block, "downsample", None) is None and block.conv1.stride == (1, 1)


def _prune_hidden(block: nn.Module, keep: float) -> nn.Module | None:
    """A copy of ``block`` with ``keep`` of its hidden channels (the largest L1 norms); None for
    a block without hidden channels of its own (MobileNetV2's first, expansion 1)."""
    new = copy.deepcopy(block)
    if hasattr(new, "conv1"):  # BasicBlock: conv1 -> bn1 -> conv2
        first, norms, last = new.conv1, [new.bn1], new.conv2
        depthwise = None
    else:  # InvertedResidual: expand (conv, bn, act), depthwise (conv, bn, act), project conv, bn
        layers = list(new.conv)
        if len(layers) < 4:
            return None
        first, norms, depthwise, last = layers[0][0], [layers[0][1], layers[1][1]], layers[1][0], layers[2]
    n = first.out_channels
    kept = first.weight.detach().abs().flatten(1).sum(1).topk(max(1, round(n * keep))).indices.sort().values
    first.weight = nn.Parameter(first.weight.detach()[kept].clone())
    first.out_channels = len(kept)
    for bn in norms:
        bn.weight = nn.Parameter(bn.weight.detach()[kept].clone())
        bn.bias = nn.Parameter(bn.bias.detach()[kept].clone())
        bn.running_mean, bn.running_var = bn.running_mean[kept].clone(), bn.running_var[kept].clone()
        bn.num_features = len(kept)
    if depthwise is not None:
        depthwise.weight = nn.Parameter(depthwise.weight.detach()[kept].clone())
        depthwise.in_channels = depthwise.out_channels = depthwise.groups = len(kept)
    last.weight = nn.Parameter(last.weight.detach()[:, kept].clone())
    last.in_channels = len(kept)
    return new


class BlockScalingNet(nn.Module):
    """The expanded SuperNet: original blocks (frozen) and their new variants."""

    def __init__(self, model: nn.Module, name: str):
        super().__init__()
        self.prefix, blocks, self.suffix = split(model, name)
        self.orig = nn.ModuleList(blocks)
        for p in self.parameters():
            p.requires_grad_(False)
        self.variants = nn.ModuleDict()
        for i, block in enumerate(blocks):
            for k, keep in enumerate(SHRINK, start=1):
                pruned = _prune_hidden(block, keep)
                if pruned is not None:
                    self.variants[f"{i}_shrink{k}"] = pruned
            if i + 1 < len(blocks) and _keeps_shape(blocks[i + 1]):
                self.variants[f"{i}_merge1"] = copy.deepcopy(block)
        for p in self.variants.parameters():
            p.requires_grad_(True)
        self.n = len(blocks)

    def options(self, i: int) -> list[Choice]:
        out: list[Choice] = [("orig", 0)]
        out += [("shrink", k) for k in range(1, len(SHRINK) + 1) if f"{i}_shrink{k}" in self.variants]
        if f"{i}_merge1" in self.variants:
            out.append(("merge", 1))
        if _keeps_shape(self.orig[i]):
            out.append(("skip", 0))
        return out

    def module(self, i: int, choice: Choice) -> nn.Module:
        kind, level = choice
        if kind == "orig":
            return self.orig[i]
        if kind == "skip":
            return nn.Identity()
        return self.variants[f"{i}_{kind}{level}"]

    def steps(self, path: Path_) -> list[tuple[int, Choice]]:
        """(position, choice) along ``path``: a merged block takes two positions."""
        out, i = [], 0
        for choice in path:
            out.append((i, choice))
            i += 2 if choice[0] == "merge" else 1
        return out

    def sample(self, rng: random.Random) -> Path_:
        path, i = [], 0
        while i < self.n:
            choice = rng.choice(self.options(i))
            path.append(choice)
            i += 2 if choice[0] == "merge" else 1
        return tuple(path)

    def largest(self) -> Path_:
        return tuple(("orig", 0) for _ in range(self.n))

    def subnet(self, path: Path_) -> nn.Sequential:
        """The plain model of ``path`` (its modules shared with the SuperNet)."""
        return nn.Sequential(self.prefix, *(self.module(i, c) for i, c in self.steps(path)), self.suffix)

    def teacher_features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Inputs of every original block, then the last block's output."""
        feats = [self.prefix(x)]
        for block in self.orig:
            feats.append(block(feats[-1]))
        return feats


def train(net: BlockScalingNet, loader, steps: int, checkpoint: Path, lr: float = 0.03, seed: int = 0,
          checkpoint_every: int = 200, fallback: dict | None = None) -> CpuTime:
    """Half the steps branch-wise distillation, half tuning on the labels, each step one sampled
    path's new blocks (SGD with momentum, cosine schedule); the originals stay frozen. Every
    step's path and batch are functions of the seed and the step, and ``checkpoint`` (new
    blocks' weights, momentum, step: ``train_base``'s format) is written every
    ``checkpoint_every`` steps, so an interrupted run resumes; without it, from ``fallback``.
    Returns the CPU time over all runs."""
    params = dict(net.variants.named_parameters())
    opt = torch.optim.SGD(params.values(), lr=lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    start, spent = 0, CpuTime()
    state = torch.load(checkpoint, map_location="cpu") if checkpoint.is_file() else fallback
    if state is not None:
        if state["steps"] != steps:
            raise SystemExit(f"{checkpoint} is of a {state['steps']}-step run, not {steps}; delete it or pass the same")
        net.variants.load_state_dict(state["model"])
        for k, buf in state["momentum"].items():
            opt.state[params[k]]["momentum_buffer"] = buf.clone()
        start, spent = state["step"], CpuTime.of(state)
        log.info("resumed at step %d of %d", start, steps)
    distill = steps // 2
    net.eval()  # the originals' BatchNorm keeps its statistics
    losses: list[float] = []
    for step in range(start, steps):
        cpu = time.process_time()
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        epoch, i = divmod(step, len(loader))
        x, y = loader.batch(epoch, i)
        path = net.sample(random.Random(f"{seed}:{step}"))
        new = [(i, c) for i, c in net.steps(path) if c[0] in ("shrink", "merge")]
        if new:
            for i, c in new:
                net.module(i, c).train()
            if step < distill:
                with torch.no_grad():
                    feats = net.teacher_features(x)
                loss = sum(F.mse_loss(net.module(i, c)(feats[i]), feats[i + 1 + (c[1] if c[0] == "merge" else 0)])
                           for i, c in new) / len(new)
            else:
                loss = F.cross_entropy(net.subnet(path)(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            for i, c in new:
                net.module(i, c).eval()
        spent = spent.plus(time.process_time() - cpu)
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            momentum = {k: opt.state[p]["momentum_buffer"] for k, p in params.items() if "momentum_buffer" in opt.state[p]}
            torch.save({"step": step + 1, "steps": steps, "model": net.variants.state_dict(), "momentum": momentum,
                        **spent.as_state()}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
            log.info("%s step %d/%d loss %.4f", "distillation" if step < distill else "tuning", step + 1, steps,
                     sum(losses[-50:]) / max(1, len(losses[-50:])))
    return spent


def calibrated(net: BlockScalingNet, path: Path_, calibration) -> nn.Module:
    """A copy of ``path``'s network, in eval mode, its BatchNorm statistics estimated on
    ``calibration`` (as AutoTailor's SubNets are evaluated)."""
    model = copy.deepcopy(net.subnet(path))
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    with torch.no_grad():
        for x, _ in calibration:
            model(x)
    return model.eval()


def evaluate(net: BlockScalingNet, path: Path_, batches, calibration) -> float:
    """Top-1 accuracy of ``path`` on ``batches``, BatchNorm recalibrated on ``calibration`` first."""
    model = calibrated(net, path, calibration)
    correct = total = 0
    with torch.no_grad():
        for x, y in batches:
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return correct / total


@dataclass
class LatencyTable:
    """Per-variant latency (ms) measured on the device, the latency model of the search."""

    ms: dict[str, float]

    @classmethod
    def measure(cls, net: BlockScalingNet, backend, shape: tuple[int, ...]) -> "LatencyTable":
        ms: dict[str, float] = {}
        with torch.no_grad():
            feats = net.teacher_features(torch.zeros(shape))
        with tempfile.TemporaryDirectory() as tmp:
            def timed(name: str, module: nn.Module, in_shape: tuple[int, ...]) -> None:
                path = backend.deploy(module.eval(), Path(tmp) / name, in_shape)
                ms[name] = backend.time(backend.load(path, in_shape)).median_ms

            timed("prefix", net.prefix, shape)
            timed("suffix", net.suffix, tuple(feats[-1].shape))
            for i in range(net.n):
                for choice in net.options(i):
                    if choice[0] != "skip":
                        timed(f"{i}_{choice[0]}{choice[1]}", net.module(i, choice), tuple(feats[i].shape))
        return cls(ms)

    def path_ms(self, net: BlockScalingNet, path: Path_) -> float:
        return self.ms["prefix"] + self.ms["suffix"] + sum(
            self.ms[f"{i}_{c[0]}{c[1]}"] for i, c in net.steps(path) if c[0] != "skip")


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
