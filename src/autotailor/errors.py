"""Exceptions raised by AutoTailor. Every message says what was wrong and what to do."""

from __future__ import annotations


class AutoTailorError(Exception):
    """Base class of every error AutoTailor raises on purpose."""


class ModelLoadError(AutoTailorError):
    """A model spec or file could not be turned into a module."""


class TraceError(AutoTailorError):
    """The model could not be traced into a computation graph."""


class GraphError(AutoTailorError):
    """The traced graph is not an image-classifier graph AutoTailor can compile."""


class ConfigError(AutoTailorError):
    """The TOML configuration is malformed or names something that does not exist."""


class ArchError(AutoTailorError):
    """An architecture (a SubNet choice) does not belong to the SuperNet's space."""


class ExportError(AutoTailorError):
    """A SubNet could not be exported or did not reproduce the SuperNet's output."""


class DataError(AutoTailorError):
    """A data spec or a data set could not be read."""


class LatencyError(AutoTailorError):
    """A latency prediction or profiling problem (missing LUT entries, unknown backend, ...)."""


class AccuracyPredictorError(AutoTailorError):
    """An accuracy predictor is missing, stale or cannot be built from what was given."""


class SearchError(AutoTailorError):
    """A search was asked something it cannot answer (no budget, unknown metric, no predictor, ...)."""


class TrainingError(AutoTailorError):
    """Training or tuning stopped: a non-finite or exploding loss. The weights on disk are the last good ones."""


class WorkdirError(AutoTailorError):
    """A work directory is in use by another run, belongs to another model, or holds unreadable state."""
