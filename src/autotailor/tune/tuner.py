"""The tuning loop: CompOFA-style sampling with in-place distillation, resumable exactly.

Each step takes one batch and K SubNets: the largest, the smallest and K-2 random ones. The
largest learns from the labels (cross-entropy with label smoothing); the others learn from
the largest's detached predictions (in-place distillation). Their gradients accumulate into
one optimiser step. Everything random in a step (the SubNets, the batch and its augmentation,
dropout) is a function of the seed and the step number, so a run resumed from a checkpoint
continues exactly as an uninterrupted one.

Under ``torchrun`` (an initialised ``torch.distributed`` process group: gloo on CPUs, nccl
on GPUs) every process takes its share of the same global batch and the same SubNets, and the
accumulated gradients are averaged across processes with one all-reduce per step, as
DistributedDataParallel does; DDP's own hooks assume one forward per backward, which K
SubNets per step are not. BatchNorm running statistics are averaged too, and only the first
process writes checkpoints.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from autotailor.data.loader import BatchLoader, at_resolution
from autotailor.errors import AutoTailorError, TrainingError
from autotailor.files import atomic_write
from autotailor.settings import merge_settings
from autotailor.supernet import Arch, SuperNet
from autotailor.tune.cputime import CpuTime

log = logging.getLogger(__name__)

OPTIMIZERS = ("sgd", "adamw")
TEACHERS = ("largest", "original")
ALPHA_RANGE = (-1.0, 1.0)  # AlphaNet's two divergences: alpha -1 (mode-seeking) and +1 (KL, mass-covering)
ALPHA_CLIP = 5.0  # bound on the importance weights (p/q)^alpha, where the student's q is near 0


def _kl_distill(teacher: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy to the teacher's probabilities: KL(teacher || student) up to a constant."""
    return -(teacher * logits.log_softmax(1)).sum(1).mean()


def _alpha_distill(teacher: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """AlphaNet's adaptive alpha-divergence (Wang et al., 2021): of D_a(p||q) at the two ends of
    ``ALPHA_RANGE``, the larger for this batch, so that a student is pushed both where it is
    overconfident and where it is not confident enough; KL's only pushes the latter.

    D_a(p||q) = (sum_i q_i w_i - 1) / (a (a - 1)) with w_i = (p_i / q_i)^a (at a = 1, KL(p||q)),
    whose gradient in the student's probabilities is -w_i / a. Where the teacher gives a class
    almost nothing, w under a < 0 is unbounded: the weights are clipped at ``ALPHA_CLIP``, in the
    gradient and in the value, which so stays within what the divergence check allows."""
    log_q = logits.log_softmax(1)
    log_p = teacher.clamp_min(1e-12).log()
    q = log_q.exp()
    weights = {a: (a * (log_p - log_q)).exp().clamp(max=ALPHA_CLIP).detach() for a in ALPHA_RANGE}

    def value(a: float) -> torch.Tensor:
        if a == 1.0:
            return (teacher * (log_p - log_q)).sum(1).mean().detach()
        return (((q * weights[a]).sum(1) - 1) / (a * (a - 1))).mean().detach()

    values = {a: value(a) for a in ALPHA_RANGE}
    a = max(values, key=lambda k: float(values[k]))
    surrogate = -(weights[a] * q).sum(1).mean() / a  # its gradient is the divergence's (clipped)
    return values[a] + surrogate - surrogate.detach()


DISTILL_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "kl": _kl_distill, "alpha": _alpha_distill}


@dataclass(frozen=True)
class TuneConfig:
    """Settings of a tuning run (the ``[tune]`` table of the config, overridable on the CLI)."""

    steps: int = 1000
    subnets: int = 4  # SubNets per step: the largest, the smallest (if ``smallest``), and random ones
    smallest: bool = True  # the sandwich rule; without it, short tunings leave the smallest SubNet no better trained than its neighbours
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 3e-5
    warmup_steps: int = 0
    label_smoothing: float = 0.1
    distill: bool = True
    # "largest": the largest SubNet of the step teaches the others (in-place distillation);
    # "original": the largest SubNet of the SuperNet given to the Tuner (before resuming: the
    # weights tuning started from), frozen, teaches every SubNet, the largest included, each
    # loss the mean of the labels' and the teacher's (Once-for-All's knowledge distillation)
    teacher: str = "largest"
    # how a student is compared with its teacher's probabilities: "kl" (cross-entropy to them)
    # or "alpha" (AlphaNet's adaptive alpha-divergence)
    distill_loss: str = "kl"
    seed: int = 0
    checkpoint_every: int = 100

    @classmethod
    def from_settings(cls, *tables: dict[str, object]) -> "TuneConfig":
        """Settings merged from ``tables``, later ones winning (config file, then command line)."""
        return merge_settings(cls, "tune", *tables)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise AutoTailorError(f"tune.optimizer = {self.optimizer!r} is not allowed; expected one of {OPTIMIZERS}")
        if self.teacher not in TEACHERS:
            raise AutoTailorError(f"tune.teacher = {self.teacher!r} is not allowed; expected one of {TEACHERS}")
        if self.distill_loss not in DISTILL_LOSSES:
            raise AutoTailorError(f"tune.distill_loss = {self.distill_loss!r} is not allowed; expected one of "
                                  f"{tuple(DISTILL_LOSSES)}")
        if self.steps < 1 or self.subnets < 1 or self.checkpoint_every < 1:
            raise AutoTailorError("tune.steps, tune.subnets and tune.checkpoint_every must be >= 1")
        ranges = {"lr": (self.lr, 0.0, math.inf, "a positive number"),
                  "weight_decay": (self.weight_decay, 0.0, math.inf, "0 or more"),
                  "momentum": (self.momentum, 0.0, 1.0, "in [0, 1)"),
                  "label_smoothing": (self.label_smoothing, 0.0, 1.0, "in [0, 1)")}
        for key, (value, low, high, allowed) in ranges.items():
            positive = value > low if key == "lr" else value >= low
            if not (positive and value < high):
                raise AutoTailorError(f"tune.{key} = {value} is not allowed; expected {allowed}")
        if self.warmup_steps < 0:
            raise AutoTailorError(f"tune.warmup_steps = {self.warmup_steps} is not allowed; expected 0 or more")


@dataclass
class StepResult:
    step: int
    loss: float
    images: int


def training_layout(model: nn.Module) -> torch.memory_format:
    """The memory layout ``model`` trains fastest in on a CPU: channels-last when it has depthwise
    convolutions, which oneDNN runs faster that way (docs/tune.md); plain convolutions gain nothing."""
    depthwise = any(isinstance(m, nn.Conv2d) and m.groups > 1 for m in model.modules())
    return torch.channels_last if depthwise else torch.contiguous_format


class Tuner:
    """Fine-tunes ``sn`` on ``loader``'s batches, checkpointing to ``checkpoint`` (if given). With
    ``arch``, every step trains that SubNet alone (``config.subnets`` is then ignored): with
    ``teacher = "original"``, the SuperNet's largest SubNet teaches it (``specialize``)."""

    def __init__(self, sn: SuperNet, loader: BatchLoader, config: TuneConfig, checkpoint: str | Path | None = None,
                 arch: Arch | None = None):
        self.sn = sn
        self.arch = None if arch is None else sn.space.complete(arch)
        self.loader = loader
        self.config = config
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        params = [p for p in sn.parameters() if p.requires_grad]
        if config.optimizer == "sgd":
            self.optimizer: torch.optim.Optimizer = torch.optim.SGD(
                params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay, nesterov=True)
        else:
            # AdamW decays the layers' weight matrices only, as vision transformers are trained:
            # not biases, norms, class tokens or position embeddings
            matrices = {id(m.weight) for m in sn.modules()
                        if isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.ndim >= 2}
            self.optimizer = torch.optim.AdamW(
                [{"params": [p for p in params if id(p) in matrices]},
                 {"params": [p for p in params if id(p) not in matrices], "weight_decay": 0.0}],
                lr=config.lr, weight_decay=config.weight_decay)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self._saved_step = 0
        # summed over every resumed run: what the training cost, which the last run's clock undercounts
        self.cpu = CpuTime()
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if self.distributed:  # start from rank 0's weights, as DDP does
            for t in (*sn.parameters(), *sn.buffers()):
                dist.broadcast(t.data, 0)
        self._teacher = self._frozen_copy(sn) if config.teacher == "original" and config.distill else None
        self._layout = training_layout(sn)

    @staticmethod
    def _frozen_copy(sn: SuperNet) -> SuperNet:
        teacher = copy.deepcopy(sn)
        teacher.set_arch(teacher.space.max())
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        return teacher

    def _lr_factor(self, step: int) -> float:
        c = self.config
        if step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        progress = (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    def sample(self, step: int) -> list[Arch]:
        """The SubNets of ``step``: largest first (the teacher), then smallest (``smallest``), then
        random; or the one ``arch`` the Tuner was given."""
        if self.arch is not None:
            return [self.arch]
        space = self.sn.space
        rng = random.Random(f"{self.config.seed}:{step}")
        fixed = [space.max(), space.min()] if self.config.smallest else [space.max()]
        archs = fixed + [space.sample(rng) for _ in range(max(0, self.config.subnets - len(fixed)))]
        return archs[: self.config.subnets]

    def train_step(self, step: int) -> StepResult:
        epoch, i = divmod(step, len(self.loader))
        x, y = self.loader.batch(epoch, i)
        if self.distributed:  # this process's share of the global batch
            x, y = x.chunk(self.world)[self.rank], y.chunk(self.world)[self.rank]
        x = x.contiguous(memory_format=self._layout)
        self.sn.train()
        self.optimizer.zero_grad(set_to_none=True)
        archs = self.sample(step)
        total = 0.0
        teacher = None
        distill = DISTILL_LOSSES[self.config.distill_loss]
        if self._teacher is not None:
            with torch.no_grad():
                teacher = self._teacher(at_resolution(x, self._teacher.input_shape()[-1])).softmax(1)
        with torch.random.fork_rng(), self.sn.using(self.sn.arch):
            torch.manual_seed(hash((self.config.seed, step)) % (2**63))
            for j, arch in enumerate(archs):
                self.sn.set_arch(arch)
                out = self.sn(at_resolution(x, self.sn.input_shape()[-1]))
                labels = F.cross_entropy(out, y, label_smoothing=self.config.label_smoothing)
                if self._teacher is not None:
                    loss = 0.5 * (labels + distill(teacher, out))
                elif j == 0 or not self.config.distill:
                    loss = labels
                    if j == 0:
                        teacher = out.detach().softmax(1)
                else:
                    loss = distill(teacher, out)
                (loss / len(archs)).backward()
                total += float(loss.detach()) / len(archs)
        if self.distributed:
            total = self._average_across_processes(total)
        self._check_loss(step, total, out.shape[-1])
        self.optimizer.step()
        self.schedule.step()
        return StepResult(step, total, len(y) * len(archs))

    def _check_loss(self, step: int, loss: float, classes: int) -> None:
        """Stop before a diverged step changes the weights: a non-finite loss, or one above 100
        times a uniform guess's (``log(classes)``), which no training that still learns reaches."""
        if math.isfinite(loss) and loss <= 100 * math.log(max(classes, 2)):
            return
        kept = (f"the checkpoint {self.checkpoint} (step {self._saved_step})" if self.checkpoint is not None
                and self.checkpoint.is_file() else "no checkpoint")
        raise TrainingError(
            f"the loss diverged at step {step}: {loss:.4g} (lr {self.config.lr:g}); the weights were not changed by "
            f"it, and the files on disk are the last good ones ({kept}). Lower the learning rate or add warm-up "
            "steps"
            + (f", delete {self.checkpoint} (it holds the old settings)" if self.checkpoint is not None
               and self.checkpoint.is_file() else "") + " and run again")

    def _average_across_processes(self, loss: float) -> float:
        """Average gradients (one flat all-reduce), BatchNorm statistics and the loss."""
        # Every process ran the same SubNets, so the parameters without a gradient (in blocks
        # they all dropped) are the same everywhere and stay untouched, as in one process.
        params = [p for p in self.sn.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.tensor([loss])])
        dist.all_reduce(flat)
        flat /= self.world
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        stats = [b for b in self.sn.buffers() if b.is_floating_point()]
        if stats:
            flat_stats = torch.cat([b.reshape(-1) for b in stats])
            dist.all_reduce(flat_stats)
            flat_stats /= self.world
            offset = 0
            for b in stats:
                b.copy_(flat_stats[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
        return float(flat[-1])

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self) -> dict:
        return {"step": self.step, "config": dataclasses.asdict(self.config), "model": self.sn.state_dict(),
                "optimizer": self.optimizer.state_dict(), "schedule": self.schedule.state_dict(),
                **self.cpu.as_state()}

    def save(self) -> None:
        """Write a checkpoint atomically: a crash during the write keeps the previous one."""
        if self.checkpoint is None:
            return
        if self.distributed:
            dist.barrier()  # every process has finished the step
            if self.rank != 0:
                return
        with atomic_write(self.checkpoint) as tmp:
            torch.save(self.state(), tmp)
        self._saved_step = self.step

    def resume(self) -> bool:
        """Continue from the checkpoint if there is one; it must come from the same settings."""
        if self.checkpoint is None or not self.checkpoint.is_file():
            return False
        state = torch.load(self.checkpoint, map_location="cpu", weights_only=False)
        if state["config"] != dataclasses.asdict(self.config):
            raise AutoTailorError(
                f"{self.checkpoint} was written with other settings {state['config']}; "
                "resume with the same settings or start a new work directory"
            )
        self.sn.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.step = self._saved_step = state["step"]
        self.cpu = CpuTime.of(state)
        log.info("resumed from %s at step %d", self.checkpoint, self.step)
        return True

    def run(self, on_step: Callable[[StepResult], None] | None = None) -> None:
        """Train until ``config.steps``, checkpointing every ``checkpoint_every`` steps and at the end."""
        self.sn.to(memory_format=self._layout)
        try:
            while self.step < self.config.steps:
                cpu = time.process_time()
                result = self.train_step(self.step)
                self.step += 1
                self.cpu = self.cpu.plus(time.process_time() - cpu)
                if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
                    self.save()
                if on_step is not None:
                    on_step(result)
        finally:  # the caller's SuperNet in its own layout again
            self.sn.to(memory_format=torch.contiguous_format)
