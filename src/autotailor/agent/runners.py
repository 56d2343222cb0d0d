"""What the agent can run: one registered ``Runner`` per runtime (the host's backend names, so
that ``remote:HOST:PORT/ort-cpu`` maps onto the runner ``ort-cpu``).

A runner names the files a model of its format consists of (``files``: part name -> suffix; the
agent stores each part under a name it makes itself, never the client's), the settings it takes,
and loads the files into a function that runs the model once on fixed random inputs (``Loaded``).
Runners whose runtime has its own profiler take a ``count`` setting: ``wall`` (the default:
calls timed by the wall clock) or a rule of ``autotailor.counters``, and then also report what
the profiler counted for each call, as the host's backends time kernels. Only numpy
and the runtime itself are imported, the runtime only when it is used: the agent runs on devices
without torch, and often with one runtime of several.

Adding a runtime is one ``@runner(NAME)`` class in this module (or any module imported before
``serve``).
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

from autotailor.counters import ORT_COUNTS, ort_kernel_ms, openvino_kernel_ms
from autotailor.errors import AgentRequestError
from autotailor.precision import configure_ncnn, ncnn_options_error

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
_RUNNERS: dict[str, type["Runner"]] = {}


def runner(name: str) -> Callable[[type["Runner"]], type["Runner"]]:
    """Register the decorated ``Runner`` subclass as ``name`` (what a request's ``backend`` names)."""

    def deco(cls: type["Runner"]) -> type["Runner"]:
        cls.name = name
        _RUNNERS[name] = cls
        return cls

    return deco


def runners() -> dict[str, type["Runner"]]:
    return dict(_RUNNERS)


def runner_class(name: str) -> type["Runner"]:
    if name not in _RUNNERS:
        raise AgentRequestError(f"unknown backend {name!r}; this agent runs: {', '.join(sorted(_RUNNERS))}", 400)
    return _RUNNERS[name]


def _bad(message: str) -> AgentRequestError:
    return AgentRequestError(message, 400)


@dataclass
class Loaded:
    """A loaded model: ``run`` runs it once; ``shapes`` are the input shapes used; ``counted``
    (when the request asked for a ``count``) gives the runtime's own count (ms) of every call
    made so far, warm-up included, in order."""

    run: Callable[[], object]
    shapes: list[Shape]
    counted: Callable[[], list[float]] | None = None


def _count(settings: dict[str, object], allowed: tuple[str, ...], backend: str) -> str:
    count = settings.get("count", "wall")
    if count not in ("wall", *allowed):
        raise _bad(f"backend {backend!r} count={count!r} is not allowed; expected one of {['wall', *allowed]}")
    return str(count)


class Runner:
    """A runtime the agent runs model files on. Subclasses set ``module`` (the Python module of
    the runtime, imported lazily), ``files`` and ``options`` (setting -> default), and implement
    ``load``."""

    name: ClassVar[str] = ""
    module: ClassVar[str] = ""
    files: ClassVar[dict[str, str]] = {"model": ".bin"}
    options: ClassVar[dict[str, object]] = {"threads": 1}
    _version: ClassVar[str | None] = None
    _probed: ClassVar[bool] = False

    def __init__(self, **settings: object):
        unknown = sorted(set(settings) - set(self.options))
        if unknown:
            raise _bad(f"backend {self.name!r} does not take the settings {unknown}; it takes {sorted(self.options)} "
                       "and the timing settings warmup, repeats, budget_s, windows, flush_mb")
        self.settings: dict[str, object] = {**self.options, **settings}
        threads = self.settings.get("threads")
        if "threads" in self.options and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
            raise _bad(f"threads must be an integer >= 1, got {threads!r}")

    @classmethod
    def version(cls) -> str | None:
        """The runtime's version, or None when it is not installed here (probed once: importing
        OpenVINO takes about a second)."""
        if not cls._probed:
            try:
                mod = importlib.import_module(cls.module)
                cls._version = str(getattr(mod, "__version__", "unknown"))
            except Exception as exc:  # noqa: BLE001 - a broken install is "not available", with the reason logged
                log.info("runtime %s (%s) not available: %s", cls.name, cls.module, exc)
                cls._version = None
            cls._probed = True
        return cls._version

    def require(self):
        """The runtime's module, or a 400 saying it is not installed on this device."""
        if self.version() is None:
            raise _bad(f"backend {self.name!r} needs the Python package {self.module!r}, which is not installed "
                       f"on this device; install it there, or choose one of the available runtimes (GET /health)")
        return importlib.import_module(self.module)

    def load(self, files: dict[str, Path], inputs: list[Shape] | None) -> Loaded:
        """The model loaded: a function running it once on fixed random inputs, and the input
        shapes used (``inputs`` when given, else the shapes the model declares)."""
        raise NotImplementedError


def _random_inputs(shapes: list[Shape], dtypes: list[np.dtype]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)  # fixed: repeated measurements of a file see the same data
    out = []
    for s, dt in zip(shapes, dtypes):
        if np.issubdtype(dt, np.floating):
            out.append(rng.standard_normal(s).astype(dt))
        else:
            out.append(np.zeros(s, dtype=dt))  # indices and masks: zeros are valid everywhere
    return out


def _resolve_shapes(declared: list[list[object]], inputs: list[Shape] | None, what: str) -> list[Shape]:
    """``inputs`` if given (checked against the declared count), else the declared shapes, which
    must then be static."""
    if inputs is not None:
        if len(inputs) != len(declared):
            raise _bad(f"the {what} has {len(declared)} inputs but the request gives {len(inputs)} shapes in 'inputs'")
        return inputs
    shapes = []
    for i, dims in enumerate(declared):
        if not all(isinstance(d, int) and d > 0 for d in dims):
            raise _bad(f"input {i} of the {what} has dynamic dimensions {dims}; give its shape in 'inputs' "
                       f"(e.g. \"inputs\": [[1, 3, 224, 224]])")
        shapes.append(tuple(int(d) for d in dims))
    return shapes


@runner("ort-cpu")
class OrtCpuRunner(Runner):
    """ONNX Runtime, CPU execution provider, ``threads`` intra-op threads, one inter-op thread,
    graph optimisation level ``optimization`` (as the host's ``ort-cpu`` backend sets them). With
    ``count`` ``layout`` or ``own``, ONNX Runtime's profiler is on and each call's counted nodes
    are summed, less ``node_offset_ms`` per node (the profiler's own cost)."""

    module = "onnxruntime"
    files = {"model": ".onnx"}
    options = {"threads": 1, "optimization": "all", "count": "wall", "node_offset_ms": 0.0}
    LEVELS = ("basic", "extended", "all")
    _DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
               "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_,
               "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}

    def __init__(self, **settings: object):
        super().__init__(**settings)
        if self.settings["optimization"] not in self.LEVELS:
            raise _bad(f"ort-cpu optimization={self.settings['optimization']!r} is not allowed; "
                       f"expected one of {list(self.LEVELS)}")
        self.count = _count(self.settings, tuple(ORT_COUNTS), self.name)
        offset = self.settings["node_offset_ms"]
        if not isinstance(offset, (int, float)) or isinstance(offset, bool) or not 0 <= offset < 1:
            raise _bad(f"node_offset_ms must be a number of milliseconds in [0, 1), got {offset!r}")

    def load(self, files: dict[str, Path], inputs: list[Shape] | None) -> Loaded:
        ort = self.require()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(self.settings["threads"])  # type: ignore[arg-type]
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = {
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.settings["optimization"]]
        if self.count != "wall":  # the profile goes beside the model, in the measurement's directory
            opts.enable_profiling = True
            opts.profile_file_prefix = str(files["model"].with_name("profile"))
        try:
            sess = ort.InferenceSession(str(files["model"]), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types for bad files
            raise _bad(f"ONNX Runtime could not load the uploaded 'model' as an ONNX model: {_short(exc)}") from exc
        decl = sess.get_inputs()
        shapes = _resolve_shapes([list(i.shape) for i in decl], inputs, "ONNX model")
        dtypes = []
        for i in decl:
            if i.type not in self._DTYPES:
                raise _bad(f"input {i.name!r} of the ONNX model has type {i.type}, which the agent cannot feed")
            dtypes.append(np.dtype(self._DTYPES[i.type]))
        feed = {i.name: a for i, a in zip(decl, _random_inputs(shapes, dtypes))}
        if self.count == "wall":
            return Loaded(lambda: sess.run(None, feed), shapes)

        def counted() -> list[float]:
            events = json.loads(Path(sess.end_profiling()).read_text())
            return ort_kernel_ms(events, 0, float(self.settings["node_offset_ms"]), ORT_COUNTS[self.count])

        return Loaded(lambda: sess.run(None, feed), shapes, counted)


@runner("ncnn")
class NcnnRunner(Runner):
    """NCNN, models as ``pnnx`` writes them (inputs ``in0``, ``in1``, ..., output ``out0``), on
    ``threads`` threads. NCNN files do not record input shapes: a request must give ``inputs``
    (with the batch dimension, which NCNN drops)."""

    module = "ncnn"
    files = {"param": ".param", "bin": ".bin"}
    options = {"threads": 1, "precision": "fp16", "winograd": True}

    def load(self, files: dict[str, Path], inputs: list[Shape] | None) -> Loaded:
        ncnn = self.require()
        if not inputs:
            raise _bad("backend 'ncnn' needs 'inputs' (NCNN files do not record input shapes), e.g. [[1, 3, 224, 224]]")
        precision, winograd = self.settings["precision"], self.settings["winograd"]
        error = ncnn_options_error(precision, winograd)
        if error:
            raise _bad(error)
        net = ncnn.Net()
        net.opt.num_threads = int(self.settings["threads"])  # type: ignore[arg-type]
        configure_ncnn(net.opt, precision, winograd)  # type: ignore[arg-type]
        if net.load_param(str(files["param"])) != 0 or net.load_model(str(files["bin"])) != 0:
            raise _bad("NCNN could not load the uploaded 'param' and 'bin' parts; are they a pnnx-written .param and .bin?")
        names = list(net.input_names())
        if len(names) != len(inputs):
            raise _bad(f"the NCNN model has inputs {names} but the request gives {len(inputs)} shapes in 'inputs'")
        outputs = list(net.output_names())
        if not outputs:
            raise _bad("the NCNN model declares no output blob")
        arrays = _random_inputs([tuple(s[1:]) for s in inputs], [np.dtype(np.float32)] * len(inputs))
        # ncnn.Mat borrows an array's memory: the arrays stay referenced by this closure.
        mats = [ncnn.Mat(a).clone() for a in arrays]

        def run() -> object:
            ex = net.create_extractor()
            for name, m in zip(names, mats):
                ex.input(name, m)
            ret, out = ex.extract(outputs[0])
            if ret != 0:
                raise _bad(f"NCNN failed to run the model (code {ret}); do 'inputs' match the model?")
            return out

        return Loaded(run, [tuple(s) for s in inputs])


@runner("openvino")
class OpenVinoRunner(Runner):
    """OpenVINO's CPU plugin on an IR model (``xml`` + ``bin``), fp32, one stream, latency hint,
    ``threads`` inference threads (as the host's ``openvino`` backend compiles it). With ``count``
    ``reorders``, its performance counters are on and each call's executed nodes but its
    reorders are summed."""

    module = "openvino"
    files = {"xml": ".xml", "bin": ".bin"}
    options = {"threads": 1, "count": "wall"}

    def load(self, files: dict[str, Path], inputs: list[Shape] | None) -> Loaded:
        ov = self.require()
        count = _count(self.settings, ("reorders",), self.name)
        config = {"INFERENCE_NUM_THREADS": int(self.settings["threads"]), "NUM_STREAMS": 1,  # type: ignore[arg-type]
                  "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                  **({"PERF_COUNT": True} if count != "wall" else {})}
        try:
            core = ov.Core()
            model = core.read_model(str(files["xml"]), str(files["bin"]))
            declared = [list(p.get_partial_shape().to_shape()) if p.get_partial_shape().is_static else ["?"]
                        for p in model.inputs]
            shapes = _resolve_shapes(declared, inputs, "OpenVINO model")
            if inputs is not None:
                model.reshape({i: list(s) for i, s in enumerate(shapes)})
            compiled = core.compile_model(model, "CPU", config)
        except AgentRequestError:
            raise
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError for everything
            raise _bad(f"OpenVINO could not load the uploaded 'xml' and 'bin' parts as an IR model: {_short(exc)}") from exc
        request = compiled.create_infer_request()
        dtypes = [np.dtype(p.get_element_type().to_dtype()) for p in compiled.inputs]
        feed = dict(enumerate(_random_inputs(shapes, dtypes)))
        if count == "wall":
            return Loaded(lambda: request.infer(feed), shapes)
        counts: list[float] = []

        def run() -> None:
            request.infer(feed)
            counts.append(openvino_kernel_ms(request.get_profiling_info()))

        return Loaded(run, shapes, lambda: list(counts))


def _short(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + " ..."
