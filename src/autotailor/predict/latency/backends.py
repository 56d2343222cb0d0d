"""Runtime backends: one registered class per runtime holds everything about it.

* ``fusion``: how the runtime groups operators into kernels (``FusionRules``);
* ``measure(module, input_shape) -> Measurement``: profiling one kernel (a small torch
  module). Each measurement warms up, then times ``repeats`` calls and keeps the median and
  the median absolute deviation; ``overhead`` times an identity kernel, the fixed cost of one
  call into the runtime, which the predictor accounts for once per model;
* ``format`` and ``deploy(net, path, input_shape)``: the export format of its files
  (``autotailor export --format``) and the writer;
* ``load(path, input_shape)``: a runner of a deployed file, to time it as deployed.

Adding a runtime is one ``@backend(NAME)`` class (see docs/architecture.md).
"""

from __future__ import annotations

import bisect
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, ClassVar, Sequence

import numpy as np
import torch
import torch.nn as nn

from autotailor.errors import ExportError, LatencyError
from autotailor.predict.latency.kernels import NO_FUSION, POINTWISE_ACTS, FusionRules
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
    return list(dict.fromkeys(cls.format for cls in _BACKENDS.values()))


def device_help() -> str:
    """What ``--device`` accepts, from the registered backends."""
    return "BACKEND[:KEY=VALUE,...]: " + ", ".join(f"{n} ({', '.join(c.options)})" for n, c in _BACKENDS.items())


def parse_device(spec: str) -> tuple[str, dict[str, object]]:
    """``ort-cpu:threads=1,optimization=all`` -> ``("ort-cpu", {"threads": 1, "optimization": "all"})``."""
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


def _shapes(input_shape: Shape | Sequence[Shape]) -> list[Shape]:
    """One input shape, or a list of them (a kernel with a residual input has two)."""
    if len(input_shape) and isinstance(input_shape[0], int):
        return [tuple(input_shape)]
    return [tuple(s) for s in input_shape]


def _summary(times_ms: list[float]) -> Measurement:
    med = statistics.median(times_ms)
    mad = statistics.median(abs(t - med) for t in times_ms)
    return Measurement(med, mad, len(times_ms), time.time())


def _time_calls(run: Callable[[], object], warmup: int, repeats: int, budget_s: float,
                before: Callable[[], object] | None = None) -> list[float]:
    """Warm up, then time up to ``repeats`` calls, fewer (but at least 5) when one call is
    long enough that ``repeats`` would exceed ``budget_s``: slow kernels are stable anyway.
    The warm-up stops early too, after two calls, once it has taken ``budget_s``: a whole
    SubNet of half a second is warm after its first call (measured on NCNN and ONNX Runtime),
    and ten warm-up calls were most of a calibration's time."""
    deadline = time.perf_counter() + budget_s
    for i in range(warmup):
        if i >= 2 and time.perf_counter() > deadline:
            break
        run()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < repeats and (len(times) < 5 or time.perf_counter() < deadline):
        if before is not None:
            before()  # not timed
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return times


class Backend:
    """A runtime to profile kernels on. ``flush_mb`` megabytes are overwritten before each timed
    run of a kernel: inside a whole model a kernel's weights may not be in the core's caches
    when it starts, as they are when it runs alone again and again. Whether that helps depends
    on the runtime, so each backend has its own default (measured: see docs/latency.md)."""

    name: ClassVar[str] = ""
    default_flush_mb: ClassVar[int] = 0
    fusion: ClassVar[FusionRules] = NO_FUSION
    format: ClassVar[str] = ""  # export format of its deployed files
    options: ClassVar[tuple[str, ...]] = ("threads",)  # settings a --device spec names (for --help)

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
        m = _summary(_time_calls(run, self.warmup, self.repeats, self.budget_s, self._flush))
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
        return _summary(_time_calls(run, self.warmup, self.repeats, self.budget_s))

    # -- deployed models -----------------------------------------------------------------------
    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape) -> Path:  # pragma: no cover
        """Write ``net`` (an extracted SubNet) in this runtime's format at ``path`` (suffix replaced)."""
        raise NotImplementedError

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:  # pragma: no cover
        """A function running the deployed model at ``path`` once on a random input, as configured."""
        raise NotImplementedError

    @classmethod
    def deployed_files(cls, path: Path) -> list[Path]:
        """Every file ``deploy`` wrote for the model at ``path`` (what ``deploy`` returned)."""
        return [path]


class _Identity(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)  # a real node that no converter optimises away


@backend("ort-cpu")
class OrtCpu(Backend):
    """ONNX Runtime, CPU execution provider, ``threads`` intra-op threads, graph optimisation
    level ``optimization``: ``extended`` (default) or ``all``, which adds the NCHWc layout
    transformation; deployed models must run with the same level as their kernels were profiled."""

    LEVELS = ("basic", "extended", "all")
    default_flush_mb = 16
    # BatchNorm is folded into the convolution at export; the CPU provider fuses a following
    # activation (ConvActivationFusion, HardSwish included when its output feeds a node, as
    # inside a model) and, in its NCHWc layout, a residual add + ReLU.
    fusion = FusionRules("ort-cpu", frozenset({"conv2d", "linear"}), (
        frozenset({"batchnorm2d"}), frozenset({"add", "iadd"}), POINTWISE_ACTS | {"gelu", "hardswish"}))
    format = "onnx"
    options = ("threads", "optimization", "flush_mb")
    # How kernels are timed, part of the LUT key so that entries timed another way are measured
    # again. 2: each kernel's output feeds a node (see ``_Consumed``); 3: less the profiler's
    # own cost per node (see ``node_offset_ms``).
    TIMING = 3

    def __init__(self, optimization: str = "all", **kwargs: object):
        super().__init__(**kwargs)
        if optimization not in self.LEVELS:
            raise LatencyError(f"ort-cpu optimization={optimization!r} is not allowed; expected one of {self.LEVELS}")
        self.optimization = optimization
        self._node_offset_ms: float | None = None

    @property
    def settings(self) -> dict[str, object]:
        return {**super().settings, "optimization": self.optimization, "timing": self.TIMING}

    def _session(self, module: nn.Module, input_shapes: list[Shape], profiling: str | None = None):
        import onnxruntime as ort

        opts = self.session_options()
        if profiling is not None:
            opts.enable_profiling = True
            opts.profile_file_prefix = profiling
        sess = ort.InferenceSession(_onnx_bytes(module, input_shapes), opts, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feed = {i.name: rng.standard_normal(s).astype(np.float32) for i, s in zip(sess.get_inputs(), input_shapes)}
        return sess, feed

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        sess, feed = self._session(module, input_shapes)
        return lambda: sess.run(None, feed)

    def measure(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Measurement:
        """The summed time of the kernel's nodes per run, from ONNX Runtime's own profiler.

        A kernel alone pays for converting its input to and its output from the blocked
        (NCHWc) layout, which a whole model does only at its ends; those reorder nodes and the
        call overhead (see ``overhead``) are left out, so that the entry is what the kernel costs
        inside a model. So is the node that consumes the kernel's output (``_Consumed``), and so
        is what the profiler itself adds to each node (``node_offset_ms``)."""
        if self._node_offset_ms is None:
            self._node_offset_ms = self.node_offset_ms()
        return _summary(self._profiled_ms(_Consumed(module), _shapes(input_shape), self._flush, self._node_offset_ms))

    def prober(self, module: nn.Module, input_shape: Shape | Sequence[Shape]) -> Callable[[], Measurement]:
        return lambda: self.measure(module, input_shape)  # each profiled run needs its own session

    def _profiled_ms(self, module: nn.Module, input_shapes: list[Shape], before: Callable[[], object] | None,
                     node_offset_ms: float) -> list[float]:
        with tempfile.TemporaryDirectory() as tmp:
            sess, feed = self._session(module, input_shapes, profiling=str(Path(tmp) / "kernel"))
            run: Callable[[], object] = lambda: sess.run(None, feed)  # noqa: E731
            _time_calls(run, self.warmup, self.repeats, self.budget_s, before)
            events = json.loads(Path(sess.end_profiling()).read_text())
        per_run = _per_run_kernel_ms(events, self.warmup, node_offset_ms)
        if not per_run:
            raise LatencyError("ONNX Runtime's profiler recorded no model runs; is this onnxruntime too old?")
        return per_run

    def node_offset_ms(self, nodes: int = 32) -> float:
        """What ORT's profiler adds to the time of each node it records: its own bookkeeping,
        a few microseconds that a model run without the profiler does not pay. Measured once per
        backend on a chain of ``nodes`` small convolutions: the profiler's time per node less
        the chain's wall time per node (the slope between the chain and a quarter of it)."""
        def chain(n: int) -> nn.Module:
            return _Consumed(nn.Sequential(*[nn.Sequential(nn.Conv2d(32, 32, 1), nn.ReLU()) for _ in range(n)]))

        shape = [(1, 32, 8, 8)]
        short, long = nodes // 4, nodes
        walls = {}
        for n in (short, long):
            walls[n] = statistics.median(_time_calls(self.prepare(chain(n).eval(), shape), self.warmup, 200, 1.0))
        slope = (walls[long] - walls[short]) / (long - short)
        profiled = statistics.median(self._profiled_ms(chain(long).eval(), shape, None, 0.0)) / long
        return max(0.0, profiled - slope)

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape) -> Path:
        from autotailor.deploy import export_onnx

        return export_onnx(net, Path(path).with_suffix(".onnx"), input_shape)

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(path), self.session_options(), providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: np.random.default_rng(0).standard_normal(input_shape).astype(np.float32)}
        return lambda: sess.run(None, feed)

    def session_options(self):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = {
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.optimization]
        return opts


class _Consumer(nn.Module):
    def forward(self, y: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if isinstance(y, (tuple, list)):  # a kernel with several outputs (a whole block)
            return tuple(t.reshape(-1) for t in y)
        return y.reshape(-1)


class _Consumed(nn.Module):
    """``kernel`` with a node consuming its output, as inside a model. ONNX Runtime fuses some
    activations (HardSwish) into the convolution before them only when their output feeds
    another node, never at a graph output. The consumer's nodes are named ``/consumer/...``."""

    def __init__(self, kernel: nn.Module):
        super().__init__()
        self.kernel, self.consumer = kernel, _Consumer()

    def forward(self, *xs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.consumer(self.kernel(*xs))


_LAYOUT_NODES = ("ReorderInput", "ReorderOutput")


def _counted(event: dict) -> bool:
    """Whether a profiled node is part of the kernel: not a layout conversion, not the consumer."""
    args = event.get("args", {})
    return args.get("op_name") not in _LAYOUT_NODES and not event["name"].startswith("/consumer/")


def _per_run_kernel_ms(events: list[dict], skip: int, node_offset_ms: float = 0.0) -> list[float]:
    """Per model run (after the first ``skip``), the summed duration of its counted nodes, each
    less ``node_offset_ms`` (the profiler's own cost per node; a node counts at least 0)."""
    runs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    runs = sorted(runs)[skip:]
    totals = [0.0] * len(runs)
    starts = [r[0] for r in runs]
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        if not _counted(e):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] <= runs[i][1]:
            totals[i] += max(0.0, e["dur"] / 1e3 - node_offset_ms)
    return totals


def _onnx_bytes(module: nn.Module, input_shapes: list[Shape]) -> bytes:
    """``module`` as an ONNX model with static shapes (BatchNorm folded, as in a deployed SubNet)."""
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), tuple(torch.zeros(s) for s in input_shapes), buf, dynamo=False,
                          opset_version=17, input_names=[f"x{i}" for i in range(len(input_shapes))])
    return buf.getvalue()


@backend("torch")
class TorchEager(Backend):
    """PyTorch eager mode on the CPU with ``threads`` intra-op threads; every operator is its own
    kernel. Deployed as TorchScript."""

    fusion = FusionRules("torch", frozenset(), ())
    format = "torchscript"

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        module = module.eval()
        gen = torch.Generator().manual_seed(0)
        xs = [torch.randn(s, generator=gen) for s in input_shapes]

        def run() -> object:
            previous = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                with torch.inference_mode():
                    return module(*xs)
            finally:
                torch.set_num_threads(previous)

        return run

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape) -> Path:
        from autotailor.deploy import export_torchscript

        return export_torchscript(net, Path(path).with_suffix(".torchscript.pt"), input_shape)

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        return self.prepare(torch.jit.load(str(path)), [input_shape])


@backend("ncnn")
class Ncnn(Backend):
    """NCNN on the CPU with ``threads`` threads; kernels and SubNets are converted by pnnx, which
    folds BatchNorm and fuses activations into convolutions. A call creates an extractor, feeds
    the inputs and extracts the output, as an application does."""

    # pnnx folds BatchNorm and fuses activations into Convolution / InnerProduct.
    fusion = FusionRules("ncnn", frozenset({"conv2d", "linear"}), (
        frozenset({"batchnorm2d"}), POINTWISE_ACTS | {"hardswish"}))
    format = "ncnn"

    def __init__(self, **kwargs: object):
        super().__init__(**kwargs)
        self._widest: int | None = None

    def prepare(self, module: nn.Module, input_shapes: list[Shape]) -> Callable[[], object]:
        from autotailor.deploy import export_ncnn

        with tempfile.TemporaryDirectory() as tmp:
            param, _ = export_ncnn(module, Path(tmp) / "kernel", input_shapes)
            return self._runner(param, input_shapes, packed=True)

    def _runner(self, param: Path, input_shapes: list[Shape], packed: bool = False) -> Callable[[], object]:
        import ncnn

        from autotailor.deploy import ncnn_net

        net = ncnn_net(param, self.threads)  # loaded into memory: the files may go
        rng = np.random.default_rng(0)
        # Inputs are NCNN-owned Mats made once, as an application reuses its input buffers, and
        # the output is extracted as computed (type 1: no conversion): copying either would be
        # timed with every kernel. A kernel's inputs come packed, as the layer before it in a
        # model leaves them, so that its time holds no layout conversion.
        arrays = [rng.standard_normal(s[1:]).astype(np.float32) for s in input_shapes]
        # ncnn.Mat borrows an array's memory: the arrays must outlive the clone (a temporary may not)
        mats = [ncnn.Mat(a).clone() for a in arrays]
        if packed:
            mats = [ncnn.convert_packing(m, self._elempack(s[1] if len(s) > 2 else s[-1]))
                    for m, s in zip(mats, input_shapes)]

        def run() -> object:
            ex = net.create_extractor()
            for i, m in enumerate(mats):
                ex.input(f"in{i}", m)
            return ex.extract("out0", 1)

        return run

    def _elempack(self, channels: int) -> int:
        """The packing NCNN's layers give a blob of ``channels`` on this CPU (probed once)."""
        if self._widest is None:
            import ncnn

            from autotailor.deploy import export_ncnn

            with tempfile.TemporaryDirectory() as tmp:
                param, _ = export_ncnn(nn.Conv2d(1, 16, 1), Path(tmp) / "probe", (1, 1, 4, 4))
                run = self._runner(param, [(1, 1, 4, 4)])
            out = run()[1]
            self._widest = out.elempack if isinstance(out, ncnn.Mat) else 1
        return next(p for p in (16, 8, 4, 1) if p <= self._widest and channels % p == 0)

    def deploy(self, net: nn.Module, path: str | Path, input_shape: Shape) -> Path:
        from autotailor.deploy import export_ncnn

        return export_ncnn(net, Path(path), input_shape)[0]

    @classmethod
    def deployed_files(cls, path: Path) -> list[Path]:
        return [path, path.with_suffix(".bin")]

    def load(self, path: str | Path, input_shape: Shape) -> Callable[[], object]:
        return self._runner(Path(path), [input_shape])
