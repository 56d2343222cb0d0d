"""SuperNet fine-tuning: sampled SubNets with in-place distillation, BN recalibration, evaluation."""

from autotailor.tune.evaluate import evaluate, recalibrated
from autotailor.tune.tuner import TuneConfig, Tuner, training_layout

__all__ = ["TuneConfig", "Tuner", "evaluate", "recalibrated", "training_layout"]
