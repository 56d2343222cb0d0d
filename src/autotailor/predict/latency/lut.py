"""The latency lookup table: one SQLite file of measured kernels per project or device.

Entries are keyed by the target (device name, backend, backend settings such as the thread
count) and the kernel's signature (a canonical string of its features; the enumeration
defines it). Each measurement is committed as soon as it is made, so an interrupted
profiling run loses nothing and a second run measures only what is ``missing``. A LUT can be
exported to a JSON file and imported elsewhere: profile on the device, search on a laptop.

An entry may carry the time a fixed reference kernel took around it (``reference_ms``, the
paired design of ``profile``): the machine's speed at that moment. ``speed`` summarises a
target's readings, and ``Measurement.at_speed`` brings an entry to their median.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from autotailor.errors import AutoTailorError
from autotailor.files import write_text

_SCHEMA = """
CREATE TABLE IF NOT EXISTS targets (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL,
    backend TEXT NOT NULL,
    settings TEXT NOT NULL,
    UNIQUE (device, backend, settings)
);
CREATE TABLE IF NOT EXISTS entries (
    target INTEGER NOT NULL REFERENCES targets(id),
    kernel TEXT NOT NULL,
    median_ms REAL NOT NULL,
    mad_ms REAL NOT NULL,
    repeats INTEGER NOT NULL,
    measured_at REAL NOT NULL,
    reference_ms REAL,
    PRIMARY KEY (target, kernel)
);
"""
_COLUMNS = "kernel, median_ms, mad_ms, repeats, measured_at, reference_ms"
_FORMAT = "autotailor-lut/1"


@dataclass(frozen=True)
class Target:
    """Where latency is measured: ``device`` (a name for the machine), ``backend`` (ort-cpu,
    ncnn, torch, ...) and its ``settings`` (e.g. ``{"threads": 1}``), which are part of the key."""

    device: str
    backend: str
    settings: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, device: str, backend: str, **settings: object) -> "Target":
        return cls(device, backend, tuple(sorted(settings.items())))

    @property
    def settings_key(self) -> str:
        return json.dumps(dict(self.settings), sort_keys=True)

    def __str__(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in self.settings)
        return f"{self.device}/{self.backend}" + (f":{opts}" if opts else "")


@dataclass(frozen=True)
class Measurement:
    """A robust summary of repeated timings of one kernel (milliseconds)."""

    median_ms: float
    mad_ms: float  # median absolute deviation: the spread, insensitive to outliers
    repeats: int
    measured_at: float = 0.0
    reference_ms: float | None = None  # the reference kernel's time around this measurement

    def at_speed(self, reference_ms: float | None) -> float:
        """The median (ms) as if measured when the reference kernel took ``reference_ms``
        (unchanged when either reading is missing)."""
        if reference_ms is None or not self.reference_ms:
            return self.median_ms
        return self.median_ms * reference_ms / self.reference_ms


@dataclass(frozen=True)
class Speed:
    """The reference kernel's readings over a target's entries: their median (``at_speed``
    brings entries to it) and how much the machine's speed moved while they were measured."""

    median_ms: float
    low: float  # the 10th percentile / median
    high: float  # the 90th percentile / median
    readings: int  # entries with a reading (several entries share one)

    @property
    def noise(self) -> float:
        """Half the relative 10-90 % range of the readings (0.05: the machine's speed moved ±5 %)."""
        return (self.high - self.low) / 2

    def describe(self) -> str:
        return (f"noise ±{100 * self.noise:.1f} %: the reference kernel took {self.median_ms:.3f} ms (median over "
                f"{self.readings} entries), 10-90 % of them {100 * (self.low - 1):+.1f} % to "
                f"{100 * (self.high - 1):+.1f} %")


class LutStore:
    """A SQLite lookup table of kernel latencies (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path)
            self._db.execute("PRAGMA journal_mode=WAL")  # readers do not block a profiling writer
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(entries)")}
            if "reference_ms" not in columns:  # a table from before the paired design
                with self._db:
                    self._db.execute("ALTER TABLE entries ADD COLUMN reference_ms REAL")
        except sqlite3.DatabaseError as exc:
            raise AutoTailorError(f"{self.path} is not a latency table (SQLite: {exc}); move it aside "
                                  f"(mv {self.path} {self.path}.bad) and profile again to measure a new one") from exc

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "LutStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _target_id(self, target: Target, create: bool) -> int | None:
        row = self._db.execute(
            "SELECT id FROM targets WHERE device=? AND backend=? AND settings=?",
            (target.device, target.backend, target.settings_key),
        ).fetchone()
        if row is not None or not create:
            return row[0] if row else None
        with self._db:
            cur = self._db.execute(
                "INSERT INTO targets (device, backend, settings) VALUES (?, ?, ?)",
                (target.device, target.backend, target.settings_key),
            )
        return int(cur.lastrowid)

    def targets(self) -> list[Target]:
        rows = self._db.execute("SELECT device, backend, settings FROM targets ORDER BY id").fetchall()
        return [Target(d, b, tuple(sorted(json.loads(s).items()))) for d, b, s in rows]

    def put(self, target: Target, kernel: str, m: Measurement) -> None:
        """Store (or replace) one measurement, committed at once."""
        tid = self._target_id(target, create=True)
        with self._db:
            self._db.execute(
                f"INSERT OR REPLACE INTO entries (target, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (tid, kernel, m.median_ms, m.mad_ms, m.repeats, m.measured_at or time.time(), m.reference_ms),
            )

    def get(self, target: Target, kernels: Iterable[str]) -> dict[str, Measurement]:
        """The stored measurements among ``kernels``."""
        tid = self._target_id(target, create=False)
        if tid is None:
            return {}
        wanted = list(dict.fromkeys(kernels))
        found: dict[str, Measurement] = {}
        for start in range(0, len(wanted), 500):  # SQLite limits the number of parameters
            chunk = wanted[start : start + 500]
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE target=? AND kernel IN ({','.join('?' * len(chunk))})",
                (tid, *chunk),
            )
            found.update({k: Measurement(*rest) for k, *rest in rows})
        return found

    def with_prefix(self, target: Target, prefix: str) -> dict[str, Measurement]:
        """The stored measurements whose key starts with ``prefix`` (e.g. every whole SubNet)."""
        tid = self._target_id(target, create=False)
        if tid is None:
            return {}
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM entries WHERE target=? AND substr(kernel, 1, ?) = ?",
                                (tid, len(prefix), prefix))
        return {k: Measurement(*rest) for k, *rest in rows}

    def missing(self, target: Target, kernels: Iterable[str]) -> list[str]:
        """The kernels not yet measured on ``target``, in the order given."""
        wanted = list(dict.fromkeys(kernels))
        have = self.get(target, wanted)
        return [k for k in wanted if k not in have]

    def speed(self, target: Target) -> Speed | None:
        """The reference readings of ``target``'s entries (None when none has one)."""
        import numpy as np

        tid = self._target_id(target, create=False)
        rows = [] if tid is None else self._db.execute(
            "SELECT reference_ms FROM entries WHERE target=? AND reference_ms > 0", (tid,)).fetchall()
        if not rows:
            return None
        readings = np.array([r[0] for r in rows])
        median = float(np.median(readings))
        low, high = np.percentile(readings, [10, 90]) / median
        return Speed(median, float(low), float(high), len(readings))

    def count(self, target: Target) -> int:
        tid = self._target_id(target, create=False)
        if tid is None:
            return 0
        return int(self._db.execute("SELECT COUNT(*) FROM entries WHERE target=?", (tid,)).fetchone()[0])

    # -- exchange --------------------------------------------------------------------------------
    def export(self, path: str | Path, target: Target | None = None) -> int:
        """Write the entries of ``target`` (default: all targets) to a JSON file; returns how many."""
        targets = [target] if target is not None else self.targets()
        data = {"format": _FORMAT, "targets": []}
        n = 0
        for t in targets:
            tid = self._target_id(t, create=False)
            rows = self._db.execute(
                f"SELECT {_COLUMNS} FROM entries WHERE target=? ORDER BY kernel",
                (tid,),
            ).fetchall() if tid is not None else []
            entries = {k: asdict(Measurement(*rest)) for k, *rest in rows}
            n += len(entries)
            data["targets"].append({"device": t.device, "backend": t.backend, "settings": dict(t.settings),
                                    "entries": entries})
        write_text(path, json.dumps(data))
        return n

    def import_(self, path: str | Path) -> int:
        """Merge a file written by ``export``; newer measurements win. Returns entries taken."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise AutoTailorError(f"cannot read latency table export {path}: {exc}") from exc
        if data.get("format") != _FORMAT:
            raise AutoTailorError(f"{path} is not a latency table export ({_FORMAT})")
        taken = 0
        for t in data["targets"]:
            target = Target.of(t["device"], t["backend"], **t["settings"])
            have = self.get(target, t["entries"])
            for kernel, m in t["entries"].items():
                m = Measurement(**m)
                if kernel not in have or have[kernel].measured_at < m.measured_at:
                    self.put(target, kernel, m)
                    taken += 1
        return taken
