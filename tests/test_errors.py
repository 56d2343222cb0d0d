"""Bad input gets an error that says what is wrong."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autotailor as at


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if x.sum() > 0:  # control flow on a tensor value: not traceable
            x = x * 2
        return self.fc(x.mean((2, 3)))


class Segmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_untraceable_model_names_the_construct() -> None:
    with pytest.raises(at.TraceError) as err:
        at.compile(DataDependent(), torch.randn(1, 3, 8, 8))
    msg = str(err.value)
    assert "could not trace DataDependent" in msg
    assert "test_errors.py" in msg and "forward" in msg  # the line that failed
    assert "control flow" in msg


def test_non_classifier_graph_is_refused() -> None:
    with pytest.raises(at.GraphError, match=r"output is of shape \(1, 4, 8, 8\).*image classifiers"):
        at.compile(Segmenter(), torch.randn(1, 3, 8, 8))


def test_bad_example_input_is_refused() -> None:
    with pytest.raises(at.GraphError, match=r"shape \(N, C, H, W\), got \(3, 8, 8\)"):
        at.compile(Segmenter(), torch.randn(3, 8, 8))


def test_model_specs() -> None:
    with pytest.raises(at.ModelLoadError, match="model spec 'resnet18' is not understood"):
        at.compile("resnet18")
    with pytest.raises(at.ModelLoadError, match="torchvision has no classification model 'resnet19'"):
        at.compile("torchvision:resnet19")
    with pytest.raises(at.ModelLoadError, match="cannot import 'no_such_pkg'"):
        at.compile("no_such_pkg:factory")


@pytest.mark.parametrize("text,message", [
    ("[var.global_vars\nresolution = [1]", "is not valid TOML"),
    ("[var.global_vars]\nresolutions = [224]", "unknown key 'var.global_vars.resolutions'; allowed keys are resolution, embed_ratio, width_ratio"),
    ("[var.stage_vars]\nreduce_depth = [1]", r"var.stage_vars.reduce_depth = \[1\] is not allowed; expected a list of integers <= 0"),
    ("[var.block_vars]\nFooBlock.expand_ratio = [0.5]", "unknown template in var.block_vars.FooBlock.expand_ratio; templates are ConvNeXtBlock"),
    ("[var.block_vars]\nBasicBlock.depth = [1]", "unknown block variable var.block_vars.BasicBlock.depth; allowed: expand_ratio, kernel_size"),
    ("[var.block_vars]\nBasicBlock.expand_ratio = [1.5]", r"expected a list of ratios in \(0, 1\]"),
    ("[arch]\nblocks = ['Nope']", "arch.blocks = \\['Nope'\\] is not allowed; expected a list of template names"),
    ("[arch]\nchannel_multiple = 0", "arch.channel_multiple = 0 is not allowed; expected a positive integer"),
    ("[other]\nx = 1", "unknown key 'other'"),
])
def test_config_errors_name_key_value_and_allowed(text: str, message: str) -> None:
    with pytest.raises(at.ConfigError, match=message):
        at.load_config(text)


def test_missing_config_file(tmp_path) -> None:
    with pytest.raises(at.ConfigError, match="config file not found"):
        at.load_config(tmp_path / "nope.toml")


class _Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x  # control flow on a value: torch.fx cannot trace this module


class WithUntraceablePart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())
        self.mid = nn.Sequential(nn.Conv2d(16, 32, 3), nn.BatchNorm2d(32), nn.ReLU())
        self.gate = _Gate()
        self.fc = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.gate(self.mid(self.stem(x))).mean((2, 3)))


def test_a_submodule_torch_fx_cannot_trace_is_kept_whole(caplog) -> None:
    torch.manual_seed(0)
    model = WithUntraceablePart().eval()
    x = torch.randn(2, 3, 16, 16)
    sn = at.compile(model, x[:1], config="[var.global_vars]\nresolution = [16]").eval()
    assert "torch.fx cannot trace into WithUntraceablePart; kept whole (not resized): gate" in caplog.text
    # Only the stem's channels vary: the gate, which AutoTailor cannot see into, fixes mid's.
    (width,) = sn.space.variables
    assert width.kind == "width" and width.values == (4, 8, 12, 16)
    with torch.no_grad():
        assert torch.allclose(sn(x), model(x), atol=1e-6)
        arch = {width.name: width.choices[0]}
        sn.set_arch(arch)
        assert torch.equal(sn.extract(arch)(x), sn(x))
        gated = sn.extract(arch)
        assert any(type(m).__name__ == "_Gate" for m in gated.modules())  # called as it is, deciding per input


def halve_if_even(x: torch.Tensor) -> torch.Tensor:
    return x / 2 if x.shape[-1] % 2 == 0 else x  # control flow on a size: torch.fx cannot trace this function


class CallsUntraceableFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(halve_if_even(self.conv(x)).mean((2, 3)))


def test_a_function_torch_fx_cannot_trace_is_kept_whole(caplog) -> None:
    torch.manual_seed(0)
    model = CallsUntraceableFunction().eval()
    sn = at.compile(model, torch.randn(1, 3, 16, 16), config="[var.global_vars]\nresolution = [15, 16]").eval()
    assert "kept whole (not resized): test_errors.halve_if_even()" in caplog.text
    with torch.no_grad():
        for r in (15, 16):  # the function still decides per input size
            sn.set_arch({"resolution": r})
            x = torch.randn(2, 3, r, r)
            assert torch.allclose(sn(x), model(x), atol=1e-6) and torch.equal(sn.extract({"resolution": r})(x), sn(x))


class _PadsOddSizes(nn.Module):
    """Layers behind control flow on a size (timm's MobileViT pads to whole patches so)."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(16, 32, 1)
        self.project = nn.Conv2d(32, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % 2:
            x = nn.functional.pad(x, (0, 1, 0, 1))
        scale = torch.full((1,), 0.5, device=x.device, dtype=x.dtype)  # a device and a dtype read as values
        return x + scale * self.project(torch.relu(self.expand(x)))[..., : x.shape[-2], : x.shape[-1]]


class WithSizeBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.block = _PadsOddSizes()
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.block(self.stem(x)).mean((2, 3)))


def test_layers_behind_a_branch_on_a_size_are_traced_at_the_example_size_and_guarded(caplog) -> None:
    torch.manual_seed(0)
    model = WithSizeBranch().eval()
    x = torch.randn(2, 3, 16, 16)
    sn = at.compile(model, x[:1], config="[var.global_vars]\nresolution = [15, 16]").eval()
    assert "kept whole" not in caplog.text
    # traced into: the block's hidden layer is a width variable of its own
    assert any(v.kind == "width" and v.values[-1] == 32 for v in sn.space.variables)
    # 15 px would take the other branch: the guard written at the branch drops it
    assert "resolution(s) [15] dropped" in caplog.text
    assert "the traced model took one branch at the compiled input size" in caplog.text
    with torch.no_grad():
        assert torch.allclose(sn(x), model(x), atol=1e-6)
        arch = sn.space.min()
        sn.set_arch(arch)
        assert torch.equal(sn.extract(arch)(x), sn(x))
