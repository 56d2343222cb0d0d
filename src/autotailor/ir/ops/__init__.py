"""The operator handlers AutoTailor ships, one module per operator family (see ``ir.handlers``).
Importing this package registers them."""

from autotailor.ir.ops import attention, conv, elementwise, linear, norm, onnx, timm  # noqa: F401
