"""The runtime's error classes, kept here until they move into ``autotailor/errors.py`` (the
project keeps every error class there; these four are the runtime's, phase 1)."""

from __future__ import annotations

from autotailor.errors import AutoTailorError


class BundleError(AutoTailorError):
    """A bundle's manifest or files cannot be read or written (the message names the file and field)."""


class ServingError(AutoTailorError):
    """The runtime cannot serve: no SubNet fits the memory budget, an input of the wrong shape, a
    format without a loader, a SubNet file that its runtime refuses."""


class PolicyError(AutoTailorError):
    """A policy name that is not registered, options it does not take, or a choice that is not a SubNet."""


class LoadHarnessError(AutoTailorError):
    """A load schedule or arrival trace that cannot be read, or a load process that failed to start."""
