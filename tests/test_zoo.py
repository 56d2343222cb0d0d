"""Every torchvision classification family compiles; the largest SubNet is the original model;
extracted SubNets equal the SuperNet and run in ONNX Runtime."""

from __future__ import annotations

import random
import shutil

import pytest
import torch
import torchvision

import autotailor as at
from autotailor.deploy import export_onnx, run_onnx
from conftest import rel_err, well_conditioned

# One model per family, at the smallest input each accepts quickly (ViT and MaxViT need 224).
FAMILIES = [
    ("resnet18", 64, "BasicBlock"),
    ("resnext50_32x4d", 64, "BottleneckBlock"),
    ("wide_resnet50_2", 64, "BottleneckBlock"),
    ("mobilenet_v2", 64, "InvertedResidualBlock"),
    ("mobilenet_v3_large", 64, "InvertedResidualSEBlock"),
    ("efficientnet_b0", 64, "InvertedResidualSEBlock"),
    ("efficientnet_v2_s", 64, "InvertedResidualSEBlock"),
    ("mnasnet0_5", 64, "InvertedResidualBlock"),
    ("regnet_y_400mf", 64, "BottleneckBlock"),
    ("shufflenet_v2_x0_5", 64, "BranchBlock"),
    ("squeezenet1_1", 64, "BranchBlock"),
    ("densenet121", 64, "BranchBlock"),
    ("googlenet", 64, "BranchBlock"),
    ("inception_v3", 96, "BranchBlock"),
    ("vgg11", 96, "ChainBlock"),
    ("alexnet", 96, "ChainBlock"),
    ("convnext_tiny", 64, "ConvNeXtBlock"),
    ("vit_b_32", 224, "AttentionBlock"),
    ("swin_t", 64, "AttentionBlock"),
    ("maxvit_t", 224, "AttentionBlock"),
]


@pytest.mark.parametrize("name,size,template", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_family_compiles_and_reproduces(name: str, size: int, template: str, tmp_path) -> None:
    torch.manual_seed(0)
    model = well_conditioned(torchvision.models.get_model(name, weights=None))
    x = torch.randn(2, 3, size, size)
    sn = at.compile(model, x).eval()
    assert template in set(sn.block_templates.values())
    assert sn.space.size >= 2 and sn.space.num_modifications >= 1

    with torch.no_grad():
        ref = model(x)
        assert rel_err(ref, sn(x)) <= 1e-4, "the largest SubNet must be the original model"

    rng = random.Random(1)
    for i, arch in enumerate([sn.space.sample(rng), sn.space.min(), sn.space.sample(rng)]):
        sn.set_arch(arch)
        xi = torch.randn(sn.input_shape(arch))
        net = sn.extract(arch).eval()
        with torch.no_grad():
            y_sn, y_net = sn(xi), net(xi)
        assert y_net.shape == (1, ref.shape[1])
        assert rel_err(y_sn, y_net) <= 1e-5
        if i == 0:
            path = export_onnx(net, tmp_path / f"{name}.onnx", tuple(xi.shape))
            assert rel_err(y_net, torch.from_numpy(run_onnx(path, xi))) <= 1e-4
            for f in tmp_path.iterdir():  # VGG and AlexNet export hundreds of MB
                shutil.rmtree(f) if f.is_dir() else f.unlink()
