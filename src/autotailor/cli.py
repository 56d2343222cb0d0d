"""The ``autotailor`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from autotailor.errors import AutoTailorError
from autotailor.pipeline.workdir import CONFIG


def _summary(sn) -> dict[str, Any]:
    from collections import Counter

    info = sn.compile_info
    kinds = Counter(v.kind for v in sn.space.variables)
    mods = Counter()
    for v in sn.space.variables:
        mods[v.kind] += len(v.choices) - 1
    return {
        "source": info.get("source"),
        "compile_seconds": round(info.get("seconds", 0.0), 3),
        "input_shape": list(sn.example_shape),
        "blocks": info.get("blocks", []),
        "stages": info.get("stages", []),
        "channel_groups": info.get("groups", {}),
        "variables": dict(kinds),
        "modifications": dict(mods),
        "num_modifications": sn.space.num_modifications,
        "space_size": str(sn.space.size),
        "log10_space_size": round(sn.space.log10_size, 3),
    }


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    counts: dict[str, list[int]] = {}  # template -> [blocks, droppable blocks]
    for b in summary["blocks"]:
        c = counts.setdefault(b["template"] or "(none)", [0, 0])
        c[0] += 1
        c[1] += b["droppable"]
    table = Table(title=f"SuperNet of {summary['source']}")
    table.add_column("template")
    table.add_column("blocks", justify="right")
    table.add_column("droppable", justify="right")
    for name, (blocks, droppable) in counts.items():
        table.add_row(name, str(blocks), str(droppable))
    console.print(table)
    stages = summary["stages"]
    console.print(f"stages: {len(stages)} (blocks per stage: {[len(s) for s in stages]})")
    console.print(
        "channel groups: {total} ({variable} variable)".format(**summary["channel_groups"])
        if summary["channel_groups"] else ""
    )
    mods = ", ".join(f"{k} {v}" for k, v in summary["modifications"].items())
    console.print(f"modifications: {summary['num_modifications']} ({mods})")
    console.print(f"space size: {summary['space_size']} (10^{summary['log10_space_size']:.1f}) SubNets")
    console.print(f"compile time: {summary['compile_seconds']:.2f} s")


def _write_work(sn, config, out: Path, summary: dict[str, Any]) -> None:
    """Write the work directory's files so that a failure leaves nothing half-written."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
    try:
        sn.save(staging / "supernet.pt")
        (staging / "space.json").write_text(json.dumps(sn.space.describe(), indent=1))
        (staging / "compile.json").write_text(json.dumps(summary, indent=1))
        (staging / CONFIG).write_text(json.dumps(config.to_dict(), indent=1))
        for f in staging.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _example(size: int | None, channels: int = 3) -> torch.Tensor | None:
    return torch.zeros(1, channels, size, size) if size else None


def cmd_compile(args: argparse.Namespace) -> int:
    import autotailor as at

    config = at.load_config(args.config)
    sn = at.compile(args.model, _example(args.input_size), config=config)
    summary = _summary(sn)
    _write_work(sn, config, Path(args.out), summary)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        _print_summary(summary)
        print(f"wrote {args.out}/supernet.pt")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The whole pipeline on the embedded default: ResNet-18 on handwritten digits, this CPU."""
    from autotailor.pipeline.run import DEMO_CONFIG, plan_run

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = out / "demo.toml"
    if not config.is_file():
        config.write_text(DEMO_CONFIG)
    print(f"AutoTailor demo: {config} (offline; resumable: run it again after an interruption)")
    return _execute(plan_run(config, out))


def _load_work(work: str):
    from autotailor.pipeline.workdir import load_supernet

    return load_supernet(work)


_TUNE_FLAGS = ("steps", "subnets", "optimizer", "lr", "weight_decay", "warmup_steps", "label_smoothing", "seed",
               "checkpoint_every")


def _step_settings(cls, section: str, args: argparse.Namespace, flags: dict[str, object]):
    """A step's settings: its ``[section]`` table in the work directory's config (``WORK/config.json``,
    from the compile), then in ``--config`` (if given), then the flags given (those not None)."""
    from autotailor.compiler.config import load_config
    from autotailor.settings import merge_settings

    path = Path(args.work) / CONFIG
    tables = [load_config(json.loads(path.read_text())).steps.get(section, {}) if path.is_file() else {}]
    if getattr(args, "config", None):
        tables.append(load_config(args.config).steps.get(section, {}))
    return merge_settings(cls, section, *tables, {k: v for k, v in flags.items() if v is not None})


def _validation_data(sn, args: argparse.Namespace, flags: dict[str, object]):
    """The data SubNets are evaluated on after the sensitivity step (``EvalData``, or None when
    no data is known): ``--data``, else the sensitivity table's; the table's validation subset
    and calibration (else the ``[sensitivity]`` tables'), then ``flags``."""
    from autotailor.pipeline.workdir import SENSITIVITY, EvalSettings, eval_data
    from autotailor.settings import merge_settings

    path = Path(args.work) / SENSITIVITY
    info = json.loads(path.read_text()).get("info", {}) if path.is_file() else {}
    spec = args.data or info.get("data")
    if not spec:
        return None
    measured = {k: info[k] for k in ("validation_images", "calibration_batches", "seed") if k in info}
    base = _step_settings(EvalSettings, "sensitivity", args, {})
    settings = merge_settings(EvalSettings, "sensitivity", vars(base) | measured,
                              {k: v for k, v in flags.items() if v is not None})
    return eval_data(spec, sn.example_shape[-1], settings)


def _run_tuning(args: argparse.Namespace, subnets: int, name: str) -> int:
    """``train`` (the largest SubNet alone) and ``tune`` (sampled SubNets), with a progress bar."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from autotailor.data import BatchLoader, load_data
    from autotailor.tune import Tuner

    rank = _init_distributed()
    sn = _load_work(args.work)
    from autotailor.tune import TuneConfig

    flags = {k: getattr(args, k, None) for k in _TUNE_FLAGS}
    if subnets is not None:  # train: the largest SubNet alone
        flags["subnets"] = subnets
    config = _step_settings(TuneConfig, name, args, flags)
    train, _ = load_data(args.data, seed=config.seed)
    loader = BatchLoader(train, args.batch_size, train=True, resolution=sn.example_shape[-1], seed=config.seed)
    tuner = Tuner(sn, loader, config, Path(args.work) / f"{name}.ckpt")
    if tuner.resume():
        print(f"resuming {name} at step {tuner.step}")
    started, images = time.perf_counter(), 0
    log_path = Path(args.work) / f"{name}.log.jsonl"  # one line per step: the loss curve and throughput
    last = [time.perf_counter(), time.process_time()]
    columns = (TextColumn(f"{name}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[ips]:.0f} img/s"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=args.quiet or rank != 0) as progress:
        task = progress.add_task(name, total=tuner.config.steps, completed=tuner.step, loss=float("nan"), ips=0.0)

        def on_step(result) -> None:
            nonlocal images
            now = [time.perf_counter(), time.process_time()]
            images += result.images
            progress.update(task, advance=1, loss=result.loss, ips=images / (now[0] - started))
            if rank == 0:
                record = {"step": result.step, "loss": result.loss, "images": result.images * tuner.world,
                          "seconds": now[0] - last[0], "cpu_seconds": now[1] - last[1], "processes": tuner.world}
                with log_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
            last[:] = now

        tuner.run(on_step)
    if rank == 0:
        sn.save(Path(args.work) / "supernet.pt")
        print(f"{name}: {tuner.step} steps on {tuner.world} process(es); weights in {args.work}/supernet.pt")
    return 0


def _init_distributed() -> int:
    """Join the process group that ``torchrun`` describes in the environment; this process's rank."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


def cmd_train(args: argparse.Namespace) -> int:
    return _run_tuning(args, 1, "train")


def cmd_tune(args: argparse.Namespace) -> int:
    return _run_tuning(args, None, "tune")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from autotailor.data import BatchLoader, load_data
    from autotailor.tune import evaluate

    sn = _load_work(args.work)
    arch = sn.space.complete(_read_arch(sn, args.arch))
    train, val = load_data(args.data, seed=args.seed)
    resolution = sn.input_shape(arch)[-1]
    val_batches = list(BatchLoader(val, args.batch_size, train=False, resolution=resolution))
    calib = BatchLoader(train, args.batch_size, train=True, resolution=resolution, seed=args.seed)
    calib_batches = [calib.batch(0, i) for i in range(min(args.calibration_batches, len(calib)))]
    result = {
        "accuracy": evaluate(sn, arch, val_batches, calib_batches),
        "accuracy_without_recalibration": evaluate(sn, arch, val_batches),
        "validation_images": sum(len(y) for _, y in val_batches),
        "arch": arch,
    }
    print(json.dumps(result, indent=1) if args.json else
          f"accuracy {result['accuracy']:.4f} (without BN recalibration {result['accuracy_without_recalibration']:.4f})"
          f" on {result['validation_images']} images")
    return 0


def _latency_setup(args: argparse.Namespace):
    """The work directory's SuperNet and the device (backend, kernel plan, LUT, targets)."""
    from autotailor.pipeline.workdir import device_setup

    sn = _load_work(args.work)
    return sn, device_setup(sn, args.work, args.device, args.device_name, args.lut, args.granularity)


def cmd_profile(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from autotailor.predict.latency import profile

    _, device = _latency_setup(args)
    plan = device.plan
    passes = [(device.backend, device.target, "caches flushed" if device.hot_target else "")]
    if device.hot_target is not None:
        passes.append((device.hot_backend, device.hot_target, "caches warm"))
    with device.open_store() as store:
        print(f"{len(plan.kernels)} unique kernels ({args.granularity}, {len(plan.groups)} kernel groups) "
              f"enumerated in {plan.seconds:.2f} s")
        for backend, target, label in passes:
            print(f"{store.count(target)} already in {store.path} for {target}")
            columns = (TextColumn(f"profile {label}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn(), TimeRemainingColumn())
            with Progress(*columns, disable=args.quiet) as progress:
                task = progress.add_task("profile", total=None)
                report = profile(plan, backend, store, target,
                                 lambda done, total, t=task: progress.update(t, completed=done, total=total))
            print(f"measured {report.measured} kernels in {report.seconds:.1f} s; the LUT holds "
                  f"{store.count(target)} entries for {target}")
    if not device.cache_fixed:
        columns = (TextColumn("calibration (whole SubNets)"), BarColumn(),
                   TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
        with Progress(*columns, disable=args.quiet) as progress:
            task = progress.add_task("calibrate", total=None)
            device.calibrate(lambda done, total: progress.update(task, completed=done, total=total))
        print(f"fitted to measured SubNets: {device.predictor().describe()}"
              + (" (cache_mb in --device fixes the budget instead)" if device.hot_target is not None else ""))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from autotailor.predict.latency import CostModel

    sn, device = _latency_setup(args)
    arch = sn.space.complete(_read_arch(sn, args.arch))
    try:
        latency = device.predictor().predict(arch)
    except AutoTailorError as exc:
        raise AutoTailorError(f"{exc}: autotailor profile {args.work} --device {args.device}") from exc
    costs = CostModel(device.plan).costs(arch)
    result = {"target": str(device.target), "latency_ms": round(latency, 4), "macs": costs.macs,
              "params": costs.params, "peak_activation_bytes": costs.peak_activation_bytes,
              "memory_bytes": costs.memory_bytes}
    print(json.dumps(result, indent=1) if args.json else
          f"{latency:.3f} ms on {device.target}; {costs.macs / 1e6:.1f} M MACs, {costs.params / 1e6:.2f} M params, "
          f"memory {costs.memory_bytes / 2**20:.1f} MiB (peak activations {costs.peak_activation_bytes / 2**20:.1f} MiB)")
    return 0


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from autotailor.pipeline.workdir import SENSITIVITY, EvalSettings, eval_data
    from autotailor.predict.accuracy import measure_sensitivity

    sn = _load_work(args.work)
    settings = _step_settings(EvalSettings, "sensitivity", args, {
        "validation_images": args.validation_images, "calibration_batches": args.calibration_batches,
        "batch_size": args.batch_size, "seed": args.seed})
    data = eval_data(args.data, sn.example_shape[-1], settings)
    print(f"{sn.space.num_modifications} single modifications to measure on {data.images} validation images "
          f"({len(data.calibration)} calibration batches each)")
    columns = (TextColumn("sensitivity"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, disable=args.quiet) as progress:
        task = progress.add_task("sensitivity", total=None)
        table = measure_sensitivity(sn, data.val, data.calibration, Path(args.work) / SENSITIVITY,
                                    info={**data.describe(), "seed": settings.seed},
                                    on_progress=lambda done, total: progress.update(task, completed=done, total=total))
    worst = sorted(table.deltas.items(), key=lambda kv: -kv[1])[:3]
    print(f"largest SubNet {100 * table.base_accuracy:.2f} %; {len(table.deltas)} sensitivities in "
          f"{table.seconds:.1f} s; most sensitive: " + ", ".join(f"{k} ({100 * v:.2f} pts)" for k, v in worst))
    return 0


def _floats(text: str | None, scale: float = 1.0) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) * scale for v in text.split(",") if v.strip())
    except ValueError:
        raise AutoTailorError(f"{text!r} is not a comma-separated list of numbers (e.g. 2,4,8)") from None


def cmd_search(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from autotailor.pipeline.finalists import Finalists
    from autotailor.pipeline.results import SearchRecord
    from autotailor.pipeline.selection import SearchSettings, objectives_for, run_search
    from autotailor.pipeline.workdir import device_setup

    sn = _load_work(args.work)
    settings = _step_settings(SearchSettings, "search", args, {
        "latency_ms": _floats(args.latency_ms), "macs": _floats(args.macs_m, 1e6),
        "params": _floats(args.params_m, 1e6), "memory_bytes": _floats(args.memory_mb, 2.0**20),
        "budgets": args.budgets, "axis": args.axis, "generations": args.generations,
        "population": args.population, "seed": args.seed, "verify": args.verify, "finalists": args.finalists})
    constrains_latency = bool(settings.latency_ms) or (not settings.limits() and settings.axis == "latency_ms")
    device = None
    if args.device != "none":
        device = device_setup(sn, args.work, args.device, args.device_name, args.lut)
        if not constrains_latency:
            try:  # latency is reported when the LUT is there, not required
                device.predictor()
            except AutoTailorError:
                device = None
    elif constrains_latency:
        raise AutoTailorError("latency budgets need a device: --device ort-cpu:threads=1 (profiled first)")
    objectives = objectives_for(sn, args.work, device)
    if settings.verify and device is None:
        raise AutoTailorError("verify measures the chosen SubNets on a device: give --device (profiled first)")
    finalists = None
    if settings.finalists:
        data = _validation_data(sn, args, {"validation_images": args.validation_images, "seed": args.validation_seed})
        if data is None:
            raise AutoTailorError(f"finalists = {settings.finalists} measures SubNets' accuracy: give --data SPEC "
                                  "(by default the data of `autotailor sensitivity`)")
        finalists = Finalists.open(sn, args.work, data, settings.finalists)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, disable=not (settings.verify or finalists) or args.json) as progress:
        timed = progress.add_task("verify (chosen SubNets timed)", total=None, visible=bool(settings.verify))
        tested = progress.add_task("finalists (accuracy measured)", total=None, visible=finalists is not None)
        result = run_search(sn, args.work, device, settings, objectives,
                            on_subnet=lambda done, total: progress.update(timed, completed=done, total=total),
                            finalists=finalists,
                            on_finalist=lambda done, total: progress.update(tested, completed=done, total=total))
    found = SearchRecord.read(args.work)
    print(f"{len(result.choices)} budgets searched in {result.seconds:.1f} s ({result.predictions} predictions"
          + (f", {found.verify_rounds} verify rounds" if settings.verify else "")
          + f"); {len(found.met)} met; choices in {args.work}/{SearchRecord.FILE}")
    if args.json:
        print(json.dumps({"schema": SearchRecord.SCHEMA, **found.to_dict()}, indent=1))
        return 0
    for c in found.choices:
        if c.arch is None:
            print(f"  {c.budget}: no SubNet meets it")
            continue
        shown = ", ".join(f"{m} {v:.4g}" for m, v in c.metrics.items() if m in ("latency_ms", "macs", "params"))
        if c.measured_latency_ms is not None:
            shown += f" (measured {c.measured_latency_ms:.4g} ms)"
        print(f"  {c.budget}: predicted accuracy {100 * c.accuracy:.2f} %"
              + (f" (measured {100 * c.measured_accuracy:.2f} %)" if c.measured_accuracy is not None else "")
              + f", {shown}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autotailor.pipeline.deployment import ExportSettings, check_formats, export_choices
    from autotailor.pipeline.results import SearchRecord
    from autotailor.pipeline.workdir import device_setup

    sn = _load_work(args.work)
    settings = _step_settings(ExportSettings, "export", args, {
        "formats": tuple(args.format.split(",")) if args.format else None, "pick": args.pick})
    check_formats(settings.formats)
    found = SearchRecord.read(args.work)
    chosen = found.pick(settings.pick)
    data = _validation_data(sn, args, {})
    device_spec = args.device or found.device
    device = device_setup(sn, args.work, device_spec, args.device_name) if device_spec and device_spec != "none" else None

    def done(e) -> None:
        lat = e.measured["latency_ms"]
        acc = e.measured["accuracy"]
        print(f"  {e.name}: {len(e.files)} file(s) in {Path(e.files[0]).parent}"
              + (f"; measured {lat:.3f} ms (predicted {e.predicted.get('latency_ms', float('nan')):.3f})"
                 if lat is not None else "")
              + (f"; accuracy {100 * acc:.2f} % (predicted {100 * e.predicted['accuracy']:.2f})"
                 if acc is not None else ""))

    print(f"exporting {len(chosen)} SubNet(s) as {', '.join(settings.formats)}"
          + (f", measured on {device.spec}" if device else ""))
    export_choices(sn, args.work, chosen, settings.formats, data, device, done)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotailor.pipeline.report import write_report

    print(f"report: {write_report(args.work)}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from autotailor.pipeline.run import plan_run

    plan = plan_run(args.config, args.work)
    return _execute(plan)


def _execute(plan) -> int:
    from autotailor.pipeline.run import execute

    started = time.perf_counter()
    record = execute(plan, main, lambda name, state: print(f"== {name}: {state}", flush=True))
    print(f"run finished in {time.perf_counter() - started:.1f} s ({record.seconds:.1f} s "
          f"over all sessions); report: {plan.work / 'report.md'}")
    return 0


def _read_arch(sn, spec: str | None):
    if spec in (None, "max"):
        return sn.space.max()
    if spec == "min":
        return sn.space.min()
    path = Path(spec)
    if not path.is_file():
        raise AutoTailorError(f"--arch {spec!r} is neither max, min nor an arch JSON file")
    return json.loads(path.read_text())


def _add_latency_args(p: argparse.ArgumentParser, granularity: bool = True) -> None:
    from autotailor.predict.latency.backends import device_help

    p.add_argument("work", help="work directory written by `autotailor compile`")
    p.add_argument("--device", default="ort-cpu:threads=1", help=device_help())
    p.add_argument("--device-name", help="name of this machine in the LUT (default: the host name)")
    p.add_argument("--lut", help="latency table (SQLite; default WORK/latency.sqlite)")
    if granularity:
        p.add_argument("--granularity", default="fused", choices=("operator", "fused", "block"))


def _add_tuning_args(p: argparse.ArgumentParser) -> None:
    # Unset flags stay None so that the [tune] table of the config decides (see TuneConfig).
    p.add_argument("work", help="work directory written by `autotailor compile`")
    p.add_argument("--data", required=True, help="cifar10:PATH, imagefolder:PATH or digits")
    p.add_argument("--config", help="TOML file whose [train] / [tune] table sets what the flags do not")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int)
    p.add_argument("--optimizer", choices=("sgd", "adamw"))
    p.add_argument("--lr", type=float)
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    from autotailor.predict.latency import export_formats

    parser = argparse.ArgumentParser(prog="autotailor", description="Compile an image classifier into a "
                                     "weight-sharing SuperNet and deploy the best SubNet for every device and budget.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a model into a SuperNet in a work directory")
    p.add_argument("model", help="torchvision:NAME, timm:NAME, path/to/model.onnx or package.module:factory")
    p.add_argument("--config", help="TOML file with the modification space (default: built-in defaults)")
    p.add_argument("--out", required=True, help="work directory to write supernet.pt and the summaries to")
    p.add_argument("--input-size", type=int, default=None, help="largest input resolution (default 224)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("train", help="train the largest SubNet (a model without trained weights)")
    _add_tuning_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("tune", help="fine-tune the SuperNet so that every SubNet stays accurate")
    _add_tuning_args(p)
    p.add_argument("--subnets", type=int, help="SubNets per step: the largest, the smallest, random ones (4)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("evaluate", help="accuracy of one SubNet, with BatchNorm recalibrated for it")
    p.add_argument("work")
    p.add_argument("--data", required=True, help="cifar10:PATH, imagefolder:PATH or digits")
    p.add_argument("--arch", default="max", help="arch JSON file, or max / min")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--calibration-batches", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("profile", help="measure the unique kernels of the space on this device (resumable)")
    _add_latency_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("predict", help="predicted latency, MACs, parameters and memory of one SubNet")
    _add_latency_args(p)
    p.add_argument("--arch", default="max", help="arch JSON file, or max / min")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("sensitivity", help="measure each single modification's accuracy drop (resumable)")
    p.add_argument("work")
    p.add_argument("--data", required=True, help="cifar10:PATH, imagefolder:PATH or digits")
    p.add_argument("--config", help="TOML file whose [sensitivity] table sets what the flags do not")
    p.add_argument("--validation-images", type=int, help="a random sample of N validation images (2000)")
    p.add_argument("--calibration-batches", type=int, help="training batches to recalibrate BatchNorm on (10)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sensitivity)

    p = sub.add_parser("search", help="the most accurate SubNet for each budget, and the Pareto front")
    _add_latency_args(p, granularity=False)
    p.add_argument("--latency-ms", help="latency budgets, e.g. 2,4,8 (needs the device's LUT)")
    p.add_argument("--macs-m", help="budgets in millions of MACs")
    p.add_argument("--params-m", help="budgets in millions of parameters")
    p.add_argument("--memory-mb", help="budgets in MiB of parameters plus peak activations")
    p.add_argument("--config", help="TOML file whose [search] table sets what the flags do not")
    p.add_argument("--budgets", type=int, help="N budgets spanning the space along --axis (if no list is given)")
    p.add_argument("--axis", choices=("latency_ms", "macs", "params", "memory_bytes"))
    p.add_argument("--generations", type=int)
    p.add_argument("--population", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--verify", type=int, help="rounds of measuring the chosen SubNets on the device, refitting "
                   "the latency predictor to them and searching again (default 0)")
    p.add_argument("--finalists", type=int, help="measure the accuracy of each budget's N best-predicted SubNets "
                   "and choose the most accurate (default 0: choose by prediction)")
    p.add_argument("--data", help="data for --finalists (default: the sensitivity table's)")
    p.add_argument("--validation-images", type=int,
                   help="validation images for --finalists (default: the sensitivity table's)")
    p.add_argument("--validation-seed", type=int,
                   help="seed of that sample and of the calibration batches (default: the sensitivity table's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("export", help="write chosen SubNets as deployable files and measure them")
    p.add_argument("work")
    p.add_argument("--pick", help="all, a budget (8ms, 300mmacs, latency_ms=8) or its position (default all)")
    p.add_argument("--config", help="TOML file whose [export] (and [sensitivity]) table sets what the flags do not")
    p.add_argument("--format", help=f"{', '.join(export_formats())}, or several: onnx,ncnn (default onnx)")
    p.add_argument("--data", help="data to recalibrate BatchNorm and measure accuracy (default: sensitivity's)")
    p.add_argument("--device", help="where to measure latency (default: the search's device; none to skip)")
    p.add_argument("--device-name", help="name of this machine in the LUT (default: the host name)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("report", help="write WORK/report.md and report.png from the steps' results")
    p.add_argument("work")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("run", help="every step from one TOML file with a [run] table (resumable)")
    p.add_argument("config")
    p.add_argument("--work", help="work directory (default: the config's path without .toml)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="the whole pipeline on an embedded default, offline, in minutes")
    p.add_argument("--out", default="autotailor-demo")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except AutoTailorError as exc:
        print(f"autotailor: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
