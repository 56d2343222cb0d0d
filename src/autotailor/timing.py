"""Timing a call the way every measurement of AutoTailor does, on the host (backends) and on a
device (the agent): stdlib only, so that the torch-free agent shares it."""

from __future__ import annotations

import time
from typing import Callable


def time_calls(run: Callable[[], object], warmup: int, repeats: int, budget_s: float,
                before: Callable[[], object] | None = None) -> list[float]:
    """Warm up, then time up to ``repeats`` calls, fewer (but at least 5) when one call is
    long enough that ``repeats`` would exceed ``budget_s``: slow kernels are stable anyway.
    The warm-up stops early too, after two calls, once it has taken ``budget_s``: a whole
    SubNet of half a second is warm after its first call (measured on NCNN and ONNX Runtime),
    and ten warm-up calls were most of a calibration's time."""
    deadline = time.perf_counter() + budget_s
    for i in range(warmup):
        if i >= 2 and time.perf_counter() > deadline:
            break
        run()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats and (len(times) < 5 or time.perf_counter() < deadline):
        if before is not None:
            before()  # not timed
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return times
