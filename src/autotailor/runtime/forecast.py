"""A short-term forecast of the slowdown (observed latency / the SubNet's manifest latency).

The model is Jacobson and Karels' round-trip-time estimator, the one TCP uses for its
retransmission timeout (RFC 6298): an exponentially weighted mean ``m`` and an exponentially
weighted mean absolute deviation ``d`` of the observations, and the upper bound ``m + k d``::

    err = y - m
    m  += alpha * err                 # alpha = 1/8
    d  += beta * (|err| - d)          # beta  = 1/4
    upper = m + k * d                 # k = 3

Why this and not Holt's linear trend or an autoregressive model (AdaScale's): the slowdown of
an inference on a shared CPU moves in steps (a process starts or stops, a quota changes), not
along trends, and is noisy from one inference to the next (±13 % within a minute on these VMs,
more on sub-millisecond SubNets, which a scheduler time slice can delay several-fold). A trend
term extrapolates the slope of each step past its end and amplifies that noise; an AR model
needs fitting and gives no bound. The EW mean follows a step within a few observations, the EW
deviation widens the bound as soon as observations disagree with the mean and narrows it again
as they settle, which is what a policy needs to step down early and up late. It costs a few
floating-point operations per inference and has two well-studied constants.

One change from RFC 6298: each observation passes through the median of the last three
before it reaches the filters, so that one isolated spike (a page fault, a timer interrupt
landing on a 0.3 ms inference) moves nothing, while a lasting slowdown passes from its second
observation on. The forecast's errors are measured against the raw observations.

The forecast starts at the manifest's idle expectation, a slowdown of 1, with a deviation of
0.1 (``upper`` 1.3), so the first inferences already have a bound.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class ForecastState:
    """A snapshot of the forecast."""

    mean: float  # the forecast of the next slowdown
    deviation: float
    upper: float  # mean + k * deviation: the slowdown the policies plan for
    n: int  # observations so far
    mae: float | None  # mean absolute error of the past one-step forecasts (of ``mean``)
    coverage: float | None  # share of observations that were <= the ``upper`` forecast before them


class SlowdownForecast:
    """See the module docstring. ``update(slowdown)`` after each inference; ``state()`` any time."""

    def __init__(self, alpha: float = 0.125, beta: float = 0.25, k: float = 3.0, prefilter: int = 3,
                 initial_deviation: float = 0.1):
        if not (0 < alpha <= 1 and 0 < beta <= 1 and k >= 0 and prefilter >= 1):
            raise ValueError(f"SlowdownForecast needs 0 < alpha, beta <= 1, k >= 0, prefilter >= 1 "
                             f"(got alpha={alpha}, beta={beta}, k={k}, prefilter={prefilter})")
        self.alpha, self.beta, self.k = alpha, beta, k
        self.mean, self.deviation = 1.0, initial_deviation
        self.n = 0
        self._recent: deque[float] = deque(maxlen=prefilter)
        self._abs_err = 0.0
        self._covered = 0

    @property
    def upper(self) -> float:
        return self.mean + self.k * self.deviation

    def update(self, slowdown: float) -> None:
        self._abs_err += abs(slowdown - self.mean)
        self._covered += slowdown <= self.upper
        self.n += 1
        self._recent.append(slowdown)
        y = statistics.median(self._recent)
        err = y - self.mean
        self.mean += self.alpha * err
        self.deviation += self.beta * (abs(err) - self.deviation)

    def state(self) -> ForecastState:
        return ForecastState(self.mean, self.deviation, self.upper, self.n,
                             self._abs_err / self.n if self.n else None,
                             self._covered / self.n if self.n else None)
