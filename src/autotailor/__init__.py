"""AutoTailor: compile an image classifier into a weight-sharing SuperNet and deploy its SubNets.

>>> import autotailor as at
>>> sn = at.compile(model, example_input)
>>> arch = sn.space.sample(0); sn.set_arch(arch); net = sn.extract(arch)
"""

from autotailor.compiler.config import TailorConfig, load_config
from autotailor.errors import (
    AccuracyPredictorError,
    ArchError,
    AutoTailorError,
    ConfigError,
    DataError,
    ExportError,
    GraphError,
    LatencyError,
    ModelLoadError,
    SearchError,
    TraceError,
    TrainingError,
    WorkdirError,
)
from autotailor.supernet import Arch, Space, SuperNet, Variable, compile, load

__version__ = "0.1.0"

__all__ = [
    "AccuracyPredictorError",
    "Arch",
    "ArchError",
    "AutoTailorError",
    "ConfigError",
    "DataError",
    "ExportError",
    "GraphError",
    "LatencyError",
    "ModelLoadError",
    "SearchError",
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
