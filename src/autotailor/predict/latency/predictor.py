"""Learning-free SubNet costs: latency as a sum of profiled kernels, and MACs, parameters and
peak memory counted from the kernels' shapes.

``profile`` measures the kernels of a ``KernelPlan`` that a LUT does not hold yet (each
committed as it is measured, so an interrupted run loses nothing); ``LatencyPredictor``
predicts a SubNet's latency as the runtime's fixed per-call overhead plus, for every kernel
the SubNet runs, its LUT median (what the kernel costs inside a model: see the backends).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from autotailor.errors import LatencyError
from autotailor.predict.latency.kernels import Kernel, KernelPlan
from autotailor.predict.latency.lut import LutStore, Measurement, Target
from autotailor.predict.latency.backends import Backend
from autotailor.predict.latency.backends.base import torch_on_one_thread
from autotailor.supernet import Arch

log = logging.getLogger(__name__)

OVERHEAD_KERNEL = "overhead"  # the LUT entry of the runtime's per-call overhead
NOISY = 0.05  # reference readings spread beyond ±5 %: warned about (half of the predictor's ±10 %)
BYTES_PER_VALUE = 4  # float32


@dataclass(frozen=True)
class ProfileReport:
    kernels: int
    measured: int
    seconds: float


def profile(plan: KernelPlan, backend: Backend, store: LutStore, target: Target,
            on_kernel: Callable[[int, int], None] | None = None, reference_every_s: float = 1.0) -> ProfileReport:
    """Measure the kernels of ``plan`` that ``store`` lacks for ``target``, and the overhead.

    Paired design: the reference kernel (``Backend.reference_probe``) is timed at the start
    and after every ``reference_every_s`` of measuring; each kernel is stored with the lower
    of the two readings around it (a disturbance only ever slows a reading down), so that
    ``LatencyPredictor.from_store`` can bring every entry to one machine speed. A VM's speed
    drifts by tens of percent over tens of seconds, which would otherwise be baked into
    whichever kernels were measured then. Kernels are committed at each reading: an
    interrupted run loses at most ``reference_every_s`` of work.

    ``on_kernel(done, total)`` is called after each measurement (progress bars).
    """
    started = time.perf_counter()
    signatures = [k.signature for k in plan.kernels]
    missing = store.missing(target, [OVERHEAD_KERNEL, *signatures])
    by_signature = {k.signature: k for k in plan.kernels}
    with torch_on_one_thread():
        reference = backend.reference_probe() if missing else None
        before, since = (reference() if reference else 0.0), time.perf_counter()
        pending: list[tuple[str, Measurement]] = []
        for done, sig in enumerate(missing, 1):
            if sig == OVERHEAD_KERNEL:
                pending.append((sig, backend.overhead()))
            else:
                module, shapes = plan.example(by_signature[sig])
                try:
                    # Computed from constants alone (a class token expanded to the batch): a
                    # static-shape conversion folds it, and a runtime may not take a model without inputs.
                    pending.append((sig, backend.measure(module, shapes) if shapes else Measurement(0.0, 0.0, 0)))
                except Exception as exc:
                    raise LatencyError(f"profiling kernel {sig!r} on {target} failed: {exc}") from exc
            if done == len(missing) or time.perf_counter() - since >= reference_every_s:
                assert reference is not None
                after = reference()
                for key, m in pending:
                    store.put(target, key, dataclasses.replace(m, reference_ms=min(before, after)))
                pending, before, since = [], after, time.perf_counter()
            if on_kernel is not None:
                on_kernel(done, len(missing))
    report = ProfileReport(len(signatures) + 1, len(missing), time.perf_counter() - started)
    log.info("profiled %d of %d kernels on %s in %.1f s", report.measured, report.kernels, target, report.seconds)
    speed = store.speed(target)
    if speed is not None and speed.noise > NOISY:
        log.warning("the machine's speed moved by ±%.0f%% while %s was profiled (the reference kernel's 10-90%% "
                    "range), more than the ±%.0f%% that keeps predictions within ±10%%; the paired design "
                    "corrects drift, not short bursts: profile again on a quieter machine if the predictions "
                    "disagree with measurements", 100 * speed.noise, target, 100 * NOISY)
    return report


class LatencyPredictor:
    """``predict(arch)``: the latency (ms) of SubNet ``arch`` on one target, from its LUT."""

    def __init__(self, plan: KernelPlan, kernel_ms: list[float], overhead_ms: float):
        self.plan = plan
        self.overhead_ms = overhead_ms
        self.kernel_ms = list(kernel_ms)
        self._groups = [(g.variables, g.block, {c: self.kernel_ms[k] for c, k in g.table.items()})
                        for g in plan.groups]

    @classmethod
    def from_store(cls, plan: KernelPlan, store: LutStore, target: Target,
                   reference_ms: float | None = None) -> "LatencyPredictor":
        """From ``target``'s entries, each brought to the machine speed at which the reference
        kernel takes ``reference_ms`` (default: the median of ``target``'s own readings)."""
        entries = store.get(target, [OVERHEAD_KERNEL, *(k.signature for k in plan.kernels)])
        missing = len(plan.kernels) + 1 - len(entries)
        if missing:
            raise LatencyError(
                f"the LUT lacks {missing} of {len(plan.kernels) + 1} kernels for {target}; profile them first")
        if reference_ms is None:
            speed = store.speed(target)
            reference_ms = None if speed is None else speed.median_ms
        return cls(plan, [entries[k.signature].at_speed(reference_ms) for k in plan.kernels],
                   entries[OVERHEAD_KERNEL].at_speed(reference_ms))

    def predict(self, arch: Arch) -> float:
        """Predicted latency (ms) of ``arch`` (a complete architecture: see ``Space.complete``)."""
        dropped = self.plan.dropped(arch)
        total = self.overhead_ms
        for variables, block, table in self._groups:
            if block not in dropped:
                total += table[tuple(arch[v] for v in variables)]
        return total


def cache_bytes() -> int:
    """What one core can keep of a model in its caches: its own L2 plus its share of the
    last-level cache (size divided by the CPUs sharing it), from Linux's sysfs; 8 MiB when
    that is not readable."""
    from pathlib import Path

    def size(text: str) -> int:
        text = text.strip().upper()
        factor = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        return int(text.rstrip("KMG")) * factor

    def sharing(text: str) -> int:
        n = 0
        for part in text.strip().split(","):
            lo, _, hi = part.partition("-")
            n += int(hi or lo) - int(lo) + 1
        return n

    caches = {}
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            level = int((d / "level").read_text())
            caches[level] = size((d / "size").read_text()) // sharing((d / "shared_cpu_list").read_text())
        except (OSError, ValueError):
            continue
    return sum(v for k, v in caches.items() if k >= 2) or 8 * 2**20


@dataclass(frozen=True)
class CacheModel:
    """How a device's memory hierarchy treats a SubNet of W bytes of weights.

    * ``cache_bytes`` C: a SubNet with W <= C keeps its weights in cache from one inference to
      the next, so its kernels run as measured warm;
    * ``cold_share`` φ: of a larger one, the share ``1 - C/W`` of its weights comes from further
      away, so the prediction moves from warm toward flushed by ``φ (1 - C/W)``. A flushed
      kernel reads its input from far too, while inside a model the kernel before has just
      written it: a model's kernels are rarely all the way to flushed;
    * ``stream_bytes`` D and ``stream_ms_per_mib`` τ: weights beyond D stream from main memory
      on every inference, which a flushed kernel (its weights still in the last-level cache)
      does not show: ``τ (W - D)`` more;
    * ``in_model_ratio`` κ: what a kernel costs inside a model over what it cost timed alone.
      A backend timed by wall clock (NCNN) pays, for each kernel alone, the handling of a
      model's input and output (growing with the activations' size), which a whole model pays
      once: κ = 0.82-0.88 for the four models measured. ONNX Runtime's kernels are timed by
      its profiler, inside the run: κ near 1. The runtime's per-call overhead, paid once, is
      not scaled.
    """

    cache_bytes: int
    cold_share: float = 1.0
    stream_bytes: float = math.inf
    stream_ms_per_mib: float = 0.0
    in_model_ratio: float = 1.0

    def latency(self, weights: int, hot_ms: float, cold_ms: float, overhead_ms: float = 0.0) -> float:
        """A SubNet's latency from its weights (bytes), its warm and flushed kernel sums and the
        runtime's per-call overhead (paid once, so not scaled by κ)."""
        ms = hot_ms
        if weights > self.cache_bytes:
            ms += self.cold_share * (1.0 - self.cache_bytes / weights) * (cold_ms - hot_ms)
        ms *= self.in_model_ratio
        if weights > self.stream_bytes:
            ms += self.stream_ms_per_mib * (weights - self.stream_bytes) / 2**20
        return ms + overhead_ms


class CacheAwarePredictor:
    """Latency from two LUTs of one device: kernels measured with the caches flushed (``cold``)
    and without (``hot``), combined by the device's ``CacheModel`` from the SubNet's weights."""

    def __init__(self, cold: LatencyPredictor, hot: LatencyPredictor, costs: "CostModel", cache: CacheModel):
        self.cold, self.hot, self.costs, self.cache = cold, hot, costs, cache
        plan = costs.plan
        params = [kernel_costs(plan, k)[1] for k in plan.kernels]
        # One pass sums both latencies and the weights: (hot ms, cold ms, parameters) per choice.
        self._groups = [(g.variables, g.block, {c: (hot.kernel_ms[k], cold.kernel_ms[k], params[k])
                                                for c, k in g.table.items()}) for g in plan.groups]

    def describe(self) -> str:
        """The cache model in words (C and φ only where there are two tables for them to act on)."""
        c = self.cache
        parts = [] if self.hot is self.cold else [f"cache budget {c.cache_bytes / 2**20:g} MiB", f"cold share {c.cold_share:g}"]
        if c.stream_ms_per_mib:
            parts.append(f"weights beyond {c.stream_bytes / 2**20:g} MiB streaming at {c.stream_ms_per_mib:.3f} ms/MiB")
        return ", ".join(parts + [f"kernels inside a model x{c.in_model_ratio:.2f}"])

    def predict(self, arch: Arch) -> float:
        dropped = self.costs.plan.dropped(arch)
        hot = cold = 0.0
        params = 0
        for variables, block, table in self._groups:
            if block not in dropped:
                h, c, p = table[tuple(arch[v] for v in variables)]
                hot, cold, params = hot + h, cold + c, params + p
        # A whole model is not flushed between calls: the warm table's overhead.
        return self.cache.latency(params * BYTES_PER_VALUE, hot, cold, self.hot.overhead_ms)


SUBNET_PREFIX = "subnet:"


def subnet_key(arch: Arch) -> str:
    """The LUT entry of a whole SubNet's measured latency (the calibration's and verified SubNets)."""
    return SUBNET_PREFIX + json.dumps(arch, sort_keys=True, separators=(",", ":"))


def subnet_arch(key: str) -> Arch:
    """The architecture of a ``subnet_key`` (``LatencyError`` if ``key`` is not one)."""
    if not key.startswith(SUBNET_PREFIX):
        raise LatencyError(f"{key!r} is not a whole SubNet's LUT entry (those start with {SUBNET_PREFIX!r})")
    return json.loads(key[len(SUBNET_PREFIX):])


def spread_by_weight(archs: list[Arch], costs: "CostModel", n: int) -> list[Arch]:
    """``n`` of ``archs`` (fewer if they repeat) spanning their range of weight sizes: their
    quantiles by parameters, lightest first."""
    ordered = sorted(archs, key=costs.params)
    picked = {subnet_key(a): a for a in (ordered[round(i * (len(ordered) - 1) / max(1, n - 1))] for i in range(n))}
    return list(picked.values())


def calibration_archs(space, costs: "CostModel", n: int = 20, seed: int = 20261122) -> list[Arch]:
    """The space's smallest and largest SubNets and, between them, ``n`` more (fewer if the space
    repeats itself) spanning the space's range of weight sizes (``spread_by_weight`` of a seeded
    random sample of ``10 n``), lightest first. Their measured latencies calibrate the
    ``CacheModel``.

    Twenty rather than twelve: fitted to twelve of the benchmark's measured SubNets picked so,
    ResNet-50 on NCNN had 95 % within ±10 % in 63 % of 30 draws; fitted to twenty, in 83 %. The
    extremes too, because random SubNets stop well short of the largest, where the cache terms
    matter most: without it, three profiles of MobileNetV2 fitted cache models whose ratios to
    the largest SubNet were 68-90 % within ±5 %; with it, 85-88 % (docs/latency.md)."""
    rng = random.Random(seed)
    spread = spread_by_weight([space.complete(space.sample(rng)) for _ in range(10 * n)], costs, n)
    ends = [space.complete(space.min()), space.complete(space.max())]
    return list({subnet_key(a): a for a in sorted([*spread, *ends], key=costs.params)}.values())


MIN_SUPPORT = 3  # calibration SubNets a cache or streaming term must act on to be fitted


def fit_cache_model(cold: LatencyPredictor, hot: LatencyPredictor, costs: "CostModel", archs: list[Arch],
                    measured_ms: list[float], max_cache_bytes: int) -> CacheModel:
    """The ``CacheModel`` whose predictions best match the measured SubNets ``archs`` (least
    mean |log(predicted / measured)|, which one disturbed measurement cannot pull far): C among
    0 and powers of two from 256 KiB to ``max_cache_bytes``, φ among 0, 0.1, ..., 1, D among
    1-256 MiB (or none), τ among 0.002-0.5 ms per MiB (from 2 GB/s to 500 GB/s), κ among 0.70,
    0.71, ..., 1.30. When ``hot`` is ``cold`` (a backend profiled in one cache state), C and φ
    have nothing to act on and are left at ``max_cache_bytes`` and 1. A term that acts on fewer
    than ``MIN_SUPPORT`` of the SubNets (weights beyond C, or beyond D) is left out: fitted to
    one or two timings, it follows their noise. Without this rule, three profiles of MobileNetV2
    fitted the largest SubNet's one timing each, and their ratios to the largest disagreed by
    7.6 % (median over SubNets); with it, by 3.2 % (docs/latency.md).

    What a core really keeps of a model in cache is not what the OS reports: a VM sees its
    host's whole last-level cache, shared with other tenants (see docs/latency.md)."""
    weights = np.array([costs.params(a) * BYTES_PER_VALUE for a in archs], dtype=np.float64)
    hot_ms = np.array([hot.predict(a) for a in archs]) - hot.overhead_ms
    cold_ms = np.array([cold.predict(a) for a in archs]) - cold.overhead_ms
    log_measured = np.log(np.array(measured_ms))
    if hot is cold:
        budgets, shares = [max_cache_bytes], [1.0]
    else:
        budgets = [0] + [2**k for k in range(18, 40) if 2**k <= max_cache_bytes]
        shares = [i / 10 for i in range(11)]
    streams = [int(f * 2**k) for k in range(20, 28) for f in (1.0, 1.5)]
    taus = np.array([0.0] + [0.002 * 1.5**i for i in range(14)])
    ratios = np.round(np.arange(0.70, 1.305, 0.01), 2)
    best: tuple[float, CacheModel] | None = None
    for budget in budgets:
        beyond = np.clip(1.0 - budget / weights, 0.0, None)
        for share in shares if np.count_nonzero(beyond) >= MIN_SUPPORT else [0.0]:
            base = hot_ms + share * beyond * (cold_ms - hot_ms)
            for stream in streams:
                extra = np.clip(weights - stream, 0.0, None) / 2**20  # MiB beyond D, per SubNet
                supported = taus if np.count_nonzero(extra) >= MIN_SUPPORT else taus[:1]
                # ratios x taus x SubNets
                predicted = ratios[:, None, None] * base + supported[None, :, None] * extra + hot.overhead_ms
                errors = np.abs(np.log(predicted) - log_measured).sum(2)
                r, t = np.unravel_index(int(errors.argmin()), errors.shape)
                if best is None or errors[r, t] < best[0] - 1e-12:
                    tau = float(supported[t])
                    best = (float(errors[r, t]), CacheModel(budget, share, stream if tau else math.inf, tau,
                                                            float(ratios[r])))
    assert best is not None
    return best[1]


@dataclass(frozen=True)
class Costs:
    """Counted costs of one SubNet at batch 1."""

    macs: int  # multiply-accumulates of convolutions and linear layers (the usual "FLOPs")
    params: int
    peak_activation_bytes: int

    @property
    def memory_bytes(self) -> int:
        """Parameters plus the peak of live activations (float32), as the paper's section 4.4 counts it."""
        return self.params * BYTES_PER_VALUE + self.peak_activation_bytes


class CostModel:
    """MACs, parameters and peak activation memory of any SubNet, from the plan's shapes."""

    def __init__(self, plan: KernelPlan):
        self.plan = plan
        kernel_cost = [kernel_costs(plan, k) for k in plan.kernels]
        # MACs and parameters summed per droppable block over the union of its groups' variables
        # (and per variable set outside blocks): fewer lookups per prediction than per group.
        space = plan.sn.space
        parts: dict[tuple, list] = {}
        for g in plan.groups:
            parts.setdefault((g.block, g.variables if g.block is None else None), []).append(g)
        self._sums: list[tuple[int | None, tuple[str, ...], dict[tuple, tuple[int, int]]]] = []
        for (block, _), groups in parts.items():
            union = {v for g in groups for v in g.variables}
            variables = tuple(v.name for v in space.variables if v.name in union)
            table = {}
            for combo in itertools.product(*(space[v].choices for v in variables)):
                choice = dict(zip(variables, combo))
                costs = [kernel_cost[g.table[tuple(choice[v] for v in g.variables)]] for g in groups]
                table[combo] = (sum(c[0] for c in costs), sum(c[1] for c in costs))
            self._sums.append((block, variables, table))
        # A value of several tensors is counted as the tensors its consumers take out of it.
        nodes = [n for n in plan.nodes if not n.const and not n.multi and n.kind != "output"]
        position = {n.name: i for i, n in enumerate(nodes)}
        last_use = {n.name: position[n.name] for n in nodes}
        for n in plan.nodes:
            for i in n.inputs:
                if i in last_use:
                    last_use[i] = max(last_use[i], position.get(n.name, len(nodes)))
        # A block's output stays alive when the block is dropped (its input takes its place,
        # with the same shape), so only tensors used inside their own block disappear.
        escapes = {i for n in plan.nodes for i in n.inputs
                   if i in plan.by_name and plan.by_name[i].block is not None and plan.by_name[i].block != n.block}
        # Each tensor's size is a table over the few variables its shape depends on; tensors with
        # the same table share it. Liveness is a positions x tensors matrix, so a prediction is a
        # few lookups and one matrix-vector product.
        space, top = plan.sn.space, plan.sn.space.max()
        tables: dict[tuple, int] = {}
        self._tables: list[tuple[tuple[str, ...], dict[tuple, int]]] = []
        index = []
        for t in nodes:
            variables = tuple(v.name for v in space.variables if v.name in plan.shapes.variables(t.name))
            table = {combo: math.prod(plan.shapes.shape(t.name, {**top, **dict(zip(variables, combo))}))
                     for combo in itertools.product(*(space[v].choices for v in variables))}
            key = (variables, tuple(table.items()))
            if key not in tables:
                tables[key] = len(self._tables)
                self._tables.append((variables, table))
            index.append(tables[key])
        self._index = np.array(index)
        owners = [None if t.name in escapes else t.block for t in nodes]
        self._owner_blocks = sorted({o for o in owners if o is not None})
        # tensors x blocks: which tensors vanish with a dropped block; positions likewise
        self._tensor_block = np.array([[o == b for b in self._owner_blocks] for o in owners], dtype=bool)
        self._position_blocks = sorted({n.block for n in nodes if n.block is not None})
        self._position_block = np.array([[n.block == b for b in self._position_blocks] for n in nodes], dtype=bool)
        self._live = np.array([[last_use[nodes[j].name] >= i and j <= i for j in range(len(nodes))]
                               for i in range(len(nodes))], dtype=np.float64)

    def _counted(self, arch: Arch, dropped: set[int]) -> tuple[int, int]:
        macs = params = 0
        for block, variables, table in self._sums:
            if block not in dropped:
                m, p = table[tuple(arch[v] for v in variables)]
                macs += m
                params += p
        return macs, params

    def params(self, arch: Arch) -> int:
        """Parameters of ``arch`` alone (cheaper than ``costs``)."""
        return self._counted(arch, self.plan.dropped(arch))[1]

    def costs(self, arch: Arch) -> Costs:
        """Counted costs of ``arch`` (a complete architecture)."""
        dropped = self.plan.dropped(arch)
        macs, params = self._counted(arch, dropped)
        unique = np.array([table[tuple(arch[v] for v in variables)] for variables, table in self._tables],
                          dtype=np.float64)
        sizes = unique[self._index]
        gone = np.array([b in dropped for b in self._owner_blocks], dtype=bool)
        if gone.any():
            sizes[self._tensor_block[:, gone].any(1)] = 0.0
        live = self._live @ sizes
        gone = np.array([b in dropped for b in self._position_blocks], dtype=bool)
        if gone.any():
            live[self._position_block[:, gone].any(1)] = 0.0
        peak = int(live.max())
        return Costs(macs, params, peak * BYTES_PER_VALUE)


def kernel_costs(plan: KernelPlan, kernel: Kernel) -> tuple[int, int]:
    """MACs and parameters of one kernel (parameters of the layers in it, learned constants it owns)."""
    group = plan.groups[kernel.group]
    arch = {**plan.sn.space.max(), **dict(zip(group.variables, kernel.choices))}
    macs = params = 0
    for name in group.nodes:
        node = plan.by_name[name]
        out = plan.shapes.shape(name, arch) if not node.multi else ()  # several tensors: no weights of its own
        ins = [plan.shapes.shape(i, arch) for i in node.inputs if not plan.by_name[i].multi]
        k = arch[node.kernel_var] if node.kernel_var else None
        m, p = node.handler.costs(node.facts, ins, out, k)
        macs, params = macs + m, params + p
    for name in plan.group_params(group):
        params += math.prod(plan.shapes.shape(name, arch))
    return macs, params
