"""Replay a request arrival trace against a local runtime, optionally under a competing CPU load.

::

    summary = replay("bundle/", "arrivals.json", slo_ms=8, out_path="replay.jsonl", load="duty.json")

The trace is an :class:`~autotailor.runtime.load.ArrivalTrace` file (``ArrivalTrace.write``), the
load a :class:`~autotailor.runtime.load.CpuSchedule` file run by a
:class:`~autotailor.runtime.load.LoadHarness` from the trace's start. Requests are served by
:func:`~autotailor.runtime.load.run_trace`: one at a time, in order, so a request that arrives
while another runs waits. Each writes one JSON line: its arrival, start and end (``time.time()``
seconds), response and wait, and the runtime's record of the inference (SubNet, latency,
slowdown, forecast, switch cost, the monitor's reading) and the duty the load harness had then.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from autotailor.errors import LoadHarnessError
from autotailor.files import atomic_write
from autotailor.runtime.bundle import Bundle
from autotailor.runtime.load import ArrivalTrace, CpuSchedule, LoadHarness, run_trace
from autotailor.runtime.policies import Policy
from autotailor.runtime.runtime import Runtime

log = logging.getLogger(__name__)

# the load harness runs this long past the trace's last arrival (requests may queue behind it);
# it is stopped as soon as the replay ends anyway
LOAD_MARGIN_S = 30.0


def replay_input(bundle: Bundle, seed: int = 0) -> np.ndarray:
    """The input every request of a replay sends: one standard normal float32 image (seeded) of
    the largest input any SubNet of ``bundle`` takes, so that each SubNet resizes it down."""
    shape = max((s.input_shape for s in bundle), key=lambda s: math.prod(s[1:]))
    return np.random.default_rng(seed).standard_normal((1, *shape[1:])).astype(np.float32)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    v = sorted(values)

    def pct(q: float) -> float | None:
        return v[min(len(v) - 1, int(q * len(v)))] if v else None

    return {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99), "max": v[-1] if v else None}


def replay(bundle_dir: str | Path | Bundle, trace_path: str | Path, slo_ms: float, out_path: str | Path | None = None,
           load: str | Path | CpuSchedule | None = None, policy: str | Policy = "forecast", seed: int = 0, *,
           memory_mb: float | None = None, policy_options: Mapping[str, Any] | None = None,
           threads: int = 1) -> dict[str, Any]:
    """Serve one request at each arrival of the trace at ``trace_path`` from a
    ``Runtime(bundle_dir, slo_ms, memory_mb, policy)``, under the CPU schedule ``load`` (a file or a
    :class:`CpuSchedule`; None: no load). Write one JSON line per request to ``out_path`` (if
    given, atomically) and return the summary: ``Runtime.stats()`` (``slo_met``: the share of
    inferences within ``slo_ms``) with the response times, which count the wait behind earlier
    requests (``response_ms``, ``response_slo_met``), the trace and the load."""
    trace = ArrivalTrace.read(trace_path)
    if not trace.times:
        raise LoadHarnessError(f"{trace_path} holds no arrivals; write a trace with requests in it "
                               "(ArrivalTrace.steady(rate_hz, duration_s).write(path))")
    schedule = CpuSchedule.read(load) if isinstance(load, (str, Path)) else load
    n = len(trace.times)
    with Runtime(bundle_dir, slo_ms, memory_mb, policy, threads=threads, policy_options=policy_options,
                 history=max(100_000, n)) as rt:
        x = replay_input(rt.bundle, seed)
        with contextlib.ExitStack() as stack:
            harness = None
            if schedule is not None:
                harness = stack.enter_context(LoadHarness(trace.duration_s + LOAD_MARGIN_S, cpu=schedule))
            log.info("replaying %d requests over %.1f s from %s%s", n, trace.duration_s, trace_path,
                     f" under the load of {load}" if harness else "")
            served = run_trace(rt, trace, x)
        inferences = rt.records[-n:]  # run_trace made exactly one inference per request, in order
        stats = rt.stats()
        policy_name = rt.policy.name

    rows = []
    for i, (s, rec) in enumerate(zip(served, inferences)):
        row: dict[str, Any] = {"request": i, "arrival": s.arrival, **asdict(rec),
                               "response_ms": s.response_ms, "wait_ms": (s.start - s.arrival) * 1000}
        if harness is not None and harness.t0 is not None:
            t = s.start - harness.t0
            row["load_duty"] = schedule.duty_at(t) if t < harness.duration_s else 0.0  # type: ignore[union-attr]
        rows.append(row)
    if out_path is not None:
        with atomic_write(out_path) as tmp:
            with open(tmp, "w") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
        log.info("wrote %d records to %s", len(rows), out_path)

    response = [r["response_ms"] for r in rows]
    return {**stats, "bundle": str(Path(bundle_dir.root if isinstance(bundle_dir, Bundle) else bundle_dir)),
            "policy": policy_name, "memory_mb": memory_mb, "seed": seed,
            "trace": {"path": str(trace_path), "kind": trace.kind, "params": dict(trace.params),
                      "requests": n, "duration_s": trace.duration_s},
            "load": None if schedule is None else {
                "path": str(load) if isinstance(load, (str, Path)) else None, "workers": schedule.workers,
                "period_ms": schedule.period_ms, "schedule": [list(p) for p in schedule.points]},
            "response_ms": _percentiles(response),
            "response_slo_met": sum(r <= slo_ms for r in response) / len(response),
            "wall_s": served[-1].end - served[0].arrival,
            "out": str(out_path) if out_path is not None else None}
