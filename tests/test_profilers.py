"""Profiling backends time real kernels on real runtimes."""

from __future__ import annotations

import pytest
import torch.nn as nn

import autotailor as at
from autotailor.predict.latency.profilers import make_backend


@pytest.mark.parametrize("name", ["ort-cpu", "torch"])
def test_bigger_kernels_take_longer_and_overhead_is_small(name: str) -> None:
    b = make_backend(name, threads=1, warmup=3, repeats=15)
    small = b.measure(nn.Conv2d(16, 16, 3, padding=1), (1, 16, 16, 16))
    big = b.measure(nn.Conv2d(64, 64, 3, padding=1), (1, 64, 32, 32))  # 64x more arithmetic
    overhead = b.overhead()
    assert small.repeats == 15 and small.mad_ms >= 0
    assert big.median_ms > 4 * small.median_ms, (small, big)
    assert overhead.median_ms < small.median_ms
    assert b.settings["threads"] == 1 and b.settings["flush_mb"] == (16 if name == "ort-cpu" else 0)


def test_unknown_backend_names_the_available_ones() -> None:
    with pytest.raises(at.AutoTailorError, match="unknown backend .tensorrt.; available: ncnn, ort-cpu, torch"):
        make_backend("tensorrt")
