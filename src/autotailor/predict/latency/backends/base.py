"""Runtime backends: one registered class per runtime holds everything about it.

* ``fusion``: how the runtime groups operators into kernels (``FusionRules``);
* ``measure(module, input_shape) -> Measurement``: profiling one kernel (a small torch
  module). Each measurement warms up, then times ``repeats`` calls and keeps the median and
  the median absolute deviation; ``overhead`` times an identity kernel, the fixed cost of one
  call into the runtime, which the predictor accounts for once per model;
* ``format`` and ``deploy(net, path, input_shape)``: the export format of its files
  (``autotailor export --format``) and the writer;
* ``load(path, input_shape)``: a runner of a deployed file, to time it as deployed.

Adding a runtime is one module with one ``@backend(NAME)`` class, imported by this package's
``__init__`` (see docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import numpy as np
import torch
import torch.nn as nn

from autotailor.errors import ExportError, LatencyError
from autotailor.timing import time_calls
from autotailor.predict.latency.kernels import NO_FUSION, FusionRules
from autotailor.predict.latency.lut import Measurement

_BACKENDS: dict[str, type["Backend"]] = {}


def backend(name: str) -> Callable[[type["Backend"]], type["Backend"]]:
    """Register the decorated ``Backend`` subclass as ``name`` (the ``--device`` spec's first part)."""

    def deco(cls: type["Backend"]) -> type["Backend"]:
        cls.name = name
        _BACKENDS[name] = cls
        return cls

    return deco


def backend_class(name: str) -> type["Backend"]:
    if name not in _BACKENDS:
        raise LatencyError(f"unknown backend {name!r}; available: {', '.join(sorted(_BACKENDS))}")
    return _BACKENDS[name]


def backends() -> dict[str, type["Backend"]]:
    """The registered backends by name."""
    return dict(_BACKENDS)


def make_backend(name: str, **settings: object) -> "Backend":
    """The backend ``name`` (``ort-cpu``, ``torch``) with its settings (e.g. ``threads=1``)."""
    cls = backend_class(name)
    try:
        return cls(**settings)
    except TypeError as exc:
        raise LatencyError(f"backend {name!r} does not take these settings {settings}: {exc}") from exc


def fusion_rules(name: str) -> FusionRules:
    """The fusion rules of backend ``name``, or ``none`` (one kernel per operator)."""
    return NO_FUSION if name == NO_FUSION.name else backend_class(name).fusion


def format_backend(fmt: str) -> type["Backend"]:
    """The backend whose files are of export format ``fmt`` (``onnx``, ``ncnn``, ``torchscript``)."""
    found = [cls for cls in _BACKENDS.values() if cls.format == fmt]
    if not found:
        raise ExportError(f"unknown export format {fmt!r}; allowed: {list(export_formats())}")
    return found[0]


def export_formats() -> list[str]:
    return list(dict.fromkeys(cls.format for cls in _BACKENDS.values() if cls.format))


def device_help() -> str:
    """What ``--device`` accepts, from the registered backends."""
    return "BACKEND[:KEY=VALUE,...]: " + ", ".join(f"{n} ({', '.join(c.options)})" for n, c in _BACKENDS.items())


def parse_device(spec: str) -> tuple[str, dict[str, object]]:
    """``ort-cpu:threads=1,optimization=all`` -> ``("ort-cpu", {"threads": 1, "optimization": "all"})``;
    a device reached through its agent, ``remote:HOST:PORT/BACKEND[:KEY=VALUE,...]`` -> ``("remote",
    {"url": "http://HOST:PORT", "backend": BACKEND, ...})``."""
    if spec.startswith("remote:"):
        address, slash, inner = spec[len("remote:"):].partition("/")
        if not slash or not address or not inner:
            raise LatencyError(f"remote device {spec!r} is not remote:HOST:PORT/BACKEND[:KEY=VALUE,...] "
                               "(e.g. remote:10.0.0.2:8765/ort-cpu:threads=1)")
        backend_name, settings = parse_device(inner)
        return "remote", {"url": f"http://{address}", "backend": backend_name, **settings}
    name, _, rest = spec.partition(":")
    settings: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise LatencyError(f"device setting {item!r} in {spec!r} is not KEY=VALUE (e.g. ort-cpu:threads=1)")
        settings[key.strip().replace("-", "_")] = _setting_value(value.strip())
    return name, settings


def _setting_value(text: str) -> object:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


Shape = tuple[int, ...]


@contextlib.contextmanager
def torch_on_one_thread() -> Iterator[None]:
    """Torch (exporting kernels, extracting SubNets) on one thread while timings run beside it:
    its idle worker threads spin for a while after each parallel operation, on a core that a
    timing or another process needs."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _shapes(input_shape: Shape | Sequence[Shape]) -> list[Shape]:
    """One input shape, or a list of them (a kernel with a residual input has two)."""
    if len(input_shape) and isinstance(input_shape[0], int):
        return [tuple(input_shape)]
    return [tuple(s) for s in input_shape]


def _summary(times_ms: list[float]) -> Measurement:
    med = statistics.median(times_ms)
    mad = statistics.median(abs(t - med) for t in times_ms)
    return Measurement(med, mad, len(times_ms), time.time())


class Backend:
    """A runtime to profile kernels on. ``flush_mb`` megabytes are overwritten before each timed
    run of a kernel: inside a whole model a kernel's weights may not be in the core's caches
    when it starts, as they are when it runs alone again and again. Whether that helps depends
    on the runtime, so each backend has its own default (measured: see docs/latency.md)."""

    name: ClassVar[str] = ""
    default_flush_mb: ClassVar[int] = 0
    fusion: ClassVar[FusionRules] = NO_FUSION
    machine: str | None = None  # the machine it measures on, if not this one (a LUT's device name)
    format: ClassVar[str] = ""  # export format of its deployed files
    suffix: ClassVar[str] = ""  # of the file ``deploy`` writes (distinct per backend: formats share a folder)
    options: ClassVar[tuple[str, ...]] = ("threads",)  # settings a --device spec names (for --help)
    # settings that shape the files it writes rather than how they run (a remote agent gets the files)
    file_options: ClassVar[tuple[str, ...]] = ()
    # how ``measure`` times a kernel: ``wall`` (wall clock less the call overhead), or a rule of
    # ``autotailor.counters`` (the runtime's own profiler), which a remote agent applies too
    count: str = "wall"

    def __init__(self, threads: int = 1, warmup: int = 10, repeats: int = 50, budget_s: float = 0.5,
                 flush_mb: int | None = None):
        flush_mb = self.default_flush_mb if flush_mb is None else flush_mb
        if threads < 1 or warmup < 0 or repeats < 1 or flush_mb < 0:
            raise LatencyError("threads and repeats must be >= 1, warmup and flush_mb >= 0")
        self.threads, self.warmup, self.repeats, self.budget_s = threads, warmup, repeats, budget_s
        self.flush_mb = flush_mb
        self._scratch = np.zeros(flush_mb * 2**20 // 8) if flush_mb else None
        self._overhead: Measurement | None = None

    @property
    def settings(self) -> dict[str, object]:
        """What makes measurements comparable: part of the LUT key."""
        return {"threads": self.threads, "flush_mb": self.flush_mb}

    def _flush(self) -> None:
        if self._scratch is not None:
            np.add(self._scratch, 1.0, out=self._scratch)

    def measure(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Measurement:
        """The time (ms) ``module`` takes when it runs inside a model, on inputs of ``input_shape``
        (one shape or a list): by default the wall time of calling it as a model of its own,
        caches flushed, less the fixed cost of a call (``overhead``), which a model pays once."""
        return self._measure_prepared(self.prepare(module, _shapes(input_shape)))

    def prober(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Callable[[], Measurement]:
        """A function doing what ``measure`` does, again and again, with the kernel prepared once
        (a converter such as pnnx takes longer than the timing itself)."""
        run = self.prepare(module, _shapes(input_shape))
        return lambda: self._measure_prepared(run)

    def _measure_prepared(self, run: Callable[[], object]) -> Measurement:
        m = _summary(time_calls(run, self.warmup, self.repeats, self.budget_s, self._flush))
        if self._overhead is None:
            self._overhead = self.overhead()
        return Measurement(max(0.0, m.median_ms - self._overhead.median_ms), m.mad_ms, m.repeats, m.measured_at)

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:  # pragma: no cover
        """A function that runs ``module`` once on the runtime (loading it is not timed)."""
        raise NotImplementedError

    def overhead(self, input_shape: tuple[int, ...] = (1, 1)) -> Measurement:
        """The fixed cost of one call of a model: the wall time of a kernel that does (almost)
        nothing, the fastest of three timings. A disturbance only ever slows one down, and one
        call takes microseconds: a single stall inflated a timing fivefold (0.031 ms for 0.006)."""
        run = self.prepare(_Identity(), [input_shape])
        return min((self.time(run) for _ in range(3)), key=lambda m: m.median_ms)

    def time(self, run: Callable[[], object]) -> Measurement:
        """Warm-up, then the median (and MAD) of timed calls of ``run`` (a whole model: no flushing)."""
        return _summary(time_calls(run, self.warmup, self.repeats, self.budget_s))

    def counter_offset_ms(self, wall_ms: Callable[[nn.Module, list[Shape]], float],
                          counted_ms: Callable[[nn.Module, list[Shape]], float]) -> float:
        """What the runtime's profiler adds to each node it counts, beyond the node's own time,
        from a model's wall time (``wall_ms``) and its count (``counted_ms``, without offset)
        however they are measured (here, or on a device): none by default."""
        return 0.0

    def reference_probe(self) -> Callable[[], float]:
        """A function timing the reference kernel now (ms, a whole call, caches not flushed): a
        fixed convolution, the same for every model, whose time says how fast the machine is
        at that moment. Profiling and calibration read it around their measurements (the paired
        design: see ``profile``)."""
        run = self.prepare(ReferenceKernel(), [REFERENCE_SHAPE])
        return lambda: self.time(run).median_ms

    # -- deployed models -----------------------------------------------------------------------
    @property
    def quantized(self) -> bool:
        """Whether its deployed files differ from its format's default ones (a quantized
        precision): an export then writes the device's own file and evaluates that file."""
        return False

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape,
               calibration: Sequence[np.ndarray] | None = None) -> Path:  # pragma: no cover
        """Write ``net`` (an extracted SubNet) in this runtime's format at ``path`` (suffix replaced).
        ``calibration``: input batches on which a quantizing precision (ONNX Runtime's int8)
        calibrates its ranges; other precisions ignore them."""
        raise NotImplementedError

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:  # pragma: no cover
        """A function running the deployed model at ``path`` once on a random input, as configured."""
        raise NotImplementedError

    def run_file(self, path: str | Path, x: np.ndarray) -> np.ndarray:  # pragma: no cover
        """The output of the deployed model at ``path`` for the input batch ``x``."""
        raise NotImplementedError

    def kernel_file(self, module: nn.Module, input_shapes: list[Shape], path: str | Path) -> Path:
        """Write one kernel (any number of inputs) in this runtime's format at ``path`` (suffix
        replaced), for a device to time; ``deployed_files`` of the result are all it needs."""
        if len(input_shapes) != 1:
            raise LatencyError(f"the {self.name} backend cannot write a kernel of {len(input_shapes)} inputs as a "
                               "file; profile it locally")
        return self.deploy(module, path, input_shapes[0])

    @classmethod
    def deploy_path(cls, path: str | Path) -> Path:
        """Where ``deploy(net, path, ...)`` writes: ``path`` with the backend's suffix."""
        return Path(path).with_suffix(cls.suffix)

    @classmethod
    def deployed_files(cls, path: Path) -> list[Path]:
        """Every file ``deploy`` wrote for the model at ``path`` (what ``deploy`` returned)."""
        return [path]


REFERENCE_SHAPE = (1, 32, 28, 28)


class ReferenceKernel(nn.Sequential):
    """The reference kernel: a 3x3 convolution of 32 channels at 28x28 and a ReLU (7 M MACs,
    weights and activations in a core's L2: it measures the core, not the memory)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
        self.eval()


class _Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)  # a real node that no converter optimises away
