"""Profiling a device through its agent: over loopback and from a second network host, against
local profiles of the same runtime, and resumed after the agent dies mid-way.

Reproduce (from the repository root, as root: the second host is a Linux network namespace;
after `make install`; about 4 min on 2 idle cores, up to twice that when other work shares them)::

    .venv/bin/python benchmarks/devices.py
    .venv/bin/python benchmarks/devices.py --quick      # smoke run, under a minute; results in the work folder

Model: ``devices:plain_cnn`` (defined here, random weights, seed 0): a MobileNet-V1-like chain
of depthwise-separable convolutions, compiled with ``autotailor compile devices:plain_cnn
--input-size 160 --config WORK/space.toml`` (resolutions 112, 136 and 160, widths 0.25/0.5/0.75/1.0
of each channel group: 344 unique kernels, a few minutes per profile). Kernels of two inputs (a
convolution fused with a residual add) go to the agent as well: ``tests/test_agent.py`` profiles
a residual model remotely; ``--model`` takes another model. Device: ONNX Runtime CPU, one thread
(``ort-cpu:threads=1``, so kernels are timed with caches flushed, 16 MB, and warm), with
``cache_mb=1`` so that ``autotailor profile`` skips the calibration on whole SubNets.

Setups, each an agent (``python -m autotailor.agent``) on this machine:

* ``loopback``: listening on 127.0.0.1;
* ``netns``: a second network host, a network namespace joined to this one by a veth pair
  (10.231.0.1/24 here, 10.231.0.2/24 there), the agent started inside it with
  ``ip netns exec`` and listening on 10.231.0.2 only.

Per setup, paired, in this order: a local profile A, the remote profile
(``autotailor profile WORK --device remote:HOST:PORT/ort-cpu:threads=1,token_file=...``), a local
profile B. The local profiles time each kernel as the agent does (``LocalWall``: the file the
remote profile sends, loaded the same way, the same timed calls and cache flush, less the same
identity kernel's time): ``autotailor profile --device ort-cpu`` itself cannot, it always uses
ONNX Runtime's profiler. The spread between A and B for the same kernels is the machine's noise
over that time; the claim is that remote vs local differs per kernel by no more than that. Once
per run, the local default (``autotailor profile WORK --device ort-cpu:threads=1``, ORT's
profiler) is profiled too, for the systematic difference the docs mention.

Resume (netns setup, its own LUT ``WORK/resume.sqlite``): ``autotailor profile`` is started,
the agent is killed with SIGKILL once ``--kill-after`` of the first pass's entries are in the
LUT; the exit code, error and time to fail are recorded; the agent is started again on the same
address and the same command run again: it must measure only the missing kernels.

Every LUT is made afresh each run (the work folder's ``*.sqlite`` are deleted first; the
compiled SuperNet is kept when model and space are unchanged). The namespace and veth pair are
removed on exit, and leftovers of a crashed run at start.
Results: ``benchmarks/results/devices.{json,md}`` (``--quick``: ``WORK/results/``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import selectors
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE))

from common import machine, write_results  # noqa: E402

NS = "autotailor-bench"  # the second host's network namespace
VETH_HOST, VETH_DEV = "atb-host", "atb-dev"
HOST_IP, DEV_IP, PREFIX = "10.231.0.1", "10.231.0.2", 24
NS_PORT = 8765
# Plain CNN: (in, out, stride) of each depthwise-separable block after a 3x3 stride-2 stem.
BLOCKS = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2)]
# model, input size, space, blocks: the full run's and the smoke run's
FULL = {"input_size": 160, "space": "[var.global_vars]\nresolution = [112, 136, 160]\n"
                                   "[var.block_vars]\nChainBlock.expand_ratio = [0.25, 0.5, 0.75, 1.0]\n"}
QUICK = {"input_size": 96, "space": "[var.global_vars]\nresolution = [96]\n"
                                    "[var.block_vars]\nChainBlock.expand_ratio = [0.5, 1.0]\n"}
PASSES = {16: "flushed", 0: "warm"}  # flush_mb -> the LUT's caches


# -- the model (``autotailor compile devices:plain_cnn``, benchmarks/ on PYTHONPATH) ----------------
def _conv_bn_relu(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def plain_cnn(blocks: int = len(BLOCKS), classes: int = 100) -> nn.Module:
    """Stem, ``blocks`` depthwise-separable blocks, pooling and a linear head."""
    torch.manual_seed(0)
    layers = _conv_bn_relu(3, BLOCKS[0][0], 3, 2)
    for cin, cout, stride in BLOCKS[:blocks]:
        layers += _conv_bn_relu(cin, cin, 3, stride, groups=cin) + _conv_bn_relu(cin, cout, 1, 1)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(BLOCKS[blocks - 1][1], classes))


def plain_cnn_small() -> nn.Module:
    """The smoke run's: two blocks."""
    return plain_cnn(2)


# -- processes ------------------------------------------------------------------------------------
def run(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def cli_env() -> dict[str, str]:
    # benchmarks/ on the path for `devices:plain_cnn`; the client's retry warnings on stderr.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}


def autotailor(*argv: str, check: bool = True) -> tuple[subprocess.CompletedProcess, float]:
    """``autotailor ARGV`` in a subprocess: its result (output captured, echoed) and wall seconds."""
    print("$ autotailor " + " ".join(argv), flush=True)
    started = time.perf_counter()
    proc = subprocess.run([str(BIN / "autotailor"), *argv], capture_output=True, text=True, env=cli_env())
    seconds = time.perf_counter() - started
    for line in (proc.stdout + proc.stderr).splitlines():
        print("  " + line, flush=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"autotailor {argv[0]} failed with exit code {proc.returncode}")
    return proc, seconds


class Namespace:
    """A second network host on this machine: namespace ``NS`` and a veth pair to it."""

    def __init__(self) -> None:
        self.made = False

    @staticmethod
    def clean() -> list[str]:
        """Remove the namespace, the veth pair and any process left in the namespace (by a
        crashed run of this script: nothing else uses it); what was removed."""
        removed = []
        if NS in run(["ip", "netns", "list"], check=False).stdout.split():
            for pid in run(["ip", "netns", "pids", NS], check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    removed.append(f"process {pid} in {NS}")
                except (ProcessLookupError, ValueError):
                    pass
            run(["ip", "netns", "del", NS], check=False)
            removed.append(f"namespace {NS}")
        if run(["ip", "link", "show", VETH_HOST], check=False).returncode == 0:
            run(["ip", "link", "del", VETH_HOST], check=False)  # deletes its peer too
            removed.append(f"veth {VETH_HOST}")
        return removed

    def __enter__(self) -> "Namespace":
        leftovers = self.clean()
        if leftovers:
            print(f"removed leftovers of an earlier run: {', '.join(leftovers)}", flush=True)
        self.made = True
        for cmd in (["ip", "netns", "add", NS],
                    ["ip", "link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_DEV],
                    ["ip", "link", "set", VETH_DEV, "netns", NS],
                    ["ip", "addr", "add", f"{HOST_IP}/{PREFIX}", "dev", VETH_HOST],
                    ["ip", "link", "set", VETH_HOST, "up"],
                    ["ip", "netns", "exec", NS, "ip", "addr", "add", f"{DEV_IP}/{PREFIX}", "dev", VETH_DEV],
                    ["ip", "netns", "exec", NS, "ip", "link", "set", VETH_DEV, "up"],
                    ["ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up"]):
            proc = run(cmd, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip()} (this benchmark needs root)")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.made:
            self.clean()
            self.made = False


class Agent:
    """``python -m autotailor.agent`` as a child process (inside ``netns`` if given)."""

    def __init__(self, host: str, port: int, token_file: Path, log_file: Path, netns: str | None = None):
        self.host, self.port, self.token_file, self.log_file, self.netns = host, port, token_file, log_file, netns
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout_s: float = 60.0) -> "Agent":
        cmd = [sys.executable, "-m", "autotailor.agent", "--host", self.host, "--port", str(self.port),
               "--token-file", str(self.token_file)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]  # execs the agent: its pid is the agent's
        with open(self.log_file, "a") as err:
            err.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n")
            err.flush()
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                         env={**os.environ, "AUTOTAILOR_AGENT_LOG": "WARNING"})
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        line = sel.select(timeout_s) and self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        sel.close()
        if not line or not line.startswith("http://"):
            self.stop()
            raise SystemExit(f"the agent did not start within {timeout_s:.0f} s; see {self.log_file}")
        self.url = line
        self.port = int(line.rsplit(":", 1)[1])  # port 0 asked: the one it took, kept for a restart
        return self

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")

    def kill(self) -> None:
        """SIGKILL: the agent dies as in a crash or a power cut, mid-measurement."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # the agent stops on SIGTERM and removes its temporary directory
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- local profiles timed as the agent times -----------------------------------------------------
def local_wall_backend(flush_mb: int):
    """ONNX Runtime CPU, 1 thread, each kernel timed as ``remote:.../ort-cpu`` times it on the
    agent: the file ``OrtCpu.deploy`` writes (what the remote backend sends), loaded as the
    agent loads it (same session options, same fixed random input), warm-up and timed calls by
    ``time_calls`` with ``flush_mb`` MB overwritten before each, the median less the per-call
    overhead (an identity kernel's file, timed the same way, the fastest of three). Only the
    process and the HTTP round trip differ from the remote profile."""
    from autotailor.predict.latency.backends.base import Backend
    from autotailor.predict.latency.backends.ort import OrtCpu

    class LocalWall(OrtCpu):
        measure = Backend.measure  # wall clock less the overhead, not ORT's profiler
        prober = Backend.prober

        @property
        def settings(self) -> dict[str, object]:
            return {**super().settings, "timing": "local-wall"}

        def prepare(self, module: nn.Module, input_shapes: list) -> Callable[[], object]:
            if len(input_shapes) != 1:
                raise RuntimeError("a kernel with several inputs: the remote profile cannot export it either")
            with tempfile.TemporaryDirectory() as tmp:
                path = self.deploy(module.eval(), Path(tmp) / "kernel", tuple(input_shapes[0]))
                return self.load(path, tuple(input_shapes[0]))

    return LocalWall(threads=1, flush_mb=flush_mb)


def profile_local_wall(work: Path, lut: Path, device: str) -> dict:
    """Both passes (flushed, warm) of a local wall-clock profile into ``lut`` as ``device``."""
    from autotailor.pipeline.workdir import load_supernet
    from autotailor.predict.latency import KernelPlan, LutStore, Target, profile

    plan = KernelPlan(load_supernet(work), "ort-cpu", "fused")
    out = {}
    with LutStore(lut) as store:
        for flush_mb, label in PASSES.items():
            backend = local_wall_backend(flush_mb)
            target = Target.of(device, "ort-cpu", **backend.settings)
            report = profile(plan, backend, store, target)
            out[label] = {"kernels": report.measured, "seconds": report.seconds}
            print(f"  local {device} ({label}): {report.measured} entries in {report.seconds:.1f} s", flush=True)
    return out


# -- LUT reading ------------------------------------------------------------------------------------
def lut_entries(lut: Path, device: str, backend: str, flush_mb: int) -> dict[str, tuple[float, float]]:
    """kernel -> (median ms, measured at) of the target of ``device``/``backend`` with ``flush_mb``."""
    from autotailor.predict.latency import LutStore

    with LutStore(lut) as store:
        for target in store.targets():
            s = dict(target.settings)
            if target.device == device and target.backend == backend and s.get("flush_mb") == flush_mb:
                return {k: (m.median_ms, m.measured_at) for k, m in store.with_prefix(target, "").items()}
    return {}


def count_entries(lut: Path) -> dict[int, int]:
    """Entries per target id, read-only (safe while a profile writes: the LUT is in WAL mode)."""
    try:
        db = sqlite3.connect(f"file:{lut}?mode=ro", uri=True, timeout=1.0)
        try:
            return dict(db.execute("SELECT target, COUNT(*) FROM entries GROUP BY target").fetchall())
        finally:
            db.close()
    except sqlite3.Error:
        return {}  # not made yet


def entry_times(lut: Path) -> dict[tuple[int, str], float]:
    db = sqlite3.connect(f"file:{lut}?mode=ro", uri=True, timeout=5.0)
    try:
        return {(t, k): at for t, k, at in db.execute("SELECT target, kernel, measured_at FROM entries")}
    finally:
        db.close()


# -- comparison -------------------------------------------------------------------------------------
def compare(x: dict, y: dict, kernels: list[str], floor: list[str]) -> dict:
    """y against x per kernel: relative differences y/x - 1 on the kernels in ``floor`` (those
    long enough for a ratio to mean something), absolute differences and LUT sums on all."""
    rel = [y[k][0] / x[k][0] - 1 for k in floor if x[k][0] > 0]
    absolute = [abs(y[k][0] - x[k][0]) * 1e3 for k in kernels]
    gaps = [abs(y[k][1] - x[k][1]) for k in kernels]
    sx, sy = sum(x[k][0] for k in kernels), sum(y[k][0] for k in kernels)
    return {"n": len(rel), "median_abs_rel": statistics.median(abs(r) for r in rel) if rel else None,
            "median_rel": statistics.median(rel) if rel else None,
            "within_5": sum(abs(r) <= 0.05 for r in rel) / len(rel) if rel else None,
            "within_10": sum(abs(r) <= 0.10 for r in rel) / len(rel) if rel else None,
            "median_abs_us": statistics.median(absolute), "sum_rel": sy / sx - 1,
            "median_gap_s": statistics.median(gaps)}


def compare_setup(lut: Path, local: Path, address: str, profiler: str, setup: str, min_ms: float) -> dict:
    """Remote vs local A and B, A vs B (the noise), and both against the local ORT-profiler LUT."""
    from autotailor.predict.latency.predictor import OVERHEAD_KERNEL

    out = {}
    for flush_mb, label in PASSES.items():
        a = lut_entries(local, f"local-{setup}-A", "ort-cpu", flush_mb)
        b = lut_entries(local, f"local-{setup}-B", "ort-cpu", flush_mb)
        r = lut_entries(lut, address, "remote", flush_mb)
        p = lut_entries(lut, profiler, "ort-cpu", flush_mb)
        kernels = sorted(k for k in a if k != OVERHEAD_KERNEL)
        missing = [k for k in kernels if k not in b or k not in r or k not in p]
        if missing or len(a) != len(r):
            raise SystemExit(f"{setup}/{label}: the LUTs do not hold the same kernels ({len(missing)} missing)")
        floor = [k for k in kernels if (a[k][0] + b[k][0]) / 2 >= min_ms and min(a[k][0], b[k][0]) > 0]
        out[label] = {
            "kernels": len(kernels), "kernels_at_least_min_ms": len(floor),
            "lut_sum_ms": {"local_A": sum(a[k][0] for k in kernels), "remote": sum(r[k][0] for k in kernels),
                           "local_B": sum(b[k][0] for k in kernels), "local_profiler": sum(p[k][0] for k in kernels)},
            "overhead_us": {"local_A": a[OVERHEAD_KERNEL][0] * 1e3, "remote": r[OVERHEAD_KERNEL][0] * 1e3,
                            "local_B": b[OVERHEAD_KERNEL][0] * 1e3, "local_profiler": p[OVERHEAD_KERNEL][0] * 1e3},
            "remote_vs_A": compare(a, r, kernels, floor), "remote_vs_B": compare(b, r, kernels, floor),
            "noise_B_vs_A": compare(a, b, kernels, floor),
            "A_vs_profiler": compare(p, a, kernels, floor), "remote_vs_profiler": compare(p, r, kernels, floor),
        }
        # Pooled: each remote timing against both local ones, as one sample of differences.
        pooled = [[r[k][0] / a[k][0] - 1, r[k][0] / b[k][0] - 1] for k in floor]
        noise = [[b[k][0] / a[k][0] - 1] for k in floor]
        flat = [d for pair in pooled for d in pair]
        c = out[label]
        c["remote_vs_local_pooled"] = {
            "median_abs_rel": statistics.median(abs(d) for d in flat) if flat else None,
            "within_5": sum(abs(d) <= 0.05 for d in flat) / len(flat) if flat else None,
            "within_10": sum(abs(d) <= 0.10 for d in flat) / len(flat) if flat else None,
            "ci95": median_abs_ci(pooled)}
        c["noise_B_vs_A"]["ci95"] = median_abs_ci(noise)
        # Within the noise: the remote's median difference is no larger than what the noise's
        # own median could be, given its sampling uncertainty (the upper end of its 95 % interval).
        rv, hi = c["remote_vs_local_pooled"]["median_abs_rel"], c["noise_B_vs_A"]["ci95"]
        c["within_noise"] = rv is not None and hi is not None and rv <= hi[1]
        c["remote_over_noise"] = rv / c["noise_B_vs_A"]["median_abs_rel"] if rv is not None and \
            c["noise_B_vs_A"]["median_abs_rel"] else None
    return out


def median_abs_ci(per_kernel: list[list[float]], draws: int = 2000) -> list[float] | None:
    """95 % bootstrap interval of the median absolute difference, resampling kernels (each
    kernel's differences stay together)."""
    if not per_kernel:
        return None
    rng = np.random.default_rng(0)
    values = np.abs(np.asarray(per_kernel))
    picks = rng.integers(0, len(values), size=(draws, len(values)))
    medians = np.median(values[picks].reshape(draws, -1), axis=1)
    return [float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))]


def health_rtt(url: str, token: str, calls: int = 20) -> dict:
    """The agent's facts, and the median round trip of ``GET /health`` (a new connection each)."""
    from autotailor.agent import AgentClient

    client = AgentClient(url, token)
    health = client.health()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        client.health()
        times.append((time.perf_counter() - t) * 1e3)
    ort = health["runtimes"]["ort-cpu"]
    return {"health_rtt_ms": statistics.median(times), "agent_machine": health["machine"],
            "agent_onnxruntime": ort["version"], "protocol": health["protocol"]}


def said(proc: subprocess.CompletedProcess) -> list[str]:
    """What ``autotailor profile`` said about the LUT: entries already there, kernels measured."""
    return [line.strip() for line in proc.stdout.splitlines()
            if " already in " in line or line.strip().startswith("measured ")]


# -- the steps --------------------------------------------------------------------------------------
def paired(work: Path, setup: str, agent: Agent, token: Path, spec: str, local: Path) -> dict:
    """Local A, remote (``autotailor profile``), local B, for one setup."""
    print(f"\n== {setup}: local A, remote via {agent.url}, local B", flush=True)
    out: dict = {"agent_url": agent.url, **health_rtt(agent.url, token.read_text().strip())}
    started = time.time()
    out["local_A"] = profile_local_wall(work, local, f"local-{setup}-A")
    proc, seconds = autotailor("profile", str(work), "--device",
                               f"remote:{agent.address}/{spec},token_file={token},cache_mb=1", "--quiet")
    out["remote"] = {"command_seconds": seconds, "said": said(proc)}
    out["local_B"] = profile_local_wall(work, local, f"local-{setup}-B")
    out["seconds"] = time.time() - started
    return out


def resume(work: Path, agent: Agent, token: Path, spec: str, kernels: int, kill_after: float) -> dict:
    """Kill the agent mid-way through a remote profile, start it again, run the profile again."""
    lut = work / "resume.sqlite"
    device = f"remote:{agent.address}/{spec},token_file={token},cache_mb=1"
    argv = ["profile", str(work), "--device", device, "--lut", str(lut), "--quiet"]
    threshold = max(2, round(kill_after * (kernels + 1)))
    print(f"\n== resume: killing the agent at {agent.url} once {threshold} of {kernels + 1} entries of the first "
          f"pass are in {lut.name}", flush=True)
    print("$ autotailor " + " ".join(argv), flush=True)
    out_file, err_file = work / "resume-first.out", work / "resume-first.err"
    with open(out_file, "w") as so, open(err_file, "w") as se:
        started = time.perf_counter()
        proc = subprocess.Popen([str(BIN / "autotailor"), *argv], stdout=so, stderr=se, text=True, env=cli_env())
        try:
            while sum(count_entries(lut).values()) < threshold:
                if proc.poll() is not None:
                    raise SystemExit(f"the profile ended (exit code {proc.returncode}) before {threshold} entries; "
                                     f"see {err_file}")
                time.sleep(0.02)
            agent.kill()
            killed = time.perf_counter()
            at_kill = sum(count_entries(lut).values())
            code = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        failed = time.perf_counter()
    err = err_file.read_text()
    for line in (out_file.read_text() + err).splitlines():
        print("  " + line, flush=True)
    before = entry_times(lut)
    first = {"exit_code": code, "seconds_before_kill": killed - started, "entries_at_kill": at_kill,
             "entries_after_exit": len(before), "seconds_from_kill_to_exit": failed - killed,
             "error": next((line for line in err.splitlines() if line.startswith("autotailor: error")), None),
             "retry_warnings": [line for line in err.splitlines() if line.startswith("WARNING") and "attempt" in line]}
    agent.start()
    print(f"agent started again at {agent.url}", flush=True)
    token_text = token.read_text().strip()
    from autotailor.agent import AgentClient

    proc2, seconds = autotailor(*argv, check=False)
    health = AgentClient(agent.url, token_text).health()
    after = entry_times(lut)
    counts = count_entries(lut)
    kept = sum(after.get(k) == t for k, t in before.items())
    # What the agent should have run: each new kernel entry once; the identity kernel 3 times for
    # each pass's per-call overhead (the remote backend's, before its first kernel), 3 more for a
    # pass's overhead entry when the LUT lacks it.
    from autotailor.predict.latency.predictor import OVERHEAD_KERNEL

    new = [key for key in after if key not in before]
    new_kernels = [key for key in new if key[1] != OVERHEAD_KERNEL]
    expected = len(new_kernels) + 3 * len({t for t, _ in new_kernels}) + 3 * (len(new) - len(new_kernels))
    second = {"exit_code": proc2.returncode, "command_seconds": seconds,
              "said": said(proc2),
              "entries_total": len(after), "entries_measured": len(after) - len(before),
              "entries_per_target": sorted(counts.values()), "expected_per_target": kernels + 1,
              "entries_before_kept_unchanged": kept, "agent_measurements": health["measurements"],
              "agent_replayed": health["replayed"], "agent_measurements_expected": expected}
    second["complete"] = all(n == kernels + 1 for n in counts.values()) and len(counts) == len(PASSES)
    return {"lut": lut.name, "command": "autotailor " + " ".join(argv), "threshold": threshold,
            "first_run": first, "second_run": second}


# -- report -----------------------------------------------------------------------------------------
def pct(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{100 * v:.{digits}f} %"


def signed(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:+.1f} %"


def interval(ci: list[float] | None) -> str:
    return "" if ci is None else f"[{100 * ci[0]:.1f}-{100 * ci[1]:.1f}]"


def passes_said(lines: list[str]) -> str:
    """Per pass, what ``autotailor profile`` found in the LUT and measured, without the paths."""
    out = []
    for line in lines:
        if " already in " in line:
            out.append(line.split(" already in ")[0] + " entries already there, ")
        elif line.startswith("measured ") and out:
            out[-1] += line.split(";")[0]
    return "; ".join(f"{label} pass: {x}" for label, x in zip(PASSES.values(), out))


def measured_said(lines: list[str]) -> str:
    """``measured N kernels in S s`` of each pass, from what ``autotailor profile`` said."""
    return " + ".join(x.split(";")[0].removeprefix("measured ") for x in lines if x.startswith("measured"))


def report(data: dict) -> str:
    m, mo = data["machine"], data["model"]
    lines = ["# Profiling through the agent: loopback, a second network host, resuming", "",
             f"Machine: {m['cpu']}, {m['cores']} cores (load average {data['load_average']['start'][0]:.2f} at the "
             f"start, {data['load_average']['end'][0]:.2f} at the end: other work shares them); onnxruntime "
             f"{m['onnxruntime']}, torch {m['torch']}, Python {m['python']}; commit {data['commit']}. "
             f"Command: `{data['command']}` ({data['seconds'] / 60:.1f} min).", "",
             f"Model `{mo['spec']}` at {mo['input_size']} px, space `{'; '.join(mo['space'].split(chr(10))).strip('; ') or 'default'}`: {mo['kernels']} unique "
             f"fused kernels (+ the per-call overhead entry) per LUT pass. Device `{data['spec']}`, each LUT in two "
             "passes (caches flushed by overwriting 16 MB before each timed call, and warm), no calibration "
             "(`cache_mb=1`). The agent runs on this same machine, over loopback or inside a network namespace "
             f"reached through a veth pair ({HOST_IP} -> {DEV_IP}).", "",
             "## Remote against local, paired", "",
             "Per setup: local profile A, the remote profile, local profile B. The local profiles time each kernel "
             "as the agent does (the same ONNX file, session options, input, timed calls, flush and overhead "
             "subtraction, in this process): `autotailor profile --device ort-cpu` offers no wall-clock timing, it "
             "always uses ONNX Runtime's profiler. Differences are per kernel, y/x - 1, over the kernels whose local "
             f"median is at least {data['min_ms']} ms (shorter ones: only the absolute difference, over all kernels). "
             "Noise: local B against local A, the same kernels timed again on the same machine; remote pooled: each "
             "remote timing against both local ones. The median time between the two timings of a kernel is given: "
             "A and B are about twice as far apart as either is from the remote one, so drift weighs a little more "
             "on the noise than on remote vs local.", "",
             "Within the noise: the remote's pooled median difference is at most the upper end of the 95 % "
             "bootstrap interval of the noise's median (kernels resampled), i.e. the remote timings differ from the "
             "local ones no more than local ones differ from each other, as far as this many kernels can tell.", "",
             "| setup | caches | kernels (>= floor) | remote vs local: median abs. diff., pooled [95 % CI] (vs A / vs B) | "
             "noise, B vs A: median abs. diff. [95 % CI] | remote / noise | within 5 %: remote pooled / noise | "
             "within 10 %: remote pooled / noise | median signed diff.: remote vs A / noise | LUT sum diff.: remote "
             "vs A / noise | median abs. diff., all kernels (us): remote vs A / noise | time apart (s): remote-A / "
             "B-A | remote within the noise |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for setup, s in data["setups"].items():
        for label, c in s["comparison"].items():
            ra, rb, n, pool = c["remote_vs_A"], c["remote_vs_B"], c["noise_B_vs_A"], c["remote_vs_local_pooled"]
            ratio = "n/a" if c["remote_over_noise"] is None else f"{c['remote_over_noise']:.2f}"
            lines.append(
                f"| {setup} | {label} | {c['kernels']} ({c['kernels_at_least_min_ms']}) | "
                f"{pct(pool['median_abs_rel'])} {interval(pool['ci95'])} ({pct(ra['median_abs_rel'])} / "
                f"{pct(rb['median_abs_rel'])}) | {pct(n['median_abs_rel'])} {interval(n['ci95'])} | {ratio} | "
                f"{pct(pool['within_5'], 0)} / {pct(n['within_5'], 0)} | "
                f"{pct(pool['within_10'], 0)} / {pct(n['within_10'], 0)} | {signed(ra['median_rel'])} / "
                f"{signed(n['median_rel'])} | {signed(ra['sum_rel'])} / {signed(n['sum_rel'])} | "
                f"{ra['median_abs_us']:.1f} / {n['median_abs_us']:.1f} | {ra['median_gap_s']:.0f} / "
                f"{n['median_gap_s']:.0f} | {'yes' if c['within_noise'] else 'no'} |")
    lines += ["", "LUT sums (ms, all kernels) and the per-call overhead entry (us), local A / remote / local B "
              "(local ORT profiler):", ""]
    for setup, s in data["setups"].items():
        for label, c in s["comparison"].items():
            su, ov = c["lut_sum_ms"], c["overhead_us"]
            lines.append(f"- {setup}, {label}: sums {su['local_A']:.3f} / {su['remote']:.3f} / {su['local_B']:.3f} "
                         f"({su['local_profiler']:.3f}); overhead {ov['local_A']:.1f} / {ov['remote']:.1f} / "
                         f"{ov['local_B']:.1f} ({ov['local_profiler']:.1f})")
    lines += ["", "## Against the local default (ONNX Runtime's profiler)", "",
              "`autotailor profile WORK --device ort-cpu:threads=1` once per run, before the setups: its entries are "
              "the kernels' nodes summed by ORT's profiler (reorder nodes, the consumer node and the profiler's own "
              "cost per node left out), so the wall-clock timings differ from it by design, not by noise.", "",
              "| setup | caches | local A vs profiler: median abs. / signed diff. | remote vs profiler: median abs. / "
              "signed diff. | LUT sum diff.: local A / remote vs profiler | noise: B vs A (median abs.) |",
              "|---|---|---|---|---|---|"]
    for setup, s in data["setups"].items():
        for label, c in s["comparison"].items():
            ap, rp, n = c["A_vs_profiler"], c["remote_vs_profiler"], c["noise_B_vs_A"]
            lines.append(f"| {setup} | {label} | {pct(ap['median_abs_rel'])} / {signed(ap['median_rel'])} | "
                         f"{pct(rp['median_abs_rel'])} / {signed(rp['median_rel'])} | {signed(ap['sum_rel'])} / "
                         f"{signed(rp['sum_rel'])} | {pct(n['median_abs_rel'])} |")
    lines += ["", "## Profiling time", "",
              "| setup | agent: CPU, cores, onnxruntime | GET /health round trip (ms) | local A: flushed + warm (s) | remote `autotailor profile` "
              "(s, whole command with its start-up: kernels measured in each pass) | local B (s) |", "|---|---|---|---|---|---|"]
    lp = data["local_profiler"]
    for setup, s in data["setups"].items():
        la, lb = s["local_A"], s["local_B"]
        am = s["agent_machine"]
        lines.append(f"| {setup} | {s['agent_url']}: {am.get('cpu_model')}, {am.get('usable_cores')} of {am.get('cores')}, "
                     f"{s['agent_onnxruntime']} | {s['health_rtt_ms']:.2f} | "
                     f"{la['flushed']['seconds']:.1f} + {la['warm']['seconds']:.1f} | "
                     f"{s['remote']['command_seconds']:.1f}: {measured_said(s['remote']['said'])} | "
                     f"{lb['flushed']['seconds']:.1f} + {lb['warm']['seconds']:.1f} |")
    lines += ["", f"Local default (ORT profiler) `autotailor profile`: {lp['command_seconds']:.1f} s: "
              f"{measured_said(lp['said'])}.", ""]
    r = data["resume"]
    f, s2 = r["first_run"], r["second_run"]
    lines += ["## Resume after the agent dies", "",
              f"`{r['command']}` on the netns agent; SIGKILL to the agent once {r['threshold']} entries of the first "
              f"pass were in the LUT ({f['seconds_before_kill']:.1f} s after the start).", "",
              f"- entries at the kill: {f['entries_at_kill']}; when the command had exited: {f['entries_after_exit']}",
              f"- the command: exit code {f['exit_code']}, {f['seconds_from_kill_to_exit']:.1f} s after the kill, "
              f"after {len(f['retry_warnings'])} failed attempts of the client (the first: "
              f"{f['retry_warnings'][0].split('failed (')[-1].split(')')[0] if f['retry_warnings'] else 'none'}); its error: "
              f"`{f['error']}`" if f["error"] else f"- the command: exit code {f['exit_code']}, no error line",
              f"- agent started again on the same address; the same command: exit code {s2['exit_code']} in "
              f"{s2['command_seconds']:.1f} s; {passes_said(s2['said'])}",
              f"- measured after the restart: {s2['entries_measured']} entries, total {s2['entries_total']} "
              f"({s2['entries_per_target']} per pass, {s2['expected_per_target']} expected: "
              f"{'complete' if s2['complete'] else 'INCOMPLETE'}); the {f['entries_after_exit']} entries made before "
              f"the kill: {s2['entries_before_kept_unchanged']} kept unchanged (same measurement time)",
              f"- the restarted agent ran {s2['agent_measurements']} measurements ({s2['agent_replayed']} replayed); "
              f"expected {s2['agent_measurements_expected']}: each new kernel entry once, and an identity kernel "
              "timed 3 times for each pass's per-call overhead, 3 more for a pass's overhead entry when the LUT "
              "lacks it", ""]
    lines += ["## Notes", ""] + [f"- {n}" for n in data["notes"]] + [""]
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: a two-block model at 96 px (under a minute)")
    p.add_argument("--workdir", default=None, help="default benchmarks/work/devices (--quick: devices-quick)")
    p.add_argument("--results", default=None, help="default benchmarks/results (--quick: WORKDIR/results)")
    p.add_argument("--model", default=None,
                   help="what `autotailor compile` compiles (default devices:plain_cnn, --quick devices:plain_cnn_small);"
                        " another model gets the default space and --input-size")
    p.add_argument("--input-size", type=int, default=None)
    p.add_argument("--min-ms", type=float, default=0.02,
                   help="relative differences only for kernels whose local median is at least this (default 0.02)")
    p.add_argument("--kill-after", type=float, default=0.5,
                   help="kill the agent once this share of the first pass's entries is in the LUT (default 0.5)")
    p.add_argument("--report-only", action="store_true", help="write the report again from RESULTS/devices.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    preset = QUICK if args.quick else FULL
    work = Path(args.workdir or HERE / "work" / ("devices-quick" if args.quick else "devices")).resolve()
    results = Path(args.results) if args.results else (work / "results" if args.quick else HERE / "results")
    if args.report_only:
        data = json.loads((results / "devices.json").read_text())
        write_results(results, "devices", data, report(data))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("this benchmark makes a network namespace: run it as root")
    spec_model = args.model or ("devices:plain_cnn_small" if args.quick else "devices:plain_cnn")
    builtin = spec_model.startswith("devices:")
    input_size = args.input_size or preset["input_size"]
    space = preset["space"] if builtin else ""
    command = " ".join(["python", "benchmarks/devices.py", *sys.argv[1:]])
    spec = "ort-cpu:threads=1"
    started = time.time()
    load_start = os.getloadavg()
    # SIGTERM cleans up as Ctrl-C does (the finally blocks below).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    work.mkdir(parents=True, exist_ok=True)
    for old in sorted([*work.glob("*.sqlite*"), *work.glob("agent-*.log")]):  # every LUT is made afresh
        old.unlink()
    token = work / "token"
    token.write_text(secrets.token_urlsafe(32) + "\n")
    token.chmod(0o600)
    compiled = {"model": spec_model, "input_size": input_size, "space": space}
    marker = work / "compiled.json"
    if not (work / "supernet.pt").is_file() or not marker.is_file() or json.loads(marker.read_text()) != compiled:
        argv = ["compile", spec_model, "--input-size", str(input_size), "--out", str(work), "--force"]
        if space:
            (work / "space.toml").write_text(space)
            argv += ["--config", str(work / "space.toml")]
        autotailor(*argv)
        marker.write_text(json.dumps(compiled))
    from autotailor.pipeline.workdir import load_supernet
    from autotailor.predict.latency import KernelPlan

    plan = KernelPlan(load_supernet(work), "ort-cpu", "fused")
    kernels = len(plan.kernels)
    inputs = sorted({len(plan.example(k)[1]) for k in plan.kernels})
    print(f"{kernels} unique kernels (fused, ort-cpu); inputs per kernel: {inputs}", flush=True)
    if inputs != [1]:
        print("warning: kernels with several inputs: the remote profile fails on them (see the report's notes)",
              flush=True)

    lut, local = work / "latency.sqlite", work / "local-wall.sqlite"
    data: dict = {"machine": machine("torch", "onnxruntime", "numpy"), "command": command,
                  "commit": run(["git", "describe", "--always", "--dirty"], check=False, cwd=ROOT).stdout.strip(),
                  "quick": args.quick, "spec": spec, "min_ms": args.min_ms, "kill_after": args.kill_after,
                  "model": {"spec": spec_model, "input_size": input_size, "space": space, "kernels": kernels,
                            "inputs_per_kernel": inputs},
                  "setups": {}}
    agents: list[Agent] = []
    try:
        with Namespace():
            print("\n== local default: ORT's profiler", flush=True)
            proc, seconds = autotailor("profile", str(work), "--device", f"{spec},cache_mb=1", "--device-name",
                                       "local-profiler", "--quiet")
            data["local_profiler"] = {"command_seconds": seconds, "said": said(proc)}
            loop = Agent("127.0.0.1", 0, token, work / "agent-loopback.log")
            agents.append(loop.start())
            data["setups"]["loopback"] = paired(work, "loopback", loop, token, spec, local)
            loop.stop()
            ns = Agent(DEV_IP, NS_PORT, token, work / "agent-netns.log", netns=NS)
            agents.append(ns.start())
            data["setups"]["netns"] = paired(work, "netns", ns, token, spec, local)
            for setup, agent in (("loopback", loop), ("netns", ns)):
                data["setups"][setup]["comparison"] = compare_setup(lut, local, agent.address, "local-profiler",
                                                                    setup, args.min_ms)
            data["resume"] = resume(work, ns, token, spec, kernels, args.kill_after)
            ns.stop()
    finally:
        for agent in agents:
            agent.stop()
    data["seconds"] = time.time() - started
    data["load_average"] = {"start": load_start, "end": os.getloadavg()}
    data["notes"] = [
        "The local wall-clock profiles are made in this benchmark's process with the library's own pieces "
        "(`Backend.measure` on `OrtCpu.deploy`/`load`); the CLI has no such option for ort-cpu.",
        "The agent runs on the same 2 cores as the host side of the profile; the host exports the next kernel "
        "only after the agent has answered, so the two never run at once."]
    write_results(results, "devices", data, report(data))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: agents stopped, namespace and veth pair removed", file=sys.stderr)
        sys.exit(130)
