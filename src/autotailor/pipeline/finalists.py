"""Finalists: each budget's best-predicted SubNets measured for accuracy, the most accurate chosen.

The sensitivity predictor orders SubNets far apart well and near-equals poorly: on ResNet-18
tuned on CIFAR-10, the search's choice at 0.30 ms measured 77.9 % while other SubNets within
the budget, predicted up to 0.7 points lower, measured up to 78.6 %. A few evaluations settle
what the sum cannot. ``WORK/finalists.json`` keeps every measurement, saved after each one:
an interrupted search resumes, and later searches and verify rounds reuse them.

A measurement on a few hundred images is itself noisy, and the most accurate of dozens of
measurements is the one most flattered by its noise: taken at face value, one small SubNet
that measured high won every larger budget of the demo. Measurements within one standard
error of the best count as a tie, which the prediction breaks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotailor.files import write_text
from autotailor.search import Budget, Objectives, SearchResult, rank
from autotailor.supernet import Arch

log = logging.getLogger(__name__)

FINALISTS = "finalists.json"


def standard_error(accuracy: float, images: int) -> float:
    """One standard error of an accuracy measured on ``images`` images (binomial)."""
    return math.sqrt(accuracy * (1 - accuracy) / images) if images else 0.0


@dataclass
class Finalists:
    """Measured accuracies of SubNets on one validation subset (``data``, an ``EvalData``),
    keyed by canonical arch, and the choice among each budget's ``count`` best-predicted."""

    sn: Any
    data: Any
    path: Path
    count: int
    measured: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # key -> {arch, accuracy}
    info: dict[str, Any] | None = None  # what the measurements were made on (data, weights); default the data's
    original: Any = None  # the SuperNet with the weights tuning started from (``load_original``), if kept
    original_measured: dict[str, float] = dataclasses.field(default_factory=dict)  # key -> its SubNets' accuracies

    @classmethod
    def open(cls, sn, work: str | Path, data, count: int) -> "Finalists":
        """The work directory's measurements if they were made on ``data``, else none (the file is
        then replaced at the first new measurement)."""
        from autotailor.pipeline.workdir import load_original, weights_digest

        path = Path(work) / FINALISTS
        info = {**data.describe(), "weights": weights_digest(work)}
        try:
            stored = json.loads(path.read_text()) if path.is_file() else {}
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            log.warning("%s is unreadable (%s); measuring again", path, exc)
            stored = {}
        measured = stored.get("subnets", {}) if isinstance(stored, dict) and stored.get("info") == info else {}
        if stored and not measured:
            log.info("%s was measured on other weights or data (%s); measuring again", path, stored.get("info"))
        original = stored.get("original") if measured else None
        return cls(sn, data, path, count, measured, info, load_original(work),
                   original if isinstance(original, dict) else {})

    def _key(self, arch: Arch) -> str:
        return json.dumps(self.sn.space.canonical(arch), sort_keys=True)

    def accuracy(self, arch: Arch) -> float | None:
        """``arch``'s measured accuracy, if it was measured."""
        hit = self.measured.get(self._key(arch))
        return None if hit is None else hit["accuracy"]

    @property
    def archs(self) -> list[Arch]:
        """Every measured SubNet."""
        return [entry["arch"] for entry in self.measured.values()]

    @property
    def images(self) -> int:
        """How many validation images each measurement was made on (0: unknown, taken as exact)."""
        if self.info and self.info.get("validation_images"):
            return int(self.info["validation_images"])
        return self.data.images if self.data is not None else 0

    def most_accurate(self, archs: list[Arch], objectives: Objectives, budget: Budget) -> Arch | None:
        """The most accurate of the measured ``archs`` (None if none was measured): among those
        measured within one standard error of the best measurement, the best predicted (``rank``).
        One standard error is about that of the difference between two SubNets measured on the
        same images, most of which both classify alike."""
        known = [a for a in archs if self.accuracy(a) is not None]
        if not known:
            return None
        top = max(map(self.accuracy, known))
        tied = [a for a in known if self.accuracy(a) >= top - standard_error(top, self.images)]
        return max(tied, key=lambda a: rank(objectives, budget, a))

    def measure(self, archs: list[Arch], on_subnet: Callable[[int, int], None] | None = None) -> int:
        """Measure those of ``archs`` not measured yet (BatchNorm recalibrated for each); returns how many."""
        from autotailor.tune import evaluate

        todo = {}
        for arch in archs:
            todo.setdefault(self._key(arch), arch)
        todo = {k: a for k, a in todo.items() if k not in self.measured}
        for i, (key, arch) in enumerate(todo.items()):
            if on_subnet:
                on_subnet(i, len(todo))
            full = self.sn.space.complete(arch)
            self.measured[key] = {"arch": full, "accuracy": evaluate(self.sn, full, self.data.val, self.data.calibration)}
            self._write()
        if on_subnet and todo:
            on_subnet(len(todo), len(todo))
        return len(todo)

    def original_accuracy(self, arch: Arch | None = None) -> float | None:
        """The accuracy of ``arch`` (by default the largest: the user's model) with the weights
        tuning started from, on the same images (None if tuning did not keep them). The largest
        keeps the model's own BatchNorm statistics; a smaller SubNet's are recalibrated. A
        SuperNet's shared weights serve every SubNet and can end below the model they were made
        from at the top of the range (a 60-epoch MobileNetV2 on CIFAR-10: the largest 85.4 %
        against 87.4 %), where the model's own weights, thinned a little, stay ahead."""
        from autotailor.pipeline.workdir import original_calibration
        from autotailor.tune import evaluate

        if self.original is None:
            return None
        space = self.original.space
        full = space.complete(space.max() if arch is None else arch)
        key = self._key(full)
        if key not in self.original_measured:
            self.original_measured[key] = evaluate(self.original, full, self.data.val,
                                                   original_calibration(self.original, full, self.data.calibration))
            self._write()
        return self.original_measured[key]

    def _write(self) -> None:
        write_text(self.path, json.dumps({"info": self.info or self.data.describe(), "subnets": self.measured,
                                          "original": self.original_measured}, indent=1))

    def choose(self, result: SearchResult, objectives: Objectives,
               on_subnet: Callable[[int, int], None] | None = None) -> SearchResult:
        """Each budget's choice becomes the most accurate (``most_accurate``) of its ``count``
        best-predicted distinct SubNets (among all the search predicted) and of every SubNet
        measured before that meets the budget."""
        seen = sorted(objectives.seen(), key=objectives.accuracy, reverse=True)
        candidates = [self._best_predicted(seen, objectives, c.budget) if c.arch is not None else []
                      for c in result.choices]
        self.measure([a for group in candidates for a in group], on_subnet)
        earlier = self.archs
        choices = []
        for choice, group in zip(result.choices, candidates):
            if choice.arch is None:
                choices.append(choice)
                continue
            pool = group + [a for a in earlier if objectives.feasible(a, choice.budget)]
            best = self.most_accurate(pool, objectives, choice.budget)
            choices.append(dataclasses.replace(choice, arch=best, accuracy=objectives.accuracy(best),
                                               metrics={m: objectives.metric(m, best) for m in objectives.metrics}))
        return dataclasses.replace(result, choices=choices)

    def _best_predicted(self, seen: list[Arch], objectives: Objectives, budget: Budget) -> list[Arch]:
        group: dict[str, Arch] = {}
        for arch in seen:
            if len(group) == self.count:
                break
            if objectives.feasible(arch, budget):
                group.setdefault(self._key(arch), arch)
        return list(group.values())
