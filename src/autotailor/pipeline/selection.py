"""The search step: predictors of a work directory, budgets, and ``search.json`` (``SearchRecord``)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotailor.errors import AutoTailorError
from autotailor.pipeline.finalists import Finalists
from autotailor.pipeline.results import ORIGINAL_WEIGHTS, SHARED_WEIGHTS, Chosen, SearchRecord
from autotailor.pipeline.workdir import SENSITIVITY, DeviceSetup
from autotailor.search import (METRICS, Budget, Choice, EvolutionSettings, Objectives, SearchError, SearchResult,
                               search)
from autotailor.supernet import Arch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSettings:
    """The ``[search]`` table: budgets (lists of limits, or a count spanning ``axis``) and the
    evolution's settings."""

    latency_ms: tuple = ()
    macs: tuple = ()
    params: tuple = ()
    memory_bytes: tuple = ()
    budgets: int = 0  # this many budgets spanning ``axis`` (a fixed ratio apart), when no list is given
    axis: str = "latency_ms"
    population: int = 100
    generations: int = 30
    beam_width: int = 4
    seed: int = 0
    verify: int = 0  # rounds of measuring the chosen SubNets on the device and searching again
    finalists: int = 0  # each budget's this many best-predicted SubNets measured for accuracy, the best chosen

    def __post_init__(self) -> None:
        for metric, values in self.limits().items():
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf]
            if bad:
                raise SearchError(f"search.{metric} = {list(values)} is not allowed; budgets are positive numbers")
        if self.axis not in METRICS:
            raise SearchError(f"search.axis = {self.axis!r} is not allowed; expected one of {list(METRICS)}")
        for key, low in (("budgets", 0), ("population", 2), ("generations", 1), ("beam_width", 1), ("verify", 0),
                         ("finalists", 0)):
            if getattr(self, key) < low:
                raise SearchError(f"search.{key} = {getattr(self, key)} is not allowed; expected {low} or more")

    def evolution(self) -> EvolutionSettings:
        return EvolutionSettings(population=self.population, generations=self.generations,
                                 beam_width=self.beam_width, seed=self.seed)

    def limits(self) -> dict[str, tuple]:
        return {m: getattr(self, m) for m in ("latency_ms", "macs", "params", "memory_bytes") if getattr(self, m)}

    def budget_list(self, objectives: Objectives) -> list[Budget]:
        if self.limits():
            return zip_budgets(self.limits())
        if self.budgets < 1:
            raise SearchError("no budget given: set latency_ms, macs, params or memory_bytes, or budgets = N "
                              "(N budgets spanning the space along axis)")
        return span_budgets(objectives, self.axis, self.budgets)


def accuracy_model(sn, work: str | Path, finalists: Finalists | None = None):
    """The sensitivity predictor of ``WORK/sensitivity.json`` and, when ``finalists`` has
    measured SubNets, its drops' overlap fitted to them (``fit_overlap``): (predictor, fit or None)."""
    from autotailor.predict.accuracy import SensitivityPredictor, SensitivityTable, fit_overlap

    predictor = SensitivityPredictor(sn.space, SensitivityTable.load(Path(work) / SENSITIVITY))
    entries = list(finalists.measured.values()) if finalists is not None else []
    fit = fit_overlap(predictor, [e["arch"] for e in entries], [e["accuracy"] for e in entries])
    if fit is None or fit.overlap is None:
        return predictor, fit
    return SensitivityPredictor(sn.space, predictor.table, fit.overlap), fit


def objectives_for(sn, work: str | Path, device: DeviceSetup | None, finalists: Finalists | None = None) -> Objectives:
    """Predicted accuracy from ``WORK/sensitivity.json`` (fitted to the finalists' measurements,
    if given: ``accuracy_model``); latency from the device's LUT (if a device is given); MACs,
    parameters and memory counted from the SuperNet's shapes."""
    from autotailor.predict.latency import CostModel, KernelPlan

    accuracy, _ = accuracy_model(sn, work, finalists)
    costs = CostModel(device.plan if device else KernelPlan(sn, "none", "fused"))
    cache: dict[tuple, Any] = {}

    def counted(field: str) -> Callable[[Arch], float]:
        def value(arch: Arch) -> float:
            key = sn.space.key(arch)
            if key not in cache:
                cache[key] = costs.costs(arch)
            return getattr(cache[key], field)
        return value

    metrics: dict[str, Callable[[Arch], float]] = {m: counted(m) for m in METRICS if m != "latency_ms"}
    if device is not None:
        try:
            metrics["latency_ms"] = _measured_first(sn.space, device.measured(), device.predictor().predict)
        except AutoTailorError as exc:
            raise SearchError(f"{exc}: run `autotailor profile {work} --device {device.spec}`") from exc
    return Objectives(sn.space, accuracy.predict, metrics)


def _measured_first(space, measured: dict[str, float],
                    predict: Callable[[Arch], float]) -> Callable[[Arch], float]:
    """Latency: a SubNet measured whole on the device (calibrated or verified) has its
    measurement, any other the prediction. A verified SubNet that measured over its budget is
    then no longer chosen on the refitted model's word, which is still a few percent off for
    some SubNets."""
    known = _by_network(space, measured)

    def latency(arch: Arch) -> float:
        ms = known.get(space.key(arch))
        return predict(arch) if ms is None else ms
    return latency


def _by_network(space, measured: dict[str, float]) -> dict[tuple, float]:
    """Whole-SubNet timings (``subnet_key`` -> ms) keyed by ``space.key``: an arch finds the
    timing of the same network timed under other choices for the blocks it drops."""
    from autotailor.predict.latency import subnet_arch

    return {space.key(subnet_arch(key)): ms for key, ms in measured.items()}


def span_budgets(objectives: Objectives, metric: str, count: int) -> list[Budget]:
    """``count`` budgets from the smallest SubNet's ``metric`` to the largest's, each a fixed
    ratio above the last. Why not even steps: accuracy changes fastest near the smallest
    SubNets, and a budget's tolerance is relative; even steps crowd the flat top of the front
    with budgets that choose the same SubNet and leave its steep bottom coarse."""
    space = objectives.space
    lo, hi = objectives.metric(metric, space.min()), objectives.metric(metric, space.max())
    if count < 2:
        return [Budget.of(**{metric: hi})]
    if lo <= 0:  # no ratio from zero: even steps
        values = [lo + (hi - lo) * i / (count - 1) for i in range(count)]
    else:
        values = [lo * (hi / lo) ** (i / (count - 1)) for i in range(count)]
    return [Budget.of(**{metric: _three_digits(v, up=i == 0)}) for i, v in enumerate(values)]


def _three_digits(value: float, up: bool) -> float:
    """``value`` to three significant digits, budgets being labels a user types back (--pick
    1.23ms); rounded up for the smallest budget, which the smallest SubNet must still meet."""
    if value <= 0:
        return value
    unit = 10.0 ** (math.floor(math.log10(value)) - 2)
    return float(f"{(math.ceil(value / unit) if up else round(value / unit)) * unit:.3g}")


def zip_budgets(limits: dict[str, Sequence[float]]) -> list[Budget]:
    """Budgets from per-metric lists: lists of one value apply to every budget, the others
    (all of one length) are taken position by position."""
    lengths = {len(v) for v in limits.values() if len(v) != 1}
    if len(lengths) > 1:
        raise SearchError(f"budget lists of different lengths {sorted(lengths)}: give each metric one value "
                          "or the same number of values")
    n = lengths.pop() if lengths else 1
    return [Budget.of(**{m: (v[0] if len(v) == 1 else v[i]) for m, v in limits.items()}) for i in range(n)]


def _chosen(choice: Choice, space, measured: dict[str, float] | None, finalists: Finalists | None) -> Chosen:
    """The record of ``choice``, its arch canonical: budgets that chose one network under
    different choices for the blocks it drops are one SubNet to count, fine-tune and export."""
    known = choice.arch is not None
    arch = space.canonical(choice.arch) if known else None
    return Chosen(choice.budget.name, choice.budget.as_dict(), arch, choice.accuracy, choice.metrics,
                  round(choice.seconds, 4),
                  measured_accuracy=finalists.accuracy(arch) if finalists is not None and known else None,
                  measured_latency_ms=_by_network(space, measured).get(space.key(arch))
                  if measured is not None and known else None)


def _with_original_weights(chosen: Chosen, budget: Budget, objectives: Objectives, finalists: Finalists,
                           measured: dict[str, float] | None) -> Chosen:
    """``chosen``, or the same SubNet with the weights tuning started from, or the user's model
    itself (their largest SubNet, if it meets the budget), whichever measured most accurate on
    the finalists' images (``Finalists.original_accuracy``); the shared weights win a tie. An
    original-weights choice's accuracy is its measurement: nothing predicts it."""
    if chosen.arch is None:
        return chosen
    finalists.measure([chosen.arch])
    arch = objectives.space.complete(chosen.arch)
    largest = objectives.space.complete(objectives.space.max())
    options = [(finalists.accuracy(arch), arch, SHARED_WEIGHTS),
               (finalists.original_accuracy(arch), arch, ORIGINAL_WEIGHTS)]
    if arch != largest and objectives.feasible(largest, budget):
        options.append((finalists.original_accuracy(largest), largest, ORIGINAL_WEIGHTS))
    best, arch, weights = max(options, key=lambda o: o[0])  # the first of equals: shared, then the smaller
    if weights == SHARED_WEIGHTS:
        return chosen
    log.info("%s: the original model's weights (%.2f %%) are more accurate than the SuperNet's (%.2f %%)",
             budget.name, 100 * best, 100 * options[0][0])
    return dataclasses.replace(
        chosen, arch=arch, accuracy=best, metrics={m: objectives.metric(m, arch) for m in objectives.metrics},
        measured_accuracy=best, weights=ORIGINAL_WEIGHTS,
        measured_latency_ms=_by_network(objectives.space, measured).get(objectives.space.key(arch))
        if measured is not None else None)


def run_search(sn, work: str | Path, device: DeviceSetup | None, settings: SearchSettings,
               objectives: Objectives | None = None, on_budget: Callable[[int, Choice], None] | None = None,
               on_subnet: Callable[[int, int], None] | None = None, finalists: Finalists | None = None,
               on_finalist: Callable[[int, int], None] | None = None, out: str | Path | None = None) -> SearchResult:
    """Search every budget of ``settings`` and write ``OUT/search.json`` (``SearchRecord``; ``out``
    is ``work`` unless a fleet keeps each device's results in its own folder).

    ``settings.verify`` > 0 (with a device): the chosen SubNets are measured on the device
    (``DeviceSetup.measure``), the latency predictor is fitted again with them, and the budgets
    (spanning the space again, if given as a count) are searched again with it, up to
    ``verify`` times (until a search chooses no SubNet not yet measured); each choice's
    measured latency goes into ``search.json``. A measured SubNet's latency is its measurement
    in every search. The last round's choices are timed once more (their latency the mean of
    both timings), and one then over its budget gives way to the most accurate measured
    SubNet within it (with ``finalists``, the best finalists within it timed first). The
    random SubNets that calibrate the predictor rarely look like a front's (the smallest, the
    most compute-dense for their weights): the front's own measurements correct the fit where
    the search looks.

    With ``finalists`` (made for ``settings.finalists`` > 0), after each search each budget's
    choice is the most accurate as measured of its best-predicted SubNets (``Finalists.choose``)."""
    objectives = objectives or objectives_for(sn, work, device)
    evolution, verify = settings.evolution(), settings.verify if device is not None else 0

    def searched(objectives: Objectives) -> SearchResult:
        result = search(sn.space, objectives, settings.budget_list(objectives), evolution, on_budget)
        return finalists.choose(result, objectives, on_finalist) if finalists else result

    result = searched(objectives)
    seconds, predictions, rounds = result.seconds, result.predictions, 0
    while verify:
        chosen = [sn.space.complete(c.arch) for c in result.choices if c.arch is not None]
        new = device.measure(chosen, on_subnet)
        log.info("verify round %d: %d chosen SubNets, %d newly measured", rounds, len(chosen), len(new))
        if not new or rounds == verify:
            break
        rounds += 1
        objectives = objectives_for(sn, work, device, finalists)
        result = searched(objectives)
        seconds, predictions = seconds + result.seconds, predictions + result.predictions
    if verify:
        # A choice kept for measuring within its budget timed, on average, on the fast side of
        # its noise (a winner's curse: MobileNetV2's choices re-timed 2-3 % slower). Timed once
        # more, each choice's latency is the mean of both timings.
        chosen = [sn.space.complete(c.arch) for c in result.choices if c.arch is not None]
        device.measure(chosen, on_subnet, again=True)
    measured = device.measured() if verify and device is not None else None
    if measured:
        # The last round's new choices were measured but not searched again, and every choice
        # was timed once more: one over its budget gives way to the best measured SubNet within it.
        objectives = objectives_for(sn, work, device, finalists)
        if finalists is not None:
            objectives = _time_finalists_for_over(result.choices, sn, work, device, finalists, objectives,
                                                  on_subnet)
            measured = device.measured()
        result = dataclasses.replace(result, choices=[_within_measured(c, objectives, measured, finalists)
                                                      for c in result.choices])
    result = dataclasses.replace(result, seconds=seconds, predictions=predictions)
    fit = None
    if finalists is not None:
        # every prediction recorded from the model fitted to all the measurements (the fit is a
        # monotone map of the sum: it changes the figures, not the order)
        predictor, fit = accuracy_model(sn, work, finalists)
        result = dataclasses.replace(
            result, choices=[c if c.arch is None else dataclasses.replace(c, accuracy=predictor.predict(
                sn.space.complete(c.arch))) for c in result.choices],
            front=[(a, predictor.predict(sn.space.complete(a)), cost) for a, _, cost in result.front])
    chosen = [_chosen(c, sn.space, measured, finalists) for c in result.choices]
    if finalists is not None and finalists.original is not None:
        largest = sn.space.complete(sn.space.max())
        if verify and any(objectives.feasible(largest, c.budget) for c in result.choices):
            device.measure([largest], on_subnet)  # deployed only if its measurement meets the budget
            objectives, measured = objectives_for(sn, work, device, finalists), device.measured()
        chosen = [_with_original_weights(c, b.budget, objectives, finalists, measured)
                  for c, b in zip(chosen, result.choices)]
    speed = device.speed() if device else None
    SearchRecord(
        device=device.spec if device else None,
        target=str(device.target) if device else None,
        latency_model=device.predictor().describe() if measured is not None else None,
        latency_noise=speed.describe() if speed else None,
        accuracy_model=fit.describe() if fit is not None else None,
        axis=result.axis,
        settings=dataclasses.asdict(evolution),
        seconds=result.seconds,
        predictions=result.predictions,
        verify_rounds=rounds,
        beam_size=result.beam_size,
        finalists=finalists.count if finalists else 0,
        choices=chosen,
        front=[{"arch": a, "accuracy": acc, result.axis: cost} for a, acc, cost in result.front],
    ).write(out or work)
    return result


def _time_finalists_for_over(choices: list[Choice], sn, work: str | Path, device: DeviceSetup,
                             finalists: Finalists, objectives: Objectives,
                             on_subnet: Callable[[int, int], None] | None) -> Objectives:
    """For each choice timed over its budget, the best finalist (``Finalists.most_accurate``)
    that the latency model puts within the budget is timed, and the next best if that one is
    over it too (``finalists.count`` at most): otherwise the choice would give way to a
    SubNet timed earlier, often one chosen for a far smaller budget. The objectives with those
    timings."""
    from autotailor.predict.latency import subnet_key

    for choice in choices:
        if choice.arch is None or objectives.feasible(sn.space.complete(choice.arch), choice.budget):
            continue
        for _ in range(finalists.count):
            best = finalists.most_accurate([a for a in finalists.archs if objectives.feasible(a, choice.budget)],
                                           objectives, choice.budget)
            if best is None or subnet_key(best) in device.measured():
                break
            device.measure([best], on_subnet)
            objectives = objectives_for(sn, work, device, finalists)
    return objectives


def _within_measured(choice: Choice, objectives: Objectives, measured: dict[str, float],
                     finalists: Finalists | None) -> Choice:
    """``choice``, or if it measured over its budget the most accurate SubNet among the measured
    ones that meet the budget (``choice`` unchanged when none does): the most accurate of the
    finalists measured (``Finalists.most_accurate``), else as predicted."""
    from autotailor.predict.latency import subnet_arch

    if choice.arch is None or objectives.feasible(objectives.space.complete(choice.arch), choice.budget):
        return choice
    fits = [a for a in map(subnet_arch, measured) if objectives.feasible(a, choice.budget)]
    if not fits:
        return choice
    best = finalists.most_accurate(fits, objectives, choice.budget) if finalists is not None else None
    best = best or max(fits, key=objectives.accuracy)
    log.info("%s: the choice measured %.3g ms, over the budget; the best measured SubNet within it replaces it",
             choice.budget.name, objectives.metric("latency_ms", objectives.space.complete(choice.arch)))
    return dataclasses.replace(choice, arch=best, accuracy=objectives.accuracy(best),
                               metrics={m: objectives.metric(m, best) for m in objectives.metrics})
