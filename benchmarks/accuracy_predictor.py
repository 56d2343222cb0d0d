"""Ranking quality of the sensitivity accuracy predictor against Once-for-All's MLP predictor.

Reproduce (from the repository root, after `make install` and benchmarks/tune_cifar10.py,
whose tuned SuperNets it reads; about 2.5 hours per model on one core, resumable)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/accuracy_predictor.py --models mobilenet_v2
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/accuracy_predictor.py --models resnet18
    .venv/bin/python benchmarks/accuracy_predictor.py --report-only

On two cores, the random SubNets can be shared by two processes (``taskset -c 0 ... --shard
0/2`` and ``taskset -c 1 ... --shard 1/2``) once the sensitivity table is built; the
unsharded run then only writes the results.

For each tuned CIFAR-10 SuperNet:

1. a fixed validation subset (``--validation-images`` CIFAR-10 test images: all 10,000 by
   default, else a seeded random sample) and ``--calibration-batches`` training batches to
   recalibrate BatchNorm for every SubNet;
2. the sensitivity table (one evaluation per single modification, plus the largest SubNet),
   timed: that is the predictor's whole build cost;
3. a pool of ``--pool`` random SubNets (seeded), each evaluated: the ground truth;
4. further random SubNets, disjoint from the pool, to train the MLP on: k B of them for each
   multiple k of ``--mlp-budgets``, where B is the sensitivity build's number of evaluations
   (k = 1: equal budget);
5. ranking quality on the pool: Kendall tau, and the paper's top-5 ranking accuracy (100
   groups of 200 drawn from the pool; a group counts when the predicted best is among its
   true top 5), for the sensitivity predictor and the MLP at each budget. The MLP's figures
   are the mean over ``--mlp-seeds`` training seeds (its argmax is unstable from one seed to
   the next); the smallest budget whose mean top-5 reaches the sensitivity predictor's gives
   the build-cost ratio.

A ``--work`` whose evaluations were made with other settings (validation images,
calibration batches) is refused rather than mixed.

Every evaluation is kept in ``benchmarks/work/accuracy_predictor/state.json`` as it finishes.
Results: ``benchmarks/results/accuracy_predictor.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from common import State, machine, write_results
from scipy.stats import kendalltau

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))  # cifar_models, for SuperNets compiled from it


def top5_accuracy(pred: np.ndarray, truth: np.ndarray, groups: int, size: int, seed: int = 0) -> float:
    """Share of random groups whose predicted best SubNet is among the group's true top 5."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(groups):
        idx = rng.choice(len(truth), size=min(size, len(truth)), replace=False)
        best = idx[int(np.argmax(pred[idx]))]
        top5 = set(idx[np.argsort(-truth[idx], kind="stable")[:5]].tolist())
        hits += best in top5
    return hits / groups


def evaluate_all(sn, archs: list[dict], data, store: State, key: tuple[str, ...], label: str,
                 shard: tuple[int, int] = (0, 1)) -> list[float] | None:
    """Each arch's accuracy, evaluated unless stored. With ``shard`` (k, n) only the archs
    whose index is k mod n are evaluated, and None is returned: n processes share the work."""
    from autotailor.tune import evaluate

    k, n = shard
    for i, arch in enumerate(archs):
        if i % n != k or str(i) in (store.get(*key) or {}):
            continue
        started = time.perf_counter()
        acc = evaluate(sn, arch, data.val, data.calibration)
        store.put({"accuracy": acc, "seconds": time.perf_counter() - started}, *key, str(i))
        if (i + 1) % 25 == 0:
            print(f"  {label}: {i + 1}/{len(archs)}", flush=True)
    if n > 1:
        return None
    done = store.get(*key)
    return [done[str(i)]["accuracy"] for i in range(len(archs))]


def run_model(name: str, args: argparse.Namespace, store: State) -> dict | None:
    import autotailor as at
    from autotailor.pipeline.workdir import EvalSettings, eval_data
    from autotailor.predict.accuracy import MlpPredictor, MlpSettings, SensitivityPredictor, measure_sensitivity

    work = Path(args.tuned) / name
    sn = at.load(work / "supernet.pt")
    settings = EvalSettings(args.validation_images, args.calibration_batches, 128, 0)
    data = eval_data(args.data, sn.example_shape[-1], settings)
    out_dir = Path(args.work) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{name}: {sn.space.num_modifications} modifications, {data.images} validation images", flush=True)
    evaluation = {"validation_images": data.images, "calibration_batches": len(data.calibration),
                  "validation_sample_seed": data.sample_seed}
    if store.get(name, "evaluation") not in (None, evaluation):
        raise SystemExit(f"{args.work} holds {name} evaluations made with {store.get(name, 'evaluation')}, "
                         f"not {evaluation}: pass another --work or the same settings")
    store.put(evaluation, name, "evaluation")
    shard = args.shard
    if shard[1] > 1:  # the random SubNets only; an unsharded run builds the table and the results
        table = None
        budget = sn.space.num_modifications + 1
    else:
        table = measure_sensitivity(sn, data.val, data.calibration, out_dir / "sensitivity.json",
                                    info={"data": "cifar10", **data.describe()})
        budget = len(table.deltas) + 1
    rng = random.Random(1)
    pool = [sn.space.sample(rng) for _ in range(args.pool)]
    pool_acc = evaluate_all(sn, pool, data, store, (name, "pool"), "pool", shard)
    extra_rng = random.Random(2)
    multiples = [int(k) for k in args.mlp_budgets.split(",")]
    extra = [sn.space.sample(extra_rng) for _ in range(max(multiples) * budget)]
    extra_acc = evaluate_all(sn, extra, data, store, (name, "mlp_train"), "MLP training SubNets", shard)
    if table is None:
        return None
    truth = np.array(pool_acc)
    sens = SensitivityPredictor(sn.space, table)
    seconds_per_eval = statistics.median(v["seconds"] for v in store.get(name, "pool").values())
    results = {"modifications": len(table.deltas), "validation_images": data.images,
               "calibration_batches": len(data.calibration), "pool": len(pool),
               "seconds_per_evaluation": seconds_per_eval, "base_accuracy": table.base_accuracy,
               "pool_accuracy": {"min": float(truth.min()), "median": float(np.median(truth)),
                                 "max": float(truth.max())}}

    def quality(pred: np.ndarray, truth: np.ndarray = truth) -> dict:
        return {"kendall_tau": float(kendalltau(pred, truth).statistic),
                "top5": top5_accuracy(pred, truth, args.groups, args.group_size)}

    results["sensitivity"] = {"evaluations": budget, "build_seconds": table.seconds, **quality(sens.predict_many(pool)),
                              # the MLP's training SubNets: a second random set, unseen by the sensitivities
                              "second_set": {"subnets": len(extra),
                                             **quality(sens.predict_many(extra), np.array(extra_acc))}}
    results["mlp"] = []
    for k in multiples:
        n = k * budget
        runs, fits = [], []
        for seed in range(args.mlp_seeds):
            started = time.perf_counter()
            mlp = MlpPredictor(sn.space, MlpSettings(seed=seed)).fit(extra[:n], extra_acc[:n])
            fits.append(time.perf_counter() - started)
            runs.append(quality(mlp.predict_many(pool)))
        evals = sum(store.get(name, "mlp_train")[str(i)]["seconds"] for i in range(n))
        fit = statistics.mean(fits)
        results["mlp"].append({"evaluations": n, "budget_multiple": k, "build_seconds": evals + fit,
                               "fit_seconds": fit, "seeds": len(runs),
                               "kendall_tau": statistics.mean(r["kendall_tau"] for r in runs),
                               "top5": statistics.mean(r["top5"] for r in runs),
                               "top5_per_seed": [r["top5"] for r in runs]})
    target = results["sensitivity"]["top5"]
    match = next((m for m in results["mlp"] if m["top5"] >= target), None)
    results["mlp_matching_top5"] = match and {"budget_multiple": match["budget_multiple"],
                                              "cost_ratio": match["build_seconds"] / table.seconds}
    return results


def report(data: dict) -> str:
    lines = ["# Accuracy predictor: sensitivities vs Once-for-All's MLP", "",
             f"Command: `{data['command']}`. Evaluations ran one thread each (`OMP_NUM_THREADS=1`): per model "
             "`--models NAME`, its random SubNets shared by two `--shard K/2` processes, one per core, for resnet18.",
             "", f"Machine: {json.dumps(data['machine'])}", "",
             "A single modification's SubNet is nearly the largest, a random one is mid-sized: the "
             "sensitivity build's evaluations cost more each.", "",
             "| model | predictor | evaluations | build time (s) | s per evaluation | Kendall tau "
             "| top-5 ranking accuracy |",
             "|---|---|---|---|---|---|---|"]
    for name, r in data["models"].items():
        s = r["sensitivity"]
        lines.append(f"| {name} | sensitivity | {s['evaluations']} | {s['build_seconds']:.0f} | "
                     f"{s['build_seconds'] / s['evaluations']:.1f} | {s['kendall_tau']:.3f} | {100 * s['top5']:.0f} % |")
        for m in r["mlp"]:
            seeds = ", ".join(f"{100 * t:.0f}" for t in m.get("top5_per_seed", []))
            lines.append(f"| {name} | MLP ({m['budget_multiple']}x budget) | {m['evaluations']} | "
                         f"{m['build_seconds']:.0f} | {m['build_seconds'] / m['evaluations']:.1f} | "
                         f"{m['kendall_tau']:.3f} | {100 * m['top5']:.0f} %"
                         + (f" (seeds: {seeds})" if seeds else "") + " |")
    lines += ["", "Pool, validation subset and what an MLP needs to match:", ""]
    for name, r in data["models"].items():
        match = r["mlp_matching_top5"]
        lines.append(f"- {name}: {r['pool']} random SubNets on {r['validation_images']} test images "
                     f"({r['calibration_batches']} calibration batches each, median {r['seconds_per_evaluation']:.2f} s "
                     f"per evaluation); pool accuracy {100 * r['pool_accuracy']['min']:.1f}-"
                     f"{100 * r['pool_accuracy']['max']:.1f} % (median {100 * r['pool_accuracy']['median']:.1f}), "
                     f"largest {100 * r['base_accuracy']:.2f} %. "
                     + (f"The MLP matches the sensitivity predictor's top-5 accuracy at {match['budget_multiple']}x "
                        f"its evaluations, {match['cost_ratio']:.1f}x its build time."
                        if match else
                        f"No MLP budget tried matches the sensitivity predictor's top-5 accuracy; the largest "
                        f"({r['mlp'][-1]['budget_multiple']}x) took {r['mlp'][-1]['build_seconds'] / r['sensitivity']['build_seconds']:.1f}x "
                        f"its build time."))
        second = r["sensitivity"]["second_set"]
        lines.append(f"- {name}, sensitivity predictor on a second random set (the MLP's {second['subnets']} "
                     f"training SubNets, evaluated alike, groups drawn the same way): Kendall tau "
                     f"{second['kendall_tau']:.3f}, top-5 {100 * second['top5']:.0f} %.")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mobilenet_v2,resnet18")
    p.add_argument("--tuned", default=str(HERE / "work" / "tune_cifar10"), help="tune_cifar10.py's work directory")
    p.add_argument("--data", default=f"cifar10:{HERE.parent.parent / 'shared' / 'data' / 'cifar10'}")
    p.add_argument("--work", default=str(HERE / "work" / "accuracy_predictor"))
    p.add_argument("--pool", type=int, default=500)
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--group-size", type=int, default=200)
    p.add_argument("--validation-images", type=int, default=10000)
    p.add_argument("--calibration-batches", type=int, default=5)
    p.add_argument("--mlp-budgets", default="1,2,3,6,9",
                   help="MLP training budgets, in multiples of the sensitivity build's evaluations")
    p.add_argument("--mlp-seeds", type=int, default=3, help="MLP training seeds averaged per budget")
    p.add_argument("--results", default=str(RESULTS), help="where the JSON and Markdown go")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--shard", default="0/1", type=lambda s: tuple(int(x) for x in s.split("/")),
                   help="K/N: evaluate only every N-th random SubNet from the K-th, so that N processes "
                        "share the pool and the MLP's SubNets; a final unsharded run writes the results")
    args = p.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    store = State(Path(args.work) / "state.json")
    if not args.report_only:
        for name in args.models.split(","):
            results = run_model(name, args, store)
            if results is None:
                print(f"{name}: shard {args.shard[0]}/{args.shard[1]} done", flush=True)
                continue
            store.put(results, name, "results")
        if args.shard[1] > 1:
            return 0
    models = {n: store.get(n, "results") for n in args.models.split(",") if store.get(n, "results")}
    data = {"command": "python " + " ".join(sys.argv), "machine": machine("torch", "scipy"), "models": models,
            "settings": {k: getattr(args, k) for k in ("pool", "groups", "group_size", "validation_images",
                                                        "calibration_batches", "mlp_budgets", "mlp_seeds")}}
    write_results(args.results, "accuracy_predictor", data, report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
