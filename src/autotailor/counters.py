"""What a runtime's own profiler says a kernel cost: ONNX Runtime's profile events and
OpenVINO's performance counters, summed per run over the nodes that are the kernel's. A kernel
run alone converts its input and output (layouts, int8 quantization), which a whole model does
only at its ends; these counts leave that out. Standard library only, so that the host's
backends and the torch-free agent count the same way.

``COUNTS`` names the rules a measurement can ask for: ``layout`` (ONNX Runtime fp32: every node
but the layout reorders and the consumer of the kernel's output), ``own`` (ONNX Runtime int8:
only the nodes of the kernel's own graph, which ``_Consumed`` names ``/kernel/...``), and
``reorders`` (OpenVINO: every executed node but its ``Reorder`` nodes).
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Iterable

ORT_LAYOUT_NODES = ("ReorderInput", "ReorderOutput")


def ort_counted(event: dict) -> bool:
    """Whether a profiled node is part of the kernel: not a layout conversion, not the consumer."""
    args = event.get("args", {})
    return args.get("op_name") not in ORT_LAYOUT_NODES and not event["name"].startswith("/consumer/")


def ort_own_node(event: dict) -> bool:
    """Whether a profiled node is one of the kernel's own, not a conversion at its input or output
    that ONNX Runtime inserted."""
    return event["name"].startswith("/kernel/")


ORT_COUNTS: dict[str, Callable[[dict], bool]] = {"layout": ort_counted, "own": ort_own_node}
COUNTS = (*ORT_COUNTS, "reorders")


def ort_kernel_ms(events: list[dict], skip: int, node_offset_ms: float = 0.0,
                  counted: Callable[[dict], bool] = ort_counted) -> list[float]:
    """Per model run of an ONNX Runtime profile (after the first ``skip``), the summed duration of
    its ``counted`` nodes, each less ``node_offset_ms`` (the profiler's own cost per node; a node
    counts at least 0)."""
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    runs = sorted(runs)[skip:]
    totals = [0.0] * len(runs)
    starts = [r[0] for r in runs]
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or not counted(e):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] <= runs[i][1]:
            totals[i] += max(0.0, e["dur"] / 1e3 - node_offset_ms)
    return totals


def openvino_kernel_ms(profiling_info: Iterable[Any]) -> float:
    """The summed time (ms) of one OpenVINO inference's executed nodes, its ``Reorder`` nodes left
    out (``InferRequest.get_profiling_info()`` after a run compiled with ``PERF_COUNT``)."""
    return sum(p.real_time.total_seconds() * 1e3 for p in profiling_info
               if p.node_type != "Reorder" and str(p.status).endswith("EXECUTED"))
