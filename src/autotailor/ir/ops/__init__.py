"""The operator handlers AutoTailor ships, one module per operator family (see ``ir.handlers``).
Importing this package registers them."""

# attention_pattern's rewrite registers ahead of linear_attention's, which reuses its helpers.
from autotailor.ir.ops import (attention, attention_pattern, conv, elementwise, head_projections, linear,  # noqa: F401
                               linear_attention, norm, onnx, timm)
