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
   orders; the two passes agreeing bounds what this machine's noise allows. A reference
   SubNet, timed during the LUT build and just before each SubNet, gives the machine's speed
   at each moment (``Reference``);
4. prediction error against the faster of the two passes (a disturbance only ever slows a
   run down), and against their mean scaled to the speed the LUT was built at: share within
   +-5% and +-10%, mean absolute percentage error, Kendall tau; for the product's predictor
   (fused kernels, the model fitted to its calibration SubNets), and the plain sum of a LUT
   (the flushed one on ONNX Runtime) for fused kernels, no fusion and whole blocks: the
   fusion ablation compares sums with sums;
5. baselines on the held-out half of the SubNets: a FLOPs-linear model fitted on the first n
   measured SubNets, and a learning-based kernel predictor (one random forest per kernel
   type on the kernels' shapes and MACs, the nn-Meter / LitePred way) trained on the kernels
   of the first n SubNets and combined by the calibration's fitted model; each with the
   profiling time it cost (the learning-based one's includes the calibration), against the
   learning-free predictor's (LUT and calibration);
6. prediction speed (predictions per second, latency and counted costs).

State (LUTs, exported SubNets' timings) lives in ``--work`` so that the script resumes.
Results: ``benchmarks/results/latency_predictor.{json,md}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torchvision
from scipy.stats import kendalltau
from common import State, machine
from sklearn.ensemble import RandomForestRegressor

import autotailor as at
from autotailor.pipeline.workdir import device_setup
from autotailor.predict.latency import (CacheAwarePredictor, CacheModel, CostModel, KernelPlan, LatencyPredictor,
                                        fit_cache_model, make_backend, profile, spread_by_weight, subnet_key)
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


class Reference:
    """One SubNet, deployed once and timed again and again: the machine's speed at that moment.

    This VM's speed drifts by tens of percent over minutes (other tenants of the host), more
    than the predictor's error. Timing the reference during the LUT build and just before each
    SubNet gives a second view: measurements scaled to the speed the LUT was built at."""

    def __init__(self, backend_name: str, sn, arch: dict, folder: Path):
        self.backend = make_backend(backend_name, threads=1, warmup=3, repeats=20)
        shape = sn.input_shape(arch)
        path = self.backend.deploy(sn.extract(arch).eval(), folder / "reference", shape)
        self._run = self.backend.load(path, shape)

    def time(self) -> float:
        return self.backend.time(self._run).median_ms


def _predictor(plan: KernelPlan, cold_ms: list[float], hot_ms: list[float] | None, overhead: float,
               cache: CacheModel | None):
    """The product's predictor from kernel tables and the device's fitted model (a warm table
    where the backend flushes caches)."""
    cold = LatencyPredictor(plan, cold_ms, overhead)
    if cache is None:
        return cold
    hot = cold if hot_ms is None else LatencyPredictor(plan, hot_ms, overhead)
    return CacheAwarePredictor(cold, hot, CostModel(plan), cache)


def run_pair(state: State, model: str, backend_name: str, args: argparse.Namespace) -> None:
    st = state.section(model, backend_name)
    torch.manual_seed(0)
    sn = at.compile(well_conditioned(getattr(torchvision.models, model)()),
                    torch.zeros(1, 3, args.input_size, args.input_size))
    rng = random.Random(0)
    archs = [sn.space.max(), sn.space.min()] + [sn.space.sample(rng) for _ in range(args.subnets)]
    # The device as `autotailor profile` sets it up: backend, targets, and the warm LUT's backend
    # where the backend flushes caches.
    device = device_setup(sn, args.work, f"{backend_name}:threads=1", device_name="bench",
                          lut=Path(args.work) / "lut.sqlite")
    backend, target = device.backend, device.target
    lut = device.open_store()
    folder = Path(args.work) / f"{model}-{backend_name}"
    folder.mkdir(exist_ok=True)
    reference = Reference(backend_name, sn, archs[2], folder)
    if st.get("lut_target") != target.settings_key:  # LUTs timed another way are built again
        st["lut_target"], st["profile_seconds"], st["reference_during_lut"] = target.settings_key, {}, []
    lut_refs = st["reference_during_lut"]

    def progress(label: str) -> Callable[[int, int], None]:
        def on_kernel(done: int, total: int) -> None:
            print(f"\r{model} {backend_name} {label}: {done}/{total}", end="", flush=True)
            if done % 100 == 0 or done == total:
                lut_refs.append(reference.time())
        return on_kernel

    plans = {}
    for name, (rules, granularity) in VARIANTS.items():
        plan = KernelPlan(sn, rules or backend_name, granularity)
        plans[name] = plan
        st.setdefault("enumeration", {})[name] = {"kernels": len(plan.kernels), "groups": len(plan.groups),
                                                  "seconds": plan.seconds}
        report = profile(plan, backend, lut, target, progress(name))
        seconds = st.setdefault("profile_seconds", {})
        seconds[name] = seconds.get(name, 0.0) + report.seconds
        print(f"\n{model} {backend_name} {name}: {len(plan.kernels)} kernels, LUT built in "
              f"{st['profile_seconds'][name]:.0f} s", flush=True)
        state.save()
    fused = plans["fused"]
    assert fused.kernels == device.plan.kernels
    if device.hot_target is not None:  # the warm LUT of the cache-aware predictor (see CacheAwarePredictor)
        report = profile(fused, device.hot_backend, lut, device.hot_target, progress("fused, caches warm"))
        st["profile_seconds"]["fused-warm"] = st["profile_seconds"].get("fused-warm", 0.0) + report.seconds
        print()
        state.save()
    timings = st.setdefault("subnets", {})
    with tempfile.TemporaryDirectory() as tmp:
        for pass_ in (0, 1):
            order = list(range(len(archs))) if pass_ == 0 else list(reversed(range(len(archs))))
            for j, i in enumerate(order):
                rec = timings.setdefault(str(i), {})
                if f"pass{pass_}" in rec:
                    continue
                started = time.perf_counter()
                shape = sn.input_shape(archs[i])
                path = backend.deploy(sn.extract(archs[i]).eval(), Path(tmp) / f"subnet{i}", shape)
                run = backend.load(path, shape)
                rec[f"reference{pass_}"] = reference.time()  # the machine's speed right now
                rec[f"pass{pass_}"] = backend.time(run).median_ms
                rec["seconds"] = rec.get("seconds", 0.0) + time.perf_counter() - started
                state.save()
                print(f"\r{model} {backend_name} pass {pass_}: {j + 1}/{len(archs)} "
                      f"(reference {rec[f'reference{pass_}']:.2f} ms)", end="", flush=True)
    print()
    recs = [timings[str(i)] for i in range(len(archs))]
    # Scale every timing to the speed the LUT was built at (the reference's median then).
    ref_lut = statistics.median(lut_refs or [r[f"reference{p}"] for r in recs for p in (0, 1)])
    scaled = [[r[f"pass{p}"] * ref_lut / r[f"reference{p}"] for p in (0, 1)] for r in recs]
    raw = [[r["pass0"], r["pass1"]] for r in recs]
    # Another tenant of the host or the other core only ever slows a run down: the faster of
    # two timings is the nearer to the undisturbed speed, which the LUT's medians of many
    # short runs see (and which the product's calibration keeps too). The mean of the timings
    # scaled by the reference is the second view: it divides by a timing as noisy as its own.
    measured = [min(t) for t in raw]
    measured_scaled = [statistics.mean(t) for t in scaled]
    refs = [r[f"reference{p}"] / ref_lut for r in recs for p in (0, 1)]

    def agreement(pairs: list[list[float]]) -> dict:
        diff = [b / a - 1 for a, b in pairs]
        return {"within_5": sum(abs(d) <= 0.05 for d in diff) / len(diff),
                "within_10": sum(abs(d) <= 0.10 for d in diff) / len(diff),
                "median_abs_difference": statistics.median(abs(d) for d in diff)}

    st["noise"] = {"passes": agreement(scaled), "passes_raw": agreement(raw),
                   "reference_speed_range": [min(refs), max(refs)],
                   "reference_during_lut_range": [min(lut_refs) / ref_lut, max(lut_refs) / ref_lut] if lut_refs else None}
    full = [sn.space.complete(a) for a in archs]
    # The product's predictor, as `autotailor profile` leaves it: its cache model fitted to
    # calibration SubNets (drawn with their own seed: not among the SubNets measured here).
    started = time.perf_counter()
    if device.calibrate():
        st["calibration_seconds"] = time.perf_counter() - started
    product = device.predictor()
    aware = isinstance(product, CacheAwarePredictor)
    cold = product.cold if aware else product
    cache = product.cache if aware else None
    two_tables = aware and product.hot is not product.cold
    # JSON has no infinity: no streaming term is stream_bytes None
    st["cache_model"] = {k: (None if v == math.inf else v) for k, v in dataclasses.asdict(cache).items()} if cache else None
    st["cache_model_text"] = product.describe() if aware else None
    st["accuracy"], st["accuracy_scaled"] = {}, {}
    predictors = {"fused": product, "fused-sum": cold}
    if aware:
        # The same model fitted to the measured SubNets themselves (in sample): how far a model
        # of this form gets on these timings, whatever the calibration SubNets say.
        costs = CostModel(fused)
        ceiling = fit_cache_model(cold, product.hot, costs, full, measured, device.cache_bytes)
        predictors["fused-fitted-to-all"] = CacheAwarePredictor(cold, product.hot, costs, ceiling)
        st["calibration_draws"] = calibration_draws(cold, product.hot, costs, full, measured, device.cache_bytes)
    for name in ("no-fusion", "block"):
        predictors[name] = LatencyPredictor.from_store(plans[name], lut, target)
    for name, predictor in predictors.items():
        pred = [predictor.predict(a) for a in full]
        st["accuracy"][name] = accuracy(pred, measured)
        st["accuracy_scaled"][name] = accuracy(pred, measured_scaled)
        if name == "fused":
            st["predicted"] = pred
            st["examples"] = [{"arch": k, "measured_ms": measured[k], "predicted_ms": pred[k]} for k in (0, 1)]
            # Where the machine let two timings of a SubNet agree within 5 %, the measurement
            # itself can tell a 10 % error: the predictor's accuracy on those alone.
            stable = [i for i, (a, b) in enumerate(raw) if abs(b / a - 1) <= 0.05]
            st["accuracy"]["fused-stable"] = accuracy([pred[i] for i in stable], [measured[i] for i in stable])
    st["measured"], st["measured_scaled"] = measured, measured_scaled
    baselines(st, fused, (cold.kernel_ms, product.hot.kernel_ms if two_tables else None, cold.overhead_ms, cache),
              full, measured)
    speed(st, sn, fused, product)
    state.save()
    lut.close()


def calibration_draws(cold, hot, costs: CostModel, archs: list, measured: list[float], cache_bytes: int,
                      sizes: tuple[int, ...] = (12, 20), draws: int = 30) -> dict:
    """How many calibration SubNets the fit needs, from the measured SubNets alone: ``draws``
    times, n of them are picked the way the calibration picks its own (quantiles by weights of
    a random sample, here of 120), the model is fitted to those and scored on all of them."""
    rng = random.Random(0)
    index = {subnet_key(a): i for i, a in enumerate(archs)}
    out = {}
    for n in sizes:
        shares = []
        for _ in range(draws):
            picked = spread_by_weight(rng.sample(archs, min(120, len(archs))), costs, n)
            model = fit_cache_model(cold, hot, costs, picked, [measured[index[subnet_key(a)]] for a in picked],
                                    cache_bytes)
            predictor = CacheAwarePredictor(cold, hot, costs, model)
            shares.append(accuracy([predictor.predict(a) for a in archs], measured)["within_10"])
        out[str(n)] = {"draws": draws, "median_within_10": statistics.median(shares),
                       "draws_reaching_95": sum(x >= 0.95 for x in shares) / draws}
    return out


def baselines(st: dict, plan: KernelPlan, tables: tuple, archs: list, measured: list) -> None:
    """FLOPs-linear and learning-based kernel predictors on the held-out half, by profiling budget."""
    cold_ms, hot_ms, overhead, cache = tables
    half = len(archs) // 2
    train_ids, test_ids = list(range(2, half)), list(range(half, len(archs)))
    costs = CostModel(plan)
    macs = [costs.costs(a).macs for a in archs]
    lf_pred = [st["predicted"][i] for i in test_ids]
    test_meas = [measured[i] for i in test_ids]
    lut_seconds = st["profile_seconds"]["fused"] + st["profile_seconds"].get("fused-warm", 0.0)
    out = {"held_out": len(test_ids), "learning_free": accuracy(lf_pred, test_meas),
           "learning_free_profile_seconds": lut_seconds + st.get("calibration_seconds", 0.0)}
    per_kernel_s = lut_seconds / max(1, len(plan.kernels))
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
        # Learning-based: profile the kernels of n SubNets (both cache states, as the LUT), learn
        # kernel latency per kernel type, combine the tables as the product does.
        seen = sorted({k for i in ids for k in plan.kernel_ids(archs[i])})
        learned_tables = [_predict_kernels(plan, _fit_kernel_model(plan, seen, features, ms), features, ms, set(seen))
                          for ms in (cold_ms, hot_ms) if ms is not None]
        predictor = _predictor(plan, learned_tables[0], learned_tables[1] if hot_ms is not None else None, overhead,
                               cache)
        # It uses the calibration's fitted model too, so it pays for the calibration as well.
        learned.append({"subnets": n, "kernels": len(seen),
                        "profile_seconds": len(seen) * per_kernel_s + st.get("calibration_seconds", 0.0),
                        **accuracy([predictor.predict(archs[i]) for i in test_ids], test_meas)})
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


def speed(st: dict, sn, plan: KernelPlan, predictor) -> None:
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
    doc = {"machine": machine("torch", "onnxruntime", "ncnn", "pnnx"),
           "command": " ".join(["python", "benchmarks/latency_predictor.py",
                                *(a for i, a in enumerate(sys.argv[1:]) if "--note" not in sys.argv[i:i + 2])]),
           "note": args.note,
           "results": state.data}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latency_predictor.json").write_text(json.dumps(doc, indent=1))
    m = doc["machine"]
    lines = ["# Latency predictor against measurement", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; onnxruntime {m['onnxruntime']}, ncnn {m['ncnn']}, pnnx "
             f"{m['pnnx']}, torch {m['torch']}. 1 thread. Command: `{doc['command']}`."
             + (f" {args.note}" if args.note else ""), "",
             "The predictor is the product's: fused kernels, the model fitted to 20 calibration SubNets "
             "(cache-aware where the backend flushes caches: ONNX Runtime). Each SubNet is "
             "timed twice, in two passes in opposite orders; it is compared with the faster timing (scaled: with the mean "
             "of both scaled to the speed the LUT was built at, by a reference SubNet timed just before each). "
             "LUT sums: the plain sum of the kernels' LUT entries (the flushed LUT on ONNX Runtime), without the fitted "
             "model, for fused kernels, without fusion and for whole blocks (the fusion ablation). Draws: 30 times, 12 "
             "(or 20) of the measured SubNets are picked as the calibration picks its own, the model is fitted to them "
             "and scored on all; the share of draws reaching 95 % within 10 %.", "",
             "| model | backend | unique kernels (fused / no fusion / block) | enumeration s | LUT build s | "
             "model fitted to 20 calibration SubNets | SubNets | within 10% | within 10%, SubNets whose two timings agree within 5% | within 10%, model fitted to all the SubNets | draws of 12 / 20 calibration SubNets reaching 95% within 10% | within 5% | MAPE | Kendall tau | LUT sum, fused: within 10%, MAPE | "
             "LUT sum, no fusion | LUT sum, blocks | noise: two passes within 5% | "
             "reference speed range | predictions/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, per in state.data.items():
        for backend, st in per.items():
            if "fused-sum" not in st.get("accuracy", {}):  # not measured yet, or by an earlier version
                continue
            e, a, scaled, noise = st["enumeration"], st["accuracy"], st["accuracy_scaled"], st["noise"]
            f = a["fused"]
            plain = a["fused-sum"]
            lut_s = st["profile_seconds"]["fused"]
            warm = st["profile_seconds"].get("fused-warm")
            calibration = st.get("calibration_seconds")
            lines.append(
                f"| {model} | {backend} | {e['fused']['kernels']} / {e['no-fusion']['kernels']} / "
                f"{e['block']['kernels']} | {e['fused']['seconds']:.2f} | {lut_s:.0f}"
                + (f" + {warm:.0f} warm" if warm is not None else "")
                + (f" + {calibration:.0f} calibration" if calibration else "") + " | "
                + f"{st.get('cache_model_text') or '-'} | "
                + f"{f['n']} | "
                f"{100 * f['within_10']:.1f}% ({100 * scaled['fused']['within_10']:.0f}% scaled) | "
                + f"{100 * a['fused-stable']['within_10']:.1f}% of {a['fused-stable']['n']} | "
                + (f"{100 * a['fused-fitted-to-all']['within_10']:.1f}% | " if "fused-fitted-to-all" in a else "- | ")
                + (" / ".join(f"{100 * d['draws_reaching_95']:.0f}%" for d in st["calibration_draws"].values()) + " | "
                   if "calibration_draws" in st else "- | ")
                + f"{100 * f['within_5']:.1f}% | "
                f"{100 * f['mape']:.1f}% | {f['kendall_tau']:.3f} | "
                + f"{100 * plain['within_10']:.1f}%, {100 * plain['mape']:.1f}% | "
                + f"{100 * a['no-fusion']['within_10']:.1f}%, {100 * a['no-fusion']['mape']:.1f}% | "
                f"{100 * a['block']['within_10']:.1f}%, {100 * a['block']['mape']:.1f}% | "
                f"{100 * noise['passes_raw']['within_5']:.0f}% ({100 * noise['passes']['within_5']:.0f}% scaled) | "
                f"{noise['reference_speed_range'][0]:.2f}-{noise['reference_speed_range'][1]:.2f}x | "
                f"{st['speed']['latency_predictions_per_s']:.0f} |")
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
    p.add_argument("--note", default="", help="how the run went, for the report")
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
