"""The steps of the pipeline as functions of a work directory and typed settings.

The command line parses its flags into these settings and calls one step; ``autotailor run``
calls them in order from one TOML file. Each step shows progress (rich, unless ``quiet``),
says what it did through ``say`` and returns what it made.

``step_settings`` merges a step's settings: its table in ``WORK/config.json`` (written at
compile), then in a TOML file given later (``--config``, the run file), then explicit values.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from autotailor.errors import AutoTailorError, WorkdirError
from autotailor.pipeline.results import ORIGINAL_WEIGHTS, SHARED_WEIGHTS
from autotailor.pipeline.workdir import (CONFIG, ORIGINAL, SENSITIVITY, SPECIALIZED, EvalSettings, check_classes,
                                         eval_data, is_original_model, load_original, load_supernet,
                                         weights_digest)

if TYPE_CHECKING:
    from autotailor.pipeline.deployment import FineTuned

T = TypeVar("T")
Say = Callable[[str], None]


def step_settings(cls: type[T], section: str, work: str | Path, config: str | Path | None = None,
                  values: dict[str, object] | None = None) -> T:
    """Settings ``cls`` of ``[section]``: ``WORK/config.json``'s table, then ``config``'s, then
    ``values`` (those not None)."""
    from autotailor.compiler.config import load_config
    from autotailor.errors import ConfigError
    from autotailor.settings import merge_settings

    path = Path(work) / CONFIG
    tables = [{}]
    if path.is_file():
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                raise ValueError(f"it holds a {type(data).__name__}, not a table")
            tables[0] = load_config(data).steps.get(section, {})
        except (ValueError, ConfigError) as exc:
            raise WorkdirError(f"{path} is not the configuration compile wrote ({exc}); restore it, or compile the "
                               "model again with --force") from exc
    if config:
        tables.append(load_config(config).steps.get(section, {}))
    return merge_settings(cls, section, *tables, {k: v for k, v in (values or {}).items() if v is not None})


def check_step_tables(settings: Callable[..., Any]) -> None:
    """Every step's table checked as the step will read it: ``settings(cls, section, **values)``
    gives a step's settings (``step_settings``, or a config's own tables), each an error naming
    the key and what is allowed; export formats against the registered backends."""
    from autotailor.pipeline.deployment import ExportSettings, check_formats
    from autotailor.pipeline.selection import SearchSettings
    from autotailor.tune import TuneConfig

    for cls, section, values in ((TuneConfig, "train", {"subnets": 1}), (TuneConfig, "tune", {}),
                                 (EvalSettings, "sensitivity", {}), (SearchSettings, "search", {})):
        settings(cls, section, **values)
    check_formats(settings(ExportSettings, "export").formats)


def _progress(label: str, quiet: bool, *extra):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"), *extra,
                    TimeElapsedColumn(), TimeRemainingColumn(), disable=quiet)


# -- compile -----------------------------------------------------------------------------------------
def summary_of(sn) -> dict[str, Any]:
    """What ``compile`` found: blocks, stages, variables, modifications, space size."""
    info = sn.compile_info
    mods: Counter = Counter()
    for v in sn.space.variables:
        mods[v.kind] += len(v.choices) - 1
    return {
        "source": info.get("source"),
        "compile_seconds": round(info.get("seconds", 0.0), 3),
        "input_shape": list(sn.example_shape),
        "blocks": info.get("blocks", []),
        "stages": info.get("stages", []),
        "channel_groups": info.get("groups", {}),
        "variables": dict(Counter(v.kind for v in sn.space.variables)),
        "modifications": dict(mods),
        "num_modifications": sn.space.num_modifications,
        "space_size": str(sn.space.size),
        "log10_space_size": round(sn.space.log10_size, 3),
    }


def compile_step(model: str, out: str | Path, config: str | Path | None = None,
                 input_size: int | None = None, force: bool = False) -> dict[str, Any]:
    """Compile ``model`` into ``out`` (a work directory); returns the summary. The files are
    staged and moved in together, so a failure leaves nothing half-written. A directory that
    holds a SuperNet is refused, or with ``force`` cleared of everything made from it first
    (``MADE_FILES``), once the new SuperNet is compiled."""
    import autotailor as at
    from autotailor.pipeline.workdir import MADE_FILES
    from autotailor.settings import merge_settings

    out = Path(out)
    used = [name for name in MADE_FILES if (out / name).exists()]
    if "supernet.pt" in used and not force:
        raise WorkdirError(f"{out} already holds a SuperNet and what was made from it ({', '.join(used)}); compile "
                           "into a new directory, or pass --force to replace it (those files are deleted)")
    cfg = at.load_config(config)
    check_step_tables(lambda cls, section, **values: merge_settings(cls, section, cfg.steps.get(section, {}), values))
    sn = at.compile(model, torch.zeros(1, 3, input_size, input_size) if input_size else None, config=cfg)
    summary = summary_of(sn)
    out.mkdir(parents=True, exist_ok=True)
    for name in used if force else ():
        target = out / name
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
    try:
        sn.save(staging / "supernet.pt")
        (staging / "space.json").write_text(json.dumps(sn.space.describe(), indent=1))
        (staging / "compile.json").write_text(json.dumps(summary, indent=1))
        (staging / CONFIG).write_text(json.dumps(cfg.to_dict(), indent=1))
        for f in staging.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


# -- train / tune ------------------------------------------------------------------------------------
def _init_distributed() -> int:
    """Join the process group that ``torchrun`` describes in the environment; this process's rank."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


def tune_step(work: str | Path, data: str, config, name: str = "tune", batch_size: int = 64,
              quiet: bool = False, say: Say = print):
    """``train`` (the largest SubNet alone: ``config.subnets`` 1) or ``tune`` (sampled SubNets)
    ``WORK/supernet.pt`` on ``data``, resuming from ``WORK/NAME.ckpt``; one line per step in
    ``WORK/NAME.log.jsonl``. Returns the ``Tuner``."""
    from rich.progress import TextColumn

    from autotailor.data import BatchLoader, load_data
    from autotailor.tune import Tuner

    rank = _init_distributed()
    sn = load_supernet(work)
    train, _ = load_data(data, seed=config.seed)
    check_classes(sn, train, data)
    loader = BatchLoader(train, batch_size, train=True, resolution=sn.example_shape[-1], seed=config.seed)
    tuner = Tuner(sn, loader, config, Path(work) / f"{name}.ckpt")
    original = Path(work) / ORIGINAL
    if tuner.resume():
        say(f"resuming {name} at step {tuner.step}")
    elif name == "tune" and rank == 0 and not original.exists():
        sn.save(original)  # the user's model: the top budgets may deploy its weights (``Finalists.original_accuracy``)
    started, images = time.perf_counter(), 0
    log_path = Path(work) / f"{name}.log.jsonl"  # one line per step: the loss curve and throughput
    last = [time.perf_counter(), time.process_time()]
    with _progress(name, quiet or rank != 0, TextColumn("loss {task.fields[loss]:.3f}"),
                   TextColumn("{task.fields[ips]:.0f} img/s")) as progress:
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
        sn.save(Path(work) / "supernet.pt")
        if name == "train":
            original.unlink(missing_ok=True)  # kept from before these weights: a later tune keeps them instead
        say(f"{name}: {tuner.step} steps on {tuner.world} process(es) in {tuner.cpu.describe(tuner.step)} "
            f"(this process, over all runs); weights in {work}/supernet.pt")
    return tuner


# -- profile -----------------------------------------------------------------------------------------
def profile_step(work: str | Path, device: str, device_name: str | None = None, lut: str | Path | None = None,
                 granularity: str = "fused", quiet: bool = False, say: Say = print):
    """Measure the kernels of the space that the device's LUT lacks (with flushed and warm caches
    where the backend flushes), then calibrate the device's cache model on whole SubNets.
    Returns the ``DeviceSetup``."""
    from autotailor.pipeline.workdir import device_setup
    from autotailor.predict.latency import profile

    setup = device_setup(load_supernet(work), work, device, device_name, lut, granularity)
    plan = setup.plan
    passes = [(setup.backend, setup.target, "caches flushed" if setup.hot_target else "")]
    if setup.hot_target is not None:
        passes.append((setup.hot_backend, setup.hot_target, "caches warm"))
    with setup.open_store() as store:
        say(f"{len(plan.kernels)} unique kernels ({granularity}, {len(plan.groups)} kernel groups) "
            f"enumerated in {plan.seconds:.2f} s")
        for backend, target, label in passes:
            say(f"{store.count(target)} already in {store.path} for {target}")
            with _progress(f"profile {label}", quiet) as progress:
                task = progress.add_task("profile", total=None)
                report = profile(plan, backend, store, target,
                                 lambda done, total, t=task: progress.update(t, completed=done, total=total))
            speed = store.speed(target)
            say(f"measured {report.measured} kernels in {report.seconds:.1f} s; the LUT holds "
                f"{store.count(target)} entries for {target}" + (f"; {speed.describe()}" if speed else ""))
    if not setup.cache_fixed:
        with _progress("calibration (whole SubNets)", quiet) as progress:
            task = progress.add_task("calibrate", total=None)
            setup.calibrate(lambda done, total: progress.update(task, completed=done, total=total))
        say(f"fitted to measured SubNets: {setup.predictor().describe()}"
            + (" (cache_mb in --device fixes the budget instead)" if setup.hot_target is not None else ""))
    return setup


# -- sensitivity -------------------------------------------------------------------------------------
def sensitivity_step(work: str | Path, data: str, settings: EvalSettings, quiet: bool = False, say: Say = print):
    """Measure every single modification's accuracy drop (resumable); returns the table."""
    from autotailor.predict.accuracy import measure_sensitivity

    sn = load_supernet(work)
    evaluation = eval_data(data, sn.example_shape[-1], settings, sn)
    say(f"{sn.space.num_modifications} single modifications to measure on {evaluation.images} validation images "
        f"({len(evaluation.calibration)} calibration batches each)")
    with _progress("sensitivity", quiet) as progress:
        task = progress.add_task("sensitivity", total=None)
        table = measure_sensitivity(sn, evaluation.val, evaluation.calibration, Path(work) / SENSITIVITY,
                                    info={**evaluation.describe(), "seed": settings.seed,
                                          "weights": weights_digest(work)},
                                    on_progress=lambda done, total: progress.update(task, completed=done, total=total))
    worst = sorted(table.deltas.items(), key=lambda kv: -kv[1])[:3]
    say(f"largest SubNet {100 * table.base_accuracy:.2f} %; {len(table.deltas)} sensitivities in "
        f"{table.seconds:.1f} s; most sensitive: " + ", ".join(f"{k} ({100 * v:.2f} pts)" for k, v in worst))
    return table


def validation_data(sn, work: str | Path, data: str | None, settings: EvalSettings,
                    overrides: dict[str, object] | None = None):
    """The data SubNets are evaluated on after the sensitivity step (``EvalData``, or None when no
    data is known): ``data``, else the sensitivity table's; the table's validation subset and
    calibration (else ``settings``), then ``overrides``."""
    from autotailor.settings import merge_settings

    from autotailor.predict.accuracy import SensitivityTable

    path = Path(work) / SENSITIVITY
    info = SensitivityTable.load(path).info if path.is_file() else {}
    spec = data or info.get("data")
    if not spec:
        return None
    measured = {k: info[k] for k in ("validation_images", "calibration_batches", "seed") if k in info}
    merged = merge_settings(EvalSettings, "sensitivity", vars(settings) | measured,
                            {k: v for k, v in (overrides or {}).items() if v is not None})
    return eval_data(spec, sn.example_shape[-1], merged, sn)


# -- search ------------------------------------------------------------------------------------------
def search_step(work: str | Path, settings, device: str | None = "ort-cpu:threads=1", device_name: str | None = None,
                lut: str | Path | None = None, data: str | None = None,
                evaluation: EvalSettings = EvalSettings(), data_overrides: dict[str, object] | None = None,
                quiet: bool = False, out: str | Path | None = None):
    """Search every budget of ``settings`` (``SearchSettings``) and write ``OUT/search.json``
    (``out``: ``work``, or a fleet device's folder); returns the ``SearchRecord``. ``device``
    None or ``"none"``: no latency."""
    from autotailor.pipeline.finalists import Finalists
    from autotailor.pipeline.results import SearchRecord
    from autotailor.pipeline.selection import objectives_for, run_search
    from autotailor.pipeline.workdir import device_setup
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    sn = load_supernet(work)
    constrains_latency = bool(settings.latency_ms) or (not settings.limits() and settings.axis == "latency_ms")
    setup = None
    if device and device != "none":
        setup = device_setup(sn, work, device, device_name, lut)
        if not constrains_latency:
            try:  # latency is reported when the LUT is there, not required
                setup.predictor()
            except AutoTailorError:
                setup = None
    elif constrains_latency:
        raise AutoTailorError("latency budgets need a device: --device ort-cpu:threads=1 (profiled first)")
    if settings.verify and setup is None:
        raise AutoTailorError("verify measures the chosen SubNets on a device: give --device (profiled first)")
    finalists = None
    if settings.finalists:
        measured_on = validation_data(sn, work, data, evaluation, data_overrides)
        if measured_on is None:
            raise AutoTailorError(f"finalists = {settings.finalists} measures SubNets' accuracy: give --data SPEC "
                                  "(by default the data of `autotailor sensitivity`)")
        finalists = Finalists.open(sn, work, measured_on, settings.finalists)
    objectives = objectives_for(sn, work, setup, finalists)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, disable=not (settings.verify or finalists) or quiet) as progress:
        timed = progress.add_task("verify (chosen SubNets timed)", total=None, visible=bool(settings.verify))
        tested = progress.add_task("finalists (accuracy measured)", total=None, visible=finalists is not None)
        run_search(sn, work, setup, settings, objectives,
                   on_subnet=lambda done, total: progress.update(timed, completed=done, total=total),
                   finalists=finalists,
                   on_finalist=lambda done, total: progress.update(tested, completed=done, total=total), out=out)
    return SearchRecord.read(out or work)


def describe_search(found, work: str | Path) -> list[str]:
    """The lines the command line prints for a search."""
    lines = [f"{len(found.choices)} budgets searched in {found.seconds:.1f} s ({found.predictions} predictions"
             + (f", {found.verify_rounds} verify rounds" if found.verified else "")
             + f"); {len(found.met)} met; choices in {work}/{found.FILE}"]
    if found.accuracy_model:
        lines.append(f"  predicted accuracy: {found.accuracy_model}")
    for c in found.choices:
        if c.arch is None:
            lines.append(f"  {c.budget}: no SubNet meets it")
            continue
        shown = ", ".join(f"{m} {v:.4g}" for m, v in c.metrics.items() if m in ("latency_ms", "macs", "params"))
        if c.measured_latency_ms is not None:
            shown += f" (measured {c.measured_latency_ms:.4g} ms)"
        if c.weights == ORIGINAL_WEIGHTS:
            lines.append(f"  {c.budget}: the original model's weights, measured accuracy {100 * c.measured_accuracy:.2f}"
                         f" % (more than the SuperNet's within the budget), {shown}")
            continue
        lines.append(f"  {c.budget}: predicted accuracy {100 * c.accuracy:.2f} %"
                     + (f" (measured {100 * c.measured_accuracy:.2f} %)" if c.measured_accuracy is not None else "")
                     + f", {shown}")
    return lines


# -- export ------------------------------------------------------------------------------------------
def export_step(work: str | Path, settings, data: str | None = None, evaluation: EvalSettings = EvalSettings(),
                device: str | None = None, device_name: str | None = None, say: Say = print,
                out: str | Path | None = None, quiet: bool = False):
    """Export the chosen SubNets ``settings.pick`` (``ExportSettings``) of ``OUT/search.json`` in
    ``settings.formats``, measured on ``device`` (default: the search's; ``"none"``: not timed)
    and on the validation data; writes ``OUT/exports.json`` (``out``: ``work``, or a fleet
    device's folder) and returns the ``Exported`` list."""
    from autotailor.pipeline.deployment import check_formats, export_choices
    from autotailor.pipeline.results import SearchRecord
    from autotailor.pipeline.workdir import device_setup

    sn = load_supernet(work)
    check_formats(settings.formats)
    out = Path(out or work)
    found = SearchRecord.read(out)
    chosen = found.pick(settings.pick)
    measured_on = validation_data(sn, work, data, evaluation)
    spec = device or found.device
    setup = device_setup(sn, work, spec, device_name) if spec and spec != "none" else None

    def done(e) -> None:
        lat, acc = e.measured["latency_ms"], e.measured["accuracy"]
        say(f"  {e.name}: {len(e.files)} file(s) in {Path(e.files[0]).parent}"
            + (f"; measured {lat:.3f} ms (predicted {e.predicted.get('latency_ms', float('nan')):.3f})"
               if lat is not None else "")
            + (f"; accuracy {100 * acc:.2f} % (predicted {100 * e.predicted['accuracy']:.2f})"
               if acc is not None else "")
            + (f"; fine-tuned alone {100 * e.measured['accuracy_finetuned']:.2f} %, not fine-tuned "
               f"{100 * e.measured['accuracy_unfinetuned']:.2f} %: exported the "
               + (f"fine-tuned one (from the {_WEIGHTS_SAID[e.finetuned_from]})" if e.finetuned_from
                  else "one not fine-tuned")
               if "accuracy_finetuned" in e.measured else ""))

    original = load_original(work)
    finetuned = None
    if settings.finetune_steps:
        if measured_on is None:
            raise AutoTailorError(f"export.finetune_steps = {settings.finetune_steps} trains each chosen SubNet: "
                                  "give the training data with --data")
        finetuned = FineTuner(sn, original, Path(work) / SPECIALIZED, measured_on, settings.finetune_steps,
                              settings.finetune_lr, quiet, say)
    say(f"exporting {len(chosen)} SubNet(s) as {', '.join(settings.formats)}"
        + (f", measured on {setup.spec}" if setup else ""))
    return export_choices(sn, out, chosen, settings.formats, measured_on, setup, done, finetuned, original)


_WEIGHTS_SAID = {SHARED_WEIGHTS: "shared weights", ORIGINAL_WEIGHTS: "original model's weights"}
PROBE_SHARE = 8  # a probe is a fine-tuning of 1/8 of the steps, its learning rate decayed over them


def probe_steps(steps: int) -> int:
    """The steps of each probe before a fine-tuning of ``steps`` (``FineTuner``)."""
    return max(1, steps // PROBE_SHARE)


class FineTuner:
    """Chosen SubNets fine-tuned alone (``export.finetune_steps``; ``tune.specialize``) on the
    training split of ``data`` (an ``EvalData``), kept in ``folder``: from the shared weights,
    whose largest SubNet teaches, or from the user's model's (``original``), which teaches.
    Which start ends more accurate is not plain beforehand, and a snapshot part-way through, at
    a high learning rate, is too noisy to tell (docs/tune.md); so each start is first fine-tuned
    in full for an eighth of the steps (the probe), and the one then more accurate on the
    validation subset is fine-tuned for all of them (the shared weights on a tie)."""

    def __init__(self, sn, original, folder: str | Path, data, steps: int, lr: float, quiet: bool = True,
                 say: Say = print):
        from autotailor.data import BatchLoader, load_data
        from autotailor.tune import specialize_config

        self.sn, self.original, self.folder, self.data, self.quiet, self.say = sn, original, Path(folder), data, quiet, say
        self.config = specialize_config(steps, lr)
        self.probe_config = specialize_config(probe_steps(steps), lr)
        self.loader = BatchLoader(load_data(data.spec, seed=self.config.seed)[0], 64, train=True,
                                  resolution=sn.example_shape[-1], seed=self.config.seed)

    def starts(self, arch) -> dict[str, Any]:
        """The SuperNets ``arch`` may start from: the shared weights, and the user's model's
        unless ``arch`` is that model itself."""
        if self.original is None or is_original_model(self.original, arch):
            return {SHARED_WEIGHTS: self.sn}
        return {SHARED_WEIGHTS: self.sn, ORIGINAL_WEIGHTS: self.original}

    def path(self, start: str, arch, probe: bool = False) -> Path:
        """Where ``arch`` fine-tuned from ``start`` (or its probe) is kept (``.ckpt`` while in progress)."""
        from autotailor.tune.specialize import specialized_path

        return specialized_path(self.starts(arch)[start], arch, self.probe_config if probe else self.config, self.folder)

    def train(self, start: str, arch, probe: bool = False):
        """``arch`` fine-tuned from ``start`` (for the probe's steps, with ``probe``), or its kept weights."""
        from autotailor.tune import specialize

        config = self.probe_config if probe else self.config
        if not self.path(start, arch, probe).is_file():
            self.say(f"  fine-tuning a SubNet alone from the {_WEIGHTS_SAID[start]} for {config.steps} steps"
                     + (", a probe" if probe else "") + f" (kept in {self.folder})")
        with _progress("fine-tune", self.quiet) as progress:
            task = progress.add_task("fine-tune", total=config.steps)
            return specialize(self.starts(arch)[start], arch, self.loader, config, self.folder,
                              lambda r: progress.update(task, completed=r.step + 1))

    def probe(self, arch) -> dict[str, float]:
        """Each start's probe's accuracy on the validation subset; empty when there is one start."""
        from autotailor.tune.evaluate import accuracy

        starts = self.starts(arch)
        size = self.sn.input_shape(arch)[-1]
        return {name: accuracy(self.train(name, arch, probe=True), self.data.val, size)
                for name in (starts if len(starts) > 1 else ())}

    @staticmethod
    def preferred(probe: dict[str, float]) -> str:
        """The start the probe prefers: the more accurate, the shared weights (the first) on a tie."""
        return max(probe, key=probe.__getitem__, default=SHARED_WEIGHTS)

    def __call__(self, arch) -> FineTuned:
        from autotailor.pipeline.deployment import FineTuned

        probe = self.probe(arch)
        start = self.preferred(probe)
        return FineTuned(self.train(start, arch), start, probe)


# -- bundle ------------------------------------------------------------------------------------------
def bundle_step(work: str | Path, out: str | Path, device: str | None = None, say: Say = print):
    """Write the exported SubNets (``WORK/exports.json``, ONNX files) as a bundle for the on-device
    runtime (``autotailor.runtime``) in ``out``: each SubNet's file and what was measured and
    predicted of it on the search's device. ``device``, if given, must be that device; in a
    fleet's work directory, the device whose results to bundle (``WORK/devices/DEVICE``)."""
    from autotailor.pipeline.results import ExportsRecord, SearchRecord
    from autotailor.pipeline.workdir import device_folder, fleet_folders
    from autotailor.runtime import Bundle, SubNetEntry

    results, fleet = Path(work), fleet_folders(work)
    if fleet:
        if device is None or device_folder(work, device) not in fleet:
            searched = [str(SearchRecord.read(f).device) for f in fleet]
            raise WorkdirError(f"{work} holds a fleet's results; name the device to bundle: --device "
                               f"{' or --device '.join(searched)}")
        results = device_folder(work, device)
    found, exported = SearchRecord.read(results), ExportsRecord.read(results).exports
    if device is not None and found.device is not None and device != found.device:
        raise WorkdirError(f"{work} was searched and exported for {found.device!r}, not {device!r}; search and "
                           f"export for {device} first (autotailor search/export {work} --device {device})")
    device = device or found.device
    if device is None:
        raise WorkdirError(f"the search of {work} used no device; name the device the exports were measured on "
                           f"and the bundle is for: autotailor bundle {work} --out DIR --device SPEC")
    sn = load_supernet(work)
    entries = []
    for e in exported:
        onnx = next((f for f in e.files if f.endswith(".onnx")), None)
        if onnx is None:
            raise WorkdirError(f"{e.name} was exported without ONNX ({', '.join(e.files)}); the runtime serves ONNX "
                               f"files: autotailor export {work} --format onnx")
        params, memory = e.predicted.get("params"), e.predicted.get("memory_bytes")
        predicted = e.predicted.get("accuracy")  # a sum of drops can pass below 0 for a barely trained model
        predicted = min(1.0, max(0.0, predicted)) if predicted is not None else None
        activations = (memory - 4 * params) / 2**20 if params is not None and memory is not None else None
        entries.append(SubNetEntry(
            name=e.name, file=str(Path(onnx).resolve()), format="onnx", input_shape=tuple(sn.input_shape(e.arch)),
            device=device, target=found.target, measured_latency_ms=e.measured.get("latency_ms"),
            latency_noise_ms=e.measured.get("latency_mad_ms"), predicted_latency_ms=e.predicted.get("latency_ms"),
            measured_accuracy=e.measured.get("accuracy"), predicted_accuracy=predicted,
            activation_mb=max(0.0, activations) if activations is not None else None, arch=e.arch))
    bundle = Bundle.write(out, entries, {"work": str(Path(work).resolve()), "source": sn.compile_info.get("source"),
                                         "device": device, "target": found.target})
    say(f"bundle of {len(bundle)} SubNet(s) for {device} in {out}")
    return bundle
