"""Variable kinds own their configuration and their effect; nothing changes the active SubNet behind the caller."""

import pytest
import torch
import torchvision

import autotailor as at
from autotailor.compiler.variables import SCOPES, VariableKind, kind, kinds, setting_kind
from autotailor.data import BatchLoader, load_digits
from autotailor.predict.latency import KernelPlan
from autotailor.tune import evaluate, recalibrated


def test_every_kind_has_its_settings_defaults_checks_and_plan():
    # Embedding plans before width, which would otherwise take a transformer's residual stream.
    assert [k.name for k in kinds()] == ["resolution", "depth", "embedding", "width", "kernel", "heads", "qk", "v"]
    for k in kinds():
        assert k.settings and set(k.settings) <= set(SCOPES)
        for method in ("default", "check", "plan"):
            assert getattr(type(k), method) is not getattr(VariableKind, method), (k.name, method)
        for scope, key in k.settings.items():
            assert setting_kind(scope, key) is k
            default = k.default(scope)
            assert default is None or k.check("test", key, list(default)) == default
    with pytest.raises(at.ConfigError, match=r"var.stage_vars.width_ratio = \[0\] is not allowed"):
        kind("width").check("test", "var.stage_vars.width_ratio", [0])


@pytest.fixture(scope="module")
def sn():
    torch.manual_seed(0)
    return at.compile(torchvision.models.mobilenet_v3_small(num_classes=10), torch.zeros(1, 3, 32, 32))


def test_channel_multiple_rounds_the_width_choices_not_the_channel_order():
    torch.manual_seed(0)
    model, x = torchvision.models.mobilenet_v3_small(num_classes=10), torch.randn(2, 3, 32, 32)
    config = at.load_config("[arch]\nchannel_multiple = 8\n")
    assert at.load_config(config.to_dict()) == config
    plain, aligned = at.compile(model, x[:1]), at.compile(model, x[:1], config=config)
    before = [v.values for v in plain.space.variables if v.kind == "width"]
    after = [v.values for v in aligned.space.variables if v.kind == "width"]
    assert sum(any(c % 8 for c in values[:-1]) for values in before) == 17  # of 27: 18, 36, 54 of 72, ...
    # 2, 4, 6 of 8 channels round to none but the model's own 8: that group's variable goes
    assert len(after) == 26 and all(c % 8 == 0 for values in after for c in values[:-1]), after
    assert sorted(values[-1] for values in after) == sorted(values[-1] for values in before if values[-1] > 8)
    # channels are ordered as without the multiple: the same weights, the same largest SubNet
    plain_sd = plain.state_dict()
    assert all(torch.equal(t, plain_sd[k]) for k, t in aligned.state_dict().items())
    torch.testing.assert_close(aligned.extract(aligned.space.max()).eval()(x), plain.extract(plain.space.max()).eval()(x))


def test_operators_read_their_variables_and_get_the_kinds_values(sn):
    arch = sn.space.sample(3)
    sn.set_arch(arch)
    for _, op in sn.operators():
        for field, var in op.reads.items():
            v = sn.space[var]
            assert getattr(op.feature.active, field) == v.value(arch[var])
            if v.kind == "width":  # a ratio sets a channel count of the operator's group
                assert v.value(v.largest) == getattr(op.feature.meta, field)
    sn.set_arch(sn.space.max())


def test_nothing_changes_the_active_subnet_behind_the_caller(sn):
    arch = sn.space.complete(sn.space.sample(7))
    sn.set_arch(arch)
    KernelPlan(sn, "ort-cpu").example(KernelPlan(sn, "ort-cpu").kernels[-1])
    sn.deduce_shapes(sn.space.min())
    sn.extract(sn.space.min())
    data = load_digits()
    batches = list(BatchLoader(data.subset(range(64)), 32, train=False))
    evaluate(sn, sn.space.min(), batches, batches)
    evaluate(sn, sn.space.min(), batches)
    with recalibrated(sn, sn.space.max(), batches):
        assert sn.arch == sn.space.max()
    assert sn.arch == arch
    with pytest.raises(RuntimeError), sn.using(sn.space.min()):
        raise RuntimeError("interrupted")
    assert sn.arch == arch
    sn.set_arch(sn.space.max())
