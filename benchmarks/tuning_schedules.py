"""How good are a SuperNet's SubNets before and after each tuning schedule: random SubNets'
accuracy against their MACs on CIFAR-10.

Reproduce (from the repository root, after `make install`; needs the base models in
``benchmarks/artifacts/``, made by ``train_base.py``)::

    .venv/bin/python benchmarks/tuning_schedules.py --data ../shared/data/cifar10
    .venv/bin/python benchmarks/tuning_schedules.py --report-only

For each model (ResNet-18 and MobileNetV2 of ``cifar_models``, their trained weights; or
``--models NAME`` of a ``train_base.py --name NAME`` run, its artifacts kept under NAME), the
SuperNet compiled at 32 px with the default space, and for each schedule (``SCHEDULES``:
``untuned``, the trained base model's weights as they are, or `autotailor tune` flags, from the
base model or, for a schedule in ``CONTINUES``, from another schedule's kept weights) the
largest, the smallest, the one with every width halved (NestDNN*'s ratio-0.5 architecture, where
every width variable has 0.5) and ``--random`` seeded random SubNets are evaluated on the 10,000 test images with BatchNorm recalibrated on 2,048
training images. MACs are counted from the shapes. Schedules in ``KEPT`` (hours) keep their
tuned weights in ``benchmarks/artifacts/MODEL_cifar10_SCHEDULE.fp16.pt``, reused instead of
tuning again; ``--snapshot`` keeps an unfinished tuning's checkpoint there, and the next run
resumes from it. The state is kept in
``benchmarks/work/tuning_schedules/state.json``, so an interrupted run resumes. Results:
``benchmarks/results/tuning_schedules.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from autotailor.tune import CpuTime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import (State, default_cifar10, fp16_state, head_commit, load_parts, machine, parts,  # noqa: E402
                    record_cost, save_parts, write_results)

MODELS = ("resnet18", "mobilenet_v2")
CALIBRATION_IMAGES = 2048
BATCH = 64
STEPS_PER_EPOCH = 782
HALF = 0.5  # every width at half, all layers, full resolution: the architecture of NestDNN*'s ratio 0.5


def _recipe(epochs: int, *extra: str, lr: str = "0.03") -> list[str]:
    """`autotailor tune` flags of tune_cifar10.py's recipe (4 SubNets a step) for ``epochs`` epochs."""
    return ["--steps", str(epochs * STEPS_PER_EPOCH), "--subnets", "4", "--lr", lr, "--weight-decay", "5e-4",
            "--warmup-steps", "100", *extra]


# schedule -> `autotailor tune` flags (None: the base model's weights as they are)
SCHEDULES: dict[str, list[str] | None] = {
    "untuned": None,
    # the recipe of tune_cifar10.py: the largest, the smallest and 2 random SubNets per step,
    # in-place distillation from the largest, for one epoch
    "sandwich4-1ep": _recipe(1),
    # the largest and 3 random SubNets per step: no sandwich-rule smallest (the demo's setting)
    "random4-1ep": _recipe(1, "--config", str(HERE / "configs" / "no_smallest.toml")),
    # the same recipe for four epochs
    "sandwich4-4ep": _recipe(4),
    # the same at a third of the learning rate: MobileNetV2's largest SubNet lost 1.4 points at 0.03
    "sandwich4-4ep-lr0.01": _recipe(4, lr="0.01"),
    # every SubNet taught by the trained model itself, frozen (Once-for-All's distillation), and
    # the labels: MobileNetV2's largest SubNet drifted 1.4 points from it under in-place distillation
    "original4-4ep": _recipe(4, "--teacher", "original"),
    # a second 4-epoch cycle (warm restart) from sandwich4-4ep's kept weights: 8 epochs in all, to
    # see whether the SuperNet gains more from longer tuning than the baselines given as many steps
    "sandwich4-4ep+4ep": _recipe(4),
    # the second cycle with AlphaNet's adaptive alpha-divergence in place of KL in the in-place
    # distillation: ResNet-18's mid-sized SubNets trail a pruned model trained alone by 1.2 points
    "sandwich4-4ep+alpha4ep": _recipe(4, "--distill-loss", "alpha"),
    # a third cycle: 12 epochs in all. After one cycle ResNet-18's halved SubNet trails the
    # pruned model trained alone for as long by 1.70 points, after two by 1.15
    "sandwich4-4ep+4ep+4ep": _recipe(4),
}
# schedule -> the schedule whose kept weights it starts from (instead of the trained base model)
CONTINUES = {"sandwich4-4ep+4ep": "sandwich4-4ep", "sandwich4-4ep+alpha4ep": "sandwich4-4ep",
             "sandwich4-4ep+4ep+4ep": "sandwich4-4ep+4ep"}
# schedules whose tuned weights take more than ~20 minutes: kept in benchmarks/artifacts/
KEPT = {"sandwich4-4ep", "sandwich4-4ep-lr0.01", "original4-4ep", "sandwich4-4ep+4ep", "sandwich4-4ep+alpha4ep",
        "sandwich4-4ep+4ep+4ep"}
ARTIFACTS = HERE / "artifacts"


def supernet(model: str, schedule: str, data: str, work: Path):
    """The SuperNet of ``model`` after ``schedule``: compiled from the trained base model, and
    tuned with the schedule's flags through the command line a user has (resumable)."""
    import os
    import subprocess

    import torch

    import autotailor as at

    folder = work / model / schedule
    cli = str(Path(sys.executable).parent / "autotailor")
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    if not (folder / "supernet.pt").is_file():
        subprocess.run([cli, "compile", f"cifar_models:{model}_trained", "--input-size", "32", "--out", str(folder)],
                       check=True, env=env)
    flags = SCHEDULES[schedule]
    kept = tuned_artifact(model, schedule)
    def start_from(weights: Path) -> None:
        sn = at.load(folder)
        sn.load_state_dict({k: v.to(sn.state_dict()[k].dtype) for k, v in
                            torch.load(weights, map_location="cpu").items()})
        sn.save(folder / "supernet.pt")

    if flags is not None and not (folder / "tuned").is_file():
        if kept.is_file():  # tuned before: the kept weights instead of the hours of tuning
            start_from(kept)
        else:
            if schedule in CONTINUES and not (folder / "tune.ckpt").is_file():
                parent = tuned_artifact(model, CONTINUES[schedule])
                if not parent.is_file():
                    raise SystemExit(f"{schedule} continues {CONTINUES[schedule]}: run that schedule first "
                                     f"(no {parent})")
                start_from(parent)
            partial = load_parts(checkpoint_artifact(model, schedule)) if not (folder / "tune.ckpt").is_file() else None
            if partial is not None:  # a run an earlier session began
                torch.save(partial, folder / "tune.ckpt")
            subprocess.run([cli, "tune", str(folder), "--data", f"cifar10:{data}", *flags, "--quiet"], check=True,
                           env=env)
            for part in parts(checkpoint_artifact(model, schedule)):
                part.unlink()
            if schedule in KEPT:
                sn = at.load(folder)
                torch.save(fp16_state(sn.state_dict()), kept)
                tuned = torch.load(folder / "tune.ckpt", map_location="cpu", weights_only=False)
                steps = tuned["config"]["steps"]
                record_cost(kept, CpuTime.of(tuned), steps)
                print(f"kept the tuned weights in {kept}: add its line to {ARTIFACTS / 'README.md'}", flush=True)
        (folder / "tuned").write_text("done\n")
    return at.load(folder)


def cycles(schedule: str) -> int:
    """How many tuning cycles ``schedule`` is (each continued schedule one more than its parent):
    the baselines get as many of theirs."""
    return 1 + (cycles(CONTINUES[schedule]) if schedule in CONTINUES else 0)


def checkpoint_artifact(model: str, schedule: str) -> Path:
    """The stem of the parts (``common.save_parts``) where ``--snapshot`` keeps an unfinished
    tuning's checkpoint (weights and momentum in fp16, step), for a later session whose work
    directory is gone."""
    return ARTIFACTS / f"{model}_cifar10_{schedule}.tune"


def snapshot(model: str, schedule: str, work: Path) -> list[Path]:
    import torch

    ckpt = work / model / schedule / "tune.ckpt"
    if not ckpt.is_file():
        raise SystemExit(f"no checkpoint at {ckpt} to snapshot")
    return save_parts(torch.load(ckpt, map_location="cpu", weights_only=False), checkpoint_artifact(model, schedule))


def tuned_artifact(model: str, schedule: str) -> Path:
    """Where the weights of ``model``'s SuperNet tuned with ``schedule`` are kept (``KEPT``)."""
    return ARTIFACTS / f"{model}_cifar10_{schedule}.fp16.pt"


def evaluate_schedule(state: State, model: str, schedule: str, data: str, randoms: int, work: Path) -> None:
    from autotailor.data import BatchLoader, load_data
    from autotailor.predict.latency import CostModel, KernelPlan
    from autotailor.tune import evaluate

    sn = supernet(model, schedule, data, work)
    costs = CostModel(KernelPlan(sn, "none"))
    rng = random.Random(0)
    archs = {"largest": sn.space.max(), "smallest": sn.space.min()}
    widths = [v for v in sn.space.variables if v.kind == "width"]
    if all(HALF in v.choices for v in widths):  # NestDNN*'s ratio 0.5 as a SubNet (baselines.py)
        archs["half"] = sn.space.complete({**sn.space.max(), **{v.name: HALF for v in widths}})
    archs.update({f"random{i:02d}": sn.space.complete(sn.space.sample(rng)) for i in range(randoms)})
    train, val = load_data(f"cifar10:{data}", seed=0)
    calib = BatchLoader(train, BATCH, train=True, resolution=32, seed=0)
    calibration = [calib.batch(0, i) for i in range(CALIBRATION_IMAGES // BATCH)]
    batches = list(BatchLoader(val, 500, train=False, resolution=32))
    for name, arch in archs.items():
        if state.get(model, schedule, name) is not None:
            continue
        started = time.perf_counter()
        accuracy = evaluate(sn, arch, batches, calibration)
        state.put({"accuracy": accuracy, "macs": costs.costs(arch).macs, "arch": arch}, model, schedule, name)
        print(f"{model} {schedule} {name}: {100 * accuracy:.2f} % at {costs.costs(arch).macs / 1e6:.1f} M MACs "
              f"({time.perf_counter() - started:.0f} s)", flush=True)


def report(state: State) -> None:
    command = " ".join(["python", "benchmarks/tuning_schedules.py", *(a for a in sys.argv[1:] if a != "--report-only")])
    m = machine("torch")
    commit = head_commit()
    lines = ["# SubNets before and after tuning (CIFAR-10)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; commit {commit}. "
             f"Command: `{command}` (resumes; `--report-only` rewrites this from the state). Accuracy on the 10,000 "
             f"test images, BatchNorm recalibrated on {CALIBRATION_IMAGES} training images; MACs counted.", "",
             "| model | schedule | largest | smallest | every width halved | random: median (min-max) | "
             "random: Spearman(MACs, accuracy) |",
             "|---|---|---|---|---|---|---|"]
    summary = {}
    for model in [m for m in MODELS if m in state.data] + sorted(m for m in state.data if m not in MODELS):
        for schedule, subnets in (state.get(model) or {}).items():
            rand = [v for k, v in subnets.items() if k.startswith("random")]
            if not rand or "largest" not in subnets or "smallest" not in subnets:
                continue
            accs = [r["accuracy"] for r in rand]
            rho = _spearman([r["macs"] for r in rand], accs)
            summary.setdefault(model, {})[schedule] = {
                "largest": subnets["largest"]["accuracy"], "smallest": subnets["smallest"]["accuracy"],
                "random_median": statistics.median(accs), "random_min": min(accs), "random_max": max(accs),
                "spearman_macs_accuracy": rho, "random": len(rand),
                "half": subnets["half"]["accuracy"] if "half" in subnets else None}
            half = f"{100 * subnets['half']['accuracy']:.2f}" if "half" in subnets else "-"
            lines.append(f"| {model} | {schedule} | {100 * subnets['largest']['accuracy']:.2f} | "
                         f"{100 * subnets['smallest']['accuracy']:.2f} | {half} | {100 * statistics.median(accs):.2f} "
                         f"({100 * min(accs):.2f}-{100 * max(accs):.2f}) | {rho:+.2f} |")
    doc = {"machine": m, "commit": commit, "command": command,
           "summary": summary, "raw": state.data}
    write_results(HERE / "results", "tuning_schedules", doc, "\n".join(lines) + "\n")


def _spearman(x: list[float], y: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r

    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=default_cifar10(), help="directory with train.zip and test.zip")
    p.add_argument("--work", default=str(HERE / "work" / "tuning_schedules"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--random", type=int, default=20)
    p.add_argument("--schedules", default=",".join(SCHEDULES), help=f"among {', '.join(SCHEDULES)}")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--snapshot", action="store_true", help="copy the unfinished tunings' checkpoints of --models "
                   "and --schedules into benchmarks/artifacts (to resume in a later session) and stop")
    args = p.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    path, committed = Path(args.work) / "state.json", HERE / "results" / "tuning_schedules.json"
    if not path.is_file() and committed.is_file():  # a new machine: start from the committed measurements
        path.write_text(json.dumps(json.loads(committed.read_text())["raw"]))
    state = State(path)
    if args.snapshot:
        for model in args.models.split(","):
            for schedule in args.schedules.split(","):
                print(*snapshot(model, schedule, Path(args.work)))
        return
    if not args.report_only:
        for schedule in args.schedules.split(","):
            for model in args.models.split(","):
                evaluate_schedule(state, model, schedule, args.data, args.random, Path(args.work))
    report(state)


if __name__ == "__main__":
    main()
