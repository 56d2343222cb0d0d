"""Predictors: latency (lookup tables of profiled kernels) and accuracy (modification sensitivities)."""
