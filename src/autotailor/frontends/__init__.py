"""Frontends: turn a user's model (module, spec string or ONNX file) into a torch.fx graph."""

from autotailor.frontends.fx_trace import trace, without_fixed_inputs
from autotailor.frontends.onnx_import import import_onnx
from autotailor.frontends.specs import load_model

__all__ = ["trace", "without_fixed_inputs", "import_onnx", "load_model"]
