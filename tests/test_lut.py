"""The latency LUT store: keyed by target, committed per entry, exchangeable as a file."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import autotailor as at
from autotailor.predict.latency import LutStore, Measurement, Target

ORT1 = Target.of("this-machine", "ort-cpu", threads=1)
ORT2 = Target.of("this-machine", "ort-cpu", threads=2)


def test_entries_are_keyed_by_target_and_settings(tmp_path) -> None:
    with LutStore(tmp_path / "lut.db") as lut:
        lut.put(ORT1, "conv:3x3:64", Measurement(1.25, 0.02, 30, 100.0))
        lut.put(ORT2, "conv:3x3:64", Measurement(0.70, 0.01, 30, 100.0))
        assert lut.get(ORT1, ["conv:3x3:64", "relu"]) == {"conv:3x3:64": Measurement(1.25, 0.02, 30, 100.0)}
        assert lut.get(ORT2, ["conv:3x3:64"])["conv:3x3:64"].median_ms == 0.70
        assert lut.missing(ORT1, ["relu", "conv:3x3:64", "relu", "add"]) == ["relu", "add"]
        assert lut.targets() == [ORT1, ORT2] and str(ORT1) == "this-machine/ort-cpu:threads=1"
        many = [f"k{i}" for i in range(1200)]  # more than one SQLite parameter batch
        for k in many[:700]:
            lut.put(ORT1, k, Measurement(0.1, 0.0, 5))
        assert len(lut.missing(ORT1, many)) == 500


def test_a_killed_writer_loses_nothing_it_committed(tmp_path) -> None:
    db = tmp_path / "lut.db"
    code = textwrap.dedent(f"""
        import os
        from autotailor.predict.latency import LutStore, Measurement, Target
        lut = LutStore({str(db)!r})
        t = Target.of("dev", "ort-cpu", threads=1)
        for i in range(5):
            lut.put(t, f"k{{i}}", Measurement(float(i), 0.0, 3))
        os._exit(9)  # killed: no close, no cleanup
    """)
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    with LutStore(db) as lut:
        t = Target.of("dev", "ort-cpu", threads=1)
        assert lut.count(t) == 5
        assert lut.missing(t, [f"k{i}" for i in range(8)]) == ["k5", "k6", "k7"]


def test_export_and_import_move_a_table_between_machines(tmp_path) -> None:
    with LutStore(tmp_path / "device.db") as lut:
        lut.put(ORT1, "a", Measurement(1.0, 0.1, 10, 200.0))
        lut.put(ORT1, "b", Measurement(2.0, 0.1, 10, 200.0, reference_ms=0.5))
        assert lut.export(tmp_path / "lut.json") == 2
    with LutStore(tmp_path / "laptop.db") as other:
        other.put(ORT1, "a", Measurement(9.0, 0.1, 10, 300.0))  # newer than the export's: kept
        assert other.import_(tmp_path / "lut.json") == 1
        got = other.get(ORT1, ["a", "b"])
        assert got["a"].median_ms == 9.0 and got["b"].median_ms == 2.0
        assert got["b"].reference_ms == 0.5 and other.speed(ORT1).median_ms == 0.5  # the reading travels with it
        (tmp_path / "x.json").write_text("{}")
        with pytest.raises(at.AutoTailorError, match="is not a latency table export"):
            other.import_(tmp_path / "x.json")


def test_a_file_that_is_not_a_table_is_refused(tmp_path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(at.AutoTailorError, match="is not a latency table"):
        LutStore(bad)


def test_a_table_from_before_the_reference_readings_opens_and_reads_as_measured(tmp_path) -> None:
    import sqlite3

    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:
        db.executescript("""
            CREATE TABLE targets (id INTEGER PRIMARY KEY, device TEXT NOT NULL, backend TEXT NOT NULL,
                                  settings TEXT NOT NULL, UNIQUE (device, backend, settings));
            CREATE TABLE entries (target INTEGER NOT NULL REFERENCES targets(id), kernel TEXT NOT NULL,
                                  median_ms REAL NOT NULL, mad_ms REAL NOT NULL, repeats INTEGER NOT NULL,
                                  measured_at REAL NOT NULL, PRIMARY KEY (target, kernel));
            INSERT INTO targets VALUES (1, 'this-machine', 'ort-cpu', '{"threads": 1}');
            INSERT INTO entries VALUES (1, 'a', 1.5, 0.1, 10, 200.0);""")
    db.close()
    with LutStore(old) as lut:
        a = lut.get(ORT1, ["a"])["a"]
        assert (a.median_ms, a.reference_ms, a.at_speed(0.3)) == (1.5, None, 1.5)
        assert lut.speed(ORT1) is None
        lut.put(ORT1, "b", Measurement(2.0, 0.1, 10, 300.0, reference_ms=0.4))
        lut.put(ORT1, "c", Measurement(4.0, 0.1, 10, 300.0, reference_ms=0.8))
        assert lut.get(ORT1, ["c"])["c"].at_speed(0.4) == pytest.approx(2.0)
        speed = lut.speed(ORT1)
        assert (speed.median_ms, speed.readings) == (pytest.approx(0.6), 2)
        assert speed.noise == pytest.approx((0.76 - 0.44) / 0.6 / 2)  # the 10-90 % range of 0.4 and 0.8
