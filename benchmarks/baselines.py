"""AutoTailor's front against the baselines the paper compares with, on CIFAR-10.

Reproduce (from the repository root, after `make install`; hours on 2 cores, resumable)::

    .venv/bin/python benchmarks/tuning_schedules.py --schedules sandwich4-4ep,sandwich4-4ep+4ep,sandwich4-4ep+4ep+4ep
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/baselines.py --data ../shared/data/cifar10
    .venv/bin/python benchmarks/baselines.py --report-only

For ResNet-18 and MobileNetV2 of ``cifar_models`` (their trained weights, ``train_base.py``;
``--models resnet18_e60,mobilenet_v2_e60`` takes the weights of ``train_base.py --name`` runs
instead, and keeps every artifact under those names):

- **AutoTailor**: the SuperNet tuned with the model's ``schedule`` (its weights kept in
  ``benchmarks/artifacts/``) in the default space (``--channel-multiple N``: with every width
  choice a multiple of N channels), profiled for ONNX Runtime with 1 thread, its sensitivities
  measured, and ``BUDGETS`` latency budgets searched with ``--verify 2 --finalists 4``,
  all through the command line a user has (the paper searches 40-50). Each choice then takes
  the base model's own weights where they measure more accurate on the finalists' validation
  sample, as ``search --finalists`` now decides with ``WORK/original.pt``
  (``original_weights_points``: applied to the committed searches' choices). Then, as ``autotailor
  export --finetune-steps`` deploys them, each chosen SubNet fine-tuned alone for
  ``ALONE_STEPS`` batches from the shared weights (the largest SubNet as teacher) or the base's
  (the base as teacher), whichever an eighth as long a fine-tuning of each (the probe) makes
  more accurate on the validation sample, and kept unless the SubNet as chosen is more accurate
  there (``alone_points``, ``alone_front``; ``--methods`` without ``alone`` skips it). That
  training and its probes come on top of the tuning's image-steps, and the costs count them.
- **NestDNN***: as the paper approximates NestDNN (its code is not public), the trained base
  model pruned with Torch-Pruning (L1 magnitude, one ratio for every layer, the classifier
  kept, each layer's kept channels rounded down to a multiple of ``ROUND_TO``) at each of
  ``RATIOS``, fine-tuned with the recipe of ``train_base.py`` at the tuning's
  learning rate. Together they get the SuperNet tuning's image-steps (images times networks
  trained on them: 3,128 batches of 64 for 4 SubNets each, per tuning cycle), each ratio a fifth
  (``NESTDNN_STEPS`` a cycle); their weights are kept in ``benchmarks/artifacts/``. Against the
  fine-tuned front, NestDNN* at the same cost too (``EQUAL_COSTS``, ``longer_nestdnn_points``),
  counted two ways: each ratio trained ``fair_steps`` batches more (a fifth of all the chosen
  SubNets' fine-tuning, probes included), or ``each_steps`` at the SubNets' learning rate (one
  SubNet's fine-tuning and probes: five NestDNN* models against five fine-tuned SubNets, one a
  comparison).
- **AdaptiveNet-style** (``adaptivenet.py``): the base model's residual blocks with shrunk,
  merged and skipped variants, the new blocks trained for as many image-steps (``ADAPTIVENET_STEPS``
  batches of one path each a cycle; half branch-wise
  distillation, half tuning on the labels, the originals frozen), and for every third of
  AutoTailor's budgets (``ADAPTIVENET_EVERY``: those of an 8-budget search) its Nearby search on
  its own per-block latency table, accuracy measured on the validation sample AutoTailor's
  finalists use.
- **LegoDNN-style** (``legodnn.py``): each residual block with descendants of its hidden
  channels pruned (no depth change), retrained block-wise on the original blocks' features for
  as many image-steps (``LEGODNN_STEPS`` batches a cycle, each training every descendant); each
  descendant's accuracy drop in the original model measured on that validation sample; for
  every one of AutoTailor's budgets the combination with the least summed drop under its summed
  per-block latency (an integer program).

A schedule of several tuning cycles (``tuning_schedules.CONTINUES``: a warm restart from the
previous cycle's weights) gives each baseline as many cycles of its own, each from the previous
one's weights (``cycles``).

Every model is evaluated on the 10,000 CIFAR-10 test images (AutoTailor's SubNets with
BatchNorm recalibrated on 2,048 training images, as the search does) and timed as ONNX on
ONNX Runtime (1 thread) in two passes, each timing beside a reading of the reference kernel
so that the machine's drift cancels (``DeviceSetup.time_deployed``; latencies are at the
speed the LUT was built at). Compared: accuracy at equal latency (each baseline model against
the most accurate AutoTailor SubNet no slower) and latency at equal accuracy (against the
fastest AutoTailor SubNet at least as accurate), the former with its standard error counted on
the test images where the two models disagree (``paired_points``: which images each point gets
wrong, from the weights it was timed with). Each method's costs (the paper's Fig. 15):
training in image-steps and CPU-minutes, latency profiling, accuracy evaluations and search
(``costs``). The state is kept in
``benchmarks/work/baselines/state.json``, so an interrupted run resumes. Results:
``benchmarks/results/baselines.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable

import numpy as np
import torch

from autotailor.tune import CpuTime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import adaptivenet  # noqa: E402
import block_scaling  # noqa: E402
import cifar_models  # noqa: E402
import legodnn  # noqa: E402
import train_base  # noqa: E402
import tuning_schedules  # noqa: E402
from common import (State, atomic_torch_save, claimed, default_cifar10, fp16_state, fp32_state, head_commit,  # noqa: E402
                    machine, record_cost, recorded_cost, save_figure, write_results)

# a model's name, or a train_base.py run's (``--models resnet18_e60``: the same architecture trained
# longer, each method's artifacts kept under that name)
MODELS = ("resnet18", "mobilenet_v2")
# each architecture's tuning schedule (``tuning_schedules.SCHEDULES``): the one its front is best with
_SCHEDULES = {"resnet18": "sandwich4-4ep+4ep+4ep", "mobilenet_v2": "sandwich4-4ep+4ep+4ep"}
STEPS = 4 * tuning_schedules.STEPS_PER_EPOCH  # the tuning schedule's batches, each for 4 SubNets
RATIOS = (0.2, 0.35, 0.5, 0.65, 0.8)
# ONNX Runtime's x86 convolutions take their fast, blocked path only for channel counts in
# multiples of 8 (AVX2) or 16 (AVX-512); Torch-Pruning's round_to keeps the pruned models on it.
# 8, not 16: rounded down to 16, a layer that would keep fewer channels stays whole, and ResNet-18
# at 0.8 comes out larger than at 0.5 (pruning_alignment.py measures all three roundings).
ROUND_TO = 8
NESTDNN_STEPS = 4 * STEPS // len(RATIOS)
# AutoTailor's chosen SubNets each fine-tuned alone after the search (`autotailor export
# --finetune-steps`): two epochs each at this peak learning rate (docs/tune.md)
ALONE_STEPS, ALONE_LR = 2 * tuning_schedules.STEPS_PER_EPOCH, 0.01
ADAPTIVENET_STEPS = 4 * STEPS
# each LegoDNN-style step trains every block's len(KEEP) descendants: as many image-steps a cycle
LEGODNN_STEPS = ADAPTIVENET_STEPS // len(legodnn.KEEP)


@dataclass(frozen=True)
class BlockMethod:
    """A block-scaling baseline: its module (``supernet``, ``train``), its training batches a
    cycle, and its name in the reports."""

    module: ModuleType
    steps: int
    label: str


BLOCK_METHODS = {"adaptivenet": BlockMethod(adaptivenet, ADAPTIVENET_STEPS, "AdaptiveNet-style"),
                 "legodnn": BlockMethod(legodnn, LEGODNN_STEPS, "LegoDNN-style")}
DEVICE = "ort-cpu:threads=1"
BUDGETS = 22  # a geometric spread: every third budget is one of an 8-budget search's
ADAPTIVENET_EVERY = 3  # its Nearby search costs minutes a budget
METHODS = ("autotailor", "nestdnn", "adaptivenet", "legodnn")
LR, WARMUP = 0.03, 100  # the SuperNet tuning's
CALIBRATION_IMAGES = 2048
TEST_IMAGES = 10_000  # CIFAR-10's test split, on which every point is evaluated
# The paper's Fig. 13 (ImageNet, phones and Jetsons): AutoTailor's mean gain over AdaptiveNet.
PAPER = {"resnet50": {"accuracy_pts": 2.27, "latency_pct": -10.37},
         "mobilenet_v2": {"accuracy_pts": 4.12, "latency_pct": -21.48}}

log = logging.getLogger("baselines")


def _cli(*argv: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    print("$ autotailor " + " ".join(argv), flush=True)
    subprocess.run([str(Path(sys.executable).parent / "autotailor"), *argv], check=True, env=env)


def schedule(model: str) -> str:
    """The tuning schedule of ``model``'s SuperNet (by its architecture)."""
    return _SCHEDULES[cifar_models.architecture(model)]


def _models(state: State) -> list[str]:
    """The models ``state`` has measurements of, the default ones first."""
    return [m for m in MODELS if m in state.data] + sorted(m for m in state.data if m not in MODELS)


def tailored(model: str, multiple: int) -> str:
    """What makes ``model``'s AutoTailor front: its SuperNet's tuning schedule, and the channel
    multiple of its space (``[arch] channel_multiple``) unless 1."""
    return schedule(model) + ("" if multiple == 1 else f", channel_multiple {multiple}")


def compiled(model: str, work: Path, multiple: int = 1) -> Path:
    """The work directory of ``model``'s tuned SuperNet in the space of channel ``multiple``
    (compiled and its kept tuned weights loaded, if not there yet), with the base's weights as
    ``autotailor tune`` keeps them (``original.pt``). The multiple changes the space's channel
    counts, not the channels' order, so the kept tuned weights fit it."""
    import autotailor as at
    from autotailor.pipeline.workdir import ORIGINAL

    folder, made_by = work / model / "autotailor", tailored(model, multiple)
    made = (folder / "schedule").read_text().strip() if (folder / "schedule").is_file() else None
    if folder.is_dir() and made != made_by:
        shutil.rmtree(folder)  # another schedule or space: compiled, profiled and searched again
    space = work / model / "space.toml"
    space.parent.mkdir(parents=True, exist_ok=True)
    space.write_text(f"[arch]\nchannel_multiple = {multiple}\n")

    def base(out: Path):
        _cli("compile", f"cifar_models:{model}_trained", "--input-size", "32", "--config", str(space), "--out", str(out))
        return at.load(out)

    if not (folder / "supernet.pt").is_file():
        kept = tuning_schedules.tuned_artifact(model, schedule(model))
        if not kept.is_file():
            raise SystemExit(f"{kept} is missing: run benchmarks/tuning_schedules.py --models {model} "
                             f"--schedules {schedule(model)}")
        sn = base(folder)
        sn.save(folder / ORIGINAL)
        sn.load_state_dict({k: v.to(sn.state_dict()[k].dtype) for k, v in torch.load(kept, map_location="cpu").items()})
        sn.save(folder / "supernet.pt")
        (folder / "schedule").write_text(made_by + "\n")
    elif not (folder / ORIGINAL).is_file():  # compiled before the base's weights were kept beside
        with tempfile.TemporaryDirectory() as tmp:
            base(Path(tmp)).save(folder / ORIGINAL)
    return folder


def autotailor_work(model: str, data: str, work: Path, multiple: int = 1) -> Path:
    """The work directory of ``model``'s tuned SuperNet (``compiled``), profiled, sensitivities
    measured and searched (each step skipped when its output is there)."""
    from autotailor.pipeline.results import SearchRecord

    folder = compiled(model, work, multiple)
    if not (folder / "latency.sqlite").is_file():
        _cli("profile", str(folder), "--device", DEVICE)
    if not (folder / "sensitivity.json").is_file():
        _cli("sensitivity", str(folder), "--data", f"cifar10:{data}")
    if (folder / "search.json").is_file() and len(SearchRecord.read(folder).choices) != BUDGETS:
        (folder / "search.json").unlink()  # searched for another number of budgets: search again
    if not (folder / "search.json").is_file():
        _cli("search", str(folder), "--device", DEVICE, "--budgets", str(BUDGETS), "--verify", "2", "--finalists", "4")
    return folder


def _test_batches(data: str) -> tuple[list, list]:
    """The test images in order, and the training batches that recalibrate BatchNorm."""
    from autotailor.data import BatchLoader, load_data

    train, test = load_data(f"cifar10:{data}", seed=0)
    calib = BatchLoader(train, 64, train=True, resolution=32, seed=0)
    calibration = [calib.batch(0, i) for i in range(CALIBRATION_IMAGES // 64)]
    return list(BatchLoader(test, 500, train=False, resolution=32)), calibration


def autotailor_points(state: State, model: str, data: str, work: Path, multiple: int) -> None:
    """The test accuracy, MACs and parameters of every SubNet the search chose. A state that has
    them for this schedule without the search's folder (a later session's, from the committed
    results) keeps them: searching again on a new profile would replace every method's points."""
    import autotailor as at
    from autotailor.pipeline.results import SearchRecord
    from autotailor.predict.latency import CostModel, KernelPlan
    from autotailor.tune import evaluate

    searched = (work / model / "autotailor" / "search.json").is_file()
    if not searched and state.get(model, "autotailor") and state.get(model, "autotailor_schedule") == tailored(model, multiple):
        log.info("%s: AutoTailor's points kept from the state (delete them to search again)", model)
        return
    folder = autotailor_work(model, data, work, multiple)
    state.put(_autotailor_cost(folder), model, "autotailor_cost")
    sn = at.load(folder)
    costs = CostModel(KernelPlan(sn, "none"))
    batches, calibration = _test_batches(data)
    record = SearchRecord.read(folder)
    budgets = [c.limits for c in record.choices]
    if state.get(model, "autotailor_budgets") != budgets:
        # a new search, on a new profile (perhaps of another machine): the earlier search's points
        # go, and the block-scaling baselines', searched at its budgets on latency tables measured again
        state.put({}, model, "autotailor")
        state.put({}, model, "alone")
        for method in BLOCK_METHODS:
            state.put({}, model, method)
            state.put(None, model, f"{method}_table")
        state.put(budgets, model, "autotailor_budgets")
    # recorded with the first search too: a second driver started later must not take the points
    # for another schedule's and drop them
    state.put(tailored(model, multiple), model, "autotailor_schedule")
    for chosen in record.met:
        if state.get(model, "autotailor", chosen.budget) is not None:
            continue
        arch = sn.space.complete(chosen.arch)
        accuracy = evaluate(sn, arch, batches, calibration)
        c = costs.costs(arch)
        state.put({"arch": arch, "accuracy": accuracy, "macs": c.macs, "params": c.params,
                   "predicted_accuracy": chosen.accuracy}, model, "autotailor", chosen.budget)
        print(f"{model} AutoTailor {chosen.budget}: {100 * accuracy:.2f} % at {c.macs / 1e6:.1f} M MACs", flush=True)
    # NestDNN*'s uniform pruning (every width at the kept fraction, unrounded, all layers, full
    # resolution) as a SubNet of the tuned SuperNet, where every width variable has that fraction:
    # how much of a gap at a ratio is the shared weights rather than the search's choice
    widths = [v for v in sn.space.variables if v.kind == "width"]
    for ratio in RATIOS:
        keep = round(1 - ratio, 6)
        if state.get(model, "nestdnn_arch", f"{ratio:g}") is not None or any(keep not in v.choices for v in widths):
            continue
        arch = sn.space.complete({**sn.space.max(), **{v.name: keep for v in widths}})
        accuracy = evaluate(sn, arch, batches, calibration)
        state.put({"accuracy": accuracy, "macs": costs.costs(arch).macs}, model, "nestdnn_arch", f"{ratio:g}")


def original_weights_points(state: State, model: str, data: str, work: Path, multiple: int) -> None:
    """What ``autotailor search --finalists`` deploys for each budget since the user's weights
    compete (``selection._with_original_weights``), applied to the search's choices: the chosen
    SubNet with the base model's weights (BatchNorm recalibrated; the largest with the model's
    own statistics) replaces the shared weights' where it measures more accurate on the
    finalists' validation sample. The point then takes its test accuracy, and keeps the shared
    weights' as ``accuracy_shared``. (The product also offers the whole base model at a budget
    its latency meets; this leaves that out, in the baselines' favour.)"""
    import autotailor as at
    from autotailor.data.loader import at_resolution
    from autotailor.pipeline.steps import validation_data
    from autotailor.pipeline.workdir import EvalSettings, load_original, original_calibration
    from autotailor.tune import evaluate
    from autotailor.tune.evaluate import extracted

    points = state.get(model, "autotailor") or {}
    if all("original_validation" in p for p in points.values()):
        return
    folder = compiled(model, work, multiple)
    sn, original = at.load(folder), load_original(folder)
    val = validation_data(sn, folder, f"cifar10:{data}", EvalSettings())
    batches, calibration = _test_batches(data)
    for key, point in points.items():
        if "original_validation" in point:
            continue
        arch = sn.space.complete(point["arch"])
        shared = evaluate(sn, arch, val.val, val.calibration)
        mine = evaluate(original, arch, val.val, original_calibration(original, arch, val.calibration))
        point = {**point, "original_validation": {"original": mine, "shared": shared}}
        if mine > shared:  # extracted as the export does it
            net = extracted(original, arch, original_calibration(original, arch, calibration))
            wrong = _wrong(lambda x: net(at_resolution(x, sn.input_shape(arch)[-1])), batches)
            point.update(weights="original", accuracy_shared=point["accuracy"], wrong_shared=point.get("wrong"),
                         wrong=wrong, accuracy=1 - float(_unpacked(wrong).mean()))
        state.put(point, model, "autotailor", key)
        print(f"{model} AutoTailor {key}: validation {100 * shared:.2f} % shared, {100 * mine:.2f} % original weights"
              + (f"; test {100 * point['accuracy']:.2f} % (shared {100 * point['accuracy_shared']:.2f} %)"
                 if mine > shared else ""), flush=True)


def alone_points(state: State, model: str, data: str, work: Path, multiple: int = 1, largest_first: bool = False) -> None:
    """Each SubNet the search chose fine-tuned alone for ``ALONE_STEPS`` batches, as ``autotailor
    export --finetune-steps`` does it (``FineTuner``: both starts probed, the better trained on; a
    SubNet chosen for several budgets is trained once; the base model itself is not): its test
    accuracy, and on the validation sample the export compares them on, its accuracy, the chosen
    weights' (not fine-tuned) and each probe's. A SubNet fine-tuned from the shared weights by an
    earlier version of this script (before the probe) is kept when the probe prefers that start:
    the settings, and so the weights, are the same."""
    import autotailor as at
    from autotailor.data.loader import at_resolution
    from autotailor.pipeline.results import SHARED_WEIGHTS
    from autotailor.pipeline.steps import FineTuner, validation_data
    from autotailor.pipeline.workdir import EvalSettings, is_original_model, load_original
    from autotailor.tune.evaluate import accuracy

    def measured(key: str, point: dict) -> bool:
        done = state.get(model, "alone", key) or {}
        return (done.get("arch") == point["arch"] and (done.get("steps"), done.get("lr")) == (ALONE_STEPS, ALONE_LR)
                and "start" in done)

    points = state.get(model, "autotailor") or {}
    if all(measured(key, p) for key, p in points.items()):
        return
    # compiled again from the kept tuned weights when a later session lacks the search's folder
    folder = compiled(model, work, multiple)
    sn, original = at.load(folder), load_original(folder)
    # the sensitivity step's validation sample (its defaults), which needs no sensitivity table
    val = validation_data(sn, folder, f"cifar10:{data}", EvalSettings())
    tuner = FineTuner(sn, original, folder / "specialized", val, ALONE_STEPS, ALONE_LR)
    batches, _ = _test_batches(data)
    # the smallest first (each quicker to train), or the largest: a second process meets the first
    for key, point in sorted(points.items(), key=lambda kv: kv[1]["macs"], reverse=largest_first):
        arch = sn.space.complete(point["arch"])
        if point.get("weights") == "original" and is_original_model(original, arch):
            continue  # the user's model itself: not fine-tuned
        # a SubNet the other process is fine-tuning is left to it (when the two meet, both would train it)
        with claimed(tuner.path(SHARED_WEIGHTS, arch).with_suffix(".lock")) as mine:
            state.reload()  # what the other process finished meanwhile
            if not mine or measured(key, point):
                continue
            started, cpu = time.perf_counter(), time.process_time()
            for start in tuner.starts(arch):
                _from_artifact(model, tuner.path(start, arch))
            probe = tuner.probe(arch)
            start = tuner.preferred(probe)
            done = state.get(model, "alone", key) or {}
            earlier = (start == SHARED_WEIGHTS and done.get("arch") == point["arch"] and "validation" in done
                       and (done.get("steps"), done.get("lr")) == (ALONE_STEPS, ALONE_LR))
            if not earlier:
                net = tuner.train(start, arch)
                path = tuner.path(start, arch)
                if time.process_time() - cpu > KEEP_CPU_SECONDS:
                    _to_artifact(model, path)
                size = sn.input_shape(arch)[-1]
                wrong = _wrong(lambda x: net(at_resolution(x, size)), batches)
                timed = CpuTime.of(torch.load(path, map_location="cpu"))  # over every run of the fine-tuning
                done = {"arch": point["arch"], "macs": point["macs"], "accuracy": 1 - float(_unpacked(wrong).mean()),
                        "wrong": wrong, "steps": ALONE_STEPS, "lr": ALONE_LR,
                        "train_cpu_seconds": timed.seconds, "train_cpu_steps": timed.steps,
                        "train_seconds": time.perf_counter() - started,
                        "validation": {"alone": accuracy(net, val.val, size)}}
            probes = [CpuTime.of(torch.load(tuner.path(s, arch, probe=True), map_location="cpu")) for s in probe]
            chosen = point["original_validation"]["original" if point.get("weights") == "original" else "shared"]
            done.update(start=start, probe=probe, probe_steps=len(probes) * tuner.probe_config.steps,
                        probe_cpu_seconds=sum(t.seconds for t in probes), probe_cpu_steps=sum(t.steps for t in probes),
                        validation={"alone": done["validation"]["alone"], "unfinetuned": chosen})
            state.put(done, model, "alone", key)
            print(f"{model} AutoTailor {key}, fine-tuned alone from the {start} weights: {100 * done['accuracy']:.2f} % "
                  f"(as chosen {100 * point['accuracy']:.2f} %; probe "
                  + ", ".join(f"{k} {100 * v:.2f} %" for k, v in probe.items()) + ")", flush=True)


# a SubNet fine-tuned alone for longer than this is kept in benchmarks/artifacts (fp16), as every
# weight that took over ~20 minutes to make
KEEP_CPU_SECONDS = 20 * 60


def _subnet_artifact(model: str, path: Path) -> Path:
    return HERE / "artifacts" / f"{model}_cifar10_alone_{path.stem}.fp16.pt"


def _from_artifact(model: str, path: Path) -> None:
    """The fine-tuned SubNet ``specialize`` would write to ``path``, from its fp16 artifact if
    one is kept and the work directory lacks it."""
    kept = _subnet_artifact(model, path)
    if path.is_file() or not kept.is_file():
        return
    saved = torch.load(kept, map_location="cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**saved, "state_dict": fp32_state(saved["state_dict"])}, path)


def _to_artifact(model: str, path: Path) -> None:
    saved = torch.load(path, map_location="cpu")
    atomic_torch_save({**saved, "state_dict": fp16_state(saved["state_dict"])}, _subnet_artifact(model, path))


def alone_front(state: State, model: str) -> list[dict]:
    """What ``autotailor export --finetune-steps`` deploys for each budget: the SubNet fine-tuned
    alone unless the chosen weights' one is more accurate on the validation sample (the base
    model itself, when chosen, as it is); each at the latency its twin was timed at (the same
    architecture: the weights' values do not change what runs)."""
    from autotailor.pipeline.deployment import keeps_finetuned

    alone, front = _alone(state, model), []
    for key, twin in (state.get(model, "autotailor") or {}).items():
        p = alone.get(key)
        if "latency_ms" not in twin:
            continue
        if p is None or twin["arch"] != p["arch"]:
            if twin.get("weights") == "original":  # the base model: not fine-tuned
                front.append({**twin, "key": key, "fine_tuned": False})
            continue
        # "shared": recorded before the probe, when every fine-tuning started from the shared weights
        unfinetuned = p["validation"].get("unfinetuned", p["validation"].get("shared"))
        kept = p if keeps_finetuned(p["validation"]["alone"], unfinetuned) else twin
        front.append({**kept, "key": key, "latency_ms": twin["latency_ms"], "fine_tuned": kept is p})
    return front


def forget_autotailor(state: State, model: str, multiple: int) -> None:
    """Drop ``model``'s AutoTailor points (tuned with another schedule) and every latency of its
    baselines: its SubNets are searched again on a new profile, and all are timed again beside
    the new profile's reference kernel. NestDNN* points trained for another number of cycles go
    too (AdaptiveNet-style's all go with the search's budgets, ``autotailor_points``)."""
    state.put({}, model, "autotailor")
    state.put({}, model, "alone")
    state.put({}, model, "nestdnn_arch")
    state.put(None, model, "autotailor_budgets")
    state.put(None, model, "autotailor_cost")
    points = state.get(model, "nestdnn") or {}
    if any(p.get("cycles", 1) != cycles(model) for p in points.values()):
        state.put({}, model, "nestdnn")
    else:
        _untime(state, model, "nestdnn")
    state.put(tailored(model, multiple), model, "autotailor_schedule")


def forget_nestdnn(state: State, model: str) -> None:
    """Drop ``model``'s NestDNN* points pruned to other channel counts (their models are trained
    again) and every other point's latency: all are timed again in one pass beside the new ones."""
    state.put({}, model, "nestdnn")
    for method in METHODS:
        _untime(state, model, method)


def _untime(state: State, model: str, method: str) -> None:
    for key, point in (state.get(model, method) or {}).items():
        state.put({k: v for k, v in point.items() if k not in ("latency_ms", "raw_latency_ms")}, model, method, key)


def pruned(model: str, ratio: float, round_to: int | None = ROUND_TO) -> torch.nn.Module:
    """NestDNN*: the trained ``model`` with ``ratio`` of each layer's channels removed by their
    L1 norm (Torch-Pruning's magnitude importance, the same ratio everywhere), the kept channels
    rounded down to a multiple of ``round_to`` (a layer that would keep none stays whole), the
    classifier kept. Deterministic, so a resumed run prunes the same channels."""
    import torch_pruning as tp

    net = cifar_models.trained(model)
    classifier = net.fc if cifar_models.architecture(model) == "resnet18" else net.classifier[-1]
    pruner = tp.pruner.MetaPruner(net, torch.randn(1, 3, 32, 32), importance=tp.importance.MagnitudeImportance(p=1),
                                  pruning_ratio=ratio, ignored_layers=[classifier], round_to=round_to)
    pruner.step()
    return net


def cycles(model: str) -> int:
    """The training cycles every method of ``model`` gets: as many as its SuperNet's schedule."""
    return tuning_schedules.cycles(schedule(model))


def nestdnn_points(state: State, model: str, data: str, work: Path, steps: int) -> None:
    """Each ratio's pruned model fine-tuned for ``steps`` batches a cycle (or its kept weights),
    then its test accuracy."""
    import torch_pruning as tp
    from autotailor.data import BatchLoader, load_data

    train, test = load_data(f"cifar10:{data}", seed=0)
    loader = BatchLoader(train, train_base.BATCH, train=True, seed=0)
    rounds = cycles(model)
    for ratio in RATIOS:
        key = f"{ratio:g}"
        done = state.get(model, "nestdnn", key) or {}
        if done.get("cycles", 1) == rounds and done.get("round_to") == ROUND_TO:
            continue
        macs, params = tp.utils.count_ops_and_params(pruned(model, ratio), torch.randn(1, 3, 32, 32))
        started, cpu = time.perf_counter(), time.process_time()
        net = nestdnn_model(model, ratio, rounds, loader, steps, work)
        accuracy = train_base.evaluate(net.eval(), test)
        state.put({"ratio": ratio, "round_to": ROUND_TO, "accuracy": accuracy, "macs": int(macs), "params": int(params),
                   "steps": rounds * steps, "cycles": rounds, "train_cpu_seconds": time.process_time() - cpu,
                   "train_seconds": time.perf_counter() - started}, model, "nestdnn", key)
        print(f"{model} NestDNN* {key}: {100 * accuracy:.2f} % at {macs / 1e6:.1f} M MACs", flush=True)


def _subnet_steps(state: State, model: str) -> int:
    """The batches ``export --finetune-steps ALONE_STEPS`` trains one chosen SubNet for: its
    fine-tuning and, once the model's SubNets are probed (``alone_points`` since the probe; the
    10-epoch models' were fine-tuned before it), the probe of each start (the benchmark keeps the
    base's weights, so both are probed)."""
    from autotailor.pipeline.steps import probe_steps

    return ALONE_STEPS + (2 * probe_steps(ALONE_STEPS) if _probed(state, model) else 0)


def _probed(state: State, model: str) -> bool:
    """Whether ``model``'s chosen SubNets are fine-tuned with the probes (``alone_points``)."""
    return any("start" in p for p in _alone(state, model).values())


def fair_steps(state: State, model: str) -> int:
    """The batches each NestDNN* ratio trains on top of its cycles so that NestDNN* in all gets as
    many image-steps as AutoTailor with its chosen SubNets fine-tuned alone, ``_subnet_steps`` each
    architecture (0 before the search chose them). Counted from the choice, not from the SubNets
    trained so far, so that NestDNN*'s training can run beside theirs. A choice that is the base
    model itself, which the export does not fine-tune, would count too, in NestDNN*'s favour (none
    of the committed searches chose it)."""
    chosen = {json.dumps(p["arch"], sort_keys=True) for p in (state.get(model, "autotailor") or {}).values()}
    image_steps = len(chosen) * _subnet_steps(state, model) * tuning_schedules.BATCH
    return -(-image_steps // (train_base.BATCH * len(RATIOS)))


def each_steps(state: State, model: str) -> int:
    """The batches each NestDNN* ratio trains on top of its cycles so that NestDNN*'s five models
    cost what five of AutoTailor's fine-tuned SubNets do: one SubNet's ``_subnet_steps`` (0 before
    the search chose any)."""
    return _subnet_steps(state, model) if state.get(model, "autotailor") else 0


@dataclass(frozen=True)
class EqualCost:
    """A way to give NestDNN* the training AutoTailor's ``--finetune-steps`` adds: each ratio's
    model trained ``extra_steps(state, model)`` batches more at peak learning rate ``lr``,
    reported as ``label``."""
    label: str
    explanation: str
    extra_steps: Callable[[State, str], int]
    lr: float

    def matches(self, point: dict, extra: int) -> bool:
        """Whether a stored point was trained by this rule (points from before ``lr`` was kept
        were trained at the tuning's ``LR``)."""
        return point["extra_steps"] == extra and point.get("lr", LR) == self.lr


# the state key of NestDNN* trained longer -> how much longer; `--methods` names them
EQUAL_COSTS = {
    "nestdnn_fair": EqualCost(
        "NestDNN* at the cost of every fine-tuned SubNet",
        "so that its five models get as many image-steps as AutoTailor with all its chosen SubNets fine-tuned alone",
        fair_steps, LR),
    "nestdnn_each": EqualCost(
        "NestDNN* at the cost of one fine-tuned SubNet a model",
        "as many as one chosen SubNet's fine-tuning and at its peak learning rate: its five models then cost what the "
        "SuperNet's tuning and five fine-tuned SubNets cost, one for each NestDNN* model compared",
        each_steps, ALONE_LR),
}


def longer_nestdnn_points(state: State, model: str, data: str, work: Path, method: str) -> None:
    """Each ratio's NestDNN* model trained ``EQUAL_COSTS[method]``'s batches more (a warm restart of
    its own recipe at the rule's learning rate from its last cycle's weights, kept in ``benchmarks/artifacts/``), then which
    test images it gets wrong."""
    from autotailor.data import BatchLoader, load_data

    rule = EQUAL_COSTS[method]
    extra = rule.extra_steps(state, model)
    if not extra:
        return
    loader = BatchLoader(load_data(f"cifar10:{data}", seed=0)[0], train_base.BATCH, train=True, seed=0)
    batches, _ = _test_batches(data)
    for ratio in sorted(RATIOS, reverse=True):  # the smallest models first: the quickest
        key = f"{ratio:g}"
        done = state.get(model, method, key)
        if done and rule.matches(done, extra):
            continue
        net = nestdnn_model(model, ratio, cycles(model))
        kept = nestdnn_artifact(model, ratio, cycles(model), extra, rule.lr)
        started, cpu = time.perf_counter(), time.process_time()
        if kept.is_file():
            _load_half(net, kept)
        else:
            spent = train_base.train(net, loader, extra, work / model / kept.name.replace(".fp16.pt", ".ckpt"), 200,
                                     f"{model} NestDNN* {key}, {extra} more steps", lr=rule.lr, warmup=WARMUP)
            torch.save(fp16_state(net.state_dict()), kept)
            record_cost(kept, spent, extra)
            _load_half(net, kept)  # evaluated as kept, as the other NestDNN* points are
        wrong = _wrong(net.eval(), batches)
        point = {"ratio": ratio, "extra_steps": extra, "lr": rule.lr, "steps": cycles(model) * NESTDNN_STEPS + extra,
                 "wrong": wrong, "accuracy": 1 - float(_unpacked(wrong).mean()), "train_cpu_seconds": time.process_time() - cpu,
                 "train_seconds": time.perf_counter() - started}
        state.put(point, model, method, key)
        print(f"{model} NestDNN* {key}, {extra} steps more: {100 * point['accuracy']:.2f} %", flush=True)


def longer_nestdnn_front(state: State, model: str, method: str) -> list[dict]:
    """NestDNN* trained ``EQUAL_COSTS[method]``'s batches more: each ratio's model, or, where that
    lost test accuracy, its weights before (the choice favours the baseline: it is made on the
    test images); at the latency of the timed twin (the same architecture)."""
    rule, timed = EQUAL_COSTS[method], state.get(model, "nestdnn") or {}
    extra = rule.extra_steps(state, model)
    return [{**max(p, timed[key], key=lambda q: q["accuracy"]), "longer": p["accuracy"] >= timed[key]["accuracy"],
             "latency_ms": timed[key]["latency_ms"]}
            for key, p in (state.get(model, method) or {}).items()
            if rule.matches(p, extra) and "latency_ms" in timed.get(key, {})]


def _load_half(net: torch.nn.Module, path: Path) -> None:
    net.load_state_dict(fp32_state(torch.load(path, map_location="cpu")))


def nestdnn_model(model: str, ratio: float, cycle: int, loader=None, steps: int = NESTDNN_STEPS,
                  work: Path | None = None) -> torch.nn.Module:
    """The NestDNN* model of ``ratio`` after ``cycle`` cycles of fine-tuning, each continuing the
    previous one's weights: its kept weights, else trained (needs ``loader`` and ``work``)."""
    net, kept = pruned(model, ratio), nestdnn_artifact(model, ratio, cycle)
    if kept.is_file():
        _load_half(net, kept)
        return net
    if loader is None or work is None:
        raise SystemExit(f"{kept} is missing: run benchmarks/baselines.py --models {model} --train-only")
    if cycle > 1:
        net = nestdnn_model(model, ratio, cycle - 1, loader, steps, work)
    spent = train_base.train(net, loader, steps, work / model / kept.name.replace(".fp16.pt", ".ckpt"), 200,
                             f"{model} NestDNN* {ratio:g}, cycle {cycle}", lr=LR, warmup=WARMUP)
    torch.save(fp16_state(net.state_dict()), kept)
    record_cost(kept, spent, steps)
    return net


def nestdnn_artifact(model: str, ratio: float, cycle: int = 1, extra: int = 0, lr: float = LR) -> Path:
    """Where a NestDNN* model's fine-tuned weights are kept (fp16 state dict of ``pruned``): after
    ``cycle`` cycles, and ``extra`` steps more at peak learning rate ``lr``."""
    more = f"+{extra}{'' if lr == LR else f'lr{lr:g}'}" if extra else ""
    return (HERE / "artifacts" / f"{model}_cifar10_nestdnn{ratio:g}_round{ROUND_TO}"
            f"{'' if cycle == 1 else f'_cycle{cycle}'}{more}.fp16.pt")


def _block_files(method: str, model: str, work: Path, cycle: int) -> tuple[Path, str]:
    """The checkpoint of a block-scaling baseline's training cycle ``cycle`` and its artifact's name."""
    suffix = "" if cycle == 1 else f"_cycle{cycle}"
    return work / model / f"{method}{suffix}.ckpt", f"{model}_{method}{suffix}"


def block_net(method: str, model: str, work: Path, data: str, steps: int | None = None
              ) -> tuple[block_scaling.BlockScalingNet, CpuTime]:
    """The block-scaling baseline ``method`` of ``model``, its new blocks trained for ``cycles``
    cycles of ``steps`` (the method's by default; resumable), each continuing the previous one's;
    and the CPU time of all cycles."""
    from autotailor.data import BatchLoader, load_data

    kind = BLOCK_METHODS[method]
    steps = steps or kind.steps
    net = kind.module.supernet(cifar_models.trained(model), cifar_models.architecture(model))
    train, _ = load_data(f"cifar10:{data}", seed=0)
    total = CpuTime()
    for cycle in range(1, cycles(model) + 1):
        ckpt, name = _block_files(method, model, work, cycle)
        kept = train_base.from_snapshot(name)
        spent = kind.module.train(net, BatchLoader(train, train_base.BATCH, train=True, seed=0), steps,
                                  ckpt, lr=LR, fallback=kept)
        total += spent
        if kept is None or kept["step"] < steps:  # kept for later sessions (no momentum)
            train_base.snapshot(name, {**torch.load(ckpt, map_location="cpu"), "momentum": {}})
    return net, total


def trained_blocks(method: str, model: str, work: Path) -> block_scaling.BlockScalingNet:
    """The trained block-scaling baseline ``method`` of ``model`` from its checkpoint."""
    net = BLOCK_METHODS[method].module.supernet(cifar_models.trained(model), cifar_models.architecture(model))
    ckpt, name = _block_files(method, model, work, cycles(model))
    state = torch.load(ckpt, map_location="cpu") if ckpt.is_file() else train_base.from_snapshot(name)
    net.variants.load_state_dict(state["model"])
    return net.eval()


def _trained_for_search(state: State, method: str, model: str, data: str, work: Path
                        ) -> tuple[block_scaling.BlockScalingNet, block_scaling.LatencyTable]:
    """The trained block-scaling baseline (its training's cost kept in the state) and its
    per-variant latency table, measured on this machine once."""
    from autotailor.predict.latency.backends.base import make_backend, parse_device

    net, spent = block_net(method, model, work, data)
    if spent.steps:  # else trained before the time was kept: the cost table's recorded minutes
        state.put({**spent.as_state(), "steps": cycles(model) * BLOCK_METHODS[method].steps, "cycles": cycles(model)},
                  model, f"{method}_cost")
    table = state.get(model, f"{method}_table")
    if table is None:
        name, options = parse_device(DEVICE)
        table = block_scaling.LatencyTable.measure(net, make_backend(name, **options), (1, 3, 32, 32)).ms
        state.put(table, model, f"{method}_table")
    return net, block_scaling.LatencyTable(table)


def _block_point(net: block_scaling.BlockScalingNet, table: block_scaling.LatencyTable, path, batches,
                 calibration) -> dict:
    """A block-scaling baseline's chosen path: its test accuracy, MACs, parameters and table latency."""
    import torch_pruning as tp

    macs, params = tp.utils.count_ops_and_params(net.subnet(path), torch.randn(1, 3, 32, 32))
    return {"path": [list(c) for c in path], "accuracy": block_scaling.evaluate(net, path, batches, calibration),
            "macs": int(macs), "params": int(params), "table_ms": table.path_ms(net, path)}


def _autotailor_budgets(state: State, model: str) -> list[float]:
    """The latency budgets of AutoTailor's search, which the block-scaling baselines search too."""
    return [limits["latency_ms"] for limits in state.get(model, "autotailor_budgets")]


class _ValidationAccuracy:
    """Accuracy of a block-scaling baseline's paths on the validation images AutoTailor's
    finalists use (BatchNorm recalibrated), each path measured once (``measured``)."""

    def __init__(self, net: block_scaling.BlockScalingNet, data: str):
        from autotailor.pipeline.workdir import EvalSettings, eval_data

        self.net, self.val = net, eval_data(f"cifar10:{data}", 32, EvalSettings())
        self.images = sum(len(y) for _, y in self.val.val)
        self.measured: dict = {}

    def __call__(self, path) -> float:
        if path not in self.measured:
            self.measured[path] = block_scaling.evaluate(self.net, path, self.val.val, self.val.calibration)
        return self.measured[path]


def adaptivenet_points(state: State, model: str, data: str, work: Path) -> None:
    """AdaptiveNet's search for each of AutoTailor's budgets (its own latency table, accuracy
    measured on the same validation images), then each choice's test accuracy."""
    budgets = _autotailor_budgets(state, model)[::ADAPTIVENET_EVERY]
    if all(state.get(model, "adaptivenet", f"{b:g}") is not None for b in budgets):
        return
    net, table = _trained_for_search(state, "adaptivenet", model, data, work)
    accuracy = _ValidationAccuracy(net, data)
    batches, calibration = _test_batches(data)
    for budget in budgets:
        key = f"{budget:g}"
        if state.get(model, "adaptivenet", key) is not None:
            continue
        cpu = time.process_time()
        found = adaptivenet.nearby_search(net, table, budget, accuracy)
        if found is None:
            state.put({"budget_ms": budget, "path": None}, model, "adaptivenet", key)
            continue
        path, val_accuracy = found
        state.put({"budget_ms": budget, "val_accuracy": val_accuracy,
                   **_block_point(net, table, path, batches, calibration), "evaluations": len(accuracy.measured),
                   "search_cpu_seconds": time.process_time() - cpu}, model, "adaptivenet", key)
        print(f"{model} AdaptiveNet {key}: {100 * state.get(model, 'adaptivenet', key, 'accuracy'):.2f} %",
              flush=True)


def legodnn_points(state: State, model: str, data: str, work: Path) -> None:
    """LegoDNN's selection for every one of AutoTailor's budgets (its own latency table and its
    descendants' accuracy drops, measured on the validation images AutoTailor's finalists use),
    then each choice's test accuracy."""
    budgets = _autotailor_budgets(state, model)
    if all(state.get(model, "legodnn", f"{b:g}") is not None for b in budgets):
        return
    net, table = _trained_for_search(state, "legodnn", model, data, work)
    profile = state.get(model, "legodnn_drops")
    if profile is None:
        accuracy = _ValidationAccuracy(net, data)
        cpu = time.process_time()
        drops = legodnn.drops(net, accuracy)
        profile = {"drops": drops, "base_accuracy": accuracy(net.largest()), "evaluations": len(accuracy.measured),
                   "validation_images": accuracy.images, "cpu_seconds": time.process_time() - cpu}
        state.put(profile, model, "legodnn_drops")
    batches, calibration = _test_batches(data)
    for budget in budgets:
        key = f"{budget:g}"
        if state.get(model, "legodnn", key) is not None:
            continue
        cpu = time.process_time()
        path = legodnn.select(net, table, profile["drops"], budget)
        if path is None:
            state.put({"budget_ms": budget, "path": None}, model, "legodnn", key)
            continue
        # LegoDNN's accuracy model: the original's accuracy less each chosen descendant's drop
        predicted = profile["base_accuracy"] - sum(profile["drops"][f"{i}_{c[0]}{c[1]}"]
                                                   for i, c in net.steps(path) if c[0] != "orig")
        state.put({"budget_ms": budget, "predicted_accuracy": predicted,
                   "search_cpu_seconds": time.process_time() - cpu,
                   **_block_point(net, table, path, batches, calibration)}, model, "legodnn", key)
        print(f"{model} LegoDNN {key}: {100 * state.get(model, 'legodnn', key, 'accuracy'):.2f} % "
              f"(predicted {100 * predicted:.2f} %)", flush=True)


def time_all(state: State, model: str, work: Path) -> None:
    """Every point's latency as ONNX on ONNX Runtime, all in one interleaved pass."""
    import autotailor as at
    from autotailor.pipeline.workdir import device_setup

    todo = []
    for method in METHODS:
        for key, point in (state.get(model, method) or {}).items():
            if "latency_ms" not in point and point.get("path", True) is not None:
                todo.append((method, key, point))
    if not todo:
        return
    folder = work / model / "autotailor"
    sn = at.load(folder)
    setup = device_setup(sn, folder, DEVICE)
    blocks: dict[str, block_scaling.BlockScalingNet] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, (method, key, point) in enumerate(todo):
            shape = (1, 3, 32, 32)
            if method == "autotailor":
                net, shape = sn.extract(point["arch"]).eval(), tuple(sn.input_shape(point["arch"]))
            elif method in BLOCK_METHODS:
                if method not in blocks:
                    blocks[method] = trained_blocks(method, model, work)
                net = blocks[method].subnet(tuple(tuple(c) for c in point["path"]))
            else:
                net = nestdnn_model(model, point["ratio"], cycles(model))
            files.append((setup.backend.deploy(net.eval(), Path(tmp) / f"m{i}", shape), shape))
        timed = setup.time_deployed(files)
    ref = setup.reference_ms()
    for (method, key, point), m in zip(todo, timed):
        state.put({**point, "latency_ms": m.at_speed(ref), "raw_latency_ms": m.median_ms}, model, method, key)
    # the machine of the last pass; one model's points are compared only among themselves
    state.put(f"{machine()['cpu']}, commit {head_commit()}", model, "timed_on")


def _wrong(forward: Callable[[torch.Tensor], torch.Tensor], batches: list) -> str:
    """The test images ``forward`` classifies wrongly, as a bitmask in base64 (bit i: image i)."""
    with torch.no_grad():
        wrong = torch.cat([forward(x).argmax(1) != y for x, y in batches]).numpy()
    return base64.b64encode(np.packbits(wrong).tobytes()).decode()


def _unpacked(wrong: str) -> np.ndarray:
    return np.unpackbits(np.frombuffer(base64.b64decode(wrong), dtype=np.uint8))[:TEST_IMAGES].astype(bool)


def paired_points(state: State, model: str, data: str, work: Path) -> None:
    """Which test images every point gets wrong, evaluated as its accuracy was: a comparison's
    standard error is then counted on the images where its two models disagree."""
    import autotailor as at
    from autotailor.data.loader import at_resolution
    from autotailor.tune.evaluate import recalibrated

    batches, calibration = _test_batches(data)
    sn, blocks = None, {}
    for method in METHODS:
        for key, point in (state.get(model, method) or {}).items():
            if "wrong" in point or point.get("path", True) is None:
                continue
            if method == "autotailor":
                sn = sn or at.load(work / model / "autotailor")
                arch = sn.space.complete(point["arch"])
                with recalibrated(sn, arch, calibration):
                    size = sn.input_shape()[-1]
                    wrong = _wrong(lambda x: sn(at_resolution(x, size)), batches)
            elif method in BLOCK_METHODS:
                if method not in blocks:
                    blocks[method] = trained_blocks(method, model, work)
                wrong = _wrong(block_scaling.calibrated(blocks[method], tuple(tuple(c) for c in point["path"]), calibration),
                               batches)
            else:
                wrong = _wrong(nestdnn_model(model, point["ratio"], cycles(model)).eval(), batches)
            # the accuracy of the model timed: NestDNN*'s kept fp16 weights can move a few images
            # from the fp32 model's it was trained as
            state.put({**point, "wrong": wrong, "accuracy": 1 - float(_unpacked(wrong).mean())}, model, method, key)


def paired_se_pts(a: dict, b: dict) -> float | None:
    """One standard error, in points, of ``a``'s accuracy minus ``b``'s on the same test images
    (from the images exactly one of them gets right), or None without both points' errors."""
    if "wrong" not in a or "wrong" not in b:
        return None
    wa, wb = _unpacked(a["wrong"]), _unpacked(b["wrong"])
    a_only, b_only, n = int((wb & ~wa).sum()), int((wa & ~wb).sum()), len(wa)
    return 100 * (a_only + b_only - (a_only - b_only) ** 2 / n) ** 0.5 / n


def compare(auto: list[dict], base: list[dict]) -> list[dict]:
    """For each baseline point: the most accurate AutoTailor point no slower (accuracy at equal
    latency) and the fastest at least as accurate (latency at equal accuracy)."""
    rows = []
    for b in sorted(base, key=lambda p: p["latency_ms"]):
        faster = [a for a in auto if a["latency_ms"] <= b["latency_ms"]]
        better = [a for a in auto if a["accuracy"] >= b["accuracy"]]
        best = max(faster, key=lambda a: a["accuracy"]) if faster else None
        quick = min(better, key=lambda a: a["latency_ms"]) if better else None
        rows.append({"baseline": b, "accuracy_gain_pts": 100 * (best["accuracy"] - b["accuracy"]) if best else None,
                     "accuracy_gain_se_pts": paired_se_pts(best, b) if best else None,
                     "latency_change_pct": 100 * (quick["latency_ms"] / b["latency_ms"] - 1) if quick else None})
    return rows


# CPU-minutes of the training that made each method's kept weights, as benchmarks/artifacts/README.md
# records them (1 thread of an AMD EPYC or Intel Xeon vCPU, beside other work; NestDNN*'s a sum
# over its five ratios, each cycle); the runs here load those weights.
TRAIN_MINUTES = {("resnet18", "autotailor"): "about 60 + 38 + 75", ("mobilenet_v2", "autotailor"): "about 60 + 39 + 85",
                 ("resnet18", "adaptivenet"): "116 + 52 + 117", ("mobilenet_v2", "adaptivenet"): "about 80 + 42 + 125",
                 ("resnet18", "nestdnn"): "82 (5 x 4-32) + 54 (5 x 4-24) + 83 (5 x 4-45)",
                 ("mobilenet_v2", "nestdnn"): "69 (5 x 4-31) + 57 (5 x 4-21) + 52 (5 x 4-26)"}


def _autotailor_cost(folder: Path) -> dict[str, str]:
    """What the profiling, the sensitivity measurement and the search in the AutoTailor work
    ``folder`` spent, as the cost table's cells (kept in the state: the folder does not outlive
    the machine)."""
    import sqlite3

    sens = json.loads((folder / "sensitivity.json").read_text())
    search = json.loads((folder / "search.json").read_text())
    finalists = json.loads((folder / "finalists.json").read_text()) if (folder / "finalists.json").is_file() else {}
    with sqlite3.connect(folder / "latency.sqlite") as db:  # the LUT's kernels, both passes
        kernels, first, last = db.execute("SELECT COUNT(*), MIN(measured_at), MAX(measured_at) FROM entries "
                                          "WHERE target IN (SELECT id FROM targets WHERE settings NOT LIKE "
                                          "'%\"model\"%')").fetchone()
    return {"profiling": f"{kernels} kernel timings in {last - first:.0f} s",
            "evaluations": f"{len(sens['deltas']) + 1} SubNets on {sens['validation_images']} images "
                           f"({sens['seconds']:.0f} s), then {len(finalists.get('subnets', {}))} finalists",
            "search": f"{search['seconds']:.1f} s, {search['predictions']} predictions, "
                      f"{search['verify_rounds']} verify rounds"}


def costs(state: State, model: str) -> list[dict]:
    """What each method spent (the paper's Fig. 15): training, in image-steps (images times
    networks trained on them: equal by design) and CPU-minutes as recorded; latency profiling;
    accuracy evaluations; search."""
    rows = []
    spent = state.get(model, "autotailor_cost")
    if spent:
        rows.append({"key": "autotailor", "method": "AutoTailor",
                     "image_steps": cycles(model) * STEPS * tuning_schedules.BATCH * 4, **spent})
    alone = _alone_trained(state, model)
    if alone:
        rows.append({"key": "alone", "method": "AutoTailor's chosen SubNets fine-tuned alone (on top of the above)",
                     "image_steps": _alone_steps(alone) * tuning_schedules.BATCH,
                     "profiling": "none", "search": "none",
                     "evaluations": f"{len(alone)} x 2 (fine-tuned, not fine-tuned) and "
                                    f"{sum(len(p.get('probe', {})) for p in alone.values())} probes on the validation "
                                    "images",
                     "train_cpu_minutes": _alone_minutes(alone)})
    nest = state.get(model, "nestdnn") or {}
    if nest:
        rows.append({"key": "nestdnn", "method": "NestDNN*", "image_steps": sum(p["steps"] for p in nest.values()) * train_base.BATCH,
                     "profiling": "none", "evaluations": f"{len(nest)} pruned models", "search": "none (one model a ratio)"})
    for method, rule in EQUAL_COSTS.items():
        extra = rule.extra_steps(state, model)
        longer = [p for p in (state.get(model, method) or {}).values() if rule.matches(p, extra)]
        if len(longer) == len(RATIOS):
            seconds = [p["train_cpu_seconds"] for p in longer]
            # as recorded with the kept weights (a run that loads them spends no training), else this run's
            recorded = recorded_cost([nestdnn_artifact(model, r, cycles(model), extra, rule.lr) for r in RATIOS])
            rows.append({"key": method, "method": f"{rule.label} ({extra:,} batches more a model, lr {rule.lr:g})",
                         "image_steps": sum(p["steps"] for p in longer) * train_base.BATCH,
                         "train_cpu_minutes": f"as NestDNN*, then {recorded or f'{sum(seconds) / 60:.0f} {_range(seconds)}'}",
                         "profiling": "none", "evaluations": f"{len(longer)} pruned models",
                         "search": "none (one model a ratio)"})
    found = [p for p in (state.get(model, "adaptivenet") or {}).values() if "evaluations" in p]
    table = state.get(model, "adaptivenet_table") or {}
    if found:
        rows.append({"key": "adaptivenet", "method": BLOCK_METHODS["adaptivenet"].label, "image_steps": cycles(model) * ADAPTIVENET_STEPS * train_base.BATCH,
                     "profiling": f"{len(table) - 2} block timings",
                     "evaluations": f"{max(p['evaluations'] for p in found)} paths on the validation images",
                     "search": f"{sum(p['search_cpu_seconds'] for p in found):.0f} CPU-s of Nearby search "
                               "(evaluations included)"})
    selected = [p for p in (state.get(model, "legodnn") or {}).values() if "search_cpu_seconds" in p]
    profile = state.get(model, "legodnn_drops")
    if selected and profile:
        rows.append({"key": "legodnn", "method": BLOCK_METHODS["legodnn"].label,
                     "image_steps": cycles(model) * LEGODNN_STEPS * len(legodnn.KEEP) * train_base.BATCH,
                     "profiling": f"{len(state.get(model, 'legodnn_table')) - 2} block timings",
                     "evaluations": f"{profile['evaluations']} models (each descendant in the original) on "
                                    f"{profile['validation_images']} validation images ({profile['cpu_seconds']:.0f} CPU-s)",
                     "search": f"{sum(p['search_cpu_seconds'] for p in selected):.1f} CPU-s of integer programs "
                               f"({len(selected)} budgets)"})
    return [{"train_cpu_minutes": _recorded_minutes(state, model, r["key"]) or TRAIN_MINUTES.get((model, r["key"]))
             or "not recorded", **r} for r in rows]


def _recorded_minutes(state: State, model: str, method: str) -> str | None:
    """The CPU-minutes the training of ``method``'s kept weights took, as recorded with them
    (``record_cost``, the block-scaling baselines' training in the state); None without a record."""
    if method == "autotailor":
        chain = [schedule(model)]
        while chain[-1] in tuning_schedules.CONTINUES:
            chain.append(tuning_schedules.CONTINUES[chain[-1]])
        return recorded_cost([tuning_schedules.tuned_artifact(model, s) for s in chain])
    if method == "nestdnn":
        return recorded_cost([nestdnn_artifact(model, r, c) for r in RATIOS for c in range(1, cycles(model) + 1)])
    cost = state.get(model, f"{method}_cost") or {}
    timed = CpuTime.of(cost)
    if method in BLOCK_METHODS and timed.steps:  # else trained before the time was kept
        return timed.describe(cost["steps"])
    return None


def _range(seconds: list[float]) -> str:
    """CPU seconds of several trainings as "(n x least-most)" minutes."""
    return f"({len(seconds)} x {min(seconds) / 60:.0f}-{max(seconds) / 60:.0f})"


def _alone_minutes(alone: dict[str, dict]) -> str:
    """The chosen SubNets' fine-tuning in CPU-minutes, saying how many of its steps were timed: a
    record made before the time was kept in the fine-tuned file holds only its own run's CPU
    time (none, for a file an earlier run finished)."""
    seconds = [p["train_cpu_seconds"] + p.get("probe_cpu_seconds", 0) for p in alone.values()]
    timed = CpuTime(sum(seconds), sum(p.get("train_cpu_steps", 0) + p.get("probe_cpu_steps", 0) for p in alone.values()))
    return f"{timed.describe(_alone_steps(alone))} {_range(seconds)}"


def _alone_steps(alone: dict[str, dict]) -> int:
    """The steps the chosen SubNets' fine-tuning took: each SubNet's, and its probes'."""
    return sum(p["steps"] + p.get("probe_steps", 0) for p in alone.values())


def _alone(state: State, model: str) -> dict[str, dict]:
    """The budgets' SubNets fine-tuned alone with ``ALONE_STEPS`` and ``ALONE_LR`` (a run with other
    settings replaces them one by one): from the start the probe prefers, or, recorded before
    the probe (no ``start``), from the shared weights."""
    return {key: p for key, p in (state.get(model, "alone") or {}).items()
            if (p["steps"], p["lr"]) == (ALONE_STEPS, ALONE_LR)}


def _alone_trained(state: State, model: str) -> dict[str, dict]:
    """The SubNets fine-tuned alone with ``ALONE_STEPS`` and ``ALONE_LR``, one per architecture:
    the budget's point that trained it (the other budgets with that architecture loaded its
    weights)."""
    alone: dict[str, dict] = {}
    for p in _alone(state, model).values():
        arch = json.dumps(p["arch"], sort_keys=True)
        if p["train_cpu_seconds"] > alone.get(arch, {}).get("train_cpu_seconds", -1):
            alone[arch] = p
    return alone


BASELINES = {"nestdnn": ("NestDNN* ratio", lambda p: f"{p['ratio']:g}"),
             "adaptivenet": ("AdaptiveNet budget", lambda p: f"{p['budget_ms']:.3g} ms"),
             "legodnn": ("LegoDNN budget", lambda p: f"{p['budget_ms']:.3g} ms")}


def _timing_noise(state: State, model: str) -> str:
    """The reference kernel's readings beside the timings (a point's raw time over its time at the
    LUT's speed is the reading over the profile's median): the noise next to the latencies."""
    ratios = [p["raw_latency_ms"] / p["latency_ms"] for method in METHODS
              for p in (state.get(model, method) or {}).values() if p.get("latency_ms") and "raw_latency_ms" in p]
    if not ratios:
        return ""
    if all(r == 1 for r in ratios):  # ``at_speed`` had no profile reading to scale by
        return ("These one-pass timings are raw: the work directory's profile held no reference readings to bring "
                "them to; `baselines_paired.md` times every point in alternated rounds.")
    low, mid, high = np.percentile(ratios, [10, 50, 90])
    return (f"The reference kernel read {100 * (mid - 1):+.0f} % against the profile's median over the timings, "
            f"10-90 % of its readings {100 * (low / mid - 1):+.0f} % to {100 * (high / mid - 1):+.0f} % around that: "
            "the paired design corrects the drift, not a burst within one timing.")


def _test_noise(points: list[dict]) -> str:
    """The test images' sampling noise at the points' median accuracy: what a gain or loss is
    to be read against."""
    p = float(np.median([a["accuracy"] for a in points]))
    se = (p * (1 - p) / TEST_IMAGES) ** 0.5
    return (f"One standard error of a test accuracy near {100 * p:.0f} % is {100 * se:.2f} points; of the "
            f"difference between two models' accuracies at most {100 * 2 ** 0.5 * se:.2f}, less as they err on the "
            "same images: the ± after a gain is its standard error counted on the images where the two disagree.")


def _means(rows: list[dict]) -> dict:
    gains = [r["accuracy_gain_pts"] for r in rows if r["accuracy_gain_pts"] is not None]
    cuts = [r["latency_change_pct"] for r in rows if r["latency_change_pct"] is not None]
    return {"mean_accuracy_gain_pts": sum(gains) / len(gains) if gains else None,
            "mean_latency_change_pct": sum(cuts) / len(cuts) if cuts else None}


def change_cell(row: dict) -> str:
    """A comparison's latency change at equal accuracy, as the report's cell."""
    change = row["latency_change_pct"]
    return f"{change:+.1f} %" if change is not None else "none as accurate"


def gain_cell(row: dict) -> str:
    """A comparison's accuracy gain with its standard error, as the report's cell."""
    if row["accuracy_gain_pts"] is None:
        return "none as fast"
    se = row["accuracy_gain_se_pts"]
    return f"{row['accuracy_gain_pts']:+.2f}" + (f" ± {se:.2f}" if se is not None else "") + " pts"


def report(state: State) -> None:
    command = " ".join(["python", "benchmarks/baselines.py", *(a for a in sys.argv[1:] if a != "--report-only")])
    m = machine("torch", "onnxruntime", "torch_pruning")
    commit = head_commit()
    lines = ["# AutoTailor against NestDNN*, AdaptiveNet and LegoDNN (CIFAR-10, ONNX Runtime 1 thread)", "",
             f"Machine of this report: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, onnxruntime {m['onnxruntime']}, "
             f"torch-pruning {m['torch_pruning']}; commit {commit}. Command: `{command}` (resumes; `--report-only` "
             f"rewrites this from the state). Accuracy on the {TEST_IMAGES:,} test images; latency as ONNX, timed in one "
             "pass alternated with a reference SubNet and scaled to the speed the LUT was built at. AutoTailor's "
             "finalists, AdaptiveNet's search and LegoDNN's profiling measure accuracy on the same validation sample.", ""]
    summary: dict = {}
    for model in _models(state):
        auto = [p for p in (state.get(model, "autotailor") or {}).values() if "latency_ms" in p]
        if not auto:
            continue
        lines += [f"## {model}", "", f"AutoTailor's SuperNet tuned with `{state.get(model, 'autotailor_schedule')}` ({cycles(model)} cycle(s) of "
                  f"{STEPS:,} steps); each baseline trained for as many cycles of its own. Profiled and timed on "
                  f"{state.get(model, 'timed_on') or 'the machine above'}. {_timing_noise(state, model)} "
                  f"{_test_noise(auto)}", ""]
        for method, (label, name) in BASELINES.items():
            base = [p for p in (state.get(model, method) or {}).values() if "latency_ms" in p]
            if not base:
                continue
            rows, alone = compare(auto, base), compare(alone_front(state, model), base)
            summary.setdefault(model, {})[method] = {**_means(rows), "rows": rows}
            header = f"| {label} | latency | accuracy | AutoTailor at equal latency | AutoTailor latency at equal accuracy |"
            if alone:
                summary[model][method]["alone"] = {**_means(alone), "rows": alone}
                header += " with --finetune-steps: at equal latency | at equal accuracy |"
            lines += [header, "|---" * header.count(" | ") + "|---|"]
            for i, r in enumerate(rows):
                b = r["baseline"]
                lines.append(f"| {name(b)} | {b['latency_ms']:.3f} ms | {100 * b['accuracy']:.2f} % | "
                             + " | ".join(f"{gain_cell(c)} | {change_cell(c)}" for c in [r, *alone[i:i + 1]]) + " |")
            lines.append("")
            if method == "nestdnn" and state.get(model, "nestdnn_arch"):
                lines += ["NestDNN*'s uniform pruning (every width at the kept fraction, unrounded) as a SubNet of "
                          "AutoTailor's SuperNet (shared weights; ratios whose kept fraction every width variable "
                          "has): " + ", ".join(
                              f"{k}: {100 * v['accuracy']:.2f} % at {v['macs'] / 1e6:.1f} M MACs"
                              for k, v in state.get(model, "nestdnn_arch").items()) + ".", ""]
            longer_rules = EQUAL_COSTS.items() if method == "nestdnn" and alone else ()  # set against the fine-tuned front
            for longer, rule in longer_rules:
                fair_rows = compare(alone_front(state, model), longer_nestdnn_front(state, model, longer))
                if not fair_rows:
                    continue
                extra = rule.extra_steps(state, model)
                summary[model][longer] = {**_means(fair_rows), "rows": fair_rows, "extra_steps": extra}
                lines += [f"{rule.label}: NestDNN* trained {extra:,} batches more a ratio (a warm restart of its "
                          f"recipe at peak learning rate {rule.lr:g} from the last cycle's weights), "
                          f"{rule.explanation}{' (the probes counted)' if _probed(state, model) else ''}. "
                          "Where that lost test accuracy, the weights before are kept (a choice "
                          "on the test images, in the baseline's favour).", "",
                          "| NestDNN* ratio | latency | trained longer | kept | AutoTailor with --finetune-steps at "
                          "equal latency | at equal accuracy |", "|---|---|---|---|---|---|"]
                lines += [f"| {name(r['baseline'])} | {r['baseline']['latency_ms']:.3f} ms | "
                          f"{100 * state.get(model, longer, name(r['baseline']))['accuracy']:.2f} % | "
                          f"{100 * r['baseline']['accuracy']:.2f} %{'' if r['baseline']['longer'] else ' (before)'} | "
                          f"{gain_cell(r)} | {change_cell(r)} |" for r in fair_rows]
                lines.append("")
        fine_tuned = _alone(state, model)
        kept = {p["key"] for p in alone_front(state, model) if p["fine_tuned"]}
        lines += ["| AutoTailor budget | latency | accuracy (test) | accuracy (predicted) | MACs | "
                  f"fine-tuned alone ({ALONE_STEPS} steps, lr {ALONE_LR:g}) |", "|---|---|---|---|---|---|"]
        for key, a in sorted(state.get(model, "autotailor").items(), key=lambda kv: kv[1].get("latency_ms", 0)):
            mine = f" (original weights; shared {100 * a['accuracy_shared']:.2f} %)" if a.get("weights") == "original" else ""
            lines.append(f"| {key} | {a.get('latency_ms', float('nan')):.3f} ms | {100 * a['accuracy']:.2f} %{mine} | "
                         f"{100 * a['predicted_accuracy']:.2f} % | {a['macs'] / 1e6:.1f} M | "
                         + (f"{100 * fine_tuned[key]['accuracy']:.2f} % from the "
                            + (f"{fine_tuned[key]['start']} weights" if "start" in fine_tuned[key]
                               else "shared weights, not probed")
                            + f"{' (exported)' if key in kept else ''} |" if key in fine_tuned else "|"))
        spent = costs(state, model)
        summary.setdefault(model, {})["costs"] = spent
        lines += ["", "Cost of each (the paper's Fig. 15):", "",
                  "| method | training: image-steps | training: CPU-minutes (as recorded) | latency profiling | "
                  "accuracy evaluations | search |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['image_steps']:,} | {r['train_cpu_minutes']} | {r['profiling']} | "
                  f"{r['evaluations']} | {r['search']} |" for r in spent]
        lines.append("")
    lines += ["The paper's Fig. 13 (ImageNet; phones and Jetsons; against AdaptiveNet): "
              + "; ".join(f"{k}: {v['accuracy_pts']:+.2f} pts, {v['latency_pct']:+.2f} % latency"
                          for k, v in PAPER.items()) + ".", ""]
    if summary:
        plot = plot_fronts({model: state_fronts(state, model) for model in _models(state)},
                           HERE / "results" / "baselines.png")
        lines += [f"![fronts]({plot.name})", ""]
    doc = {"machine": m, "commit": commit, "command": command, "paper": PAPER, "summary": summary,
           "raw": state.data}
    write_results(HERE / "results", "baselines", doc, "\n".join(lines) + "\n")


def state_fronts(state: State, model: str) -> dict[str, list[dict]]:
    """``model``'s points of every method and front in the state, by method (``plot_fronts``'s input)."""
    fronts = {method: list((state.get(model, method) or {}).values()) for method in METHODS}
    fronts["alone"] = alone_front(state, model)
    fronts.update({method: longer_nestdnn_front(state, model, method) for method in EQUAL_COSTS})
    return fronts


def plot_fronts(fronts: dict[str, dict[str, list[dict]]], path: Path) -> Path:
    """Accuracy against latency of each model's fronts (model -> method -> points), one panel a
    model; points without a latency are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fronts), figsize=(6 * len(fronts), 4.2), squeeze=False)
    labels = {"autotailor": ("AutoTailor (shared weights)", "o-"), "alone": ("AutoTailor, export --finetune-steps", "D-"),
              "nestdnn": ("NestDNN*", "s--"), "nestdnn_fair": (EQUAL_COSTS["nestdnn_fair"].label, "x--"),
              "nestdnn_each": (EQUAL_COSTS["nestdnn_each"].label, "+--"),
              "adaptivenet": (BLOCK_METHODS["adaptivenet"].label, "^:"), "legodnn": (BLOCK_METHODS["legodnn"].label, "v:")}
    for ax, (model, by_method) in zip(axes[0], fronts.items()):
        for method, (label, style) in labels.items():
            points = sorted((p["latency_ms"], 100 * p["accuracy"]) for p in by_method.get(method, []) if "latency_ms" in p)
            if points:
                ax.plot(*zip(*points), style, label=label)
        ax.set_title(f"{model}, CIFAR-10")
        ax.set_xlabel("latency (ms), ONNX Runtime 1 thread")
        ax.set_ylabel("top-1 accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    return save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=default_cifar10(), help="directory with train.zip and test.zip")
    p.add_argument("--work", default=str(HERE / "work" / "baselines"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--nestdnn-steps", type=int, default=NESTDNN_STEPS, help="fine-tuning steps of each pruned model")
    p.add_argument("--train-only", action="store_true",
                   help="only fine-tune and evaluate the NestDNN* models and train the block-scaling baselines' "
                        "new blocks (no latency measured and no report written: for a busy machine)")
    p.add_argument("--methods", default=",".join(["nestdnn", *BLOCK_METHODS, "alone", *EQUAL_COSTS]),
                   help="the baselines to train (--train-only: two processes can train one each) or to measure; "
                        "alone: AutoTailor's chosen SubNets also fine-tuned alone; nestdnn_fair: NestDNN* trained "
                        "as many image-steps more as that fine-tuning took in all; nestdnn_each: each NestDNN* "
                        "model as many as one SubNet's")
    p.add_argument("--snapshot", action="store_true", help="copy the block-scaling baselines' training checkpoints "
                   "of --models into benchmarks/artifacts (fp16 parts), for a later session to resume from, and stop")
    p.add_argument("--no-timing", action="store_true",
                   help="search, evaluate and profile but time no point: the latencies are left for a later run "
                        "on an idle machine, which times them all in one pass")
    p.add_argument("--channel-multiple", type=int, default=1,
                   help="AutoTailor's space: every width choice a multiple of this many channels ([arch] channel_multiple)")
    p.add_argument("--alone-largest-first", action="store_true",
                   help="fine-tune the chosen SubNets alone from the largest down: a second process beside one "
                        "going up from the smallest")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    path, committed = work / "state.json", HERE / "results" / "baselines.json"
    if not path.is_file() and committed.is_file():  # a new machine: start from the committed measurements
        path.write_text(json.dumps(json.loads(committed.read_text())["raw"]))
    state = State(path)
    for model in _models(state):
        # results from before the schedule was recorded were made with sandwich4-4ep
        made_by = tailored(model, args.channel_multiple)
        if state.get(model) and (state.get(model, "autotailor_schedule") or "sandwich4-4ep") != made_by:
            forget_autotailor(state, model, args.channel_multiple)
        if any(p.get("round_to") != ROUND_TO for p in (state.get(model, "nestdnn") or {}).values()):
            forget_nestdnn(state, model)
    if args.snapshot:
        for model in args.models.split(","):
            for method in BLOCK_METHODS:
                for cycle in range(1, cycles(model) + 1):
                    ckpt, name = _block_files(method, model, work, cycle)
                    if ckpt.is_file():
                        print(*train_base.snapshot(name, torch.load(ckpt, map_location="cpu")))
        return
    if args.train_only:  # writes no report: the comparison's points are not measured yet
        for model in args.models.split(","):
            (work / model).mkdir(exist_ok=True)
            if "nestdnn" in args.methods.split(","):
                nestdnn_points(state, model, args.data, work, args.nestdnn_steps)
            for method in BLOCK_METHODS.keys() & set(args.methods.split(",")):
                block_net(method, model, work, args.data)
            for method in EQUAL_COSTS.keys() & set(args.methods.split(",")):
                longer_nestdnn_points(state, model, args.data, work, method)
        return
    if not args.report_only:
        for model in args.models.split(","):
            (work / model).mkdir(exist_ok=True)
            methods = args.methods.split(",")
            autotailor_points(state, model, args.data, work, args.channel_multiple)
            original_weights_points(state, model, args.data, work, args.channel_multiple)
            if "nestdnn" in methods:
                nestdnn_points(state, model, args.data, work, args.nestdnn_steps)
            if "adaptivenet" in methods:
                adaptivenet_points(state, model, args.data, work)
            if "legodnn" in methods:
                legodnn_points(state, model, args.data, work)
            if not args.no_timing:
                time_all(state, model, work)
            paired_points(state, model, args.data, work)
            if "alone" in methods:
                alone_points(state, model, args.data, work, args.channel_multiple, args.alone_largest_first)
            for method in EQUAL_COSTS.keys() & set(methods):
                longer_nestdnn_points(state, model, args.data, work, method)
    report(state)


if __name__ == "__main__":
    main()
