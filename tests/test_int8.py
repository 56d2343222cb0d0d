"""INT8 as part of a target: ONNX Runtime's own quantizer for kernels, SubNets and exports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torchvision

import autotailor as at
from autotailor.counters import ort_kernel_ms, ort_own_node
from autotailor.predict.latency import make_backend, parse_device
from autotailor.testing import well_conditioned


def _ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def test_precision_is_checked_and_is_part_of_the_target() -> None:
    with pytest.raises(at.LatencyError, match=r"ort-cpu precision='fp16' is not allowed; expected one of \('fp32', 'int8'\)"):
        make_backend("ort-cpu", precision="fp16")
    name, settings = parse_device("ort-cpu:threads=1,precision=int8")
    int8, fp32 = make_backend(name, **settings), make_backend("ort-cpu", threads=1)
    assert int8.settings["precision"] == "int8" and "precision" not in fp32.settings  # fp32 tables keep their key
    assert int8.quantized and not fp32.quantized


def test_int8_kernels_are_timed_as_inside_a_model(tmp_path) -> None:
    """A kernel alone quantizes its input, dequantizes its output and transposes both for the
    integer kernels; only its own nodes count. Both sums come from one profile of the kernel
    file, so the comparison holds whatever the machine's load."""
    backend = make_backend("ort-cpu", threads=1, precision="int8", warmup=3, repeats=20)
    kernel = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()).eval()
    shape = (1, 32, 28, 28)
    path = backend.kernel_file(kernel, [shape], tmp_path / "kernel")
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= _ops(path)
    assert backend.count == "own" and backend.measure(kernel, shape).median_ms > 0
    opts = backend.session_options()
    opts.enable_profiling, opts.profile_file_prefix = True, str(tmp_path / "profile")
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    for _ in range(13):
        sess.run(None, feed)
    events = json.loads(Path(sess.end_profiling()).read_text())
    own, every = (ort_kernel_ms(events, 3, 0.0, rule) for rule in (ort_own_node, lambda e: True))
    assert len(own) == len(every) == 10
    assert all(0 < o < e for o, e in zip(own, every)), (own, every)
    converted = {e["args"]["op_name"] for e in events if e.get("cat") == "Node" and not ort_own_node(e)}
    assert "QuantizeLinear" in converted or "DynamicQuantizeLinear" in converted, converted


def test_int8_subnets_compute_what_the_fp32_ones_do(tmp_path) -> None:
    torch.manual_seed(0)
    sn = at.compile(well_conditioned(torchvision.models.resnet18(num_classes=10)), torch.zeros(1, 3, 32, 32))
    arch = sn.space.complete(sn.space.sample(3))
    net = sn.extract(arch).eval()
    shape = tuple(sn.input_shape(arch))
    images = torch.randn((64, *shape[1:]), generator=torch.Generator().manual_seed(1))
    int8, fp32 = make_backend("ort-cpu", precision="int8"), make_backend("ort-cpu")
    calibrated = int8.deploy(net, tmp_path / "int8", shape, [images[:32].numpy()])
    plain = fp32.deploy(net, tmp_path / "fp32", shape)
    assert "QuantizeLinear" in _ops(calibrated) and "QuantizeLinear" not in _ops(plain)
    x = images[32:].numpy()
    with torch.no_grad():
        ref = net(images[32:]).numpy()
    assert np.abs(fp32.run_file(plain, x) - ref).max() <= 1e-4 * np.abs(ref).max()
    y = int8.run_file(calibrated, x)
    cosine = (y * ref).sum(1) / np.linalg.norm(y, axis=1) / np.linalg.norm(ref, axis=1)
    assert cosine.min() > 0.95, cosine.min()  # quantization error, not a different model
    assert (y.argmax(1) == ref.argmax(1)).mean() >= 0.75
