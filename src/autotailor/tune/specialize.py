"""One chosen SubNet fine-tuned on its own after the search (Once-for-All's last step).

Every weight of a SuperNet serves many SubNets, so a SubNet of the shared weights is a
compromise, and mid-sized ones lose the most (docs/tune.md). Once the search has chosen what
to deploy, each chosen SubNet can be trained alone, its weights no longer shared, with the
given SuperNet's largest SubNet as a frozen teacher: each step's loss is the mean of the
labels' and the teacher's. The SuperNet given may be the tuned one or the one with the user's
model's weights (the export tries both). The architecture stays, and so does the latency; only
the accuracy changes.

The result is kept as ``FOLDER/DIGEST.pt``. The digest covers the SuperNet's weights (and so
the teacher), the SubNet and the settings, so a SubNet chosen for several budgets, or exported
again, is trained once. An interrupted run resumes from ``FOLDER/DIGEST.ckpt``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from autotailor.data.loader import BatchLoader
from autotailor.files import atomic_write
from autotailor.supernet import Arch, SuperNet
from autotailor.tune.evaluate import extracted, recalibrated
from autotailor.tune.tuner import StepResult, TuneConfig, Tuner

log = logging.getLogger(__name__)

WEIGHT_DECAY = 5e-4  # a single network's (the CIFAR and ImageNet recipes'), not the SuperNet's lighter one
CALIBRATION_BATCHES = 10  # training batches that estimate BatchNorm statistics (the teacher's, the result's)


def specialize_config(steps: int, lr: float, seed: int = 0) -> TuneConfig:
    """The tuning settings of ``specialize``: ``steps`` batches at peak learning rate ``lr``
    (cosine decay, no warm-up), the largest SubNet as frozen teacher."""
    return TuneConfig(steps=steps, subnets=1, smallest=False, lr=lr, weight_decay=WEIGHT_DECAY,
                      teacher="original", seed=seed)


def specialized_path(sn: SuperNet, arch: Arch, config: TuneConfig, folder: str | Path) -> Path:
    """Where ``specialize`` keeps ``arch`` fine-tuned with ``config`` from ``sn``'s weights (one
    file per network: archs that differ only in the blocks they drop share it)."""
    digest = hashlib.sha256()
    for name, tensor in sn.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update(json.dumps([sn.space.canonical(arch), dataclasses.asdict(config)], sort_keys=True).encode())
    return Path(folder) / f"{digest.hexdigest()[:16]}.pt"


def specialize(sn: SuperNet, arch: Arch, loader: BatchLoader, config: TuneConfig, folder: str | Path,
               on_step: Callable[[StepResult], None] | None = None) -> nn.Module:
    """``arch`` as a standalone module (``SuperNet.extract``), fine-tuned alone on ``loader``'s
    batches with ``config`` (``specialize_config``), or its kept weights; ``sn`` is not changed."""
    arch = sn.space.complete(arch)
    kept = specialized_path(sn, arch, config, folder)
    if kept.is_file():
        net = sn.extract(arch)
        net.load_state_dict(torch.load(kept, map_location="cpu")["state_dict"])
        return net.eval()
    own = copy.deepcopy(sn)
    # A tuned SuperNet's running statistics are a mixture over the SubNets it sampled: the teacher
    # (copied by the Tuner) gets the largest's own, and the result its own
    calibration = [loader.batch(0, i) for i in range(min(CALIBRATION_BATCHES, len(loader)))]
    with recalibrated(own, own.space.max(), calibration):
        tuner = Tuner(own, loader, config, kept.with_suffix(".ckpt"), arch=arch)
    if tuner.resume():
        log.info("resuming the fine-tuning of %s at step %d", kept.stem, tuner.step)
    tuner.run(on_step)
    net = extracted(own, arch, calibration)
    with atomic_write(kept) as tmp:
        torch.save({"arch": arch, "config": dataclasses.asdict(config), "state_dict": net.state_dict(),
                    **tuner.cpu.as_state()}, tmp)
    kept.with_suffix(".ckpt").unlink(missing_ok=True)
    return net
