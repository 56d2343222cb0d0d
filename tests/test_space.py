"""The space: exact size, sampling, validation, and the sizes of the paper's spaces."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
import torch.nn as nn
import torchvision

import autotailor as at


class TinyResNet(nn.Module):
    """Two stages of residual blocks, small enough to enumerate every SubNet."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.s1 = nn.ModuleList([self._block(8) for _ in range(3)])
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.s2 = nn.ModuleList([self._block(16) for _ in range(2)])
        self.fc = nn.Linear(16, 5)

    @staticmethod
    def _block(c: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c, 2 * c, 1), nn.BatchNorm2d(2 * c), nn.ReLU(),
                             nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c), nn.ReLU(),
                             nn.Conv2d(2 * c, c, 1), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.s1:
            x = x + b(x)
        x = self.down(x)
        for b in self.s2:
            x = x + b(x)
        return self.fc(x.mean((2, 3)))


CONFIG = """
[var.global_vars]
resolution = [16, 24]
width_ratio = [1.0]
[var.stage_vars]
reduce_depth = [-2, -1, 0]
width_ratio = [0.5, 1.0]
[var.block_vars]
InvertedResidualBlock.expand_ratio = [0.5, 1.0]
"""


def _signature(net: torch.nn.Module, resolution: int) -> tuple:
    """What makes two SubNets the same network: input size, layer shapes and their order."""
    return (resolution,) + tuple((n, tuple(p.shape)) for n, p in net.named_parameters())


def test_size_counts_exactly_the_distinct_subnets() -> None:
    torch.manual_seed(0)
    sn = at.compile(TinyResNet(), torch.randn(1, 3, 24, 24), config=CONFIG)
    variables = sn.space.variables
    kinds = sorted({v.kind for v in variables})
    assert kinds == ["depth", "resolution", "width"]
    seen, canonical, keys = set(), {}, {}
    for values in itertools.product(*(v.choices for v in variables)):
        arch = dict(zip((v.name for v in variables), values))
        signature = _signature(sn.extract(arch), arch["resolution"])
        seen.add(signature)
        # archs with one canonical form are one network, and there are as many forms as networks;
        # so with one key (what caches and the search's records key on)
        assert canonical.setdefault(json.dumps(sn.space.canonical(arch), sort_keys=True), signature) == signature
        assert keys.setdefault(sn.space.key(arch), signature) == signature
    assert sn.space.size == len(seen) == len(canonical) == len(keys)
    product = 1
    for v in variables:
        product *= len(v.choices)
    assert sn.space.size < product  # dropped blocks' own choices are not counted twice
    assert sn.space.num_modifications == sum(len(v.choices) - 1 for v in variables)


def test_sample_is_seeded_json_and_valid() -> None:
    sn = at.compile(TinyResNet(), torch.randn(1, 3, 24, 24), config=CONFIG)
    a, b = sn.space.sample(random.Random(3)), sn.space.sample(random.Random(3))
    assert a == b
    assert json.loads(json.dumps(a)) == a
    assert sn.space.complete(a) == a
    assert sn.space.min() != sn.space.max()
    assert all(sn.space.max()[v.name] == max(v.choices) for v in sn.space.variables)


def test_bad_archs_are_refused_with_the_allowed_values() -> None:
    sn = at.compile(TinyResNet(), torch.randn(1, 3, 24, 24), config=CONFIG)
    with pytest.raises(at.ArchError, match=r"resolution = 20 is not a choice; allowed: \[16, 24\]"):
        sn.set_arch({"resolution": 20})
    with pytest.raises(at.ArchError, match="unknown variable"):
        sn.set_arch({"nope": 1})


def test_save_and_load_roundtrip(tmp_path) -> None:
    torch.manual_seed(0)
    sn = at.compile(TinyResNet(), torch.randn(1, 3, 24, 24), config=CONFIG).eval()
    arch = sn.space.sample(5)
    sn.save(tmp_path / "sn.pt")
    sn2 = at.load(tmp_path / "sn.pt").eval()
    x = torch.randn(1, *sn.input_shape(arch)[1:])
    sn.set_arch(arch)
    sn2.set_arch(arch)
    assert torch.equal(sn(x), sn2(x))
    assert sn2.space.size == sn.space.size
    # a file saved before the space cached its depth variables (the attribute absent) keys alike
    short = {**arch, **{v.name: v.choices[0] for v in sn.space.variables if v.kind == "depth"}}
    key = sn.space.key(sn.space.complete(short))
    vars(sn.space).pop("_depths")
    sn.save(tmp_path / "old.pt")
    old = at.load(tmp_path / "old.pt").space
    assert "_depths" not in vars(old)
    assert old.key(old.complete(short)) == key != old.key(old.max())
    with pytest.raises(at.AutoTailorError, match="no SuperNet file"):
        at.load(tmp_path / "missing.pt")


RICH = """
[var.global_vars]
resolution = [128, 144, 160, 176, 192, 208, 224]
[var.stage_vars]
width_ratio = [0.5, 0.625, 0.75, 0.875, 1.0]
[var.block_vars]
InvertedResidualBlock.expand_ratio = [0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
InvertedResidualSEBlock.expand_ratio = [0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
InvertedResidualSEBlock.kernel_size = [3, 5]
ConvNeXtBlock.expand_ratio = [0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]
ConvNeXtBlock.kernel_size = [3, 5, 7]
"""


@pytest.mark.parametrize("name,default_min,rich_min", [
    ("resnet50", 1e13, 1e13),
    ("mobilenet_v2", 1e10, 1e10),
    ("mobilenet_v3_large", 1e13, 1e22),
    ("convnext_tiny", 1e17, 1e23),
])
def test_spaces_as_rich_as_the_paper(name: str, default_min: float, rich_min: float) -> None:
    """The paper's Table 3: ResNet-50 2e13, MobileNetV2 8e10, MobileNetV3 7e22, ConvNeXt-T 2e23."""
    model = torchvision.models.get_model(name, weights=None)
    x = torch.zeros(1, 3, 224, 224)
    default, rich = at.compile(model, x).space, at.compile(model, x, config=RICH).space
    assert default.size >= default_min, f"default space 10^{default.log10_size:.1f}"
    assert rich.size >= rich_min, f"configured space 10^{rich.log10_size:.1f}"
