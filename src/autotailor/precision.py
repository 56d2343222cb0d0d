"""Runtimes' precisions: which of a runtime's options each turns on. Standard library only, so
that the host's backends and the torch-free agent share one table."""

from __future__ import annotations

#: NCNN: ``fp16`` is NCNN's default (fp16 weights, blobs and arithmetic on the CPUs and layers
#: that have them, fp32 elsewhere); ``fp32`` turns them off; ``bf16`` stores bf16 where the
#: CPU has it.
NCNN_PRECISIONS: dict[str, dict[str, bool]] = {
    "fp16": {"use_fp16_packed": True, "use_fp16_storage": True, "use_fp16_arithmetic": True, "use_bf16_storage": False},
    "fp32": {"use_fp16_packed": False, "use_fp16_storage": False, "use_fp16_arithmetic": False, "use_bf16_storage": False},
    "bf16": {"use_fp16_packed": False, "use_fp16_storage": False, "use_fp16_arithmetic": False, "use_bf16_storage": True},
}


def set_ncnn_precision(opt: object, precision: str) -> None:
    """Set an ``ncnn.Option`` for ``precision`` (a key of ``NCNN_PRECISIONS``; ``KeyError`` otherwise)."""
    for option, on in NCNN_PRECISIONS[precision].items():
        setattr(opt, option, on)
