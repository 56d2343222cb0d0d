"""The runtime: serves inferences from a bundle, switching SubNets as the device's conditions change.

::

    rt = Runtime("bundle/", slo_ms=8, memory_mb=64, policy="forecast")
    y = rt.infer(x)            # x: a numpy array; resized to the current SubNet's resolution
    rt.stats()                 # switches, their cost, latency percentiles, goal met, monitor cost

Before each inference the policy chooses among the SubNets that fit the memory budget; a
SubNet not loaded yet is loaded then (and run once on zeros, so that its first served
inference is not a cold one), and the least recently used ones are unloaded while the loaded
SubNets' memory exceeds the budget. The time to make another SubNet current, loaded or not, is
the switch cost. The budget in force is ``memory_mb``, and at most ``memory_headroom`` of the
memory the monitor finds available (plus what the loaded SubNets hold), so that memory
pressure from other processes unloads SubNets and, at worst, narrows the choice.

Idle latencies in place: the manifest's latency is measured by the profiler, back to back;
served one at a time through this process, a call costs more (input conversion, the
runtime's call, caches cooled by the wait), a large share of a sub-millisecond SubNet and
little of a long one. A slowdown against the manifest would then say "loaded" at idle, more
so for the fastest SubNet, and the policies would scale every SubNet by the wrong factor. So
each SubNet, once loaded, runs ``calibration_runs`` more times on zeros; the median is its
idle latency in place, divided by the median slowdown of the last three inferences when that
exceeds 1 (a load slows it as it slowed them) and never below the manifest's. A SubNet not
measured yet is expected at its manifest latency plus the smallest excess measured so far.
None is measured while the monitor finds less than half a core per thread free. The policies
and the monitor get copies of the SubNets that carry these latencies (``idle_ms``) as
``measured_latency_ms``, hence ``latency_ms``, in the bundle's order.

Needs numpy and onnxruntime only (no torch): a device runs it without the compiler.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import threading
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from autotailor.files import atomic_write
from autotailor.errors import PolicyError, ServingError
from autotailor.runtime.bundle import Bundle, SubNetEntry
from autotailor.runtime.loaders import Session, loader_for
from autotailor.runtime.monitor import Monitor, Reading
from autotailor.runtime.policies import Goal, Policy, PolicyState, make_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InferenceRecord:
    """One served inference. Times are time.time() seconds."""

    start: float
    end: float
    subnet: str
    latency_ms: float
    slowdown: float  # latency_ms / the SubNet's idle latency in place (see ``Runtime.idle_ms``)
    forecast_mean: float  # the slowdown forecast after this inference
    forecast_upper: float
    switch_ms: float | None  # the switch this inference waited for (None: no switch)
    reading: Reading | None  # the monitor's sample before this inference


def resize_bilinear(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize an ``N x C x H x W`` array bilinearly with half-pixel centres (torch's
    ``F.interpolate(mode="bilinear", align_corners=False)``, which SubNets are trained with)."""
    out = x
    for axis, n_out in ((2, size[0]), (3, size[1])):
        n_in = out.shape[axis]
        if n_in == n_out:
            continue
        src = np.maximum((np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5, 0.0)
        i0 = np.floor(src).astype(np.int64)
        i1 = np.minimum(i0 + 1, n_in - 1)
        w = (src - i0).astype(np.float32)
        shape = [1] * out.ndim
        shape[axis] = n_out
        w = w.reshape(shape)
        out = np.take(out, i0, axis=axis) * (1 - w) + np.take(out, i1, axis=axis) * w
    return np.ascontiguousarray(out, dtype=np.float32)


class Runtime:
    """Serves inferences from ``bundle`` under ``slo_ms`` per inference and ``memory_mb`` for
    the loaded SubNets, with the ``policy`` (a registered name or a :class:`Policy`)."""

    def __init__(self, bundle: Bundle | str | Path, slo_ms: float, memory_mb: float | None = None,
                 policy: str | Policy = "forecast", monitor: Monitor | None = None, *, threads: int = 1,
                 policy_options: Mapping[str, Any] | None = None, memory_headroom: float | None = 0.5,
                 history: int = 100_000, resize: bool = True, calibration_runs: int = 5):
        if not (isinstance(slo_ms, (int, float)) and slo_ms > 0 and math.isfinite(slo_ms)):
            raise ServingError(f"slo_ms must be a positive number of milliseconds (got {slo_ms!r})")
        if memory_mb is not None and not memory_mb > 0:
            raise ServingError(f"memory_mb must be positive or None (got {memory_mb!r})")
        if threads < 1:
            raise ServingError(f"threads must be >= 1 (got {threads})")
        if calibration_runs < 0:
            raise ServingError(f"calibration_runs must be >= 0 (got {calibration_runs})")
        self.bundle = bundle if isinstance(bundle, Bundle) else Bundle.load(bundle)
        self.slo_ms, self.memory_mb, self.threads = float(slo_ms), memory_mb, threads
        self.memory_headroom, self.resize, self.calibration_runs = memory_headroom, resize, calibration_runs
        self.subnets = tuple(s for s in self.bundle if memory_mb is None or s.memory_mb <= memory_mb)
        if not self.subnets:
            small = min(self.bundle, key=lambda s: s.memory_mb)
            raise ServingError(f"no SubNet of {self.bundle.root} fits memory_mb={memory_mb}; the smallest, "
                               f"{small.name!r}, needs {small.memory_mb:.2f} MB")
        if isinstance(policy, Policy):
            if policy_options:
                raise PolicyError("policy_options go with a policy name, not with a Policy object")
            self.policy = policy
        else:
            self.policy = make_policy(policy, **dict(policy_options or {}))
        self.monitor = monitor or Monitor()
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._current: SubNetEntry | None = None
        self._excess: dict[str, float] = {}  # per SubNet measured: a call in place less the manifest's latency
        self._in_place: dict[str, SubNetEntry] = {}  # every SubNet with its expected idle latency in place
        self._update_in_place()
        self._switched_at = -math.inf
        self._recent: deque[float] = deque(maxlen=64)
        self._last_violation: float | None = None
        self._records: deque[InferenceRecord] = deque(maxlen=history)
        self._lock = threading.Lock()
        self._wall0, self._perf0 = time.time(), time.perf_counter()
        self.switches = 0  # changes of the current SubNet (the first choice is not one)
        self.loads = 0
        self.evictions = 0
        self.switch_ms: list[float] = []  # every switch's cost, the first choice's included

    # ---- state
    @property
    def current(self) -> SubNetEntry | None:
        return self._current

    @property
    def loaded(self) -> tuple[str, ...]:
        """The loaded SubNets, least recently used first."""
        return tuple(self._sessions)

    @property
    def records(self) -> list[InferenceRecord]:
        return list(self._records)

    @property
    def last_record(self) -> InferenceRecord | None:
        return self._records[-1] if self._records else None

    @property
    def idle_ms(self) -> dict[str, float]:
        """Each SubNet's idle latency in place: measured once loaded, estimated before (module docstring)."""
        return {name: e.latency_ms for name, e in self._in_place.items()}

    def _update_in_place(self) -> None:
        least = min(self._excess.values(), default=0.0)
        self._in_place = {s.name: replace(s, measured_latency_ms=s.latency_ms + self._excess.get(s.name, least))
                          for s in self.subnets}

    def _calibrate(self, entry: SubNetEntry, session: Session) -> None:
        if not self.calibration_runs:
            return
        reading = self.monitor.reading
        if reading is not None and reading.cpu_available is not None and reading.cpu_available < 0.5 * self.threads:
            log.debug("SubNet %s not calibrated: %.2f cores free", entry.name, reading.cpu_available)
            return
        x = np.zeros((1, *entry.input_shape[1:]), dtype=np.float32)
        times = []
        for _ in range(self.calibration_runs):
            t0 = time.perf_counter()
            session.run(x)
            times.append((time.perf_counter() - t0) * 1000)
        # a slowdown the monitor cannot see (a sibling hyperthread, heat) slows this measurement as
        # it slowed the last inferences: divide it out
        recent = [r.slowdown for r in list(self._records)[-3:]]
        slowed = max(1.0, statistics.median(recent)) if recent else 1.0
        self._excess[entry.name] = max(0.0, statistics.median(times) / slowed - entry.latency_ms)
        log.debug("SubNet %s: %.3f ms more in place than the manifest's %.3f ms", entry.name,
                  self._excess[entry.name], entry.latency_ms)
        self._update_in_place()

    def _now(self) -> float:
        return self._wall0 + (time.perf_counter() - self._perf0)

    def budget_mb(self, reading: Reading | None = None) -> float | None:
        """The memory budget in force: ``memory_mb``, capped by the headroom of available memory."""
        budget = self.memory_mb
        reading = reading or self.monitor.reading
        if self.memory_headroom is not None and reading is not None and reading.mem_available_mb is not None:
            held = sum(self.bundle[n].memory_mb for n in self._sessions)
            dynamic = self.memory_headroom * (reading.mem_available_mb + held)
            budget = dynamic if budget is None else min(budget, dynamic)
        return budget

    # ---- switching
    def _evict(self, budget: float | None, keep: set[str]) -> None:
        if budget is None:
            return
        for name in list(self._sessions):
            if sum(self.bundle[n].memory_mb for n in self._sessions) <= budget:
                return
            if name not in keep:
                self._sessions.pop(name).close()
                self.evictions += 1
                log.debug("unloaded SubNet %s (memory budget %.2f MB)", name, budget)

    def _make_current(self, entry: SubNetEntry, budget: float | None) -> float:
        t0 = time.perf_counter()
        if entry.name not in self._sessions:
            old = {self._current.name} if self._current else set()
            self._evict(None if budget is None else budget - entry.memory_mb, keep=old)
            session = loader_for(entry.format).load(self.bundle.path(entry), entry, self.threads)
            try:
                session.run(np.zeros((1, *entry.input_shape[1:]), dtype=np.float32))
            except Exception as exc:
                raise ServingError(f"SubNet {entry.name!r} ({self.bundle.path(entry)}) fails on zeros of shape "
                                   f"{(1, *entry.input_shape[1:])}: {exc}") from exc
            self._calibrate(entry, session)
            self._sessions[entry.name] = session
            self.loads += 1
        self._sessions.move_to_end(entry.name)
        self._evict(budget, keep={entry.name})
        previous, self._current = self._current, entry
        self._recent.clear()
        ms = (time.perf_counter() - t0) * 1000
        self.switch_ms.append(ms)
        if previous is not None:
            self.switches += 1
            log.info("switched %s -> %s in %.2f ms", previous.name, entry.name, ms)
        return ms

    def _fit(self, x: np.ndarray, entry: SubNetEntry) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        want = entry.input_shape
        if x.ndim != len(want) or (len(want) == 4 and x.shape[1] != want[1]) or (len(want) != 4 and x.shape[1:] != want[1:]):
            raise ServingError(f"input of shape {x.shape} does not fit SubNet {entry.name!r}, which takes {want} "
                               "(any batch size; images of any height and width are resized)")
        if len(want) == 4 and x.shape[2:] != want[2:]:
            if not self.resize:
                raise ServingError(f"input of {x.shape[2]}x{x.shape[3]} pixels for SubNet {entry.name!r}, which takes "
                                   f"{want[2]}x{want[3]}; resize it or make the Runtime with resize=True")
            x = resize_bilinear(x, want[2:])
        return x

    # ---- serving
    def infer(self, x: np.ndarray) -> np.ndarray:
        """Run ``x`` through the SubNet the policy chooses now; return its first output."""
        with self._lock:
            reading = self.monitor.sample()
            now = self._now()
            budget = self.budget_mb(reading)
            in_place = self._in_place
            fitting = [in_place[s.name] for s in self.subnets if budget is None or s.memory_mb <= budget]
            candidates = tuple(fitting) or (in_place[min(self.subnets, key=lambda s: s.memory_mb).name],)
            current = in_place[self._current.name] if self._current is not None else None
            state = PolicyState(now, current, now - self._switched_at, tuple(self._recent),
                                self.monitor.forecast.state(), reading, self._last_violation)
            chosen = self.policy.choose(candidates, Goal(self.slo_ms, budget), state)
            name = getattr(chosen, "name", chosen)
            if name not in {s.name for s in candidates}:
                raise PolicyError(f"policy {self.policy.name!r} chose {name!r}, which is not "
                                  f"one of the SubNets it was given ({[s.name for s in candidates]})")
            choice = self.bundle[name]
            switch_ms = None
            if current is None or name != current.name:
                switch_ms = self._make_current(choice, budget)
                self._switched_at = self._now()
            xs = self._fit(x, choice)
            session = self._sessions[choice.name]
            t0 = time.perf_counter()
            try:
                y = session.run(xs)
            except Exception as exc:
                raise ServingError(f"SubNet {choice.name!r} failed on an input of shape {xs.shape}: {exc}") from exc
            t1 = time.perf_counter()
            latency = (t1 - t0) * 1000
            slowdown = self.monitor.observe(self._in_place[name], latency)
            self._recent.append(latency)
            end = self._wall0 + (t1 - self._perf0)
            if latency > self.slo_ms:
                self._last_violation = end
            f = self.monitor.forecast
            record = InferenceRecord(self._wall0 + (t0 - self._perf0), end, choice.name, latency, slowdown,
                                     f.mean, f.upper, switch_ms, reading)
            self._records.append(record)
            self.policy.observe(record)
            return y

    # ---- results
    def stats(self) -> dict[str, Any]:
        """A summary of the inferences served so far."""
        recs = list(self._records)
        lat = sorted(r.latency_ms for r in recs)
        per: dict[str, int] = {}
        for r in recs:
            per[r.subnet] = per.get(r.subnet, 0) + 1
        overhead = self.monitor.overhead
        fc = self.monitor.forecast.state()

        def pct(q: float) -> float | None:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None

        return {
            "inferences": len(recs), "per_subnet": per, "switches": self.switches, "loads": self.loads,
            "evictions": self.evictions,
            "switch_ms": {"median": statistics.median(self.switch_ms) if self.switch_ms else None,
                          "max": max(self.switch_ms, default=None)},
            "latency_ms": {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99)},
            "slo_ms": self.slo_ms, "slo_met": sum(v <= self.slo_ms for v in lat) / len(lat) if lat else None,
            "accuracy": statistics.fmean(self.bundle[r.subnet].accuracy for r in recs) if recs else None,
            "monitor": {"cpu_s": overhead.cpu_s, "share": overhead.share, "samples": overhead.samples},
            "forecast": {"mae": fc.mae, "coverage": fc.coverage},
            "idle_ms": self.idle_ms,
        }

    def write_records(self, path: str | Path) -> Path:
        """The inference records as JSON lines (atomically)."""
        with atomic_write(path) as tmp:
            with open(tmp, "w") as f:
                for r in self._records:
                    f.write(json.dumps(asdict(r)) + "\n")
        return Path(path)

    def close(self) -> None:
        for s in self._sessions.values():
            s.close()
        self._sessions.clear()
        self._current = None

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
