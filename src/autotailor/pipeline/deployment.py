"""The export step: chosen SubNets as deployable files, each measured on its target.

A SubNet is extracted with its BatchNorm statistics recalibrated on training batches (a
tuned SuperNet's shared statistics are those of the largest SubNet; a small SubNet exported
with them loses most of its accuracy), written in every requested format, timed on the
search's device (paired with the reference kernel and brought to the LUT's machine speed, as
the predictions are; as timed in ``latency_raw_ms``) and evaluated on the validation subset,
beside what was predicted. A device whose files are quantized (``Backend.quantized``: ONNX
Runtime at int8) writes its own file of its format, calibrated on the data's calibration
batches, and that file is what is evaluated.

With ``[export] finetune_steps``, each chosen SubNet is also fine-tuned alone, its weights no
longer shared (``tune.specialize``), from the shared or the user's model's weights, whichever a
probe of both prefers (``autotailor export``), and exported unless the SubNet as chosen is more
accurate on the validation subset.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch.nn as nn

from autotailor.data.loader import at_resolution
from autotailor.errors import ConfigError, ExportError
from autotailor.predict.latency import export_formats, format_backend
from autotailor.files import write_text
from autotailor.pipeline.results import ORIGINAL_WEIGHTS, Chosen, Exported, ExportsRecord
from autotailor.pipeline.workdir import ORIGINAL, DeviceSetup, EvalData, is_original_model, original_calibration, slug
from autotailor.supernet import Arch
from autotailor.tune.evaluate import accuracy, extracted

log = logging.getLogger(__name__)

def check_formats(formats: Sequence[str]) -> list[str]:
    """``formats`` if each is a registered backend's export format (``onnx``, ``ncnn``, ...)."""
    allowed = export_formats()
    bad = [f for f in formats if f not in allowed]
    if bad or not formats:
        raise ExportError(f"unknown export format(s) {bad or formats}; allowed: {allowed}")
    return list(formats)


@dataclass(frozen=True)
class ExportSettings:
    """The ``[export]`` table."""

    formats: tuple = ("onnx",)
    pick: str = "all"  # all, a budget label (8ms, latency_ms=8) or a budget's position
    finetune_steps: int = 0  # each chosen SubNet fine-tuned alone for this many batches first; 0: not
    finetune_lr: float = 0.01  # its peak learning rate (cosine decay)

    def __post_init__(self) -> None:
        if self.finetune_steps < 0:
            raise ConfigError(f"export.finetune_steps = {self.finetune_steps} is not allowed; expected 0 (off) or more")
        if not self.finetune_lr > 0:
            raise ConfigError(f"export.finetune_lr = {self.finetune_lr} is not allowed; expected a positive number")


@dataclass(frozen=True)
class FineTuned:
    """A chosen SubNet fine-tuned alone (``export.finetune_steps``)."""

    net: nn.Module
    start: str  # the weights it started from, whose largest SubNet taught it: SHARED_WEIGHTS or ORIGINAL_WEIGHTS
    probe: dict[str, float]  # each start's validation accuracy after the probe (empty if only one start)


def keeps_finetuned(finetuned: float, unfinetuned: float) -> bool:
    """Whether the export deploys a SubNet fine-tuned alone, of validation accuracy ``finetuned``,
    in place of the chosen weights' one (``unfinetuned``): unless that is more accurate; on a
    tie, what the user asked for."""
    return finetuned >= unfinetuned


def export_choices(sn, out: str | Path, choices: Sequence[Chosen], formats: Sequence[str],
                   data: EvalData | None, device: DeviceSetup | None,
                   on_done: Callable[[Exported], None] | None = None,
                   finetuned: Callable[[Arch], FineTuned] | None = None, original=None) -> list[Exported]:
    """Export each chosen SubNet (of ``search.json``) into ``OUT/export/BUDGET/`` and measure it;
    write ``OUT/exports.json`` (``out``: the work directory, or a fleet device's folder).
    A choice with the user's model's weights (``Chosen.weights`` ``original``) is extracted from
    ``original``, the SuperNet with the weights tuning started from (``load_original``); the
    largest keeps the model's own BatchNorm statistics. ``finetuned`` (needs ``data``) makes a
    SubNet fine-tuned alone (``FineTuned``): it is exported in place of the chosen weights' one
    unless that is more accurate on the validation subset (both are measured, as
    ``accuracy_finetuned`` and ``accuracy_unfinetuned``), as it can be on the smallest SubNets,
    which the sandwich rule trained at every step. The user's model itself is not fine-tuned."""
    formats = check_formats(formats)
    reference = device.reference_ms() if device is not None else None
    done = []
    for choice in choices:
        arch = sn.space.complete(choice.arch)
        folder = Path(out) / "export" / slug(choice.budget)
        folder.mkdir(parents=True, exist_ok=True)
        shape = tuple(sn.input_shape(arch))
        shared = choice.weights != ORIGINAL_WEIGHTS
        if not shared and original is None:
            raise ExportError(f"{choice.budget}: the search chose the original model's weights, which "
                              f"(WORK/{ORIGINAL}) are gone: run `autotailor search` again")
        calibration = None if data is None else data.calibration
        if not shared:
            calibration = original_calibration(original, arch, calibration)
        elif data is None:
            log.warning("exporting %s without BatchNorm recalibration (no data given)", choice.budget)
        net = extracted(sn if shared else original, arch, calibration)
        compared: dict[str, float] = {}
        finetuned_from = None
        if finetuned is not None and data is not None and (shared or not is_original_model(original, arch)):
            alone = finetuned(arch)
            compared = {"accuracy_finetuned": accuracy(alone.net, data.val, shape[-1]),
                        "accuracy_unfinetuned": accuracy(net, data.val, shape[-1]),
                        **{f"accuracy_probe_{start}": a for start, a in alone.probe.items()}}
            if keeps_finetuned(compared["accuracy_finetuned"], compared["accuracy_unfinetuned"]):
                net, finetuned_from = alone.net, alone.start
        files: dict[str, Path] = {fmt: format_backend(fmt)().deploy(net, folder / "subnet", shape) for fmt in formats}
        quantized = device is not None and device.backend.quantized
        if quantized:  # the device's own file replaces (or joins) its format's default one
            if data is None:
                log.warning("quantizing %s with ranges from random inputs (no data given): its accuracy will suffer; "
                            "give --data", choice.budget)
            ranges = None if data is None else [at_resolution(x, shape[-1]).numpy() for x, _ in data.calibration]
            files[device.backend.format] = device.backend.deploy(net, folder / "subnet", shape, ranges)
        measured: dict[str, float | None] = {"latency_ms": None, "latency_mad_ms": None, "latency_raw_ms": None,
                                             "accuracy": None, **compared}
        if device is not None:
            backend = device.backend
            with tempfile.TemporaryDirectory() as tmp:
                path = files.get(backend.format) or backend.deploy(net, Path(tmp) / "subnet", shape)
                timed = device.time_deployed([(path, shape)])[0]  # paired with the reference kernel
            # at the LUT's machine speed, as predicted; and as timed
            speed = timed.at_speed(reference) / timed.median_ms if timed.median_ms else 1.0
            measured.update(latency_ms=timed.at_speed(reference), latency_mad_ms=timed.mad_ms * speed,
                            latency_raw_ms=timed.median_ms)
        if data is not None and quantized:
            measured["accuracy"] = _file_accuracy(device.backend.format, files[device.backend.format], data, shape)
        elif data is not None:  # the exported one's, measured above when compared
            measured["accuracy"] = (compared["accuracy_finetuned" if finetuned_from else "accuracy_unfinetuned"]
                                    if compared else accuracy(net, data.val, shape[-1]))
        predicted = {"accuracy": choice.accuracy, **choice.metrics}
        written = [p for fmt, path in files.items() for p in format_backend(fmt).deployed_files(path)]
        item = Exported(choice.budget, arch, [str(p) for p in written], predicted, measured, choice.weights,
                        finetuned_from)
        write_text(folder / "arch.json", json.dumps(arch, indent=1))
        done.append(item)
        if on_done:
            on_done(item)
    ExportsRecord(done).write(out)
    return done


def _file_accuracy(fmt: str, path: Path, data: EvalData, shape: tuple[int, ...]) -> float:
    """Top-1 accuracy of the deployed file ``path`` (of format ``fmt``, run here) on ``data.val``."""
    runner = format_backend(fmt)()
    correct = total = 0
    for x, y in data.val:
        scores = runner.run_file(path, at_resolution(x, shape[-1]).numpy())
        correct += int((np.asarray(scores).argmax(1) == y.numpy()).sum())
        total += len(y)
    return correct / max(total, 1)
