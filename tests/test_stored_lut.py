"""Latency predictions from a stored LUT do not move when the code is reorganised.

``data/fixture_lut.json`` holds one LUT per model, keyed by the kernel signatures the
enumeration produced when it was written (values are arbitrary but fixed);
``data/fixture_predictions.json`` the predictions and counted costs of ten SubNets each. A
change to how kernels are enumerated, described or fused changes a signature, leaves the LUT
without an entry, and fails here.
"""

import json
from pathlib import Path

import pytest
import torch
import torchvision

import autotailor as at
from autotailor.predict.latency import CostModel, KernelPlan, LatencyPredictor, LutStore, Target
from autotailor.testing import well_conditioned

DATA = Path(__file__).parent / "data"
CASES = json.loads((DATA / "fixture_predictions.json").read_text())["cases"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with LutStore(tmp_path_factory.mktemp("lut") / "lut.sqlite") as s:
        s.import_(DATA / "fixture_lut.json")
        yield s


@pytest.mark.parametrize("case", CASES, ids=[c["model"] for c in CASES])
def test_predictions_from_a_stored_lut_are_unchanged(case, store):
    torch.manual_seed(0)
    model = well_conditioned(getattr(torchvision.models, case["model"])())
    sn = at.compile(model, torch.zeros(1, 3, case["input_size"], case["input_size"]))
    plan = KernelPlan(sn, case["rules"])
    assert len(plan.kernels) == case["kernels"]
    predictor = LatencyPredictor.from_store(plan, store, Target.of(f"fixture-{case['model']}", case["rules"]))
    costs = CostModel(plan)
    for arch, expected_ms, expected_costs in zip(case["archs"], case["latency_ms"], case["costs"]):
        assert predictor.predict(arch) == pytest.approx(expected_ms, rel=1e-12, abs=1e-12)
        assert vars(costs.costs(arch)) == expected_costs
