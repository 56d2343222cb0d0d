"""Accuracy predictors (sensitivities, MLP) and the budgeted search."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import torchvision

import autotailor as at
from autotailor.data import BatchLoader, load_data
from autotailor.predict.accuracy import (ArchEncoder, MlpPredictor, MlpSettings, SensitivityPredictor,
                                         SensitivityTable, fit_overlap, measure_sensitivity)
from autotailor.predict.latency import CostModel, KernelPlan
from autotailor.search import Budget, EvolutionSettings, Objectives, SearchError, parse_budget_label, search
from autotailor.tune import evaluate


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return at.compile(torchvision.models.resnet18(num_classes=10), torch.randn(1, 3, 32, 32))


def _table(space, seed: int = 0) -> SensitivityTable:
    rng = random.Random(seed)
    return SensitivityTable(0.9, {k: rng.uniform(0.0, 0.02) for k in ArchEncoder(space).keys})


def test_sensitivity_prediction_is_base_minus_the_deltas_it_makes(resnet) -> None:
    space = resnet.space
    table = _table(space)
    table.deltas["stage1.width_ratio=0.5"] = -0.05  # below what 1000 images resolve: counted as one image
    table.validation_images = 1000
    table.deltas = {k: max(v, 0.002) if k != "stage1.width_ratio=0.5" else v for k, v in table.deltas.items()}
    pred = SensitivityPredictor(space, table)
    assert pred.predict(space.max()) == pytest.approx(0.9)
    arch = {**space.max(), "resolution": space["resolution"].choices[0], "stage1.width_ratio": 0.5}
    assert pred.predict(arch) == pytest.approx(0.9 - table.deltas[f"resolution={space['resolution'].choices[0]}"] - 0.001)
    # a variable in a dropped block adds nothing: the drop's own delta covers the block
    stage = next(s for s, st in enumerate(space.stages) if st.droppable)
    block = space.stages[stage].droppable[-1]
    inner = next(v for v in space.variables if v.block == block)
    dropped = {**space.max(), f"stage{stage}.reduce_depth": -1, inner.name: inner.choices[0]}
    expected = 0.9 - table.deltas[f"stage{stage}.reduce_depth=-1"]
    assert pred.predict(dropped) == pytest.approx(expected)
    kept = {**space.max(), inner.name: inner.choices[0]}
    assert pred.predict(kept) == pytest.approx(0.9 - table.deltas[f"{inner.name}={json.dumps(inner.choices[0])}"])
    archs = [space.sample(i) for i in range(20)]
    assert np.allclose(pred.predict_many(archs), [pred.predict(a) for a in archs])
    del table.deltas[next(iter(table.deltas))]
    with pytest.raises(at.AutoTailorError, match="the sensitivity table lacks 1 of"):
        SensitivityPredictor(space, table)


def test_overlapping_drops_are_fitted_to_measured_subnets(resnet) -> None:
    space = resnet.space
    plain = SensitivityPredictor(space, _table(space))
    archs = [space.complete(space.sample(i)) for i in range(30)] + [space.min()]
    drops = plain.drops(archs)
    # SubNets whose drops saturate at 5 points: the fit finds the level it was made with
    truth = 0.9 - 0.05 * (1 - np.exp(-drops / 0.05))
    fit = fit_overlap(plain, archs, truth)
    assert fit.samples == 31 and fit.overlap == pytest.approx(0.05, rel=0.05)
    assert fit.error < 0.001 and fit.loo_error < 0.001
    fitted = SensitivityPredictor(space, plain.table, fit.overlap)
    assert np.allclose(fitted.predict_many(archs), truth, atol=0.001)
    assert fitted.predict(space.max()) == pytest.approx(0.9)
    # the same order as the plain sum: a monotone map of it
    assert np.array_equal(np.argsort(fitted.predict_many(archs)), np.argsort(plain.predict_many(archs)))
    # drops that add up are found to add up; too few SubNets fit nothing
    additive = fit_overlap(plain, archs, plain.predict_many(archs))
    assert additive.overlap is None and additive.error < 1e-9
    assert "drops adding up (the best fit)" in additive.describe()
    assert fit_overlap(plain, archs[:4], truth[:4]) is None
    assert fit.describe().startswith("sensitivities fitted to 31 measured SubNets: drops saturating at 5.0")
    with pytest.raises(at.AutoTailorError, match="overlap = 0 must be a positive accuracy"):
        SensitivityPredictor(space, plain.table, 0)


def test_sensitivities_are_measured_once_and_resume(tmp_path) -> None:
    torch.manual_seed(0)
    config = {"var": {"global_vars": {"resolution": [24, 32], "width_ratio": [1.0]},
                      "stage_vars": {"reduce_depth": [0], "width_ratio": [0.5, 1.0]},
                      "block_vars": {"BasicBlock.expand_ratio": [1.0]}}}
    sn = at.compile(torchvision.models.resnet18(num_classes=10), torch.randn(1, 3, 32, 32), config=config)
    train, val = load_data("digits")
    val_batches = list(BatchLoader(val.subset(np.arange(64)), 32, train=False, resolution=32))
    calib = [BatchLoader(train, 32, train=True, resolution=32).batch(0, 0)]
    path = tmp_path / "sensitivity.json"
    seen: list[tuple[int, int]] = []
    table = measure_sensitivity(sn, val_batches, calib, path, info={"data": "digits"},
                                on_progress=lambda d, t: seen.append((d, t)))
    n = sn.space.num_modifications
    assert seen[0] == (0, n + 1) and seen[-1] == (n + 1, n + 1)
    assert table.validation_images == 64 and len(table.deltas) == n
    base = evaluate(sn, sn.space.max(), val_batches, calib)
    assert table.base_accuracy == pytest.approx(base)
    key = "resolution=24"
    assert table.deltas[key] == pytest.approx(base - evaluate(sn, {"resolution": 24}, val_batches, calib))
    # interrupted after some modifications: the rest is measured, the rest kept
    saved = json.loads(path.read_text())
    first = dict(list(saved["deltas"].items())[:2])
    path.write_text(json.dumps({**saved, "deltas": first}))
    seen.clear()
    again = measure_sensitivity(sn, val_batches, calib, path, info={"data": "digits"},
                                on_progress=lambda d, t: seen.append((d, t)))
    assert seen[0] == (3, n + 1) and again.deltas == pytest.approx(table.deltas)
    # measured on other data (or weights): set aside, measured again, never mixed
    other = measure_sensitivity(sn, val_batches, calib, path, info={"data": "other"})
    assert other.info == {"data": "other"} and len(other.deltas) == n
    assert json.loads(path.with_name("sensitivity.json.stale").read_text())["info"] == {"data": "digits"}


def test_mlp_learns_an_additive_accuracy(resnet) -> None:
    space = resnet.space
    truth = SensitivityPredictor(space, _table(space, 1))
    archs = [space.sample(i) for i in range(300)]
    acc = truth.predict_many(archs)
    mlp = MlpPredictor(space, MlpSettings(epochs=300)).fit(archs[:200], acc[:200])
    test = mlp.predict_many(archs[200:])
    assert np.corrcoef(test, acc[200:])[0, 1] > 0.8
    with pytest.raises(at.AutoTailorError, match="not trained"):
        MlpPredictor(space).predict(space.max())


def _objectives(sn) -> Objectives:
    costs = CostModel(KernelPlan(sn, "none", "fused"))
    return Objectives(sn.space, SensitivityPredictor(sn.space, _table(sn.space)).predict,
                      {"macs": lambda a: costs.costs(a).macs, "params": lambda a: costs.costs(a).params})


def test_search_meets_every_budget_and_is_deterministic(resnet) -> None:
    space = resnet.space
    obj = _objectives(resnet)
    lo, hi = obj.metric("macs", space.min()), obj.metric("macs", space.max())
    budgets = [Budget.of(macs=lo + (hi - lo) * f) for f in (0.1, 0.4, 0.7)] + [Budget.of(macs=lo / 2)]
    settings = EvolutionSettings(population=20, generations=5, seed=3)
    result = search(space, obj, budgets, settings)
    met = result.choices[:3]
    assert all(c.metrics["macs"] <= c.budget.as_dict()["macs"] for c in met)
    assert [c.accuracy for c in met] == sorted(c.accuracy for c in met)  # more budget, no worse
    assert result.choices[3].arch is None  # below the smallest SubNet
    # the evolution improves on a random feasible SubNet of the same budget
    rng = random.Random(0)
    randoms = [a for a in (space.sample(rng) for _ in range(300)) if obj.feasible(a, budgets[1])]
    assert met[1].accuracy >= max(obj.accuracy(a) for a in randoms)
    again = search(space, _objectives(resnet), budgets, settings)
    assert [c.arch for c in again.choices] == [c.arch for c in result.choices]
    # the front is non-dominated and ascending
    front = result.front
    assert all(a[2] < b[2] and a[1] < b[1] for a, b in zip(front, front[1:]))
    two = search(space, obj, [Budget.of(macs=hi * 0.5, params=obj.metric("params", space.max()) * 0.3)], settings)
    c = two.choices[0]
    assert c.metrics["macs"] <= hi * 0.5 and c.metrics["params"] <= obj.metric("params", space.max()) * 0.3
    with pytest.raises(SearchError, match="budgets constrain \\['latency_ms'\\]"):
        search(space, obj, [Budget.of(latency_ms=3)], settings)


def test_budgets_spanning_the_space_are_a_fixed_ratio_apart(resnet) -> None:
    from autotailor.pipeline.selection import span_budgets

    obj = _objectives(resnet)
    lo, hi = obj.metric("macs", resnet.space.min()), obj.metric("macs", resnet.space.max())
    values = [b.as_dict()["macs"] for b in span_budgets(obj, "macs", 5)]
    assert values[0] >= lo and values[0] == pytest.approx(lo, rel=1e-2)  # rounded up: the smallest still fits
    assert values[-1] == pytest.approx(hi, rel=5e-3)
    ratios = [b / a for a, b in zip(values, values[1:])]
    assert ratios == pytest.approx([(hi / lo) ** 0.25] * 4, rel=1e-2)
    assert [b.as_dict()["macs"] for b in span_budgets(obj, "macs", 1)] == [hi]


def test_budget_labels() -> None:
    assert parse_budget_label("8ms") == ("latency_ms", 8.0)
    assert parse_budget_label("300mmacs") == ("macs", 300e6)
    assert parse_budget_label("4MB") == ("memory_bytes", 4 * 2**20)
    assert parse_budget_label("latency_ms=2.5") == ("latency_ms", 2.5)
    with pytest.raises(SearchError, match="budget '8 parsecs' is not understood"):
        parse_budget_label("8 parsecs")
    with pytest.raises(SearchError, match="unknown metric\\(s\\) \\['energy'\\]"):
        Budget.of(energy=1.0)
    assert Budget.of(latency_ms=8, macs=3e8).name == "latency_ms=8,macs=3e+08"
