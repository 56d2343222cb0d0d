"""Policies: which SubNet serves the next inference. One class per policy, registered by name.

A policy is a plug-in in the spirit of Mistify's tailoring algorithms (Init, Measure, Adjust):
its constructor takes its options (Init), :meth:`Policy.observe` sees every served inference
(Measure) and :meth:`Policy.choose` returns the SubNet for the next one (Adjust), given the
SubNets that fit the memory budget (least accurate first, each with its idle latency in place
as ``latency_ms``: see ``runtime.py``; compare SubNets by name), the goal and the state the
runtime and its monitor keep::

    @register_policy("fastest-when-hot")
    class FastestWhenHot(Policy):
        def __init__(self, celsius: float = 80.0):
            self.celsius = celsius

        def choose(self, subnets, goal, state):
            hot = state.reading is not None and (state.reading.temperature_c or 0) > self.celsius
            return min(subnets, key=lambda s: s.latency_ms) if hot else best_fitting(subnets, goal.slo_ms)

Built in: ``static`` (one SubNet, never switches), ``reactive`` (AdaptiveNet: on the observed
latency of the current SubNet) and ``forecast`` (AdaScale: on the forecast upper bound of the
slowdown). Both adaptive ones step down as soon as the goal is missed (after a short minimum
dwell, so that the new SubNet is observed before it is judged) and step up only after a quiet
period and with a margin, so that a SubNet near the goal does not flap.
"""

from __future__ import annotations

import inspect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from autotailor.errors import PolicyError
from autotailor.runtime.forecast import ForecastState
from autotailor.runtime.monitor import Reading

if TYPE_CHECKING:
    from autotailor.runtime.bundle import SubNetEntry
    from autotailor.runtime.runtime import InferenceRecord


@dataclass(frozen=True)
class Goal:
    """What the runtime must meet: a latency per inference and the memory of the loaded SubNets."""

    slo_ms: float
    memory_mb: float | None = None  # the budget in force now (None: unlimited)


@dataclass(frozen=True)
class PolicyState:
    """What a policy knows when it chooses."""

    now: float  # time.time()
    current: "SubNetEntry | None"  # None before the first inference
    since_switch_s: float  # since ``current`` became current (inf before the first switch)
    recent_ms: tuple[float, ...]  # observed latencies of ``current`` since it became current, oldest first
    forecast: ForecastState  # of the slowdown
    reading: Reading | None  # the monitor's last sample
    last_violation: float | None  # time.time() of the last inference over the goal (any SubNet)


class Policy:
    """Base class of policies; see the module docstring."""

    name: ClassVar[str] = ""

    def observe(self, record: "InferenceRecord") -> None:
        """Called after every inference."""

    def choose(self, subnets: Sequence["SubNetEntry"], goal: Goal, state: PolicyState) -> "SubNetEntry":
        raise NotImplementedError


_POLICIES: dict[str, type[Policy]] = {}


def register_policy(name: str):
    """Class decorator: ``@register_policy("name")`` makes ``Runtime(policy="name")`` use the class."""

    def deco(cls: type[Policy]) -> type[Policy]:
        cls.name = name
        _POLICIES[name] = cls
        return cls

    return deco


def policies() -> tuple[str, ...]:
    return tuple(sorted(_POLICIES))


def make_policy(name: str, **options: Any) -> Policy:
    """The registered policy ``name`` built with ``options`` (errors name what it takes)."""
    try:
        cls = _POLICIES[name]
    except KeyError:
        raise PolicyError(f"no policy {name!r}; registered: {list(policies())} "
                          "(a new policy is one @register_policy class)") from None
    params = inspect.signature(cls.__init__).parameters
    takes = [p for p in params if p != "self" and params[p].kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(takes))
    if unknown and not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise PolicyError(f"policy {name!r} takes no option {unknown}; it takes {takes}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {name!r} refused its options {options}: {exc}") from exc


def fastest(subnets: Sequence["SubNetEntry"]) -> "SubNetEntry":
    return min(subnets, key=lambda s: (s.latency_ms, -s.accuracy))


def best_fitting(subnets: Sequence["SubNetEntry"], slo_ms: float, slowdown: float = 1.0) -> "SubNetEntry":
    """The most accurate SubNet whose latency times ``slowdown`` meets ``slo_ms``; the fastest if none does."""
    fits = [s for s in subnets if s.latency_ms * slowdown <= slo_ms]
    return fits[-1] if fits else fastest(subnets)  # ``subnets`` are sorted by accuracy


@register_policy("static")
class Static(Policy):
    """One SubNet for good: ``pick`` is ``best-at-idle`` (the most accurate whose idle latency
    meets the goal; the fastest if none does), ``largest`` (the slowest), ``smallest`` (the
    fastest) or a SubNet's name."""

    def __init__(self, pick: str = "best-at-idle"):
        self.pick = pick
        self._chosen: str | None = None  # by name: the runtime refines the entries' latencies

    def choose(self, subnets, goal, state):
        if self._chosen is None or self._chosen not in {s.name for s in subnets}:
            if self.pick == "best-at-idle":
                self._chosen = best_fitting(subnets, goal.slo_ms).name
            elif self.pick == "largest":
                self._chosen = max(subnets, key=lambda s: (s.latency_ms, s.accuracy)).name
            elif self.pick == "smallest":
                self._chosen = fastest(subnets).name
            elif self.pick in {s.name for s in subnets}:
                self._chosen = self.pick
            else:
                raise PolicyError(f"static policy: pick={self.pick!r} is not best-at-idle, largest, smallest "
                                  f"or a SubNet within the memory budget ({[s.name for s in subnets]})")
        return next(s for s in subnets if s.name == self._chosen)


class _Stepping(Policy):
    """Hysteresis shared by the adaptive policies: a step down waits ``min_dwell_s`` after the
    last switch; a step up waits a quiet period without a missed goal and after the last
    switch, and must meet the goal with ``up_margin`` to spare. The quiet period starts at
    ``quiet_s``; a step up undone within it (a failed probe: the larger SubNet turned out
    slower than the forecast said, as a SubNet longer than a scheduler slice does under a
    load that a shorter one slips past) multiplies it by ``backoff``, up to ``max_quiet_s``;
    a step up that holds for it sets it back to ``quiet_s``, and so does the monitor seeing
    other processes keep at least half a core less busy than when a probe last failed (the
    load it failed under has gone, so the next probe need not wait out the backoff)."""

    def __init__(self, min_dwell_s: float = 0.05, quiet_s: float = 1.0, up_margin: float = 0.15,
                 backoff: float = 2.0, max_quiet_s: float = 30.0):
        if min_dwell_s < 0 or quiet_s < 0 or not 0 <= up_margin < 1 or backoff < 1 or max_quiet_s < quiet_s:
            raise ValueError("needs min_dwell_s, quiet_s >= 0, 0 <= up_margin < 1, backoff >= 1, max_quiet_s >= quiet_s")
        self.min_dwell_s, self.quiet_s, self.up_margin = min_dwell_s, quiet_s, up_margin
        self.backoff, self.max_quiet_s = backoff, max_quiet_s
        self.quiet_now = quiet_s  # the quiet period in force
        self._up_at: float | None = None  # when the last step up happened, until it holds or fails
        self._failed_under: float | None = None  # cores other processes kept busy when a probe last failed

    def _quiet(self, state: PolicyState) -> bool:
        calm = state.last_violation is None or state.now - state.last_violation >= self.quiet_now
        return calm and state.since_switch_s >= self.quiet_now

    def _step(self, subnets, goal: Goal, state: PolicyState, slowdown: float | None) -> "SubNetEntry":
        cur = state.current
        if self._up_at is not None and state.now - self._up_at >= self.quiet_now:
            self.quiet_now, self._up_at = self.quiet_s, None  # the step up held
        others = state.reading.cpu_others if state.reading is not None else None
        if self._failed_under is not None and others is not None and others <= self._failed_under - 0.5:
            self.quiet_now, self._failed_under = self.quiet_s, None  # the load the probes failed under has gone
        if cur is None or cur.name not in {s.name for s in subnets}:
            return best_fitting(subnets, goal.slo_ms, slowdown or 1.0)
        if slowdown is None:
            return cur
        if cur.latency_ms * slowdown > goal.slo_ms:  # missing the goal: down, at once
            down = best_fitting(subnets, goal.slo_ms, slowdown)
            if state.since_switch_s < self.min_dwell_s or down.latency_ms >= cur.latency_ms:
                return cur
            if self._up_at is not None:  # a failed probe
                self.quiet_now = min(self.quiet_now * self.backoff, self.max_quiet_s)
                self._up_at = None
                if state.reading is not None:
                    self._failed_under = state.reading.cpu_others
            return down
        up = best_fitting(subnets, goal.slo_ms * (1 - self.up_margin), slowdown)
        if up.accuracy > cur.accuracy and self._quiet(state):
            self._up_at = state.now
            return up
        return cur


@register_policy("reactive")
class Reactive(_Stepping):
    """AdaptiveNet's runtime switching: the ratio ``r`` of the current SubNet's recent observed
    latency (the median of its last ``window`` inferences) to its idle latency scales every
    SubNet's latency; when the recent latency misses the goal, the most accurate SubNet within
    ``slo / r`` takes over; after a quiet period, a more accurate one that meets it with the
    margin. It reacts only to what the current SubNet has shown (no forecast)."""

    def __init__(self, window: int = 5, min_dwell_s: float = 0.05, quiet_s: float = 1.0, up_margin: float = 0.15,
                 backoff: float = 2.0, max_quiet_s: float = 30.0):
        super().__init__(min_dwell_s, quiet_s, up_margin, backoff, max_quiet_s)
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window

    def choose(self, subnets, goal, state):
        recent = state.recent_ms[-self.window:]
        if state.current is None or len(recent) < min(self.window, 3):
            return self._step(subnets, goal, state, None if state.current else 1.0)
        return self._step(subnets, goal, state, statistics.median(recent) / state.current.latency_ms)


@register_policy("forecast")
class Forecast(_Stepping):
    """AdaScale's proactive choice: the most accurate SubNet whose idle latency times the
    forecast's upper bound of the slowdown meets the goal: the larger of the last 20
    inferences' time-weighted mean slowdown (the inverse of the CPU share we get, which holds
    for every SubNet) and their 90th percentile (see ``forecast.py``). Unlike ``reactive``, it
    plans for the share and the slow tail, not the median of the current SubNet alone."""

    def choose(self, subnets, goal, state):
        bound = state.forecast.upper
        return self._step(subnets, goal, state, bound if math.isfinite(bound) else None)
