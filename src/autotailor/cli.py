"""The ``autotailor`` command line: flags parsed into the steps' settings (``pipeline.steps``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from autotailor.errors import AutoTailorError, WorkdirError


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


def cmd_compile(args: argparse.Namespace) -> int:
    from autotailor.pipeline.steps import compile_step

    summary = compile_step(args.model, args.out, args.config, args.input_size, force=args.force)
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


def _settings(cls, section: str, args: argparse.Namespace, values: dict[str, object]):
    from autotailor.pipeline.steps import step_settings

    return step_settings(cls, section, args.work, getattr(args, "config", None), values)


_TUNE_FLAGS = ("steps", "subnets", "optimizer", "lr", "weight_decay", "warmup_steps", "label_smoothing", "seed",
               "checkpoint_every", "teacher", "distill_loss")


def _run_tuning(args: argparse.Namespace, subnets: int | None, name: str) -> int:
    from autotailor.pipeline.steps import tune_step
    from autotailor.tune import TuneConfig

    flags = {k: getattr(args, k, None) for k in _TUNE_FLAGS}
    if subnets is not None:  # train: the largest SubNet alone
        flags["subnets"] = subnets
    tune_step(args.work, args.data, _settings(TuneConfig, name, args, flags), name, args.batch_size, args.quiet)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    return _run_tuning(args, 1, "train")


def cmd_tune(args: argparse.Namespace) -> int:
    return _run_tuning(args, None, "tune")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from autotailor.data import BatchLoader, load_data
    from autotailor.pipeline.workdir import check_classes
    from autotailor.tune import evaluate

    sn = _load_work(args.work)
    arch = sn.space.complete(_read_arch(sn, args.arch))
    train, val = load_data(args.data, seed=args.seed)
    check_classes(sn, train, args.data)
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
    from autotailor.pipeline.steps import profile_step

    profile_step(args.work, args.device, args.device_name, args.lut, args.granularity, args.quiet)
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


def _eval_settings(args: argparse.Namespace, values: dict[str, object] | None = None):
    from autotailor.pipeline.workdir import EvalSettings

    return _settings(EvalSettings, "sensitivity", args, values or {})


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from autotailor.pipeline.steps import sensitivity_step

    settings = _eval_settings(args, {"validation_images": args.validation_images,
                                     "calibration_batches": args.calibration_batches,
                                     "batch_size": args.batch_size, "seed": args.seed})
    sensitivity_step(args.work, args.data, settings, args.quiet)
    return 0


def _floats(text: str | None, scale: float = 1.0) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        return tuple(float(v) * scale for v in text.split(",") if v.strip())
    except ValueError:
        raise AutoTailorError(f"{text!r} is not a comma-separated list of numbers (e.g. 2,4,8)") from None


def cmd_search(args: argparse.Namespace) -> int:
    from autotailor.pipeline.selection import SearchSettings
    from autotailor.pipeline.steps import describe_search, search_step

    settings = _settings(SearchSettings, "search", args, {
        "latency_ms": _floats(args.latency_ms), "macs": _floats(args.macs_m, 1e6),
        "params": _floats(args.params_m, 1e6), "memory_bytes": _floats(args.memory_mb, 2.0**20),
        "budgets": args.budgets, "axis": args.axis, "generations": args.generations,
        "population": args.population, "seed": args.seed, "verify": args.verify, "finalists": args.finalists})
    found = search_step(args.work, settings, args.device, args.device_name, args.lut, args.data, _eval_settings(args),
                        {"validation_images": args.validation_images, "seed": args.validation_seed}, args.json)
    lines = describe_search(found, args.work)
    if args.json:  # stdout holds the JSON alone (for jq and scripts); the summary line goes to stderr
        print(lines[0], file=sys.stderr)
        print(json.dumps({"schema": found.SCHEMA, **found.to_dict()}, indent=1))
    else:
        print("\n".join(lines))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autotailor.pipeline.deployment import ExportSettings
    from autotailor.pipeline.steps import export_step

    settings = _settings(ExportSettings, "export", args, {
        "formats": tuple(args.format.split(",")) if args.format else None, "pick": args.pick,
        "finetune_steps": args.finetune_steps, "finetune_lr": args.finetune_lr})
    export_step(args.work, settings, args.data, _eval_settings(args), args.device, args.device_name)
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    from autotailor.pipeline.steps import bundle_step

    bundle_step(args.work, args.out, args.device)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from autotailor.runtime.serving import serve

    # SIGTERM (systemd, kill) stops the server as Ctrl-C does; serve() closes it cleanly either way.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    serve(args.bundle, args.slo_ms, host=args.host, port=args.port, memory_mb=args.memory_mb, policy=args.policy,
          max_body_mb=args.max_body_mb, on_ready=lambda url: print(url, flush=True))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from autotailor.runtime.replay import replay

    summary = replay(args.bundle, args.trace, args.slo_ms, out_path=args.out, load=args.load, policy=args.policy,
                     seed=args.seed, memory_mb=args.memory_mb)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    r = summary["response_ms"]
    print(f"{summary['inferences']} requests: {summary['slo_met']:.1%} of inferences within {summary['slo_ms']:g} ms "
          f"({summary['response_slo_met']:.1%} counting the wait); response p50 {r['p50']:.2f} ms, "
          f"p99 {r['p99']:.2f} ms; {summary['switches']} switches; per SubNet {summary['per_subnet']}")
    if args.out:
        print(f"wrote {args.out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotailor.pipeline.report import write_report

    if not (Path(args.work) / "compile.json").is_file():
        raise WorkdirError(f"{args.work} is not a work directory (no compile.json); run `autotailor compile MODEL "
                           f"--out {args.work}` or `autotailor run FILE` first")
    print(f"report: {write_report(args.work)}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from autotailor.pipeline.run import plan_run

    plan = plan_run(args.config, args.work)
    return _execute(plan)


def _execute(plan) -> int:
    from autotailor.pipeline.run import execute

    started = time.perf_counter()
    record = execute(plan, lambda name, state: print(f"== {name}: {state}", flush=True))
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
    try:
        arch = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AutoTailorError(f"--arch {spec}: not valid JSON ({exc}); an arch is an object such as "
                              '{"resolution": 192, "stage3.reduce_depth": -1}') from exc
    if not isinstance(arch, dict):
        raise AutoTailorError(f"--arch {spec}: an arch is a JSON object of variable: choice, not {type(arch).__name__}")
    return arch


def _number(kind: type, low: float, high: float = float("inf"), above: bool = False):
    """An argparse type: a ``kind`` in [low, high] (above ``low`` if ``above``); argparse names
    the flag and exits 2 with the message otherwise."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not (value > low if above else value >= low) or not value <= high:
            bound = f"above {low:g}" if above else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: expected {bound}"
                                             + (f" and at most {high:g}" if high != float("inf") else ""))
        return value
    return parse


_POSITIVE_INT = _number(int, 1)


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
    p.add_argument("--batch-size", type=_POSITIVE_INT, default=64)
    p.add_argument("--steps", type=_POSITIVE_INT)
    p.add_argument("--optimizer", choices=("sgd", "adamw"))
    p.add_argument("--lr", type=_number(float, 0, above=True))
    p.add_argument("--weight-decay", type=_number(float, 0))
    p.add_argument("--warmup-steps", type=_number(int, 0))
    p.add_argument("--label-smoothing", type=_number(float, 0, 0.999))
    p.add_argument("--seed", type=int)
    p.add_argument("--checkpoint-every", type=_POSITIVE_INT)
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
    p.add_argument("--input-size", type=_number(int, 8, 4096), default=None,
                   help="largest input resolution, 8 to 4096 (default 224)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--force", action="store_true",
                   help="replace the work directory's SuperNet and delete what was made from the old one")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("train", help="train the largest SubNet (a model without trained weights)")
    _add_tuning_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("tune", help="fine-tune the SuperNet so that every SubNet stays accurate")
    _add_tuning_args(p)
    p.add_argument("--subnets", type=int, help="SubNets per step: the largest, the smallest, random ones (4)")
    p.add_argument("--teacher", choices=("largest", "original"),
                   help="who teaches the SubNets: the step's largest SubNet (largest) or the model as tuning found it "
                        "(original)")
    p.add_argument("--distill-loss", choices=("kl", "alpha"),
                   help="how a SubNet is compared with its teacher: cross-entropy to its probabilities (kl) or "
                        "AlphaNet's adaptive alpha-divergence (alpha)")
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
    p.add_argument("--finetune-steps", type=int,
                   help="fine-tune each chosen SubNet alone for this many batches of --data first (default 0: not)")
    p.add_argument("--finetune-lr", type=float, help="its peak learning rate (default 0.01)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("bundle", help="the exported SubNets as a bundle for the on-device runtime (docs/runtime.md)")
    p.add_argument("work")
    p.add_argument("--out", required=True, help="the bundle's folder (a manifest.json and the SubNets' files)")
    p.add_argument("--device", help="the device the bundle is for (default: the search's; must match it)")
    p.set_defaults(func=cmd_bundle)

    p = sub.add_parser("report", help="write WORK/report.md and report.png from the steps' results")
    p.add_argument("work")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("run", help="every step from one TOML file with a [run] table (resumable)")
    p.add_argument("config")
    p.add_argument("--work", help="work directory (default: the config's path without .toml)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("serve", help="on a device: serve a bundle over HTTP, switching SubNets as conditions "
                       "change (docs/runtime.md)")
    p.add_argument("bundle", help="bundle directory (manifest.json and the SubNets' files)")
    p.add_argument("--slo-ms", type=_number(float, 0, above=True), required=True,
                   help="latency goal of one inference, in ms")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: loopback only; "
                   "anyone who can reach the port can run inferences)")
    p.add_argument("--port", type=_number(int, 0, 65535), default=8080, help="port (default 8080; 0: any free port)")
    p.add_argument("--memory-mb", type=_number(float, 0, above=True),
                   help="memory the loaded SubNets may take (default: no limit)")
    p.add_argument("--policy", default="forecast", help="static, reactive, forecast or a registered plug-in")
    p.add_argument("--max-body-mb", type=_number(float, 0, above=True), default=32.0,
                   help="largest request body accepted, in MB (default 32); larger ones get HTTP 413")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("replay", help="replay a request arrival trace against a bundle, optionally under a "
                       "CPU load schedule; one JSON line per request")
    p.add_argument("bundle", help="bundle directory (manifest.json and the SubNets' files)")
    p.add_argument("--trace", required=True, help="arrival trace (JSON written by ArrivalTrace.write)")
    p.add_argument("--slo-ms", type=_number(float, 0, above=True), required=True,
                   help="latency goal of one inference, in ms")
    p.add_argument("--load", help="CPU load schedule run during the replay (JSON or CSV t_seconds,duty; "
                   "docs/runtime.md)")
    p.add_argument("--out", help="write one JSON line per request here (JSONL)")
    p.add_argument("--memory-mb", type=_number(float, 0, above=True),
                   help="memory the loaded SubNets may take (default: no limit)")
    p.add_argument("--policy", default="forecast", help="static, reactive, forecast or a registered plug-in")
    p.add_argument("--seed", type=int, default=0, help="seed of the input every request sends")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_replay)

    from autotailor.agent.__main__ import add_arguments as add_agent_arguments, run as run_agent

    p = sub.add_parser("agent", help="on a device: serve measurements of model files to a host (docs/agent.md)")
    add_agent_arguments(p)
    p.set_defaults(func=run_agent)

    p = sub.add_parser("demo", help="the whole pipeline on an embedded default, offline, in minutes")
    p.add_argument("--out", default="autotailor-demo")
    p.set_defaults(func=cmd_demo)
    return parser


# commands that write into a work directory: one at a time per directory (``run`` locks in ``execute``)
_WRITERS = ("compile", "train", "tune", "profile", "sensitivity", "search", "export", "report")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        work = getattr(args, "out", None) if args.command == "compile" else getattr(args, "work", None)
        if args.command in _WRITERS and work:
            from autotailor.pipeline.workdir import locked

            with locked(work, "autotailor " + " ".join(sys.argv[1:] if argv is None else argv)):
                return args.func(args)
        return args.func(args)
    except AutoTailorError as exc:
        print(f"autotailor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotailor: interrupted; run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
