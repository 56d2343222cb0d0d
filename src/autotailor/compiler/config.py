"""The TOML modification-space configuration, validated into a ``TailorConfig``.

```toml
title = "Example"
[arch]
blocks = ["BottleneckBlock"]          # templates to match (default: all)
[var.global_vars]
resolution = [160, 192, 224]          # input sizes (default: 5/7, 6/7 and 7/7 of the example's)
width_ratio = [0.75, 1.0]             # channels not owned by one stage or block (stems, heads)
[var.stage_vars]
reduce_depth = [-2, -1, 0]            # drop up to two trailing blocks of a stage
width_ratio = [0.5, 0.75, 1.0]        # channels a stage's blocks share (the residual stream)
[var.block_vars]
BottleneckBlock.expand_ratio = [0.25, 0.5, 0.75, 1.0]
InvertedResidualBlock.kernel_size = [3, 5, 7]
[tune]                                # settings of `autotailor tune` (see TuneConfig)
steps = 2000
lr = 0.05
```
A list with a single value (``[1.0]``, ``[0]``) switches a modification off.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotailor.compiler.templates import BLOCK_VARIABLES, template_names, templates
from autotailor.errors import ConfigError

DEFAULT_STAGE_WIDTH = (0.5, 0.75, 1.0)
DEFAULT_GLOBAL_WIDTH = (0.75, 1.0)
DEFAULT_DEPTH = (-2, -1, 0)
STEP_TABLES = ("run", "train", "tune", "sensitivity", "search", "export")


@dataclass(frozen=True)
class TailorConfig:
    """A validated configuration; ``None`` resolution means "derive from the example input"."""

    title: str = ""
    blocks: tuple[str, ...] | None = None
    resolution: tuple[int, ...] | None = None
    global_width: tuple[float, ...] = DEFAULT_GLOBAL_WIDTH
    stage_width: tuple[float, ...] = DEFAULT_STAGE_WIDTH
    reduce_depth: tuple[int, ...] = DEFAULT_DEPTH
    block_vars: dict[str, dict[str, tuple]] = field(default_factory=dict)
    # Later steps' tables ([tune], ...), kept as written; each step validates its own.
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def block_choices(self, template: str, variable: str) -> tuple:
        """Choices of ``variable`` for blocks of ``template``: configured, else the template's default."""
        if variable in self.block_vars.get(template, {}):
            return self.block_vars[template][variable]
        return next(t.defaults[variable] for t in templates() if t.name == template)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "blocks": list(self.blocks) if self.blocks is not None else None,
            "resolution": list(self.resolution) if self.resolution is not None else None,
            "global_width": list(self.global_width),
            "stage_width": list(self.stage_width),
            "reduce_depth": list(self.reduce_depth),
            "block_vars": {t: {k: list(v) for k, v in vs.items()} for t, vs in self.block_vars.items()},
            **self.steps,
        }


def load_config(source: "str | Path | dict | TailorConfig | None") -> TailorConfig:
    """Read a config from a TOML file path, a TOML string, a dict, or return the default."""
    if source is None:
        return TailorConfig()
    if isinstance(source, TailorConfig):
        return source
    if isinstance(source, dict):
        return _from_dict(source, "config")
    text, where = str(source), "config"
    path = Path(str(source))
    if "\n" not in text and "=" not in text:
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        text, where = path.read_text(), str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where} is not valid TOML: {exc}") from exc
    return _from_dict(data, where)


def _allowed(where: str, key: str, value: object, allowed: object) -> ConfigError:
    return ConfigError(f"{where}: {key} = {value!r} is not allowed; expected {allowed}")


def _check_keys(where: str, table: dict, allowed: tuple[str, ...], prefix: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key '{prefix}{key}'; allowed keys are {', '.join(allowed)}")


def _numbers(where: str, key: str, value: object, kind: type, check, rule: str) -> tuple:
    if not isinstance(value, list) or not value:
        raise _allowed(where, key, value, f"a non-empty list of {rule}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
            raise _allowed(where, key, value, f"a list of {rule}")
        if not check(v):
            raise _allowed(where, key, value, f"a list of {rule}")
        out.append(kind(v))
    return tuple(sorted(set(out)))


def _ratios(where: str, key: str, value: object) -> tuple[float, ...]:
    return _numbers(where, key, value, float, lambda v: 0 < v <= 1, "ratios in (0, 1]")


def _from_dict(data: dict, where: str) -> TailorConfig:
    _check_keys(where, data, ("title", "arch", "var", *STEP_TABLES), "")
    steps = {k: data[k] for k in STEP_TABLES if k in data}
    for k, table in steps.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: [{k}] must be a table")
    arch = data.get("arch", {})
    var = data.get("var", {})
    if not isinstance(arch, dict) or not isinstance(var, dict):
        raise ConfigError(f"{where}: [arch] and [var] must be tables")
    _check_keys(where, arch, ("blocks",), "arch.")
    _check_keys(where, var, ("global_vars", "stage_vars", "block_vars"), "var.")
    names = template_names()
    blocks = None
    if "blocks" in arch:
        blocks = arch["blocks"]
        if not isinstance(blocks, list) or any(b not in names for b in blocks):
            raise _allowed(where, "arch.blocks", blocks, f"a list of template names from {names}")
        blocks = tuple(blocks)
    g = var.get("global_vars", {})
    s = var.get("stage_vars", {})
    b = var.get("block_vars", {})
    _check_keys(where, g, ("resolution", "width_ratio"), "var.global_vars.")
    _check_keys(where, s, ("reduce_depth", "width_ratio"), "var.stage_vars.")
    resolution = None
    if "resolution" in g:
        resolution = _numbers(where, "var.global_vars.resolution", g["resolution"], int, lambda v: v > 0, "positive integers")
    kwargs: dict[str, Any] = {}
    if "width_ratio" in g:
        kwargs["global_width"] = _ratios(where, "var.global_vars.width_ratio", g["width_ratio"])
    if "width_ratio" in s:
        kwargs["stage_width"] = _ratios(where, "var.stage_vars.width_ratio", s["width_ratio"])
    if "reduce_depth" in s:
        kwargs["reduce_depth"] = _numbers(
            where, "var.stage_vars.reduce_depth", s["reduce_depth"], int, lambda v: v <= 0, "integers <= 0"
        )
    block_vars: dict[str, dict[str, tuple]] = {}
    flat: dict[str, object] = {}
    for key, value in b.items():  # TOML turns `A.b = [...]` into {"A": {"b": [...]}}
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    for key, value in flat.items():
        tname, _, vname = key.partition(".")
        if tname not in names:
            raise ConfigError(f"{where}: unknown template in var.block_vars.{key}; templates are {', '.join(names)}")
        if vname not in BLOCK_VARIABLES:
            raise ConfigError(
                f"{where}: unknown block variable var.block_vars.{key}; allowed: {', '.join(BLOCK_VARIABLES)}"
            )
        full = f"var.block_vars.{key}"
        if vname == "expand_ratio":
            choices = _ratios(where, full, value)
        else:
            choices = _numbers(where, full, value, int, lambda v: v >= 1 and v % 2 == 1, "odd kernel sizes >= 1")
        block_vars.setdefault(tname, {})[vname] = choices
    title = data.get("title", "")
    if not isinstance(title, str):
        raise _allowed(where, "title", title, "a string")
    return TailorConfig(title=title, blocks=blocks, resolution=resolution, block_vars=block_vars, steps=steps,
                        **kwargs)
