"""Trace a torch.nn.Module into a torch.fx GraphModule, with errors a user can act on."""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from autotailor.errors import TraceError

log = logging.getLogger(__name__)


def trace(model: torch.nn.Module) -> fx.GraphModule:
    """Symbolically trace ``model`` in eval mode.

    Tracing in eval mode fixes Python-level branches such as ``if self.training`` to their
    inference path, which is the function the SuperNet must reproduce.
    """
    if isinstance(model, fx.GraphModule):
        return model
    was_training = model.training
    model.eval()
    try:
        return fx.symbolic_trace(model)
    except Exception as exc:  # torch.fx raises many types (TraceError, TypeError, ...)
        raise TraceError(_explain(model, exc)) from exc
    finally:
        model.train(was_training)


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
