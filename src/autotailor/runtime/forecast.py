"""A short-term forecast of the slowdown (observed latency / the SubNet's idle latency in place).

The model: a sliding window of the last ``window`` inferences (20). The forecast is the
window's time-weighted mean slowdown, the sum of the observed latencies over the sum of the
idle latencies; the upper bound the policies plan with is the larger of that and the
window's ``quantile`` (0.9, nearest rank) of the per-inference slowdowns. Before the first
observation the forecast is the idle expectation, 1, with the bound ``prior_upper``
(1.3); then the window starts full of that expectation (slowdown 1, weighted like the first
observation), so that the first inferences are judged as any later ones are: one slow
inference (a cold cache) moves the mean by a twentieth of its excess, three move the quantile.

Why this, and not an exponentially weighted mean plus k EW deviations (Jacobson/Karels, TCP's
timeout) or Holt's linear trend: on a shared CPU the slowdown moves in steps (a process starts
or stops, a quota changes), and how it shows depends on the SubNet. The scheduler gives our
thread a share of a CPU; a SubNet longer than a time slice runs a little in every slice, so
each of its inferences is slowed by about 1/share, while a SubNet shorter than a slice mostly
runs within one undisturbed and now and then waits whole slices (measured here under two busy
processes: a 6 ms SubNet 3.8x slower at the median, a 1.8 ms one 1.08x at the median and 5.6x
at the 90th percentile). What carries over from the SubNet that ran to the ones that might is
the share, and the time-weighted mean is its inverse for any SubNet; the quantile adds the tail
of the one that ran. A per-inference mean with a deviation describes neither, and after a step
it overshoots: with RFC 6298's constants a step from 1 to 2.5 drove the bound to 4.3 before it
settled, and the policy stepped down two SubNets where one was enough. Holt's trend
extrapolates each step's slope past its end. The window's figures never exceed what was
observed; the quantile rises once more than ``(1 - quantile) * window`` inferences (3 of 20)
have slowed, and the bound falls only once most of the window has recovered: quick to step
down, slow to step up, the asymmetry a latency goal wants. One spike raises the mean by
spike / window and leaves the quantile. It costs one sort of 20 floats per inference.

The running error: ``mae`` is the mean absolute error of the past one-step forecasts (the
forecast before each observation against the observation), ``coverage`` the share of
observations at or below the bound that preceded them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class ForecastState:
    """A snapshot of the forecast."""

    mean: float  # the forecast: the window's time-weighted mean slowdown
    upper: float  # max(mean, the window's quantile): the slowdown the policies plan for
    n: int  # observations so far
    mae: float | None  # mean absolute error of the past one-step forecasts
    coverage: float | None  # share of observations that were <= the bound before them


class SlowdownForecast:
    """See the module docstring. ``update(slowdown, weight)`` after each inference, ``weight``
    the SubNet's idle latency (so that the mean is time-weighted); ``state()`` any time."""

    def __init__(self, window: int = 20, quantile: float = 0.9, prior_upper: float = 1.3):
        if window < 1 or not 0 < quantile <= 1 or not prior_upper >= 1:
            raise ValueError(f"SlowdownForecast needs window >= 1, 0 < quantile <= 1 and prior_upper >= 1 "
                             f"(got {window}, {quantile}, {prior_upper})")
        self.window, self.quantile, self.prior_upper = window, quantile, prior_upper
        self._recent: deque[tuple[float, float]] = deque(maxlen=window)  # (slowdown, weight)
        self._sw = self._w = 0.0  # the window's sums of slowdown x weight and of weight
        self.mean, self.upper = 1.0, prior_upper
        self.n = 0
        self._abs_err = 0.0
        self._covered = 0

    def update(self, slowdown: float, weight: float = 1.0) -> None:
        self._abs_err += abs(slowdown - self.mean)
        self._covered += slowdown <= self.upper
        if self.n == 0:
            self._recent.extend([(1.0, weight)] * self.window)
            self._sw = self._w = weight * self.window
        self.n += 1
        if len(self._recent) == self.window:
            s0, w0 = self._recent[0]
            self._sw -= s0 * w0
            self._w -= w0
        self._recent.append((slowdown, weight))
        self._sw += slowdown * weight
        self._w += weight
        self.mean = self._sw / self._w
        ordered = sorted(s for s, _ in self._recent)
        self.upper = max(self.mean, ordered[max(0, math.ceil(self.quantile * len(ordered)) - 1)])

    def state(self) -> ForecastState:
        return ForecastState(self.mean, self.upper, self.n,
                             self._abs_err / self.n if self.n else None,
                             self._covered / self.n if self.n else None)
