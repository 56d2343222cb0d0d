"""Does a device's latency table hold on a noisy machine? Profiles of one model and device made
at different times, each checked against an independent paired measurement.

Reproduce (from the repository root, after `make install`; about an hour with the default
gap, resumable)::

    .venv/bin/python benchmarks/latency_repeatability.py
    .venv/bin/python benchmarks/latency_repeatability.py --profiles 3 --gap-min 25 --subnets 60
    .venv/bin/python benchmarks/latency_repeatability.py --report-only

1. ``--model`` (default torchvision MobileNetV2, random weights, default space, 224 px) is
   compiled once.
2. ``--profiles`` times, ``--gap-min`` minutes apart (start to start), ``autotailor profile``
   builds a new LUT for ``--device`` (default ``ort-cpu:threads=1``) in its own file: kernels
   paired with the reference kernel, then the calibration on 20 whole SubNets, as a user's
   profile does. Each profile's noise reading (the reference kernel's spread) is kept.
3. ``--subnets`` random SubNets (seed 1) plus the smallest and the largest are predicted by
   every profile. Two predictors per profile: the product's (paired: every entry brought to
   the profile's median machine speed), and the same LUT used as timed (unpaired: raw entries
   and raw calibration timings, the model fitted to those), the ablation.
4. Independent check, after the profiles, in a separate process without torch
   (``paired_timing.py``): each SubNet exported to ONNX and timed in 15-call windows
   alternated with the largest SubNet and the reference kernel, 5 rounds. Its ratio to the
   largest is drift-free; its absolute time is brought to each profile's machine speed by the
   reference kernel read in the same rounds.
5. Per profile and predictor: share of SubNets within ±10 % and ±5 %, mean bias, Kendall tau,
   for ratios to the largest and for absolute times; across profiles: the spread of their
   predictions for the same SubNets ((max - min) / median per SubNet), beside the noise
   floor (how much the check's own ratios vary from round to round).

State in ``--work`` (LUTs, exports, ``state.json``) so that an interrupted run resumes.
Results: ``benchmarks/results/latency_repeatability.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import State, head_commit, machine, write_results  # noqa: E402

log = logging.getLogger("latency_repeatability")


def profile_once(model_dir: Path, lut: Path, device: str) -> dict:
    from autotailor.pipeline.steps import profile_step

    started = time.time()
    setup = profile_step(model_dir, device, device_name="this", lut=lut, quiet=True, say=log.info)
    speed = setup.speed()
    return {"started_at": started, "seconds": time.time() - started, "speed": {
        "median_ms": speed.median_ms, "low": speed.low, "high": speed.high, "noise": speed.noise,
        "readings": speed.readings}, "paired_model": setup.predictor().describe()}


def unpaired(setup):
    """The predictor ``setup.predictor()`` would be if nothing were brought to one speed."""
    from autotailor.predict.latency import (SUBNET_PREFIX, CacheAwarePredictor, CostModel, LatencyPredictor,
                                            fit_cache_model, subnet_arch)

    plan = setup.plan
    keys = ["overhead", *(k.signature for k in plan.kernels)]
    with setup.open_store() as store:
        tables = [store.get(t, keys) for t in (setup.target, setup.hot_target or setup.target)]
        measured = {k: m.median_ms for k, m in store.with_prefix(setup.subnet_target, SUBNET_PREFIX).items()}
    cold, hot = (LatencyPredictor(plan, [e[k].median_ms for k in keys[1:]], e["overhead"].median_ms) for e in tables)
    model = fit_cache_model(cold, hot, CostModel(plan), [subnet_arch(k) for k in measured], list(measured.values()),
                            setup.cache_bytes)
    return CacheAwarePredictor(cold, hot, CostModel(plan), model)


def predictions(model_dir: Path, lut: Path, device: str, archs: list[dict]) -> dict:
    from autotailor.pipeline.workdir import device_setup, load_supernet

    setup = device_setup(load_supernet(model_dir), model_dir, device, "this", lut)
    paired, raw = setup.predictor(), unpaired(setup)
    return {"paired": [paired.predict(a) for a in archs], "unpaired": [raw.predict(a) for a in archs],
            "paired_model": paired.describe(), "unpaired_model": raw.describe()}


def check(model_dir: Path, work: Path, device: str, archs: list[dict], threads: int) -> dict:
    """The independent paired measurement (``paired_timing.py``), exporting what it lacks."""
    from autotailor.pipeline.workdir import device_setup, load_supernet
    from autotailor.predict.latency.backends.base import REFERENCE_SHAPE, ReferenceKernel

    setup = device_setup(load_supernet(model_dir), model_dir, device, "this", work / "lut0.sqlite")
    sn, backend = setup.plan.sn, setup.backend
    folder = work / "onnx"
    folder.mkdir(exist_ok=True)
    reference = folder / "reference.onnx"
    if not reference.is_file():
        backend.kernel_file(ReferenceKernel(), [REFERENCE_SHAPE], reference)
    models = {}
    for i, arch in enumerate(archs):
        path = folder / f"subnet{i}.onnx"
        if not path.is_file():
            backend.deploy(sn.extract(arch).eval(), path, tuple(sn.input_shape(arch)))
        models[str(i)] = str(path)
    spec = {"threads": threads, "rounds": 5, "calls": 15, "warmup": 3, "reference": str(reference),
            "largest": models[str(len(archs) - 1)], "models": models}
    (work / "check_spec.json").write_text(json.dumps(spec))
    started = time.time()
    subprocess.run([sys.executable, str(HERE / "paired_timing.py"), str(work / "check_spec.json"),
                    str(work / "check.json")], check=True)
    return {"seconds": time.time() - started, "finished_at": time.time(),
            "timings": json.loads((work / "check.json").read_text())}


def errors(predicted: list[float], measured: list[float]) -> dict:
    e = np.array(predicted) / np.array(measured) - 1
    return {"within_10": float(np.mean(np.abs(e) <= 0.10)), "within_5": float(np.mean(np.abs(e) <= 0.05)),
            "bias": float(np.mean(e)), "mape": float(np.mean(np.abs(e))),
            "kendall_tau": float(kendalltau(predicted, measured).statistic)}


def spread(rows: list[list[float]]) -> dict:
    """Per SubNet, (max - min) / median of the profiles' predictions: median and 90th percentile."""
    per = [(max(r) - min(r)) / statistics.median(r) for r in zip(*rows)]
    return {"median": float(np.median(per)), "p90": float(np.percentile(per, 90)), "max": float(max(per))}


def analyse(state: State) -> dict:
    timings = state.get("check", "timings")
    n = len(timings)
    t = [timings[str(i)] for i in range(n)]
    measured_ratio = [x["ratio"] for x in t]
    out: dict = {"profiles": {}, "noise": {}}
    preds = state.get("predictions")
    for p, prof in sorted(state.get("profiles").items()):
        ref = prof["speed"]["median_ms"]
        at_speed = [x["ms"] * ref / x["reference_ms"] for x in t]  # the check brought to the profile's speed
        row = {}
        for kind in ("paired", "unpaired"):
            pred = preds[p][kind]
            row[kind] = {"ratio": errors([v / pred[-1] for v in pred], measured_ratio),
                         "absolute": errors(pred, at_speed if kind == "paired" else [x["ms"] for x in t])}
        out["profiles"][p] = row
    profiles = sorted(state.get("profiles"))
    refs = [state.get("profiles", p, "speed", "median_ms") for p in profiles]
    common = statistics.median(refs)
    for kind in ("paired", "unpaired"):
        rows = [preds[p][kind] for p in profiles]
        out.setdefault("agreement", {})[kind] = {
            "absolute": spread(rows),
            "ratio": spread([[v / r[-1] for v in r] for r in rows]),
            "at_one_speed": spread([[v * common / ref for v in r] for r, ref in zip(rows, refs)])}
    largest = t[-1]["largest_window_ms"] + [w for x in t for w in x["largest_window_ms"]]
    lo, hi = np.percentile(largest, [10, 90]) / np.median(largest)
    out["noise"] = {"check_ratio_mad_median": float(np.median([x["ratio_mad"] for x in t])),
                    "check_ratio_mad_p90": float(np.percentile([x["ratio_mad"] for x in t], 90)),
                    "largest_windows_10_90": [float(lo - 1), float(hi - 1)],
                    "reference_readings_ms": refs}
    return out


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def report(state: State, args, command: str) -> None:
    a = analyse(state)
    meta = state.get("meta")
    lines = ["# Latency tables that hold on a noisy machine", "",
             f"Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores; onnxruntime "
             f"{meta['machine']['onnxruntime']}, torch {meta['machine']['torch']}; commit {meta['commit']}. "
             f"Command: `{command}`. {args.note}", "",
             f"Model `{meta['model']}` at {meta['input_size']} px (random weights, default space), device "
             f"`{meta['device']}`: {len(state.get('profiles'))} profiles, each a new LUT, started "
             + ", ".join(time.strftime('%H:%M', time.gmtime(p['started_at'])) for _, p in
                         sorted(state.get('profiles').items()))
             + f" UTC; the independent check (paired, torch-free, {len(state.get('archs'))} SubNets: "
             f"{len(state.get('archs')) - 2} random, the smallest and the largest) finished "
             f"{time.strftime('%H:%M', time.gmtime(state.get('check', 'finished_at')))} UTC.", "",
             "## Profiles", "",
             "| profile | started (UTC) | seconds | reference kernel, median ms | readings 10-90 % | noise reading | "
             "fitted model (paired) | fitted model (unpaired) |", "|---|---|---|---|---|---|---|---|"]
    preds = state.get("predictions")
    for p, prof in sorted(state.get("profiles").items()):
        s = prof["speed"]
        lines.append(f"| {p} | {time.strftime('%H:%M', time.gmtime(prof['started_at']))} | {prof['seconds']:.0f} | "
                     f"{s['median_ms']:.4f} | {pct(s['low'] - 1)} to {pct(s['high'] - 1)} | ±{pct(s['noise'])} | "
                     f"{preds[p].get('paired_model', prof['paired_model'])} | {preds[p]['unpaired_model']} |")
    lines += ["", "## Predictions against the independent check", "",
              "Ratio: each SubNet's prediction over the largest's, against the measured ratio (drift-free). "
              "Absolute: the prediction against the check's time brought to the profile's machine speed by the "
              "reference kernel (paired), or as timed (unpaired).", "",
              "| profile | predictor | ratio: within 10 % | within 5 % | bias | Kendall tau | absolute: within 10 % | "
              "within 5 % | bias |", "|---|---|---|---|---|---|---|---|---|"]
    for p, row in sorted(a["profiles"].items()):
        for kind in ("paired", "unpaired"):
            r, ab = row[kind]["ratio"], row[kind]["absolute"]
            lines.append(f"| {p} | {kind} | {pct(r['within_10'])} | {pct(r['within_5'])} | {r['bias']:+.1%} | "
                         f"{r['kendall_tau']:.3f} | {pct(ab['within_10'])} | {pct(ab['within_5'])} | {ab['bias']:+.1%} |")
    n = a["noise"]
    lines += ["", "## Agreement between the profiles", "",
              "Per SubNet, (max - min) / median of the profiles' predictions; median, 90th percentile and maximum "
              "over the SubNets. At one speed: each profile's predictions scaled by the median of the profiles' "
              "reference readings over its own (what remains once the machine's speed at each hour is taken out).", "",
              "| predictor | absolute (median / p90 / max) | ratio to the largest | absolute at one speed |",
              "|---|---|---|---|"]
    for kind, g in a["agreement"].items():
        lines.append(f"| {kind} | " + " | ".join(f"{pct(g[k]['median'])} / {pct(g[k]['p90'])} / {pct(g[k]['max'])}"
                                                 for k in ("absolute", "ratio", "at_one_speed")) + " |")
    lines += ["", "## Noise floor", "",
              f"- The check's ratio to the largest varies from round to round by {pct(n['check_ratio_mad_median'])} "
              f"(median over SubNets of the median absolute deviation; 90th percentile {pct(n['check_ratio_mad_p90'])}).",
              f"- The largest SubNet's 15-call window medians during the check: 10-90 % range "
              f"{pct(n['largest_windows_10_90'][0])} to {pct(n['largest_windows_10_90'][1])} of their median.",
              "- The profiles' reference readings (median ms): " + ", ".join(f"{r:.4f}" for r in n["reference_readings_ms"]),
              ""]
    write_results(HERE / "results", "latency_repeatability", {**a, "meta": meta}, "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="torchvision:mobilenet_v2")
    p.add_argument("--input-size", type=int, default=224)
    p.add_argument("--device", default="ort-cpu:threads=1")
    p.add_argument("--profiles", type=int, default=3)
    p.add_argument("--gap-min", type=float, default=25.0, help="minutes from one profile's start to the next's")
    p.add_argument("--subnets", type=int, default=60)
    p.add_argument("--work", default=str(HERE / "work" / "latency_repeatability"))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--note", default="", help="how the run went, for the report")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not args.device.startswith("ort-cpu"):
        raise SystemExit(f"--device {args.device}: the independent check (paired_timing.py) runs ONNX files in "
                         "ONNX Runtime only; give an ort-cpu device")
    command = "python benchmarks/latency_repeatability.py " + " ".join(sys.argv[1:])
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    state = State(work / "state.json")
    if args.report_only:
        report(state, args, command)
        return
    from autotailor.pipeline.steps import compile_step
    from autotailor.pipeline.workdir import load_supernet

    model_dir = work / "model"
    if not (model_dir / "supernet.pt").is_file():
        compile_step(args.model, model_dir, input_size=args.input_size)
    commit = head_commit()
    state.put({"machine": machine("onnxruntime", "torch"), "commit": commit, "model": args.model,
               "input_size": args.input_size, "device": args.device}, "meta")
    space = load_supernet(model_dir).space
    if state.get("archs") is None:
        rng = random.Random(1)
        archs = [space.complete(space.sample(rng)) for _ in range(args.subnets)]
        state.put(archs + [space.complete(space.min()), space.complete(space.max())], "archs")
    archs = state.get("archs")
    for i in range(args.profiles):
        key = str(i)
        if state.get("profiles", key) is None:
            if i:
                wait = state.get("profiles", str(i - 1), "started_at") + 60 * args.gap_min - time.time()
                if wait > 0:
                    log.info("profile %d starts in %.0f s", i, wait)
                    time.sleep(wait)
            log.info("profile %d", i)
            state.put(profile_once(model_dir, work / f"lut{i}.sqlite", args.device), "profiles", key)
        if state.get("predictions", key) is None:
            state.put(predictions(model_dir, work / f"lut{i}.sqlite", args.device, archs), "predictions", key)
    if state.get("check") is None:
        from autotailor.predict.latency import parse_device

        threads = int(parse_device(args.device)[1].get("threads", 1))
        state.put(check(model_dir, work, args.device, archs, threads), "check")
    report(state, args, command)


if __name__ == "__main__":
    main()
