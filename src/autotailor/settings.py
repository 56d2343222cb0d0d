"""Settings dataclasses filled from TOML tables and command-line flags, checked key by key."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from autotailor.errors import ConfigError

T = TypeVar("T")


def merge_settings(cls: type[T], section: str, *tables: dict[str, Any]) -> T:
    """An instance of the dataclass ``cls`` with ``tables`` merged, later ones winning (the
    config file's ``[section]``, then the command line). An unknown key or a value of the wrong
    type is an error naming ``section.key`` and what is allowed. Lists become tuples."""
    defaults = cls()
    fields = [f.name for f in dataclasses.fields(cls)]
    merged: dict[str, Any] = {}
    for table in tables:
        for key, value in table.items():
            if key not in fields:
                raise ConfigError(f"unknown {section} setting {key!r}; allowed: {', '.join(fields)}")
            kind = type(getattr(defaults, key))
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if kind is tuple and isinstance(value, list):
                value = tuple(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ConfigError(f"{section}.{key} = {value!r} is not allowed; expected a {kind.__name__}")
            merged[key] = value
    return cls(**merged)
