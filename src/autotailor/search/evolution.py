"""Evolutionary search under budgets, started from a beam search (the paper's section 4.3.2).

The beam search walks once from the largest SubNet to the smallest, each step taking the
single-step reductions that lose the least predicted accuracy per unit of cost saved; the
SubNets it passes cover every budget along the way, so one walk seeds all budgets. Each
budget then runs Once-for-All's evolution: a population of 100, the best 25% kept as parents,
half of the population replaced by mutations (each variable resampled with probability 0.1)
and the rest by crossovers of two parents; candidates over the budget are rejected.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autotailor.search.objectives import Budget, Objectives, SearchError
from autotailor.supernet import Arch
from autotailor.supernet.space import Space

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvolutionSettings:
    """Once-for-All's settings; ``generations`` and ``beam_width`` trade search time for quality."""

    population: int = 100
    parents: float = 0.25
    mutation_prob: float = 0.1
    mutation_share: float = 0.5
    generations: int = 30
    beam_width: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {"population": self.population >= 4, "parents": 0 < self.parents < 1,
                  "mutation_prob": 0 < self.mutation_prob <= 1, "mutation_share": 0 <= self.mutation_share < 1,
                  "generations": self.generations >= 0, "beam_width": self.beam_width >= 1}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise SearchError(f"invalid search setting(s) {bad}: population >= 4, 0 < parents < 1, "
                              "0 < mutation_prob <= 1, 0 <= mutation_share < 1, generations >= 0, beam_width >= 1")


@dataclass
class Choice:
    """The best SubNet found for one budget (``arch`` None when no SubNet meets it)."""

    budget: Budget
    arch: Arch | None
    accuracy: float | None
    metrics: dict[str, float]
    seconds: float


@dataclass
class SearchResult:
    choices: list[Choice]
    front: list[tuple[Arch, float, float]]  # (arch, accuracy, axis metric), ascending in the metric
    axis: str
    seconds: float
    predictions: int
    beam_size: int
    settings: EvolutionSettings = field(default_factory=EvolutionSettings)


def _smaller(space: Space, arch: Arch) -> list[Arch]:
    """Every arch one step smaller in exactly one variable."""
    out = []
    for v in space.variables:
        i = v.choices.index(arch[v.name])
        if i > 0:
            out.append({**arch, v.name: v.choices[i - 1]})
    return out


def beam_search(space: Space, objectives: Objectives, metrics: Sequence[str], width: int) -> list[Arch]:
    """The SubNets on a beam's walk from the largest to the smallest SubNet.

    A step's candidates are every one-step reduction of a beam member, ranked by predicted
    accuracy lost per unit of cost saved (costs normalised by the largest SubNet's, summed over
    ``metrics``); the ``width`` best form the next beam.
    """
    top = space.max()
    scale = {m: objectives.metric(m, top) or 1.0 for m in metrics}

    def cost(arch: Arch) -> float:
        return sum(objectives.metric(m, arch) / scale[m] for m in metrics)

    beam, visited = [top], {objectives.key(top): top}
    while beam:
        ranked = []
        for parent in beam:
            a, c = objectives.accuracy(parent), cost(parent)
            for child in _smaller(space, parent):
                key = objectives.key(child)
                if key in visited:
                    continue
                saved = c - cost(child)
                lost = a - objectives.accuracy(child)
                # Saving nothing ranks last; losing nothing (or gaining) ranks by saving.
                score = lost / saved if saved > 1e-12 else float("inf")
                ranked.append((score, -saved, len(ranked), key, child))
        ranked.sort(key=lambda r: r[:3])
        beam = []
        for _, _, _, key, child in ranked:
            if key not in visited:
                visited[key] = child
                beam.append(child)
                if len(beam) == width:
                    break
    return list(visited.values())


def _mutate(space: Space, arch: Arch, prob: float, rng: random.Random) -> Arch:
    return {v.name: rng.choice(v.choices) if rng.random() < prob else arch[v.name] for v in space.variables}


def _crossover(space: Space, a: Arch, b: Arch, rng: random.Random) -> Arch:
    return {v.name: (a if rng.random() < 0.5 else b)[v.name] for v in space.variables}


def rank(objectives: Objectives, budget: Budget, arch: Arch) -> tuple[float, float]:
    """Sort key of SubNets under ``budget``, best last: predicted accuracy, then at equal
    accuracy the cheaper SubNet (relative to the budget's limits)."""
    return objectives.accuracy(arch), -sum(objectives.metric(m, arch) / (v or 1.0) for m, v in budget.limits)


def evolve(space: Space, objectives: Objectives, budget: Budget, seeds: Sequence[Arch],
           settings: EvolutionSettings, rng: random.Random) -> Choice:
    """Once-for-All's evolution under ``budget``, its population started from ``seeds``."""
    started = time.perf_counter()

    rank_ = functools.partial(rank, objectives, budget)

    population = [a for a in seeds if objectives.feasible(a, budget)]
    if not population:
        return Choice(budget, None, None, {}, time.perf_counter() - started)
    population.sort(key=rank_, reverse=True)
    population = population[: settings.population]
    n_parents = max(2, round(settings.parents * settings.population))
    n_mutations = round(settings.mutation_share * settings.population)
    n_crossovers = settings.population - n_parents - n_mutations
    tries = 20  # per wanted child: a budget that almost nothing meets must not loop forever

    def children(make: Callable[[], Arch], count: int) -> list[Arch]:
        out: list[Arch] = []
        for _ in range(count * tries):
            if len(out) == count:
                break
            child = make()
            if objectives.feasible(child, budget):
                out.append(child)
        return out

    # Fill a small seed population up to its size by mutation before evolving.
    population += children(lambda: _mutate(space, rng.choice(population), settings.mutation_prob, rng),
                           settings.population - len(population))
    best = max(population, key=rank_)
    for _ in range(settings.generations):
        parents = sorted(population, key=rank_, reverse=True)[:n_parents]
        mutated = children(lambda p=parents: _mutate(space, rng.choice(p), settings.mutation_prob, rng), n_mutations)
        crossed = children(lambda p=parents: _crossover(space, rng.choice(p), rng.choice(p), rng), n_crossovers)
        population = parents + mutated + crossed
        best = max([best, *population], key=rank_)
    metrics = {m: objectives.metric(m, best) for m in objectives.metrics}
    return Choice(budget, best, objectives.accuracy(best), metrics, time.perf_counter() - started)


def pareto_front(objectives: Objectives, archs: Sequence[Arch], axis: str) -> list[tuple[Arch, float, float]]:
    """The archs no other arch beats in both predicted accuracy and ``axis`` (lower is better)."""
    points = sorted(((objectives.metric(axis, a), -objectives.accuracy(a), i) for i, a in enumerate(archs)))
    front, best = [], float("-inf")
    for cost, neg_acc, i in points:
        if -neg_acc > best:
            best = -neg_acc
            front.append((archs[i], best, cost))
    return front


def search(space: Space, objectives: Objectives, budgets: Sequence[Budget],
           settings: EvolutionSettings = EvolutionSettings(),
           on_budget: Callable[[int, Choice], None] | None = None) -> SearchResult:
    """The best SubNet for each budget, and the Pareto front of everything the search saw.

    Deterministic for a given ``settings.seed``: each budget's random stream is seeded by the
    seed and the budget's position.
    """
    if not budgets:
        raise SearchError("no budget given; pass at least one limit, e.g. --latency-ms 8")
    started = time.perf_counter()
    metrics = sorted({m for b in budgets for m, _ in b.limits})
    missing = [m for m in metrics if m not in objectives.metrics]
    if missing:
        raise SearchError(f"budgets constrain {missing}, which this search cannot predict ({objectives.metrics})")
    pool = beam_search(space, objectives, metrics, settings.beam_width)
    log.info("beam search: %d SubNets from the largest to the smallest", len(pool))
    choices = []
    for i, budget in enumerate(budgets):
        choice = evolve(space, objectives, budget, pool, settings, random.Random(f"{settings.seed}/{i}"))
        choices.append(choice)
        if on_budget:
            on_budget(i, choice)
    axis = metrics[0] if len(metrics) == 1 else ("latency_ms" if "latency_ms" in metrics else metrics[0])
    front = pareto_front(objectives, list(objectives.seen()), axis)
    return SearchResult(choices, front, axis, time.perf_counter() - started, objectives.predictions(), len(pool),
                        settings)
