"""``baselines.md``'s comparisons with every latency timed again in alternated rounds.

``baselines.py`` times each point once (two passes in opposite orders, beside the reference
kernel). On a noisy VM that is not enough where two fronts lie close: the same pruned models,
timed an hour apart, read up to 39 % apart while the reference kernel moved under 10 %. Here
every AutoTailor SubNet and baseline model of ``baselines.py``'s state is exported to ONNX and
timed by ``paired_timing.py`` (a process without torch) in rounds of 30-call windows, each
beside the largest SubNet, whose memory traffic drifts with theirs: a point's latency is the
median of its ratio to the largest over the rounds (their median absolute deviation beside it),
times the largest's median. The comparison (``baselines.compare``: accuracy at equal latency,
latency at equal accuracy) is then made again on those latencies, with the same accuracies and
standard errors.

    .venv/bin/python benchmarks/baselines_paired.py --work benchmarks/work/baselines_c3 [--rounds 15]

Needs ``baselines.py``'s state in ``--work`` (a run of it first; the SuperNets of the ``--models``
it times are compiled there if missing); the other models in the committed
``baselines_paired.json`` keep their timings and have their comparisons made again from the
state (``--models ""`` times none). A block-scaling baseline none of whose points a model's
timing covers (added after it) is left out of that model's section until it is timed again.
Minutes on 2 cores. Results: ``benchmarks/results/baselines_paired.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import baselines  # noqa: E402
from common import State, head_commit, machine, write_results  # noqa: E402


TIMED = ("autotailor", "nestdnn", *baselines.BLOCK_METHODS)  # the methods whose points are timed


def _export(net: torch.nn.Module, shape: tuple[int, ...], path: Path) -> str:
    torch.onnx.export(net.eval(), torch.randn(*shape), str(path), dynamo=False)
    return str(path)


def _name(method: str, key: str, point: dict) -> str:
    """The ONNX file a point is timed as: budgets that chose one SubNet share it."""
    return f"autotailor/{json.dumps(point['arch'], sort_keys=True)}" if method == "autotailor" else f"{method}/{key}"


def _points(state: State, model: str, method: str) -> dict[str, dict]:
    """``method``'s points of ``model`` that are models (a search that found none is not)."""
    return {key: p for key, p in (state.get(model, method) or {}).items() if p.get("path", True) is not None}


def time_model(state: State, model: str, work: Path, rounds: int, tmp: Path) -> dict:
    """``model``'s AutoTailor SubNets and baseline models timed in alternated rounds: each file's
    ``ratio`` to the largest SubNet beside it and the rounds' spread (``ratio_mad``), and the
    largest's median window."""
    import autotailor as at

    sn = at.load(baselines.compiled(model, work))
    files: dict[str, str] = {}
    for key, p in _points(state, model, "autotailor").items():
        name = _name("autotailor", key, p)
        if name not in files:
            files[name] = _export(sn.extract(p["arch"]), tuple(sn.input_shape(p["arch"])),
                                  tmp / f"{model}_a{len(files)}.onnx")
    for key, p in _points(state, model, "nestdnn").items():
        files[_name("nestdnn", key, p)] = _export(baselines.nestdnn_model(model, p["ratio"], baselines.cycles(model)),
                                                  (1, 3, 32, 32), tmp / f"{model}_n{key}.onnx")
    for method in baselines.BLOCK_METHODS:
        found = _points(state, model, method)
        net = baselines.trained_blocks(method, model, work) if found else None
        for key, p in found.items():
            files[_name(method, key, p)] = _export(net.subnet(tuple(tuple(c) for c in p["path"])), (1, 3, 32, 32),
                                                   tmp / f"{model}_{method}{len(files)}.onnx")
    arch = sn.space.max()
    largest = _export(sn.extract(arch), tuple(sn.input_shape(arch)), tmp / f"{model}_largest.onnx")
    spec, out = tmp / f"{model}_spec.json", tmp / f"{model}_timed.json"
    spec.write_text(json.dumps({"threads": 1, "rounds": rounds, "calls": 30, "warmup": 3, "reference": largest,
                                "largest": largest, "models": files}))
    subprocess.run([sys.executable, str(HERE / "paired_timing.py"), str(spec), str(out)], check=True)
    timed = json.loads(out.read_text())
    return {"largest_ms": statistics.median(t["largest_ms"] for t in timed.values()),
            "timed": {name: {"ratio": t["ratio"], "ratio_mad": t["ratio_mad"]} for name, t in timed.items()}}


def _written_timing(got: dict) -> dict:
    """The timing a model's points in a written ``baselines_paired.json`` carry (``time_model``'s form)."""
    return {"largest_ms": got["largest_ms"],
            "timed": {p["name"]: {"ratio": p["latency_ratio"], "ratio_mad": p["ratio_mad"]}
                      for method in TIMED for p in got.get(method, [])}}


def points(state: State, model: str, timing: dict) -> dict:
    """``model``'s AutoTailor and baseline points with ``latency_ms`` from ``timing``, and the
    fronts that share their architectures' latencies: fine-tuned alone, NestDNN* trained longer."""
    got: dict = {"largest_ms": timing["largest_ms"]}
    for method in TIMED:
        found = _points(state, model, method)
        if method in baselines.BLOCK_METHODS and not any(_name(method, k, p) in timing["timed"] for k, p in found.items()):
            continue  # added after this model was timed
        got[method] = []
        for key, p in found.items():
            name = _name(method, key, p)
            if name not in timing["timed"]:  # searched or pruned again since its committed timing
                raise SystemExit(f"{model}'s {method} point {key} has no paired timing: run with --models {model}")
            t = timing["timed"][name]
            got[method].append({**p, "key": key, "name": name, "latency_ms": t["ratio"] * timing["largest_ms"],
                                "latency_ratio": t["ratio"], "ratio_mad": t["ratio_mad"]})
    shared = ("latency_ms", "latency_ratio", "ratio_mad")
    twins = {p["key"]: p for p in got["autotailor"]}  # fine-tuned alone: its shared twin's architecture
    got["alone"] = [{**p, **{k: twins[p["key"]][k] for k in shared}} for p in baselines.alone_front(state, model)]
    twins = {p["key"]: p for p in got["nestdnn"]}  # trained longer: the same pruned architecture
    for method in baselines.EQUAL_COSTS:
        got[method] = [{**p, **{k: twins[f"{p['ratio']:g}"][k] for k in shared}}
                       for p in baselines.longer_nestdnn_front(state, model, method)]
    return got


def _exported(point: dict) -> str:
    """Which weights ``autotailor export --finetune-steps`` writes for a point of the fine-tuned front."""
    if point["fine_tuned"]:  # from the start its probe preferred, or before the probe from the shared weights
        return f"fine-tuned from the {point['start']} weights" if "start" in point else \
            "fine-tuned from the shared weights, not probed"
    return "original weights" if point.get("weights") == "original" else "shared"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=str(HERE / "work" / "baselines"), help="baselines.py's work directory")
    p.add_argument("--models", default=",".join(baselines.MODELS))
    p.add_argument("--rounds", type=int, default=15, help="30-call windows of each model, each beside the largest SubNet")
    args = p.parse_args()
    work = Path(args.work)
    if not (work / "state.json").is_file():
        raise SystemExit(f"{work / 'state.json'} is missing: run benchmarks/baselines.py --work {work} first")
    state = State(work / "state.json")
    command = "python benchmarks/baselines_paired.py " + " ".join(sys.argv[1:])
    m = machine("torch", "onnxruntime", "torch_pruning")
    lines = ["# AutoTailor against the baselines, every latency timed in alternated rounds (CIFAR-10, ONNX Runtime 1 thread)",
             "", f"Machine: {m['cpu']}, {m['cores']} cores; onnxruntime {m['onnxruntime']}; commit {head_commit()}. "
             f"Command: `{command}` (each model's section names the run that timed it; models not in `--models` keep "
             f"their committed timings). Each point's latency: the median over {args.rounds} rounds of its 30-call window's "
             "ratio to the largest SubNet's beside it, times the largest's median window; in brackets the rounds' "
             "median absolute deviation of that ratio. Accuracies and their standard errors as in `baselines.md`.", ""]
    # models not timed by this run keep their committed timings (their work folders may be gone)
    written = HERE / "results" / "baselines_paired.json"
    kept = json.loads(written.read_text()) if written.is_file() else {"models": {}}
    timings = {model: (_written_timing(got), got["timed_by"])
               for model, got in kept["models"].items() if state.get(model, "autotailor")}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            if state.get(model, "autotailor"):
                timings[model] = (time_model(state, model, work, args.rounds, Path(tmp)),
                                  {"commit": head_commit(), "command": command})
    results = {}
    for model, (timing, timed_by) in timings.items():
        got = results[model] = {**points(state, model, timing), "timed_by": timed_by, "against": {}}
        lines += [f"## {model}", "", f"Timed at commit {timed_by['commit']}: `{timed_by['command']}`. "
                  f"Largest SubNet: {got['largest_ms']:.3f} ms."]
        for method, (label, name) in baselines.BASELINES.items():
            if not got.get(method):
                continue
            rows, alone = (baselines.compare(got[front], got[method]) for front in ("autotailor", "alone"))
            got["against"][method] = {front: [{k: v for k, v in r.items() if k != "baseline"}
                                              | {"baseline": name(r["baseline"])} for r in found]
                                      for front, found in (("shared", rows), ("fine_tuned", alone))}
            header = (f"| {label} | latency | accuracy | AutoTailor at equal latency | "
                      "AutoTailor latency at equal accuracy |" + (" with --finetune-steps: at equal latency | "
                                                                   "at equal accuracy |" if alone else ""))
            lines += ["", header, "|---" * header.count(" | ") + "|---|"]
            for i, r in enumerate(rows):
                b = r["baseline"]
                lines.append(f"| {name(b)} | {b['latency_ms']:.3f} ms (±{100 * b['ratio_mad']:.0f} %) | "
                             f"{100 * b['accuracy']:.2f} % | "
                             + " | ".join(f"{baselines.gain_cell(c)} | {baselines.change_cell(c)}"
                                          for c in [r, *alone[i:i + 1]]) + " |")
        for method, rule in baselines.EQUAL_COSTS.items():
            if not got[method] or not got["alone"]:
                continue
            fair = baselines.compare(got["alone"], got[method])
            got[f"rows_{method}"] = [{k: v for k, v in r.items() if k != "baseline"}
                                     | {"ratio": r["baseline"]["ratio"]} for r in fair]
            lines += ["", f"{rule.label}: NestDNN* trained {rule.extra_steps(state, model):,} batches more "
                      "a ratio, as in `baselines.md`.", "",
                      "| NestDNN* ratio | latency | accuracy | AutoTailor with --finetune-steps at equal latency | "
                      "at equal accuracy |", "|---|---|---|---|---|"]
            lines += [f"| {r['baseline']['ratio']:g} | {r['baseline']['latency_ms']:.3f} ms | "
                      f"{100 * r['baseline']['accuracy']:.2f} % | {baselines.gain_cell(r)} | "
                      f"{baselines.change_cell(r)} |" for r in fair]
        by_key = {a["key"]: a for a in got["alone"]}
        lines += ["", "| AutoTailor budget | latency | accuracy (test) | MACs | exported with --finetune-steps |",
                  "|---|---|---|---|---|"]
        lines += [f"| {a['key']} | {a['latency_ms']:.3f} ms (±{100 * a['ratio_mad']:.0f} %) | "
                  f"{100 * a['accuracy']:.2f} %{' (original weights)' if a.get('weights') == 'original' else ''} | "
                  f"{a['macs'] / 1e6:.1f} M | "
                  + (f"{100 * by_key[a['key']]['accuracy']:.2f} % ({_exported(by_key[a['key']])}) |" if a["key"] in by_key
                     else "|")
                  for a in sorted(got["autotailor"], key=lambda a: a["latency_ms"])]
        lines.append("")
    plot = baselines.plot_fronts(results, HERE / "results" / "baselines_paired.png")
    lines += [f"![fronts, every latency timed in rounds]({plot.name})", ""]
    for got in results.values():  # the JSON keeps what was timed, not the test images' error masks
        for p in (p for method in (*TIMED, "alone", *baselines.EQUAL_COSTS) for p in got.get(method, [])):
            p.pop("wrong", None)
    write_results(HERE / "results", "baselines_paired",
                  {"machine": m, "commit": head_commit(), "command": command, "models": results},
                  "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
