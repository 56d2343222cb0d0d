"""Compiling a model's ONNX export gives the same space and the same SubNets."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
import torchvision

import autotailor as at
from conftest import rel_err, well_conditioned


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "convnext_tiny"])
def test_onnx_export_compiles_to_the_same_space(name: str, tmp_path) -> None:
    torch.manual_seed(0)
    model = well_conditioned(torchvision.models.get_model(name, weights=None))
    x = torch.randn(1, 3, 64, 64)
    path = tmp_path / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)

    sn_torch = at.compile(model, x).eval()
    sn_onnx = at.compile(path, x).eval()
    assert [(v.name, v.kind, v.choices) for v in sn_onnx.space.variables] == [
        (v.name, v.kind, v.choices) for v in sn_torch.space.variables
    ]
    assert sn_onnx.space.size == sn_torch.space.size
    rng = random.Random(0)
    for arch in [sn_torch.space.max(), sn_torch.space.min(), sn_torch.space.sample(rng), sn_torch.space.sample(rng)]:
        xi = torch.randn(sn_torch.input_shape(arch))
        sn_torch.set_arch(arch)
        sn_onnx.set_arch(arch)
        with torch.no_grad():
            assert rel_err(sn_torch(xi), sn_onnx(xi)) <= 1e-4


def test_onnx_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(at.ModelLoadError, match="ONNX file not found: .*missing.onnx"):
        at.compile(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(at.ModelLoadError, match="is not a valid ONNX model"):
        at.compile(bad)
