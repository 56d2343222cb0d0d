"""The run's report: ``WORK/report.md`` and ``WORK/report.png``, from the JSON the steps wrote."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from autotailor.files import write_text
from autotailor.pipeline.finalists import FINALISTS, standard_error
from autotailor.pipeline.results import ORIGINAL_WEIGHTS, ExportsRecord, Record, RunRecord, SearchRecord
from autotailor.pipeline.workdir import SENSITIVITY, fleet_folders
from autotailor.search import METRICS


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _record(cls: type[Record], work: Path) -> Any:
    return cls.read(work) if cls.exists(work) else None


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric == "accuracy":
        return f"{100 * value:.2f} %"
    unit, scale = METRICS[metric]
    return f"{value / scale:.3g} {unit}"


def plot(work: Path, search: SearchRecord, exports: ExportsRecord | None, images: int = 0) -> Path:
    """The Pareto front (predicted), the chosen SubNets (predicted; measured on the validation
    images, with one standard error for ``images`` of them, when finalists were measured) and
    the exported SubNets as measured."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    axis = search.axis
    unit, scale = METRICS[axis]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    front = search.front
    ax.plot([f[axis] / scale for f in front], [100 * f["accuracy"] for f in front], "-", color="0.6",
            label="Pareto front (predicted)")
    chosen = search.met
    ax.plot([c.metrics[axis] / scale for c in chosen], [100 * c.accuracy for c in chosen], "o",
            color="tab:blue", label="chosen SubNets (predicted)")
    front = sorted({(c.measured_latency_ms if axis == "latency_ms" and c.measured_latency_ms else c.metrics[axis],
                     c.measured_accuracy) for c in chosen if c.measured_accuracy is not None})
    if front:
        ax.errorbar([x / scale for x, _ in front], [100 * a for _, a in front],
                    yerr=[100 * standard_error(a, images) for _, a in front], fmt="-", marker="D", ms=4, capsize=3,
                    color="tab:green", label="chosen SubNets (measured, validation)")
    measured = [e for e in (exports.exports if exports else []) if e.measured.get("accuracy") is not None
                and (axis != "latency_ms" or e.measured.get("latency_ms") is not None)]
    if measured:
        xs = [(e.measured["latency_ms"] if axis == "latency_ms" else e.predicted[axis]) / scale for e in measured]
        ax.plot(xs, [100 * e.measured["accuracy"] for e in measured], "s", color="tab:red",
                label="exported SubNets (measured)")
    for c in chosen:
        if axis in c.limits:
            ax.axvline(c.limits[axis] / scale, color="tab:blue", alpha=0.08, lw=1)
    ax.set_xlabel(f"{axis} ({unit})" + (f" on {search.target}" if axis == "latency_ms" and search.target else ""))
    ax.set_ylabel("top-1 accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path = work / "report.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(work: str | Path) -> Path:
    """Write ``WORK/report.md`` (and ``report.png`` when a search has run); returns the Markdown path."""
    work = Path(work)
    compile_info = _load(work / "compile.json") or {}
    run = _record(RunRecord, work)
    sens = _load(work / SENSITIVITY)
    lines = [f"# AutoTailor report: {compile_info.get('source', work.name)}", ""]
    if compile_info:
        lines += [f"SuperNet: {compile_info.get('num_modifications')} single modifications, "
                  f"10^{compile_info.get('log10_space_size', 0):.1f} SubNets; "
                  f"input {compile_info.get('input_shape')}.", ""]
    if run:
        lines += ["## Time per step", "", "| step | seconds |", "|---|---|"]
        lines += [f"| {s} | {done.seconds:.1f} |" for s, done in run.steps.items()]
        lines += [f"| total | {run.seconds:.1f} |", ""]
    if sens:
        worst = sorted(sens["deltas"].items(), key=lambda kv: -kv[1])[:5]
        lines += ["## Accuracy predictor (sensitivities)", "",
                  f"Largest SubNet: {_fmt('accuracy', sens['base_accuracy'])} on {sens['validation_images']} "
                  f"validation images ({sens['info'].get('data', '?')}); {len(sens['deltas'])} modifications "
                  f"measured in {sens['seconds']:.1f} s. Most sensitive: "
                  + ", ".join(f"`{k}` {100 * v:.2f} pts" for k, v in worst) + ".", ""]
    images = (_load(work / FINALISTS) or {}).get("info", {}).get("validation_images", 0)
    fleet = fleet_folders(work)
    if fleet:
        lines += [f"A fleet of {len(fleet)} devices: compiled, tuned and measured for accuracy once; profiled, "
                  "searched and exported for each.", ""]
    for folder in fleet or [work]:
        lines += _results(work, folder, images, heading="## " + (f"{SearchRecord.read(folder).device}: " if fleet else ""))
    return write_text(work / "report.md", "\n".join(lines))


def _results(work: Path, folder: Path, images: int, heading: str) -> list[str]:
    """The search and export sections of one device's results (``folder``: the work directory,
    or a fleet device's folder), under ``heading``."""
    search, exports = _record(SearchRecord, folder), _record(ExportsRecord, folder)
    lines: list[str] = []
    if search:
        verified, finalists, shown = search.verified, search.finalists, _shown(search)
        lines += [f"{heading}Search", "",
                  f"{len(search.choices)} budgets searched in {search.seconds:.1f} s "
                  f"({search.predictions} predictions; beam {search.beam_size} SubNets)"
                  + (f" for {search.target}" if search.target else "") + "."
                  + (f" The chosen SubNets were measured on it (brought to the machine's speed when the LUT was "
                     f"profiled) and the searches repeated "
                     f"{search.verify_rounds} time(s) with the latency model refitted to them: "
                     f"{search.latency_model}." if verified else "")
                  + (f" Each budget's {finalists} best-predicted SubNets were measured for accuracy on the "
                     "validation subset, and the most accurate chosen (within one standard error, the better "
                     "predicted)." if finalists else "")
                  + (f" Predicted accuracy: {search.accuracy_model}." if search.accuracy_model else "")
                  + (f" Machine speed while the LUT was profiled: {search.latency_noise}." if search.latency_noise
                     else ""), "",
                  "| budget | predicted accuracy | " + ("measured accuracy | " if finalists else "")
                  + " | ".join(f"predicted {m}" for m in shown)
                  + (" | measured latency_ms |" if verified else " |"),
                  "|---|---|" + "---|" * (len(shown) + verified + bool(finalists))]
        for c in search.choices:
            cells = [_fmt(m, c.metrics.get(m)) for m in shown] if c.arch else ["no SubNet meets it"]
            if finalists and c.arch:
                cells.insert(0, _fmt("accuracy", c.measured_accuracy))
            if verified and c.arch:
                cells.append(_fmt("latency_ms", c.measured_latency_ms))
            lines.append(f"| {c.budget} | {_predicted_accuracy(c.accuracy, c.weights)} | " + " | ".join(cells) + " |")
        lines += ["", *_front_summary(search, images),
                  f"![Pareto front]({plot(folder, search, exports, images).relative_to(work)})", ""]
    if exports:
        lines += [f"{heading}Exported SubNets, measured", "",
                  "Timed paired with the reference kernel and brought to the machine's speed when the LUT was "
                  "profiled, as the predictions are.", "",
                  "| budget | predicted latency | measured latency | predicted accuracy | measured accuracy | files |",
                  "|---|---|---|---|---|---|"]
        for e in exports.exports:
            files = ", ".join(f"`{Path(f).relative_to(work) if Path(f).is_relative_to(work) else f}`"
                              for f in e.files)
            fine_tuned = f" (fine-tuned from the {e.finetuned_from} weights)" if e.finetuned_from else ""
            lines.append(f"| {e.name} | {_fmt('latency_ms', e.predicted.get('latency_ms'))} | "
                         f"{_fmt('latency_ms', e.measured.get('latency_ms'))} | "
                         f"{_predicted_accuracy(e.predicted.get('accuracy'), e.weights)} | "
                         f"{_fmt('accuracy', e.measured.get('accuracy'))}{fine_tuned} | {files} |")
        lines.append("")
    return lines


def _front_summary(search: SearchRecord, images: int) -> list[str]:
    """How many budgets chose distinct SubNets; with measured accuracies, the validation noise,
    whether measured accuracy rises with the budget within it, and the predictions' largest gap."""
    met = search.met
    distinct = len({json.dumps([c.arch, c.weights], sort_keys=True) for c in met})
    out = [f"{distinct} of {len(search.choices)} budgets chose distinct SubNets"
           + (" (some with the original model's weights)." if any(c.weights == ORIGINAL_WEIGHTS for c in met)
              else ".")]
    measured = [c for c in met if c.measured_accuracy is not None]
    predicted = [c for c in measured if c.weights != ORIGINAL_WEIGHTS] or measured
    if measured and images:
        noise = [standard_error(c.measured_accuracy, images) for c in measured]
        falls = [f"{b.budget} ({100 * b.measured_accuracy:.2f} % after {100 * a.measured_accuracy:.2f} %)"
                 for a, b, na, nb in zip(measured, measured[1:], noise, noise[1:])
                 if b.measured_accuracy < a.measured_accuracy - 2 * math.hypot(na, nb)]
        gap = max(predicted, key=lambda c: abs(c.accuracy - c.measured_accuracy))
        out[0] += (f" Validation noise: one standard error of an accuracy measured on {images} images is "
                   f"{100 * max(noise):.2f} pts or less. Measured accuracy "
                   + ("rises with the budget (non-decreasing within two standard errors of each step)"
                      if not falls else "falls by more than two standard errors at " + ", ".join(falls))
                   + f"; the largest gap between predicted and measured is {100 * abs(gap.accuracy - gap.measured_accuracy):.2f}"
                   f" pts ({gap.budget}).")
    return out + [""]


def _predicted_accuracy(value: float | None, weights: str) -> str:
    """A chosen SubNet's predicted accuracy; one with the original model's weights is measured, not predicted."""
    return "original weights" if weights == ORIGINAL_WEIGHTS else _fmt("accuracy", value)


def _shown(search: SearchRecord) -> list[str]:
    """Metrics shown per budget: the constrained ones first, then latency and MACs if known."""
    constrained = sorted({m for c in search.choices for m in c.limits})
    known = next((c.metrics for c in search.met), {})
    return constrained + [m for m in ("latency_ms", "macs", "memory_bytes") if m in known and m not in constrained]
