"""How a SubNet file of one format becomes something that runs: one registered loader per format.

ONNX (through ONNX Runtime's CPU provider) is built in. A format is one class::

    @register_loader("openvino")
    class OpenVinoLoader(Loader):
        options = ("precision",)

        def load(self, path, entry, threads):
            ...  # return an object with run(x) -> np.ndarray and close()

Loaders import their runtime inside ``load`` so that importing this module costs nothing and
needs neither torch nor the runtimes of formats a bundle does not use.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

import numpy as np

from autotailor.errors import ServingError

if TYPE_CHECKING:
    from autotailor.runtime.bundle import SubNetEntry


class Session(Protocol):
    """A loaded SubNet."""

    def run(self, x: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


class Loader:
    """Loads the files of one format. ``options`` names the manifest entry's ``options`` keys it reads."""

    format: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()

    def check(self, options: Mapping[str, Any]) -> str | None:
        """What is wrong with a manifest entry's ``options`` (None: nothing)."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            return f"has {unknown} that the {self.format} loader does not take (it takes {list(self.options)})"
        return None

    def load(self, path: Path, entry: "SubNetEntry", threads: int) -> Session:
        raise NotImplementedError


_LOADERS: dict[str, type[Loader]] = {}


def register_loader(fmt: str):
    """Class decorator: ``@register_loader("onnx")`` makes the class load the files of ``fmt``."""

    def deco(cls: type[Loader]) -> type[Loader]:
        cls.format = fmt
        _LOADERS[fmt] = cls
        return cls

    return deco


def formats() -> tuple[str, ...]:
    """The formats a bundle may name."""
    return tuple(sorted(_LOADERS))


def loader_for(fmt: str) -> Loader:
    try:
        return _LOADERS[fmt]()
    except KeyError:
        raise ServingError(f"no loader for format {fmt!r}; registered: {list(formats())} "
                           "(a new format is one @register_loader class)") from None


class _OnnxSession:
    def __init__(self, sess: Any):
        self._sess = sess
        self._input = sess.get_inputs()[0].name
        self._output = sess.get_outputs()[0].name

    def run(self, x: np.ndarray) -> np.ndarray:
        return self._sess.run([self._output], {self._input: x})[0]

    def close(self) -> None:
        self._sess = None


@register_loader("onnx")
class OnnxLoader(Loader):
    """ONNX Runtime, CPU execution provider, ``threads`` intra-op threads and one inter-op thread.
    ``options.optimization``: ``basic``, ``extended`` or ``all`` (default), the graph optimisation
    level, which must be the one the SubNet's latency was measured at (the ``ort-cpu`` backend's
    ``optimization``)."""

    options = ("optimization",)
    LEVELS = ("basic", "extended", "all")

    def check(self, options: Mapping[str, Any]) -> str | None:
        problem = super().check(options)
        if problem is None and options.get("optimization", "all") not in self.LEVELS:
            problem = f"optimization must be one of {list(self.LEVELS)} (found {options['optimization']!r})"
        return problem

    def load(self, path: Path, entry: "SubNetEntry", threads: int) -> Session:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = {
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[entry.options.get("optimization", "all")]
        try:
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/... types
            raise ServingError(f"ONNX Runtime cannot load SubNet {entry.name!r} from {path}: {exc}") from exc
        return _OnnxSession(sess)
