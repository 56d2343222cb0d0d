"""On-device adaptation: the runtime's policies against changing CPU load, on one bundle.

Reproduce (from the repository root, after `make install` and `autotailor demo --out /tmp/demo`;
about 8 min on 2 cores)::

    .venv/bin/python benchmarks/runtime_adaptation.py --work /tmp/demo
    .venv/bin/python benchmarks/runtime_adaptation.py --bundle BUNDLE_DIR --slo-ms 3 --repeats 2
    # the tuned CIFAR-10 fronts (the SuperNets kept in benchmarks/artifacts, profiled, their
    # sensitivities measured, searched and exported first: about 20 min; ~20 min per front then)
    .venv/bin/python benchmarks/runtime_adaptation.py --front resnet18 --repeats 3

Input: a bundle (``--bundle``), a work directory (``--work``), from which
``autotailor bundle WORK --out WORKDIR/bundle`` makes one, or ``--front MODEL``: the work
directory ``benchmarks/baselines.py`` makes of MODEL's tuned SuperNet (``autotailor_work``:
profile on ``ort-cpu:threads=1``, sensitivity on CIFAR-10 from ``--data``, search over 8
budgets), exported as ONNX and bundled.

Conditions, written once into the work folder (``benchmarks/work/runtime_adaptation/traces/``)
and read back from there, so that a second run replays the same ones (``--rewrite`` draws them
again):

* load traces, each one or two ``CpuSchedule`` files run by ``LoadHarness`` (one busy process
  each, nice 0, period 20 ms so that a change takes effect within 20 ms): ``none``; ``step``
  (one process, i.e. the core the runtime does not use, from 15 % of the run, a second one,
  i.e. both cores, from 35 %, none from 90 %); ``bursty`` (seeded: idle stretches of 0.5-3 s,
  bursts of 0.3-1.5 s of one or, twice as often, two busy processes). The load level at a moment
  is the number of busy processes, 0, 1 or 2;
* one request arrival trace: steady, ``--rate`` requests/s (100) for ``--duration`` s (20).

Policies: ``static`` largest, smallest and best-at-idle, ``reactive``, ``forecast`` (defaults), and
``oracle``, a policy registered here that is given the load schedules and, before every
inference, the most accurate SubNet whose latency measured under the load level of that moment
(the highest level within the last 25 ms, which covers the load processes' 20 ms reaction)
meets the goal at its ``--oracle-quantile`` (0.99) in the calibration.

Calibration: each SubNet's latency (``session.run`` only, on the resized input, one request
every 1/rate s as in the runs, so that the CPU idles between requests as it does then) under
0, 1 and 2 busy processes, in blocks ordered 0,1,2,2,1,0 (so that a drift of the machine
within the calibration weighs on every level alike) and, within a block, round-robin over the
SubNets (so that it weighs on every SubNet alike). The idle blocks are repeated after the runs:
their difference is the drift over the benchmark.

The goal, unless ``--slo-ms`` is given: ``--goal-factor`` (1.5) x the largest SubNet's calibrated
idle median, rounded up to 0.1 ms: the largest meets it at idle but for this machine's noise
tail, and misses it once a competing process halves the share of the CPU it gets. (A goal
above the largest's idle 99th percentile, the first version's, left it met under two busy
processes: they slow a 4 ms SubNet by less than that tail.) The report gives the share of the
largest's calibrated latencies above the goal per load level.

Every run: a fresh ``Runtime`` (threads=1, no memory budget), a warm-up of 5 inferences per
SubNet at idle before the trace (every SubNet loaded, so that the runs compare switching, not
first loads; the warm-up is not counted), then ``run_trace`` under the load harness. Per run:
goal attainment (inference latency <= goal; and response time, the wait behind earlier
requests included), mean accuracy (each served SubNet's accuracy from the manifest), switches
and their total cost, the monitor's CPU time over the run's wall time, the forecast's error.
Runs go trace by trace, policies in an order rotated by repeat and by trace.

What a run measured is kept in ``WORKDIR/NAME.measured.json`` before the report is written;
``--report-only`` (with the run's flags) writes plots and report from it again.
Results: ``benchmarks/results/runtime_adaptation.{json,md}`` (``runtime_adaptation_MODEL`` for
``--front MODEL``) and a timeline per trace, ``benchmarks/results/runtime_adaptation[_MODEL]_TRACE.png``;
per-run records in the work folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from autotailor.runtime import (  # noqa: E402
    ArrivalTrace,
    Bundle,
    CpuSchedule,
    LoadHarness,
    Policy,
    Runtime,
    best_fitting,
    fastest,
    make_policy,
    register_policy,
    run_trace,
)
from autotailor.runtime.loaders import loader_for  # noqa: E402
from autotailor.runtime.replay import replay_input  # noqa: E402
from autotailor.runtime.runtime import resize_bilinear  # noqa: E402

TRACES = ("none", "step", "bursty")
POLICIES = ("static-largest", "static-smallest", "static-best-at-idle", "reactive", "forecast", "oracle")
LEVELS = (0, 1, 2)
PERIOD_MS = 20.0
WARMUP = 5  # inferences per SubNet before a run
log = logging.getLogger("runtime_adaptation")


# ---------------------------------------------------------------- conditions
def load_layers(trace: str, duration: float, seed: int) -> list[CpuSchedule]:
    """The CPU schedules of one load trace: one busy process each (none for ``none``)."""
    if trace == "none":
        return []
    if trace == "step":
        a = CpuSchedule(((0.0, 0.0), (0.15 * duration, 1.0), (0.9 * duration, 0.0)), 1, PERIOD_MS)
        b = CpuSchedule(((0.0, 0.0), (0.35 * duration, 1.0), (0.9 * duration, 0.0)), 1, PERIOD_MS)
        return [a, b]
    if trace == "bursty":
        rng = random.Random(seed)
        pa, pb = [(0.0, 0.0)], [(0.0, 0.0)]
        t = rng.uniform(0.5, 2.0)
        while t < duration - 0.5:
            burst = rng.uniform(0.3, 1.5)
            two = rng.random() < 2 / 3
            pa.append((round(t, 3), 1.0))
            if two:
                pb.append((round(t, 3), 1.0))
            t += burst
            pa.append((round(t, 3), 0.0))
            if two:
                pb.append((round(t, 3), 0.0))
            t += rng.uniform(0.5, 3.0)
        return [CpuSchedule(tuple(pa), 1, PERIOD_MS), CpuSchedule(tuple(pb), 1, PERIOD_MS)]
    raise SystemExit(f"unknown trace {trace!r}; known: {TRACES}")


def level_at(layers: list[CpuSchedule], t: float) -> int:
    return int(round(sum(s.workers * s.duty_at(t) for s in layers)))


def write_conditions(folder: Path, args) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    arrivals = folder / "arrivals.json"
    if args.rewrite or not arrivals.is_file():
        ArrivalTrace.steady(args.rate, args.duration).write(arrivals)
    for trace in TRACES:
        index = folder / f"{trace}.json"
        if index.is_file() and not args.rewrite:
            continue
        files = []
        for i, layer in enumerate(load_layers(trace, args.duration, args.seed)):
            layer.write(folder / f"{trace}.{i}.json")
            files.append(f"{trace}.{i}.json")
        index.write_text(json.dumps({"trace": trace, "cpu_schedules": files}, indent=1) + "\n")


def read_layers(folder: Path, trace: str) -> list[CpuSchedule]:
    doc = json.loads((folder / f"{trace}.json").read_text())
    return [CpuSchedule.read(folder / f) for f in doc["cpu_schedules"]]


# ---------------------------------------------------------------- calibration
def calibrate(bundle: Bundle, rate: float, n: int, order: tuple[int, ...]) -> dict[int, dict[str, list[float]]]:
    """Latencies (ms) of every SubNet under each load level in ``order``, ``n`` per SubNet and block,
    one inference every 1/rate s, round-robin over the SubNets."""
    x = replay_input(bundle)
    sessions = {s.name: loader_for(s.format).load(bundle.path(s), s, 1) for s in bundle}
    xs = {s.name: resize_bilinear(x, tuple(s.input_shape[2:])) for s in bundle}
    for s in bundle:
        for _ in range(WARMUP):
            sessions[s.name].run(xs[s.name])
    out: dict[int, dict[str, list[float]]] = {}
    gap = 1.0 / rate
    try:
        for level in order:
            lat = out.setdefault(level, {s.name: [] for s in bundle})
            with contextlib.ExitStack() as stack:
                if level:
                    stack.enter_context(LoadHarness(n * len(bundle) * gap * 3 + 10,
                                                    cpu=CpuSchedule.constant(1.0, level, PERIOD_MS)))
                    time.sleep(0.3)
                due = time.perf_counter()
                for _ in range(n):
                    for s in bundle:
                        due += gap
                        time.sleep(max(0.0, due - time.perf_counter()))
                        t0 = time.perf_counter()
                        sessions[s.name].run(xs[s.name])
                        lat[s.name].append((time.perf_counter() - t0) * 1000)
            log.info("calibrated level %d", level)
    finally:
        for s in sessions.values():
            s.close()
    return out


def q(values: list[float], quantile: float) -> float:
    return float(np.quantile(np.asarray(values), quantile, method="inverted_cdf")) if values else math.nan


# ---------------------------------------------------------------- policies
@register_policy("oracle")
class Oracle(Policy):
    """Knows the future load: given the load schedules (``layers``, from ``t0``) and, per load
    level, the SubNet to serve under it (``table``: the most accurate whose calibrated latency
    meets the goal), it serves that SubNet for the highest level within ``lag_s`` before now."""

    def __init__(self, layers: list[CpuSchedule] | None = None, table: dict[int, str] | None = None,
                 lag_s: float = 0.025):
        self.layers, self.table, self.lag_s = layers or [], table or {}, lag_s
        self.t0: float | None = None

    def choose(self, subnets, goal, state):
        if self.t0 is None:
            return best_fitting(subnets, goal.slo_ms)
        t = state.now - self.t0
        level = max(level_at(self.layers, t), level_at(self.layers, max(0.0, t - self.lag_s)))
        name = self.table.get(level)
        named = [s for s in subnets if s.name == name]
        return named[0] if named else fastest(subnets)


class WarmedUp(Policy):
    """``WARMUP`` inferences on every SubNet (loading them), then ``inner`` decides."""

    def __init__(self, inner: Policy, names: list[str]):
        self.inner, self.name = inner, inner.name
        self.queue = [n for n in names for _ in range(WARMUP)]

    def observe(self, record):
        if not self.queue:
            self.inner.observe(record)

    def choose(self, subnets, goal, state):
        if self.queue:
            name = self.queue.pop(0)
            return next(s for s in subnets if s.name == name)
        return self.inner.choose(subnets, goal, state)


def make(policy: str, layers: list[CpuSchedule], table: dict[int, str]) -> Policy:
    if policy.startswith("static-"):
        return make_policy("static", pick=policy.removeprefix("static-"))
    if policy == "oracle":
        return Oracle(layers, table)
    return make_policy(policy)


# ---------------------------------------------------------------- one run
def run_one(bundle: Bundle, slo: float, policy: str, layers: list[CpuSchedule], arrivals: ArrivalTrace,
            table: dict[int, str], records_path: Path) -> dict:
    pol = make(policy, layers, table)
    warm = WarmedUp(pol, [s.name for s in bundle])
    with Runtime(bundle, slo, None, warm, threads=1, history=len(arrivals.times) + 1000) as rt:
        x = replay_input(bundle)
        for _ in range(len(warm.queue)):
            rt.infer(x)
        n_warm = len(rt.records)
        cpu0 = rt.monitor.overhead.cpu_s
        wall0 = time.perf_counter()
        with contextlib.ExitStack() as stack:
            t0 = time.time()
            harnesses = [stack.enter_context(LoadHarness(arrivals.duration_s + 5, cpu=layer)) for layer in layers]
            if harnesses:
                t0 = harnesses[0].t0
            if isinstance(pol, Oracle):
                pol.t0 = t0
            served = run_trace(rt, arrivals, x)
        wall = time.perf_counter() - wall0
        monitor_cpu = rt.monitor.overhead.cpu_s - cpu0
        recs = rt.records[n_warm:]
        fc = rt.monitor.forecast.state()
    rows = []
    for i, (s, r) in enumerate(zip(served, recs)):
        rows.append({"request": i, "t": s.arrival - t0, "start": r.start - t0, "subnet": r.subnet,
                     "latency_ms": r.latency_ms, "response_ms": s.response_ms, "slowdown": r.slowdown,
                     "forecast_upper": r.forecast_upper, "switch_ms": r.switch_ms if i else None,
                     "level": level_at(layers, r.start - t0),
                     "cpu_others": r.reading.cpu_others if r.reading is not None else None})
    with open(records_path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return summarize(bundle, slo, rows, monitor_cpu, wall, fc)


def summarize(bundle: Bundle, slo: float, rows: list[dict], monitor_cpu: float, wall: float, fc) -> dict:
    lat = [r["latency_ms"] for r in rows]
    switches = [r["switch_ms"] for r in rows if r["switch_ms"] is not None]
    by_level = {}
    for level in LEVELS:
        sel = [r["latency_ms"] for r in rows if r["level"] == level]
        if sel:
            by_level[level] = {"n": len(sel), "met": sum(v <= slo for v in sel) / len(sel)}
    per = {}
    for r in rows:
        per[r["subnet"]] = per.get(r["subnet"], 0) + 1
    return {
        "n": len(rows), "met": sum(v <= slo for v in lat) / len(lat),
        "response_met": sum(r["response_ms"] <= slo for r in rows) / len(rows),
        "accuracy": statistics.fmean(bundle[r["subnet"]].accuracy for r in rows),
        "switches": len(switches), "switch_ms_total": sum(switches),
        "switch_ms_median": statistics.median(switches) if switches else None,
        "switch_ms_max": max(switches, default=None),
        "p50_ms": q(lat, 0.5), "p99_ms": q(lat, 0.99), "by_level": by_level, "per_subnet": per,
        # ~1 when the runtime's idle latencies in place are right
        "idle_slowdown_p50": statistics.median([r["slowdown"] for r in rows if r["level"] == 0] or [math.nan]),
        "monitor_cpu_s": monitor_cpu, "wall_s": wall, "monitor_share": monitor_cpu / wall,
        "forecast_mae": fc.mae, "forecast_coverage": fc.coverage,
        # cores other processes kept busy (the monitor's readings), less the injected load
        "others_beyond_load": statistics.fmean([r["cpu_others"] - r["level"] for r in rows
                                                if r["cpu_others"] is not None] or [math.nan]),
    }


def mean_runs(runs: list[dict]) -> dict:
    """The mean of every number over repeated runs, with min and max of the goal attainment."""
    out = {k: (statistics.fmean(r[k] for r in runs) if isinstance(runs[0][k], (int, float)) and
               all(r[k] is not None for r in runs) else runs[0][k]) for k in runs[0]}
    out["met_min"], out["met_max"] = min(r["met"] for r in runs), max(r["met"] for r in runs)
    out["switch_ms_max"] = max((r["switch_ms_max"] for r in runs if r["switch_ms_max"] is not None), default=None)
    out["repeats"] = len(runs)
    return out


# ---------------------------------------------------------------- plot
def plot(trace: str, slo: float, bundle: Bundle, work: Path, policies: list[str], layers, duration, out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.name for s in bundle]
    fig, axes = plt.subplots(len(policies), 1, figsize=(11, 2.1 * len(policies)), sharex=True)
    ts = np.linspace(0, duration, 2000)
    levels = np.array([level_at(layers, t) for t in ts])
    for ax, policy in zip(np.atleast_1d(axes), policies):
        path = work / "records" / f"{trace}.{policy}.r0.jsonl"
        if not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for lv, alpha in ((1, 0.12), (2, 0.25)):
            ax.fill_between(ts, 0, 1, where=levels >= lv, transform=ax.get_xaxis_transform(), color="red",
                            alpha=alpha, lw=0, step="mid")
        t = np.array([r["start"] for r in rows])
        lat = np.array([r["latency_ms"] for r in rows])
        ok = lat <= slo
        ax.scatter(t[ok], lat[ok], s=2, c="tab:blue", label="latency (within goal)")
        ax.scatter(t[~ok], lat[~ok], s=5, c="tab:red", label="latency (missed)")
        ax.axhline(slo, color="k", lw=0.8, ls="--", label=f"goal {slo:g} ms")
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax2 = ax.twinx()
        ax2.step(t, [names.index(r["subnet"]) for r in rows], where="post", color="tab:green", lw=0.9,
                 label="SubNet (rank by accuracy)")
        ax2.set_ylim(-0.5, len(names) - 0.5)
        ax2.set_ylabel("SubNet")
        met = ok.mean() * 100
        acc = statistics.fmean(bundle[r["subnet"]].accuracy for r in rows) * 100
        ax.set_title(f"{trace} / {policy}: {met:.1f} % within goal, accuracy {acc:.2f} %", fontsize=9)
    h1, l1 = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(h1 + [plt.Line2D([], [], color="tab:green"), plt.Rectangle((0, 0), 1, 1, color="red", alpha=0.25)],
               l1 + ["SubNet (0 = least accurate)", "load: 1 (light) or 2 (dark) busy processes"],
               loc="lower center", ncol=3, fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel("s from the trace's start")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main
def results_name(args) -> str:
    """``runtime_adaptation``, or ``runtime_adaptation_MODEL`` for a ``--front``."""
    return f"runtime_adaptation_{args.front}" if args.front else "runtime_adaptation"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--bundle", help="a bundle directory")
    src.add_argument("--work", help="a work directory with exports; bundled into WORKDIR/bundle")
    src.add_argument("--front", choices=("resnet18", "mobilenet_v2"), help="a tuned CIFAR-10 front (see above)")
    p.add_argument("--data", default=None, help="CIFAR-10 (train.zip, test.zip) for --front "
                   "(default: ../shared/data/cifar10 or $AUTOTAILOR_CIFAR10)")
    p.add_argument("--workdir", default=str(HERE / "work" / "runtime_adaptation"))
    p.add_argument("--slo-ms", type=float, default=None, help="the goal (default: from the calibration)")
    p.add_argument("--goal-factor", type=float, default=1.5,
                   help="without --slo-ms, the goal is this times the largest SubNet's idle median")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per run")
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--calib-n", type=int, default=60, help="calibration inferences per SubNet and block")
    p.add_argument("--oracle-quantile", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rewrite", action="store_true", help="draw the traces again")
    p.add_argument("--report-only", action="store_true",
                   help="write the plots and the report again from the last run's WORKDIR/NAME.measured.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    started = time.time()
    work = Path(args.workdir)
    (work / "records").mkdir(parents=True, exist_ok=True)
    if args.report_only:
        m = json.loads((work / f"{results_name(args)}.measured.json").read_text())
        write_report(args, Bundle.load(m["bundle_dir"]), work, m)
        return
    cli = Path(sys.executable).with_name("autotailor")
    if args.front:
        import baselines
        from common import default_cifar10

        front = baselines.autotailor_work(args.front, args.data or default_cifar10(), HERE / "work" / "baselines")
        if not (front / "exports.json").is_file():
            subprocess.run([str(cli), "export", str(front), "--format", "onnx"], check=True)
        args.work = str(front)
    if args.work:
        bundle_dir = work / "bundle"
        subprocess.run([str(cli), "bundle", args.work, "--out", str(bundle_dir)], check=True)
    else:
        bundle_dir = Path(args.bundle)
    bundle = Bundle.load(bundle_dir)
    write_conditions(work / "traces", args)
    arrivals = ArrivalTrace.read(work / "traces" / "arrivals.json")
    traces, policies = args.traces.split(","), args.policies.split(",")

    calib = calibrate(bundle, args.rate, args.calib_n, (0, 1, 2, 2, 1, 0))
    largest = max(bundle, key=lambda s: (s.latency_ms, s.accuracy))
    slo = args.slo_ms or math.ceil(args.goal_factor * q(calib[0][largest.name], 0.5) * 10) / 10
    table = {}
    for level in LEVELS:
        fits = [s for s in bundle if q(calib[level][s.name], args.oracle_quantile) <= slo]
        table[level] = (fits[-1] if fits else fastest(bundle)).name  # bundle: least accurate first
    log.info("goal %.2f ms; oracle table %s", slo, table)

    runs: dict[str, dict[str, list[dict]]] = {t: {p_: [] for p_ in policies} for t in traces}
    k = 0
    for rep in range(args.repeats):
        for ti, trace in enumerate(traces):
            layers = read_layers(work / "traces", trace)
            shift = (rep + ti) % len(policies)
            for policy in policies[shift:] + policies[:shift]:
                res = run_one(bundle, slo, policy, layers, arrivals, table,
                              work / "records" / f"{trace}.{policy}.r{rep}.jsonl")
                res["order"] = k
                k += 1
                runs[trace][policy].append(res)
                log.info("%s / %s: %.1f %% within goal, accuracy %.2f %%, %d switches", trace, policy,
                         res["met"] * 100, res["accuracy"] * 100, res["switches"])
    after = calibrate(bundle, args.rate, args.calib_n, (0,))[0]
    # kept before the report, so that a failing report loses no run (--report-only writes it again)
    measured = {"slo": slo, "calib": {str(lv): v for lv, v in calib.items()}, "after": after, "table": table,
                "runs": runs, "traces": traces, "policies": policies, "seconds": time.time() - started,
                "bundle_dir": str(bundle_dir), "command": sys.argv[1:]}
    (work / f"{results_name(args)}.measured.json").write_text(json.dumps(measured))
    write_report(args, bundle, work, measured)


def write_report(args, bundle: Bundle, work: Path, m: dict) -> None:
    """The plots and the report from what a run measured (``WORKDIR/NAME.measured.json``)."""
    calib = {int(lv): v for lv, v in m["calib"].items()}
    table = {int(lv): name for lv, name in m["table"].items()}
    slo, traces, policies = m["slo"], m["traces"], m["policies"]
    arrivals = ArrivalTrace.read(work / "traces" / "arrivals.json")
    for trace in traces:
        plot(trace, slo, bundle, work, policies, read_layers(work / "traces", trace), arrivals.duration_s,
             HERE / "results" / f"{results_name(args)}_{trace}.png")
    report(args, bundle, m["bundle_dir"], slo, calib, m["after"], table, m["runs"], traces, policies, m["seconds"],
           "python benchmarks/runtime_adaptation.py " + " ".join(m["command"]))


def report(args, bundle, bundle_dir, slo, calib, after, table, runs, traces, policies, seconds, command) -> None:
    from common import head_commit, machine, write_results

    m = machine("onnxruntime", "numpy")
    commit = head_commit()
    largest = max(bundle, key=lambda s: (s.latency_ms, s.accuracy))
    summary = {t: {p_: mean_runs(runs[t][p_]) for p_ in policies if runs[t][p_]} for t in traces}
    lines = ["# Runtime adaptation: policies against changing CPU load", "",
             f"Machine: {m['cpu']}, {m['cores']} cores (other processes' load during each run: the last column); "
             f"onnxruntime {m['onnxruntime']}, numpy {m['numpy']}; commit {commit}. Command: `{command}`. "
             f"Wall time {seconds / 60:.1f} min.", "",
             f"Bundle `{bundle_dir}`: {len(bundle)} SubNets. Requests: steady {args.rate:g}/s for "
             f"{args.duration:g} s per run, {args.repeats} run(s) per (trace, policy). "
             f"Goal: **{slo:g} ms** per inference"
             + (" (given)." if args.slo_ms else
                f" = {args.goal_factor:g} x the largest SubNet's ({largest.name}) calibrated idle median, rounded up "
                "to 0.1 ms."), "",
             "## Calibration (ms; session.run on the resized input, one request every "
             f"{1000 / args.rate:g} ms; {2 * args.calib_n} per SubNet and level, blocks 0,1,2,2,1,0)", "",
             "| SubNet | accuracy | manifest | idle p50 | idle p99 | 1 busy p50 | 1 busy p99 | 2 busy p50 | 2 busy p99 "
             "| idle p50 after the runs | drift |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in bundle:
        c = [calib[lv][s.name] for lv in LEVELS]
        a50 = q(after[s.name], 0.5)
        lines.append(f"| {s.name} | {s.accuracy * 100:.2f} | {s.latency_ms:.3f} | "
                     + " | ".join(f"{q(v, 0.5):.3f} | {q(v, 0.99):.3f}" for v in c)
                     + f" | {a50:.3f} | {(a50 / q(c[0], 0.5) - 1) * 100:+.0f} % |")
    idle0 = calib[0][largest.name]
    first, second = idle0[:args.calib_n], idle0[args.calib_n:]
    lines += ["", f"Largest SubNet above the goal in the calibration: idle {np.mean(np.array(idle0) > slo) * 100:.1f} %, "
              f"1 busy {np.mean(np.array(calib[1][largest.name]) > slo) * 100:.1f} %, "
              f"2 busy {np.mean(np.array(calib[2][largest.name]) > slo) * 100:.1f} %. Its idle median in the first "
              f"and last calibration block: {q(first, 0.5):.3f} / {q(second, 0.5):.3f} ms, after the runs "
              f"{q(after[largest.name], 0.5):.3f} ms.",
              f"Oracle's SubNet per load level (most accurate with calibrated p{args.oracle_quantile * 100:g} <= goal): "
              + ", ".join(f"{lv} busy: {table[lv]}" for lv in LEVELS) + ".", "",
              "## Results", "",
              "Within goal: the share of inferences whose latency met the goal (min-max over repeats); response: "
              "the same for arrival-to-answer time, the wait behind earlier requests and switches included. "
              "Switch cost: every change of SubNet during the run (all SubNets were loaded by the warm-up). "
              "Monitor: its CPU time over the run's wall time, in % of one core. Other load: the mean cores other "
              "processes kept busy (the monitor's readings) beyond the injected load. Idle slowdown: the median "
              "slowdown the runtime saw while no load was injected (observed latency over its idle latency in "
              "place; about 1 when that is right).", "",
              "| trace | policy | within goal % | response % | idle / 1 / 2 busy % | accuracy % | switches | "
              "switch cost total (median, max) ms | p50 / p99 ms | monitor % core | forecast MAE, coverage | "
              "idle slowdown | other load (cores) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in traces:
        for p_ in policies:
            r = summary[t].get(p_)
            if r is None:
                continue
            met = f"{r['met'] * 100:.1f}" + (f" ({r['met_min'] * 100:.1f}-{r['met_max'] * 100:.1f})"
                                            if r["repeats"] > 1 else "")
            lv = " / ".join(f"{runs[t][p_][0]['by_level'][x]['met'] * 100:.1f}" if x in runs[t][p_][0]["by_level"]
                            else "-" for x in LEVELS)
            medians = [x["switch_ms_median"] for x in runs[t][p_] if x["switch_ms_median"] is not None]
            sw = (f"{r['switch_ms_total']:.2f} ({statistics.median(medians):.3f}, {r['switch_ms_max']:.3f})"
                  if medians else "0")
            lines.append(f"| {t} | {p_} | {met} | {r['response_met'] * 100:.1f} | {lv} | {r['accuracy'] * 100:.2f} | "
                         f"{r['switches']:g} | {sw} | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} | "
                         f"{r['monitor_share'] * 100:.2f} | {r['forecast_mae']:.2f}, {r['forecast_coverage']:.2f} | "
                         f"{r['idle_slowdown_p50']:.2f} | {r['others_beyond_load']:.2f} |")
    # targets
    lines += ["", "## The issue's targets", ""]
    targets = {}
    for t in traces:
        s = summary[t]
        if not {"forecast", "static-largest", "oracle"} <= set(s):
            continue
        targets[t] = {
            "static_largest_below_80": s["static-largest"]["met"] < 0.8,
            "forecast_99": s["forecast"]["met"] >= 0.99,
            "accuracy_within_1pt_of_oracle": s["oracle"]["accuracy"] - s["forecast"]["accuracy"] <= 0.01,
        }
        lines.append(f"- {t}: forecast {s['forecast']['met'] * 100:.1f} % within goal (target >= 99 %: "
                     f"{'met' if targets[t]['forecast_99'] else 'NOT met'}), static-largest "
                     f"{s['static-largest']['met'] * 100:.1f} % ({'below' if targets[t]['static_largest_below_80'] else 'not below'} "
                     f"80 %); forecast accuracy {s['forecast']['accuracy'] * 100:.2f} % vs oracle "
                     f"{s['oracle']['accuracy'] * 100:.2f} % (within 1 point: "
                     f"{'met' if targets[t]['accuracy_within_1pt_of_oracle'] else 'NOT met'})")
    shares = [r["monitor_share"] for t in traces for p_ in policies for r in runs[t][p_]]
    sw = [r["switch_ms_max"] for t in traces for p_ in policies for r in runs[t][p_] if r["switch_ms_max"] is not None]
    fastest_p50 = min(q(calib[0][s.name], 0.5) for s in bundle)
    lines.append(f"- monitor overhead: at most {max(shares) * 100:.2f} % of a core over all runs (target <= 1 %: "
                 f"{'met' if max(shares) <= 0.01 else 'NOT met'})")
    if sw:
        lines.append(f"- switch between loaded SubNets: at most {max(sw):.3f} ms against the fastest SubNet's idle "
                     f"median inference {fastest_p50:.3f} ms (target: less than one inference: "
                     f"{'met' if max(sw) < fastest_p50 else 'NOT met'})")
    targets["monitor_max_share"] = max(shares)
    targets["switch_ms_max"] = max(sw, default=None)
    lines += ["", "Timelines: " + ", ".join(f"`{results_name(args)}_{t}.png`" for t in traces) + "."]
    data = {"machine": m, "commit": commit, "command": command, "seconds": seconds, "slo_ms": slo,
            "bundle": str(bundle_dir), "rate": args.rate, "duration": args.duration, "repeats": args.repeats,
            "oracle_table": table, "targets": targets,
            "calibration": {str(lv): {n: {"p50": q(v, 0.5), "p99": q(v, 0.99), "n": len(v)} for n, v in calib[lv].items()}
                            for lv in LEVELS},
            "after": {n: {"p50": q(v, 0.5), "p99": q(v, 0.99)} for n, v in after.items()},
            "summary": summary, "runs": runs}
    write_results(HERE / "results", results_name(args), data, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
