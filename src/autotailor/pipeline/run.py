"""``autotailor run CONFIG.toml``: every step from one file, resumable after any step.

The file is the compile configuration (``[arch]``, ``[var.*]``) plus a ``[run]`` table that
says what to run on, and optional tables per step (``[train]``, ``[tune]``, ``[sensitivity]``,
``[search]``, ``[export]``) that set what the step's flags would::

    [run]
    model = "torchvision:resnet18"   # a model spec, as for `autotailor compile`
    input_size = 32                  # largest input resolution
    data = "digits"                  # a data spec, as for `autotailor tune`
    device = "ort-cpu:threads=1"     # the target to profile, search for and measure on
    [train]
    steps = 150                      # train the model first (leave [train] out if it is trained)
    [tune]
    steps = 100
    [search]
    budgets = 10                     # or latency_ms = [2, 4, 8]
    verify = 2                       # measure the chosen SubNets, refit, search again (rounds)
    finalists = 4                    # measure each budget's 4 best-predicted SubNets' accuracy
    [export]
    formats = ["onnx"]

A fleet: ``devices = [...]`` instead of ``device``, each device with the ``[search]`` budgets
or its own in ``[run.budgets]`` (a count, or a list of latency budgets in ms)::

    [run]
    devices = ["ort-cpu:threads=1", "ncnn:threads=1", "openvino:threads=1"]
    [run.budgets]
    "ncnn:threads=1" = [2, 4, 8]

Compile, train, tune and sensitivity run once; profile, search and export once per device,
each device's results in ``WORK/devices/DEVICE/`` (``search.json``, ``export/``,
``exports.json``), its exports in ``[export]``'s formats and its own; the report has a front
per device.

The whole file is checked before the first step starts (every table's keys and values, the
device, the export formats). Each step is a call of its step function (``pipeline.steps``)
with the file's table as it is when the step starts. Each finished step is recorded in
``WORK/run.json`` with its inputs (what it is given and its tables of the file); a second run
skips a step whose inputs are unchanged and that no step before it had to run again, and an
interrupted step resumes from its own checkpoint or table. When a step's inputs changed, it
runs again, and so does every step after it; a change to ``[train]`` or ``[tune]``, which
change the weights in place, starts again from compile.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotailor.errors import AutoTailorError, ConfigError
from autotailor.pipeline.results import RunRecord, StepDone

#: ``autotailor demo``: ResNet-18 trained from scratch on scikit-learn's handwritten digits
#: (real data that ships with a dependency, so it runs offline), for this machine's CPU.
DEMO_CONFIG = """\
title = "AutoTailor demo: ResNet-18 on handwritten digits, for this CPU under ONNX Runtime"
[run]
model = "torchvision:resnet18"
input_size = 32
data = "digits"
device = "ort-cpu:threads=1"
[train]
steps = 150
lr = 0.05
warmup_steps = 20
[tune]
steps = 500
lr = 0.02
smallest = false
[sensitivity]
calibration_batches = 4
[search]
budgets = 8
verify = 2
finalists = 4
[export]
formats = ["onnx"]
"""

_RUN_KEYS: dict[str, type | tuple[type, ...]] = {"model": str, "input_size": int, "data": str, "device": str,
                                                  "devices": list, "budgets": dict}
# The tables of the file each step reads, besides what it is given.
_TABLES = {"compile": ("arch", "var"), "train": ("train",), "tune": ("tune",), "profile": (),
           "sensitivity": ("sensitivity",), "search": ("search", "sensitivity"), "export": ("export", "sensitivity")}
_CHANGES_WEIGHTS = ("train", "tune")


@dataclass(frozen=True)
class RunPlan:
    """What ``autotailor run`` will do: ``steps`` as (name, its inputs, the call); the call takes
    ``again``, true when the step runs again over an earlier run's results."""

    config: Path
    work: Path
    steps: list[tuple[str, dict[str, Any], Callable[[bool], object]]]


def plan_run(config: str | Path, work: str | Path | None = None, quiet: bool = True) -> RunPlan:
    """Read ``config`` and list the step calls of its run (nothing is executed here). A step's
    settings are read when it starts: the file's table as it is then (``step_settings``)."""
    from autotailor.pipeline import steps as st
    from autotailor.pipeline.deployment import ExportSettings
    from autotailor.pipeline.selection import SearchSettings
    from autotailor.pipeline.workdir import EvalSettings, device_folder
    from autotailor.tune import TuneConfig

    config = Path(config)
    if not config.is_file():
        raise ConfigError(f"{config} does not exist; `autotailor run` takes a TOML file with a [run] table")
    try:
        data = tomllib.loads(config.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config}: not valid TOML ({exc})") from exc
    run = data.get("run")
    if not isinstance(run, dict):
        raise ConfigError(f"{config}: a [run] table with model, data and device is required")
    unknown = [k for k in run if k not in _RUN_KEYS]
    if unknown:
        raise ConfigError(f"{config}: unknown key(s) run.{', run.'.join(unknown)}; allowed: {list(_RUN_KEYS)}")
    missing = [k for k in ("model", "data") if k not in run]
    if missing:
        raise ConfigError(f"{config}: [run] needs {missing} (a model spec and a data spec)")
    for k, kind in _RUN_KEYS.items():
        if k in run and not isinstance(run[k], kind):
            raise ConfigError(f"{config}: run.{k} must be {kind.__name__ if isinstance(kind, type) else kind}")
    work = Path(work) if work else config.with_suffix("")
    data_spec = run["data"]
    devices, budgets = _devices(config, run)

    def settings(cls, section: str, **values: object):
        return st.step_settings(cls, section, work, config, values)

    # Everything checked now, so that a mistake in the last table does not wait for the first steps.
    from autotailor.compiler.config import load_config
    from autotailor.predict.latency.backends.base import make_backend, parse_device

    load_config(config)
    for device in devices:
        name, options = parse_device(device)
        make_backend(name, **options)
    st.check_step_tables(settings)
    for device in budgets:
        settings(SearchSettings, "search", **budgets[device])

    steps: list[tuple[str, dict[str, Any], Callable[[bool], object]]] = [
        ("compile", {"model": run["model"], "input_size": run.get("input_size")},
         lambda again: st.compile_step(run["model"], work, config, run.get("input_size"), force=again))]
    if "train" in data:
        steps.append(("train", {"data": data_spec}, lambda again: st.tune_step(
            work, data_spec, settings(TuneConfig, "train", subnets=1), "train", quiet=quiet)))
    steps.append(("tune", {"data": data_spec},
                  lambda again: st.tune_step(work, data_spec, settings(TuneConfig, "tune"), "tune", quiet=quiet)))
    sensitivity = ("sensitivity", {"data": data_spec},
                   lambda again: st.sensitivity_step(work, data_spec, settings(EvalSettings, "sensitivity"), quiet=quiet))
    fleet = "devices" in run
    if fleet:
        steps.append(sensitivity)  # shared by every device's search
    for device in devices:
        out = device_folder(work, device) if fleet else work
        suffix = f" {device}" if fleet else ""
        own = budgets.get(device, {})
        steps.append((f"profile{suffix}", {"device": device}, lambda again, d=device: st.profile_step(work, d, quiet=quiet)))
        if not fleet:
            steps.append(sensitivity)
        steps += [
            (f"search{suffix}", {"device": device, "data": data_spec, **({"budgets": own} if own else {})},
             lambda again, d=device, o=out, b=own: print("\n".join(st.describe_search(st.search_step(
                 work, settings(SearchSettings, "search", **b), d, data=data_spec,
                 evaluation=settings(EvalSettings, "sensitivity"), quiet=quiet, out=o), o)))),
            (f"export{suffix}", {"device": device, "data": data_spec},
             lambda again, d=device, o=out: st.export_step(work, _own_format(settings(ExportSettings, "export"), d)
                                                          if fleet else settings(ExportSettings, "export"), data_spec,
                                                          settings(EvalSettings, "sensitivity"), d, out=o,
                                                          quiet=quiet)),
        ]
    steps = [(name, {**given, **{t: data[t] for t in _TABLES[name.split()[0]] if t in data}}, call)
             for name, given, call in steps]
    return RunPlan(config, work, steps)


def _own_format(settings, device: str):
    """A fleet device's export settings: ``[export]``'s formats and the device's own (an NCNN
    device gets NCNN files, an OpenVINO device IR files, whatever ``[export]`` lists)."""
    import dataclasses

    from autotailor.predict.latency.backends.base import backend_class, parse_device

    name, options = parse_device(device)
    own = backend_class(options["backend"] if name == "remote" else name).format  # type: ignore[arg-type]
    return dataclasses.replace(settings, formats=tuple(dict.fromkeys([*settings.formats, own])))


def _devices(config: Path, run: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The run's devices (``device``, or a fleet's ``devices``) and each device's own search
    budgets (``[run.budgets]``: a count, or latency budgets in ms) as ``[search]`` values."""
    if "device" in run and "devices" in run:
        raise ConfigError(f"{config}: give run.device (one device) or run.devices (a fleet), not both")
    devices = run.get("devices", [run.get("device", "ort-cpu:threads=1")])
    if not devices or not all(isinstance(d, str) and d for d in devices):
        raise ConfigError(f"{config}: run.devices must be a non-empty list of device specs, e.g. "
                          '["ort-cpu:threads=1", "ncnn:threads=1"]')
    twice = sorted({d for d in devices if devices.count(d) > 1})
    if twice:
        raise ConfigError(f"{config}: run.devices names {twice} more than once")
    budgets: dict[str, dict[str, Any]] = {}
    for device, value in run.get("budgets", {}).items():
        if device not in devices:
            raise ConfigError(f"{config}: run.budgets names {device!r}, which is not in run.devices {devices}")
        if isinstance(value, int) and not isinstance(value, bool):
            budgets[device] = {"budgets": value, "latency_ms": []}  # lists: as run.json reads them back
        elif isinstance(value, list):
            budgets[device] = {"latency_ms": value}
        else:
            raise ConfigError(f"{config}: run.budgets.{device!r} = {value!r}: give a count of budgets (20) or "
                              "latency budgets in ms ([2, 4, 8])")
    if budgets and "devices" not in run:
        raise ConfigError(f"{config}: run.budgets is for a fleet (run.devices); with one device, set [search]")
    return devices, budgets


def execute(plan: RunPlan, on_step: Callable[[str, str], None] | None = None) -> RunRecord:
    """Run the plan's steps not yet recorded as done in ``WORK/run.json``, recording each as it
    finishes, then write the report; returns the record."""
    from autotailor.pipeline.workdir import locked

    with locked(plan.work, f"autotailor run {plan.config}"):
        return _execute(plan, on_step)


def _execute(plan: RunPlan, on_step: Callable[[str, str], None] | None) -> RunRecord:
    from autotailor.pipeline.report import write_report

    record = RunRecord.read(plan.work) if RunRecord.exists(plan.work) else RunRecord(str(plan.config))
    changed = [name for name, given, _ in plan.steps if name in record.steps and record.steps[name].settings != given]
    if any(name in _CHANGES_WEIGHTS for name in changed):
        changed.insert(0, "compile")  # tuned weights cannot be untuned: start from the model again
    again = False
    for name, given, call in plan.steps:
        again = again or name in changed
        if name in record.steps and not again:
            if on_step:
                on_step(name, "done before")
            continue
        if on_step:
            on_step(name, "inputs changed: running again" if again and name in record.steps else "running")
        started = time.perf_counter()
        try:
            call(again and name in record.steps)
        except AutoTailorError as exc:
            raise AutoTailorError(f"step {name} failed: {exc}; fix it and run again to resume from this step") from exc
        record.steps[name] = StepDone(round(time.perf_counter() - started, 2), given)
        record.write(plan.work)
    if on_step:
        on_step("report", "running")
    write_report(plan.work)
    return record
