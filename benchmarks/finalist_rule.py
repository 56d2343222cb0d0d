"""How the finalists' choice rule does on test images it did not see.

Reproduce (from the repository root, after benchmarks/baselines.py, whose AutoTailor searches
and finalists it reads; about half an hour per model on one core, resumable)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/finalist_rule.py --work benchmarks/work/baselines
    .venv/bin/python benchmarks/finalist_rule.py --report-only

For each model's search in ``baselines.py`` (``--verify 2 --finalists 4``, 22 latency budgets, the
finalists measured on a sample of the CIFAR-10 test images), every ``RULES`` entry chooses,
for each budget, among all the measured SubNets that meet it, at the latencies the search
used: the most accurate as measured (the rule before), or the better predicted among those
measured within one standard error of the best (``Finalists.most_accurate``). Each choice's
accuracy on the test images outside the finalists' sample says which rule chose better: the
sample's own figures flatter whichever SubNet its noise favoured. BatchNorm is recalibrated
as the finalists' measurements were (``eval_data``'s calibration batches). Results:
``benchmarks/results/finalist_rule.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import State, default_cifar10, head_commit, machine, write_results  # noqa: E402

DEVICE = "ort-cpu:threads=1"  # baselines.py's
MODELS = ("resnet18", "mobilenet_v2")


def _most_accurate_measured(finalists, pool, objectives, budget):
    from autotailor.search import rank

    return max(pool, key=lambda a: (finalists.accuracy(a), rank(objectives, budget, a)))


def _within_one_standard_error(finalists, pool, objectives, budget):
    return finalists.most_accurate(pool, objectives, budget)


RULES: dict[str, Callable] = {"most accurate measured": _most_accurate_measured,
                              "within one standard error, best predicted": _within_one_standard_error}


def choices(sn, folder: Path) -> tuple[dict, dict[str, list[dict]]]:
    """The finalists' info, and each rule's choice per budget of the folder's search:
    {budget, arch, key, sample accuracy, predicted accuracy, latency}."""
    from autotailor.pipeline.finalists import FINALISTS, Finalists
    from autotailor.pipeline.results import SearchRecord
    from autotailor.pipeline.selection import objectives_for
    from autotailor.pipeline.workdir import device_setup
    from autotailor.search import Budget

    stored = json.loads((folder / FINALISTS).read_text())
    finalists = Finalists(sn, None, folder / FINALISTS, 4, stored["subnets"], stored["info"])
    objectives = objectives_for(sn, folder, device_setup(sn, folder, DEVICE), finalists)
    archs, searched = finalists.archs, SearchRecord.read(folder).choices
    out: dict[str, list[dict]] = {}
    for name, rule in RULES.items():
        out[name] = []
        for chosen in searched:
            budget = Budget.of(**chosen.limits)
            pool = [a for a in archs if objectives.feasible(a, budget)]
            if not pool:
                continue
            arch = rule(finalists, pool, objectives, budget)
            out[name].append({"budget": chosen.budget, "arch": arch, "key": finalists._key(arch),
                              "sample_accuracy": finalists.accuracy(arch), "predicted": objectives.accuracy(arch),
                              "latency_ms": objectives.metric("latency_ms", arch),
                              "macs": objectives.metric("macs", arch)})
    return stored["info"], out


def run(args: argparse.Namespace, state: State) -> None:
    import autotailor as at
    from autotailor.pipeline.workdir import EvalSettings, eval_data
    from autotailor.tune import evaluate

    for model in args.models.split(","):
        folder = Path(args.work) / model / "autotailor"
        sn = at.load(folder)
        info, chosen = choices(sn, folder)
        # all test images, with the calibration batches the finalists were measured with
        data = eval_data(f"cifar10:{args.data}", 32, EvalSettings(10_000, info["calibration_batches"], 128,
                                                                   info["validation_sample_seed"]))
        todo = {c["key"]: c["arch"] for rows in chosen.values() for c in rows}
        for i, (key, arch) in enumerate(todo.items()):
            if state.get(model, "all_images", key) is None:
                state.put(evaluate(sn, arch, data.val, data.calibration), model, "all_images", key)
                print(f"{model}: {i + 1}/{len(todo)} SubNets on all test images", flush=True)
        state.put({"info": info, "choices": chosen}, model, "search")


def report(state: State) -> tuple[dict, str]:
    from autotailor.pipeline.finalists import standard_error

    lines = ["# The finalists' choice rule, judged on held-out test images", "",
             "Each rule chooses among the SubNets `benchmarks/baselines.py`'s search measured on its "
             "finalists' sample; held out: the CIFAR-10 test images outside that sample "
             "(`benchmarks/finalist_rule.py`).", ""]
    summary = {}
    for model, entry in state.data.items():
        if not isinstance(entry, dict) or "search" not in entry:
            continue
        info, chosen, all_images = entry["search"]["info"], entry["search"]["choices"], entry["all_images"]
        n = info["validation_images"]

        def held_out(c: dict) -> float:
            return (10_000 * all_images[c["key"]] - n * c["sample_accuracy"]) / (10_000 - n)

        names = list(chosen)
        noise = max(standard_error(held_out(c), 10_000 - n) for rows_ in chosen.values() for c in rows_)
        rows = list(zip(*chosen.values()))
        differ = [r for r in rows if len({c["key"] for c in r}) > 1]
        gains = [100 * (held_out(r[1]) - held_out(r[0])) for r in differ]
        summary[model] = {
            "finalist_images": n, "held_out_images": 10_000 - n, "budgets": len(rows),
            "distinct": {name: len({c["key"] for c in chosen[name]}) for name in names},
            "mean_held_out": {name: statistics.fmean(100 * held_out(c) for c in chosen[name]) for name in names},
            "budgets_differing": len(differ), "held_out_gain_where_differing": gains}
        s = summary[model]
        lines += [f"## {model}", "",
                  f"{s['budgets']} budgets; finalists measured on {n} test images, judged on the other "
                  f"{s['held_out_images']:,}. The rules differ at {len(differ)} budgets"
                  + (f", where the second is {statistics.fmean(gains):+.2f} pts on average "
                     f"({min(gains):+.2f} to {max(gains):+.2f})" if gains else "") + ". Distinct SubNets: "
                  + ", ".join(f"{s['distinct'][name]} ({name})" for name in names) + "; mean held-out accuracy: "
                  + ", ".join(f"{s['mean_held_out'][name]:.2f} % ({name})" for name in names)
                  + f". Noise: one standard error of a held-out accuracy is {100 * noise:.2f} pts or less "
                  "(binomial; less for the difference of two SubNets sharing weights, which mostly agree).", "",
                  "| budget | " + " | ".join(f"{name}: MACs, ms, sample %, held-out %" for name in names) + " |",
                  "|---|" + "---|" * len(names)]
        for r in rows:
            lines.append(f"| {r[0]['budget']} | " + " | ".join(
                f"{c['macs'] / 1e6:.1f} M, {c['latency_ms']:.3g}, {100 * c['sample_accuracy']:.2f}, "
                f"{100 * held_out(c):.2f}" for c in r) + " |")
        lines.append("")
    return summary, "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=str(HERE / "work" / "baselines"), help="baselines.py's --work")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--data", default=default_cifar10(), help="directory with CIFAR-10's train.zip and test.zip")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    results = HERE / "results"
    committed = results / "finalist_rule.json"
    state = State(Path(args.work) / "finalist_rule_state.json")
    commit = head_commit()
    if args.report_only:
        stored = json.loads(committed.read_text())
        state.data, commit = stored["raw"], stored["commit"]
    else:
        run(args, state)
    summary, text = report(state)
    text += (f"\nMeasured at commit {commit}; reproduce: "
             "`OMP_NUM_THREADS=1 python benchmarks/finalist_rule.py --work benchmarks/work/baselines`.\n")
    write_results(results, "finalist_rule", {"machine": machine("torch"), "commit": commit,
                                             "summary": summary, "raw": state.data}, text)


if __name__ == "__main__":
    main()
