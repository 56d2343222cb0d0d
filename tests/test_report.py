"""The report's account of a search: distinct choices, validation noise, whether measured
accuracy rises with the budget, and the predictions' largest gap; and the plot of it."""

from __future__ import annotations

import json

from autotailor.pipeline.finalists import standard_error
from autotailor.pipeline.report import _front_summary, plot
from autotailor.pipeline.results import Chosen, SearchRecord


def _search(measured: list[float], predicted: list[float], archs: list[int]) -> SearchRecord:
    choices = [Chosen(f"latency_ms={ms}", {"latency_ms": ms}, {"block1.expand_ratio": a}, p, {"latency_ms": ms * 0.9},
                      0.1, measured_accuracy=m, measured_latency_ms=ms * 0.95)
               for ms, m, p, a in zip((1.0, 2.0, 3.0, 4.0), measured, predicted, archs)]
    return SearchRecord(device="ort-cpu", target="t", latency_model=None, axis="latency_ms", settings={}, seconds=1.0,
                        predictions=10, verify_rounds=0, beam_size=4, finalists=4, choices=choices,
                        front=[{"arch": {}, "accuracy": 0.9, "latency_ms": 1.0}])


def test_one_standard_error_of_a_binomial_accuracy() -> None:
    assert abs(standard_error(0.9, 400) - 0.015) < 1e-12
    assert standard_error(0.9, 0) == 0.0


def test_a_rising_front_within_the_noise_is_reported_as_rising() -> None:
    # 0.94 after 0.95 on 400 images: a fall of 1 point, within two standard errors (about 3.1 points)
    text = " ".join(_front_summary(_search([0.90, 0.95, 0.94, 0.97], [0.89, 0.93, 0.95, 0.985], [1, 2, 2, 3]), 400))
    assert text.startswith("3 of 4 budgets chose distinct SubNets. Validation noise: one standard error of an "
                           "accuracy measured on 400 images is 1.50 pts or less.")
    assert "rises with the budget (non-decreasing within two standard errors of each step)" in text
    assert "the largest gap between predicted and measured is 2.00 pts (latency_ms=2.0)" in text


def test_a_fall_beyond_the_noise_names_the_budget() -> None:
    text = " ".join(_front_summary(_search([0.97, 0.90, 0.95, 0.96], [0.97, 0.90, 0.95, 0.96], [1, 2, 3, 4]), 400))
    assert "falls by more than two standard errors at latency_ms=2.0 (90.00 % after 97.00 %)" in text
    assert "the largest gap between predicted and measured is 0.00 pts" in text


def test_without_measured_accuracy_only_the_distinct_choices_are_counted(tmp_path) -> None:
    search = _search([None] * 4, [0.8, 0.85, 0.9, 0.95], [1, 1, 2, 2])
    assert _front_summary(search, 400) == ["2 of 4 budgets chose distinct SubNets.", ""]
    path = plot(tmp_path, _search([0.90, 0.95, 0.94, 0.97], [0.89, 0.93, 0.95, 0.99], [1, 2, 2, 3]), None, 400)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(search.to_dict())  # the record stays JSON
