"""Trace a torch.nn.Module into a torch.fx GraphModule, with errors a user can act on."""

from __future__ import annotations

import inspect
import logging
import math
import operator
from typing import Callable

import torch
import torch.fx as fx
from torch.fx._symbolic_trace import _maybe_revert_all_patches, _wrapped_fns_to_patch  # torch.fx's own state

from autotailor.errors import TraceError

log = logging.getLogger(__name__)


MAX_OPAQUE = 64  # submodules kept whole before tracing gives up


class _Tracer(fx.Tracer):
    """torch.fx's tracer, with some submodules and functions kept whole (called, not traced into)."""

    # Defaults: unpickling a traced model makes one without arguments.
    def __init__(self, opaque: frozenset[str] = frozenset(), functions: tuple[Callable, ...] = ()):
        super().__init__(autowrap_functions=functions)
        self.opaque = opaque

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return qualname in self.opaque or super().is_leaf_module(m, qualname)


class _ConcreteTracer(_Tracer):
    """A tracer that also runs the model on an example input, node by node, so that Python
    control flow on sizes (``if pad_h > 0``, ``math.ceil(H / p)``, a device's type) takes the
    example's branch instead of stopping the trace, as torch.export specialises a program to
    its example. Sizes stay symbolic in the graph (another batch size or resolution computes
    its own); every branch taken on a size becomes a ``torch._assert`` in the graph, so an input
    that would take the other branch fails loudly instead of computing something else. Branches
    on tensor values are refused: they depend on the image, not on its size. Functions a
    library marked with ``torch.fx.wrap`` (torchvision's ``shifted_window_attention``) are traced
    into, since their layers' weights would otherwise be out of reach."""

    def __init__(self, example: torch.Tensor, opaque: frozenset[str] = frozenset(),
                 functions: tuple[Callable, ...] = ()):
        super().__init__(opaque, functions)
        self.example = example
        self.kept_whole = functions
        self.values: dict[fx.Node, object] = {}
        self.guards = 0

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ConcreteProxy(node, self)

    def trace(self, root, concrete_args=None) -> fx.Graph:
        graph = super().trace(root, concrete_args)
        for node in graph.nodes:  # torch.fx marked the last node of each function traced into as the call
            if node.meta.get("is_wrapped") and not (_wrapped_by_library(node.target) or node.target in self.kept_whole):
                del node.meta["is_wrapped"]
        return graph

    def value(self, a: object) -> object:
        return fx.node.map_aggregate(a, lambda v: self.values[v.node] if isinstance(v, fx.Proxy) else v)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        if kind == "call_function" and _wrapped_by_library(target) and target not in self.kept_whole:
            return target(*args, **kwargs)  # traced into: its calls come back here as nodes
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if kind == "output":
            return proxy
        with _maybe_revert_all_patches():  # run the real code, not the tracer's patched calls
            self.values[proxy.node] = self._run(kind, target, self.value(args), self.value(kwargs))
        return proxy

    def _run(self, kind: str, target, a: tuple, kw: dict) -> object:
        if kind == "placeholder":
            return self.example.clone() if not self.values else (a[0] if a else None)
        if kind == "get_attr":
            return operator.attrgetter(target)(self.root)
        if kind == "call_module":
            return self.root.get_submodule(target)(*a, **kw)
        if kind == "call_method":
            return getattr(a[0], target)(*a[1:], **kw)
        return target(*a, **kw)

    def to_bool(self, obj: fx.Proxy) -> bool:
        value = self.values[obj.node]
        if isinstance(value, torch.Tensor):
            raise TraceError("control flow on a tensor's values: it depends on the image, not on its size")
        taken = bool(value)
        self.guards += 1
        condition = obj if taken else self.create_proxy("call_function", operator.not_, (obj,), {})
        self.create_proxy("call_function", torch._assert,
                          (condition,
                           f"the traced model took one branch at the compiled input size ({obj.node.name} is "
                           f"{taken}); this input takes the other"), {})
        return taken

    def iter(self, obj: fx.Proxy):
        value = self.values[obj.node]
        if isinstance(value, torch.Tensor):
            raise TraceError("iteration over a tensor: its length is a size of the input")
        return iter([obj[i] for i in range(len(value))])


class _ConcreteProxy(fx.Proxy):
    """A proxy whose attributes that are not numbers or tensors (a device, a dtype, a flag) are
    plain values, and which rounds and measures like the number or tuple it stands for."""

    def __getattr__(self, k: str):
        value = getattr(self.tracer.values[self.node], k)
        if callable(value):
            return fx.proxy.Attribute(self, k)  # a method call, recorded as one node
        if isinstance(value, (torch.Tensor, int, float, tuple, list)) and not isinstance(value, bool):
            return self.tracer.create_proxy("call_function", getattr, (self, k), {})
        return value

    def __len__(self) -> int:
        value = self.tracer.values[self.node]
        if isinstance(value, torch.Tensor):
            raise TraceError("len() of a tensor: its length is a size of the input")
        return len(value)

    def __setitem__(self, key, value) -> None:  # torchvision's Swin builds its shift mask so
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    def __ceil__(self):
        return self.tracer.create_proxy("call_function", math.ceil, (self,), {})

    def __floor__(self):
        return self.tracer.create_proxy("call_function", math.floor, (self,), {})


def _wrapped_by_library(fn: object) -> bool:
    """Whether ``fn`` is a function some library registered with ``torch.fx.wrap`` (torch.fx's
    registry is keyed by the function's module globals and name)."""
    return inspect.isfunction(fn) and (id(fn.__globals__), fn.__name__) in _wrapped_fns_to_patch


def trace(model: torch.nn.Module, example: torch.Tensor | None = None) -> fx.GraphModule:
    """Symbolically trace ``model`` in eval mode.

    Tracing in eval mode fixes Python-level branches such as ``if self.training`` to their
    inference path, which is the function the SuperNet must reproduce. A submodule or a public
    library function whose code torch.fx cannot follow (control flow on sizes or values) is
    kept whole, as one operator AutoTailor calls but does not resize, and tracing starts again;
    the model's own code failing is a ``TraceError`` that names the construct. Where what is
    kept whole holds layers (timm's EfficientViT and MobileViT attention, torchvision's Swin
    attention, one ``torch.fx.wrap``ped function), the model is traced again running on
    ``example``, its branches on sizes taken as at the example's size and guarded
    (``_ConcreteTracer``), so that those layers can be resized too.
    """
    if isinstance(model, fx.GraphModule):
        return model
    was_training = model.training
    model.eval()
    try:
        try:
            gm, hidden = _trace(model, None)
        except TraceError:
            if example is None:
                raise
            return _trace(model, example)[0]  # the model's own code branches on a size
        if example is None or not hidden:
            return gm
        try:
            concrete, _ = _trace(model, example)
        except TraceError as exc:
            log.warning("%s; its layers inside %s are kept whole", exc, ", ".join(hidden))
            return gm
        return concrete
    finally:
        model.train(was_training)


def _trace(model: torch.nn.Module, example: torch.Tensor | None) -> tuple[fx.GraphModule, list[str]]:
    """The traced graph, plain (``example`` None) or running on ``example``, and what it keeps
    whole that holds layers."""
    opaque: set[str] = set()
    functions: list[Callable] = []
    names = {id(m): name for name, m in model.named_modules() if name}
    while True:
        tracer = (_ConcreteTracer(example, frozenset(opaque), tuple(functions)) if example is not None
                  else _Tracer(frozenset(opaque), tuple(functions)))
        try:
            with torch.no_grad():
                graph = tracer.trace(model, concrete_args=_defaults(model))
        except Exception as exc:  # torch.fx raises many types (TraceError, TypeError, ...)
            culprit = _culprit(exc, names)
            if culprit is None or culprit in opaque or culprit in functions or \
                    len(opaque) + len(functions) >= MAX_OPAQUE:
                raise TraceError(_explain(model, exc)) from exc
            (opaque.add if isinstance(culprit, str) else functions.append)(culprit)
            continue
        kept = sorted(opaque) + [f"{f.__module__}.{f.__name__}()" for f in functions]
        hidden = [q for q in sorted(opaque) if any(True for _ in model.get_submodule(q).parameters())] + [
            f"{n.target.__module__}.{n.target.__name__}()" for n in graph.nodes
            if n.op == "call_function" and (n.target in functions or _wrapped_by_library(n.target))
            and any(a.op == "get_attr" for a in n.all_input_nodes)]
        if kept and (example is not None or not hidden):
            log.warning("torch.fx cannot trace into %s; kept whole (not resized): %s", type(model).__name__,
                        ", ".join(kept))
        if example is not None:
            log.info("traced %s running on its example input: %d branch(es) on sizes taken as at %s",
                     type(model).__name__, tracer.guards, tuple(example.shape))
        return without_fixed_inputs(fx.GraphModule(tracer.root, graph, type(model).__name__)), hidden


def _culprit(exc: BaseException, names: dict[int, str]) -> str | Callable | None:
    """What was running, innermost, when ``exc`` was raised: a module-level function of the
    model's library (timm's ``resample_abs_pos_embed``), or the qualified name of a submodule
    whose ``forward`` was; None if only the model's own code was."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        fn = frame.f_globals.get(frame.f_code.co_name)
        if isinstance(owner, torch.nn.Module) and id(owner) in names:
            found = names[id(owner)]
        elif getattr(fn, "__code__", None) is frame.f_code and not _ours(frame.f_code.co_filename):
            found = fn
        tb = tb.tb_next
    return found


def _ours(filename: str) -> bool:
    """Code of torch or AutoTailor, never kept whole (the tracer's own frames)."""
    return "/torch/" in filename or "autotailor" in filename


def _defaults(model: torch.nn.Module) -> dict[str, object] | None:
    """Every argument of ``forward`` after the image that has a default, fixed to it.

    Left symbolic, an optional argument (timm's ``attn_mask=None, is_causal=False``) becomes a
    graph input that every block reads: blocks could not be dropped, and exports would pass a
    tensor where the model expects a bool.
    """
    params = list(inspect.signature(model.forward).parameters.values())[1:]
    fixed = {p.name: p.default for p in params
             if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD}
    return fixed or None


_GUARDS = {"_assert", "_assert_is_none", "eq"}


def without_fixed_inputs(gm: fx.GraphModule) -> fx.GraphModule:
    """The graph with one input: torch.fx keeps a fixed argument as an input that only guards
    (``torch._assert(arg == value)``, ``_assert_is_none(arg)``) read; exporters cannot pass it,
    so it goes with its guards."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes)[1:]:
        if node.op != "placeholder":
            continue
        reach, stack = set(), [node]
        while stack:
            for u in stack.pop().users:
                if u not in reach:
                    reach.add(u)
                    stack.append(u)
        if all(u.op == "call_function" and getattr(u.target, "__name__", "") in _GUARDS for u in reach):
            for n in sorted(reach, key=order.__getitem__, reverse=True):
                gm.graph.erase_node(n)
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm


def _explain(model: torch.nn.Module, exc: Exception) -> str:
    """Name the construct that stopped tracing and say how to get around it."""
    where = _innermost_frame(exc)
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    hint = (
        "torch.fx cannot follow Python control flow that depends on tensor values "
        "(if/for/while on a tensor, .item(), len() of a tensor) or unsupported constructs. "
        "Move that code into a leaf module, wrap the function with torch.fx.wrap, "
        "or export the model to ONNX and compile the .onnx file instead."
    )
    return (
        f"could not trace {type(model).__name__}: {type(exc).__name__}: {msg}"
        + (f" (at {where})" if where else "")
        + f". {hint}"
    )


def _innermost_frame(exc: BaseException) -> str:
    tb = exc.__traceback__
    last = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if "torch/fx" not in code.co_filename and "autotailor" not in code.co_filename:
            last = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return last or ""
