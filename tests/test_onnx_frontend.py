"""Compiling a model's ONNX export gives the same space and the same SubNets."""

from __future__ import annotations

import random
import warnings

import onnxruntime as ort
import pytest
import torch
import torchvision

import autotailor as at
from autotailor.deploy import export_onnx
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

    assert_same_space(at.compile(model, x).eval(), at.compile(path, x).eval())


def assert_same_space(sn_torch, sn_onnx, renumbered: bool = False) -> None:
    """The same variables with the same choices, and the same outputs for the largest, the
    smallest and two random SubNets. ``renumbered``: the same variables in the same order, their
    blocks numbered otherwise (torchvision's patch merging is one function call in the module,
    its operations in the export)."""
    def names(sn) -> list[str]:
        return [v.name for v in sn.space.variables]

    assert [(v.kind, v.choices) for v in sn_onnx.space.variables] == [
        (v.kind, v.choices) for v in sn_torch.space.variables
    ]
    assert renumbered or names(sn_onnx) == names(sn_torch)
    assert sn_onnx.space.size == sn_torch.space.size
    rng = random.Random(0)
    for arch in [sn_torch.space.max(), sn_torch.space.min(), sn_torch.space.sample(rng), sn_torch.space.sample(rng)]:
        xi = torch.randn(sn_torch.input_shape(arch))
        sn_torch.set_arch(arch)
        sn_onnx.set_arch(dict(zip(names(sn_onnx), (arch[n] for n in names(sn_torch)))))
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
    if kind == "levit":
        from test_transformers import tiny_levit

        return tiny_levit()
    if kind == "maxvit":
        # its products exported as Einsum, its qkv split as three Slices, each attention's position
        # biases folded to one constant (heads, N, N) with as many heads as tokens N in the second stage
        from test_transformers import tiny_maxvit

        return tiny_maxvit().eval()
    if kind == "torchvision_vit":  # nn.MultiheadAttention: exported on (tokens, batch, features)
        from torchvision.models.vision_transformer import VisionTransformer

        return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=48, mlp_dim=96,
                                 num_classes=10).eval()
    if kind.startswith("torchvision_swin"):
        # The shift mask's shape arithmetic stays onnx2torch's modules, which export themselves;
        # V2's cosine attention exports F.normalize as ReduceL2, Clip and Div.
        from torchvision.models import swin_transformer as tv

        v2 = {"block": tv.SwinTransformerBlockV2, "downsample_layer": tv.PatchMergingV2} if kind.endswith("v2") else {}
        return tv.SwinTransformer(patch_size=[4, 4], embed_dim=24, depths=[2, 2], num_heads=[3, 6], window_size=[4, 4],
                                  num_classes=10, **v2).eval()
    if kind == "vit":
        return timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4,
                                             num_classes=10).eval()
    return timm.models.SwinTransformer(img_size=32, patch_size=2, window_size=4, embed_dim=24, depths=(2, 2),
                                       num_heads=(3, 6), num_classes=10).eval()


@pytest.mark.parametrize("kind", ["vit", "torchvision_vit", "swin", "torchvision_swin", "torchvision_swin_v2", "levit", "maxvit"])
@pytest.mark.parametrize("opset", [17, None])
def test_a_transformers_onnx_export_compiles_to_the_same_space(kind, opset, tmp_path) -> None:
    # None: the exporter's default opset (20), where onnx2torch lacks Shape, Reshape, Split, Pad,
    # ReduceMean and ScatterND of the newest versions, and Gelu: those convert as the older
    # versions they extend; Swin's LayerNorms are sized by their scale (the export leaves their
    # input's shape unknown after a reshape computed at run time). The ONNX operators are then
    # written as torch operations, so attention heads, q/k and value widths and the embedding
    # width are found as in the PyTorch module (LeViT's too: its Linear + BatchNorm projections
    # and its attention biases gathered by a table of indices).
    import onnx

    model = _tiny_transformer(kind)
    # torchvision's Swin at 64 px: at 32 its extracted SubNets hold no onnx2torch module
    size = 64 if kind == "levit" or kind.startswith("torchvision_swin") else 32
    x = torch.randn(1, 3, size, size)
    path = tmp_path / f"{kind}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # at the default opset, with the batch left free (dynamic_axes), as exports for serving are
        torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["input"],
                          **({"dynamic_axes": {"input": {0: "batch"}}} if opset is None else {"opset_version": opset}))
    assert onnx.load(str(path)).opset_import[0].version >= (19 if opset is None else opset)
    config = f"[var.global_vars]\nresolution = [{size}]\n"
    sn_onnx = at.compile(path, x, config=config).eval()
    with torch.no_grad():
        assert rel_err(sn_onnx(x), model(x)) <= 1e-5
        if opset is None:  # sizes the export computes from the batch stay computed from it
            x3 = torch.randn(3, 3, size, size)
            assert rel_err(sn_onnx(x3), model(x3)) <= 1e-5
    assert {"heads", "qk", "v", "embedding", "width", "depth"} <= {v.kind for v in sn_onnx.space.variables}
    assert_same_space(at.compile(model, x, config=config).eval(), sn_onnx, renumbered=kind.startswith("torchvision_swin"))
    # and a SubNet of it exports to ONNX again and runs in ONNX Runtime
    arch = sn_onnx.space.sample(random.Random(1))
    sn_onnx.set_arch(arch)
    sub = export_onnx(sn_onnx.extract(arch).eval(), tmp_path / "subnet.onnx", (1, 3, size, size))
    (y,) = ort.InferenceSession(str(sub), providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})
    with torch.no_grad():
        assert rel_err(torch.from_numpy(y), sn_onnx(x)) <= 1e-4


def test_efficientvits_onnx_export_gets_its_linear_attentions_heads(tmp_path) -> None:
    # Its values padded with ones (a Pad with a constant), q, k and v as three slices, the attention
    # computed in float32 (Casts), sizes read for the reshapes. (The small model's blocks parse
    # otherwise from its module and its export, so the spaces are compared by their heads.)
    from test_transformers import tiny_efficientvit

    model, x = tiny_efficientvit(), torch.randn(1, 3, 64, 64)
    path = tmp_path / "efficientvit.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    config = "[var.global_vars]\nresolution = [64]\n"
    sn_onnx, sn_torch = (at.compile(m, x, config=config).eval() for m in (path, model))

    def heads(sn) -> list[tuple]:
        return [v.choices for v in sn.space.variables if v.kind == "heads"]

    assert heads(sn_onnx) == heads(sn_torch) and len(heads(sn_onnx)) == 3
    fewest = {**sn_onnx.space.max(), **{v.name: v.choices[0] for v in sn_onnx.space.variables if v.kind == "heads"}}
    with torch.no_grad():
        assert rel_err(sn_onnx(x), model(x)) <= 1e-5
        sn_onnx.set_arch(fewest)
        net = sn_onnx.extract(fewest).eval()
        assert rel_err(net(x), sn_onnx(x)) <= 1e-5 and rel_err(net(x), model(x)) > 1e-3
    sub = export_onnx(net, tmp_path / "subnet.onnx", (1, 3, 64, 64))
    (y,) = ort.InferenceSession(str(sub), providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})
    assert rel_err(torch.from_numpy(y), net(x).detach()) <= 1e-4


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
