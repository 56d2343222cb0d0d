"""Block scaling, what the AdaptiveNet-style (``adaptivenet.py``) and LegoDNN-style
(``legodnn.py``) baselines share: a trained model's residual blocks, each with new variants
(hidden channels pruned by L1 norm; with depth, a merged block and a skip), the originals
frozen; a SubNet is a path, one variant per position. Also the training loop of the new blocks
(resumable), evaluation with BatchNorm recalibrated, and the per-variant latency table measured
on the device that both searches sum along a path.
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
from typing import Callable

import torch
import torch.nn as nn

from autotailor.tune import CpuTime

log = logging.getLogger("block_scaling")

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


def prune_hidden(block: nn.Module, keep: float, multiple: int = 1) -> nn.Module | None:
    """A copy of ``block`` with ``keep`` of its hidden channels (the largest L1 norms; their number
    rounded down to a multiple of ``multiple``, at least one multiple); None for a block without
    hidden channels of its own (MobileNetV2's first, expansion 1)."""
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
    count = max(multiple, round(n * keep) // multiple * multiple)
    kept = first.weight.detach().abs().flatten(1).sum(1).topk(count).indices.sort().values
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
    """The expanded SuperNet: original blocks (frozen) and their new variants: each block's
    hidden channels pruned to each fraction of ``shrink`` (a multiple of ``multiple`` channels),
    and with ``depth`` a merged variant of a block whose successor keeps the shape (a copy of
    it, replacing both) and a skip of a shape-keeping block."""

    def __init__(self, model: nn.Module, name: str, shrink: tuple[float, ...], depth: bool, multiple: int = 1):
        super().__init__()
        self.prefix, blocks, self.suffix = split(model, name)
        self.orig = nn.ModuleList(blocks)
        for p in self.parameters():
            p.requires_grad_(False)
        self.variants = nn.ModuleDict()
        self.depth, self.levels = depth, len(shrink)
        for i, block in enumerate(blocks):
            for k, keep in enumerate(shrink, start=1):
                pruned = prune_hidden(block, keep, multiple)
                if pruned is not None:
                    self.variants[f"{i}_shrink{k}"] = pruned
            if depth and i + 1 < len(blocks) and _keeps_shape(blocks[i + 1]):
                self.variants[f"{i}_merge1"] = copy.deepcopy(block)
        for p in self.variants.parameters():
            p.requires_grad_(True)
        self.n = len(blocks)

    def options(self, i: int) -> list[Choice]:
        out: list[Choice] = [("orig", 0)]
        out += [("shrink", k) for k in range(1, self.levels + 1) if f"{i}_shrink{k}" in self.variants]
        if f"{i}_merge1" in self.variants:
            out.append(("merge", 1))
        if self.depth and _keeps_shape(self.orig[i]):
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


StepLoss = Callable[[int, torch.Tensor, torch.Tensor], "torch.Tensor | None"]


def train_variants(net: BlockScalingNet, loader, steps: int, checkpoint: Path, step_loss: StepLoss,
                   lr: float = 0.03, checkpoint_every: int = 200, fallback: dict | None = None,
                   phase: Callable[[int], str] = lambda step: "training") -> CpuTime:
    """The new blocks trained for ``steps`` batches on ``step_loss(step, images, labels)`` (None:
    nothing to train that step) with SGD, momentum and a cosine schedule; the originals stay
    frozen, in eval mode. ``checkpoint`` (new blocks' weights, momentum, step: ``train_base``'s
    format) is written every ``checkpoint_every`` steps, so an interrupted run resumes; without
    it, from ``fallback``. Returns the CPU time over all runs."""
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
    net.eval()  # the originals' BatchNorm keeps its statistics
    losses: list[float] = []
    for step in range(start, steps):
        cpu = time.process_time()
        for g in opt.param_groups:
            g["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        epoch, i = divmod(step, len(loader))
        loss = step_loss(step, *loader.batch(epoch, i))
        if loss is not None:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        spent = spent.plus(time.process_time() - cpu)
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            momentum = {k: opt.state[p]["momentum_buffer"] for k, p in params.items() if "momentum_buffer" in opt.state[p]}
            torch.save({"step": step + 1, "steps": steps, "model": net.variants.state_dict(), "momentum": momentum,
                        **spent.as_state()}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
            log.info("%s step %d/%d loss %.4f", phase(step), step + 1, steps,
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
    """Per-variant latency (ms) measured on the device, the latency model of both searches."""

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

    def choice_ms(self, i: int, choice: Choice) -> float:
        return 0.0 if choice[0] == "skip" else self.ms[f"{i}_{choice[0]}{choice[1]}"]

    def path_ms(self, net: BlockScalingNet, path: Path_) -> float:
        return self.ms["prefix"] + self.ms["suffix"] + sum(self.choice_ms(i, c) for i, c in net.steps(path))
