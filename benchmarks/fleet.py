"""A fleet in one `autotailor run`: three targets, each with its own budgets, sharing what can be shared.

Reproduce (from the repository root, after `make install`; about half an hour on 2 cores)::

    .venv/bin/python benchmarks/fleet.py
    .venv/bin/python benchmarks/fleet.py --quick          # smoke run, a few minutes; results in the work folder

The run file is the demo's (`autotailor demo`: ResNet-18 trained on scikit-learn's digits, so
it runs offline) with ``devices`` = ONNX Runtime, NCNN and OpenVINO (1 thread each) instead of
one device and ``--budgets`` budgets per device. One ``autotailor run`` compiles, trains, tunes
and measures the sensitivities once, then profiles, searches (measuring each budget's finalists'
accuracy and the choices' latency) and exports per device.

Reported: the time of every step from ``run.json`` (each shared step appears once); per device,
its LUT entries, the search (budgets, distinct choices), its exports (files in the device's own
format, measured latency against predicted, measured accuracy), and how many SubNets' accuracy
the accuracies the one shared finalists table holds against what the searches shortlisted.
Results: ``benchmarks/results/fleet.{json,md}`` (``--quick``: ``WORK/results/``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import head_commit, machine, write_results  # noqa: E402

DEVICES = ("ort-cpu:threads=1", "ncnn:threads=1", "openvino:threads=1")


def config_text(budgets: int, quick: bool) -> str:
    from autotailor.pipeline.run import DEMO_CONFIG

    text = DEMO_CONFIG.replace('device = "ort-cpu:threads=1"', "devices = " + json.dumps(list(DEVICES)))
    text = text.replace("[search]\nbudgets = 8", f"[search]\nbudgets = {budgets}")
    if quick:
        text = text.replace("[train]\nsteps = 150", "[train]\nsteps = 10").replace("[tune]\nsteps = 500",
                                                                                 "[tune]\nsteps = 10")
        text += "[var.global_vars]\nresolution = [24, 32]\n"
    assert "devices" in text and f"budgets = {budgets}" in text
    return text


def summarize(work: Path) -> dict:
    from autotailor.pipeline.results import ExportsRecord, RunRecord, SearchRecord
    from autotailor.pipeline.workdir import device_folder
    from autotailor.predict.latency import LutStore

    record = RunRecord.read(work)
    devices = {}
    with LutStore(work / "latency.sqlite") as lut:
        counts = {t: lut.count(t) for t in lut.targets()}
    asked = 0
    for device in DEVICES:
        folder = device_folder(work, device)
        search, exports = SearchRecord.read(folder), ExportsRecord.read(folder).exports
        asked += search.finalists * len(search.met)
        errors = [e.measured["latency_ms"] / e.predicted["latency_ms"] - 1 for e in exports
                  if e.measured.get("latency_ms") and e.predicted.get("latency_ms")]
        backend = device.split(":")[0]
        devices[device] = {
            "lut_entries": sum(n for t, n in counts.items() if t.backend == backend),
            "budgets": len(search.choices), "met": len(search.met),
            "distinct": len({json.dumps(c.arch, sort_keys=True) for c in search.met}),
            "verify_rounds": search.verify_rounds, "latency_noise": search.latency_noise,
            "exports": len(exports),
            "formats": sorted({Path(f).suffix for e in exports for f in e.files}),
            "latency_ms": [e.measured.get("latency_ms") for e in exports],
            "median_abs_error": statistics.median(abs(x) for x in errors) if errors else None,
            "accuracy": [e.measured.get("accuracy") for e in exports],
        }
    finalists = json.loads((work / "finalists.json").read_text()) if (work / "finalists.json").is_file() else {}
    return {"steps": {k: v.seconds for k, v in record.steps.items()}, "total_s": record.seconds,
            "devices": devices, "finalists_measured": len(finalists.get("subnets", {})),
            "finalists_asked": asked}


def report(results: dict, folder: Path) -> None:
    steps = results["steps"]
    shared = [s for s in steps if " " not in s]
    lines = ["# A fleet in one run", "",
             f"Machine: {results['machine']['cpu']}, {results['machine']['cores']} cores; onnxruntime "
             f"{results['machine']['onnxruntime']}, ncnn {results['machine']['ncnn']}, openvino "
             f"{results['machine']['openvino']}; commit {results['commit']}. Command: `{results['command']}`. "
             f"{results['note']}", "",
             f"One `autotailor run` of the demo's model and data for {len(DEVICES)} devices, "
             f"{results['budgets']} budgets each: {results['total_s']:.0f} s of steps "
             f"({results['wall_s']:.0f} s wall). Shared steps, each run once: {', '.join(shared)}.", "",
             "## Time per step", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {s} | {t:.1f} |" for s, t in steps.items()]
    lines += ["", "## Per device", "",
              "| device | LUT entries | budgets met | distinct choices | exports | formats | exported latency ms "
              "(measured) | median abs. error vs predicted | exported accuracy | profile noise |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for d, r in results["devices"].items():
        lat = [x for x in r["latency_ms"] if x is not None]
        acc = [x for x in r["accuracy"] if x is not None]
        lines.append(f"| {d} | {r['lut_entries']} | {r['met']} of {r['budgets']} | {r['distinct']} | {r['exports']} | "
                     f"{' '.join(r['formats'])} | {min(lat):.3f}-{max(lat):.3f} | "
                     + (f"{100 * r['median_abs_error']:.1f} %" if r["median_abs_error"] is not None else "-")
                     + f" | {100 * min(acc):.1f}-{100 * max(acc):.1f} % | {(r['latency_noise'] or '-').split(':')[0]} |")
    lines += ["", f"Finalists: the three searches' last rounds alone shortlist {results['finalists_asked']} SubNets "
              f"(budgets met x finalists per budget, every verify round shortlists again); the work directory's one "
              f"finalists table holds {results['finalists_measured']} measured accuracies in all, each SubNet "
              "measured once whichever device's search shortlisted it.", ""]
    write_results(folder, "fleet", results, "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", type=int, default=20)
    p.add_argument("--work", default=str(HERE / "work" / "fleet"))
    p.add_argument("--quick", action="store_true", help="3 budgets, 10 training steps: a smoke run")
    p.add_argument("--note", default="", help="how the run went, for the report")
    args = p.parse_args()
    budgets = 3 if args.quick else args.budgets
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    config = work / "fleet.toml"
    if not config.is_file():
        config.write_text(config_text(budgets, args.quick))
    started = time.time()
    # resumable: a second call continues where the run stopped (run.json)
    subprocess.run([str(Path(sys.executable).parent / "autotailor"), "run", str(config), "--work",
                    str(work / "run")], check=True)
    results = {**summarize(work / "run"), "budgets": budgets, "wall_s": time.time() - started,
               "machine": machine("onnxruntime", "ncnn", "openvino", "torch"), "note": args.note,
               "commit": head_commit(),
               "command": "python benchmarks/fleet.py " + " ".join(sys.argv[1:])}
    report(results, work / "results" if args.quick else HERE / "results")


if __name__ == "__main__":
    main()
