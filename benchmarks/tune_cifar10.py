"""Train, tune and evaluate SuperNets on CIFAR-10: what tuning buys every SubNet.

Reproduce (from the repository root, after `make install`; several hours on 2 cores, resumable)::

    .venv/bin/python benchmarks/tune_cifar10.py --data ../shared/data/cifar10
    .venv/bin/python benchmarks/tune_cifar10.py --report-only     # table again from the JSON

For each model (``benchmarks/cifar_models.py``: ResNet-18 with a 32x32 stem, MobileNetV2),
everything through the command line a user has:

1. ``autotailor compile cifar_models:NAME --input-size 32`` (default space);
2. the base model: the weights ``benchmarks/train_base.py`` keeps in ``benchmarks/artifacts/``
   (10 epochs), or with ``--train-here`` (or without them) ``autotailor train`` from random
   weights;
3. ``autotailor tune`` fine-tunes the SuperNet (K=4 SubNets per step, in-place distillation);
4. evaluation on the 10,000 CIFAR-10 test images of the largest, the smallest and 20 random
   SubNets (seeded), each with and without BatchNorm recalibration (2,048 training images),
   with the tuned SuperNet and with the untuned one (the base model's weights).

Then, for MobileNetV2, the same short tuning run from the base weights once in one process
and once under ``torchrun`` with two processes (same global batch): loss curves, throughput
and the largest SubNet's accuracy side by side.

Every stage is resumable: the commands resume from their checkpoints, and finished stages
and evaluations are recorded in ``WORK/state.json``, so the script can be stopped and started
again. Losses, wall and CPU time per step come from the ``train.log.jsonl`` / ``tune.log.jsonl``
that the commands write (wall time: the median step's times the steps, which a paused run
does not inflate). Results: ``benchmarks/results/tune_cifar10.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import State, machine

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BIN = Path(sys.executable).parent
BATCH = 64
TRAIN_IMAGES = 50_000
STEPS_PER_EPOCH = -(-TRAIN_IMAGES // BATCH)

MODELS = {
    "mobilenet_v2": "cifar_models:mobilenet_v2",
    "resnet18": "cifar_models:resnet18",
}
# SGD with Nesterov momentum, label smoothing 0.1, cosine schedule; tuning starts lower.
TRAIN_FLAGS = ["--lr", "0.05", "--weight-decay", "5e-4", "--warmup-steps", "200"]
TUNE_FLAGS = ["--weight-decay", "5e-4", "--warmup-steps", "100", "--subnets", "4"]  # and --lr from --tune-lr
DIST_STEPS = int(os.environ.get("TUNE_CIFAR10_DIST_STEPS", 60))


def run(cmd: list[str], threads: int | None = None) -> None:
    env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def read_log(path: Path) -> list[dict]:
    """The per-step records of a training log; a step repeated after a resume counts once (the last)."""
    records: dict[int, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            records[r["step"]] = r
    return [records[k] for k in sorted(records)]


def log_summary(path: Path) -> dict:
    """Steps, time and throughput of a train/tune log. The wall time is the median step's
    times the steps: a run paused (SIGSTOP while the machine times something else) or
    interrupted mid-step would otherwise count the pause."""
    records = read_log(path)
    seconds = statistics.median(r["seconds"] for r in records) * len(records) if records else 0.0
    images = sum(r["images"] for r in records)
    return {"steps": len(records), "wall_seconds": round(seconds, 1),
            "wall_seconds_summed": round(sum(r["seconds"] for r in records), 1),
            "cpu_seconds_rank0": round(sum(r["cpu_seconds"] for r in records), 1),
            "images_per_second": round(images / seconds, 1) if seconds else None,
            "final_loss": round(statistics.mean(r["loss"] for r in records[-50:]), 4) if records else None}


def evaluate_archs(state: State, name: str, work: Path, data: str, archs: dict[str, dict]) -> None:
    from autotailor import load
    from autotailor.data import BatchLoader, load_data
    from autotailor.tune import evaluate

    train, val = load_data(data, seed=0)
    calib = BatchLoader(train, BATCH, train=True, resolution=32, seed=0)
    calib_raw = [calib.batch(0, i) for i in range(2048 // BATCH)]
    val_batches = list(BatchLoader(val, 500, train=False, resolution=32))
    for which, file in (("tuned", "supernet.pt"), ("untuned", "supernet-base.pt")):
        sn = load(work / file)
        for arch_name, arch in archs.items():
            for mode, calibration in (("recalibrated", calib_raw), ("plain", None)):
                if state.get(name, "eval", which, arch_name, mode) is not None:
                    continue
                t = time.perf_counter()
                acc = evaluate(sn, arch, val_batches, calibration)
                state.put(acc, name, "eval", which, arch_name, mode)
                print(f"{name} {which:8s} {arch_name:10s} {mode:12s} {acc:.4f} ({time.perf_counter() - t:.1f} s)",
                      flush=True)


def distributed_check(state: State, name: str, work: Path, data: str, args: argparse.Namespace) -> None:
    """The same short tuning run in one process (2 threads) and in two (1 thread each)."""
    from autotailor import load
    from autotailor.data import BatchLoader, load_data
    from autotailor.tune import evaluate

    flags = [*TUNE_FLAGS, "--lr", str(args.tune_lr), "--steps", str(DIST_STEPS), "--checkpoint-every", "1000",
             "--quiet"]
    for procs in (1, 2):
        d = work / f"dist{procs}"
        if state.get(name, "dist", str(procs)) is not None:
            continue
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        shutil.copy(work / "supernet-base.pt", d / "supernet.pt")
        if procs == 1:
            run([str(BIN / "autotailor"), "tune", str(d), "--data", data, *flags], threads=2)
        else:
            run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(BIN / "autotailor"), "tune",
                 str(d), "--data", data, *flags], threads=1)
        train, val = load_data(data, seed=0)
        calib = BatchLoader(train, BATCH, train=True, resolution=32, seed=0)
        sn = load(d / "supernet.pt")
        acc = evaluate(sn, sn.space.max(), list(BatchLoader(val, 500, train=False, resolution=32)),
                       [calib.batch(0, i) for i in range(2048 // BATCH)])
        losses = [r["loss"] for r in read_log(d / "tune.log.jsonl")]
        state.put({"losses": losses, "log": log_summary(d / "tune.log.jsonl"), "largest_accuracy": acc},
                  name, "dist", str(procs))


def run_model(state: State, name: str, args: argparse.Namespace) -> None:
    work = Path(args.work) / name
    data = f"cifar10:{args.data}"
    cli = str(BIN / "autotailor")
    # The base model's weights from benchmarks/artifacts (train_base.py), when they are there.
    base_artifact = (HERE / "artifacts" / f"{name}_cifar10.fp16.pt").is_file() and not args.train_here
    if not (work / "supernet.pt").is_file():
        spec = f"{MODELS[name]}_trained" if base_artifact else MODELS[name]
        run([cli, "compile", spec, "--input-size", "32", "--out", str(work)])
        if base_artifact:
            shutil.copy(work / "supernet.pt", work / "supernet-base.pt")
            state.put("artifact", name, "trained")
    train_steps = max(1, round(args.train_epochs * STEPS_PER_EPOCH))
    tune_steps = max(1, round(args.tune_epochs * STEPS_PER_EPOCH))
    if not state.get(name, "trained"):
        run([cli, "train", str(work), "--data", data, "--steps", str(train_steps), *TRAIN_FLAGS, "--quiet"])
        shutil.copy(work / "supernet.pt", work / "supernet-base.pt")
        state.put(True, name, "trained")
    if not state.get(name, "tuned"):
        run([cli, "tune", str(work), "--data", data, "--steps", str(tune_steps), "--lr", str(args.tune_lr),
             *TUNE_FLAGS, "--quiet"])
        state.put(args.tune_lr, name, "tune_lr")
        state.put(True, name, "tuned")
    from autotailor import load

    space = load(work / "supernet.pt").space
    rng = random.Random(0)
    archs = {"largest": space.max(), "smallest": space.min()}
    archs.update({f"random{i:02d}": space.sample(rng) for i in range(args.random)})
    evaluate_archs(state, name, work, data, archs)
    state.put({"train": log_summary(work / "train.log.jsonl"), "tune": log_summary(work / "tune.log.jsonl"),
               "train_steps": train_steps, "tune_steps": tune_steps,
               "log10_space_size": round(space.log10_size, 2)}, name, "runs")
    if name == args.dist_model:
        distributed_check(state, name, work, data, args)


def summarise(name: str, s: dict) -> dict:
    ev = s["eval"]
    tuned, untuned = ev["tuned"], ev["untuned"]
    base = untuned["largest"]["plain"]  # the trained base model, as it is
    randoms = sorted(k for k in tuned if k.startswith("random"))
    rand = [tuned[k]["recalibrated"] for k in randoms]
    gains = {k: tuned[k]["recalibrated"] - untuned[k]["recalibrated"] for k in tuned}
    out = {
        "base_accuracy": base,
        "largest": tuned["largest"], "smallest": tuned["smallest"],
        "random_median": statistics.median(rand), "random_min": min(rand), "random_max": max(rand),
        "random_median_plain": statistics.median(tuned[k]["plain"] for k in randoms),
        "untuned_random_median": statistics.median(untuned[k]["recalibrated"] for k in randoms),
        "untuned_random_median_plain": statistics.median(untuned[k]["plain"] for k in randoms),
        "untuned_smallest": untuned["smallest"],
        "min_gain_from_tuning": min(gains.values()),
        "improved": sum(g > 0 for g in gains.values()), "evaluated": len(gains),
        **s["runs"],
    }
    out["targets"] = {
        "largest_within_1pt_of_base": base - tuned["largest"]["recalibrated"] <= 0.01,
        "random_median_within_5pt_of_base": base - out["random_median"] <= 0.05,
        "every_subnet_improved": out["improved"] == out["evaluated"],
    }
    if "dist" in s and {"1", "2"} <= s["dist"].keys():
        one, two = s["dist"]["1"], s["dist"]["2"]
        diffs = [abs(a - b) for a, b in zip(one["losses"], two["losses"])]
        window = 10  # per-step losses are noisy; compare 10-step means too
        means = [abs(statistics.mean(one["losses"][i:i + window]) - statistics.mean(two["losses"][i:i + window]))
                 for i in range(0, len(diffs), window)]
        out["distributed"] = {
            "steps": len(diffs), "max_step_loss_diff": max(diffs), "max_10step_mean_loss_diff": max(means),
            "one_process": one["log"], "two_processes": two["log"],
            "largest_accuracy_one": one["largest_accuracy"], "largest_accuracy_two": two["largest_accuracy"],
            "throughput_ratio": two["log"]["images_per_second"] / one["log"]["images_per_second"],
        }
    return out


def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def report(state: State, args: argparse.Namespace) -> None:
    results = {name: summarise(name, state.data[name]) for name in MODELS
               if state.get(name, "runs") is not None}
    doc = {"machine": machine("torch", "torchvision"), "command": " ".join(["python", "benchmarks/tune_cifar10.py", *sys.argv[1:]]),
           "note": args.note,
           "settings": {"batch": BATCH, "train_flags": TRAIN_FLAGS, "tune_flags": TUNE_FLAGS,
                        "tune_lr": {name: state.get(name, "tune_lr") for name in results},
                        "validation": "CIFAR-10 test split, 10,000 images",
                        "recalibration": "2,048 augmented training images"},
           "models": results, "raw": state.data}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tune_cifar10.json").write_text(json.dumps(doc, indent=1))
    m = doc["machine"]
    lines = [
        "# Tuning on CIFAR-10", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, torchvision {m['torchvision']}. "
        f"Command: `{doc['command']}`.", "", *([args.note, ""] if args.note else []),
        f"Base model: `autotailor train` ({' '.join(TRAIN_FLAGS)}, batch {BATCH}); tuning: `autotailor tune` "
        f"({' '.join(TUNE_FLAGS)}); steps and tuning lr per model below ({STEPS_PER_EPOCH} steps per epoch). "
        "Accuracy (%) on the 10,000 test images; BN recalibrated on 2,048 training images unless 'plain'.", "",
        "| model | base | largest | smallest | random median (min-max) | random median plain | "
        "untuned: smallest / random median | worst gain from tuning | improved |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {pct(r['base_accuracy'])} | {pct(r['largest']['recalibrated'])} | "
            f"{pct(r['smallest']['recalibrated'])} | {pct(r['random_median'])} "
            f"({pct(r['random_min'])}-{pct(r['random_max'])}) | {pct(r['random_median_plain'])} | "
            f"{pct(r['untuned_smallest']['recalibrated'])} / {pct(r['untuned_random_median'])} | "
            f"{100 * r['min_gain_from_tuning']:+.2f} | {r['improved']}/{r['evaluated']} |")
    lines += ["", "| model | train / tune steps, tune lr | targets | train: img/s, wall (median step x steps), CPU (rank 0) | "
              "tune: SubNet-img/s, wall (median step x steps), CPU |", "|---|---|---|---|---|"]
    for name, r in results.items():
        t, u = r["train"], r["tune"]
        met = ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in r["targets"].items())
        lr = state.get(name, "tune_lr")
        lines.append(f"| {name} | {t['steps']} / {u['steps']}, {lr} | {met} | {t['images_per_second']}, {t['wall_seconds'] / 60:.1f} min, "
                     f"{t['cpu_seconds_rank0'] / 60:.1f} min | {u['images_per_second']}, "
                     f"{u['wall_seconds'] / 60:.1f} min, {u['cpu_seconds_rank0'] / 60:.1f} min |")
    for name, r in results.items():
        d = r.get("distributed")
        if d:
            lines += ["", f"Two processes vs one ({name}, {d['steps']} tuning steps from the base weights, global "
                      f"batch {BATCH}): max per-step loss difference {d['max_step_loss_diff']:.3f}, max difference "
                      f"of 10-step means {d['max_10step_mean_loss_diff']:.3f}; largest SubNet accuracy "
                      f"{pct(d['largest_accuracy_one'])} vs {pct(d['largest_accuracy_two'])}; throughput "
                      f"{d['one_process']['images_per_second']} SubNet-img/s (1 process, 2 threads) vs "
                      f"{d['two_processes']['images_per_second']} (2 processes, 1 thread each), "
                      f"ratio {d['throughput_ratio']:.2f}."]
    lines += ["", "Resume: an interrupted and resumed run ends with the same weights as an uninterrupted one "
              "(`tests/test_tune.py::test_interrupted_tuning_resumes_exactly`)."]
    (RESULTS / "tune_cifar10.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    default_data = os.environ.get("AUTOTAILOR_CIFAR10", str(HERE.parent.parent / "shared" / "data" / "cifar10"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=default_data, help="directory with train.zip and test.zip")
    p.add_argument("--work", default=str(HERE / "work" / "tune_cifar10"))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--train-epochs", type=float, default=4)
    p.add_argument("--tune-epochs", type=float, default=8)
    p.add_argument("--tune-lr", type=float, default=0.03)
    p.add_argument("--train-here", action="store_true",
                   help="train the base model with `autotailor train` even if benchmarks/artifacts has its weights")
    p.add_argument("--random", type=int, default=20)
    p.add_argument("--dist-model", default="mobilenet_v2")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--note", default="", help="how the run went (shared machine, pinned cores), for the report")
    args = p.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    state = State(Path(args.work) / "state.json")
    if not args.report_only:
        for name in args.models.split(","):
            run_model(state, name, args)
    report(state, args)


if __name__ == "__main__":
    main()
