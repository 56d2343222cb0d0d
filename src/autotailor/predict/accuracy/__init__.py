"""Accuracy prediction: modification sensitivities (learning-free) and an MLP baseline."""

from autotailor.predict.accuracy.mlp import MlpPredictor, MlpSettings
from autotailor.predict.accuracy.sensitivity import (AccuracyPredictorError, ArchEncoder, OverlapFit,
                                                     SensitivityPredictor, SensitivityTable, fit_overlap,
                                                     measure_sensitivity)

__all__ = ["AccuracyPredictorError", "ArchEncoder", "MlpPredictor", "MlpSettings", "OverlapFit",
           "SensitivityPredictor", "SensitivityTable", "fit_overlap", "measure_sensitivity"]
