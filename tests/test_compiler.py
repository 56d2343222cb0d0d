"""The compiler passes on small models whose right answer is known."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn
import torchvision

import autotailor as at
from autotailor.ir import Block, DynConv2d, Operator
from conftest import rel_err, well_conditioned


class SameWidthResidual(nn.Module):
    """Residual convs that read and write the same channels (8 -> 8), as in FusedMBConv."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)) for _ in range(3))
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = x + torch.relu(b(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def test_reordering_keeps_the_function_when_a_conv_reads_and_writes_its_group() -> None:
    torch.manual_seed(0)
    model = well_conditioned(SameWidthResidual())
    x = torch.randn(2, 3, 16, 16)
    sn = at.compile(model, x).eval()
    stem = sn.net.get_submodule("stem.0")
    assert not torch.equal(stem.weight, model.stem[0].weight), "channels were not reordered"
    with torch.no_grad():
        assert rel_err(model(x), sn(x)) <= 1e-5
    assert "stage0.width_ratio" in sn.space


class LayerScaled(nn.Module):
    """A parameter multiplied into the channels (ConvNeXt's layer scale) joins their group."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.scale = nn.Parameter(torch.rand(16, 1, 1) + 0.5)
        self.proj = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        y = self.proj(self.scale * self.conv(x))
        return self.fc(y.mean((2, 3)))


def test_elementwise_parameters_are_sliced_with_their_channels() -> None:
    torch.manual_seed(0)
    model = LayerScaled().eval()
    sn = at.compile(model, torch.randn(1, 3, 12, 12), config="[var.block_vars]\nChainBlock.expand_ratio = [0.5, 1.0]")
    var = sn.space[dict(sn.operators())["conv"].reads["out_channels"]]
    arch = {var.name: 0.5}
    net = sn.extract(arch)
    shapes = sorted(tuple(p.shape) for p in net.parameters())
    assert (8, 1, 1) in shapes  # the scale keeps 8 of its 16 channels
    x = torch.randn(1, 3, 12, 12)
    sn.set_arch(arch)
    with torch.no_grad():
        assert rel_err(sn(x), net(x)) <= 1e-6


class Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 1)
        self.b = nn.Conv2d(3, 8, 1)
        self.mid = nn.Conv2d(16, 16, 1)
        self.out = nn.Conv2d(16, 8, 1)
        self.fc = nn.Linear(8 * 4 * 4, 2)

    def forward(self, x):
        y = torch.cat([self.a(x), self.b(x)], 1)
        y = self.out(torch.relu(self.mid(y)))
        return self.fc(torch.flatten(y, 1))


def test_unknown_operators_fix_the_channels_they_touch() -> None:
    sn = at.compile(Concat(), torch.randn(1, 3, 4, 4), config="[var.global_vars]\nresolution = [4]")
    widths = [v for v in sn.space.variables if v.kind == "width"]
    # Only mid's output can change: a/b feed a concat, out's channels are flattened with space.
    assert len(widths) == 1
    ops = {name: op for name, op in sn.operators()}
    assert ops["mid"].reads == {"out_channels": widths[0].name} and ops["out"].reads == {"in_channels": widths[0].name}
    assert "a" not in ops and "b" not in ops and "fc" not in ops  # bypassed: they stay static


class Squeezed(nn.Module):
    """Axes of one added and removed around the channels (as an ONNX import writes them)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 1)
        self.b = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        y = self.a(x).unsqueeze(0).unsqueeze(3)  # (1, N, 8, 1, H, W)
        y = self.b(torch.relu(y.squeeze((0, 3))))
        return self.fc(y.mean((2, 3)).unsqueeze(1).squeeze(1))


def test_squeezes_keep_the_channels_on_their_axis() -> None:
    torch.manual_seed(0)
    model = Squeezed().eval()
    sn = at.compile(model, torch.randn(2, 3, 4, 4), config="[var.global_vars]\nresolution = [4]").eval()
    widths = [v for v in sn.space.variables if v.kind == "width"]
    ops = {name: op for name, op in sn.operators()}
    assert len(widths) == 2 and ops["a"].reads == {"out_channels": widths[0].name}
    assert ops["b"].reads == {"in_channels": widths[0].name, "out_channels": widths[1].name}
    arch = {v.name: min(v.choices) for v in widths}
    net = sn.extract(arch)
    x = torch.randn(2, 3, 4, 4)
    sn.set_arch(arch)
    with torch.no_grad():
        assert net.a.out_channels < 8 and rel_err(sn(x), net(x)) <= 1e-6


def test_grouped_convolutions_keep_whole_groups() -> None:
    torch.manual_seed(0)
    model = well_conditioned(torchvision.models.resnext50_32x4d(weights=None))
    sn = at.compile(model, torch.randn(1, 3, 64, 64))
    grouped = [op for _, op in sn.operators() if isinstance(op, DynConv2d) and 1 < op.groups < op.in_channels]
    assert grouped
    rng = random.Random(0)
    for _ in range(3):
        arch = sn.space.sample(rng)
        sn.set_arch(arch)
        for op in grouped:
            per_group = op.feature.meta.in_channels // op.feature.meta.groups
            assert op.feature.active.in_channels % per_group == 0


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "convnext_tiny", "inception_v3"])
def test_deduced_shapes_match_a_real_run(name: str) -> None:
    torch.manual_seed(0)
    size = 96 if name == "inception_v3" else 64
    sn = at.compile(well_conditioned(torchvision.models.get_model(name, weights=None)), torch.randn(1, 3, size, size))
    sn.eval()
    arch = sn.space.sample(random.Random(4))
    deduced = sn.deduce_shapes(arch)
    sn.set_arch(arch)
    seen: dict[str, tuple[int, ...]] = {}
    hooks = [m.register_forward_hook(lambda mod, i, o, n=n: seen.__setitem__(n, tuple(o.shape)))
             for n, m in sn.net.named_modules() if isinstance(m, Operator) and n]
    with torch.no_grad():
        y = sn(torch.randn(sn.input_shape(arch)))
    for h in hooks:
        h.remove()
    names = {}  # module path -> the node's name in deduce_shapes (ir.walk's)

    def collect(gm, prefix: str) -> None:
        for n in gm.graph.nodes:
            if n.op == "call_module" and isinstance(gm.get_submodule(n.target), Block):
                collect(gm.get_submodule(n.target).body, f"{prefix}{n.target}.body.")
            elif n.op == "call_module":
                names[prefix + n.target] = prefix + n.name

    collect(sn.net, "")
    assert seen and all(deduced[names[n]] == s for n, s in seen.items())
    assert deduced["output" if "output" in deduced else list(deduced)[-1]] == tuple(y.shape)


def test_the_users_model_is_not_modified() -> None:
    torch.manual_seed(0)
    model = well_conditioned(torchvision.models.mobilenet_v3_small(weights=None))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sn = at.compile(model, torch.randn(1, 3, 64, 64))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    ours = {t.data_ptr() for t in (*sn.parameters(), *sn.buffers()) if t.numel()}
    theirs = {t.data_ptr() for t in (*model.parameters(), *model.buffers()) if t.numel()}
    assert not ours & theirs, "the SuperNet shares storage with the user's model"
    with torch.no_grad():
        for p in sn.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], model.state_dict()[k]) for k in before)


class FixedView(nn.Module):
    def forward(self, x):
        return x.view(1, 3 * 8 * 8)


def test_the_walker_names_the_node_that_failed() -> None:
    from autotailor.compiler.graph_utils import run_error

    gm = torch.fx.symbolic_trace(FixedView())
    assert run_error(gm, torch.zeros(1, 3, 8, 8)) is None
    assert run_error(gm, torch.zeros(1, 3, 4, 4)).startswith("GraphError: at node view (call_method view): RuntimeError")


class FixedFlatten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 16 * 16, 2)

    def forward(self, x):
        return self.fc(self.conv(x).reshape(1, 4 * 16 * 16))


def test_dropped_resolutions_are_one_log_line_without_tracebacks(capfd, caplog) -> None:
    with caplog.at_level("WARNING"):
        sn = at.compile(FixedFlatten(), torch.zeros(1, 3, 16, 16))
    assert "resolution" not in sn.space
    (record,) = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert record.getMessage().startswith("resolution(s) [12] dropped: the model does not run at them (12: GraphError: "
                                          "at node reshape (call_method reshape): RuntimeError")
    assert "Traceback" not in capfd.readouterr().err
