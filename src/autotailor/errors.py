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


class AgentError(AutoTailorError):
    """A measurement through an agent failed: the agent refused the request, could not run the
    file, or could not be reached. ``status`` is the HTTP status the agent answered (0 if none)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class AgentRequestError(AgentError):
    """The agent refused a request because of what it held (HTTP 4xx): a wrong token, a body above
    the agent's limit, malformed JSON, an unknown backend or setting, a file its runtime cannot
    load. Sending the same request again fails the same way; the message says what to change."""


class AgentUnreachableError(AgentError):
    """The agent did not answer (connection refused or dropped, timeout) after every retry, or
    stayed busy (HTTP 503) past the client's patience."""


class BundleError(AutoTailorError):
    """A bundle's manifest or files cannot be read or written (the message names the file and field)."""


class ServingError(AutoTailorError):
    """The runtime cannot serve: no SubNet fits the memory budget, an input of the wrong shape, a
    format without a loader, a SubNet file that its runtime refuses."""


class PolicyError(AutoTailorError):
    """A policy name that is not registered, options it does not take, or a choice that is not a SubNet."""


class LoadHarnessError(AutoTailorError):
    """A load schedule or arrival trace that cannot be read, or a load process that failed to start."""
