"""The CPU time a training took, kept in its checkpoints so that a resumed run adds to it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuTime:
    """``seconds`` of CPU time over ``steps`` training steps: fewer steps than the training made
    when it resumed from a checkpoint written before the time was kept."""

    seconds: float = 0.0
    steps: int = 0

    @classmethod
    def of(cls, state: Mapping) -> CpuTime:
        """What a checkpoint written with ``as_state`` kept; nothing for one without it."""
        return cls(float(state.get("cpu_seconds", 0.0)), int(state.get("cpu_steps", 0)))

    def as_state(self) -> dict[str, float | int]:
        return {"cpu_seconds": self.seconds, "cpu_steps": self.steps}

    def plus(self, seconds: float) -> CpuTime:
        """One step more, of ``seconds``."""
        return CpuTime(self.seconds + seconds, self.steps + 1)

    def __add__(self, other: CpuTime) -> CpuTime:
        return CpuTime(self.seconds + other.seconds, self.steps + other.steps)

    def describe(self, steps: int) -> str:
        """"12.3 CPU-minutes", saying which part of the training's ``steps`` it covers."""
        timed = "" if self.steps >= steps else f" over the {self.steps:,} of {steps:,} steps timed"
        return f"{self.seconds / 60:.1f} CPU-minutes{timed}"
