"""Does a SubNet's time depend on the session it was loaded into, or on the moment it is timed?

Reproduce (from the repository root, after `make install`, on an idle machine; 1-3 minutes)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/load_variation.py --model timm:levit_128s --label intel-idle
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/load_variation.py --report-only

The latency benchmark measures every SubNet twice, each time loading its file anew
(``DeviceSetup.time_deployed``). When the two disagree, either loads differ (where the runtime
puts the weights and its arena: a property of the session, kept as long as it lives) or moments
do (the machine). This benchmark tells them apart: on ``--backend`` at 1 thread, the smallest,
the largest and ``--subnets`` random SubNets of ``--model`` (random weights, default space,
224 px) are each loaded into ``--sessions`` sessions kept for the whole run, and each is timed
by the product's ``Backend.time`` in ``--rounds`` rounds, together with one freshly loaded
session per round. Per SubNet: the spread of its sessions' medians (the load), the
round-to-round spread of one session (the moment), and how far a fresh load's timing falls
from the kept sessions' median.

Each run is kept under its ``--label`` in ``--work``/state.json (on a new machine, started from
the committed results), so that runs on different machines add up.
Results: ``benchmarks/results/load_variation.{json,md}``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import State, head_commit, resumed_state, machine, write_results

import autotailor as at
from autotailor.frontends import load_model
from autotailor.predict.latency import make_backend
from autotailor.predict.latency.backends.base import torch_on_one_thread
from autotailor.testing import well_conditioned

HERE = Path(__file__).resolve().parent


def run_timing(args: argparse.Namespace) -> dict:
    backend = make_backend(args.backend, threads=1)
    torch.manual_seed(0)
    spec = args.model if ":" in args.model else f"torchvision:{args.model}"
    sn = at.compile(well_conditioned(load_model(spec)), torch.zeros(1, 3, 224, 224))
    rng = random.Random(0)
    archs = [sn.space.max(), sn.space.min(), *(sn.space.sample(rng) for _ in range(args.subnets))]
    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp, torch_on_one_thread():
        files = []
        for i, arch in enumerate(archs):
            shape = sn.input_shape(arch)
            files.append((backend.deploy(sn.extract(arch).eval(), Path(tmp) / f"subnet{i}", shape), shape))
        kept = [[backend.load(path, shape) for _ in range(args.sessions)] for path, shape in files]
        timings = [{"kept": [[] for _ in range(args.sessions)], "fresh": []} for _ in files]
        for _ in range(args.rounds):
            for (path, shape), sessions, out in zip(files, kept, timings):
                for k, run in enumerate(sessions):
                    out["kept"][k].append(backend.time(run).median_ms)
                out["fresh"].append(backend.time(backend.load(path, shape)).median_ms)
    return {"model": args.model, "backend": args.backend, "sessions": args.sessions, "rounds": args.rounds,
            "timings": timings, "machine": machine("onnxruntime"), "commit": head_commit(), "started": started_at}


def _session_spread(kept: list[list[float]], centre: float) -> float:
    medians = [statistics.median(s) for s in kept]
    return (max(medians) - min(medians)) / centre * 100


def analyse(run: dict) -> list[dict]:
    """Per SubNet, in percent of its median: the spread of its kept sessions' medians
    ((max - min) / median), the same with each round's timings shuffled among the sessions
    (what the spread is when the session does not matter: mean of 200 shuffles), one session's
    round-to-round spread (median absolute deviation, median over its sessions), and the fresh
    loads' deviation from the kept sessions' median (median, and the share beyond 5 %)."""
    rng = np.random.default_rng(0)
    out = []
    for t in run["timings"]:
        medians = [statistics.median(s) for s in t["kept"]]
        centre = statistics.median([x for s in t["kept"] for x in s])
        by_round = np.array(t["kept"]).T  # rounds x sessions
        shuffled = statistics.mean(_session_spread(rng.permuted(by_round, axis=1).T.tolist(), centre)
                                   for _ in range(200))
        rounds = statistics.median(statistics.median(abs(x / m - 1) for x in s) for s, m in zip(t["kept"], medians))
        fresh = [x / centre - 1 for x in t["fresh"]]
        out.append({"ms": centre, "sessions": _session_spread(t["kept"], centre), "shuffled": shuffled,
                    "rounds": rounds * 100, "fresh": statistics.median(fresh) * 100,
                    "fresh_beyond_5": float(np.mean([abs(f) > 0.05 for f in fresh])) * 100})
    return out


def report(state: State) -> None:
    runs = state.data.get("runs", {})
    lines = ["# A SubNet's time: the load or the moment", "",
             "Command: `python benchmarks/load_variation.py` (see its docstring). Per SubNet (0: the largest, "
             "1: the smallest, then random ones), in percent of its median time: `sessions`, the spread "
             "((max - min) / median) of the medians of the sessions it was loaded into once, and (`shuffled`) the same "
             "with each round's timings shuffled among the sessions: what it is when the session does not matter; "
             "`rounds`, one "
             "session's round-to-round median absolute deviation; `fresh`, the median deviation of a session "
             "loaded anew each round from the kept sessions' median, and how often it is more than 5 % off.", ""]
    for label, run in runs.items():
        a = analyse(run)
        lines += [f"## {label}: {run['model']} on {run['backend']}", "",
                  f"Started {run['started']}; {run['sessions']} sessions kept per SubNet, {run['rounds']} rounds; "
                  f"commit {run['commit']}; {run['machine']['cpu']}, {run['machine']['cores']} cores, onnxruntime "
                  f"{run['machine'].get('onnxruntime')}.", "",
                  "| SubNet | median ms | sessions | shuffled | rounds | fresh | fresh beyond 5 % |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {i} | {r['ms']:.3f} | {r['sessions']:.1f} % | {r['shuffled']:.1f} % | {r['rounds']:.1f} % | {r['fresh']:+.1f} % | "
                  f"{r['fresh_beyond_5']:.0f} % |" for i, r in enumerate(a)]
        lines += ["", f"Median over SubNets: sessions {statistics.median(r['sessions'] for r in a):.1f} % (shuffled "
                  f"{statistics.median(r['shuffled'] for r in a):.1f} %), rounds "
                  f"{statistics.median(r['rounds'] for r in a):.1f} %, fresh "
                  f"{statistics.median(r['fresh'] for r in a):+.1f} %.", ""]
    write_results(HERE / "results", "load_variation",
                  {"runs": {k: {**{x: v[x] for x in v if x != "timings"}, "analysis": analyse(v)} for k, v in runs.items()},
                   "raw": state.data}, "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="timm:levit_128s")
    p.add_argument("--backend", default="ort-cpu")
    p.add_argument("--subnets", type=int, default=10)
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--label", default="idle", help="the name this run is kept under (the machine and its load)")
    p.add_argument("--work", default=str(HERE / "work" / "load_variation"))
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    state = resumed_state(args.work, "load_variation")
    if not args.report_only:
        state.put(run_timing(args), "runs", args.label)
    report(state)


if __name__ == "__main__":
    main()
