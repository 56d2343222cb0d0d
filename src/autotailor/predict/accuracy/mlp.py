"""The learning-based baseline: Once-for-All's MLP accuracy predictor.

Three fully connected layers of 400 units on the arch encoding, trained by regression on
(arch, measured accuracy) pairs. It needs many evaluated SubNets to rank well, which is what
the sensitivity predictor avoids; it is here to be compared against, on the same budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from autotailor.predict.accuracy.sensitivity import AccuracyPredictorError, ArchEncoder
from autotailor.supernet import Arch
from autotailor.supernet.space import Space


@dataclass(frozen=True)
class MlpSettings:
    hidden: int = 400
    layers: int = 3
    epochs: int = 500
    lr: float = 1e-3
    weight_decay: float = 1e-4
    seed: int = 0


class MlpPredictor:
    """Accuracy regressed from the arch encoding by a small MLP (full-batch Adam, MSE)."""

    def __init__(self, space: Space, settings: MlpSettings = MlpSettings()):
        self.encoder = ArchEncoder(space)
        self.settings = settings
        gen = torch.Generator().manual_seed(settings.seed)
        dims = [len(self.encoder), *[settings.hidden] * settings.layers]
        layers: list[nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(dims[-1], 1))
        self.net = nn.Sequential(*layers)
        with torch.no_grad():  # seeded initialisation, independent of the global RNG
            for p in self.net.parameters():
                p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) / max(p.shape[-1], 1) ** 0.5)
        self._mean, self._std = 0.0, 1.0
        self.fitted = False

    def fit(self, archs: Sequence[Arch], accuracies: Sequence[float]) -> "MlpPredictor":
        if len(archs) < 2 or len(archs) != len(accuracies):
            raise AccuracyPredictorError(
                f"the MLP needs at least 2 measured SubNets with one accuracy each, got {len(archs)} and "
                f"{len(accuracies)}")
        x = torch.from_numpy(self.encoder.encode(archs))
        y = torch.tensor(np.asarray(accuracies, dtype=np.float32))
        self._mean, self._std = float(y.mean()), float(y.std()) or 1.0
        target = (y - self._mean) / self._std
        s = self.settings
        opt = torch.optim.Adam(self.net.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        self.net.train()
        for _ in range(s.epochs):
            opt.zero_grad()
            loss = nn.functional.mse_loss(self.net(x).squeeze(1), target)
            loss.backward()
            opt.step()
        self.net.eval()
        self.fitted = True
        return self

    def predict_many(self, archs: Sequence[Arch]) -> np.ndarray:
        if not self.fitted:
            raise AccuracyPredictorError("the MLP predictor is not trained; call fit(archs, accuracies) first")
        with torch.no_grad():
            out = self.net(torch.from_numpy(self.encoder.encode(archs))).squeeze(1)
        return out.numpy().astype(np.float64) * self._std + self._mean

    def predict(self, arch: Arch) -> float:
        return float(self.predict_many([arch])[0])
