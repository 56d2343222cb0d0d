"""Trace a torch.nn.Module into a torch.fx GraphModule, with errors a user can act on."""

from __future__ import annotations

import inspect
import logging
from typing import Callable

import torch
import torch.fx as fx

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


def trace(model: torch.nn.Module) -> fx.GraphModule:
    """Symbolically trace ``model`` in eval mode.

    Tracing in eval mode fixes Python-level branches such as ``if self.training`` to their
    inference path, which is the function the SuperNet must reproduce. A submodule or a public
    library function whose code torch.fx cannot follow (control flow on sizes or values: timm's
    EfficientViT and MobileViT, its position-embedding resampling) is kept whole, as one
    operator AutoTailor calls but does not resize, and tracing starts again; the model's own
    code failing is a ``TraceError`` that names the construct.
    """
    if isinstance(model, fx.GraphModule):
        return model
    was_training = model.training
    model.eval()
    opaque: set[str] = set()
    functions: list[Callable] = []
    names = {id(m): name for name, m in model.named_modules() if name}
    try:
        while True:
            tracer = _Tracer(frozenset(opaque), tuple(functions))
            try:
                graph = tracer.trace(model, concrete_args=_defaults(model))
            except Exception as exc:  # torch.fx raises many types (TraceError, TypeError, ...)
                culprit = _culprit(exc, names)
                if culprit is None or culprit in opaque or culprit in functions or \
                        len(opaque) + len(functions) >= MAX_OPAQUE:
                    raise TraceError(_explain(model, exc)) from exc
                (opaque.add if isinstance(culprit, str) else functions.append)(culprit)
                continue
            kept = sorted(opaque) + [f"{f.__module__}.{f.__name__}()" for f in functions]
            if kept:
                log.warning("torch.fx cannot trace into %s; kept whole (not resized): %s", type(model).__name__,
                            ", ".join(kept))
            return without_fixed_inputs(fx.GraphModule(tracer.root, graph, type(model).__name__))
    finally:
        model.train(was_training)


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
