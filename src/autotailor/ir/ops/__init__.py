"""The operator handlers AutoTailor ships, one module per operator family (see ``ir.handlers``).
Importing this package registers them."""

from autotailor.ir.ops import attention, conv, elementwise, linear, linear_attention, norm, onnx, timm  # noqa: F401
