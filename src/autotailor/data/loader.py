"""Batches from an in-memory dataset: seeded shuffling, standard augmentation, any resolution."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from autotailor.data.datasets import ArrayDataset

# ImageNet statistics: what pretrained models expect, and harmless for models trained here.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def at_resolution(x: torch.Tensor, resolution: int) -> torch.Tensor:
    """``x`` resized to ``resolution`` x ``resolution`` (a SubNet's input size)."""
    if x.shape[-1] == resolution and x.shape[-2] == resolution:
        return x
    return F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False, antialias=True)


class BatchLoader:
    """Iterates over ``(images, labels)`` batches of ``data``.

    Training batches are reshuffled every epoch by ``(seed, epoch)`` and augmented with a random
    crop from a padded image (padding 1/8 of the side) and a horizontal flip, the usual
    CIFAR recipe; evaluation batches keep the data's order. Images come out normalised, as
    float32 ``[B, 3, resolution, resolution]``.
    """

    def __init__(self, data: ArrayDataset, batch_size: int, train: bool, resolution: int | None = None,
                 seed: int = 0, drop_last: bool | None = None):
        self.data = data
        self.batch_size = batch_size
        self.train = train
        self.resolution = resolution or data.images.shape[1]
        self.seed = seed
        self.epoch = 0
        self.drop_last = train if drop_last is None else drop_last
        self._mean = torch.tensor(MEAN).view(1, 3, 1, 1)
        self._std = torch.tensor(STD).view(1, 3, 1, 1)

    def __len__(self) -> int:
        n = len(self.data)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.epoch
        self.epoch += 1
        for i in range(len(self)):
            yield self.batch(epoch, i)

    def batch(self, epoch: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``i`` of ``epoch``: a pure function of the seed, so a resumed run sees the
        very batches an uninterrupted one would."""
        order = np.random.default_rng((self.seed, epoch)).permutation(len(self.data)) if self.train else None
        index = slice(i * self.batch_size, (i + 1) * self.batch_size)
        index = order[index] if order is not None else np.arange(len(self.data))[index]
        x = torch.from_numpy(self.data.images[index]).permute(0, 3, 1, 2).float().div_(255)
        if self.train:
            x = self._augment(x, np.random.default_rng((self.seed, epoch, i)))
        x = (at_resolution(x, self.resolution) - self._mean) / self._std
        return x, torch.from_numpy(self.data.labels[index])

    @staticmethod
    def _augment(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        b, _, h, w = x.shape
        pad = max(1, h // 8)
        padded = F.pad(x, (pad, pad, pad, pad), mode="reflect")
        dy, dx = rng.integers(0, 2 * pad + 1, size=(2, b))
        rows = torch.arange(h)[None, :] + torch.from_numpy(dy)[:, None]
        cols = torch.arange(w)[None, :] + torch.from_numpy(dx)[:, None]
        out = padded[torch.arange(b)[:, None, None, None], torch.arange(3)[None, :, None, None],
                     rows[:, None, :, None], cols[:, None, None, :]]
        flip = torch.from_numpy(rng.random(b) < 0.5)
        out[flip] = out[flip].flip(-1)
        return out
