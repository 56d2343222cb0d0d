"""Learning-free latency prediction against measurement, with a fusion ablation and two baselines.

Reproduce (from the repository root, after `make install`, on an otherwise idle machine;
several hours for everything, resumable)::

    .venv/bin/python benchmarks/latency_predictor.py
    .venv/bin/python benchmarks/latency_predictor.py --models mobilenet_v2 --backends ort-cpu --subnets 50
    .venv/bin/python benchmarks/latency_predictor.py --report-only

For each model (torchvision, random weights made well-conditioned, default space, 224 px) and
backend (ONNX Runtime CPU and NCNN, 1 thread):

1. enumeration of the unique kernels for each granularity (operator without fusion, fused
   kernels, whole blocks): count and time;
2. LUT build (``profile``) per granularity, timed; the fused LUT is built first and alone, so
   its time is the real cost of a new device;
3. ``--subnets`` random SubNets plus the smallest and the largest, each exported with the
   backend's deploy path (ONNX / pnnx->NCNN) and timed twice, in two passes in opposite
   orders; the two passes agreeing bounds what this machine's noise allows. Before every 20
   SubNets, 20 fixed LUT kernels are measured again: their drift against the LUT is reported;
4. prediction error of each granularity against the mean of the two passes: share within
   +-5% and +-10%, mean absolute percentage error, Kendall tau;
5. baselines on the held-out half of the SubNets: a FLOPs-linear model fitted on the first n
   measured SubNets, and a learning-based kernel predictor (one random forest per kernel
   type on the kernels' shapes and MACs, the nn-Meter / LitePred way) trained on the kernels
   of the first n SubNets; each with the profiling time it cost, against the learning-free
   predictor's;
6. prediction speed (predictions per second, latency and counted costs).

State (LUTs, exported SubNets' timings) lives in ``--work`` so that the script resumes.
Results: ``benchmarks/results/latency_predictor.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torchvision
from scipy.stats import kendalltau
from common import State, machine
from sklearn.ensemble import RandomForestRegressor

import autotailor as at
from autotailor.predict.latency import (CacheAwarePredictor, CostModel, KernelPlan, LatencyPredictor, LutStore, Target,
                                        cache_bytes, make_backend, profile)
from autotailor.predict.latency.predictor import kernel_costs
from autotailor.testing import well_conditioned

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODELS = ("resnet50", "mobilenet_v2", "mobilenet_v3_large", "convnext_tiny")
BACKENDS = ("ort-cpu", "ncnn")
# name -> (fusion rules, granularity); "fused" uses the backend's own rules
VARIANTS = {"fused": (None, "fused"), "no-fusion": ("none", "operator"), "block": (None, "block")}
BUDGETS = (2, 5, 10, 20, 50, 100)


def accuracy(pred: list[float], meas: list[float]) -> dict:
    err = [p / m - 1 for p, m in zip(pred, meas)]
    return {"n": len(err), "within_5": sum(abs(e) <= 0.05 for e in err) / len(err),
            "within_10": sum(abs(e) <= 0.10 for e in err) / len(err),
            "mape": statistics.mean(abs(e) for e in err), "mean_error": statistics.mean(err),
            "kendall_tau": float(kendalltau(pred, meas).statistic)}


def run_pair(state: State, model: str, backend_name: str, args: argparse.Namespace) -> None:
    st = state.section(model, backend_name)
    torch.manual_seed(0)
    sn = at.compile(well_conditioned(getattr(torchvision.models, model)()),
                    torch.zeros(1, 3, args.input_size, args.input_size))
    backend = make_backend(backend_name, threads=1)
    rng = random.Random(0)
    archs = [sn.space.max(), sn.space.min()] + [sn.space.sample(rng) for _ in range(args.subnets)]
    lut = LutStore(Path(args.work) / "lut.sqlite")
    target = Target.of("bench", backend_name, **backend.settings)
    plans = {}
    for name, (rules, granularity) in VARIANTS.items():
        plan = KernelPlan(sn, rules or backend_name, granularity)
        plans[name] = plan
        st.setdefault("enumeration", {})[name] = {"kernels": len(plan.kernels), "groups": len(plan.groups),
                                                  "seconds": plan.seconds}
        seconds = st.setdefault("profile_seconds", {}).get(name, 0.0)
        report = profile(plan, backend, lut, target,
                         lambda d, n, name=name: print(f"\r{model} {backend_name} {name}: {d}/{n}", end="", flush=True))
        st["profile_seconds"][name] = seconds + report.seconds
        st.setdefault("profiled", {})[name] = report.kernels
        print(f"\n{model} {backend_name} {name}: {len(plan.kernels)} kernels, LUT built in "
              f"{st['profile_seconds'][name]:.0f} s", flush=True)
        state.save()
    fused = plans["fused"]
    hot_target = None
    if backend.flush_mb:  # the warm LUT of the cache-aware predictor (see CacheAwarePredictor)
        hot_backend = make_backend(backend_name, threads=1, flush_mb=0)
        hot_target = Target.of("bench", backend_name, **hot_backend.settings)
        report = profile(fused, hot_backend, lut, hot_target)
        st["profile_seconds"]["fused-warm"] = st["profile_seconds"].get("fused-warm", 0.0) + report.seconds
        state.save()
    probe = random.Random(1).sample(fused.kernels, min(20, len(fused.kernels)))
    entries = lut.get(target, [k.signature for k in probe])
    timings = st.setdefault("subnets", {})
    drift = st.setdefault("drift", [])
    with tempfile.TemporaryDirectory() as tmp:
        for pass_ in (0, 1):
            order = list(range(len(archs))) if pass_ == 0 else list(reversed(range(len(archs))))
            for j, i in enumerate(order):
                rec = timings.setdefault(str(i), {})
                if f"pass{pass_}" in rec:
                    continue
                if j % 20 == 0:  # the LUT's own kernels again: how far the machine drifted
                    again = [backend.measure(*fused.example(k)).median_ms / entries[k.signature].median_ms
                             for k in probe]
                    drift.append(statistics.median(again))
                started = time.perf_counter()
                shape = sn.input_shape(archs[i])
                path = backend.deploy(sn.extract(archs[i]).eval(), Path(tmp) / f"subnet{i}", shape)
                rec[f"pass{pass_}"] = backend.time(backend.load(path, shape)).median_ms
                rec["seconds"] = rec.get("seconds", 0.0) + time.perf_counter() - started
                state.save()
                print(f"\r{model} {backend_name} pass {pass_}: {j + 1}/{len(archs)}", end="", flush=True)
    print()
    measured = [statistics.mean([timings[str(i)]["pass0"], timings[str(i)]["pass1"]]) for i in range(len(archs))]
    repeat = [timings[str(i)]["pass1"] / timings[str(i)]["pass0"] - 1 for i in range(len(archs))]
    st["noise"] = {"passes_within_5": sum(abs(r) <= 0.05 for r in repeat) / len(repeat),
                   "passes_within_10": sum(abs(r) <= 0.10 for r in repeat) / len(repeat),
                   "median_abs_pass_difference": statistics.median(abs(r) for r in repeat),
                   "lut_drift_median": statistics.median(drift) if drift else None,
                   "lut_drift_range": [min(drift), max(drift)] if drift else None}
    full = [sn.space.complete(a) for a in archs]
    st["accuracy"] = {}
    for name, plan in plans.items():
        predictor = LatencyPredictor.from_store(plan, lut, target)
        pred = [predictor.predict(a) for a in full]
        st["accuracy"][name] = accuracy(pred, measured)
        if name == "fused":
            st["examples"] = [{"arch": k, "measured_ms": measured[k], "predicted_ms": pred[k]} for k in (0, 1)]
            st["predicted"] = pred
            if hot_target is not None:
                aware = CacheAwarePredictor(predictor, LatencyPredictor.from_store(plan, lut, hot_target),
                                            CostModel(plan), cache_bytes())
                st["accuracy"]["fused-cache-aware"] = accuracy([aware.predict(a) for a in full], measured)
    st["measured"] = measured
    baselines(st, sn, fused, lut, target, full, measured)
    speed(st, sn, fused, lut, target)
    state.save()
    lut.close()


def baselines(st: dict, sn, plan: KernelPlan, lut: LutStore, target: Target, archs: list, measured: list) -> None:
    """FLOPs-linear and learning-based kernel predictors on the held-out half, by profiling budget."""
    half = len(archs) // 2
    train_ids, test_ids = list(range(2, half)), list(range(half, len(archs)))
    costs = CostModel(plan)
    macs = [costs.costs(a).macs for a in archs]
    lf_pred = [st["predicted"][i] for i in test_ids]
    test_meas = [measured[i] for i in test_ids]
    out = {"held_out": len(test_ids), "learning_free": accuracy(lf_pred, test_meas),
           "learning_free_profile_seconds": st["profile_seconds"]["fused"]}
    per_kernel_s = st["profile_seconds"]["fused"] / max(1, len(plan.kernels))
    entries = lut.get(target, [k.signature for k in plan.kernels] + ["overhead"])
    kernel_ms = [entries[k.signature].median_ms for k in plan.kernels]
    features = [_kernel_features(plan, k) for k in plan.kernels]
    flops, learned = [], []
    for n in BUDGETS:
        ids = train_ids[:n]
        if len(ids) < n:
            break
        # FLOPs-linear: fit on n measured SubNets; it cost their export and measurement time.
        a, b = np.polyfit([macs[i] for i in ids], [measured[i] for i in ids], 1)
        seconds = sum(st["subnets"][str(i)]["seconds"] / 2 for i in ids)
        flops.append({"subnets": n, "profile_seconds": seconds,
                      **accuracy([a * macs[i] + b for i in test_ids], test_meas)})
        # Learning-based: profile the kernels of n SubNets, learn kernel latency per kernel type.
        seen = sorted({k for i in ids for k in plan.kernel_ids(archs[i])})
        model = _fit_kernel_model(plan, seen, features, kernel_ms)
        pred_kernel = _predict_kernels(plan, model, features, kernel_ms, set(seen))
        pred = [entries["overhead"].median_ms + sum(pred_kernel[k] for k in plan.kernel_ids(archs[i]))
                for i in test_ids]
        learned.append({"subnets": n, "kernels": len(seen), "profile_seconds": len(seen) * per_kernel_s,
                        **accuracy(pred, test_meas)})
    out["flops_linear"], out["learning_based"] = flops, learned
    target_share = out["learning_free"]["within_10"]
    for key in ("flops_linear", "learning_based"):
        reached = [r for r in out[key] if r["within_10"] >= target_share]
        out[f"{key}_seconds_to_match"] = reached[0]["profile_seconds"] if reached else None
    st["baselines"] = out


def _kernel_features(plan: KernelPlan, kernel) -> list[float]:
    group = plan.groups[kernel.group]
    arch = {**plan.sn.space.max(), **dict(zip(group.variables, kernel.choices))}
    ins = [math.prod(plan.shapes.shape(i, arch)) for i in group.inputs] or [0]
    out = math.prod(plan.shapes.shape(group.outputs[0], arch))
    macs, params = kernel_costs(plan, kernel)
    ks = [arch[plan.by_name[n].kernel_var] for n in group.nodes if plan.by_name[n].kernel_var] or [0]
    first = plan.shapes.shape(group.inputs[0], arch) if group.inputs else (0,)
    return [math.log1p(macs), math.log1p(params), math.log1p(sum(ins)), math.log1p(out), ks[0],
            *(list(first[1:4]) + [0, 0, 0])[:3]]


def _fit_kernel_model(plan: KernelPlan, seen: list[int], features: list, kernel_ms: list) -> dict:
    by_type: dict[str, list[int]] = {}
    for k in seen:
        by_type.setdefault(plan.groups[plan.kernels[k].group].static, []).append(k)
    models = {}
    for kind, ks in by_type.items():
        if len(ks) >= 3:
            rf = RandomForestRegressor(n_estimators=50, random_state=0)
            rf.fit([features[k] for k in ks], [math.log(max(kernel_ms[k], 1e-4)) for k in ks])
            models[kind] = rf
    fallback = RandomForestRegressor(n_estimators=50, random_state=0)
    fallback.fit([features[k] for k in seen], [math.log(max(kernel_ms[k], 1e-4)) for k in seen])
    models[None] = fallback
    return models


def _predict_kernels(plan: KernelPlan, models: dict, features: list, kernel_ms: list, seen: set) -> list[float]:
    out = []
    for k, kernel in enumerate(plan.kernels):
        if k in seen:
            out.append(kernel_ms[k])  # profiled: the measurement itself
        else:
            model = models.get(plan.groups[kernel.group].static, models[None])
            out.append(math.exp(model.predict([features[k]])[0]))
    return out


def speed(st: dict, sn, plan: KernelPlan, lut: LutStore, target: Target) -> None:
    predictor = LatencyPredictor.from_store(plan, lut, target)
    costs = CostModel(plan)
    archs = [sn.space.complete(sn.space.sample(random.Random(i))) for i in range(10_000)]
    t = time.perf_counter()
    for a in archs:
        predictor.predict(a)
    latency_per_s = len(archs) / (time.perf_counter() - t)
    t = time.perf_counter()
    for a in archs[:2000]:
        costs.costs(a)
    st["speed"] = {"latency_predictions_per_s": latency_per_s,
                   "cost_predictions_per_s": 2000 / (time.perf_counter() - t)}


def report(state: State, args: argparse.Namespace) -> None:
    doc = {"machine": machine("torch", "onnxruntime", "ncnn", "pnnx"), "command": " ".join(["python", "benchmarks/latency_predictor.py", *sys.argv[1:]]),
           "results": state.data}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latency_predictor.json").write_text(json.dumps(doc, indent=1))
    m = doc["machine"]
    lines = ["# Latency predictor against measurement", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; onnxruntime {m['onnxruntime']}, ncnn {m['ncnn']}, pnnx "
             f"{m['pnnx']}, torch {m['torch']}. 1 thread. Command: `{doc['command']}`.", "",
             "| model | backend | unique kernels (fused / no fusion / block) | enumeration s | LUT build s (fused) | "
             "SubNets | within 10% | within 5% | MAPE | Kendall tau | no fusion: within 10%, MAPE | "
             "block: within 10%, MAPE | cache-aware: within 10%, MAPE | noise: passes within 5% | predictions/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, per in state.data.items():
        for backend, st in per.items():
            if "accuracy" not in st:
                continue
            e, a = st["enumeration"], st["accuracy"]
            f, nf, bl = a["fused"], a["no-fusion"], a["block"]
            lines.append(
                f"| {model} | {backend} | {e['fused']['kernels']} / {e['no-fusion']['kernels']} / "
                f"{e['block']['kernels']} | {e['fused']['seconds']:.2f} | {st['profile_seconds']['fused']:.0f} | "
                f"{f['n']} | {100 * f['within_10']:.1f}% | {100 * f['within_5']:.1f}% | {100 * f['mape']:.1f}% | "
                f"{f['kendall_tau']:.3f} | {100 * nf['within_10']:.1f}%, {100 * nf['mape']:.1f}% | "
                f"{100 * bl['within_10']:.1f}%, {100 * bl['mape']:.1f}% | "
                + (f"{100 * a['fused-cache-aware']['within_10']:.1f}%, {100 * a['fused-cache-aware']['mape']:.1f}% | "
                   if "fused-cache-aware" in a else "- | ")
                + f"{100 * st['noise']['passes_within_5']:.1f}% | {st['speed']['latency_predictions_per_s']:.0f} |")
    lines += ["", "Baselines on the held-out SubNets (share within 10% / profiling seconds spent):", "",
              "| model | backend | learning-free | FLOPs-linear by n SubNets | learning-based by n SubNets' kernels | "
              "seconds to match: FLOPs / learned |", "|---|---|---|---|---|---|"]
    for model, per in state.data.items():
        for backend, st in per.items():
            b = st.get("baselines")
            if not b:
                continue
            fl = ", ".join(f"{r['subnets']}: {100 * r['within_10']:.0f}% / {r['profile_seconds']:.0f}s"
                           for r in b["flops_linear"])
            lb = ", ".join(f"{r['subnets']}: {100 * r['within_10']:.0f}% / {r['profile_seconds']:.0f}s"
                           for r in b["learning_based"])
            match = " / ".join("not reached" if b[f"{k}_seconds_to_match"] is None else
                               f"{b[f'{k}_seconds_to_match']:.0f}s" for k in ("flops_linear", "learning_based"))
            lines.append(f"| {model} | {backend} | {100 * b['learning_free']['within_10']:.0f}% / "
                         f"{b['learning_free_profile_seconds']:.0f}s | {fl} | {lb} | {match} |")
    (RESULTS / "latency_predictor.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--backends", default=",".join(BACKENDS))
    p.add_argument("--subnets", type=int, default=200, help="random SubNets besides the smallest and largest")
    p.add_argument("--input-size", type=int, default=224, help="largest resolution (smaller for a quick check)")
    p.add_argument("--work", default=str(HERE / "work" / "latency_predictor"))
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    state = State(Path(args.work) / "state.json")
    if not args.report_only:
        for model in args.models.split(","):
            for backend in args.backends.split(","):
                run_pair(state, model, backend, args)
                report(state, args)
    report(state, args)


if __name__ == "__main__":
    main()
