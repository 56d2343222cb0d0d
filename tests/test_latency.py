"""Unique-kernel enumeration, counted costs, the latency predictor and resumable profiling."""

from __future__ import annotations

import collections
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn
import torchvision
from torch.fx.passes.shape_prop import ShapeProp

import autotailor as at
from autotailor.predict.latency import (
    CacheAwarePredictor, CacheModel, CostModel, KernelPlan, LatencyPredictor, LutStore, Measurement, Target, cache_bytes,
    make_backend, parse_device, profile,
)
from autotailor.predict.latency.kernels import _deduce
from autotailor.testing import well_conditioned


@pytest.fixture(scope="module")
def mnv3() -> at.SuperNet:
    torch.manual_seed(0)
    return at.compile(well_conditioned(torchvision.models.mobilenet_v3_small()), torch.zeros(1, 3, 64, 64))


@pytest.fixture(scope="module")
def resnet() -> at.SuperNet:
    return at.compile(torchvision.models.resnet18(), torch.zeros(1, 3, 64, 64))


def _subnet_convs(sn: at.SuperNet, arch) -> collections.Counter:
    """(in, out, kernel, stride, groups, input H) of every convolution the extracted SubNet runs."""
    net = sn.extract(arch).eval()
    ShapeProp(net).propagate(torch.zeros(sn.input_shape(arch)))
    found = collections.Counter()
    for n in net.graph.nodes:
        if n.op == "call_module" and isinstance(net.get_submodule(n.target), nn.Conv2d):
            c = net.get_submodule(n.target)
            h = n.args[0].meta["tensor_meta"].shape[2]
            found[(c.in_channels, c.out_channels, c.kernel_size[0], c.stride[0], c.groups, h)] += 1
    return found


def _plan_convs(plan: KernelPlan, arch) -> collections.Counter:
    arch = plan.sn.space.complete(arch)
    found = collections.Counter()
    dropped = plan.dropped(arch)
    for g in plan.groups:
        if g.block in dropped:
            continue
        for name in g.nodes:
            node = plan.by_name[name]
            if node.kind != "conv2d":
                continue
            cin = plan.shapes.shape(node.inputs[0], arch)
            out = plan.shapes.shape(name, arch)
            conv = node.owner.get_submodule(node.fx_node.target)
            k = arch[node.kernel_var] if node.kernel_var else node.facts["kernel"]
            per_group = conv.in_channels // conv.groups
            groups = 1 if conv.groups == 1 else cin[1] // per_group
            found[(cin[1], out[1], k, conv.stride[0], groups, cin[2])] += 1
    return found


@pytest.mark.parametrize("fixture", ["mnv3", "resnet"])
def test_kernels_of_a_subnet_are_the_convolutions_it_runs(fixture, request) -> None:
    sn = request.getfixturevalue(fixture)
    plan = KernelPlan(sn)
    rng = random.Random(0)
    for arch in [sn.space.max(), sn.space.min(), *(sn.space.sample(rng) for _ in range(4))]:
        assert _plan_convs(plan, arch) == _subnet_convs(sn, arch)
        ids = plan.kernel_ids(arch)
        assert all(0 <= i < len(plan.kernels) for i in ids)
    # Every SubNet's kernels are among the enumerated ones, and the space needs each of them.
    used = {i for _ in range(200) for i in plan.kernel_ids(sn.space.sample(rng))}
    assert len(used) > 0.5 * len(plan.kernels)


def test_shapes_follow_the_architecture_exactly(mnv3) -> None:
    plan = KernelPlan(mnv3)
    rng = random.Random(1)
    for arch in [mnv3.space.min(), *(mnv3.space.sample(rng) for _ in range(5))]:
        deduced = _deduce(mnv3, arch)
        assert {n: plan.shapes.shape(n, arch) for n in deduced} == deduced
    mnv3.set_arch(mnv3.space.max())


def test_granularities_group_differently(resnet) -> None:
    op = KernelPlan(resnet, "ort-cpu", "operator")
    fused = KernelPlan(resnet, "ort-cpu", "fused")
    block = KernelPlan(resnet, "ort-cpu", "block")
    compute = [n for n in fused.nodes if not n.const and n.kind not in ("input", "output", "dropout")]
    assert len(op.groups) == len(compute)
    assert len(block.groups) < len(fused.groups) < len(op.groups)
    kinds = [tuple(fused.by_name[n].kind for n in g.nodes) for g in fused.groups]
    assert ("conv2d", "batchnorm2d", "relu") in kinds and ("conv2d", "batchnorm2d", "add", "relu") in kinds
    with pytest.raises(at.AutoTailorError, match="granularity 'layer' is not allowed; expected one of"):
        KernelPlan(resnet, "ort-cpu", "layer")
    with pytest.raises(at.LatencyError, match="unknown backend 'tpu'; available: ncnn, openvino, ort-cpu, remote, torch"):
        KernelPlan(resnet, "tpu")


def test_counted_costs_match_the_extracted_subnet(mnv3) -> None:
    costs = CostModel(KernelPlan(mnv3))
    rng = random.Random(2)
    for arch in [mnv3.space.max(), mnv3.space.min(), mnv3.space.sample(rng)]:
        net = mnv3.extract(arch).eval()
        macs = 0

        def hook(mod, inputs, out):
            nonlocal macs
            if isinstance(mod, nn.Conv2d):
                macs += out.numel() * mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
            elif isinstance(mod, nn.Linear):
                macs += out.numel() * mod.in_features

        handles = [m.register_forward_hook(hook) for m in net.modules()]
        with torch.no_grad():
            net(torch.zeros(mnv3.input_shape(arch)))
        for h in handles:
            h.remove()
        c = costs.costs(mnv3.space.complete(arch))
        assert c.params == sum(p.numel() for p in net.parameters())
        assert c.macs == macs
        assert c.memory_bytes == 4 * c.params + c.peak_activation_bytes


def test_peak_activation_memory_of_a_chain_and_a_residual() -> None:
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, 8, 3, padding=1)
            self.b = nn.Conv2d(8, 8, 3, padding=1)
            self.head = nn.Linear(8, 10)

        def forward(self, x):
            y = self.a(x)
            z = self.b(y) + y  # y stays alive while b runs: input 3x16x16 gone, y and b's output live
            return self.head(z.mean((2, 3)))

    static = {"var": {"global_vars": {"resolution": [16], "width_ratio": [1.0]}}}
    sn = at.compile(Net(), torch.zeros(1, 3, 16, 16), config=static)
    c = CostModel(KernelPlan(sn)).costs(sn.space.max())
    # Live at the add: y, b(y) and the add's output, 8x16x16 floats each.
    assert c.peak_activation_bytes == 3 * 8 * 16 * 16 * 4


def test_profile_then_predict_sums_the_lut(tmp_path, resnet) -> None:
    plan = KernelPlan(resnet, "torch")
    backend = make_backend("torch", threads=1, warmup=1, repeats=3, budget_s=0.01)
    target = Target.of("test", "torch", **backend.settings)
    with LutStore(tmp_path / "lut.sqlite") as store:
        with pytest.raises(at.AutoTailorError, match=f"the LUT lacks {len(plan.kernels) + 1} of"):
            LatencyPredictor.from_store(plan, store, target)
        seen = []
        report = profile(plan, backend, store, target, lambda done, total: seen.append((done, total)))
        assert report.measured == len(plan.kernels) + 1 == seen[-1][0] == seen[-1][1]
        assert profile(plan, backend, store, target).measured == 0  # nothing is measured twice
        predictor = LatencyPredictor.from_store(plan, store, target)
        entries = store.get(target, [k.signature for k in plan.kernels] + ["overhead"])
        speed = store.speed(target)
    assert speed.readings == len(entries) and all(m.reference_ms > 0 for m in entries.values())
    arch = resnet.space.sample(3)
    expected = entries["overhead"].at_speed(speed.median_ms) + sum(
        entries[plan.kernels[i].signature].at_speed(speed.median_ms) for i in plan.kernel_ids(arch))
    assert predictor.predict(resnet.space.complete(arch)) == pytest.approx(expected, rel=1e-12)
    big, small = predictor.predict(resnet.space.max()), predictor.predict(resnet.space.min())
    assert big > 2 * small


class _SlowingMachine:
    """A runtime 10 % slower at every reading of the reference kernel (scripted: a drift cannot
    be set up on demand). Every kernel takes 2 references' time at the speed of its moment."""

    def __init__(self) -> None:
        self.speed = 0.9

    def reference_probe(self):
        def read() -> float:
            self.speed += 0.1
            return 0.5 * self.speed
        return read

    def overhead(self) -> Measurement:
        return Measurement(0.01 * self.speed, 0.0, 5)

    def measure(self, module, shapes) -> Measurement:
        return Measurement(self.speed, 0.0, 5)


def test_profiling_brings_every_kernel_to_one_machine_speed(tmp_path, resnet, caplog) -> None:
    plan = KernelPlan(resnet, "torch")
    target = Target.of("test", "drifting")
    with LutStore(tmp_path / "lut.sqlite") as store:
        with caplog.at_level("WARNING"):
            profile(plan, _SlowingMachine(), store, target, reference_every_s=0.0)
        raw = [m.median_ms for m in store.get(target, [k.signature for k in plan.kernels]).values()]
        speed = store.speed(target)
        predictor = LatencyPredictor.from_store(plan, store, target)
    assert max(raw) > 5 * min(raw)  # as timed: the machine slowed down while profiling
    assert predictor.kernel_ms == pytest.approx([2 * speed.median_ms] * len(plan.kernels))
    assert predictor.overhead_ms == pytest.approx(0.02 * speed.median_ms)
    assert speed.noise > 0.5
    assert f"the machine's speed moved by ±{100 * speed.noise:.0f}% while test/drifting was profiled" in caplog.text


def test_device_specs() -> None:
    assert parse_device("ort-cpu:threads=2,optimization=all,flush-mb=0") == (
        "ort-cpu", {"threads": 2, "optimization": "all", "flush_mb": 0})
    assert parse_device("torch") == ("torch", {})
    with pytest.raises(at.AutoTailorError, match="device setting 'threads' in 'ort-cpu:threads' is not KEY=VALUE"):
        parse_device("ort-cpu:threads")
    with pytest.raises(at.AutoTailorError, match="ort-cpu optimization='max' is not allowed; expected one of"):
        make_backend("ort-cpu", optimization="max")
    with pytest.raises(at.AutoTailorError, match="backend 'torch' does not take these settings"):
        make_backend("torch", optimization="all")


def test_profiling_killed_halfway_resumes_without_measuring_twice(tmp_path) -> None:
    work = tmp_path / "work"
    cli = [sys.executable, "-m", "autotailor.cli"]
    subprocess.run([*cli, "compile", "torchvision:mobilenet_v3_small", "--input-size", "64", "--out", str(work)],
                   check=True, capture_output=True)
    profile_cmd = [*cli, "profile", str(work), "--device", "ort-cpu:threads=1,flush_mb=0", "--device-name", "t",
                   "--quiet"]
    # killed, it cannot remove its temporary files: they go to tmp_path
    proc = subprocess.Popen(profile_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    lut = work / "latency.sqlite"
    deadline = time.time() + 120
    count = 0
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if lut.is_file():
            with LutStore(lut) as store:
                targets = store.targets()
                count = store.count(targets[0]) if targets else 0
            if count >= 30:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert count >= 30
    with LutStore(lut) as store:
        target = store.targets()[0]
        before = store.count(target)
        first = dict(store._db.execute("SELECT kernel, measured_at FROM entries").fetchall())
    done = subprocess.run(profile_cmd, check=True, capture_output=True, text=True).stdout
    total = int(done.split(" unique kernels")[0]) + 1
    assert f"{before} already in" in done
    assert f"measured {total - before} kernels" in done
    assert "fitted to measured SubNets: " in done
    with LutStore(lut) as store:
        assert store.count(target) == total
        subnets = [t for t in store.targets() if "model" in dict(t.settings)]  # the 22 calibration SubNets
        assert len(subnets) == 1 and store.count(subnets[0]) == 22
        after = dict(store._db.execute("SELECT kernel, measured_at FROM entries").fetchall())
    assert all(after[k] == t for k, t in first.items())  # what was measured before the kill was kept
    out = subprocess.run([*cli, "predict", str(work), "--device", "ort-cpu:threads=1,flush_mb=0", "--device-name",
                          "t", "--arch", "min", "--json"], check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    assert result["latency_ms"] > 0 and result["params"] > 0 and result["memory_bytes"] > 4 * result["params"]
    missing = subprocess.run([*cli, "predict", str(work), "--device", "ort-cpu:threads=2", "--device-name", "t"],
                             capture_output=True, text=True)
    assert missing.returncode == 2
    assert f"profile them first: autotailor profile {work} --device ort-cpu:threads=2" in missing.stderr


def test_every_format_exported_into_one_folder_keeps_its_own_files() -> None:
    from autotailor.predict.latency import backends

    # Every backend with files of its own (a remote one writes its inner backend's).
    names = [p.name for cls in backends().values() if cls.format for p in cls.deployed_files(cls().deploy_path("subnet"))]
    assert len(names) == len(set(names)) >= 6, names


@pytest.mark.parametrize("name", ["ort-cpu", "ncnn", "torch", "openvino"])
def test_backends_deploy_subnets_that_compute_the_same(name, tmp_path, mnv3) -> None:
    backend = make_backend(name, threads=1, warmup=1, repeats=3)
    arch = mnv3.space.sample(4)
    shape = mnv3.input_shape(arch)
    net = mnv3.extract(arch).eval()
    path = backend.deploy(net, tmp_path / "subnet", shape)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = net(x).numpy()
    assert all(p.is_file() for p in backend.deployed_files(path))
    out = backend.run_file(path, x.numpy())
    # NCNN and OpenVINO pick their own convolution algorithms (Winograd, packed layouts):
    # float32 rounding differs more.
    assert abs(out - ref).max() <= (1e-4 if name in ("ort-cpu", "torch") else 1e-3) * abs(ref).max()
    m = backend.time(backend.load(path, shape))
    assert m.repeats == 3 and m.median_ms > 0
    # a prober measures as `measure` does, the kernel prepared (converted) once
    kernel, kernel_shape = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU()).eval(), (1, 8, 16, 16)
    probe = backend.prober(kernel, kernel_shape)
    first, again = probe(), probe()
    assert first.repeats == again.repeats == backend.measure(kernel, kernel_shape).repeats >= 3
    assert first.median_ms > 0 and again.median_ms > 0


def test_openvino_kernels_are_timed_without_the_layout_reorders_a_model_does_once() -> None:
    """A depthwise convolution alone spends about half its wall time converting its input to and
    its output from the CPU plugin's blocked layout; the performance counters leave that out."""
    backend = make_backend("openvino", threads=1, warmup=3, repeats=20)
    kernel = nn.Sequential(nn.Conv2d(96, 96, 3, padding=1, groups=96), nn.ReLU6()).eval()
    shape = (1, 96, 56, 56)
    prepared = backend.prepare(kernel, [shape])
    # alternated, each the best of three rounds: a busy machine slows one round, not the comparison
    rounds = [(backend.measure(kernel, shape).median_ms,
               backend.time(prepared).median_ms - backend.overhead().median_ms) for _ in range(3)]
    counted, wall = min(c for c, _ in rounds), min(w for _, w in rounds)
    assert 0 < counted < 0.8 * wall, rounds
    assert backend.settings["timing"] == 2  # tables timed by the wall clock are measured again


def test_subnets_whose_weights_fit_in_cache_are_predicted_from_warm_kernels(tmp_path, resnet) -> None:
    from autotailor.pipeline.workdir import device_setup

    plan = KernelPlan(resnet, "ort-cpu")
    cold = LatencyPredictor(plan, [2.0] * len(plan.kernels), 0.1)
    hot = LatencyPredictor(plan, [1.0] * len(plan.kernels), 0.1)
    costs = CostModel(plan)
    small, big = resnet.space.min(), resnet.space.max()
    assert costs.params(small) == costs.costs(small).params < costs.params(big)
    cache = costs.params(small) * 4 + 1  # the smallest SubNet's weights fit, the largest's do not
    predictor = CacheAwarePredictor(cold, hot, costs, CacheModel(cache))
    assert predictor.predict(small) == pytest.approx(hot.predict(small))
    beyond = 1 - cache / (costs.params(big) * 4)  # the share of the largest's weights that runs cold
    assert 0.5 < beyond < 1
    assert predictor.predict(big) == pytest.approx(hot.predict(big) + beyond * (cold.predict(big) - hot.predict(big)))
    assert 2**20 <= cache_bytes() <= 2**32
    device = device_setup(resnet, tmp_path, "ort-cpu:threads=1,cache_mb=3")
    assert device.cache_bytes == 3 * 2**20 and dict(device.hot_target.settings)["flush_mb"] == 0
    assert dict(device.target.settings)["flush_mb"] == 16
    assert device_setup(resnet, tmp_path, "ncnn:threads=1").hot_target is None  # NCNN is profiled warm
    with pytest.raises(at.AutoTailorError, match="the LUT lacks"):
        device.predictor()


def test_ort_kernels_are_timed_as_fused_inside_a_model(tmp_path) -> None:
    """ONNX Runtime fuses conv + HardSwish only when the HardSwish output feeds a node, as it
    always does inside a model; a kernel timed alone must be given such a consumer."""
    import onnxruntime as ort

    from autotailor.counters import ort_counted
    from autotailor.predict.latency.backends.ort import OrtCpu, _Consumed, _onnx_bytes

    kernel = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Hardswish())
    backend = OrtCpu(threads=1)
    assert backend.settings["timing"] == 3

    def counted_ops(module: nn.Module) -> list[str]:
        opts = backend.session_options()
        opts.enable_profiling, opts.profile_file_prefix = True, str(tmp_path / "p")
        sess = ort.InferenceSession(_onnx_bytes(module, [(1, 8, 14, 14)]), opts, providers=["CPUExecutionProvider"])
        sess.run(None, {"x0": torch.randn(1, 8, 14, 14).numpy()})
        with open(sess.end_profiling()) as f:
            events = json.load(f)
        return sorted(e["args"]["op_name"] for e in events
                      if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and ort_counted(e))

    assert counted_ops(_Consumed(kernel)) == ["Conv"]
    assert counted_ops(kernel) == ["Conv", "HardSigmoid", "Mul"]
    assert backend.measure(kernel, (1, 8, 14, 14)).median_ms > 0

    class TwoOutputs(nn.Module):  # a whole block as one kernel can hand on several tensors
        def __init__(self) -> None:
            super().__init__()
            self.kernel = kernel

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.kernel(x)
            return y, y * 2

    assert counted_ops(_Consumed(TwoOutputs())) == ["Conv", "Mul"]
    assert backend.measure(TwoOutputs(), (1, 8, 14, 14)).median_ms > 0


def test_cache_budget_is_fitted_to_measured_subnets(tmp_path, resnet) -> None:
    from autotailor.pipeline.workdir import device_setup
    from autotailor.predict.latency import calibration_archs, fit_cache_model, subnet_arch, subnet_key

    device = device_setup(resnet, tmp_path, "ort-cpu:threads=1", device_name="here")
    plan, costs = device.plan, CostModel(device.plan)
    cold = LatencyPredictor(plan, [2.0] * len(plan.kernels), 0.1)
    hot = LatencyPredictor(plan, [1.0] * len(plan.kernels), 0.1)
    archs = calibration_archs(resnet.space, costs)
    weights = [costs.params(a) for a in archs]
    assert len(archs) == 22 and weights == sorted(weights) and weights[0] < weights[-1]
    assert (archs[0], archs[-1]) == (resnet.space.complete(resnet.space.min()), resnet.space.complete(resnet.space.max()))
    # measurements made by a machine keeping 512 KiB in cache, its model kernels 60 % of the way to
    # flushed and 0.9x their time alone, and weights beyond 12 MiB streaming from memory at ~0.05 ms
    # per MiB (on the fit's grid)
    tau = 0.002 * 1.5**8
    truth = CacheModel(2**19, 0.6, 12 * 2**20, tau, 0.9)
    measured = [CacheAwarePredictor(cold, hot, costs, truth).predict(a) for a in archs]
    kernels_hot, kernels_cold = hot.predict(archs[-1]) - 0.1, cold.predict(archs[-1]) - 0.1
    assert weights[0] * 4 < 12 * 2**20 < weights[-1] * 4 and measured[-1] == pytest.approx(
        0.9 * (kernels_hot + 0.6 * (1 - 2**19 / (4 * weights[-1])) * (kernels_cold - kernels_hot))
        + tau * (4 * weights[-1] - 12 * 2**20) / 2**20 + 0.1)  # the overhead is not scaled by κ
    fitted = fit_cache_model(cold, hot, costs, archs, measured, 2**30)
    assert (fitted.cache_bytes, fitted.cold_share, fitted.stream_bytes, fitted.in_model_ratio) == (2**19, 0.6, 12 * 2**20, 0.9)
    assert fitted.stream_ms_per_mib == pytest.approx(tau)
    # one SubNet measured while the machine was disturbed (twice as slow) does not move the fit
    disturbed = measured[:5] + [2 * measured[5]] + measured[6:]
    assert fit_cache_model(cold, hot, costs, archs, disturbed, 2**30) == fitted

    # Through the device: kernel LUTs and calibration SubNets stored, the budget comes out fitted.
    with device.open_store() as store:
        for target, ms in ((device.target, 2.0), (device.hot_target, 1.0)):
            for k in plan.kernels:
                store.put(target, k.signature, Measurement(ms, 0.0, 1))
            store.put(target, "overhead", Measurement(0.1, 0.0, 1))
        for a, m in zip(archs[:-1], measured):
            store.put(device.subnet_target, subnet_key(a), Measurement(m, 0.0, 1))
    assert device.predictor().cache == CacheModel(device.cache_bytes)  # one SubNet missing: the OS's figure
    with device.open_store() as store:
        store.put(device.subnet_target, subnet_key(archs[-1]), Measurement(measured[-1], 0.0, 1))
    fitted = device.predictor().cache
    assert (fitted.cache_bytes, fitted.cold_share, fitted.stream_bytes) == (2**19, 0.6, 12 * 2**20)
    assert device.calibrate() == 0  # all measured: nothing to do
    # SubNets measured later (a search's choices, verified) join the fit; another model's do not:
    # 25 SubNets whose kernels run at 1.1x inside a model outweigh the calibration's 22 at 0.9x.
    rng = random.Random(3)
    later = list({subnet_key(a): a for a in (resnet.space.complete(resnet.space.sample(rng)) for _ in range(25))}.values())
    slower = CacheAwarePredictor(cold, hot, costs, CacheModel(2**19, 0.6, 12 * 2**20, tau, 1.1))
    with device.open_store() as store:
        for a in later:
            store.put(device.subnet_target, subnet_key(a), Measurement(slower.predict(a), 0.0, 1))
    assert len(later) == 25 and len(device.measured()) == 47
    # A model with the same variables (a 100-class head) shares the LUT's kernels, not its SubNets.
    other = device_setup(at.compile(torchvision.models.resnet18(num_classes=100), torch.zeros(1, 3, 64, 64)),
                         tmp_path, "ort-cpu:threads=1", device_name="here")
    assert other.plan.sn.space.variables == resnet.space.variables and other.target == device.target
    assert other.subnet_target != device.subnet_target and other.measured() == {}
    with other.open_store() as store:
        store.put(other.subnet_target, subnet_key(later[0]), Measurement(9.0, 0.0, 1))
    assert device.measured()[subnet_key(later[0])] == pytest.approx(slower.predict(later[0]))
    assert [subnet_arch(subnet_key(a)) for a in later] == later
    with pytest.raises(at.LatencyError, match="is not a whole SubNet's LUT entry"):
        subnet_arch("overhead")
    before = CacheAwarePredictor(cold, hot, costs, fitted)

    def error(p) -> float:
        return statistics.median(abs(p.predict(a) / slower.predict(a) - 1) for a in later)

    assert error(before) > 0.15 and error(device.predictor()) < 0.05
    fixed = device_setup(resnet, tmp_path, "ort-cpu:threads=1,cache_mb=1", device_name="here")
    assert fixed.predictor().cache == CacheModel(2**20) and fixed.calibrate() == 0


def test_one_table_backend_is_calibrated_for_kernels_inside_a_model(tmp_path, resnet) -> None:
    """NCNN is profiled in one cache state, and its kernels alone run slower than inside a model:
    the calibration SubNets give that ratio (and any streaming), not a cache budget."""
    from autotailor.pipeline.workdir import device_setup
    from autotailor.predict.latency import calibration_archs, fit_cache_model, subnet_key

    device = device_setup(resnet, tmp_path, "ncnn:threads=1", device_name="here")
    assert device.hot_target is None
    plan, costs = device.plan, CostModel(device.plan)
    table = LatencyPredictor(plan, [1.0 + i % 3 for i in range(len(plan.kernels))], 0.05)
    archs = calibration_archs(resnet.space, costs)
    measured = [0.84 * (table.predict(a) - 0.05) + 0.05 for a in archs]  # kernels x0.84, the overhead once
    fitted = fit_cache_model(table, table, costs, archs, measured, 2**22)
    assert fitted == CacheModel(2**22, 1.0, math.inf, 0.0, 0.84)
    # the largest SubNet timed 8 % slow once: no streaming term is fitted to that one timing
    slow_largest = measured[:-1] + [1.08 * measured[-1]]
    assert fit_cache_model(table, table, costs, archs, slow_largest, 2**22) == fitted
    with device.open_store() as store:
        for k, ms in zip(plan.kernels, table.kernel_ms):
            store.put(device.target, k.signature, Measurement(ms, 0.0, 1))
        store.put(device.target, "overhead", Measurement(0.05, 0.0, 1))
    assert isinstance(device.predictor(), LatencyPredictor)  # not calibrated: the kernels' sum
    with device.open_store() as store:
        for a, m in zip(archs, measured):
            store.put(device.subnet_target, subnet_key(a), Measurement(m, 0.0, 1))
    predictor = device.predictor()
    assert predictor.cache.in_model_ratio == 0.84
    assert predictor.describe() == "kernels inside a model x0.84"
    assert [predictor.predict(a) for a in archs] == pytest.approx(measured)


def test_calibration_measures_whole_subnets_once_at_the_luts_speed(tmp_path, mnv3) -> None:
    from autotailor.pipeline.workdir import CALIBRATION_ROUNDS, device_setup
    from autotailor.predict.latency import calibration_archs, subnet_key

    archs = calibration_archs(mnv3.space, CostModel(KernelPlan(mnv3, "ort-cpu")))
    measured, devices = {}, {}
    now = device_setup(mnv3, tmp_path, "ort-cpu:threads=1").backend.reference_probe()()
    for slower in (1.0, 2.0):  # the same machine; its LUT profiled as if it had been twice as slow
        device = devices[slower] = device_setup(mnv3, tmp_path, "ort-cpu:threads=1,warmup=2,repeats=9",
                                                lut=tmp_path / f"{slower}.sqlite")
        with pytest.raises(at.AutoTailorError, match="profile them before measuring SubNets"):
            device.calibrate()
        with device.open_store() as store:
            for k in device.plan.kernels:
                store.put(device.target, k.signature, Measurement(slower, 0.0, 1, reference_ms=slower * now))
        assert device.reference_ms() == pytest.approx(slower * now)
        assert device.calibrate() == len(archs) == 22
        assert device.calibrate() == 0  # stored in the LUT: a second run measures nothing
        with device.open_store() as store:
            stored = store.get(device.subnet_target, [subnet_key(a) for a in archs])
        assert len(stored) == 22 and all(m.reference_ms > 0 for m in stored.values())
        # Its rounds pooled: this small model's take under CALIBRATION_SECONDS, so all four are made.
        assert {m.repeats for m in stored.values()} == {CALIBRATION_ROUNDS * 9}
        measured[slower] = device.measured()
    # Each timing is stored with the reference kernel's reading beside it and read back at the
    # LUT's speed: against the LUT of a machine twice as slow, twice the time. Unpaired, the two
    # calibrations' timings differed by a median factor of 1.36 to 2.89 on a 2-vCPU AMD EPYC VM.
    ratios = [measured[2.0][k] / measured[1.0][k] for k in measured[1.0]]
    assert 1.6 < statistics.median(ratios) < 2.5, ratios
    # Timed again on request (a search's final choices): each then holds both timings.
    first = devices[2.0].measured()
    assert device.measure(archs[:3] + archs[:1], again=True) == archs[:3]
    with device.open_store() as store:
        again = store.get(device.subnet_target, [subnet_key(a) for a in archs])
    for a in archs:
        k = subnet_key(a)
        assert again[k].repeats == stored[k].repeats + (9 if a in archs[:3] else 0)
    assert all(0.6 < device.measured()[k] / first[k] < 1.6 for k in first)


def test_two_timings_of_a_subnet_pool_into_their_mean() -> None:
    from autotailor.pipeline.workdir import pooled

    two = pooled(Measurement(1.0, 0.02, 10, 5.0), Measurement(1.2, 0.01, 10, 9.0))
    assert (two.median_ms, two.mad_ms, two.repeats, two.measured_at) == (pytest.approx(1.1), 0.02, 20, 9.0)
    assert pooled(two, Measurement(1.4, 0.0, 10, 12.0)).median_ms == pytest.approx(1.2)  # each timing counts once
    # A timing read at another machine speed is brought to the first one's before pooling.
    paired = pooled(Measurement(1.0, 0.0, 10, 5.0, reference_ms=0.5), Measurement(2.4, 0.0, 10, 9.0, reference_ms=1.0))
    assert (paired.median_ms, paired.reference_ms) == (pytest.approx(1.1), 0.5)


class _ScriptedRuntime:
    """A runtime whose timings are given in order: a disturbance on the real one cannot be set up."""

    def __init__(self, ms: list[float]):
        self.ms = iter(ms)

    def load(self, path, shape) -> None:
        return None

    def time(self, run) -> Measurement:
        return Measurement(next(self.ms), 0.0, 5)


@pytest.mark.parametrize("readings, timings, expected_ms, expected_reference", [
    # the reading before b's first timing is inflated by a disturbance: b keeps 2.00 ms, not
    # 2.00 / 1.25 = 1.6 ms (the pass with the lower quotient, which a search once measured so)
    ([1.0, 1.25, 1.0, 1.0, 1.0], [1.00, 2.00, 2.02, 1.02], [1.00, 2.00], [1.0, 1.0]),
    # the machine really is 25 % slower than when the LUT was built: every reading says so
    ([1.25] * 5, [1.25, 2.5, 2.6, 1.3], [1.00, 2.00], [1.25, 1.25]),
])
def test_time_deployed_keeps_the_faster_timing_with_the_lower_reading_around_it(
        tmp_path, readings, timings, expected_ms, expected_reference) -> None:
    from autotailor.pipeline.workdir import DeviceSetup

    runtime = _ScriptedRuntime(timings)
    scripted = iter(readings)
    runtime.reference_probe = lambda: lambda: next(scripted)
    device = DeviceSetup("scripted", runtime, None, tmp_path / "lut.sqlite", None)
    timed = device.time_deployed([("a.onnx", (1, 3, 8, 8)), ("b.onnx", (1, 3, 8, 8))])  # order a, b, b, a
    assert [m.reference_ms for m in timed] == pytest.approx(expected_reference)
    assert [m.at_speed(1.0) for m in timed] == pytest.approx(expected_ms)  # at the LUT's speed (reference 1.0)


@pytest.mark.parametrize("name", ["squeezenet1_0", "densenet121"])
def test_the_largest_subnet_counts_the_models_own_parameters(name):
    # Layers AutoTailor does not resize (fixed channel groups) count their parameters once:
    # before their handlers counted them, SqueezeNet's largest SubNet had 1.76 M for 1.25 M.
    model = getattr(torchvision.models, name)()
    sn = at.compile(model, torch.zeros(1, 3, 64, 64))
    assert CostModel(KernelPlan(sn, "ort-cpu")).costs(sn.space.max()).params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["torchvision:shufflenet_v2_x0_5", "timm:deit_tiny_patch16_224", "torchvision:vit_b_16"])
def test_kernels_that_read_sizes_or_return_several_tensors_are_enumerated_and_profiled(name) -> None:
    # x.size() and arithmetic on sizes are folded into the kernels that use them; chunk, split
    # and unbind, and nn.MultiheadAttention's (output, weights), are kernels with their consumers.
    import timm

    kind, _, model_name = name.partition(":")
    model = timm.create_model(model_name) if kind == "timm" else getattr(torchvision.models, model_name)()
    size = 64 if "shufflenet" in name else 224
    sn = at.compile(well_conditioned(model), torch.zeros(1, 3, size, size), config="[var.global_vars]\nresolution = [%d]" % size)
    plan = KernelPlan(sn, "ort-cpu")
    assert CostModel(plan).costs(sn.space.max()).params == sum(p.numel() for p in model.parameters())
    odd = [k for k in plan.kernels
           if any(plan.by_name[n].multi or any(plan.by_name[a].scalar for a in plan.by_name[n].args_map.values())
                  for n in plan.groups[k.group].nodes)]
    assert odd
    backend = make_backend("ort-cpu", threads=1, warmup=1, repeats=3)
    for kernel in odd[:2]:
        module, shapes = plan.example(kernel)
        assert backend.measure(module, shapes).repeats == 3
