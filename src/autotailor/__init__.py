"""AutoTailor: compile an image classifier into a weight-sharing SuperNet and deploy its SubNets.

>>> import autotailor as at
>>> sn = at.compile(model, example_input)
>>> arch = sn.space.sample(0); sn.set_arch(arch); net = sn.extract(arch)

The names below are imported when first used (PEP 562), so that the on-device parts
(``autotailor.runtime``, ``autotailor.agent``) import without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from autotailor.errors import (
    AccuracyPredictorError,
    AgentError,
    AgentRequestError,
    AgentUnreachableError,
    ArchError,
    AutoTailorError,
    BundleError,
    ConfigError,
    DataError,
    ExportError,
    GraphError,
    LatencyError,
    LoadHarnessError,
    ModelLoadError,
    PolicyError,
    SearchError,
    ServingError,
    TraceError,
    TrainingError,
    WorkdirError,
)

__version__ = "0.1.0"

_LAZY = {"TailorConfig": "autotailor.compiler.config", "load_config": "autotailor.compiler.config",
         "Arch": "autotailor.supernet", "Space": "autotailor.supernet", "SuperNet": "autotailor.supernet",
         "Variable": "autotailor.supernet", "compile": "autotailor.supernet", "load": "autotailor.supernet"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autotailor' has no attribute {name!r}")


__all__ = [
    "AccuracyPredictorError",
    "AgentError",
    "AgentRequestError",
    "AgentUnreachableError",
    "Arch",
    "ArchError",
    "AutoTailorError",
    "BundleError",
    "ConfigError",
    "DataError",
    "ExportError",
    "GraphError",
    "LatencyError",
    "LoadHarnessError",
    "ModelLoadError",
    "PolicyError",
    "SearchError",
    "ServingError",
    "TrainingError",
    "WorkdirError",
    "Space",
    "SuperNet",
    "TailorConfig",
    "TraceError",
    "Variable",
    "compile",
    "load",
    "load_config",
]
