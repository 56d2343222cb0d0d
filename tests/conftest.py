"""Shared test helpers."""

from autotailor.testing import rel_err, well_conditioned

__all__ = ["rel_err", "well_conditioned"]
