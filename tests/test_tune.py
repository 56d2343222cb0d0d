"""Tuning: it learns, evaluation with BN recalibration leaves the SuperNet intact, and an
interrupted run resumes to exactly the weights of an uninterrupted one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

import autotailor as at
from autotailor.data import BatchLoader, load_data
from autotailor.tune import CpuTime, TuneConfig, Tuner, evaluate, specialize, specialize_config
from autotailor.tune.evaluate import accuracy
from autotailor.tune.specialize import specialized_path
from autotailor.tune.tuner import ALPHA_CLIP, DISTILL_LOSSES


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(16, 32, 1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 3, padding=1),
                          nn.BatchNorm2d(16)) for _ in range(2))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = torch.relu(x + b(x))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def digits():
    return load_data("digits", seed=0)


def _supernet() -> at.SuperNet:
    torch.manual_seed(0)
    return at.compile(SmallNet(), torch.zeros(1, 3, 16, 16))


def test_training_then_tuning_learns_and_evaluation_restores_statistics(digits) -> None:
    train, val = digits
    sn = _supernet()
    losses = []
    # First the base model (the largest SubNet alone, as `autotailor train` does), then the SuperNet.
    Tuner(sn, BatchLoader(train, 64, train=True, resolution=16), TuneConfig(steps=150, subnets=1, lr=0.1)).run(
        lambda r: losses.append(r.loss))
    assert sum(losses[-10:]) < 0.6 * sum(losses[:10]), losses
    val_batches = list(BatchLoader(val, 200, train=False, resolution=16))
    calib = [b for _, b in zip(range(4), BatchLoader(train, 64, train=True, resolution=16, seed=9))]
    untuned_small = evaluate(sn, sn.space.min(), val_batches, calib)
    Tuner(sn, BatchLoader(train, 64, train=True, resolution=16, seed=1), TuneConfig(steps=40, lr=0.05)).run()
    before = {k: v.clone() for k, v in sn.state_dict().items()}
    top = evaluate(sn, sn.space.max(), val_batches, calib)
    small = evaluate(sn, sn.space.min(), val_batches, calib)
    assert all(torch.equal(before[k], v) for k, v in sn.state_dict().items()), "evaluation changed the SuperNet"
    assert top > 0.7 and small > untuned_small, (top, small, untuned_small)


@pytest.mark.parametrize("teacher,distill_loss", [("largest", "kl"), ("original", "kl"), ("largest", "alpha")])
def test_interrupted_tuning_resumes_exactly(digits, tmp_path, teacher: str, distill_loss: str) -> None:
    # with the original model as teacher, the resumed run teaches with the SuperNet it was given
    # (the weights tuning started from), not with those it resumed
    train, _ = digits
    config = TuneConfig(steps=6, checkpoint_every=2, lr=0.05, teacher=teacher, distill_loss=distill_loss)

    def loader() -> BatchLoader:
        return BatchLoader(train, 32, train=True, resolution=16, seed=1)

    straight = _supernet()
    Tuner(straight, loader(), config).run()

    class Interrupt(Exception):
        pass

    def stop_at_step_3(result) -> None:
        if result.step == 2:
            raise Interrupt

    ckpt = tmp_path / "tune.pt"
    with pytest.raises(Interrupt):
        Tuner(_supernet(), loader(), config, ckpt).run(stop_at_step_3)
    resumed = _supernet()
    tuner = Tuner(resumed, loader(), config, ckpt)
    assert tuner.resume() and tuner.step == 2  # the checkpoint of step 2; step 3 is redone
    # the CPU time of the first run's two checkpointed steps carries over, and the rest adds to it
    first = torch.load(ckpt, weights_only=False)["cpu_seconds"]
    assert first > 0 and tuner.cpu == CpuTime(first, 2)
    tuner.run()
    saved = torch.load(ckpt, weights_only=False)
    assert tuner.cpu.seconds > first and CpuTime.of(saved) == tuner.cpu and tuner.cpu.steps == 6
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(at.AutoTailorError, match="was written with other settings"):
        Tuner(_supernet(), loader(), dataclasses.replace(config, steps=7), ckpt).resume()
    other = _supernet()  # the two teachers, and the two losses, train differently
    Tuner(other, loader(), dataclasses.replace(config, teacher={"largest": "original"}.get(teacher, "largest"))
          if distill_loss == "kl" else dataclasses.replace(config, distill_loss="kl")).run()
    assert any(not torch.equal(a, b) for a, b in zip(other.state_dict().values(), straight.state_dict().values()))


def test_tune_config_errors() -> None:
    with pytest.raises(at.AutoTailorError, match="tune.optimizer = 'adam' is not allowed; expected one of"):
        TuneConfig(optimizer="adam")
    with pytest.raises(at.AutoTailorError,
                       match=r"tune.teacher = 'base' is not allowed; expected one of \('largest', 'original'\)"):
        TuneConfig(teacher="base")
    with pytest.raises(at.AutoTailorError,
                       match=r"tune.distill_loss = 'mse' is not allowed; expected one of \('kl', 'alpha'\)"):
        TuneConfig(distill_loss="mse")


def _divergence(a: float, p: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """D_a(p||q) written out: KL(p||q) at a = 1, else (sum p^a q^(1-a) - 1) / (a (a - 1))."""
    q = logits.softmax(1)
    if a == 1.0:
        return (p * (p / q).log()).sum(1).mean()
    return ((p ** a * q ** (1 - a)).sum(1) - 1).div(a * (a - 1)).mean()


def test_alpha_distillation_takes_the_larger_divergence_with_its_gradient() -> None:
    alpha = DISTILL_LOSSES["alpha"]
    torch.manual_seed(0)
    teacher = torch.randn(8, 10).softmax(1)
    near = (teacher.log() + 0.1 * torch.randn(8, 10)).requires_grad_(True)  # no weight reaches the clip
    loss = alpha(teacher, near)
    loss.backward()
    exact = {a: _divergence(a, teacher, near) for a in (-1.0, 1.0)}
    larger = max(exact, key=lambda a: exact[a].item())
    assert loss.item() == pytest.approx(exact[larger].item(), rel=1e-4)
    grad = torch.autograd.grad(exact[larger], near)[0]
    assert torch.allclose(near.grad, grad, atol=1e-6), (near.grad - grad).abs().max()
    same = teacher.log().requires_grad_(True)
    assert alpha(teacher, same).item() == pytest.approx(0.0, abs=1e-6)
    # a student confident where the teacher gives almost nothing: D_-1 is about 1e5, clipped at
    # most (ALPHA_CLIP - 1) / 2 = 2, so the loss is KL's (4.15 here), and the gradient finite
    sure = torch.full((1, 10), 1e-6).index_fill(1, torch.tensor([0]), 1.0)
    sure = sure / sure.sum()
    wrong = torch.zeros(1, 10).index_fill(1, torch.tensor([1]), 4.0).requires_grad_(True)
    assert _divergence(-1.0, sure, wrong).item() > 1e4
    clipped = alpha(sure, wrong)
    clipped.backward()
    assert clipped.item() == pytest.approx(_divergence(1.0, sure, wrong.detach()).item(), rel=1e-5)
    assert (ALPHA_CLIP - 1) / 2 < clipped.item() < 5 and torch.isfinite(wrong.grad).all()
    # KL's loss is the cross-entropy to the teacher: KL(p||q) plus the teacher's entropy
    kl = DISTILL_LOSSES["kl"](teacher, near.detach())
    entropy = -(teacher * teacher.log()).sum(1).mean()
    assert float(kl) == pytest.approx(float(_divergence(1.0, teacher, near.detach()) + entropy), rel=1e-5)


def test_settings_come_from_the_config_and_the_command_line_wins() -> None:
    config = at.load_config("[tune]\nsteps = 50\nlr = 1\noptimizer = 'adamw'")
    merged = TuneConfig.from_settings(config.steps["tune"], {"steps": 7})
    assert (merged.steps, merged.lr, merged.optimizer, merged.subnets) == (7, 1.0, "adamw", 4)
    with pytest.raises(at.AutoTailorError, match="unknown tune setting 'epochs'; allowed: steps, subnets"):
        TuneConfig.from_settings({"epochs": 3})
    with pytest.raises(at.AutoTailorError, match="tune.steps = '10' is not allowed; expected a int"):
        TuneConfig.from_settings({"steps": "10"})
    with pytest.raises(at.ConfigError, match=r"\[tune\] must be a table"):
        at.load_config("tune = 3")


def test_each_step_trains_the_largest_then_the_smallest_unless_told_not_to(digits) -> None:
    sn = _supernet()
    loader = BatchLoader(digits[0], 8, train=True, resolution=16, seed=0)
    sandwich = Tuner(sn, loader, TuneConfig(subnets=3), None).sample(5)
    assert sandwich[:2] == [sn.space.max(), sn.space.min()] and len(sandwich) == 3
    no_smallest = Tuner(sn, loader, TuneConfig(subnets=3, smallest=False), None).sample(5)
    assert no_smallest[0] == sn.space.max() and len(no_smallest) == 3
    assert no_smallest[1] == sandwich[2]  # the same seeded random SubNets, one more of them
    assert sn.space.min() not in no_smallest[1:]


def test_a_chosen_subnet_fine_tuned_alone_gains_accuracy_is_kept_and_leaves_the_supernet_alone(digits,
                                                                                                tmp_path) -> None:
    train, val = digits
    sn = _supernet()
    Tuner(sn, BatchLoader(train, 64, train=True, resolution=16), TuneConfig(steps=150, subnets=1, lr=0.1)).run()
    Tuner(sn, BatchLoader(train, 64, train=True, resolution=16, seed=1), TuneConfig(steps=20, lr=0.05)).run()
    arch = sn.space.complete({"stage0.width_ratio": 0.75, "block1.expand_ratio": 0.5, "block2.expand_ratio": 0.5})
    val_batches = list(BatchLoader(val, 200, train=False, resolution=16))
    calib = [b for _, b in zip(range(4), BatchLoader(train, 64, train=True, resolution=16, seed=9))]
    shared = evaluate(sn, arch, val_batches, calib)
    before = {k: v.clone() for k, v in sn.state_dict().items()}
    loader = BatchLoader(train, 64, train=True, resolution=16, seed=2)
    config = specialize_config(60, 0.05)
    steps: list[int] = []
    net = specialize(sn, arch, loader, config, tmp_path, lambda r: steps.append(r.step))
    assert steps == list(range(60))
    assert all(torch.equal(before[k], v) for k, v in sn.state_dict().items()), "specialize changed the SuperNet"
    alone = accuracy(net, val_batches, sn.input_shape(arch)[-1])
    assert alone > shared + 0.02, (alone, shared)
    # kept under a digest of the weights, the SubNet and the settings: loaded, not trained again
    kept = specialized_path(sn, arch, config, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]
    again = specialize(sn, arch, loader, config, tmp_path, lambda r: pytest.fail("trained again"))
    x = val_batches[0][0]
    assert torch.equal(again(x), net(x))
    assert specialized_path(sn, arch, specialize_config(61, 0.05), tmp_path) != kept
    assert specialized_path(sn, sn.space.max(), config, tmp_path) != kept
    # one network, one file: archs that differ only in a block they drop share it
    short = {**arch, "stage0.reduce_depth": -1}
    assert specialized_path(sn, {**short, "block2.expand_ratio": 1.0}, config, tmp_path) == \
        specialized_path(sn, short, config, tmp_path) != kept


def test_an_interrupted_fine_tuning_resumes_to_the_same_weights(digits, tmp_path) -> None:
    sn = _supernet()
    arch = sn.space.min()
    loader = BatchLoader(digits[0], 32, train=True, resolution=16, seed=3)
    config = dataclasses.replace(specialize_config(6, 0.05), checkpoint_every=2)
    whole = specialize(sn, arch, loader, config, tmp_path / "whole")

    class Stop(Exception):
        pass

    def stop_after_three(r) -> None:
        if r.step == 2:
            raise Stop

    with pytest.raises(Stop):
        specialize(sn, arch, loader, config, tmp_path / "cut", stop_after_three)
    [ckpt] = (tmp_path / "cut").iterdir()
    assert ckpt.suffix == ".ckpt"
    before = torch.load(ckpt, weights_only=False)["cpu_seconds"]
    resumed = specialize(sn, arch, loader, config, tmp_path / "cut")
    [kept] = (tmp_path / "cut").iterdir()
    spent = CpuTime.of(torch.load(kept))
    assert kept.suffix == ".pt" and spent.seconds > before > 0 and spent.steps == config.steps  # both runs' CPU time
    for k, v in whole.state_dict().items():
        assert torch.allclose(v.float(), resumed.state_dict()[k].float(), atol=1e-6), k
