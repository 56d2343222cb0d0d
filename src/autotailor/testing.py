"""Helpers for checking compilation on models with random weights (tests, benchmarks, users)."""

from __future__ import annotations

import torch
import torch.nn as nn


def well_conditioned(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give a randomly initialised model non-degenerate BatchNorm statistics and heads, in place.

    Fresh torchvision models have unit BatchNorm scales and zero means, which makes some
    (MobileNetV3) produce outputs of magnitude ~1e-10 and every channel look equally
    important, and zero classifier heads (ViT, Swin) whose output is always 0. Random
    statistics and heads give O(1) activations, so comparing outputs means something.
    Returns the model in eval mode.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.Linear, nn.Conv2d)) and not mod.weight.any():
                mod.weight.normal_(0, 0.02, generator=g)
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.running_mean is not None:
                n = mod.num_features
                mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                if mod.weight is not None:
                    mod.weight.copy_(torch.rand(n, generator=g) + 0.5)
                    mod.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return model.eval()


def rel_err(reference: torch.Tensor, other: torch.Tensor) -> float:
    """max |reference - other| relative to the largest magnitude of ``reference``."""
    a, b = torch.as_tensor(reference).detach(), torch.as_tensor(other).detach()
    return float((a - b).abs().max() / a.abs().max().clamp_min(1e-12))
