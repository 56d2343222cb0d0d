"""INT8 models with ONNX Runtime's own quantizer: static quantization in the QDQ format, weights
per output channel (int8), activations per tensor (uint8), their ranges calibrated on input
batches (min-max). ONNX Runtime runs such a model with its integer kernels (QLinearConv and
the like), converting at the model's input and output only."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

log = logging.getLogger(__name__)

Shape = tuple[int, ...]
RANDOM_BATCHES = 4  # calibration batches of random inputs, where no data is given


def random_batches(input_shapes: Sequence[Shape], n: int = RANDOM_BATCHES) -> list[list[np.ndarray]]:
    """``n`` batches of seeded standard-normal inputs (one array per input): enough to time a
    quantized kernel or SubNet, whose speed does not depend on the ranges; not for accuracy."""
    rng = np.random.default_rng(0)
    return [[rng.standard_normal(s).astype(np.float32) for s in input_shapes] for _ in range(n)]


def quantize_onnx(model: bytes | str | Path, out: str | Path, batches: Iterable[Sequence[np.ndarray]]) -> Path:
    """``model`` (ONNX bytes or file) quantized to INT8 at ``out``, its activation ranges
    calibrated on ``batches`` (each a list of arrays, one per model input, in input order)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    initializers = {i.name for i in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]
    feeds = iter([dict(zip(names, batch)) for batch in batches])

    class _Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(feeds, None)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".int8-") as tmp:
        source = Path(tmp) / "model.onnx"
        # the quantizer's own preparation: shapes inferred, so that every tensor can be quantized
        quant_pre_process(proto, source, skip_optimization=True)
        quantize_static(str(source), str(Path(tmp) / "int8.onnx"), _Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        Path(tmp, "int8.onnx").replace(out)
    return out
