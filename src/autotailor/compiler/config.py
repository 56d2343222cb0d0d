"""The TOML modification-space configuration, validated into a ``TailorConfig``.

```toml
title = "Example"
[arch]
blocks = ["BottleneckBlock"]          # templates to match (default: all)
channel_multiple = 8                  # every width choice a multiple of 8 channels (default: 1)
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

from autotailor.compiler.templates import template_names, templates
from autotailor.compiler.variables import SCOPES, setting_kind, setting_keys
from autotailor.errors import ConfigError

STEP_TABLES = ("run", "train", "tune", "sensitivity", "search", "export")


@dataclass(frozen=True)
class TailorConfig:
    """A validated configuration: per scope (``global_vars``, ``stage_vars``, ``block_vars``) the
    choices given for each variable kind's key; what is not given takes the kind's default."""

    title: str = ""
    blocks: tuple[str, ...] | None = None
    # Channel counts of every width choice are multiples of this (a model's own counts stay
    # choices): runtimes' fast convolution kernels work on blocks of 8 or 16 channels.
    channel_multiple: int = 1
    global_vars: dict[str, tuple] = field(default_factory=dict)
    stage_vars: dict[str, tuple] = field(default_factory=dict)
    block_vars: dict[str, dict[str, tuple]] = field(default_factory=dict)  # template -> key -> choices
    # Later steps' tables ([tune], ...), kept as written; each step validates its own.
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)

    def choices(self, scope: str, key: str) -> tuple | None:
        """Choices of ``var.SCOPE.KEY``: configured, else its kind's default (None: from the model)."""
        given = getattr(self, scope)
        return given[key] if key in given else setting_kind(scope, key).default(scope)

    def block_choices(self, template: str, key: str) -> tuple:
        """Choices of ``key`` for blocks of ``template``: configured, else the template's
        default, else the kind's."""
        if key in self.block_vars.get(template, {}):
            return self.block_vars[template][key]
        t = next(t for t in templates() if t.name == template)
        return t.defaults[key] if key in t.defaults else setting_kind("block_vars", key).default("block_vars")

    def to_dict(self) -> dict[str, Any]:
        """The configuration as the TOML file's tables (``load_config`` reads it back)."""
        arch = {**({"blocks": list(self.blocks)} if self.blocks is not None else {}),
                **({"channel_multiple": self.channel_multiple} if self.channel_multiple != 1 else {})}
        return {
            "title": self.title,
            **({"arch": arch} if arch else {}),
            "var": {"global_vars": {k: list(v) for k, v in self.global_vars.items()},
                    "stage_vars": {k: list(v) for k, v in self.stage_vars.items()},
                    "block_vars": {t: {k: list(v) for k, v in vs.items()} for t, vs in self.block_vars.items()}},
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
    _check_keys(where, arch, ("blocks", "channel_multiple"), "arch.")
    _check_keys(where, var, SCOPES, "var.")
    names = template_names()
    blocks = None
    if "blocks" in arch:
        blocks = arch["blocks"]
        if not isinstance(blocks, list) or any(b not in names for b in blocks):
            raise _allowed(where, "arch.blocks", blocks, f"a list of template names from {names}")
        blocks = tuple(blocks)
    multiple = arch.get("channel_multiple", 1)
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise _allowed(where, "arch.channel_multiple", multiple, "a positive integer (8 or 16 for CPU runtimes)")
    scoped: dict[str, dict] = {}
    for scope in ("global_vars", "stage_vars"):
        table = var.get(scope, {})
        _check_keys(where, table, setting_keys(scope), f"var.{scope}.")
        scoped[scope] = {k: setting_kind(scope, k).check(where, f"var.{scope}.{k}", v) for k, v in table.items()}
    block_vars: dict[str, dict[str, tuple]] = {}
    flat: dict[str, object] = {}
    for key, value in var.get("block_vars", {}).items():  # TOML turns `A.b = [...]` into {"A": {"b": [...]}}
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    for key, value in flat.items():
        tname, _, vname = key.partition(".")
        if tname not in names:
            raise ConfigError(f"{where}: unknown template in var.block_vars.{key}; templates are {', '.join(names)}")
        kind = setting_kind("block_vars", vname)
        if kind is None:
            raise ConfigError(f"{where}: unknown block variable var.block_vars.{key}; "
                              f"allowed: {', '.join(setting_keys('block_vars'))}")
        block_vars.setdefault(tname, {})[vname] = kind.check(where, f"var.block_vars.{key}", value)
    title = data.get("title", "")
    if not isinstance(title, str):
        raise _allowed(where, "title", title, "a string")
    return TailorConfig(title=title, blocks=blocks, channel_multiple=multiple, global_vars=scoped["global_vars"],
                        stage_vars=scoped["stage_vars"], block_vars=block_vars, steps=steps)
