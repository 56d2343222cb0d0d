"""SuperNet fine-tuning: sampled SubNets with in-place distillation, BN recalibration, evaluation,
and chosen SubNets fine-tuned alone."""

from autotailor.tune.cputime import CpuTime
from autotailor.tune.evaluate import evaluate, recalibrated
from autotailor.tune.specialize import specialize, specialize_config
from autotailor.tune.tuner import TuneConfig, Tuner, training_layout

__all__ = ["CpuTime", "TuneConfig", "Tuner", "evaluate", "recalibrated", "specialize", "specialize_config", "training_layout"]
