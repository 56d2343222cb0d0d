"""Feature: the meta (largest) and active architecture of one TailorIR module."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from autotailor.errors import ArchError

S = TypeVar("S")


@dataclass
class Feature(Generic[S]):
    """``meta`` is the largest architecture (what the shared weights hold); ``active`` is the current one.

    Both are frozen dataclasses of the same type; ``transform`` replaces fields of ``active``
    and refuses values that exceed ``meta`` for the integer fields (channels, kernel).
    """

    meta: S
    active: S

    @classmethod
    def of(cls, spec: S) -> "Feature[S]":
        return cls(meta=spec, active=spec)

    def transform(self, owner: str, **changes: Any) -> None:
        for key, value in changes.items():
            top = getattr(self.meta, key)
            if isinstance(top, int) and not isinstance(top, bool) and not 0 < value <= top:
                raise ArchError(f"{owner}: {key}={value} is outside 1..{top} (the largest architecture)")
        self.active = dataclasses.replace(self.active, **changes)

    def reset(self) -> None:
        self.active = self.meta
