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


def _write_work(sn, out: Path, summary: dict[str, Any]) -> None:
    """Write the work directory's files so that a failure leaves nothing half-written."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
    try:
        sn.save(staging / "supernet.pt")
        (staging / "space.json").write_text(json.dumps(sn.space.describe(), indent=1))
        (staging / "compile.json").write_text(json.dumps(summary, indent=1))
        (staging / "config.json").write_text(json.dumps(sn.config.to_dict(), indent=1))
        for f in staging.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _example(size: int | None, channels: int = 3) -> torch.Tensor | None:
    return torch.zeros(1, channels, size, size) if size else None


def cmd_compile(args: argparse.Namespace) -> int:
    import autotailor as at

    sn = at.compile(args.model, _example(args.input_size), config=args.config)
    summary = _summary(sn)
    _write_work(sn, Path(args.out), summary)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        _print_summary(summary)
        print(f"wrote {args.out}/supernet.pt")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Compile a model, extract three SubNets, export them to ONNX and check them in ONNX Runtime."""
    from rich.console import Console
    from rich.table import Table

    import autotailor as at
    from autotailor.deploy import export_onnx, run_onnx
    from autotailor.frontends import load_model
    from autotailor.testing import rel_err, well_conditioned

    console = Console()
    out = Path(args.out)
    started = time.perf_counter()
    console.print(f"[bold]AutoTailor demo[/]: compiling {args.model} (random weights, offline)")
    model = load_model(args.model)
    if isinstance(model, torch.nn.Module):
        model = well_conditioned(model)  # non-degenerate random weights, so the errors below mean something
    sn = at.compile(model, _example(args.input_size))
    sn.compile_info["source"] = args.model
    summary = _summary(sn)
    _write_work(sn, out, summary)
    _print_summary(summary)
    sn.eval()
    table = Table(title="SubNets exported to ONNX and run in ONNX Runtime")
    for col in ("SubNet", "resolution", "params (M)", "ORT vs SuperNet (max rel. error)"):
        table.add_column(col)
    archs = {"smallest": sn.space.min(), "random": sn.space.sample(args.seed), "largest": sn.space.max()}
    gen = torch.Generator().manual_seed(args.seed)
    for name, arch in archs.items():
        shape = sn.input_shape(arch)
        x = torch.randn(shape, generator=gen)
        sn.set_arch(arch)
        with torch.no_grad():
            ref = sn(x)
        net = sn.extract(arch).eval()
        path = export_onnx(net, out / f"subnet-{name}.onnx", shape)
        (out / f"subnet-{name}.arch.json").write_text(json.dumps(arch, indent=1))
        err = rel_err(ref, torch.from_numpy(run_onnx(path, x)))
        params = sum(p.numel() for p in net.parameters()) / 1e6
        table.add_row(name, str(shape[-1]), f"{params:.2f}", f"{err:.1e}")
        if err > 1e-4:
            raise AutoTailorError(f"the {name} SubNet's ONNX output differs from the SuperNet's by {err}")
    console.print(table)
    console.print(f"done in {time.perf_counter() - started:.1f} s; SuperNet, archs and ONNX files in {out}/")
    return 0


def _load_work(work: str):
    import autotailor as at

    path = Path(work) / "supernet.pt"
    if not path.is_file():
        raise AutoTailorError(f"{work} holds no supernet.pt; run `autotailor compile MODEL --out {work}` first")
    return at.load(path)


_TUNE_FLAGS = ("steps", "subnets", "optimizer", "lr", "weight_decay", "warmup_steps", "label_smoothing", "seed",
               "checkpoint_every")


def _tune_config(args: argparse.Namespace, sn, subnets: int | None):
    """[tune] of the work directory's config, then of --config, then the flags given."""
    from autotailor.compiler.config import load_config
    from autotailor.tune import TuneConfig

    tables = [sn.config.steps.get("tune", {})]
    if args.config:
        tables.append(load_config(args.config).steps.get("tune", {}))
    flags = {k: getattr(args, k) for k in _TUNE_FLAGS if getattr(args, k, None) is not None}
    if subnets is not None:
        flags["subnets"] = subnets
    return TuneConfig.from_settings(*tables, flags)


def _run_tuning(args: argparse.Namespace, subnets: int, name: str) -> int:
    """``train`` (the largest SubNet alone) and ``tune`` (sampled SubNets), with a progress bar."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from autotailor.data import BatchLoader, load_data
    from autotailor.tune import Tuner

    rank = _init_distributed()
    sn = _load_work(args.work)
    config = _tune_config(args, sn, subnets)
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
    """The work directory's SuperNet, the kernel plan for the device's backend, its LUT and target."""
    import socket

    from autotailor.predict.latency import KernelPlan, LutStore, Target, make_backend, parse_device

    sn = _load_work(args.work)
    name, settings = parse_device(args.device)
    backend = make_backend(name, **settings)
    plan = KernelPlan(sn, name, args.granularity)
    target = Target.of(args.device_name or socket.gethostname(), name, **backend.settings)
    store = LutStore(args.lut or Path(args.work) / "latency.sqlite")
    return sn, plan, backend, store, target


def cmd_profile(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from autotailor.predict.latency import profile

    _, plan, backend, store, target = _latency_setup(args)
    with store:
        before = store.count(target)
        print(f"{len(plan.kernels)} unique kernels ({args.granularity}, {len(plan.groups)} kernel groups) "
              f"enumerated in {plan.seconds:.2f} s; {before} already in {store.path} for {target}")
        columns = (TextColumn("profile"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, disable=args.quiet) as progress:
            task = progress.add_task("profile", total=None)
            report = profile(plan, backend, store, target,
                             lambda done, total: progress.update(task, completed=done, total=total))
        print(f"measured {report.measured} kernels in {report.seconds:.1f} s; the LUT holds "
              f"{store.count(target)} entries for {target}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from autotailor.predict.latency import CostModel, LatencyPredictor

    sn, plan, _, store, target = _latency_setup(args)
    arch = sn.space.complete(_read_arch(sn, args.arch))
    with store:
        try:
            latency = LatencyPredictor.from_store(plan, store, target).predict(arch)
        except AutoTailorError as exc:
            raise AutoTailorError(f"{exc}: autotailor profile {args.work} --device {args.device}") from exc
    costs = CostModel(plan).costs(arch)
    result = {"target": str(target), "latency_ms": round(latency, 4), "macs": costs.macs, "params": costs.params,
              "peak_activation_bytes": costs.peak_activation_bytes, "memory_bytes": costs.memory_bytes}
    print(json.dumps(result, indent=1) if args.json else
          f"{latency:.3f} ms on {target}; {costs.macs / 1e6:.1f} M MACs, {costs.params / 1e6:.2f} M params, "
          f"memory {costs.memory_bytes / 2**20:.1f} MiB (peak activations {costs.peak_activation_bytes / 2**20:.1f} MiB)")
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


def _add_latency_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("work", help="work directory written by `autotailor compile`")
    p.add_argument("--device", default="ort-cpu:threads=1",
                   help="BACKEND[:KEY=VALUE,...]: ort-cpu (threads, optimization, flush_mb) or torch (threads)")
    p.add_argument("--device-name", help="name of this machine in the LUT (default: the host name)")
    p.add_argument("--lut", help="latency table (SQLite; default WORK/latency.sqlite)")
    p.add_argument("--granularity", default="fused", choices=("operator", "fused", "block"))


def _add_tuning_args(p: argparse.ArgumentParser) -> None:
    # Unset flags stay None so that the [tune] table of the config decides (see TuneConfig).
    p.add_argument("work", help="work directory written by `autotailor compile`")
    p.add_argument("--data", required=True, help="cifar10:PATH, imagefolder:PATH or digits")
    p.add_argument("--config", help="TOML file whose [tune] table sets what the flags do not")
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
    parser = argparse.ArgumentParser(prog="autotailor", description=__doc__)
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

    p = sub.add_parser("demo", help="run the pipeline on an embedded default, offline")
    p.add_argument("--model", default="torchvision:mobilenet_v3_large")
    p.add_argument("--out", default="autotailor-demo")
    p.add_argument("--input-size", type=int, default=224)
    p.add_argument("--seed", type=int, default=0)
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
