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

Each finished step is recorded in ``WORK/run.json`` with its time; a second run skips it, and
an interrupted step resumes from its own checkpoint or table.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
steps = 100
lr = 0.02
[sensitivity]
calibration_batches = 4
[search]
budgets = 8
verify = 2
finalists = 4
[export]
formats = ["onnx"]
"""

_RUN_KEYS: dict[str, type | tuple[type, ...]] = {"model": str, "input_size": int, "data": str, "device": str}


@dataclass(frozen=True)
class RunPlan:
    """What ``autotailor run`` will do: ``steps`` as (name, command-line arguments)."""

    config: Path
    work: Path
    steps: list[tuple[str, list[str]]]


def plan_run(config: str | Path, work: str | Path | None = None) -> RunPlan:
    """Read ``config`` and list the commands of its run (nothing is executed here)."""
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
    w, data_spec, device = str(work), run["data"], run.get("device", "ort-cpu:threads=1")
    cfg = ["--config", str(config)]  # the file's step tables, as edited since the compile
    compile_args = ["compile", run["model"], "--config", str(config), "--out", w]
    if "input_size" in run:
        compile_args += ["--input-size", str(run["input_size"])]
    steps: list[tuple[str, list[str]]] = [("compile", compile_args)]
    if "train" in data:
        steps.append(("train", ["train", w, "--data", data_spec, *cfg, "--quiet"]))
    steps += [
        ("tune", ["tune", w, "--data", data_spec, *cfg, "--quiet"]),
        ("profile", ["profile", w, "--device", device, "--quiet"]),
        ("sensitivity", ["sensitivity", w, "--data", data_spec, *cfg, "--quiet"]),
        ("search", ["search", w, "--device", device, "--data", data_spec, *cfg]),
        ("export", ["export", w, "--data", data_spec, "--device", device, *cfg]),
        ("report", ["report", w]),
    ]
    return RunPlan(config, work, steps)


def execute(plan: RunPlan, command: Callable[[list[str]], int],
            on_step: Callable[[str, str], None] | None = None) -> RunRecord:
    """Run the plan's steps not yet recorded as done in ``WORK/run.json`` through ``command``
    (the CLI's ``main``), recording each as it finishes; returns the record."""
    record = RunRecord.read(plan.work) if RunRecord.exists(plan.work) else RunRecord(str(plan.config))
    for name, argv in plan.steps:
        if name in record.steps and name != "report":
            if on_step:
                on_step(name, "done before")
            continue
        if on_step:
            on_step(name, "running")
        started = time.perf_counter()
        code = command(argv)
        if code != 0:
            raise AutoTailorError(f"step {name} failed (exit {code}): autotailor {' '.join(argv)}; "
                              "fix it and run again to resume from this step")
        if name == "report":
            continue
        record.steps[name] = StepDone(round(time.perf_counter() - started, 2), {"argv": argv})
        record.write(plan.work)
    return record
