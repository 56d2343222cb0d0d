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
