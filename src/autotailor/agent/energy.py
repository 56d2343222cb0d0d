"""Energy meters a device exposes, read by the agent around a model's runs.

A meter is found by a registered finder (``@finder(NAME)``) that looks at the system's files
and returns the meters it found, or says why there are none. Two kinds:

* ``rapl``: Linux powercap (Intel RAPL and AMD's RAPL-compatible zones), cumulative energy
  counters per package (``/sys/class/powercap/*/energy_uj``), read before and after, with
  the counter's wrap-around (``max_energy_range_uj``);
* ``hwmon``: power sensors of Linux's hwmon class (``/sys/class/hwmon/*/power*_input`` in
  microwatts: many ARM boards, and Jetson's INA3221 rails on recent kernels), sampled every
  ``interval_s`` on a thread and integrated.

Nothing is estimated: where no meter is readable the answer says so and why (none found, or
found but not readable: since 2020 Linux lets only root read RAPL counters). The figures are
the meter's whole domain (a CPU package, a board rail), other processes included.

Adding a source (a phone's battery counters) is one more ``@finder`` function.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

_FINDERS: dict[str, Callable[[Path], "list[Meter] | str"]] = {}


def finder(name: str) -> Callable[[Callable[[Path], "list[Meter] | str"]], Callable[[Path], "list[Meter] | str"]]:
    """Register a function ``root -> meters found, or why none`` (``root``: the file system's root)."""

    def deco(fn: Callable[[Path], "list[Meter] | str"]) -> Callable[[Path], "list[Meter] | str"]:
        _FINDERS[name] = fn
        return fn

    return deco


class Meter:
    """``start()``, then ``stop()`` gives the joules used since."""

    name: str

    def start(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def stop(self) -> float:  # pragma: no cover - interface
        raise NotImplementedError


def _read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


@dataclass
class CounterMeter(Meter):
    """A cumulative energy counter in microjoules that wraps at ``max_uj``."""

    name: str
    path: Path
    max_uj: int
    _start: int = 0

    def start(self) -> None:
        self._start = _read_int(self.path)

    def stop(self) -> float:
        delta = _read_int(self.path) - self._start
        return (delta + self.max_uj if delta < 0 else delta) / 1e6


@dataclass
class SampledMeter(Meter):
    """A power sensor in microwatts, sampled every ``interval_s`` and integrated (trapezoids)."""

    name: str
    path: Path
    interval_s: float = 0.01
    _thread: threading.Thread | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _joules: float = 0.0

    def _sample(self) -> None:
        last_t, last_w = time.perf_counter(), _read_int(self.path) / 1e6
        while not self._stop.wait(self.interval_s):
            t, w = time.perf_counter(), _read_int(self.path) / 1e6
            self._joules += (t - last_t) * (w + last_w) / 2
            last_t, last_w = t, w
        t, w = time.perf_counter(), _read_int(self.path) / 1e6
        self._joules += (t - last_t) * (w + last_w) / 2

    def start(self) -> None:
        self._joules = 0.0
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        assert self._thread is not None
        self._stop.set()
        self._thread.join()
        return self._joules


def _readable(paths: list[Path]) -> tuple[list[Path], list[str]]:
    ok, refused = [], []
    for p in paths:
        try:
            _read_int(p)
            ok.append(p)
        except PermissionError:
            refused.append(str(p))
        except (OSError, ValueError, IndexError):
            continue
    return ok, refused


@finder("rapl")
def _rapl(root: Path) -> "list[Meter] | str":
    base = root / "sys/class/powercap"
    # top-level zones only (intel-rapl:0, not intel-rapl:0:0): a package already counts its cores
    zones = sorted(z for z in base.glob("*rapl:*") if z.name.count(":") == 1) if base.is_dir() else []
    if not zones:
        return f"no RAPL zone in {base}"
    ok, refused = _readable([z / "energy_uj" for z in zones])
    if not ok:
        return (f"RAPL counters {', '.join(refused)} are not readable by this user (Linux lets only root read "
                "them): run the agent as root or grant read access") if refused else f"no readable RAPL counter in {base}"
    meters: list[Meter] = []
    for path in ok:
        zone = path.parent
        try:
            label = (zone / "name").read_text().strip()
        except OSError:
            label = zone.name
        max_uj = _read_int(zone / "max_energy_range_uj") if (zone / "max_energy_range_uj").is_file() else 2**32
        meters.append(CounterMeter(f"rapl:{zone.name}:{label}", path, max_uj))
    return meters


@finder("hwmon")
def _hwmon(root: Path) -> "list[Meter] | str":
    base = root / "sys/class/hwmon"
    sensors = sorted(base.glob("hwmon*/power*_input")) if base.is_dir() else []
    if not sensors:
        return f"no hwmon power sensor in {base}"
    ok, refused = _readable(sensors)
    if not ok:
        return f"hwmon power sensors {', '.join(refused)} are not readable by this user"
    meters: list[Meter] = []
    for path in ok:
        try:
            label = (path.parent / "name").read_text().strip()
        except OSError:
            label = path.parent.name
        meters.append(SampledMeter(f"hwmon:{path.parent.name}:{label}:{path.name}", path))
    return meters


def find_meters(root: str | Path = "/") -> tuple[list[Meter], list[str]]:
    """The readable meters of the system at ``root``, and, per source without one, why not."""
    meters: list[Meter] = []
    reasons: list[str] = []
    for name, fn in _FINDERS.items():
        found = fn(Path(root))
        if isinstance(found, str):
            reasons.append(f"{name}: {found}")
        else:
            meters += found
    return meters, reasons


def measure_energy(run: Callable[[], object], seconds: float, meters: list[Meter], reasons: list[str]) -> dict:
    """Run ``run`` again and again for ``seconds`` with every meter read around; or, with no
    meter, only say why (nothing is run then)."""
    if not meters:
        return {"available": False, "reason": "; ".join(reasons)}
    for m in meters:
        m.start()
    calls, t0 = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - t0 < seconds:
        run()
        calls += 1
    elapsed = time.perf_counter() - t0
    joules = {m.name: m.stop() for m in meters}
    return {"available": True, "seconds": round(elapsed, 4), "calls": calls,
            "sources": {name: {"joules": j, "joules_per_call": j / calls, "watts": j / elapsed}
                        for name, j in joules.items()},
            "scope": "each source's whole domain (a CPU package, a board rail), other processes included"}
