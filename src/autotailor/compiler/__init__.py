"""Compiler passes: channel groups, block parsing, stage division, templates, config."""

from autotailor.compiler.config import TailorConfig, load_config

__all__ = ["TailorConfig", "load_config"]
