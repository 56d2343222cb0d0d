"""Sensitivity-based accuracy prediction (the paper's section 4.2.2).

A *single modification* is one non-largest choice of one variable. Its sensitivity is
``Δm = Acc(SuperNet) - Acc(SubNet({m}))``, measured once with BatchNorm recalibrated for that
SubNet. A SubNet's accuracy is predicted as ``Acc(SuperNet) - Σ Δm`` over the modifications it
makes. A variable inside a block the SubNet drops changes nothing, so it adds nothing: the
drop's own Δ already covers the block.

Building the table costs one evaluation per modification (``Space.num_modifications``) plus
one of the largest SubNet; it is written after every measurement, so an interrupted build
resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autotailor.errors import AccuracyPredictorError
from autotailor.files import write_text
from autotailor.supernet import Arch, SuperNet
from autotailor.supernet.space import Space
from autotailor.tune import evaluate

log = logging.getLogger(__name__)

Batches = Sequence[tuple[torch.Tensor, torch.Tensor]]




def modification_key(variable: str, choice: Any) -> str:
    """The name of a single modification, as stored in ``sensitivity.json``."""
    return f"{variable}={json.dumps(choice)}"


class ArchEncoder:
    """Architectures as 0/1 vectors over the space's single modifications.

    Entry ``i`` is 1 when the arch makes modification ``i`` (its variable takes that non-largest
    choice) and the variable's block is not dropped. The largest SubNet encodes as all zeros.
    This is Once-for-All's one-hot encoding without the redundant largest choice, with dropped
    blocks' variables zeroed the way OFA zeroes skipped layers.
    """

    def __init__(self, space: Space):
        self.space = space
        self.modifications: list[tuple[str, Any]] = [
            (v.name, c) for v in space.variables for c in v.choices[:-1]]
        self.keys = [modification_key(v, c) for v, c in self.modifications]
        self._index = {(v, _hashable(c)): i for i, (v, c) in enumerate(self.modifications)}
        self._block = {v.name: v.block for v in space.variables}

    def __len__(self) -> int:
        return len(self.modifications)

    def active(self, arch: Arch) -> list[int]:
        """Indices of the modifications ``arch`` makes (a complete arch)."""
        dropped = self.space.dropped_blocks(arch)
        out = []
        for name, value in arch.items():
            i = self._index.get((name, _hashable(value)))
            if i is not None and self._block[name] not in dropped:
                out.append(i)
        return out

    def encode(self, archs: Sequence[Arch]) -> np.ndarray:
        x = np.zeros((len(archs), len(self)), dtype=np.float32)
        for row, arch in enumerate(archs):
            x[row, self.active(arch)] = 1.0
        return x

    def single(self, i: int) -> Arch:
        """The SubNet that makes modification ``i`` alone."""
        name, choice = self.modifications[i]
        return {**self.space.max(), name: choice}


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass
class SensitivityTable:
    """What the build measured: the largest SubNet's accuracy and each modification's Δ."""

    base_accuracy: float | None = None
    deltas: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    validation_images: int = 0
    calibration_batches: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"base_accuracy": self.base_accuracy, "deltas": self.deltas, "seconds": self.seconds,
                "validation_images": self.validation_images, "calibration_batches": self.calibration_batches,
                "info": self.info}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SensitivityTable":
        return cls(data.get("base_accuracy"), dict(data.get("deltas", {})), float(data.get("seconds", 0.0)),
                   int(data.get("validation_images", 0)), int(data.get("calibration_batches", 0)),
                   dict(data.get("info", {})))

    @classmethod
    def load(cls, path: str | Path) -> "SensitivityTable":
        path = Path(path)
        if not path.is_file():
            raise AccuracyPredictorError(
                f"{path} does not exist; build it with `autotailor sensitivity {path.parent} --data SPEC`")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise AccuracyPredictorError(
                f"{path} is not a sensitivity table ({exc}); run `autotailor sensitivity {path.parent} --data SPEC`, "
                "which sets it aside and measures again") from exc

    def save(self, path: str | Path) -> None:
        """Atomic: a crash leaves the previous table, never half a file."""
        write_text(path, json.dumps(self.to_dict(), indent=1))


def measure_sensitivity(sn: SuperNet, val_batches: Batches, calibration: Batches, path: str | Path,
                        info: dict[str, Any] | None = None,
                        on_progress: Callable[[int, int], None] | None = None) -> SensitivityTable:
    """Measure every single modification's Δ on ``val_batches`` (BN recalibrated on
    ``calibration`` for each SubNet), resuming from ``path`` and saving there after each one.

    A table measured on other weights or data (``info`` differs) is set aside as
    ``PATH.stale`` and measured again, never mixed; an unreadable one is set aside as ``PATH.bad``.
    """
    path = Path(path)
    encoder = ArchEncoder(sn.space)
    images = sum(len(y) for _, y in val_batches)
    info = dict(info or {})
    table = SensitivityTable(info=info)
    if path.is_file():
        try:
            table = SensitivityTable.load(path)
        except AccuracyPredictorError as exc:  # unreadable: kept aside for a look, measured afresh
            aside = path.with_name(path.name + ".bad")
            path.replace(aside)
            log.warning("%s; moved to %s, measuring again", exc, aside)
    if table.info != info or (table.validation_images and table.validation_images != images):
        # measured on other weights or data: stale, kept aside and measured again
        aside = path.with_name(path.name + ".stale")
        path.replace(aside)
        changed = sorted(k for k in set(table.info) | set(info) if table.info.get(k) != info.get(k))
        log.warning("%s was measured with other %s; moved to %s, measuring again", path, ", ".join(changed) or
                    "validation images", aside)
        table = SensitivityTable(info=info)
    table.validation_images, table.calibration_batches = images, len(calibration)
    todo = [i for i, k in enumerate(encoder.keys) if k not in table.deltas]
    total = len(encoder) + 1
    done = total - len(todo) - (table.base_accuracy is None)
    if on_progress:
        on_progress(done, total)
    if table.base_accuracy is None:
        started = time.perf_counter()
        table.base_accuracy = evaluate(sn, sn.space.max(), val_batches, calibration)
        table.seconds += time.perf_counter() - started
        table.save(path)
        done += 1
        if on_progress:
            on_progress(done, total)
    for i in todo:
        started = time.perf_counter()
        accuracy = evaluate(sn, encoder.single(i), val_batches, calibration)
        table.deltas[encoder.keys[i]] = table.base_accuracy - accuracy
        table.seconds += time.perf_counter() - started
        table.save(path)
        done += 1
        log.info("Δ %s = %.4f", encoder.keys[i], table.deltas[encoder.keys[i]])
        if on_progress:
            on_progress(done, total)
    return table


class SensitivityPredictor:
    """``predict(arch) = Acc(SuperNet) - D`` with ``D = Σ Δm`` over the modifications ``arch``
    makes, or with ``overlap`` (in accuracy units) ``overlap * (1 - exp(-D / overlap))``.

    No Δ counts for less than one validation image (``1 / validation_images``): a Δ of 0 or
    below (a smaller SubNet measured as accurate as the largest, or more) is what the subset
    cannot resolve, not a free modification. Taken at face value, a search would stack dozens
    of such modifications at no predicted cost, and together they do cost accuracy.

    Drops overlap: what two modifications cost together is less than the sum of what each
    costs alone, the more so the more modifications a SubNet makes. On the demo's SuperNet the
    sum underrated its 8 chosen SubNets by 1 to 13 points, the smallest the most. ``overlap``
    is the saturation level of the combined drop, fitted to measured SubNets (``fit_overlap``);
    a monotone map of ``D``, it ranks SubNets as the sum does.
    """

    def __init__(self, space: Space, table: SensitivityTable, overlap: float | None = None):
        self.encoder = ArchEncoder(space)
        missing = [k for k in self.encoder.keys if k not in table.deltas]
        if table.base_accuracy is None or missing:
            raise AccuracyPredictorError(
                f"the sensitivity table lacks {len(missing)} of {len(self.encoder)} modifications"
                f"{' and the base accuracy' if table.base_accuracy is None else ''} (e.g. {missing[:3]}); "
                "run `autotailor sensitivity WORK --data SPEC` to finish it")
        if overlap is not None and not overlap > 0:
            raise AccuracyPredictorError(f"overlap = {overlap} must be a positive accuracy (or None: drops add up)")
        self.table = table
        self.overlap = overlap
        self.base = float(table.base_accuracy)
        floor = 1.0 / table.validation_images if table.validation_images else 0.0
        self.deltas = np.maximum(np.array([table.deltas[k] for k in self.encoder.keys], dtype=np.float64), floor)

    def drops(self, archs: Sequence[Arch]) -> np.ndarray:
        """``D``, the sum of the single-modification drops, of each arch."""
        return self.encoder.encode(archs) @ self.deltas

    def predict(self, arch: Arch) -> float:
        return float(self.predict_many([arch])[0])

    def predict_many(self, archs: Sequence[Arch]) -> np.ndarray:
        return self.base - _combined(self.drops(archs), self.overlap)


def _combined(drops: np.ndarray, overlap: float | None) -> np.ndarray:
    return drops if overlap is None else overlap * -np.expm1(-drops / overlap)


@dataclass(frozen=True)
class OverlapFit:
    """``overlap`` fitted to ``samples`` measured SubNets (None: the plain sum fitted best), and
    the fitted predictor's mean absolute error on them, in and out of sample (leave-one-out)."""

    overlap: float | None
    samples: int
    error: float
    loo_error: float

    def describe(self) -> str:
        shape = (f"drops saturating at {100 * self.overlap:.2f} pts" if self.overlap is not None
                 else "drops adding up (the best fit)")
        return (f"sensitivities fitted to {self.samples} measured SubNets: {shape}; mean error "
                f"{100 * self.error:.2f} pts, {100 * self.loo_error:.2f} pts leaving each out")


_OVERLAPS = np.exp(np.linspace(np.log(0.005), np.log(2.0), 120))  # 0.5 to 200 points


def fit_overlap(predictor: SensitivityPredictor, archs: Sequence[Arch], measured: Sequence[float],
                min_samples: int = 5) -> OverlapFit | None:
    """The ``overlap`` (or none) that fits ``measured`` accuracies of ``archs`` best in squares;
    None with fewer than ``min_samples`` SubNets."""
    if len(archs) < min_samples:
        return None
    drops, acc = predictor.drops(archs), np.asarray(measured, dtype=np.float64)
    candidates: list[float | None] = [None, *map(float, _OVERLAPS)]
    # squared error of every candidate on every SubNet: [candidates, samples]
    errors = np.stack([(predictor.base - _combined(drops, c) - acc) ** 2 for c in candidates])
    best = int(errors.sum(1).argmin())
    total = errors.sum(1, keepdims=True)
    loo = [errors[int((total[:, 0] - errors[:, i]).argmin()), i] for i in range(len(acc))]
    return OverlapFit(candidates[best], len(acc), float(np.sqrt(errors[best]).mean()),
                      float(np.sqrt(loo).mean()))
