"""What the device has left for us, and how fast our own inferences run.

A :class:`Monitor` reads, at most every ``interval_ms`` (a cached :class:`Reading` otherwise;
the figures marked *slow* at most every ``slow_interval_ms``, since they change slowly and cost
most of a sample: the cgroup files lie along a path of folders):

- CPU: the CPUs this process may use (affinity, slow), the cgroup's CPU quota in cores (slow; v2
  ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``; None when unlimited), the cores
  other processes kept busy since the last sample, over at least 50 ms (the counters tick
  every 10 ms; ``/proc/stat`` less this process's own CPU time; psutil where there is no
  ``/proc``), what that leaves of the CPUs and quota, and the CPU pressure (PSI
  ``/proc/pressure/cpu``, "some avg10");
- memory: ``MemAvailable`` of ``/proc/meminfo``, capped by the cgroup's memory limit less its
  usage (slow);
- the CPU frequency and temperature where ``/sys`` exposes them (slow; ``cpufreq/scaling_cur_freq``,
  ``thermal_zone*/temp``, ``hwmon*/temp*_input``).

A figure the system does not expose is None, never a guess. The most direct signal, though,
is the latency of our own inferences: :meth:`Monitor.observe` turns each into a slowdown (the
observed latency over the SubNet's ``latency_ms``, which the runtime sets to its idle latency in
place) and feeds the
:class:`~autotailor.runtime.forecast.SlowdownForecast`. The monitor counts its own CPU time
(``overhead``), so that its cost is a figure too.

``proc`` and ``sys`` default to ``/proc`` and ``/sys``; another root reads the same files there.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotailor.runtime.forecast import SlowdownForecast

if TYPE_CHECKING:
    from autotailor.runtime.bundle import SubNetEntry

log = logging.getLogger(__name__)

_MIN_SPAN_S = 0.05  # the shortest span of /proc/stat counters the CPU figures are taken over, per CPU
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a page-aligned LONG_MAX


@dataclass(frozen=True)
class Reading:
    """One sample of the device. None: the system does not expose the figure."""

    time: float  # time.time() of the sample
    cpu_count: int  # CPUs this process may run on
    cpu_quota: float | None  # the cgroup's CPU quota in cores (None: no quota)
    cpu_others: float | None  # cores other processes kept busy since the previous sample
    cpu_available: float | None  # min(cpu_count, cpu_quota) - cpu_others, at least 0
    cpu_pressure: float | None  # % of the last 10 s some runnable task waited for a CPU (PSI)
    mem_available_mb: float | None
    cpu_freq_mhz: float | None  # mean over the CPUs
    temperature_c: float | None  # the hottest sensor


@dataclass(frozen=True)
class _Slow:
    """The figures read every ``slow_interval_ms``."""

    time: float
    cpu_count: int
    cpu_quota: float | None
    memory_left_mb: float | None
    cpu_freq_mhz: float | None
    temperature_c: float | None


@dataclass(frozen=True)
class Overhead:
    """What the monitor itself cost: CPU seconds in ``sample``/``observe`` and their share of wall time."""

    cpu_s: float
    wall_s: float
    samples: int

    @property
    def share(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


def _read(path: Path | str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def cpu_quota_v2(folder: Path) -> float | None:
    """Cores allowed by ``folder/cpu.max`` ("max 100000" or "50000 100000"); None: unlimited or absent."""
    text = _read(folder / "cpu.max")
    if text is None:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return int(parts[0]) / int(parts[1])
    except (ValueError, ZeroDivisionError):
        return None


def cpu_quota_v1(folder: Path) -> float | None:
    """Cores allowed by ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: unlimited -> None)."""
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def memory_left_mb(folder: Path, version: int) -> float | None:
    """The cgroup's memory limit less its usage, in MB; None: no limit or absent."""
    names = ("memory.max", "memory.current") if version == 2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    limit, usage = (_read(folder / n) for n in names)
    try:
        lim, use = int(limit or ""), int(usage or "")
    except ValueError:  # v2 writes "max" for no limit
        return None
    return max(0.0, (lim - use) / 2**20) if lim < _NO_LIMIT else None


class _Cgroups:
    """The folders of this process's cgroups, from ``/proc/self/mountinfo`` and ``/proc/self/cgroup``;
    a quota is the smallest along the path up to the hierarchy's mount point."""

    def __init__(self, proc: Path, sys_root: Path):
        self.cpu: list[tuple[Path, int]] = []  # (folder, version), innermost first
        self.memory: list[tuple[Path, int]] = []
        mounts: dict[str, tuple[str, str, int]] = {}  # controller -> (root in hierarchy, mount point, version)
        for line in (_read(proc / "self/mountinfo") or "").splitlines():
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
                continue
            point = fields[4]
            if not point.startswith("/sys/"):
                continue
            point = str(sys_root / point[len("/sys/"):])
            if rest[0] == "cgroup2":
                mounts.setdefault("", (fields[3], point, 2))
            else:
                for opt in rest[2].split(","):
                    if opt in ("cpu", "memory"):
                        mounts[opt] = (fields[3], point, 1)
        paths: dict[str, str] = {}  # controller ("" for v2) -> path
        for line in (_read(proc / "self/cgroup") or "").splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                for c in parts[1].split(",") if parts[1] else [""]:
                    paths[c] = parts[2]
        for ctl, out in (("cpu", self.cpu), ("memory", self.memory)):
            key = ctl if ctl in mounts and ctl in paths else ""
            if key not in mounts or key not in paths:
                continue
            root, point, version = mounts[key]
            if version == 2 and not Path(point, "cgroup.controllers").is_file():
                continue
            path = paths[key]
            rel = path[len(root):] if root != "/" and path.startswith(root) else path
            folder = Path(point, rel.lstrip("/"))
            if not folder.is_dir():
                folder = Path(point)
            while True:
                out.append((folder, version))
                if folder == Path(point) or folder.parent == folder:
                    break
                folder = folder.parent

    def cpu_quota(self) -> float | None:
        quotas = [q for folder, v in self.cpu
                  if (q := cpu_quota_v2(folder) if v == 2 else cpu_quota_v1(folder)) is not None]
        return min(quotas) if quotas else None

    def memory_left_mb(self) -> float | None:
        left = [m for folder, v in self.memory if (m := memory_left_mb(folder, v)) is not None]
        return min(left) if left else None


class Monitor:
    """Samples the device (see the module docstring) and keeps the observed slowdowns."""

    def __init__(self, interval_ms: float = 250.0, forecast: SlowdownForecast | None = None,
                 proc: str | Path = "/proc", sys: str | Path = "/sys", slow_interval_ms: float = 1000.0):
        self.interval_s, self.slow_interval_s = interval_ms / 1000, slow_interval_ms / 1000
        self.forecast = forecast or SlowdownForecast()
        self.proc, self.sys = Path(proc), Path(sys)
        self._cgroups = _Cgroups(self.proc, self.sys)
        self._freq_files = sorted(glob.glob(str(self.sys / "devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")))
        self._temp_files = sorted(glob.glob(str(self.sys / "class/thermal/thermal_zone*/temp"))
                                  + glob.glob(str(self.sys / "class/hwmon/hwmon*/temp*_input")))
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._psutil = None
        if not (self.proc / "stat").is_file():
            try:
                import psutil

                self._psutil = psutil
            except ImportError:
                log.info("no %s and no psutil: CPU availability is not measured", self.proc / "stat")
        self._cpu_prev = self._cpu_times()
        self._reading: Reading | None = None
        self._slow: _Slow | None = None
        self._cpu_s = 0.0
        self._samples = 0
        self._born = time.perf_counter()

    # ---- CPU time counters
    def _cpu_times(self) -> tuple[float, float, float, int] | None:
        """(all CPUs' busy seconds, all CPUs' total seconds, this process's CPU seconds, CPUs)."""
        if self._psutil is not None:
            t = self._psutil.cpu_times()
            idle = t.idle + getattr(t, "iowait", 0.0)
            total = sum(v for k, v in t._asdict().items() if k not in ("guest", "guest_nice"))
            own = self._psutil.Process().cpu_times()
            return total - idle, total, own.user + own.system, self._psutil.cpu_count() or 1
        text = _read(self.proc / "stat")
        if text is None:
            return None
        lines = text.splitlines()
        try:
            # user nice system idle iowait irq softirq steal guest guest_nice; guest time is inside user
            v = [int(x) for x in lines[0].split()[1:]]
            total = sum(v[:8])
            busy = total - v[3] - (v[4] if len(v) > 4 else 0)
            ncpu = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
        except (IndexError, ValueError):
            return None
        return busy / self._ticks, total / self._ticks, time.process_time(), max(1, ncpu)

    def _meminfo_mb(self) -> float | None:
        for line in (_read(self.proc / "meminfo") or "").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
        if self._psutil is not None:
            return self._psutil.virtual_memory().available / 2**20
        return None

    def _pressure(self) -> float | None:
        for line in (_read(self.proc / "pressure/cpu") or "").splitlines():
            if line.startswith("some"):
                for item in line.split()[1:]:
                    if item.startswith("avg10="):
                        return float(item[6:])
        return None

    def _slow_figures(self, now: float) -> "_Slow":
        if self._slow is not None and now - self._slow.time < self.slow_interval_s:
            return self._slow
        try:
            cpu_count = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpu_count = os.cpu_count() or 1
        self._slow = _Slow(now, cpu_count, self._cgroups.cpu_quota(), self._cgroups.memory_left_mb(),
                           self._mean_of(self._freq_files, 1000.0, lambda v: sum(v) / len(v)),
                           self._mean_of(self._temp_files, 1000.0, max))
        return self._slow

    def _mean_of(self, files: list[str], scale: float, reduce) -> float | None:
        values = []
        for f in files:
            text = _read(f)
            try:
                values.append(int(text) / scale)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                continue
        return reduce(values) if values else None

    # ---- public
    @property
    def reading(self) -> Reading | None:
        """The last sample (None before the first)."""
        return self._reading

    def sample(self, force: bool = False) -> Reading:
        """A reading of the device, taken now if the last is older than ``interval_ms`` (or ``force``:
        then the slow figures too)."""
        now = time.time()
        if not force and self._reading is not None and now - self._reading.time < self.interval_s:
            return self._reading
        c0 = time.thread_time()
        if force:
            self._slow = None
        slow = self._slow_figures(now)
        cpu_count, quota = slow.cpu_count, slow.cpu_quota
        last = self._reading
        others, available = (last.cpu_others, last.cpu_available) if last is not None else (None, None)
        cur = self._cpu_times()
        # /proc/stat counts in ticks (10 ms): over a shorter span the busy share is mostly rounding,
        # so the last figures stand until the counters have moved by _MIN_SPAN_S per CPU
        if cur is not None and self._cpu_prev is not None and cur[1] - self._cpu_prev[1] >= _MIN_SPAN_S * cur[3]:
            busy, total, own = (a - b for a, b in zip(cur[:3], self._cpu_prev[:3]))
            # /proc/stat's total is the sum over all CPUs: busy/total is the busy share of all of them
            others = max(0.0, (busy - own) / total * cur[3])
            limit = min(cpu_count, quota) if quota is not None else cpu_count
            available = max(0.0, limit - others)
            self._cpu_prev = cur
        elif cur is not None and self._cpu_prev is None:
            self._cpu_prev = cur
        mem = self._meminfo_mb()
        if slow.memory_left_mb is not None:
            mem = slow.memory_left_mb if mem is None else min(mem, slow.memory_left_mb)
        self._reading = Reading(
            time=now, cpu_count=cpu_count, cpu_quota=quota, cpu_others=others, cpu_available=available,
            cpu_pressure=self._pressure(), mem_available_mb=mem, cpu_freq_mhz=slow.cpu_freq_mhz,
            temperature_c=slow.temperature_c)
        self._samples += 1
        self._cpu_s += time.thread_time() - c0
        return self._reading

    def observe(self, entry: "SubNetEntry", latency_ms: float) -> float:
        """Record one inference of ``entry`` that took ``latency_ms``; return its slowdown."""
        c0 = time.thread_time()
        slowdown = latency_ms / entry.latency_ms
        self.forecast.update(slowdown, entry.latency_ms)
        self._cpu_s += time.thread_time() - c0
        return slowdown

    @property
    def overhead(self) -> Overhead:
        return Overhead(self._cpu_s, time.perf_counter() - self._born, self._samples)
