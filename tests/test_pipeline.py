"""`autotailor run`: every step from one TOML file, resumable; exports run without AutoTailor."""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import autotailor as at
from autotailor.cli import main
from autotailor.compiler.config import load_config
from autotailor.data import BatchLoader, load_data
from autotailor.pipeline.deployment import ExportSettings, export_choices
from autotailor.pipeline.results import ExportsRecord, RunRecord, SearchRecord
from autotailor.pipeline.run import DEMO_CONFIG, plan_run
from autotailor.pipeline.selection import SearchSettings, objectives_for
from autotailor.pipeline.workdir import EvalSettings, eval_data, weights_digest
from autotailor.predict.latency import LutStore
from autotailor.settings import merge_settings
from autotailor.tune import TuneConfig, recalibrated, specialize, specialize_config
from autotailor.tune.evaluate import accuracy as accuracy_of

CONFIG = """\
[run]
model = "torchvision:resnet18"
input_size = 32
data = "digits"
device = "ort-cpu:threads=1,warmup=1,repeats=5,budget_s=0.05"
[var.global_vars]
resolution = [24, 32]
width_ratio = [1.0]
[var.stage_vars]
reduce_depth = [-1, 0]
width_ratio = [0.5, 1.0]
[var.block_vars]
BasicBlock.expand_ratio = [1.0]
[train]
steps = 3
[tune]
steps = 2
[sensitivity]
validation_images = 64
calibration_batches = 1
batch_size = 32
[search]
budgets = 3
population = 8
generations = 2
[export]
formats = ["onnx", "ncnn"]
pick = "1"
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One finished run (shared by the tests below: it takes a minute)."""
    root = tmp_path_factory.mktemp("run")
    config = root / "tailor.toml"
    config.write_text(CONFIG.replace('pick = "1"', 'pick = "7ms"'))  # a budget the search will not have
    code = main(["run", str(config)])
    assert code == 2  # the export step fails on the bad pick; everything before it is recorded
    record = RunRecord.read(root / "tailor")
    assert list(record.steps) == ["compile", "train", "tune", "profile", "sensitivity", "search"]
    config.write_text(CONFIG)
    assert main(["run", str(config)]) == 0
    return root / "tailor"


def test_run_resumes_at_the_failed_step_and_writes_everything(run_dir, capsys) -> None:
    record = RunRecord.read(run_dir)
    assert list(record.steps) == ["compile", "train", "tune", "profile", "sensitivity", "search", "export"]
    assert all(s.seconds > 0 for s in record.steps.values())
    with LutStore(run_dir / "latency.sqlite") as lut:  # ONNX Runtime: kernels flushed and warm, this model's SubNets
        settings = sorted((dict(t.settings)["flush_mb"], "model" in dict(t.settings)) for t in lut.targets())
        assert settings == [(0, False), (16, False), (16, True)]
    search = SearchRecord.read(run_dir)
    assert len(search.choices) == 3 and search.axis == "latency_ms"
    for c in search.choices:
        assert c.metrics["latency_ms"] <= c.limits["latency_ms"] and c.accuracy <= 1
    space = at.load(run_dir).space  # recorded canonical: one network is one SubNet to count and export
    assert [c.arch for c in search.choices] == [space.canonical(c.arch) for c in search.choices]
    exports = ExportsRecord.read(run_dir).exports
    assert [e.name for e in exports] == [search.choices[1].budget]
    e = exports[0]
    assert e.measured["latency_ms"] > 0 and 0 <= e.measured["accuracy"] <= 1
    assert sorted(p.rsplit("/", 1)[1] for p in e.files) == ["subnet.bin", "subnet.onnx", "subnet.param"]
    report = (run_dir / "report.md").read_text()
    for text in ("## Time per step", "## Search", "## Exported SubNets, measured", "![Pareto front](report.png)"):
        assert text in report
    assert (run_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a second run redoes nothing but the report
    capsys.readouterr()
    assert main(["run", str(run_dir.parent / "tailor.toml")]) == 0
    out = capsys.readouterr().out
    assert out.count("done before") == 7 and RunRecord.read(run_dir) == record


def test_exported_subnets_run_without_autotailor(run_dir, tmp_path) -> None:
    e = ExportsRecord.read(run_dir).exports[0]
    sn = at.load(run_dir)
    arch = sn.space.complete(e.arch)
    data = eval_data("digits", 32, EvalSettings(validation_images=64, calibration_batches=1, batch_size=32))
    x = torch.randn(sn.input_shape(arch), generator=torch.Generator().manual_seed(0))
    with recalibrated(sn, arch, data.calibration), torch.no_grad():
        ref = sn(x)
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "ref.npy", ref.numpy())
    onnx_path = next(f for f in e.files if f.endswith(".onnx"))
    param = next(f for f in e.files if f.endswith(".param"))
    code = f"""
        import sys
        sys.modules["autotailor"] = None
        sys.modules["torch"] = None  # the runtimes alone
        import numpy as np, onnxruntime as ort, ncnn
        x, ref = np.load("{tmp_path}/x.npy"), np.load("{tmp_path}/ref.npy")
        scale = np.abs(ref).max()
        y = ort.InferenceSession("{onnx_path}", providers=["CPUExecutionProvider"]).run(None, {{"input": x}})[0]
        assert np.abs(y - ref).max() <= 1e-4 * scale, ("onnx", np.abs(y - ref).max() / scale)
        net = ncnn.Net()
        net.load_param("{param}")
        net.load_model("{param[:-6]}.bin")
        ex = net.create_extractor()
        ex.input("in0", ncnn.Mat(np.ascontiguousarray(x[0])).clone())
        _, out = ex.extract("out0")
        y = np.array(out).reshape(ref.shape)
        assert np.abs(y - ref).max() <= 1e-3 * scale, ("ncnn", np.abs(y - ref).max() / scale)
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, timeout=300)


def test_search_and_export_commands(run_dir, capsys) -> None:
    work = str(run_dir)
    assert main(["search", work, "--macs-m", "8,20", "--device", "none", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout holds the JSON alone; the summary line is on stderr
    assert "budgets searched in" in captured.err, captured.err
    assert [c["limits"] for c in result["choices"]] == [{"macs": 8e6}, {"macs": 20e6}]
    assert all(c["arch"] is None or c["metrics"]["macs"] <= c["limits"]["macs"] for c in result["choices"])
    assert "latency_ms" not in result["choices"][-1]["metrics"] or result["device"] is None
    assert main(["export", work, "--pick", "9ms"]) == 2
    assert "--pick '9ms' names no chosen SubNet; the search chose: macs=" in capsys.readouterr().err
    assert main(["export", work, "--format", "tflite"]) == 2
    assert "unknown export format(s) ['tflite']; allowed: ['onnx', 'torchscript', 'ncnn', 'openvino']" in capsys.readouterr().err
    assert main(["search", work, "--latency-ms", "1", "--device", "none"]) == 2
    assert "latency budgets need a device" in capsys.readouterr().err


def test_run_config_errors(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nmodel = 'torchvision:resnet18'\nspeed = 'fast'\n")
    with pytest.raises(at.AutoTailorError, match=r"unknown key\(s\) run.speed; allowed: \['model'"):
        plan_run(bad)
    bad.write_text("[run]\nmodel = 'torchvision:resnet18'\n")
    with pytest.raises(at.AutoTailorError, match=r"\[run\] needs \['data'\]"):
        plan_run(bad)
    with pytest.raises(at.AutoTailorError, match="does not exist"):
        plan_run(tmp_path / "missing.toml")
    demo = tmp_path / "demo.toml"
    demo.write_text(DEMO_CONFIG)
    plan = plan_run(demo, tmp_path / "w")
    assert [s for s, _, _ in plan.steps] == ["compile", "train", "tune", "profile", "sensitivity", "search", "export"]
    # every step table of the demo is valid for its step
    steps = load_config(demo).steps
    for cls, section in ((TuneConfig, "train"), (TuneConfig, "tune"), (EvalSettings, "sensitivity"),
                         (SearchSettings, "search"), (ExportSettings, "export")):
        merge_settings(cls, section, steps[section])
    with pytest.raises(at.AutoTailorError, match="unknown search setting 'budget'; allowed: latency_ms"):
        merge_settings(SearchSettings, "search", {"budget": 3})


def test_search_verify_measures_the_chosen_subnets_and_refits(run_dir, capsys) -> None:
    from autotailor.pipeline.finalists import Finalists
    from autotailor.pipeline.selection import _within_measured
    from autotailor.pipeline.workdir import device_setup
    from autotailor.predict.latency import CostModel, calibration_archs, subnet_arch, subnet_key
    from autotailor.search import Budget, Choice

    work, device = str(run_dir), "ort-cpu:threads=1,warmup=1,repeats=5,budget_s=0.05"
    assert main(["search", work, "--budgets", "3", "--device", device, "--verify", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0 <= result["verify_rounds"] <= 2 and "kernels inside a model x" in result["latency_model"]
    sn = at.load(run_dir / "supernet.pt")
    setup = device_setup(sn, work, device)
    measured = setup.measured()
    chosen = [c for c in result["choices"] if c["arch"] is not None]
    assert chosen
    for c in chosen:  # each choice measured whole, stored in the LUT, and reported
        key = subnet_key(sn.space.complete(c["arch"]))
        assert c["measured_latency_ms"] == pytest.approx(measured[key]) and measured[key] > 0
    # the calibration's SubNets and the verified ones (of every round) all take part in the fit
    calibration = calibration_archs(sn.space, CostModel(setup.plan))
    assert {subnet_key(a) for a in calibration} | {subnet_key(sn.space.complete(c["arch"])) for c in chosen} \
        <= set(measured)
    # a measured SubNet's latency is its measurement from then on, any other's the prediction
    objectives = objectives_for(sn, work, setup)
    slowest = max(chosen, key=lambda c: c["measured_latency_ms"])

    def latency(arch):
        return objectives.metric("latency_ms", arch)
    for c in chosen:
        assert latency(sn.space.complete(c["arch"])) == measured[subnet_key(sn.space.complete(c["arch"]))]
    unmeasured = next(a for a in (sn.space.sample(random.Random(i)) for i in range(100)) if subnet_key(a) not in measured)
    assert latency(unmeasured) == pytest.approx(setup.predictor().predict(unmeasured))
    for c in chosen:  # each choice meets its budget as measured, unless no measured SubNet does
        assert c["measured_latency_ms"] <= c["limits"]["latency_ms"] or min(measured.values()) > c["limits"]["latency_ms"]
    # a choice measured over its budget gives way to the most accurate measured SubNet within it
    limit = 0.999 * slowest["measured_latency_ms"]
    over = Choice(Budget.of(latency_ms=limit), slowest["arch"], None, {}, 0.0)
    fits = [subnet_arch(k) for k, ms in measured.items() if ms <= limit]
    assert fits  # the calibration's lightest SubNets at least
    replaced = _within_measured(over, objectives, measured, None)
    assert replaced.arch == max(fits, key=objectives.accuracy) and replaced.metrics["latency_ms"] <= limit
    assert replaced.accuracy == objectives.accuracy(replaced.arch)
    # with finalists, measured accuracy decides among the measured SubNets within the budget
    finalists = Finalists(sn, None, run_dir / "finalists.json", 1)
    worst, best = min(fits, key=objectives.accuracy), max(fits, key=objectives.accuracy)
    assert objectives.accuracy(worst) < objectives.accuracy(best)
    for arch, accuracy in ((worst, 0.99), (best, 0.5), (sn.space.complete(slowest["arch"]), 1.0)):
        finalists.measured[finalists._key(arch)] = {"arch": arch, "accuracy": accuracy}
    assert _within_measured(over, objectives, measured, finalists).arch == worst
    assert main(["report", work]) == 0  # the report shows each choice's measured latency
    report = (run_dir / "report.md").read_text()
    assert "| measured latency_ms |" in report and f"repeated {result['verify_rounds']} time(s)" in report
    first = chosen[0]
    assert f"| {first['budget']} |" in report
    assert report.split(f"| {first['budget']} |")[1].split("\n")[0].rstrip(" |").endswith(
        f"{first['measured_latency_ms']:.3g} ms")
    assert main(["search", work, "--budgets", "3", "--device", "none", "--axis", "macs", "--verify", "1"]) == 2
    assert "verify measures the chosen SubNets on a device: give --device" in capsys.readouterr().err


def test_search_finalists_choose_the_most_accurate_measured_subnet(run_dir, capsys) -> None:
    from autotailor.pipeline.finalists import Finalists, standard_error
    from autotailor.pipeline.workdir import load_original, original_calibration
    from autotailor.tune import evaluate

    work = str(run_dir)
    assert main(["search", work, "--macs-m", "20,60", "--device", "none", "--finalists", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["finalists"] == 3
    sn = at.load(run_dir / "supernet.pt")
    # by default, the sensitivity table's validation subset and calibration
    data = eval_data("digits", 32, EvalSettings(validation_images=64, calibration_batches=1, batch_size=32))
    stored = json.loads((run_dir / "finalists.json").read_text())
    assert stored["info"] == {**data.describe(), "weights": weights_digest(run_dir)}  # stale once tuned again
    measured = list(stored["subnets"].values())
    objectives = objectives_for(sn, work, None)
    chosen = [c for c in result["choices"] if c["arch"] is not None]
    assert len(chosen) == 2
    original = load_original(run_dir)
    for c in chosen:
        arch = sn.space.complete(c["arch"])
        # the shared weights, or the user's where they measure more accurate (near chance with either here)
        if c["weights"] == "original":
            expected = evaluate(original, arch, data.val, original_calibration(original, arch, data.calibration))
        else:
            expected = evaluate(sn, arch, data.val, data.calibration)
        assert c["measured_accuracy"] == pytest.approx(expected)
        assert objectives.metric("macs", arch) <= c["limits"]["macs"]
        within = [m["accuracy"] for m in measured if objectives.metric("macs", m["arch"]) <= c["limits"]["macs"]]
        # the most accurate, or one measured within a standard error of it that is predicted better
        assert len(within) >= 3 and c["measured_accuracy"] >= max(within) - standard_error(max(within), 64)
    # measured once: a later search reuses the measurements; other data starts afresh
    finalists = Finalists.open(sn, work, data, 3)
    assert finalists.measure([c["arch"] for c in chosen]) == 0 and len(finalists.measured) == len(measured)
    other = eval_data("digits", 32, EvalSettings(validation_images=32, calibration_batches=1, batch_size=32))
    assert Finalists.open(sn, work, other, 3).measured == {}
    assert main(["report", work]) == 0  # the report shows each choice's measured accuracy
    report = (run_dir / "report.md").read_text()
    assert "Each budget's 3 best-predicted SubNets were measured for accuracy" in report
    row = report.split(f"| {chosen[0]['budget']} |")[1].split("\n")[0].split("|")
    assert row[1].strip() == f"{100 * chosen[0]['measured_accuracy']:.2f} %"


def test_finalists_measured_within_one_standard_error_tie_and_the_prediction_decides(run_dir) -> None:
    from autotailor.pipeline.finalists import Finalists
    from autotailor.search import Budget

    sn = at.load(run_dir / "supernet.pt")
    objectives = objectives_for(sn, str(run_dir), None)
    archs = [sn.space.complete(sn.space.sample(random.Random(i))) for i in range(40)]
    weak, strong = min(archs, key=objectives.accuracy), max(archs, key=objectives.accuracy)
    assert objectives.accuracy(weak) < objectives.accuracy(strong)
    budget = Budget.of(macs=1e12)

    def finalists(images: int, measured: list[tuple[dict, float]]) -> Finalists:
        f = Finalists(sn, None, run_dir / "unused.json", 2, info={"validation_images": images})
        for arch, accuracy in measured:
            f.measured[f._key(arch)] = {"arch": arch, "accuracy": accuracy}
        return f

    # the weaker predicted measured 1 point higher: on 400 images (one standard error 1.43
    # points at 91 %) a tie, which the prediction breaks; on 100,000 (0.09 points) it wins
    both = [(weak, 0.91), (strong, 0.90)]
    assert finalists(400, both).most_accurate([weak, strong], objectives, budget) == strong
    assert finalists(100_000, both).most_accurate([weak, strong], objectives, budget) == weak
    assert finalists(0, both).most_accurate([weak, strong], objectives, budget) == weak  # images unknown: exact
    # beyond one standard error the measurement decides, and unmeasured SubNets are not chosen
    apart, other = finalists(400, [(weak, 0.95), (strong, 0.90)]), next(a for a in archs if a not in (weak, strong))
    assert apart.most_accurate([weak, strong, other], objectives, budget) == weak
    assert apart.most_accurate([other], objectives, budget) is None


def test_a_choice_timed_over_its_budget_times_the_best_finalist_within_it(run_dir, tmp_path) -> None:
    from autotailor.pipeline.finalists import Finalists
    from autotailor.pipeline.selection import _time_finalists_for_over
    from autotailor.pipeline.workdir import device_setup
    from autotailor.predict.latency import subnet_key
    from autotailor.search import Budget, Choice

    work = tmp_path / "run"
    shutil.copytree(run_dir, work)  # the LUT gains measurements
    sn = at.load(work / "supernet.pt")
    setup = device_setup(sn, str(work), "ort-cpu:threads=1,warmup=1,repeats=5,budget_s=0.05")
    objectives = objectives_for(sn, str(work), setup)
    largest = sn.space.complete(sn.space.max())
    budget = Budget.of(latency_ms=0.99 * objectives.metric("latency_ms", largest))
    known = setup.measured()
    fresh = [a for a in (sn.space.complete(sn.space.sample(random.Random(100 + i))) for i in range(40))
             if subnet_key(a) not in known and objectives.feasible(a, budget)][:5]
    assert len(fresh) == 5
    finalists = Finalists(sn, None, work / "finalists.json", 2, info={"validation_images": 0})
    for i, arch in enumerate(fresh):  # the last the most accurate
        finalists.measured[finalists._key(arch)] = {"arch": arch, "accuracy": 0.5 + 0.01 * i}
    within = Choice(budget, fresh[0], None, {}, 0.0)
    assert _time_finalists_for_over([within], sn, str(work), setup, finalists, objectives, None) is objectives
    assert setup.measured().keys() == known.keys()  # a choice within its budget times nothing
    over = Choice(budget, largest, None, {}, 0.0)
    after = _time_finalists_for_over([over], sn, str(work), setup, finalists, objectives, None)
    timed = [a for a in fresh if subnet_key(a) in setup.measured()]
    assert 1 <= len(timed) <= finalists.count and subnet_key(fresh[-1]) in setup.measured()
    if len(timed) == 2:  # the most accurate was timed over the budget, and the next best then
        assert not after.feasible(fresh[-1], budget) and fresh[-2] in timed
    assert after.metric("latency_ms", fresh[-1]) == pytest.approx(setup.measured()[subnet_key(fresh[-1])])


def test_run_runs_a_step_again_when_its_inputs_change_and_every_step_after_it(tmp_path) -> None:
    from autotailor.pipeline.run import RunPlan, execute

    calls: list[tuple[str, bool]] = []
    names = ["compile", "tune", "profile", "search", "export"]

    def plan(tune_steps: int, budgets: int) -> RunPlan:
        tables = {"compile": 1, "tune": tune_steps, "profile": 0, "search": budgets, "export": 0}
        return RunPlan(tmp_path / "c.toml", tmp_path / "w",
                       [(n, {"table": tables[n]}, (lambda n: lambda again: calls.append((n, again)))(n)) for n in names])

    (tmp_path / "w").mkdir()
    execute(plan(2, 3))
    assert calls == [(n, False) for n in names]
    calls.clear()
    execute(plan(2, 3))
    assert calls == []
    execute(plan(2, 4))  # a search setting: search and what follows it
    assert calls == [("search", True), ("export", True)]
    calls.clear()
    execute(plan(5, 4))  # a tuning setting: the weights were tuned in place, so from compile on
    assert calls == [(n, True) for n in names]


def test_a_run_file_is_checked_whole_before_the_first_step(tmp_path) -> None:
    config = tmp_path / "t.toml"
    for table, message in (("[export]\nformats = ['tflite']", r"unknown export format\(s\) \['tflite'\]; allowed"),
                           ("[tune]\nlr = -1.0", r"tune.lr = -1.0 is not allowed; expected a positive number"),
                           ("[search]\nbudget = 3", "unknown search setting 'budget'; allowed: latency_ms"),
                           ("[var.stage_vars]\nreduce_depth = [1]", r"reduce_depth = \[1\] is not allowed"),
                           ("device = 'tpu'", "unknown backend 'tpu'")):
        config.write_text("[run]\nmodel = 'torchvision:resnet18'\ndata = 'digits'\n" + table)
        with pytest.raises(at.AutoTailorError, match=message):
            plan_run(config, tmp_path / "w")
        assert not (tmp_path / "w").exists()  # nothing ran


def test_bundle_holds_the_exported_subnets_for_the_on_device_runtime(run_dir, tmp_path, capsys) -> None:
    import dataclasses
    import shutil

    import onnxruntime as ort

    from autotailor.runtime import Bundle, Runtime

    work = tmp_path / "w"  # other tests search run_dir again, with or without a device
    shutil.copytree(run_dir, work, ignore=shutil.ignore_patterns("*.ckpt", "*.sqlite"))
    search = dataclasses.replace(SearchRecord.read(work), device="ort-cpu:threads=1")
    search.write(work)
    assert main(["bundle", str(work), "--out", str(tmp_path / "b")]) == 0
    bundle = Bundle.load(tmp_path / "b")
    (exported,) = ExportsRecord.read(work).exports
    (entry,) = bundle.subnets
    assert entry.name == exported.name and entry.device == search.device and entry.target == search.target
    assert entry.measured_latency_ms == exported.measured["latency_ms"] > 0
    assert entry.latency_noise_ms == exported.measured["latency_mad_ms"] >= 0
    assert entry.measured_accuracy == exported.measured["accuracy"]
    assert entry.input_shape == tuple(at.load(work).input_shape(exported.arch))
    x = np.random.default_rng(0).random(entry.input_shape, dtype=np.float32)
    onnx_file = next(f for f in exported.files if f.endswith(".onnx"))
    session = ort.InferenceSession(onnx_file, providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {session.get_inputs()[0].name: x})
    assert np.allclose(Runtime(tmp_path / "b", slo_ms=1000).infer(x), expected, atol=1e-5)
    assert main(["bundle", str(work), "--out", str(tmp_path / "c"), "--device", "ncnn:threads=1"]) == 2
    assert "was searched and exported for 'ort-cpu:threads=1', not 'ncnn:threads=1'" in capsys.readouterr().err
    dataclasses.replace(search, device=None).write(work)
    assert main(["bundle", str(work), "--out", str(tmp_path / "d")]) == 2
    assert "used no device; name the device the exports were measured on" in capsys.readouterr().err


def test_a_fleet_runs_the_shared_steps_once_and_keeps_each_devices_results_apart(tmp_path, capsys) -> None:
    ort_cpu, ncnn = "ort-cpu:threads=1,warmup=1,repeats=5,budget_s=0.05", "ncnn:threads=1,warmup=1,repeats=5,budget_s=0.05"
    config = tmp_path / "fleet.toml"
    config.write_text(CONFIG.replace(f'device = "{ort_cpu}"', f'devices = ["{ort_cpu}", "{ncnn}"]')
                      .replace('formats = ["onnx", "ncnn"]\npick = "1"', 'formats = ["onnx"]')
                      .replace("[var.global_vars]", f'[run.budgets]\n"{ncnn}" = 2\n[var.global_vars]'))
    assert main(["run", str(config)]) == 0
    work = tmp_path / "fleet"
    record = RunRecord.read(work)
    assert list(record.steps) == ["compile", "train", "tune", "sensitivity",
                                  f"profile {ort_cpu}", f"search {ort_cpu}", f"export {ort_cpu}",
                                  f"profile {ncnn}", f"search {ncnn}", f"export {ncnn}"]
    searches = {}
    for device, budgets in ((ort_cpu, 3), (ncnn, 2)):  # ncnn's own budget count from [run.budgets]
        folder = work / "devices" / device.replace(":", "_").replace(",", "_").replace("=", "_")
        searches[device] = search = SearchRecord.read(folder)
        assert search.device == device and len(search.choices) == budgets
        exported = ExportsRecord.read(folder).exports
        assert len(exported) == len(search.met)
        assert all(f.startswith(str(folder / "export")) for e in exported for f in e.files)
        suffixes = {f.rsplit(".", 1)[1] for e in exported for f in e.files}  # [export]'s onnx and its own
        assert suffixes == ({"onnx"} if device == ort_cpu else {"onnx", "param", "bin"})
        assert all(e.measured["latency_ms"] > 0 and e.measured["latency_raw_ms"] > 0 for e in exported)
        assert main(["bundle", str(work), "--out", str(tmp_path / device[:4]), "--device", device]) == 0
    assert not (work / "search.json").exists() and not (work / "exports.json").exists()
    capsys.readouterr()
    assert main(["run", str(config)]) == 0  # nothing changed: every step done before
    assert capsys.readouterr().out.count("done before") == 10
    assert searches[ort_cpu].target != searches[ncnn].target  # each its own LUT target
    with LutStore(work / "latency.sqlite") as lut:
        assert sorted({t.backend for t in lut.targets()}) == ["ncnn", "ort-cpu"]
    report = (work / "report.md").read_text()
    for device in (ort_cpu, ncnn):
        assert f"## {device}: Search" in report and f"## {device}: Exported SubNets, measured" in report
    assert report.count("![Pareto front](devices/") == 2
    assert main(["bundle", str(work), "--out", str(tmp_path / "b")]) == 2
    assert f"holds a fleet's results; name the device to bundle: --device {ncnn} or --device {ort_cpu}" in \
        capsys.readouterr().err


def test_fleet_run_files_are_checked(tmp_path) -> None:
    config = tmp_path / "t.toml"
    head = "[run]\nmodel = 'torchvision:resnet18'\ndata = 'digits'\n"
    for run, message in (("device = 'ort-cpu'\ndevices = ['ncnn']", "give run.device .* or run.devices .*, not both"),
                         ("devices = ['ort-cpu', 'ort-cpu']", r"run.devices names \['ort-cpu'\] more than once"),
                         ("devices = []", "run.devices must be a non-empty list of device specs"),
                         ("devices = ['ort-cpu', 'tpu']", "unknown backend 'tpu'"),
                         ("devices = ['ort-cpu']\n[run.budgets]\nncnn = 3", r"run.budgets names 'ncnn', which is not in"),
                         ("devices = ['ort-cpu']\n[run.budgets]\nort-cpu = 'many'", "give a count of budgets"),
                         ("devices = ['ort-cpu']\n[run.budgets]\nort-cpu = [0]", r"search.latency_ms = \[0\] is not allowed")):
        config.write_text(head + run)
        with pytest.raises(at.AutoTailorError, match=message):
            plan_run(config, tmp_path / "w")


def test_an_int8_device_exports_its_own_file_and_measures_its_accuracy(run_dir, tmp_path, capsys) -> None:
    work = tmp_path / "work"
    shutil.copytree(run_dir, work)
    assert main(["export", str(work), "--pick", "1", "--device", "none"]) == 0  # float, accuracy measured in torch
    fp32 = ExportsRecord.read(work).exports[0]
    assert main(["export", str(work), "--pick", "1", "--device", "ort-cpu:threads=1,precision=int8"]) == 0
    capsys.readouterr()
    e = ExportsRecord.read(work).exports[0]
    onnx_file = next(f for f in e.files if f.endswith(".onnx"))
    assert "QuantizeLinear" in {n.op_type for n in onnx.load(onnx_file).graph.node} and e.arch == fp32.arch
    assert e.measured["latency_ms"] > 0
    # the int8 file's accuracy, measured on the file (digits, a small validation sample): near the fp32 SubNet's
    assert abs(e.measured["accuracy"] - fp32.measured["accuracy"]) <= 0.08, (e.measured, fp32.measured)


def test_export_can_fine_tune_each_chosen_subnet_alone_from_the_start_its_probe_prefers(run_dir, tmp_path,
                                                                                       capsys) -> None:
    from autotailor.pipeline.deployment import FineTuned
    from autotailor.pipeline.results import ORIGINAL_WEIGHTS, SHARED_WEIGHTS
    from autotailor.pipeline.workdir import is_original_model, load_original

    work = tmp_path / "work"
    shutil.copytree(run_dir, work)
    # searched again without finalists (another test's may have chosen the user's model): the
    # middle budget's choice, a SubNet of the shared weights smaller than the model
    assert main(["search", str(work), "--budgets", "3", "--device", "none", "--axis", "macs"]) == 0
    assert main(["export", str(work), "--finetune-steps", "-1"]) == 2
    assert "export.finetune_steps = -1 is not allowed; expected 0 (off) or more" in capsys.readouterr().err
    flags = ["--finetune-steps", "30", "--finetune-lr", "0.05", "--device", "none", "--pick", "1"]
    assert main(["export", str(work), *flags]) == 0
    out = capsys.readouterr().out
    e = ExportsRecord.read(work).exports[0]
    sn, original = at.load(work), load_original(work)
    arch = sn.space.complete(e.arch)
    assert e.weights == SHARED_WEIGHTS and original is not None and not is_original_model(original, arch)
    # each start fine-tuned for an eighth of the steps (the probe) and measured on the validation subset
    assert "fine-tuning a SubNet alone from the shared weights for 3 steps, a probe (kept in" in out, out
    assert "fine-tuning a SubNet alone from the original model's weights for 3 steps, a probe (kept in" in out, out
    loader = BatchLoader(load_data("digits", seed=0)[0], 64, train=True, resolution=sn.example_shape[-1])
    data = eval_data("digits", 32, EvalSettings(validation_images=64, calibration_batches=1, batch_size=32))
    config = specialize_config(30, 0.05)
    starts = {SHARED_WEIGHTS: sn, ORIGINAL_WEIGHTS: original}
    for name, start in starts.items():  # again, in a folder of its own: the same accuracy as recorded
        probed = specialize(start, arch, loader, specialize_config(3, 0.05), tmp_path / f"probe-{name}")
        assert accuracy_of(probed, data.val, arch["resolution"]) == e.measured[f"accuracy_probe_{name}"]
    winner = ORIGINAL_WEIGHTS if e.measured["accuracy_probe_original"] > e.measured["accuracy_probe_shared"] \
        else SHARED_WEIGHTS
    said = {SHARED_WEIGHTS: "shared weights", ORIGINAL_WEIGHTS: "original model's weights"}[winner]
    assert f"fine-tuning a SubNet alone from the {said} for 30 steps (kept" in out, out
    alone = specialize(starts[winner], arch, loader, config, work / "specialized")  # the kept one: loaded
    with recalibrated(sn, arch, data.calibration):
        shared = sn.extract(arch).eval()
    measured = {k: accuracy_of(net, data.val, arch["resolution"]) for k, net in (("finetuned", alone), ("shared", shared))}
    assert e.measured["accuracy_finetuned"] == measured["finetuned"]
    assert e.measured["accuracy_unfinetuned"] == measured["shared"]
    kept_finetuned = measured["finetuned"] >= measured["shared"]
    assert e.finetuned_from == (winner if kept_finetuned else None)
    assert e.measured["accuracy"] == max(measured.values())
    assert (f"exported the fine-tuned one (from the {said})" if kept_finetuned else "exported the one not fine-tuned") \
        in out, out
    x = torch.randn(sn.input_shape(arch), generator=torch.Generator().manual_seed(0))
    onnx_path = next(f for f in e.files if f.endswith(".onnx"))
    y = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})[0]
    with torch.no_grad():
        ref = (alone if kept_finetuned else shared)(x).numpy()
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()
    # both probes and the winner's weights are kept
    kept = sorted(p.name for p in (work / "specialized").iterdir())
    assert sorted(p.suffix for p in (work / "specialized").iterdir()) == [".pt", ".pt", ".pt"], kept
    # exported again: the kept weights and probes, no training
    assert main(["export", str(work), *flags]) == 0
    out = capsys.readouterr().out
    assert "fine-tuning a SubNet" not in out, out
    assert sorted(p.name for p in (work / "specialized").iterdir()) == kept
    # a fine-tuned SubNet less accurate than the chosen weights' is not what is exported
    worse = copy.deepcopy(shared)
    for p in worse.parameters():
        p.data.zero_()  # every class scored alike: argmax is class 0
    chosen = SearchRecord.read(work).pick("1")
    [again] = export_choices(sn, tmp_path / "out", chosen, ["onnx"], data, None,
                             finetuned=lambda a: FineTuned(worse, SHARED_WEIGHTS, {}))
    assert again.measured["accuracy_finetuned"] < again.measured["accuracy_unfinetuned"] == again.measured["accuracy"]
    assert again.finetuned_from is None


def test_the_original_weights_are_chosen_and_exported_where_they_are_more_accurate_than_the_shared_ones(
        run_dir, tmp_path, capsys) -> None:
    from autotailor.pipeline.results import ORIGINAL_WEIGHTS
    from autotailor.tune import evaluate

    work = tmp_path / "w"
    shutil.copytree(run_dir, work)
    assert (work / "original.pt").is_file()  # the run's tune kept what it started from
    # a tuning gone wrong: the run's weights as the user's model (with its largest SubNet's
    # BatchNorm statistics, which the few steps of training barely moved), and as shared weights
    # the same with the classifier's rows moved one class on, so that every SubNet names the wrong class
    sn = at.load(work)
    largest = sn.space.complete(sn.space.max())
    data = eval_data("digits", 32, EvalSettings(validation_images=64, calibration_batches=1, batch_size=32))
    with recalibrated(sn, largest, data.calibration):
        sn.save(work / "original.pt")
    weight, bias = sn.net.fc.weight, sn.net.fc.bias  # torchvision's classifier
    with torch.no_grad():
        weight.copy_(weight.roll(1, 0))
        bias.copy_(bias.roll(1, 0))
    sn.save(work / "supernet.pt")
    original = at.load(work / "original.pt")
    sn = at.load(work)
    expected = accuracy_of(original.extract(largest).eval(), data.val, 32)  # its own statistics, not recalibrated
    macs = objectives_for(sn, str(work), None).metric("macs", largest)
    capsys.readouterr()
    assert main(["search", str(work), "--macs-m", f"{macs / 2e6:.3f},{1.01 * macs / 1e6:.3f}", "--device", "none",
                 "--finalists", "2"]) == 0
    out = capsys.readouterr().out
    small, top = SearchRecord.read(work).choices
    finalists = json.loads((work / "finalists.json").read_text())
    assert expected > max(e["accuracy"] for e in finalists["subnets"].values())  # the run's weights: near chance
    # the top budget, which the user's model meets: the user's weights win, as the model itself
    # or as the chosen SubNet cut from it (this barely trained model's statistics are its own
    # for the first, recalibrated for the second)
    assert top.weights == ORIGINAL_WEIGHTS and top.measured_accuracy == top.accuracy >= expected
    assert f"the original model's weights, measured accuracy {100 * top.measured_accuracy:.2f} %" in out, out
    if sn.space.key(top.arch) == sn.space.key(largest):
        assert top.measured_accuracy == expected and top.metrics["macs"] == macs
    else:
        top_arch = sn.space.complete(top.arch)
        assert top.measured_accuracy == evaluate(original, top_arch, data.val, data.calibration)
    # the smaller: the SubNet the search chose, with the user's weights (BatchNorm recalibrated)
    # where they measured more accurate than the shared ones (near chance with either here)
    small_arch = sn.space.complete(small.arch)
    mine = evaluate(original, small_arch, data.val, data.calibration)
    theirs = evaluate(sn, small_arch, data.val, data.calibration)
    assert small.metrics["macs"] <= macs / 2
    assert (small.weights, small.measured_accuracy) == ((ORIGINAL_WEIGHTS, mine) if mine > theirs else ("shared", theirs))
    assert expected in finalists["original"].values() and mine in finalists["original"].values()
    # exported as measured
    assert main(["export", str(work), "--pick", "all", "--device", "none", "--format", "onnx"]) == 0
    exported = {e.name: e for e in ExportsRecord.read(work).exports}
    for c in (small, top):
        assert exported[c.budget].weights == c.weights
        assert exported[c.budget].measured["accuracy"] == pytest.approx(c.measured_accuracy, abs=1.01 / 64)  # an image at most
    def onnx_output(exported, x: torch.Tensor) -> np.ndarray:
        path = next(f for f in exported.files if f.endswith(".onnx"))
        return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x.numpy()})[0]

    # the user's model as it is: its own weights and BatchNorm statistics, never fine-tuned
    whole = dataclasses.replace(top, arch=largest, weights=ORIGINAL_WEIGHTS)
    [e] = export_choices(sn, tmp_path / "whole", [whole], ["onnx"], data, None, original=original,
                         finetuned=lambda arch: pytest.fail("the user's model was fine-tuned"))
    assert e.measured["accuracy"] == expected and e.finetuned_from is None and "accuracy_finetuned" not in e.measured
    x = torch.randn(sn.input_shape(largest), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = original.extract(largest).eval()(x).numpy()
    assert np.abs(onnx_output(e, x) - ref).max() <= 1e-4 * np.abs(ref).max()
    # a smaller SubNet with the user's weights: BatchNorm recalibrated, as measured
    cut = dataclasses.replace(small, weights=ORIGINAL_WEIGHTS)
    [e] = export_choices(sn, tmp_path / "cut", [cut], ["onnx"], data, None, original=original)
    assert e.measured["accuracy"] == mine
    x = torch.randn(sn.input_shape(small_arch), generator=torch.Generator().manual_seed(0))  # at its resolution
    with recalibrated(original, small_arch, data.calibration), torch.no_grad():
        ref = original.extract(small_arch).eval()(x).numpy()
    assert np.abs(onnx_output(e, x) - ref).max() <= 1e-4 * np.abs(ref).max()
    assert main(["report", str(work)]) == 0
    report = (work / "report.md").read_text()
    assert "budgets chose distinct SubNets (some with the original model's weights)." in report
    originals = sum(c.weights == ORIGINAL_WEIGHTS for c in (small, top))
    assert report.count("| original weights |") == 2 * originals  # the search's rows and the exports'
    # with verify, it is timed first, and chosen only if that timing meets the budget
    assert main(["search", str(work), "--latency-ms", "1000", "--device", "ort-cpu:threads=1,warmup=1,repeats=5,"
                 "budget_s=0.05", "--verify", "1", "--finalists", "2"]) == 0
    (timed,) = SearchRecord.read(work).choices
    assert timed.weights == ORIGINAL_WEIGHTS and 0 < timed.measured_latency_ms == timed.metrics["latency_ms"]
    # what tuning started from gone: the export says what to do
    (work / "original.pt").unlink()
    capsys.readouterr()
    assert main(["export", str(work), "--pick", "0", "--device", "none", "--format", "onnx"]) == 2
    assert ("the search chose the original model's weights, which (WORK/original.pt) are gone: run `autotailor "
            "search` again") in capsys.readouterr().err
    # searched again without them: SubNets only
    assert main(["search", str(work), "--macs-m", f"{1.01 * macs / 1e6:.3f}", "--device", "none",
                 "--finalists", "2"]) == 0
    assert [c.weights for c in SearchRecord.read(work).choices] == ["shared"]
