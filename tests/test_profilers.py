"""Profiling backends time real kernels on real runtimes."""

from __future__ import annotations

import pytest
import torch.nn as nn

import autotailor as at
from autotailor.predict.latency.backends import make_backend


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
    with pytest.raises(at.AutoTailorError, match="unknown backend .tensorrt.; available: ncnn, openvino, ort-cpu, remote, torch"):
        make_backend("tensorrt")


def test_ort_profiler_cost_per_node_is_left_out() -> None:
    from autotailor.counters import ort_kernel_ms
    from autotailor.predict.latency.backends.ort import OrtCpu

    def node(name: str, ts: int, dur: int, op: str = "Conv") -> dict:
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    events = [{"cat": "Session", "name": "model_run", "ts": t, "dur": 50} for t in (0, 100)]
    events += [node("/kernel/a", 1, 6), node("/kernel/b", 10, 2), node("/kernel/r", 20, 9, "ReorderOutput"),
               node("/consumer/Reshape", 30, 4), node("/kernel/a", 101, 7)]
    assert ort_kernel_ms(events, skip=0) == [0.008, 0.007]
    # 3 us per node less: a node shorter than that counts 0, never less; reorders and consumer don't count
    assert ort_kernel_ms(events, skip=0, node_offset_ms=0.003) == pytest.approx([0.003, 0.004])
    assert ort_kernel_ms(events, skip=1) == [0.007]
    offset = OrtCpu(threads=1, warmup=3).node_offset_ms()
    assert 0.0005 < offset < 0.02, offset  # microseconds: ORT's profiler bookkeeping per node
