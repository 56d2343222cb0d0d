"""Typed results of the steps: one dataclass per results file of the work directory, each with a
versioned schema, ``to_dict``/``from_dict``, and ``write``/``read`` (atomic; a missing, corrupt or
older file is an error that names it and the step that rewrites it).

=================  ====================  ==========================
file               record                written by
=================  ====================  ==========================
``search.json``    ``SearchRecord``      ``autotailor search``
``exports.json``   ``ExportsRecord``     ``autotailor export``
``run.json``       ``RunRecord``         ``autotailor run``
=================  ====================  ==========================
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from autotailor.errors import AutoTailorError, SearchError
from autotailor.files import write_text

R = TypeVar("R", bound="Record")
SHARED_WEIGHTS, ORIGINAL_WEIGHTS = "shared", "original"  # what a chosen SubNet is deployed with


class Record:
    """Base of the results files: ``FILE`` in the work directory, ``SCHEMA`` its version,
    ``STEP`` the command that writes it."""

    FILE: ClassVar[str]
    SCHEMA: ClassVar[str]
    STEP: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        return cls(**data)

    def write(self, work: str | Path) -> Path:
        return write_text(Path(work) / self.FILE, json.dumps({"schema": self.SCHEMA, **self.to_dict()}, indent=1))

    @classmethod
    def exists(cls, work: str | Path) -> bool:
        return (Path(work) / cls.FILE).is_file()

    @classmethod
    def read(cls: type[R], work: str | Path) -> R:
        path = Path(work) / cls.FILE
        again = f"run `{cls.STEP.format(work=work)}` (again)"
        if not path.is_file():
            raise AutoTailorError(f"{path} does not exist: {again}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise AutoTailorError(f"{path} is not valid JSON ({exc}); {again} to rewrite it") from exc
        if not isinstance(data, dict) or data.get("schema") != cls.SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else None
            raise AutoTailorError(f"{path} is not of schema {cls.SCHEMA} (found {found!r}); {again} to rewrite it")
        data.pop("schema")
        try:
            return cls.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise AutoTailorError(f"{path} does not hold what {cls.SCHEMA} needs ({exc}); {again}") from exc


@dataclass
class Chosen:
    """The SubNet a search chose for one budget (``arch`` None: no SubNet meets it)."""

    budget: str
    limits: dict[str, float]
    arch: dict[str, Any] | None
    accuracy: float | None
    metrics: dict[str, float]
    seconds: float
    measured_accuracy: float | None = None  # with finalists
    measured_latency_ms: float | None = None  # with verify
    weights: str = SHARED_WEIGHTS  # or ORIGINAL_WEIGHTS: those tuning started from, the user's model's (WORK/original.pt)


@dataclass
class SearchRecord(Record):
    """``search.json``: the chosen SubNet per budget and the Pareto front."""

    FILE = "search.json"
    SCHEMA = "autotailor-search/1"
    STEP = "autotailor search {work} --latency-ms ..."

    device: str | None
    target: str | None
    latency_model: str | None
    axis: str
    settings: dict[str, Any]
    seconds: float
    predictions: int
    verify_rounds: int
    beam_size: int
    finalists: int
    choices: list[Chosen]
    front: list[dict[str, Any]] = field(default_factory=list)
    accuracy_model: str | None = None  # with finalists: how the predictor was fitted to them
    latency_noise: str | None = None  # the LUT's noise reading (``Speed.describe``)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SearchRecord":
        return cls(**{**data, "choices": [Chosen(**c) for c in data["choices"]]})

    @property
    def met(self) -> list[Chosen]:
        """The choices of the budgets some SubNet meets."""
        return [c for c in self.choices if c.arch is not None]

    @property
    def verified(self) -> bool:
        return any(c.measured_latency_ms is not None for c in self.choices)

    def pick(self, name: str) -> list[Chosen]:
        """The chosen SubNets ``name`` designates: ``all``, a budget label (``8ms``, ``latency_ms=8``)
        or a budget's position (0, 1, ...)."""
        from autotailor.search import parse_budget_label

        if name == "all":
            return self.met
        named = [c for c in self.met if c.budget == name]  # a label as the search wrote it
        if named:
            return named
        if name.isdigit():
            i = int(name)
            if i < len(self.choices) and self.choices[i].arch is not None:
                return [self.choices[i]]
        else:
            metric, value = parse_budget_label(name)
            matches = [c for c in self.met if abs(c.limits.get(metric, float("nan")) - value) <= 1e-9 * max(1, value)]
            if matches:
                return matches
        labels = ", ".join(c.budget for c in self.met) or "none (no budget was met)"
        raise SearchError(f"--pick {name!r} names no chosen SubNet; the search chose: {labels} (or pick all, or 0..)")


@dataclass
class Exported:
    """One exported SubNet: its files, and what was predicted and measured of it."""

    name: str
    arch: dict[str, Any]
    files: list[str]
    predicted: dict[str, float | None]
    measured: dict[str, float | None]
    weights: str = SHARED_WEIGHTS  # as chosen (``Chosen.weights``)
    finetuned_from: str | None = None  # fine-tuned alone from SHARED_WEIGHTS or ORIGINAL_WEIGHTS; None: not


@dataclass
class ExportsRecord(Record):
    """``exports.json``: every SubNet the last export wrote."""

    FILE = "exports.json"
    SCHEMA = "autotailor-exports/1"
    STEP = "autotailor export {work}"

    exports: list[Exported]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ExportsRecord":
        return cls([Exported(**e) for e in data["exports"]])


@dataclass
class StepDone:
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunRecord(Record):
    """``run.json``: which steps of ``autotailor run`` are done, with their time and settings."""

    FILE = "run.json"
    SCHEMA = "autotailor-run/1"
    STEP = "autotailor run CONFIG.toml --work {work}"

    config: str
    steps: dict[str, StepDone] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunRecord":
        return cls(data["config"], {k: StepDone(**v) for k, v in data["steps"].items()})

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps.values())
