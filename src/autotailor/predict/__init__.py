"""Predictors: latency (lookup tables of profiled kernels) and, later, accuracy."""
