"""Conditions to adapt to, repeatable: competing CPU load, memory pressure and request arrivals.

- :class:`CpuSchedule`: ``workers`` processes, each busy for ``duty`` (0..1) of every period,
  the duty a step function of time read from a file: JSON ``{"workers": 2, "period_ms": 100,
  "schedule": [[0, 0.0], [2, 1.0], [5, 0.0]]}`` or CSV rows ``t_seconds,duty``.
- :class:`LoadHarness`: runs a schedule and/or holds ``memory_mb`` allocated and touched, for
  at most ``duration_s``. A context manager: on exit, on an exception, the processes are
  terminated (killed if they linger) and reaped; each also stops by itself at the deadline
  or when its parent dies, so none outlives the harness.
- :class:`ArrivalTrace`: request arrival times (steady, step, bursty; seeded), written to and
  read from JSON so that a run can be repeated; :func:`run_trace` plays one against a runtime.

The load processes run ``_load_worker.py`` by path: they start in milliseconds and import
neither autotailor nor torch.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import random
import selectors
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from autotailor.files import write_text
from autotailor.errors import LoadHarnessError

if TYPE_CHECKING:
    from autotailor.runtime.runtime import Runtime

log = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("_load_worker.py")
ARRIVALS_SCHEMA = "autotailor-arrivals/1"


@dataclass(frozen=True)
class CpuSchedule:
    """A step function of (seconds from the start, duty 0..1) for ``workers`` busy processes."""

    points: tuple[tuple[float, float], ...]
    workers: int = 1
    period_ms: float = 100.0

    def __post_init__(self) -> None:
        problem = _check_points(self.points)
        if problem:
            raise LoadHarnessError(f"CPU schedule {problem}")
        if self.workers < 1 or not self.period_ms > 0:
            raise LoadHarnessError(f"CPU schedule needs workers >= 1 and period_ms > 0 "
                                   f"(got {self.workers}, {self.period_ms})")

    @classmethod
    def constant(cls, duty: float, workers: int = 1, period_ms: float = 100.0) -> "CpuSchedule":
        return cls(((0.0, duty),), workers, period_ms)

    def duty_at(self, t: float) -> float:
        duty = 0.0
        for at, d in self.points:
            if t < at:
                break
            duty = d
        return duty

    @classmethod
    def read(cls, path: str | Path, workers: int = 1, period_ms: float = 100.0) -> "CpuSchedule":
        """From JSON (an object as in the module docstring, or a bare list of points) or CSV
        (``t_seconds,duty`` rows, a header allowed); ``workers``/``period_ms`` where the file has none."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise LoadHarnessError(f"cannot read CPU schedule {path}: {exc}") from exc
        try:
            if path.suffix.lower() == ".csv":
                rows = [r for r in csv.reader(io.StringIO(text)) if r and not r[0].lstrip().startswith("#")]
                if rows and not _is_number(rows[0][0]):
                    rows = rows[1:]
                points = [(float(r[0]), float(r[1])) for r in rows]
            else:
                data = json.loads(text)
                if isinstance(data, dict):
                    workers = int(data.get("workers", workers))
                    period_ms = float(data.get("period_ms", period_ms))
                    data = data.get("schedule")
                points = [(float(t), float(d)) for t, d in data]
        except (ValueError, TypeError, IndexError, json.JSONDecodeError) as exc:
            raise LoadHarnessError(f"{path} is not a CPU schedule (rows of t_seconds, duty): {exc}") from exc
        problem = _check_points(points)
        if problem:
            raise LoadHarnessError(f"{path}: {problem}")
        return cls(tuple(points), workers, period_ms)

    def write(self, path: str | Path) -> Path:
        doc = {"workers": self.workers, "period_ms": self.period_ms, "schedule": [list(p) for p in self.points]}
        return write_text(path, json.dumps(doc, indent=1) + "\n")


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _check_points(points: Sequence[tuple[float, float]]) -> str | None:
    if not points:
        return "has no points"
    for i, (t, d) in enumerate(points):
        if not (math.isfinite(t) and t >= 0):
            return f"point {i}: t={t} must be >= 0 seconds"
        if not 0 <= d <= 1:
            return f"point {i}: duty={d} must be within 0..1"
        if i and t <= points[i - 1][0]:
            return f"point {i}: t={t} must come after t={points[i - 1][0]}"
    return None


class LoadHarness:
    """Competing load for at most ``duration_s`` seconds; see the module docstring.

    >>> with LoadHarness(10, cpu=CpuSchedule(((0, 0.0), (2, 1.0), (6, 0.0)), workers=2), memory_mb=256) as h:
    ...     ...  # h.t0: the schedule's time zero (time.time()); h.pids

    ``nice``: the processes' nice value (absolute; below 0 needs the privilege to raise priority).
    """

    def __init__(self, duration_s: float, cpu: CpuSchedule | str | Path | None = None, memory_mb: float = 0,
                 nice: int = 0, ready_timeout_s: float = 10.0):
        if not (duration_s > 0 and math.isfinite(duration_s)):
            raise LoadHarnessError(f"duration_s must be a positive number of seconds (got {duration_s!r})")
        if memory_mb < 0:
            raise LoadHarnessError(f"memory_mb must be >= 0 (got {memory_mb})")
        self.duration_s = duration_s
        self.cpu = CpuSchedule.read(cpu) if isinstance(cpu, (str, Path)) else cpu
        self.memory_mb, self.nice, self.ready_timeout_s = memory_mb, nice, ready_timeout_s
        self.t0: float | None = None
        self._procs: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else time.time() - self.t0

    def duty_now(self) -> float:
        return self.cpu.duty_at(self.elapsed()) if self.cpu is not None else 0.0

    def _spawn(self, spec: dict[str, Any]) -> None:
        try:
            p = subprocess.Popen([sys.executable, "-I", "-S", str(_WORKER), json.dumps({**spec, "nice": self.nice})],
                                 stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        except OSError as exc:
            raise LoadHarnessError(f"cannot start a load process ({sys.executable}): {exc}") from exc
        self._procs.append(p)

    def start(self) -> "LoadHarness":
        if self._procs:
            raise LoadHarnessError("this load harness is running already")
        self.t0 = time.time()
        end, ppid = self.t0 + self.duration_s, os.getpid()
        try:
            if self.cpu is not None:
                spec = {"kind": "cpu", "schedule": [list(p) for p in self.cpu.points],
                        "period_ms": self.cpu.period_ms, "start": self.t0, "end": end, "ppid": ppid}
                for _ in range(self.cpu.workers):
                    self._spawn(spec)
            if self.memory_mb > 0:
                self._spawn({"kind": "memory", "mb": self.memory_mb, "end": end, "ppid": ppid})
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("load harness: %d processes for %.1f s (pids %s)", len(self._procs), self.duration_s, self.pids)
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        with selectors.DefaultSelector() as sel:
            for p in self._procs:
                sel.register(p.stdout, selectors.EVENT_READ, p)
            waiting = set(self.pids)
            while waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LoadHarnessError(f"load processes {sorted(waiting)} were not ready within {self.ready_timeout_s} s")
                for key, _ in sel.select(left):
                    p = key.data
                    line = p.stdout.readline()
                    if line.strip() != "ready":
                        raise LoadHarnessError(f"load process {p.pid} failed to start (exit code {p.poll()})")
                    sel.unregister(p.stdout)
                    waiting.discard(p.pid)

    def stop(self) -> None:
        """Terminate every process (kill what lingers) and reap it."""
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        for p in self._procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
        self._procs = []

    def wait(self) -> None:
        """Sleep until ``duration_s`` has passed since the start."""
        if self.t0 is not None:
            time.sleep(max(0.0, self.t0 + self.duration_s - time.time()))

    def __enter__(self) -> "LoadHarness":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class ArrivalTrace:
    """Request arrival times in seconds from the trace's start, ascending."""

    times: tuple[float, ...]
    kind: str = "custom"
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if any(b < a for a, b in zip(self.times, self.times[1:])) or any(t < 0 for t in self.times[:1]):
            raise LoadHarnessError("arrival times must be >= 0 and ascending")

    @property
    def duration_s(self) -> float:
        return self.times[-1] if self.times else 0.0

    def count(self, start: float, end: float) -> int:
        """Arrivals in [start, end)."""
        return int(np.searchsorted(self.times, end, "left") - np.searchsorted(self.times, start, "left"))

    @classmethod
    def steady(cls, rate_hz: float, duration_s: float) -> "ArrivalTrace":
        """One request every 1/rate seconds."""
        n = int(math.floor(rate_hz * duration_s + 1e-9))
        return cls(tuple(i / rate_hz for i in range(n)), "steady", {"rate_hz": rate_hz, "duration_s": duration_s})

    @classmethod
    def step(cls, steps: Sequence[tuple[float, float]], duration_s: float) -> "ArrivalTrace":
        """Evenly spaced requests whose rate changes at given times: ``[(t, rate_hz), ...]``."""
        problem = _check_points([(t, 0.0) for t, _ in steps])
        if problem or any(r < 0 for _, r in steps):
            raise LoadHarnessError(f"step trace: {problem or 'rates must be >= 0'}")
        times: list[float] = []
        bounds = [t for t, _ in steps[1:]] + [duration_s]
        for (t, rate), until in zip(steps, bounds):
            if rate > 0:
                k = 0
                while t + k / rate < until - 1e-12:
                    times.append(t + k / rate)
                    k += 1
        return cls(tuple(times), "step", {"steps": [list(s) for s in steps], "duration_s": duration_s})

    @classmethod
    def bursty(cls, rate_hz: float, burst_rate_hz: float, burst_s: float, every_s: float, duration_s: float,
               seed: int = 0) -> "ArrivalTrace":
        """Poisson arrivals at ``rate_hz``, at ``burst_rate_hz`` for the first ``burst_s`` of every
        ``every_s`` seconds (a Markov-modulated Poisson process, drawn by thinning; seeded)."""
        rng = random.Random(seed)
        top = max(rate_hz, burst_rate_hz)
        times, t = [], 0.0
        while top > 0:
            t += rng.expovariate(top)
            if t >= duration_s:
                break
            rate = burst_rate_hz if (t % every_s) < burst_s else rate_hz
            if rng.random() * top < rate:
                times.append(t)
        return cls(tuple(times), "bursty", {"rate_hz": rate_hz, "burst_rate_hz": burst_rate_hz, "burst_s": burst_s,
                                            "every_s": every_s, "duration_s": duration_s, "seed": seed})

    def write(self, path: str | Path) -> Path:
        doc = {"schema": ARRIVALS_SCHEMA, "kind": self.kind, "params": dict(self.params), "times": list(self.times)}
        return write_text(path, json.dumps(doc) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> "ArrivalTrace":
        try:
            data = json.loads(Path(path).read_text())
            if data.get("schema") != ARRIVALS_SCHEMA:
                raise ValueError(f"schema is {data.get('schema')!r}, not {ARRIVALS_SCHEMA!r}")
            return cls(tuple(float(t) for t in data["times"]), data.get("kind", "custom"), data.get("params", {}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LoadHarnessError(f"{path} is not an arrival trace: {exc}") from exc


@dataclass(frozen=True)
class Served:
    """One request of a trace: when it arrived, started and ended (time.time()), and which SubNet served it."""

    arrival: float
    start: float
    end: float
    subnet: str

    @property
    def response_ms(self) -> float:
        return (self.end - self.arrival) * 1000


def run_trace(runtime: "Runtime", trace: ArrivalTrace, x: np.ndarray, speed: float = 1.0) -> list[Served]:
    """Serve one request with input ``x`` at each arrival (one at a time, in order: a request that
    arrives while another runs waits, and its response time counts the wait)."""
    wall0, perf0 = time.time(), time.perf_counter()
    out = []
    for a in trace.times:
        due = perf0 + a / speed
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        runtime.infer(x)
        rec = runtime.last_record
        out.append(Served(wall0 + a / speed, rec.start if rec else math.nan, rec.end if rec else math.nan,
                          rec.subnet if rec else ""))
    return out
