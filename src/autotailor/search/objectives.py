"""What the search optimises and constrains: predicted accuracy and costs, cached per SubNet.

Every budget of a search run asks about many of the same SubNets; the cache makes each
prediction happen once per run, whatever the number of budgets.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from autotailor.errors import SearchError
from autotailor.supernet import Arch
from autotailor.supernet.space import Space

#: Constrainable metrics, their display units and the factor from the unit to the metric.
METRICS: dict[str, tuple[str, float]] = {
    "latency_ms": ("ms", 1.0),
    "macs": ("M MACs", 1e6),
    "params": ("M params", 1e6),
    "memory_bytes": ("MiB", 2.0**20),
    "peak_activation_bytes": ("MiB", 2.0**20),
}




@dataclass(frozen=True)
class Budget:
    """Upper limits on metrics, e.g. ``{"latency_ms": 8.0, "memory_bytes": 4 * 2**20}``."""

    limits: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, **limits: float) -> "Budget":
        unknown = [m for m in limits if m not in METRICS]
        if unknown:
            raise SearchError(f"unknown metric(s) {unknown}; constrainable metrics: {list(METRICS)}")
        return cls(tuple(sorted((m, float(v)) for m, v in limits.items())))

    @property
    def name(self) -> str:
        """A short label such as ``latency_ms=8`` (the ``--pick`` name of its SubNet)."""
        return ",".join(f"{m}={v:g}" for m, v in self.limits)

    def as_dict(self) -> dict[str, float]:
        return dict(self.limits)


_PICK = re.compile(r"^\s*([0-9.]+)\s*([a-zA-Z]*)\s*$")
_SUFFIX = {"ms": "latency_ms", "mmacs": "macs", "mparams": "params", "mb": "memory_bytes", "mib": "memory_bytes"}


def parse_budget_label(text: str) -> tuple[str, float]:
    """``"8ms"`` -> ("latency_ms", 8.0); ``"300mmacs"``, ``"2mparams"``, ``"4mb"`` likewise; ``"latency_ms=8"`` too."""
    if "=" in text:
        metric, _, value = text.partition("=")
        if metric not in METRICS:
            raise SearchError(f"unknown metric {metric!r} in {text!r}; constrainable metrics: {list(METRICS)}")
        try:
            return metric, float(value)
        except ValueError:
            raise SearchError(f"budget {text!r} is not understood; write one metric=value (latency_ms=8), or a label "
                              "the search wrote") from None
    m = _PICK.match(text)
    if not m or m.group(2).lower() not in _SUFFIX:
        raise SearchError(f"budget {text!r} is not understood; write e.g. 8ms, 300mmacs, 2mparams, 4mb or latency_ms=8")
    metric = _SUFFIX[m.group(2).lower()]
    return metric, float(m.group(1)) * METRICS[metric][1]


class Objectives:
    """Predicted accuracy and metrics of SubNets, computed once per distinct SubNet.

    ``metrics`` maps a metric name to a function of a complete arch; functions that return a
    dict (several metrics from one pass, like counted costs) are given once per group name.
    """

    def __init__(self, space: Space, accuracy: Callable[[Arch], float],
                 metrics: dict[str, Callable[[Arch], float]]):
        self.space = space
        self._accuracy = accuracy
        self._metrics = metrics
        self._names = [v.name for v in space.variables]
        self._acc: dict[tuple, float] = {}
        self._values: dict[tuple[str, tuple], float] = {}

    @property
    def metrics(self) -> list[str]:
        return list(self._metrics)

    def key(self, arch: Arch) -> tuple:
        return self.space.key(arch)

    def accuracy(self, arch: Arch) -> float:
        key = self.key(arch)
        if key not in self._acc:
            self._acc[key] = float(self._accuracy(arch))
        return self._acc[key]

    def metric(self, name: str, arch: Arch) -> float:
        if name not in self._metrics:
            raise SearchError(f"no predictor for {name!r}; this search predicts {self.metrics}")
        key = (name, self.key(arch))
        if key not in self._values:
            self._values[key] = float(self._metrics[name](arch))
        return self._values[key]

    def feasible(self, arch: Arch, budget: Budget) -> bool:
        return all(self.metric(m, arch) <= limit for m, limit in budget.limits)

    def predictions(self) -> int:
        """Distinct predictions made so far (accuracy and each metric count separately)."""
        return len(self._acc) + len(self._values)

    def seen(self) -> Iterable[Arch]:
        """Every SubNet whose accuracy was predicted."""
        for key in self._acc:
            yield dict(zip(self._names, key))
