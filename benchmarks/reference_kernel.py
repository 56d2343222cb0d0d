"""Which reference kernel tracks a whole model's speed? The paired design's choice, measured.

Reproduce (from the repository root, after `make install`; ``--minutes`` of timing per run)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reference_kernel.py --model mobilenet_v3_large --minutes 10 \
        --label idle
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/reference_kernel.py --report-only

The latency predictor brings every measurement to one machine speed by the time of a
reference kernel read around it (``Backend.reference_probe``). That only works if the
reference slows down as the models do. This benchmark times, on ``--backend`` at 1 thread,
the smallest, the largest and ``--subnets`` random SubNets of ``--model`` (random weights,
default space, 224 px), each with every candidate reference read just before and just after
it (the product's design: the lower of the two readings), in rounds until ``--minutes`` have
passed. Candidates (``candidates()``): the product's kernel, kernels whose weights or
activations live in the shared cache or memory, a mobile block, and the model's largest
SubNet; sums of two are scored too. For each SubNet and candidate: how much the SubNet's time
over the reference's varies from round to round (robust spread, percent), against the
SubNet's time alone. The lower, the better the candidate cancels the machine's drift.

Each run is kept under its ``--label`` (e.g. ``idle``, ``beside-training``) in
``--work``/state.json (on a new machine, started from the committed results), so that runs under
different loads add up.
Results: ``benchmarks/results/reference_kernel.{json,md}``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from common import State, head_commit, resumed_state, machine, write_results
from torch import nn

import autotailor as at
from autotailor.frontends import load_model
from autotailor.predict.latency import make_backend
from autotailor.predict.latency.backends.base import REFERENCE_SHAPE, ReferenceKernel, torch_on_one_thread
from autotailor.testing import well_conditioned

HERE = Path(__file__).resolve().parent
WINDOW = 15  # rounds per window of the slow drift (about a minute)


def _conv(cin: int, cout: int, k: int, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups)


def candidates() -> dict[str, tuple[nn.Module, tuple[int, ...], str]]:
    """name -> (module, input shape, what it stresses)."""
    torch.manual_seed(0)
    return {
        "l2_conv": (ReferenceKernel(), REFERENCE_SHAPE, "the product's: 3x3 conv, 32 ch at 28x28, in a core's L2"),
        "l3_conv": (nn.Sequential(_conv(768, 768, 1), nn.ReLU()), (1, 768, 7, 7),
                    "1x1 conv, 768 ch at 7x7: 2.3 MiB of weights, in the shared L3"),
        "weights_stream": (nn.Sequential(_conv(2048, 2048, 1), nn.ReLU()), (1, 2048, 1, 1),
                           "1x1 conv on one pixel: 16 MiB of weights streamed from memory"),
        "dw_activations": (nn.Sequential(_conv(96, 96, 3, 96), nn.ReLU()), (1, 96, 112, 112),
                           "3x3 depthwise, 96 ch at 112x112: 4.6 MiB of activations each way"),
        "mobile_block": (nn.Sequential(_conv(64, 384, 1), nn.ReLU(), _conv(384, 384, 3, 384), nn.ReLU(),
                                       _conv(384, 64, 1)), (1, 64, 28, 28), "an inverted residual at 28x28"),
    }


def run_timing(args: argparse.Namespace) -> dict:
    backend = make_backend(args.backend, threads=1)
    torch.manual_seed(0)
    sn = at.compile(well_conditioned(load_model(f"torchvision:{args.model}")), torch.zeros(1, 3, 224, 224))
    rng = random.Random(0)
    archs = {"smallest": sn.space.min(), "largest": sn.space.max(),
             **{f"random{i}": sn.space.sample(rng) for i in range(args.subnets)}}
    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp, torch_on_one_thread():
        runs: dict[str, Callable[[], object]] = {}
        for name, arch in archs.items():
            shape = sn.input_shape(arch)
            runs[name] = backend.load(backend.deploy(sn.extract(arch).eval(), Path(tmp) / name, shape), shape)
        refs = {name: backend.load(backend.deploy(m.eval(), Path(tmp) / name, shape), shape)
                for name, (m, shape, _) in candidates().items()}
        refs["largest"] = runs["largest"]
        # one round: every candidate read (shuffled), then a SubNet, ..., then every candidate again
        rounds: list[dict] = []
        started, order = time.time(), list(archs)
        while time.time() - started < 60 * args.minutes:
            rng.shuffle(order)
            slots: list[dict[str, float]] = []
            subnets: dict[str, float] = {}
            for name in [*order, None]:
                names = list(refs)
                rng.shuffle(names)
                slots.append({r: backend.time(refs[r]).median_ms for r in names})
                if name is not None:
                    subnets[name] = backend.time(runs[name]).median_ms
            rounds.append({"t": time.time() - started, "order": list(order), "slots": slots, "subnets": subnets})
    return {"model": args.model, "backend": args.backend, "minutes": args.minutes, "rounds": rounds,
            "candidates": {k: v[2] for k, v in candidates().items()} | {"largest": "the model's largest SubNet"},
            "machine": machine("onnxruntime"), "commit": head_commit(), "started": started_at}


def _spread(logs: list[float]) -> float:
    """1.4826 x the median absolute deviation of log values, in percent (a robust sd)."""
    x = np.asarray(logs)
    return 100 * 1.4826 * float(np.median(np.abs(x - np.median(x))))


def _drift(logs: list[float], window: int = WINDOW) -> tuple[float, float]:
    """(slow, fast): half the 10-90 % range of the medians of consecutive ``window`` rounds (the
    drift a reference read beside a timing can cancel), and the robust spread of the rounds
    around their window's median (bursts within a timing, which none can), in percent."""
    x = np.asarray(logs)
    chunks = [x[i:i + window] for i in range(0, len(x) - window + 1, window)]
    medians = np.array([np.median(c) for c in chunks])
    slow = 100 * float(np.percentile(medians, 90) - np.percentile(medians, 10)) / 2
    return slow, _spread(np.concatenate([c - np.median(c) for c in chunks]).tolist())


def analyse(run: dict) -> dict:
    """Per SubNet and reference (single and pairs summed): the robust spread of the SubNet's
    time over the reference's (the lower of the readings before and after it), and its slow
    and fast parts (``_drift``)."""
    names = list(run["candidates"])
    refs: list[tuple[str, ...]] = [(n,) for n in names] + [p for p in itertools.combinations(names, 2)
                                                           if "largest" not in p]
    table: dict[str, dict[str, float]] = {}
    drift: dict[str, dict[str, tuple[float, float]]] = {}
    subnets = list(run["rounds"][0]["subnets"])
    for s in subnets:
        row: dict[str, list[float]] = {"alone": [], **{"+".join(r): [] for r in refs if s not in r}}
        for rd in run["rounds"]:
            i = rd["order"].index(s)
            before, after = rd["slots"][i], rd["slots"][i + 1]
            t = rd["subnets"][s]
            row["alone"].append(math.log(t))
            for r in refs:
                if s not in r:
                    row["+".join(r)].append(math.log(t / min(sum(before[n] for n in r), sum(after[n] for n in r))))
        table[s] = {k: _spread(v) for k, v in row.items()}
        drift[s] = {k: _drift(v) for k, v in row.items()}
    keys = list(dict.fromkeys(k for s in subnets for k in table[s]))

    def mean(values: dict[str, dict], key: str, part=lambda v: v) -> float:
        return float(np.mean([part(values[s][key]) for s in subnets if key in values[s]]))

    return {"per_subnet": table, "rounds": len(run["rounds"]),
            "mean": {k: mean(table, k) for k in keys},
            "slow": {k: mean(drift, k, lambda v: v[0]) for k in keys},
            "fast": {k: mean(drift, k, lambda v: v[1]) for k in keys},
            "median_ms": {s: float(np.median([rd["subnets"][s] for rd in run["rounds"]])) for s in subnets}}


def report(state: State) -> None:
    runs = state.data.get("runs", {})
    lines = ["# Which reference kernel tracks a model's speed", "",
             "Command: `python benchmarks/reference_kernel.py` (see its docstring). Each SubNet timed by the "
             "product's backend (1 thread) between two readings of every candidate reference; the spread is "
             "1.4826 x the median absolute deviation over rounds of log(SubNet / reference), in percent, with the "
             "lower reading of the reference around the SubNet. `alone`: the SubNet's own time, no reference. "
             "Lower is better: the reference cancels more of the machine's drift. Slow / fast: half the "
             f"10-90 % range of the medians of {WINDOW} consecutive rounds (about a minute: the drift a reference "
             "can cancel), and the robust spread of the rounds around their window's median (bursts within one "
             "timing, which no reference can), each averaged over the SubNets.", ""]
    for label, run in runs.items():
        a = analyse(run)
        lines += [f"## {label}: {run['model']} on {run['backend']}", "",
                  f"Started {run['started']}, {run['minutes']} min, {a['rounds']} rounds; commit {run['commit']}; "
                  f"{run['machine']['cpu']}, {run['machine']['cores']} cores, onnxruntime "
                  f"{run['machine'].get('onnxruntime')}.", ""]
        ranked = sorted(a["mean"].items(), key=lambda kv: kv[1])
        subnets = list(a["per_subnet"])
        lines += ["| reference | mean spread | slow / fast | " + " | ".join(
            f"{s} ({a['median_ms'][s]:.2f} ms)" for s in subnets) + " |", "|---|---|---|" + "---|" * len(subnets)]
        for key, mean in ranked:
            cells = [f"{a['per_subnet'][s][key]:.1f} %" if key in a["per_subnet"][s] else "-" for s in subnets]
            lines.append(f"| {key} | {mean:.1f} % | {a['slow'][key]:.1f} / {a['fast'][key]:.1f} % | "
                         + " | ".join(cells) + " |")
        lines += ["", "Candidates: " + "; ".join(f"`{k}`: {v}" for k, v in run["candidates"].items()) + ".", ""]
    write_results(HERE / "results", "reference_kernel", {"runs": {k: {**{x: v[x] for x in v if x != "rounds"},
                                                    "analysis": analyse(v)} for k, v in runs.items()},
                                       "raw": state.data}, "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mobilenet_v3_large")
    p.add_argument("--backend", default="ort-cpu")
    p.add_argument("--subnets", type=int, default=6)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--label", default="idle", help="the name this run is kept under (the machine's load)")
    p.add_argument("--work", default=str(HERE / "work" / "reference_kernel"))
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    state = resumed_state(args.work, "reference_kernel")
    if not args.report_only:
        state.put(run_timing(args), "runs", args.label)
    report(state)


if __name__ == "__main__":
    main()
