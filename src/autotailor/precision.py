"""Runtime options that are part of a target: NCNN's precisions (which of its options each turns
on) and its Winograd convolution. Standard library only, so that the host's backends and the
torch-free agent configure NCNN the same way."""

from __future__ import annotations

#: NCNN: ``fp16`` is NCNN's default (fp16 weights, blobs and arithmetic on the CPUs and layers
#: that have them, fp32 elsewhere); ``fp32`` turns them off; ``bf16`` stores bf16 where the
#: CPU has it.
NCNN_PRECISIONS: dict[str, dict[str, bool]] = {
    "fp16": {"use_fp16_packed": True, "use_fp16_storage": True, "use_fp16_arithmetic": True, "use_bf16_storage": False},
    "fp32": {"use_fp16_packed": False, "use_fp16_storage": False, "use_fp16_arithmetic": False, "use_bf16_storage": False},
    "bf16": {"use_fp16_packed": False, "use_fp16_storage": False, "use_fp16_arithmetic": False, "use_bf16_storage": True},
}


def ncnn_options_error(precision: object, winograd: object) -> str | None:
    """What is wrong with these NCNN options, or None (callers raise it as their own error)."""
    if precision not in NCNN_PRECISIONS:
        return f"ncnn precision={precision!r} is not allowed; expected one of {list(NCNN_PRECISIONS)}"
    if not isinstance(winograd, bool):
        return f"ncnn winograd={winograd!r} is not allowed; expected true or false"
    return None


def configure_ncnn(opt: object, precision: str = "fp16", winograd: bool = True) -> None:
    """Set an ``ncnn.Option`` for ``precision`` (a key of ``NCNN_PRECISIONS``; ``KeyError``
    otherwise) and ``winograd``. NCNN picks Winograd for 3x3 convolutions by their channels,
    not their size: a 32 px ResNet-18 SubNet, whose last stages run at 2x2 and 1x1, ran 5.3x
    slower with it (docs/latency.md)."""
    for option, on in NCNN_PRECISIONS[precision].items():
        setattr(opt, option, on)
    opt.use_winograd_convolution = winograd
