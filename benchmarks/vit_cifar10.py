"""Accuracy of a small vision transformer's SubNets on CIFAR-10: tuned, searched, and predicted.

Reproduce (from the repository root, after `make install` and
``train_base.py --model vit_c32``, whose weights it compiles; hours on one core, resumable)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vit_cifar10.py --data ../shared/data/cifar10 --threads 1
    .venv/bin/python benchmarks/vit_cifar10.py --report-only

The model is ``cifar_models.vit_c32`` (timm's VisionTransformer at 32 px: patch 4, width 192,
6 layers of 6 heads) with its trained CIFAR-10 weights. Every step a user takes goes through
the command line (``autotailor ...``, ``--threads`` as ``OMP_NUM_THREADS``):

1. **compile**: ``autotailor compile cifar_models:vit_c32_trained --input-size 32`` with the
   default space but the q/k width per head switched off (``SPACE``: the kept tuned weights and
   the committed results predate that variable); the largest SubNet is evaluated once before
   tuning (the untuned figure).
2. **tune**: ``autotailor tune`` with the vision-transformer recipe of ``docs/tune.md``: AdamW,
   lr 5e-4, weight decay 0.05, ``--warmup-steps`` (200) warm-up steps, label smoothing 0.1, 4
   SubNets a step (the sandwich rule), in-place distillation from the largest, batch 64 for
   ``--tune-steps`` steps (782: one epoch). The tuned weights are kept in
   ``benchmarks/artifacts/vit_c32_cifar10_tuned.fp16.pt`` (with ``.json``: how they were made)
   and reused instead of tuning again; ``--snapshot`` keeps an unfinished tuning's checkpoint
   there (``vit_c32_cifar10_tuned.ckpt0.pt``: fp16, Adam's second moments as square roots, as
   ``train_base.snapshot`` keeps them, with the tuning's log so far), and the next run resumes
   from it when its work directory has no checkpoint.
3. **sensitivity**: ``autotailor sensitivity`` (its default of 2,000 validation images, fewer
   if ``--validation-images`` is, or ``--sensitivity-images``), timed.
4. **pool**: the largest, the smallest and ``--random`` (200) seeded random SubNets, each
   evaluated on ``--validation-images`` (all 10,000) CIFAR-10 test images as
   ``baselines.autotailor_points`` evaluates (``autotailor.tune.evaluate``, which skips BatchNorm
   recalibration for a model without BatchNorm), MACs and parameters counted.
5. **predictor**: the sensitivity predictor of ``WORK/model/sensitivity.json`` (as the search
   builds it) on the pool: Kendall tau and top-5 ranking accuracy (``accuracy_predictor.top5_accuracy``:
   100 groups of min(200, pool) SubNets; a group counts when the predicted best is among its
   true top 5).
6. **search**: ``autotailor search --macs-m ... --device none`` for ``--budgets`` (20) MAC
   budgets spread geometrically (a fixed ratio apart, as ``--budgets N`` spans a space) from
   the smallest SubNet's MACs to the largest's, each rounded up to the next thousand MACs; each
   chosen SubNet evaluated as the pool is, and compared with the pool SubNets within its
   budget: the most accurate of them, and the share it beats or ties.

Every result is kept in ``benchmarks/work/vit_cifar10/state.json`` as it finishes, so an
interrupted run resumes. Results: ``benchmarks/results/vit_cifar10.{json,md,png}``
(``--report-only`` rewrites them from the state). ``--no-artifacts`` (smoke tests) keeps the
artifacts and results in the work directory instead, e.g.::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/vit_cifar10.py --model-spec cifar_models:vit_c32 \\
        --work /tmp/vit_smoke --tune-steps 4 --random 4 --validation-images 256 --budgets 3 --threads 1 --no-artifacts
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from accuracy_predictor import top5_accuracy  # noqa: E402
from baselines import CALIBRATION_IMAGES, _cli  # noqa: E402
from common import (State, atomic_torch_save, default_cifar10, fp16_state, fp32_state, head_commit,  # noqa: E402
                    machine, save_figure, write_results)

MODEL_SPEC = "cifar_models:vit_c32_trained"
STEPS_PER_EPOCH = 782  # batches of 64 in CIFAR-10's 50,000 training images
# docs/tune.md's recipe for vision transformers (label smoothing and distillation: TuneConfig's defaults)
RECIPE = ["--subnets", "4", "--optimizer", "adamw", "--lr", "5e-4", "--weight-decay", "0.05", "--label-smoothing",
          "0.1"]
WARMUP = 200
# The space its kept tuned weights and committed results were made in: no q/k or value width.
SPACE = "[var.block_vars]\nAttentionBlock.qk_ratio = [1.0]\nAttentionBlock.v_ratio = [1.0]\n"
TUNED = "vit_c32_cifar10_tuned.fp16.pt"  # tuning_schedules.tuned_artifact's naming, schedule "tuned"
TUNED_INFO = "vit_c32_cifar10_tuned.json"
SNAPSHOT = "vit_c32_cifar10_tuned.ckpt0.pt"
ARTIFACT_BYTES = 25 * 2**20
GROUPS, GROUP_SIZE = 100, 200  # accuracy_predictor.py's top-5 groups
SENSITIVITY_IMAGES = 2000  # `autotailor sensitivity`'s default (EvalSettings)

log = logging.getLogger("vit_cifar10")


# -- tuning checkpoints kept as artifacts ----------------------------------------------------------
def _fp16_checkpoint(ckpt: dict) -> dict:
    """The tuner's checkpoint (``Tuner.state``) with its floating tensors in fp16: weights and
    Adam's moments, the second moments as square roots (fp16 flushes values below 6e-8 to
    zero, and a zero second moment makes the resumed run's first steps huge; see
    ``train_base.snapshot``). Steps, settings and the schedule are kept as they are."""
    model = fp16_state(ckpt["model"])
    slots = {"exp_avg": lambda t: t.half(), "exp_avg_sq": lambda t: t.sqrt().half()}
    opt = {**ckpt["optimizer"], "state": {i: {k: slots[k](v) if k in slots else v for k, v in s.items()}
                                          for i, s in ckpt["optimizer"]["state"].items()}}
    return {**ckpt, "model": model, "optimizer": opt, "fp16": True}


def _fp32_checkpoint(ckpt: dict) -> dict:
    """``_fp16_checkpoint`` undone (up to fp16 rounding): what ``Tuner.resume`` reads."""
    model = fp32_state(ckpt["model"])
    slots = {"exp_avg": lambda t: t.float(), "exp_avg_sq": lambda t: t.float().square()}
    opt = {**ckpt["optimizer"], "state": {i: {k: slots[k](v) if k in slots else v for k, v in s.items()}
                                          for i, s in ckpt["optimizer"]["state"].items()}}
    return {k: v for k, v in {**ckpt, "model": model, "optimizer": opt}.items() if k != "fp16"}


def snapshot(folder: Path, artifacts: Path) -> Path:
    """``WORK/model/tune.ckpt`` in fp16 as ``artifacts/SNAPSHOT``, for a later session whose
    work directory is gone (refused over the artifacts' 25 MB a file)."""
    ckpt = folder / "tune.ckpt"
    if not ckpt.is_file():
        raise SystemExit(f"no checkpoint at {ckpt} to snapshot")
    out = artifacts / SNAPSHOT
    artifacts.mkdir(parents=True, exist_ok=True)
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    tune_log = folder / "tune.log.jsonl"  # the sessions so far, for the tuning's time
    atomic_torch_save({**_fp16_checkpoint(state), "log": tune_log.read_text() if tune_log.is_file() else ""}, out)
    if out.stat().st_size > ARTIFACT_BYTES:
        size = out.stat().st_size / 2**20
        out.unlink()
        raise SystemExit(f"the fp16 checkpoint is {size:.1f} MB, over the artifacts' 25 MB a file")
    print(f"step {state['step']} of {state['config']['steps']} kept in {out} ({out.stat().st_size / 2**20:.1f} MB)")
    return out


# -- stages ----------------------------------------------------------------------------------------
def _done(state: State, stage: str, started: float) -> None:
    seconds = time.perf_counter() - started
    state.put(seconds, "stage_seconds", stage)
    print(f"== {stage}: {seconds:.1f} s", flush=True)


def eval_batches(sn, data: str, images: int) -> tuple[list, list]:
    """``baselines.autotailor_points``' evaluation data: ``images`` of the CIFAR-10 test split
    (a seeded sample if fewer than all) in batches of 500, and 2,048 training images to
    recalibrate BatchNorm on (``evaluate`` runs none of them for a model without BatchNorm)."""
    from autotailor.data import BatchLoader, load_data

    train, test = load_data(f"cifar10:{data}", seed=0)
    resolution = sn.example_shape[-1]
    calib = BatchLoader(train, 64, train=True, resolution=resolution, seed=0)
    calibration = [calib.batch(0, i) for i in range(CALIBRATION_IMAGES // 64)]
    return list(BatchLoader(test.sample(images, 0), 500, train=False, resolution=resolution)), calibration


def measure(sn, costs, arch: dict, batches: list, calibration: list) -> dict[str, Any]:
    """``arch``'s test accuracy, MACs and parameters, and the seconds the evaluation took."""
    from autotailor.tune import evaluate

    started = time.perf_counter()
    accuracy = evaluate(sn, arch, batches, calibration)
    c = costs.costs(arch)
    return {"arch": arch, "accuracy": accuracy, "macs": c.macs, "params": c.params,
            "seconds": time.perf_counter() - started}


def compile_model(args: argparse.Namespace, state: State, folder: Path) -> None:
    """The SuperNet compiled from ``--model-spec``, and its largest SubNet's accuracy before tuning."""
    import autotailor as at

    started = time.perf_counter()
    if not (folder / "supernet.pt").is_file():
        # The space the kept tuned weights were tuned in and the committed results measured:
        # heads, MLP, embedding and depth, without the q/k width per head that came after them.
        config = folder.parent / "space.toml"
        config.write_text(SPACE)
        _cli("compile", args.model_spec, "--input-size", "32", "--config", str(config), "--out", str(folder))
        _done(state, "compile", started)
    if state.get("compile") is None:
        summary = json.loads((folder / "compile.json").read_text())
        state.put({k: summary.get(k) for k in ("num_modifications", "modifications", "space_size", "log10_space_size",
                                               "compile_seconds")}, "compile")
    # the SuperNet is untuned until the tuning stage is recorded (the tuner writes supernet.pt last)
    if state.get("untuned_largest") is None and state.get("tune") is None:
        started = time.perf_counter()
        from autotailor.predict.latency import CostModel, KernelPlan

        sn = at.load(folder)
        batches, calibration = eval_batches(sn, args.data, args.validation_images)
        point = measure(sn, CostModel(KernelPlan(sn, "none")), sn.space.max(), batches, calibration)
        state.put(point, "untuned_largest")
        print(f"untuned largest SubNet: {100 * point['accuracy']:.2f} %", flush=True)
        _done(state, "untuned", started)


def _tune_log(folder: Path) -> dict[str, Any]:
    """What ``WORK/model/tune.log.jsonl`` says of the tuning, over all its sessions (those before
    a snapshot included)."""
    path = folder / "tune.log.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    last = {r["step"]: r for r in lines}  # a resumed run repeats the steps after its last checkpoint
    losses = [last[s]["loss"] for s in sorted(last)]
    seconds = sum(r["seconds"] for r in lines)
    return {"steps": len(last) or None, "seconds": seconds, "cpu_seconds": sum(r["cpu_seconds"] for r in lines),
            "subnet_images_per_second": sum(r["images"] for r in lines) / seconds if seconds else None,
            "final_loss": statistics.mean(losses[-50:]) if losses else None}


def tune(args: argparse.Namespace, state: State, folder: Path, artifacts: Path) -> None:
    """Tune through the command line (resumable; from the snapshot if the work directory has no
    checkpoint), keep the weights in ``artifacts``, or load the kept ones instead."""
    import autotailor as at

    if state.get("tune") is not None:
        return
    started = time.perf_counter()
    kept, info_path, partial = artifacts / TUNED, artifacts / TUNED_INFO, artifacts / SNAPSHOT
    flags = ["--steps", str(args.tune_steps), *RECIPE, "--warmup-steps", str(args.warmup_steps)]
    if kept.is_file():  # tuned before: the kept weights instead of the tuning
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        if info.get("flags", flags) != flags:
            raise SystemExit(f"{kept} was tuned with {info['flags']}, not {flags}: pass the same --tune-steps and "
                             "--warmup-steps, or move it away")
        sn = at.load(folder)
        sn.load_state_dict({k: v.to(sn.state_dict()[k].dtype) for k, v in torch.load(kept, map_location="cpu").items()})
        sn.save(folder / "supernet.pt")
        state.put({**info, "kept": str(kept)}, "tune")
        print(f"tuned weights loaded from {kept}", flush=True)
        _done(state, "tune", started)
        return
    if partial.is_file() and not (folder / "tune.ckpt").is_file():  # a tuning an earlier session began
        ckpt = _fp32_checkpoint(torch.load(partial, map_location="cpu", weights_only=False))
        (folder / "tune.log.jsonl").write_text(ckpt.pop("log", ""))
        atomic_torch_save(ckpt, folder / "tune.ckpt")
        print(f"resuming from {partial} (step {ckpt['step']})", flush=True)
    _cli("tune", str(folder), "--data", f"cifar10:{args.data}", *flags, "--quiet")
    commit = head_commit()
    info = {"command": "autotailor tune WORK --data cifar10:PATH " + " ".join(flags), "flags": flags,
            "model_spec": args.model_spec, "commit": commit, **_tune_log(folder)}
    sn = at.load(folder)
    artifacts.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(fp16_state(sn.state_dict()), kept)
    info_path.write_text(json.dumps(info, indent=1) + "\n")
    partial.unlink(missing_ok=True)
    print(f"kept the tuned weights in {kept}: add its line to {artifacts / 'README.md'}", flush=True)
    state.put({**info, "kept": str(kept)}, "tune")
    _done(state, "tune", started)


def sensitivity(args: argparse.Namespace, state: State, folder: Path) -> None:
    """``autotailor sensitivity``, timed (the predictor's whole build)."""
    from autotailor.predict.accuracy import SensitivityTable

    if state.get("sensitivity") is not None:
        return
    started = time.perf_counter()
    images = args.sensitivity_images or min(SENSITIVITY_IMAGES, args.validation_images)
    _cli("sensitivity", str(folder), "--data", f"cifar10:{args.data}", "--validation-images", str(images), "--quiet")
    seconds = time.perf_counter() - started
    table = SensitivityTable.load(folder / "sensitivity.json")
    state.put({"seconds": seconds, "build_seconds": table.seconds, "evaluations": len(table.deltas) + 1,
               "validation_images": table.validation_images, "calibration_batches": table.calibration_batches,
               "base_accuracy": table.base_accuracy}, "sensitivity")
    _done(state, "sensitivity", started)


def pool(args: argparse.Namespace, state: State, folder: Path) -> None:
    """The largest, the smallest and ``--random`` seeded random SubNets, each evaluated."""
    import autotailor as at
    from autotailor.predict.latency import CostModel, KernelPlan

    sn = at.load(folder)
    rng = random.Random(0)
    archs = {"largest": sn.space.max(), "smallest": sn.space.min()}
    archs.update({f"random{i:03d}": sn.space.complete(sn.space.sample(rng)) for i in range(args.random)})
    todo = [name for name in archs if state.get("pool", name) is None]
    if not todo:
        return
    started = time.perf_counter()
    costs = CostModel(KernelPlan(sn, "none"))
    batches, calibration = eval_batches(sn, args.data, args.validation_images)
    for n, name in enumerate(todo):
        point = measure(sn, costs, archs[name], batches, calibration)
        state.put(point, "pool", name)
        print(f"pool {name} ({n + 1}/{len(todo)}): {100 * point['accuracy']:.2f} % at {point['macs'] / 1e6:.1f} M MACs "
              f"({point['seconds']:.0f} s)", flush=True)
    _done(state, "pool", started)


def predict(state: State, folder: Path) -> None:
    """The sensitivity predictor's accuracy for every pool SubNet (cheap: made again each run)."""
    import autotailor as at
    from autotailor.pipeline.selection import accuracy_model

    started = time.perf_counter()
    sn = at.load(folder)
    predictor, _ = accuracy_model(sn, folder)  # as the search builds it from WORK/model/sensitivity.json
    names = sorted(state.get("pool"))
    predicted = predictor.predict_many([state.get("pool", n, "arch") for n in names])
    state.put({n: float(p) for n, p in zip(names, predicted)}, "predicted")
    _done(state, "predict", started)


def budgets_mmacs(lo: int, hi: int, count: int) -> list[float]:
    """``count`` MAC budgets (millions) from ``lo`` to ``hi``, a fixed ratio apart, each rounded up
    to the next thousand MACs (so that the smallest and largest SubNets meet the ends)."""
    values = [lo * (hi / lo) ** (i / max(1, count - 1)) for i in range(count)] if count > 1 else [float(hi)]
    return [(math.floor(v / 1e3) + 1) / 1e3 for v in values]


def search(args: argparse.Namespace, state: State, folder: Path) -> None:
    """``autotailor search`` for the MAC budgets, and each chosen SubNet evaluated."""
    import autotailor as at
    from autotailor.pipeline.results import SearchRecord
    from autotailor.predict.latency import CostModel, KernelPlan

    budgets = budgets_mmacs(state.get("pool", "smallest", "macs"), state.get("pool", "largest", "macs"), args.budgets)
    if state.get("search", "budgets_mmacs") != budgets or not SearchRecord.exists(folder):
        started = time.perf_counter()
        _cli("search", str(folder), "--macs-m", ",".join(f"{b:.3f}" for b in budgets), "--device", "none")
        record = SearchRecord.read(folder)
        state.put({"budgets_mmacs": budgets, "seconds": time.perf_counter() - started,
                   "search_seconds": record.seconds, "predictions": record.predictions, "choices": {}}, "search")
        _done(state, "search", started)
    record = SearchRecord.read(folder)
    todo = [(i, c) for i, c in enumerate(record.choices) if state.get("search", "choices", f"{i:02d}") is None]
    if not todo:
        return
    started = time.perf_counter()
    sn = at.load(folder)
    costs = CostModel(KernelPlan(sn, "none"))
    key = lambda arch: json.dumps(arch, sort_keys=True)  # noqa: E731  (archs as the state holds them)
    known = {key(p["arch"]): p for p in [*state.get("pool").values(), *state.get("search", "choices").values()]
             if p.get("arch")}
    batches = calibration = None
    for i, c in todo:
        entry: dict[str, Any] = {"budget": c.budget, "budget_macs": c.limits["macs"], "predicted_accuracy": c.accuracy}
        if c.arch is not None:
            arch = sn.space.complete(c.arch)
            point = known.get(key(arch))
            if point is None:
                if batches is None:
                    batches, calibration = eval_batches(sn, args.data, args.validation_images)
                point = measure(sn, costs, arch, batches, calibration)
                known[key(arch)] = point
            entry.update({k: point[k] for k in ("arch", "accuracy", "macs", "params")})
            print(f"budget {c.budget}: {100 * point['accuracy']:.2f} % (predicted {100 * c.accuracy:.2f} %) at "
                  f"{point['macs'] / 1e6:.2f} M MACs", flush=True)
        else:
            entry["arch"] = None
        state.put(entry, "search", "choices", f"{i:02d}")
    _done(state, "search_eval", started)


# -- report ----------------------------------------------------------------------------------------
def compare(state: State) -> list[dict[str, Any]]:
    """Each budget's choice against the pool SubNets within the budget: the most accurate of
    them, and the share of them it beats or ties."""
    points = list((state.get("pool") or {}).values())
    rows = []
    for key, c in sorted((state.get("search", "choices") or {}).items()):
        within = [p for p in points if p["macs"] <= c["budget_macs"]]
        best = max(within, key=lambda p: p["accuracy"]) if within else None
        share = (sum(p["accuracy"] <= c["accuracy"] for p in within) / len(within)
                 if within and c.get("arch") else None)
        rows.append({"budget_mmacs": c["budget_macs"] / 1e6, "chosen_mmacs": c["macs"] / 1e6 if c.get("arch") else None,
                     "predicted_accuracy": c["predicted_accuracy"], "accuracy": c.get("accuracy"),
                     "pool_within": len(within), "best_pool_accuracy": best["accuracy"] if best else None,
                     "best_pool_mmacs": best["macs"] / 1e6 if best else None, "share_beaten_or_tied": share})
    return rows


def predictor_quality(state: State) -> dict[str, Any] | None:
    """Kendall tau and top-5 ranking accuracy of the sensitivity predictor on the pool."""
    from scipy.stats import kendalltau

    predicted, measured = state.get("predicted") or {}, state.get("pool") or {}
    names = sorted(n for n in predicted if n in measured)
    if len(names) < 2:
        return None
    pred = np.array([predicted[n] for n in names])
    truth = np.array([measured[n]["accuracy"] for n in names])
    size = min(GROUP_SIZE, len(names))
    return {"subnets": len(names), "kendall_tau": float(kendalltau(pred, truth).statistic),
            "top5": top5_accuracy(pred, truth, GROUPS, size), "groups": GROUPS, "group_size": size,
            "predicted_best_in_true_top5": names[int(np.argmax(pred))] in
            {names[i] for i in np.argsort(-truth, kind="stable")[:5]}}


def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def report(args: argparse.Namespace, state: State, results: Path) -> None:
    argv = sys.argv[1:]
    kept = [a for i, a in enumerate(argv) if a != "--report-only" and not a.startswith("--note")
            and not (i > 0 and argv[i - 1] == "--note")]
    command = " ".join(["python", "benchmarks/vit_cifar10.py", *kept])
    m = machine("torch", "timm", "scipy", "autotailor")
    commit = head_commit()
    settings = state.get("settings") or {}
    measured = state.get("pool") or {}
    randoms = [p["accuracy"] for k, p in measured.items() if k.startswith("random")]
    tuned, sens, quality, rows = state.get("tune") or {}, state.get("sensitivity") or {}, predictor_quality(state), \
        compare(state)
    summary = {
        "largest": measured.get("largest"), "smallest": measured.get("smallest"),
        "untuned_largest": state.get("untuned_largest"),
        "random": {"count": len(randoms), "median": statistics.median(randoms), "min": min(randoms),
                   "max": max(randoms)} if randoms else None,
        "tuning": tuned, "sensitivity": sens, "predictor": quality, "budgets": rows,
        "search": {k: v for k, v in (state.get("search") or {}).items() if k != "choices"},
        "stage_seconds": state.get("stage_seconds")}
    lines = ["# A small vision transformer on CIFAR-10: SubNets tuned, searched and predicted", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, timm {m['timm']}, scipy {m['scipy']}; "
             f"commit {commit}. Command: `{command}` (resumes; `--report-only` rewrites this from the state)."
             + (f" {args.note}" if args.note else ""), "",
             f"Model `{settings.get('model_spec')}` (`cifar_models.vit_c32`: 32 px, patch 4, width 192, 6 layers of "
             f"6 heads), compiled at 32 px with the default space"
             + (f" ({state.get('compile', 'num_modifications')} modifications, 10^"
                f"{state.get('compile', 'log10_space_size'):.1f} SubNets)" if state.get("compile") else "")
             + f". Accuracy on {settings.get('validation_images')} CIFAR-10 test images"
             + (" (all)" if settings.get("validation_images") == 10000 else " (a seeded sample)")
             + "; MACs and parameters counted from the shapes.", ""]
    lines += ["| SubNet | accuracy | MACs | parameters |", "|---|---|---|---|"]
    for label, p in (("largest (untuned, before `autotailor tune`)", state.get("untuned_largest")),
                     ("largest", measured.get("largest")), ("smallest", measured.get("smallest"))):
        if p:
            lines.append(f"| {label} | {_pct(p['accuracy'])} | {p['macs'] / 1e6:.1f} M | {p['params'] / 1e6:.2f} M |")
    if randoms:
        lines.append(f"| {len(randoms)} random: median (min-max) | {_pct(statistics.median(randoms))} "
                     f"({_pct(min(randoms))} - {_pct(max(randoms))}) | | |")
    lines.append("")
    if tuned:
        made = (f"{tuned['steps']} steps, {_minutes(tuned.get('seconds'))} wall, {_minutes(tuned.get('cpu_seconds'))} "
                f"CPU, {tuned['subnet_images_per_second']:.0f} SubNet-images/s, final loss {tuned['final_loss']:.3f}"
                if tuned.get("steps") else "how long: not recorded")
        lines += [f"Tuning: `{tuned.get('command', 'autotailor tune')}` ({made}; commit {tuned.get('commit', '?')}); "
                  f"weights kept in `{Path(tuned['kept']).name}`.", ""]
    if sens:
        lines += [f"Sensitivity predictor: `autotailor sensitivity` measured {sens['evaluations']} SubNets (each "
                  f"single modification and the largest) on {sens['validation_images']} test images "
                  f"(no BatchNorm to recalibrate) in {sens['build_seconds']:.0f} s of "
                  f"evaluations ({sens['seconds']:.0f} s for the whole command)."
                  + (f" On the pool of {quality['subnets']} SubNets (the largest, the smallest and the random ones): "
                     f"Kendall tau {quality['kendall_tau']:.3f}, top-5 ranking accuracy {100 * quality['top5']:.0f} % "
                     f"({quality['groups']} groups of {quality['group_size']}); the pool's predicted best is "
                     f"{'' if quality['predicted_best_in_true_top5'] else 'not '}among its true top 5."
                     if quality else ""), ""]
    if rows:
        search_info = state.get("search") or {}
        lines += [f"Search: `autotailor search --macs-m ... --device none`, {len(rows)} MAC budgets a fixed ratio "
                  f"apart from the smallest SubNet's MACs to the largest's "
                  f"({search_info.get('search_seconds', 0):.1f} s of search, {search_info.get('predictions', 0)} "
                  "predictions). Each choice against the pool SubNets within its budget:", "",
                  "| budget | chosen MACs | predicted | measured | pool within | best pool SubNet within | "
                  "pool beaten or tied |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            chosen = r["chosen_mmacs"] is not None
            lines.append(f"| {r['budget_mmacs']:.3f} M | " + (f"{r['chosen_mmacs']:.2f} M" if chosen else "none")
                         + f" | {_pct(r['predicted_accuracy'])} | {_pct(r['accuracy'])} | {r['pool_within']} | "
                         + (f"{_pct(r['best_pool_accuracy'])} at {r['best_pool_mmacs']:.2f} M"
                            if r["best_pool_accuracy"] is not None else "-")
                         + f" | {_pct(r['share_beaten_or_tied'], 0)} |")
        lines.append("")
    if measured:
        lines += [f"![pool and searched front]({_plot(state, results).name})", ""]
    stages = state.get("stage_seconds") or {}
    if stages:
        lines += ["Time per stage (this work directory, last session of each): "
                  + ", ".join(f"{k} {_minutes(v)}" for k, v in stages.items()) + ".", ""]
    doc = {"machine": m, "commit": commit, "command": command, "note": args.note, "settings": settings,
           "summary": summary, "raw": state.data}
    write_results(results, "vit_cifar10", doc, "\n".join(lines) + "\n")


def _plot(state: State, results: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(7, 4.5))
    measured = state.get("pool")
    randoms = [(p["macs"] / 1e6, 100 * p["accuracy"]) for k, p in measured.items() if k.startswith("random")]
    if randoms:
        ax.scatter(*zip(*randoms), s=12, c="0.6", label=f"{len(randoms)} random SubNets")
    for name, marker in (("largest", "^"), ("smallest", "v")):
        if name in measured:
            ax.scatter(measured[name]["macs"] / 1e6, 100 * measured[name]["accuracy"], marker=marker, s=50, c="k",
                       label=name, zorder=3)
    chosen = sorted({(c["macs"] / 1e6, 100 * c["accuracy"], 100 * c["predicted_accuracy"])
                     for c in (state.get("search", "choices") or {}).values() if c.get("arch")})
    if chosen:
        x, acc, pred = zip(*chosen)
        ax.plot(x, acc, "o-", c="tab:red", label="searched (measured)", zorder=4)
        ax.plot(x, pred, "x:", c="tab:blue", label="searched (predicted)", zorder=4)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    ax.set_xlabel("MACs (millions)")
    ax.set_ylabel("top-1 accuracy (%)")
    ax.set_title("vit_c32 SubNets, CIFAR-10 test")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, results / "vit_cifar10.png")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=default_cifar10(), help="directory with train.zip and test.zip")
    p.add_argument("--work", default=str(HERE / "work" / "vit_cifar10"))
    p.add_argument("--model-spec", default=MODEL_SPEC,
                   help="what `autotailor compile` compiles (cifar_models:vit_c32: random weights, for smoke tests)")
    p.add_argument("--tune-steps", type=int, default=STEPS_PER_EPOCH, help="tuning steps (batches of 64)")
    p.add_argument("--warmup-steps", type=int, default=WARMUP, help="tuning warm-up steps")
    p.add_argument("--random", type=int, default=200, help="random SubNets in the pool")
    p.add_argument("--validation-images", type=int, default=10000, help="test images every SubNet is evaluated on")
    p.add_argument("--sensitivity-images", type=int, default=None,
                   help=f"validation images of `autotailor sensitivity` (default {SENSITIVITY_IMAGES}, its own, "
                        "or --validation-images if fewer)")
    p.add_argument("--budgets", type=int, default=20, help="MAC budgets searched")
    p.add_argument("--threads", type=int, default=1, help="threads of the evaluations and the commands")
    p.add_argument("--snapshot", action="store_true", help="copy the unfinished tuning's checkpoint into the "
                   "artifacts (fp16), for a later session to resume from, and stop")
    p.add_argument("--no-artifacts", action="store_true", help="keep the artifacts and results in the work "
                   "directory, not in benchmarks/artifacts and benchmarks/results (smoke tests)")
    p.add_argument("--note", default="", help="how the run went, for the report")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = Path(args.work)
    if args.model_spec != MODEL_SPEC and not args.no_artifacts:
        raise SystemExit(f"--model-spec {args.model_spec} needs --no-artifacts: the kept weights are of {MODEL_SPEC}")
    artifacts = work / "artifacts" if args.no_artifacts else HERE / "artifacts"
    results = work / "results" if args.no_artifacts else HERE / "results"
    folder = work / "model"
    work.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the commands' threads (baselines._cli passes the env on)
    torch.set_num_threads(args.threads)
    state = State(work / "state.json")
    if args.snapshot:
        snapshot(folder, artifacts)
        return
    if not args.report_only:
        settings = {"model_spec": args.model_spec, "validation_images": args.validation_images}
        if state.get("settings") not in (None, settings):
            raise SystemExit(f"{work} holds results of {state.get('settings')}, not {settings}: pass another --work "
                             "or the same settings")
        state.put(settings, "settings")
        compile_model(args, state, folder)
        tune(args, state, folder, artifacts)
        sensitivity(args, state, folder)
        pool(args, state, folder)
        predict(state, folder)
        search(args, state, folder)
    report(args, state, results)


if __name__ == "__main__":
    main()
