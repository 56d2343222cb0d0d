"""Learning-free latency prediction against measurement, with a fusion ablation and two baselines.

Reproduce (from the repository root, after `make install`, on an otherwise idle machine;
several hours for everything, resumable)::

    .venv/bin/python benchmarks/latency_predictor.py
    .venv/bin/python benchmarks/latency_predictor.py --models mobilenet_v2,resnet50 --backends openvino --variants fused
    .venv/bin/python benchmarks/latency_predictor.py --report-only

For each model (torchvision by name, or any model spec such as ``timm:deit_tiny_patch16_224``;
random weights made well-conditioned, default space, 224 px) and
backend (``--backends``: ONNX Runtime CPU and NCNN by default, OpenVINO too, each optionally
with settings of its own, e.g. ``ort-cpu:precision=int8``; 1 thread):

1. enumeration of the unique kernels for each granularity in ``--variants`` (fused kernels,
   operators without fusion, whole blocks): count and time;
2. LUT build (``profile``, the product's paired design) per granularity, timed; the fused LUT
   is built first and alone, so its time is the real cost of a new device; then the product's
   calibration (22 SubNets);
3. ``--subnets`` random SubNets plus the smallest and the largest, each exported with the
   backend's deploy path and measured twice by the product's paired timing
   (``DeviceSetup.time_deployed``: two passes in opposite orders, each timing read with the
   reference kernel around it). Each measurement is brought to the machine speed of the LUT
   and the two are averaged; how often the two agree within 5 % is the noise floor;
4. prediction error against that (and, as the ablation, against the faster timing as timed):
   share within +-5% and +-10%, mean bias, mean absolute percentage error, Kendall tau; for
   the product's predictor (fused kernels, the model fitted to its calibration SubNets), and
   the plain sum of a LUT (the flushed one on ONNX Runtime) for each granularity;
5. baselines on the held-out half of the SubNets: a FLOPs-linear model fitted on the first n
   measured SubNets, and a learning-based kernel predictor (one random forest per kernel
   type on the kernels' shapes and MACs, the nn-Meter / LitePred way) trained on the kernels
   of the first n SubNets and combined by the calibration's fitted model; each with the
   profiling time it cost (the learning-based one's includes the calibration), against the
   learning-free predictor's (LUT and calibration);
6. prediction speed (predictions per second, latency and counted costs).

State lives in ``--work`` so that the script resumes; when it is missing, the pairs already in
``benchmarks/results/latency_predictor.json`` are kept (each pair records its machine, commit
and time), so pairs measured in different sessions add up. ``--again`` measures the named pairs
anew (with a fresh ``--work``, their LUT too), e.g. on an idle machine::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/latency_predictor.py --models mobilenet_v2 \
        --backends ort-cpu,ncnn --variants fused --again --work benchmarks/work/latency_idle
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
from scipy.stats import kendalltau
from common import State, head_commit, machine
from sklearn.ensemble import RandomForestRegressor

import autotailor as at
from autotailor.frontends import load_model
from autotailor.pipeline.workdir import device_setup
from autotailor.predict.latency import (CacheAwarePredictor, CacheModel, CostModel, KernelPlan, LatencyPredictor,
                                        fit_cache_model, parse_device, profile, spread_by_weight, subnet_key)
from autotailor.predict.latency.predictor import kernel_costs
from autotailor.testing import well_conditioned

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MODELS = ("resnet50", "mobilenet_v2", "mobilenet_v3_large", "convnext_tiny")
BACKENDS = ("ort-cpu", "ncnn")
# name -> (fusion rules, granularity); "fused" uses the backend's own rules
VARIANTS = {"fused": (None, "fused"), "no-fusion": ("none", "operator"), "block": (None, "block")}
BUDGETS = (2, 5, 10, 20, 50, 100)
CHUNK = 10  # SubNets exported and timed together, saved as they finish
DESIGN = "paired"  # SubNets timed by the product's paired design (results of earlier designs are not merged)


def accuracy(pred: list[float], meas: list[float]) -> dict:
    err = [p / m - 1 for p, m in zip(pred, meas)]
    return {"n": len(err), "within_5": sum(abs(e) <= 0.05 for e in err) / len(err),
            "within_10": sum(abs(e) <= 0.10 for e in err) / len(err),
            "mape": statistics.mean(abs(e) for e in err), "mean_error": statistics.mean(err),
            "kendall_tau": float(kendalltau(pred, meas).statistic)}


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
    # A bare name is torchvision's; any other model spec (timm:deit_tiny_patch16_224) is loaded as
    # `autotailor compile` loads it.
    sn = at.compile(well_conditioned(load_model(model if ":" in model else f"torchvision:{model}")),
                    torch.zeros(1, 3, args.input_size, args.input_size))
    rng = random.Random(0)
    archs = [sn.space.max(), sn.space.min()] + [sn.space.sample(rng) for _ in range(args.subnets)]
    # The device as `autotailor profile` sets it up: backend, targets, and the warm LUT's backend
    # where the backend flushes caches.
    # a backend may carry settings of its own (ort-cpu:precision=int8); 1 thread always
    spec = f"{backend_name},threads=1" if ":" in backend_name else f"{backend_name}:threads=1"
    device = device_setup(sn, args.work, spec, device_name="bench",
                          lut=Path(args.work) / "lut.sqlite")
    backend, target = device.backend, device.target
    lut = device.open_store()
    if st.get("lut_target") != target.settings_key:  # LUTs timed another way are built again
        st["lut_target"], st["profile_seconds"] = target.settings_key, {}

    def progress(label: str) -> Callable[[int, int], None]:
        def on_kernel(done: int, total: int) -> None:
            print(f"\r{model} {backend_name} {label}: {done}/{total}", end="", flush=True)
        return on_kernel

    plans = {}
    variants = ["fused", *(v for v in args.variants.split(",") if v != "fused")]
    for name in variants:
        rules, granularity = VARIANTS[name]
        plan = KernelPlan(sn, rules or parse_device(spec)[0], granularity)
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
    # Each SubNet is measured twice by the product's paired timing (``time_deployed``: two
    # passes in opposite orders, each timing paired with the reference kernel), in chunks
    # that are saved as they finish.
    timings = st.setdefault("subnets", {})
    todo = [i for i in range(len(archs)) if str(i) not in timings]
    for start in range(0, len(todo), CHUNK):
        chunk = todo[start:start + CHUNK]
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            files = [(backend.deploy(sn.extract(archs[i]).eval(), Path(tmp) / f"subnet{i}", sn.input_shape(archs[i])),
                      sn.input_shape(archs[i])) for i in chunk]
            runs = [device.time_deployed(files) for _ in range(2)]
        seconds = (time.perf_counter() - started) / len(chunk)
        for k, i in enumerate(chunk):
            timings[str(i)] = {"timings": [[r[k].median_ms, r[k].reference_ms] for r in runs], "seconds": seconds}
        state.save()
        print(f"\r{model} {backend_name} SubNets: {len(archs) - len(todo) + start + len(chunk)}/{len(archs)}",
              end="", flush=True)
    print()
    recs = [timings[str(i)]["timings"] for i in range(len(archs))]
    speed_now = device.speed()
    ref_lut = speed_now.median_ms
    # Paired: each measurement brought to the machine speed of the LUT (the reference kernel's
    # median reading while its kernels were profiled), the two averaged. As timed: the faster
    # of the two, unscaled (a disturbance only ever slows a run down).
    paired = [[ms * ref_lut / ref for ms, ref in t] for t in recs]
    measured = [statistics.mean(t) for t in paired]
    measured_raw = [min(ms for ms, _ in t) for t in recs]
    refs = [ref / ref_lut for t in recs for _, ref in t]

    def agreement(pairs: list[list[float]]) -> dict:
        diff = [b / a - 1 for a, b in pairs]
        return {"within_5": sum(abs(d) <= 0.05 for d in diff) / len(diff),
                "within_10": sum(abs(d) <= 0.10 for d in diff) / len(diff),
                "median_abs_difference": statistics.median(abs(d) for d in diff)}

    st["noise"] = {"measurements": agreement(paired), "measurements_raw": agreement([[a for a, _ in t] for t in recs]),
                   "reference_speed_range": [min(refs), max(refs)], "lut_noise": speed_now.noise,
                   "lut_reference_10_90": [speed_now.low, speed_now.high]}
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
    st["accuracy"], st["accuracy_raw"] = {}, {}
    predictors = {"fused": product, "fused-sum": cold}
    if aware:
        # The same model fitted to the measured SubNets themselves (in sample): how far a model
        # of this form gets on these timings, whatever the calibration SubNets say.
        costs = CostModel(fused)
        ceiling = fit_cache_model(cold, product.hot, costs, full, measured, device.cache_bytes)
        predictors["fused-fitted-to-all"] = CacheAwarePredictor(cold, product.hot, costs, ceiling)
        st["calibration_draws"] = calibration_draws(cold, product.hot, costs, full, measured, device.cache_bytes)
    for name in variants[1:]:
        predictors[name] = LatencyPredictor.from_store(plans[name], lut, target)
    for name, predictor in predictors.items():
        pred = [predictor.predict(a) for a in full]
        st["accuracy"][name] = accuracy(pred, measured)
        st["accuracy_raw"][name] = accuracy(pred, measured_raw)
        if name == "fused":
            st["predicted"] = pred
            st["examples"] = [{"arch": k, "measured_ms": measured[k], "predicted_ms": pred[k]} for k in (0, 1)]
            # Where the machine let two measurements of a SubNet agree within 5 %, the
            # measurement itself can tell a 10 % error: the predictor's accuracy on those alone.
            stable = [i for i, (a, b) in enumerate(paired) if abs(b / a - 1) <= 0.05]
            st["accuracy"]["fused-stable"] = accuracy([pred[i] for i in stable], [measured[i] for i in stable])
    st["measured"], st["measured_raw"] = measured, measured_raw
    st["measured_at"] = {"time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": head_commit(),
                         "machine": machine("torch", "onnxruntime", "ncnn", "pnnx", "openvino")}
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
        seconds = sum(st["subnets"][str(i)]["seconds"] / 2 for i in ids)  # one paired measurement each
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


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def report(state: State, args: argparse.Namespace) -> None:
    doc = {"design": DESIGN, "machine": machine("torch", "onnxruntime", "ncnn", "pnnx", "openvino"),
           "command": " ".join(["python", "benchmarks/latency_predictor.py",
                                *(a for i, a in enumerate(sys.argv[1:]) if "--note" not in sys.argv[i:i + 2])]),
           "note": args.note,
           "results": state.data}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latency_predictor.json").write_text(json.dumps(doc, indent=1))
    lines = ["# Latency predictor against measurement", "",
             f"Command of the last run: `{doc['command']}`." + (f" {args.note}" if args.note else ""), "",
             "The predictor is the product's: fused kernels, profiled with the paired design, the model fitted to the "
             "22 calibration SubNets (cache-aware where the backend flushes caches: ONNX Runtime). Every SubNet is "
             "measured twice by the product's paired timing, each measurement brought to the machine speed of the "
             "LUT by the reference kernel; the two are averaged. Noise floor: the share of SubNets whose two "
             "measurements agree within 5 %, and their median difference. Stable: the SubNets whose two measurements "
             "agree within 5 %. As timed: against the faster timing, not brought to one speed (the ablation). "
             "LUT sums: the plain sum of the kernels' LUT entries (the flushed LUT on ONNX Runtime), without the "
             "fitted model, per granularity (the fusion ablation). Draws: 30 times, 12 (or 20) of the measured SubNets "
             "are picked as the calibration picks its own, the model is fitted to them and scored on all; the share "
             "of draws reaching 95 % within 10 %.", "",
             "| model | backend | measured | unique kernels (fused / no fusion / block) | LUT build s | LUT noise | "
             "fitted model | SubNets | within 10% | within 5% | bias | MAPE | Kendall tau | within 10%, stable | "
             "within 10%, model fitted to all | draws of 12 / 20 reaching 95% | within 10%, as timed | "
             "LUT sum fused / no fusion / blocks: within 10% | noise floor: two measurements within 5%, median "
             "difference | reference readings while measuring | predictions/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, per in state.data.items():
        for backend, st in per.items():
            if "fused-sum" not in st.get("accuracy", {}):  # not measured yet
                continue
            e, a, noise = st["enumeration"], st["accuracy"], st["noise"]
            f = a["fused"]
            m = st["measured_at"]
            warm = st["profile_seconds"].get("fused-warm")
            calibration = st.get("calibration_seconds")
            kernels = " / ".join(str(e[v]["kernels"]) if v in e else "-" for v in VARIANTS)
            sums = " / ".join(_pct(a[v]["within_10"]) if v in a else "-" for v in ("fused-sum", "no-fusion", "block"))
            lines.append(
                f"| {model} | {backend} | {m['time']}, {m['commit']}, {m['machine']['cpu']} | {kernels} | "
                f"{st['profile_seconds']['fused']:.0f}" + (f" + {warm:.0f} warm" if warm is not None else "")
                + (f" + {calibration:.0f} calibration" if calibration else "")
                + f" | ±{100 * noise['lut_noise']:.1f}% | {st.get('cache_model_text') or '-'} | {f['n']} | "
                f"{_pct(f['within_10'])} | {_pct(f['within_5'])} | {100 * f['mean_error']:+.1f}% | "
                f"{_pct(f['mape'])} | {f['kendall_tau']:.3f} | "
                f"{_pct(a['fused-stable']['within_10'])} of {a['fused-stable']['n']} | "
                f"{_pct(a['fused-fitted-to-all']['within_10']) if 'fused-fitted-to-all' in a else '-'} | "
                + (" / ".join(f"{100 * d['draws_reaching_95']:.0f}%" for d in st["calibration_draws"].values())
                   if "calibration_draws" in st else "-")
                + f" | {_pct(st['accuracy_raw']['fused']['within_10'])} | {sums} | "
                f"{_pct(noise['measurements']['within_5'])}, {_pct(noise['measurements']['median_abs_difference'])} | "
                f"{noise['reference_speed_range'][0]:.2f}-{noise['reference_speed_range'][1]:.2f}x | "
                f"{st['speed']['latency_predictions_per_s']:.0f} |")
    failed = [(model, backend, st["error"]) for model, per in state.data.items() for backend, st in per.items()
              if "error" in st and "fused-sum" not in st.get("accuracy", {})]
    if failed:
        lines += ["", "Pairs that do not run:", ""] + [f"- {m} on {b}: {e}" for m, b, e in failed]
    lines += ["", "Baselines on the held-out SubNets (share within 10% / profiling seconds spent):", "",
              "| model | backend | learning-free | FLOPs-linear by n SubNets | learning-based by n SubNets' kernels | "
              "seconds to match: FLOPs / learned |", "|---|---|---|---|---|---|"]
    for model, per in state.data.items():
        for backend, st in per.items():
            b = st.get("baselines")
            if not b or "fused-sum" not in st.get("accuracy", {}):
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
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="granularities to profile besides the product's fused kernels (the fusion ablation)")
    p.add_argument("--work", default=str(HERE / "work" / "latency_predictor"))
    p.add_argument("--again", action="store_true",
                   help="measure the named pairs again (their results so far are replaced when they finish)")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--note", default="", help="how the run went, for the report")
    args = p.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    state = State(Path(args.work) / "state.json")
    committed = RESULTS / "latency_predictor.json"
    if not state.data and committed.is_file():  # pairs measured in an earlier session
        doc = json.loads(committed.read_text())
        if doc.get("design") == DESIGN:
            state.data = doc["results"]
    if not args.report_only:
        for model in args.models.split(","):
            for backend in args.backends.split(","):
                if args.again and state.get(model, backend, "accuracy") is not None:
                    state.data[model][backend] = {}  # a fresh --work holds no timings of it either
                try:
                    run_pair(state, model, backend, args)
                    state.section(model, backend).pop("error", None)
                except at.AutoTailorError as exc:  # a model the runtime cannot take is a result
                    state.section(model, backend)["error"] = str(exc)
                    state.save()
                    print(f"\n{model} {backend}: {exc}", flush=True)
                report(state, args)
    report(state, args)


if __name__ == "__main__":
    main()
