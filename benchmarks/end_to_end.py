"""From a tuned SuperNet to measured SubNets for 40 latency budgets; and the demo, timed.

Reproduce (from the repository root, after `make install`, benchmarks/tune_cifar10.py and
benchmarks/accuracy_predictor.py, whose SuperNets, sensitivity tables and evaluated pools it
reuses; on an otherwise idle machine, since it times models)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/end_to_end.py --models mobilenet_v2,resnet18
    .venv/bin/python benchmarks/end_to_end.py --demo          # clean clone, make install, make demo
    .venv/bin/python benchmarks/end_to_end.py --report-only

Search part, per tuned CIFAR-10 SuperNet, on ONNX Runtime CPU with one thread:

1. ``autotailor profile`` builds the latency LUT (timed);
2. ``autotailor search --verify 3 --finalists 4`` for ``--budgets`` latency budgets spanning
   the space (a fixed ratio apart): each round's chosen SubNets are measured and join the
   latency predictor's fit, and the budgets are searched again (the searches and the whole
   step timed); each budget's 4 best-predicted SubNets are measured for accuracy on a sample
   of ``--finalist-images`` test images (seed 1), the most accurate chosen;
3. every chosen SubNet is exported to ONNX (BatchNorm recalibrated), its latency measured
   as the search's verification measures (median of repeats, in two passes in opposite orders,
   the faster kept; brought to the LUT's machine speed by the reference kernel read beside
   each timing) and its accuracy on all test images (accuracy_predictor.py's validation set)
   and on the finalists' sample, which give its accuracy on the test images the finalists did
   not see (held out: the choice among finalists is not judged on the images it was made on);
4. the same latency measurement for that benchmark's pool of random SubNets, and their
   accuracy on the same held-out images (from their accuracy on all test images, known, and
   on the finalists' sample, measured): the chosen front must beat the pool (no random SubNet
   more accurate than every chosen SubNet at or below its measured latency by more than 0.5
   points).

Demo part: a clean clone of this repository, ``make install`` and ``make demo``, each timed,
and the report the demo wrote. Results: ``benchmarks/results/end_to_end.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import State, machine, write_results

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
BIN = Path(sys.executable).parent
DEVICE = "ort-cpu:threads=1"
FINALIST_SEED = 1  # the finalists' test sample; accuracy_predictor.py's calibration batches are seed 0's
sys.path.insert(0, str(HERE))  # cifar_models, for SuperNets compiled from it


def cli(*argv: str) -> None:
    print("$ autotailor " + " ".join(argv), flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([str(BIN / "autotailor"), *argv], check=True, env=env)


def measure_latencies(sn, work: Path, archs: list[dict], calibration) -> list[dict]:
    """Latency of each SubNet as ONNX on ONNX Runtime, timed as the search's verification
    times its choices (``DeviceSetup.time_deployed``: the median of repeated calls, two passes
    in opposite orders, at the LUT's machine speed), with the speed read every 8 timings:
    ``ms`` at the LUT's speed, ``raw_ms`` as timed."""
    from autotailor.pipeline.workdir import device_setup
    from autotailor.tune import recalibrated

    setup = device_setup(sn, work, DEVICE)
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, arch in enumerate(archs):
            shape = tuple(sn.input_shape(arch))
            with recalibrated(sn, arch, calibration):
                net = sn.extract(arch).eval()
            files.append((setup.backend.deploy(net, Path(tmp) / f"subnet{i}", shape), shape))
        timed = setup.time_deployed(files)
    ref = setup.reference_ms()
    return [{"ms": m.at_speed(ref), "raw_ms": m.median_ms, "slowness": m.median_ms / m.at_speed(ref)} for m in timed]


def pool_on_sample(sn, work: Path, pool: list[dict], batches: list, calibration: list) -> list[float]:
    """Accuracy of each pool SubNet on ``batches`` (BN recalibrated on ``calibration``), kept in
    ``work/pool_on_finalist_sample.json`` after each ten (a restarted run skips them)."""
    from autotailor.tune import evaluate

    path = work / "pool_on_finalist_sample.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    for i, arch in enumerate(pool):
        if str(i) not in done:
            done[str(i)] = evaluate(sn, arch, batches, calibration)
            if i % 10 == 9 or i == len(pool) - 1:
                path.write_text(json.dumps(done))
    return [done[str(i)] for i in range(len(pool))]


def run_model(name: str, args: argparse.Namespace, store: State) -> dict:
    import numpy as np

    import autotailor as at
    from autotailor.pipeline.workdir import EvalSettings, eval_data
    from autotailor.tune import evaluate

    tuned = Path(args.tuned) / name
    work = Path(args.work) / name
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy2(tuned / "supernet.pt", work / "supernet.pt")
    for f in ("compile.json", "config.json", "space.json"):
        shutil.copy2(tuned / f, work / f)
    ap = Path(args.accuracy_work)
    ap_state = json.loads((ap / "state.json").read_text())
    shutil.copy2(ap / name / "sensitivity.json", work / "sensitivity.json")
    for old in [*work.glob("latency.sqlite*"), work / "finalists.json"]:  # built from scratch: their time is reported
        old.unlink(missing_ok=True)
    ap_results = ap_state[name]["results"]  # the same validation subset and calibration
    settings = EvalSettings(ap_results["validation_images"], ap_results["calibration_batches"], 128, 0)

    started = time.perf_counter()
    cli("profile", str(work), "--device", DEVICE, "--quiet")
    profile_seconds = time.perf_counter() - started
    started = time.perf_counter()
    search_args = ["--budgets", str(args.budgets), "--verify", str(args.verify)]
    if args.finalists:
        search_args += ["--finalists", str(args.finalists), "--data", args.data,
                        "--validation-images", str(args.finalist_images), "--validation-seed", str(FINALIST_SEED)]
    cli("search", str(work), "--device", DEVICE, *search_args)
    search_step_seconds = time.perf_counter() - started
    found = json.loads((work / "search.json").read_text())
    sn = at.load(work / "supernet.pt")
    data = eval_data(args.data, sn.example_shape[-1], settings)
    chosen = [c for c in found["choices"] if c["arch"] is not None]
    archs = [sn.space.complete(c["arch"]) for c in chosen]
    rng = random.Random(1)  # accuracy_predictor.py's pool, in its order
    pool = [sn.space.sample(rng) for _ in range(len(ap_state[name]["pool"]))]
    pool_acc = [ap_state[name]["pool"][str(i)]["accuracy"] for i in range(len(pool))][: args.pool]
    pool = pool[: args.pool]
    # Chosen and random SubNets timed in one interleaved session, so drift hits both alike.
    measured = measure_latencies(sn, work, archs + pool, data.calibration)
    chosen_lat, pool_lat = [m["ms"] for m in measured[: len(archs)]], [m["ms"] for m in measured[len(archs):]]
    all_acc = [evaluate(sn, a, data.val, data.calibration) for a in archs]
    chosen_acc, held_out_images = all_acc, data.images
    if args.finalists:
        # Judged on the test images the finalists were not measured on. BatchNorm in eval mode
        # classifies each image alone, so a SubNet's accuracy there follows from its accuracy on
        # all images and on the finalists' sample (for the random SubNets, known and cached).
        sample = eval_data(args.data, sn.example_shape[-1],
                           EvalSettings(args.finalist_images, 1, 128, FINALIST_SEED)).val
        n_all, n_sample = data.images, sum(len(y) for _, y in sample)
        held_out_images = n_all - n_sample

        def held_out(on_all: list[float], on_sample: list[float]) -> list[float]:
            return [(n_all * a - n_sample * s) / held_out_images for a, s in zip(on_all, on_sample)]
        chosen_acc = held_out(all_acc, [evaluate(sn, a, sample, data.calibration) for a in archs])
        pool_acc = held_out(pool_acc, pool_on_sample(sn, work, pool, sample, data.calibration))
    rows = []
    for c, m, acc, on_all in zip(chosen, measured, chosen_acc, all_acc):
        rows.append({"budget_ms": c["limits"]["latency_ms"], "predicted_ms": c["metrics"]["latency_ms"],
                     "measured_ms": m["ms"], "raw_ms": m["raw_ms"], "slowness": m["slowness"],
                     "verified_ms": c.get("measured_latency_ms"),
                     "predicted_accuracy": c["accuracy"], "finalist_accuracy": c.get("measured_accuracy"),
                     "measured_accuracy": acc,
                     "all_images_accuracy": on_all,
                     "within_budget_5pct": m["ms"] <= 1.05 * c["limits"]["latency_ms"]})
    beaten = []
    for lat, acc in zip(pool_lat, pool_acc):
        best = max((a for cl, a in zip(chosen_lat, chosen_acc) if cl <= lat), default=None)
        if best is None or acc > best + 0.005:
            beaten.append({"measured_ms": lat, "accuracy": acc, "best_chosen_at_or_below": best})
    return {"budgets": len(found["choices"]), "met": len(chosen), "profile_seconds": profile_seconds,
            "search_seconds": found["seconds"], "search_step_seconds": search_step_seconds,
            "verify_rounds": found["verify_rounds"], "latency_model": found["latency_model"],
            "predictions": found["predictions"], "rows": rows,
            "within_budget_5pct": sum(r["within_budget_5pct"] for r in rows),
            "pool": len(pool), "pool_beating_front": beaten,
            "validation_images": data.images, "finalists": args.finalists,
            "finalist_images": args.finalist_images if args.finalists else 0,
            "held_out_images": held_out_images,
            "pool_latency_ms": {"min": float(np.min(pool_lat)), "max": float(np.max(pool_lat))},
            "pool_points": [{"measured_ms": lat, "accuracy": acc} for lat, acc in zip(pool_lat, pool_acc)]}


def run_demo() -> dict:
    """Clone this repository (its last commit), install and run the demo, each timed."""
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "autotailor"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        times = {}
        for target in ("install", "demo"):
            started = time.perf_counter()
            done = subprocess.run(["make", target], cwd=clone, capture_output=True, text=True)
            times[target] = time.perf_counter() - started
            if done.returncode != 0:
                raise SystemExit(f"make {target} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        report = (clone / "autotailor-demo" / "report.md").read_text()
        run = json.loads((clone / "autotailor-demo" / "run.json").read_text())
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout
        return {"commit": commit.strip(), "install_seconds": times["install"], "demo_seconds": times["demo"],
                "steps": {k: v["seconds"] for k, v in run["steps"].items()}, "report": report}


def report(data: dict) -> str:
    lines = ["# End to end: budgets to measured SubNets, and the demo", "",
             "Each part states the machine it ran on: a part run again replaces only itself.", ""]
    for name, r in data.get("models", {}).items():
        rows = r["rows"]
        errors = [abs(x["measured_ms"] / x["predicted_ms"] - 1) for x in rows]
        lines += [f"## {name} on {DEVICE}", "",
                  f"Command: `{r.get('command', '')}` (commit {r.get('commit', '?')[:10]})", "",
                  f"Machine: {json.dumps(r['machine'])}", "",
                  f"- LUT built in {r['profile_seconds']:.0f} s; {r['budgets']} budgets searched in "
                  f"{r['search_seconds']:.1f} s ({r['predictions']} predictions, {r.get('verify_rounds', 0)} verify "
                  f"rounds; the whole search step with its measurements {r.get('search_step_seconds', 0):.0f} s); "
                  f"{r['met']} met.",
                  f"- Latency model after verification: {r.get('latency_model')}.",
                  f"- Chosen SubNets measuring within their budget +5 %: {r['within_budget_5pct']} of {len(rows)}; "
                  f"median |measured/predicted - 1| {100 * statistics.median(errors):.1f} %. Timings here are "
                  "brought to the LUT's machine speed by the reference kernel read beside each (slowness "
                  f"{min(x['slowness'] for x in rows):.2f}-{max(x['slowness'] for x in rows):.2f}); as timed, "
                  f"{sum(x['raw_ms'] <= 1.05 * x['budget_ms'] for x in rows)} of {len(rows)} are within +5 %.",
                  f"- Random SubNets ({r['pool']}, measured {r['pool_latency_ms']['min']:.2f}-"
                  f"{r['pool_latency_ms']['max']:.2f} ms) more accurate by > 0.5 points than every chosen SubNet "
                  f"at or below their latency: {len(r['pool_beating_front'])}.",
                  (f"- Finalists: each budget's {r['finalists']} best-predicted SubNets measured on "
                   f"{r['finalist_images']} test images, the most accurate chosen; chosen SubNets judged on the "
                   f"other {r['held_out_images']} (held out), random ones too (from their accuracy on all "
                   f"{r['validation_images']} and on the finalists' sample)."
                   if r.get("finalists") else "- Choices by prediction alone (no finalists)."), "",
                  "| budget (ms) | predicted (ms) | measured in the search's verification (ms) | measured here (ms) "
                  "| as timed (ms) | predicted acc. | finalists' acc. | measured acc. ("
                  + ("held out" if r.get("finalists") else "all images") + ") | all images |",
                  "|---|---|---|---|---|---|---|---|---|"]

        def pct(v) -> str:
            return "-" if v is None else f"{100 * v:.2f} %"
        lines += [f"| {x['budget_ms']:.3g} | {x['predicted_ms']:.3f} | "
                  + (f"{x['verified_ms']:.3f}" if x.get("verified_ms") is not None else "-")
                  + f" | {x['measured_ms']:.3f} | {x['raw_ms']:.3f} | {pct(x['predicted_accuracy'])} | "
                  f"{pct(x.get('finalist_accuracy'))} | {pct(x['measured_accuracy'])} | "
                  f"{pct(x.get('all_images_accuracy', x['measured_accuracy']))} |" for x in rows]
        lines.append("")
    demo = data.get("demo")
    if demo:
        lines += ["## `autotailor demo` from a clean clone", "",
                  f"Commit {demo['commit'][:10]}: `make install` {demo['install_seconds']:.0f} s, "
                  f"`make demo` {demo['demo_seconds']:.0f} s (limit 600 s). Steps (s): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in demo["steps"].items()) + ".", "",
                  f"Machine: {json.dumps(demo['machine'])}", "",
                  "The report it wrote:", "", "```markdown", demo["report"].strip(), "```", ""]
    return "\n".join(lines)


def _state(path: Path, results: Path) -> State:
    """The work directory's state; on a machine without one, the committed results' parts, so
    that running one part again keeps the others (results written before parts stated their
    machine get the file's)."""
    if not path.is_file() and results.is_file():
        old = json.loads(results.read_text())
        parts = [*old.get("models", {}).values(), *([old["demo"]] if old.get("demo") else [])]
        for part in parts:
            part.setdefault("machine", old.get("machine"))
        path.write_text(json.dumps({k: old[k] for k in ("commands", "models", "demo") if k in old}, indent=1))
    return State(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="")
    p.add_argument("--demo", action="store_true", help="time a clean clone's make install and make demo")
    p.add_argument("--tuned", default=str(HERE / "work" / "tune_cifar10"))
    p.add_argument("--accuracy-work", default=str(HERE / "work" / "accuracy_predictor"))
    p.add_argument("--data", default=f"cifar10:{ROOT.parent / 'shared' / 'data' / 'cifar10'}")
    p.add_argument("--work", default=str(HERE / "work" / "end_to_end"))
    p.add_argument("--budgets", type=int, default=40)
    p.add_argument("--verify", type=int, default=3, help="search's verify rounds")
    p.add_argument("--pool", type=int, default=500, help="random SubNets of the accuracy pool to time")
    p.add_argument("--finalists", type=int, default=4, help="search's finalists per budget (0: choose by prediction)")
    p.add_argument("--finalist-images", type=int, default=2000, help="test images the finalists are measured on")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    store = _state(Path(args.work) / "state.json", Path(args.results) / "end_to_end.json")
    command = "python " + " ".join(sys.argv)
    if not args.report_only:
        for name in filter(None, args.models.split(",")):
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
            dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True).stdout
            store.put({**run_model(name, args, store), "command": command, "machine": machine("torch", "onnxruntime"),
                       "commit": commit.strip() + (" with uncommitted changes in src" if dirty else "")}, "models", name)
        if args.demo:
            store.put({**run_demo(), "machine": machine("torch", "onnxruntime")}, "demo")
            store.put(command, "commands", "demo")
    data = {"commands": store.get("commands") or {}, "models": store.get("models") or {}, "demo": store.get("demo")}
    write_results(args.results, "end_to_end", data, report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
