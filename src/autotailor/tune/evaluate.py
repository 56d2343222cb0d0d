"""Evaluate a SubNet, with its BatchNorm statistics recalibrated first.

Shared running statistics are those of the largest SubNet (and an average over whatever was
sampled during tuning); a smaller SubNet's activations have other statistics, so Once-for-All
re-estimates them on a few training batches before evaluating. Here the recalibration is
temporary: ``recalibrated`` restores every buffer afterwards, so evaluating many SubNets in a
row leaves the SuperNet as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn

from autotailor.data.loader import at_resolution
from autotailor.supernet import Arch, SuperNet


def _norms(sn: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in sn.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]


@contextmanager
def recalibrated(sn: SuperNet, arch: Arch, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """Within the block, ``sn`` runs ``arch`` with BatchNorm statistics estimated on ``batches``
    (cumulative average, no gradient, dropout off); all buffers, the mode and the active
    architecture are restored on exit. A model without BatchNorm runs no batches."""
    norms = _norms(sn)
    saved = [(bn.momentum, {k: v.clone() for k, v in bn._buffers.items() if v is not None}) for bn in norms]
    was_training = sn.training
    with sn.using(arch):
        resolution = sn.input_shape()[-1]
        try:
            sn.eval()
            for bn in norms:
                bn.reset_running_stats()
                bn.momentum = None  # cumulative moving average over the calibration batches
                bn.train()
            with torch.no_grad():
                for x, _ in batches if norms else ():  # nothing to estimate (a ViT): no passes
                    sn(at_resolution(x, resolution))
            sn.eval()
            yield
        finally:
            for bn, (momentum, buffers) in zip(norms, saved):
                bn.momentum = momentum
                for k, v in buffers.items():
                    bn._buffers[k].copy_(v)
            sn.train(was_training)


def extracted(sn: SuperNet, arch: Arch, calibration: Iterable[tuple[torch.Tensor, torch.Tensor]] | None) -> nn.Module:
    """``arch`` as a standalone module in eval mode (``SuperNet.extract``), with BatchNorm
    statistics recalibrated on ``calibration`` batches first, or as they are without them."""
    if calibration is None:
        return sn.extract(arch).eval()
    with recalibrated(sn, arch, calibration):
        return sn.extract(arch).eval()


def accuracy(net: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], resolution: int) -> float:
    """Top-1 accuracy of ``net`` (in its current mode) on ``batches``, resized to ``resolution``."""
    correct = total = 0
    with torch.no_grad():
        for x, y in batches:
            correct += int((net(at_resolution(x, resolution)).argmax(1) == y).sum())
            total += len(y)
    return correct / max(total, 1)


def evaluate(sn: SuperNet, arch: Arch, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             calibration: Iterable[tuple[torch.Tensor, torch.Tensor]] | None = None) -> float:
    """Top-1 accuracy of ``arch`` on ``batches``; with ``calibration`` batches, BatchNorm
    statistics are recalibrated for ``arch`` first (and restored afterwards)."""

    def run() -> float:
        return accuracy(sn, batches, sn.input_shape()[-1])

    was_training = sn.training
    try:
        if calibration is not None:
            with recalibrated(sn, arch, calibration):
                return run()
        with sn.using(arch):
            sn.eval()
            return run()
    finally:
        sn.train(was_training)
