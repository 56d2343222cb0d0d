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


def _tiny_transformer(kind: str) -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    if kind == "vit":
        return timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4,
                                             num_classes=10).eval()
    return timm.models.SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2, 2),
                                       num_heads=(3, 6), num_classes=10).eval()


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_a_transformer_exported_at_the_exporters_default_opset_imports(kind, tmp_path) -> None:
    # torch's exporter writes opset 20 by default, where onnx2torch lacks Shape, Reshape, Split,
    # Pad, ReduceMean and ScatterND of the newest versions, and Gelu: those convert as the older
    # versions they extend; Swin's LayerNorms are sized by their scale (the export leaves their
    # input's shape unknown after a reshape computed at run time).
    import onnx

    model = _tiny_transformer(kind)
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path / f"{kind}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["input"])
    assert onnx.load(str(path)).opset_import[0].version >= 19
    sn = at.compile(path, x, config="[var.global_vars]\nresolution = [32]\n").eval()
    with torch.no_grad():
        assert rel_err(sn(x), model(x)) <= 1e-5


def test_an_operator_using_what_its_older_version_lacks_is_refused(tmp_path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64), "pads")
    graph = helper.make_graph([helper.make_node("Pad", ["input", "pads"], ["output"], mode="wrap", name="wrap")],
                              "g", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 10, 10])],
                              initializer=[pads])
    path = tmp_path / "wrap.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), str(path))
    with pytest.raises(at.ModelLoadError, match="Pad 'wrap' uses what opset 13 lacks"):
        at.compile(path, torch.randn(1, 3, 8, 8))
