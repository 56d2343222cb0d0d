"""timm models and every form of model spec compile like torchvision's."""

from __future__ import annotations

import random

import pytest
import timm
import torch

import autotailor as at
from conftest import rel_err, well_conditioned

TIMM = [
    ("resnet18", {"depth", "width", "resolution"}),
    ("efficientnet_b0", {"depth", "width", "kernel", "resolution"}),  # BatchNormAct2d, functional BN
    ("convnext_atto", {"depth", "width", "kernel", "resolution"}),  # identity-module shortcuts
    ("vit_tiny_patch16_224", {"depth", "width", "heads", "qk", "v", "embedding"}),  # optional attn_mask input; fixed resolution
]


@pytest.mark.parametrize("name,kinds", TIMM, ids=[t[0] for t in TIMM])
def test_timm_models(name: str, kinds: set[str]) -> None:
    torch.manual_seed(0)
    model = well_conditioned(timm.create_model(name, pretrained=False))
    x = torch.randn(1, 3, 224, 224)
    sn = at.compile(model, x).eval()
    assert {v.kind for v in sn.space.variables} == kinds
    with torch.no_grad():
        assert rel_err(model(x), sn(x)) <= 1e-4
        for arch in (sn.space.min(), sn.space.sample(random.Random(0))):
            sn.set_arch(arch)
            xi = torch.randn(sn.input_shape(arch))
            assert rel_err(sn(xi), sn.extract(arch).eval()(xi)) <= 1e-5


@pytest.mark.parametrize("spec", ["timm:resnet18", "torchvision:resnet18", "torchvision.models:resnet18"])
def test_every_spec_form_gives_the_same_space(spec: str) -> None:
    sn = at.compile(spec, torch.zeros(1, 3, 64, 64))
    ref = at.compile("torchvision:resnet18", torch.zeros(1, 3, 64, 64))
    assert [(v.name, v.choices) for v in sn.space.variables] == [(v.name, v.choices) for v in ref.space.variables]
    assert sn(torch.randn(2, 3, 64, 64)).shape == (2, 1000)
