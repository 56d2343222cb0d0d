"""The executable SuperNet, its modification space, and ``compile``."""

from autotailor.supernet.build import compile
from autotailor.supernet.space import Arch, Space, Variable
from autotailor.supernet.supernet import SuperNet, load

__all__ = ["Arch", "Space", "SuperNet", "Variable", "compile", "load"]
