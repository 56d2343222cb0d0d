"""The work directory: where every step reads its inputs and writes its results.

```
WORK/supernet.pt        compile, train, tune     the SuperNet and its weights
WORK/original.pt        tune                     the SuperNet as the first tuning found it (the user's model)
WORK/config.json        compile                  the configuration: the space and the steps' tables
WORK/latency.sqlite     profile                  latency lookup tables, one per target
WORK/sensitivity.json   sensitivity              Δ of every single modification
WORK/search.json        search                   the SubNet chosen per budget, the Pareto front
WORK/export/NAME/       export                   deployable SubNets; WORK/exports.json their measurements
WORK/report.md, .png    report                   the run's report and plot
WORK/run.json           run                      which steps of `autotailor run` are done, and their times
WORK/devices/DEVICE/    run (a fleet)            one device's search.json, export/, exports.json and plot
```
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from autotailor.errors import AutoTailorError, WorkdirError
from autotailor.supernet import Arch

log = logging.getLogger(__name__)

CONFIG = "config.json"
SENSITIVITY = "sensitivity.json"
ORIGINAL = "original.pt"  # the weights the first tuning started from: the user's model, a choice for the top budgets
LUT = "latency.sqlite"
SPECIALIZED = "specialized"  # chosen SubNets fine-tuned alone (export.finetune_steps)
CALIBRATION_SECONDS = 30.0  # what a calibration's timings span at least (see ``DeviceSetup.calibrate``)
CALIBRATION_ROUNDS = 4


#: What the steps write into a work directory: ``compile --force`` deletes these and nothing else.
MADE_FILES = ("supernet.pt", ORIGINAL, "space.json", "compile.json", CONFIG, "train.ckpt", "tune.ckpt",
              "train.log.jsonl", "tune.log.jsonl", SENSITIVITY, "finalists.json", "search.json", "exports.json",
              "latency.sqlite", "latency.sqlite-wal", "latency.sqlite-shm", "report.md", "report.png", "run.json",
              "export", "devices", SPECIALIZED)
_LOCK = ".autotailor.lock"
DEVICES = "devices"


def slug(name: str) -> str:
    """``name`` as one file name (a budget label, a device spec)."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def device_folder(work: str | Path, spec: str) -> Path:
    """Where a fleet keeps device ``spec``'s results: ``WORK/devices/SLUG``."""
    return Path(work) / DEVICES / slug(spec)


def fleet_folders(work: str | Path) -> list[Path]:
    """The device folders of a fleet's work directory that hold a search (none: not a fleet)."""
    folder = Path(work) / DEVICES
    return sorted(f for f in folder.iterdir() if (f / "search.json").is_file()) if folder.is_dir() else []


@contextlib.contextmanager
def locked(work: str | Path, command: str) -> Iterator[None]:
    """Hold ``WORK``'s lock while the block runs: one writer per work directory. A second
    writer is refused at once with the holder's process id and command (the operating system
    releases the lock when a process ends, however it ends)."""
    work = Path(work)
    created = not work.exists()
    try:
        work.mkdir(parents=True, exist_ok=True)
        handle = open(work / _LOCK, "a+")
    except OSError as exc:
        raise WorkdirError(f"cannot write to the work directory {work}: {exc.strerror or exc}; choose a "
                           "writable directory") from exc
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise WorkdirError(f"{work} is in use by {holder}; wait for it to finish (or stop it) and run "
                               "again") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} ({command})")
        handle.flush()
        try:
            yield
        finally:  # no file left behind; a directory made for nothing goes too (a failed compile)
            (work / _LOCK).unlink(missing_ok=True)
            if created and not any(work.iterdir()):
                work.rmdir()


def weights_digest(work: str | Path) -> str:
    """A digest of ``WORK/supernet.pt``. Results measured on the SuperNet's weights record it and
    are stale once it changes (tuned, or compiled again)."""
    digest = hashlib.sha256()
    with open(Path(work) / "supernet.pt", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def load_supernet(work: str | Path):
    import autotailor as at

    path = Path(work) / "supernet.pt"
    if not path.is_file():
        raise AutoTailorError(f"{work} holds no supernet.pt; run `autotailor compile MODEL --out {work}` first")
    return at.load(path)


def load_original(work: str | Path):
    """The SuperNet with the weights its first tuning started from (``WORK/original.pt``), whose
    largest SubNet is the user's model as given; None if tuning did not keep them."""
    import autotailor as at

    path = Path(work) / ORIGINAL
    return at.load(path) if path.is_file() else None


def is_original_model(original, arch: Arch) -> bool:
    """Whether ``arch`` of ``original`` (``load_original``) is its largest SubNet: the user's model."""
    space = original.space
    return space.key(space.complete(arch)) == space.key(space.max())


def original_calibration(original, arch: Arch, calibration: list | None) -> list | None:
    """The batches a SubNet of ``original`` (``load_original``) is recalibrated on before it is
    measured or exported: none for the user's model, which keeps its own BatchNorm statistics;
    ``calibration`` for a smaller one, whose statistics are no longer the model's."""
    return None if is_original_model(original, arch) else calibration


@dataclass(frozen=True)
class EvalSettings:
    """The ``[sensitivity]`` table: how SubNets are evaluated (sensitivities, exports)."""

    validation_images: int = 2000  # a random sample of the validation split under `seed` (all of it if fewer)
    calibration_batches: int = 10
    batch_size: int = 128
    seed: int = 0


@dataclass
class EvalData:
    """A fixed validation subset and calibration batches, both at the SuperNet's largest resolution
    (each SubNet resizes them to its own)."""

    spec: str
    val: list[tuple[torch.Tensor, torch.Tensor]]
    calibration: list[tuple[torch.Tensor, torch.Tensor]]
    sample_seed: int | None = None  # the seed of the validation sample; None: the whole split

    @property
    def images(self) -> int:
        return sum(len(y) for _, y in self.val)

    def describe(self) -> dict[str, Any]:
        info = {"data": self.spec, "validation_images": self.images, "calibration_batches": len(self.calibration)}
        if self.sample_seed is not None:
            info["validation_sample_seed"] = self.sample_seed
        return info


def check_classes(sn, data, spec: str) -> None:
    """Refuse ``data`` (an ``ArrayDataset`` of ``spec``) with more classes than ``sn`` has outputs:
    its labels would index past the model's scores, and accuracies would mean nothing."""
    from autotailor.errors import DataError
    from autotailor.ir.shapes import run_meta

    outputs = run_meta(sn.net, torch.empty(sn.input_shape(), device="meta")).shape[-1]
    if len(data.classes) > outputs:
        raise DataError(f"{spec} has {len(data.classes)} classes but the model has {outputs} outputs; compile a "
                        f"model with at least {len(data.classes)} outputs (its classifier), or use data with at most "
                        f"{outputs} classes")


def eval_data(spec: str, resolution: int, settings: EvalSettings = EvalSettings(), sn=None) -> EvalData:
    """A random sample of ``validation_images`` of the validation split (under ``seed``) and
    ``calibration_batches`` augmented training batches, the same on every call with the same
    arguments; with ``sn``, data with more classes than it has outputs is refused."""

    from autotailor.data import BatchLoader, load_data

    s = settings
    train, val = load_data(spec, seed=s.seed)
    if sn is not None:
        check_classes(sn, train, spec)
    sampled = s.validation_images < len(val)
    val = val.sample(s.validation_images, s.seed)
    calib = BatchLoader(train, s.batch_size, train=True, resolution=resolution, seed=s.seed)
    return EvalData(spec, list(BatchLoader(val, s.batch_size, train=False, resolution=resolution)),
                    [calib.batch(0, i) for i in range(min(s.calibration_batches, len(calib)))],
                    s.seed if sampled else None)


@dataclass
class DeviceSetup:
    """A device spec resolved for a work directory: backend, kernel plan, LUT and target.

    A backend that flushes the caches before each kernel (ONNX Runtime by default) is also
    profiled without flushing (``hot_backend``, ``hot_target``): SubNets whose weights fit in
    the cache budget are predicted from those measurements (see ``CacheAwarePredictor``). The
    budget is ``cache_bytes`` when the spec sets ``cache_mb``; otherwise the ``CacheModel`` is
    fitted to a few whole SubNets measured by ``calibrate`` (``cache_bytes``, from the CPU's
    cache sizes, is the largest budget tried, and the budget when no calibration was measured).
    Every backend is calibrated so: the fit also finds what a kernel costs inside a model
    relative to alone (``CacheModel.in_model_ratio``; NCNN's kernels alone are slower).
    SubNets measured later (``measure``: a search's choices, verified) join the fit. Whole
    SubNets are stored under ``subnet_target``, the target qualified by the model: kernels are
    shared by every model profiled into one LUT, a SubNet's measurement only by its own model
    (two SuperNets may have the same variable names).
    """

    spec: str
    backend: Any
    plan: Any
    lut: Path
    target: Any
    hot_backend: Any = None
    hot_target: Any = None
    cache_bytes: int = 0
    cache_fixed: bool = False  # set by the spec's cache_mb: no calibration

    @functools.cached_property
    def subnet_target(self):
        """Where whole SubNets are stored: ``target`` qualified by a digest of what the SuperNet
        computes (its variables, and the kernels of its whole space for this backend)."""
        from autotailor.predict.latency import Target

        text = json.dumps([[repr(v) for v in self.plan.sn.space.variables],
                           sorted(k.signature for k in self.plan.kernels)])
        model = hashlib.sha256(text.encode()).hexdigest()[:16]
        return Target.of(self.target.device, self.target.backend, **dict(self.target.settings), model=model)

    def open_store(self):
        from autotailor.predict.latency import LutStore

        return LutStore(self.lut)

    def _calibration(self):
        from autotailor.predict.latency import CostModel, calibration_archs

        costs = CostModel(self.plan)
        return costs, calibration_archs(self.plan.sn.space, costs)

    def calibrate(self, on_subnet: Callable[[int, int], None] | None = None) -> int:
        """Measure the calibration SubNets the LUT lacks; how many were measured (see ``measure``).

        They are timed in rounds until the timings span ``CALIBRATION_SECONDS`` (at most
        ``CALIBRATION_ROUNDS``): a whole model's speed relative to the reference kernel wanders
        by a few percent from one 10-second spell to the next, and an in-model factor fitted to
        one short spell carries it into every prediction."""
        if self.cache_fixed:
            return 0
        return len(self.measure(self._calibration()[1], on_subnet, min_seconds=CALIBRATION_SECONDS,
                                max_rounds=CALIBRATION_ROUNDS))

    def time_deployed(self, files: Sequence[tuple[Path, Any]], on_timed: Callable[[int, int], None] | None = None
                      ) -> list[Any]:
        """Time deployed SubNets (``(path, input shape)`` as ``backend.deploy`` wrote them): per
        SubNet, a ``Measurement`` with the reference kernel's reading around it (``reference_ms``).

        Paired design: the reference kernel (``Backend.reference_probe``) is read before every
        timing and once at the end; a timing takes the lower of the readings around it, since
        a disturbance only ever inflates a reading. Two passes in opposite orders; each SubNet
        keeps its faster timing (a disturbance only ever slows a run down). Choosing the pass
        by the quotient instead would favour a reading that a disturbance inflated, and put a
        SubNet up to 20 % below what it measures. Sessions are loaded one at a time."""
        from autotailor.predict.latency.backends.base import torch_on_one_thread

        readings: list[float] = []
        timings: list[list[tuple[Any, int]]] = [[] for _ in files]
        order = [*range(len(files)), *reversed(range(len(files)))]
        with torch_on_one_thread():
            probe = self.backend.reference_probe()
            for done, i in enumerate(order):
                readings.append(probe())
                path, shape = files[i]
                timings[i].append((self.backend.time(self.backend.load(path, shape)), len(readings) - 1))
                if on_timed is not None:
                    on_timed(done + 1, len(order))
            readings.append(probe())
        out = []
        for pair in timings:
            m, r = min(pair, key=lambda t: t[0].median_ms)
            out.append(dataclasses.replace(m, reference_ms=min(readings[r], readings[r + 1])))
        return out

    def speed(self):
        """The reference kernel's readings while the kernels were profiled (``Speed``; None for a
        LUT profiled before the paired design)."""
        with self.open_store() as store:
            return store.speed(self.target)

    def reference_ms(self) -> float | None:
        """The machine speed every prediction and stored SubNet is brought to: the median
        reading of the reference kernel while the kernels were profiled."""
        speed = self.speed()
        return None if speed is None else speed.median_ms

    def measure(self, archs: list[dict[str, Any]], on_subnet: Callable[[int, int], None] | None = None,
                again: bool = False, min_seconds: float = 0.0, max_rounds: int = 1) -> list[dict[str, Any]]:
        """Measure the whole SubNets ``archs`` (complete architectures) that the LUT lacks (with
        ``again``, all of them: a stored measurement becomes the mean of its timings), exported
        and run as deployed (``time_deployed``), and store them; the ones measured. They are
        timed again until ``min_seconds`` have passed, ``max_rounds`` times at most, and each
        SubNet's rounds pooled. Every stored SubNet of this space takes part in the
        ``CacheModel`` fit of ``predictor``.

        Each is stored with its reference reading and read back at the LUT's machine speed
        (``measured``): a VM's speed drifts by tens of percent for tens of seconds at a time,
        which would otherwise be fitted as a property of the cache."""
        import tempfile

        from autotailor.predict.latency import subnet_key

        unique = {subnet_key(a): a for a in archs}
        with self.open_store() as store:
            lacking = len(store.missing(self.target, [k.signature for k in self.plan.kernels]))
            stored = store.get(self.subnet_target, list(unique))
        if lacking:  # SubNets are stored at the LUT's machine speed: it must be measured first
            raise AutoTailorError(f"the LUT lacks {lacking} kernels for {self.target}; profile them before measuring "
                                  "SubNets")
        missing = [a for k, a in unique.items() if again or k not in stored]
        if not missing:
            return []
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for i, arch in enumerate(missing):
                shape = self.plan.sn.input_shape(arch)
                files.append((self.backend.deploy(self.plan.sn.extract(arch).eval(), Path(tmp) / f"subnet{i}", shape),
                              shape))
            progress = None if on_subnet is None else lambda done, total: on_subnet(done // 2, total // 2)
            started = time.perf_counter()
            rounds = [self.time_deployed(files, on_timed=progress)]
            while len(rounds) < max_rounds and time.perf_counter() - started < min_seconds:
                rounds.append(self.time_deployed(files, on_timed=progress))
        if len(rounds) > 1:
            log.info("%d SubNets timed in %d rounds, %.0f s", len(files), len(rounds), time.perf_counter() - started)
        with self.open_store() as store:
            for i, arch in enumerate(missing):
                m = stored.get(subnet_key(arch))
                for timed in rounds:
                    m = timed[i] if m is None else pooled(m, timed[i])
                store.put(self.subnet_target, subnet_key(arch), m)
        return missing

    def measured(self) -> dict[str, float]:
        """Every whole SubNet of this model measured on the target: ``subnet_key`` -> median ms."""
        from autotailor.predict.latency import SUBNET_PREFIX

        reference = self.reference_ms()
        with self.open_store() as store:
            stored = store.with_prefix(self.subnet_target, SUBNET_PREFIX)
        return {key: m.at_speed(reference) for key, m in stored.items()}

    def predictor(self):
        """The latency predictor of this device (the LUTs must be complete: ``profile`` first)."""
        from autotailor.predict.latency import (CacheAwarePredictor, CacheModel, LatencyPredictor, fit_cache_model,
                                                subnet_arch, subnet_key)

        reference = self.reference_ms()  # the warm table too is brought to the flushed one's speed
        with self.open_store() as store:
            cold = LatencyPredictor.from_store(self.plan, store, self.target, reference)
            hot = cold if self.hot_target is None else LatencyPredictor.from_store(self.plan, store, self.hot_target,
                                                                                   reference)
        costs, archs = self._calibration()
        measured = self.measured()
        lacking = sum(subnet_key(a) not in measured for a in archs)
        calibrated = not self.cache_fixed and not lacking
        if not self.cache_fixed and 0 < lacking < len(archs):
            log.warning("the LUT's calibration for %s lacks %d of its %d SubNets (profiled by an older version, or "
                        "interrupted): predictions are not calibrated until `autotailor profile` measures them",
                        self.target, lacking, len(archs))
        if hot is cold and not calibrated:
            return cold
        model = CacheModel(self.cache_bytes)
        if calibrated:
            model = fit_cache_model(cold, hot, costs, [subnet_arch(k) for k in measured], list(measured.values()),
                                    self.cache_bytes)
        return CacheAwarePredictor(cold, hot, costs, model)


def pooled(old, new):
    """One ``Measurement`` of two timings of the same SubNet: their medians (the new one at the
    old one's machine speed) averaged, weighted by their repeats (so a third timing counts as
    much as each of the first two)."""
    from autotailor.predict.latency import Measurement

    n = old.repeats + new.repeats
    return Measurement((old.median_ms * old.repeats + new.at_speed(old.reference_ms) * new.repeats) / n,
                       max(old.mad_ms, new.mad_ms), n, new.measured_at, old.reference_ms)


def device_setup(sn, work: str | Path, spec: str, device_name: str | None = None, lut: str | Path | None = None,
                 granularity: str = "fused") -> DeviceSetup:
    """``spec`` is ``BACKEND[:KEY=VALUE,...]``: the backend's settings, and ``cache_mb`` (what one
    core keeps of a model in cache; by default fitted to the SubNets ``calibrate`` measures)."""
    from autotailor.predict.latency import KernelPlan, Target, cache_bytes, make_backend, parse_device

    name, settings = parse_device(spec)
    cache = settings.pop("cache_mb", None)
    backend = make_backend(name, **settings)
    plan = KernelPlan(sn, backend.fusion, granularity)
    device = device_name or backend.machine or socket.gethostname()
    target = Target.of(device, name, **backend.settings)
    setup = DeviceSetup(spec, backend, plan, Path(lut or Path(work) / LUT), target,
                        cache_bytes=int(float(cache) * 2**20) if cache is not None else cache_bytes(),
                        cache_fixed=cache is not None)
    if backend.flush_mb:
        setup.hot_backend = make_backend(name, **{**settings, "flush_mb": 0})
        setup.hot_target = Target.of(device, name, **setup.hot_backend.settings)
    return setup
