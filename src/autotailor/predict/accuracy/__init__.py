"""Accuracy prediction: modification sensitivities (learning-free) and an MLP baseline."""

from autotailor.predict.accuracy.mlp import MlpPredictor, MlpSettings
from autotailor.predict.accuracy.sensitivity import (AccuracyPredictorError, ArchEncoder, SensitivityPredictor,
                                                     SensitivityTable, measure_sensitivity)

__all__ = ["AccuracyPredictorError", "ArchEncoder", "MlpPredictor", "MlpSettings", "SensitivityPredictor",
           "SensitivityTable", "measure_sensitivity"]
