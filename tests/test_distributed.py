"""Two processes under torchrun tune like one process with the same global batch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    sys.path.insert(0, {tests!r})
    import autotailor as at
    from autotailor.data import BatchLoader, load_data
    from autotailor.tune import TuneConfig, Tuner
    from test_tune import SmallNet
    distributed = len(sys.argv) > 2
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    sn = at.compile(SmallNet(), torch.zeros(1, 3, 16, 16))
    train, _ = load_data("digits", seed=0)
    tuner = Tuner(sn, BatchLoader(train, 32, train=True, resolution=16), TuneConfig(steps=8, lr=0.05, subnets=3))
    losses = []
    tuner.run(lambda r: losses.append(r.loss))
    if not distributed or dist.get_rank() == 0:
        torch.save({{"losses": losses, "state": sn.state_dict(), "world": tuner.world}}, sys.argv[1])
    if distributed:
        dist.destroy_process_group()
""")


def test_two_processes_match_one(tmp_path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent)))
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    subprocess.run([sys.executable, str(script), str(one)], check=True, timeout=600)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(script), str(two), "distributed"], check=True, timeout=600)
    a, b = torch.load(one), torch.load(two)
    assert (a["world"], b["world"]) == (1, 2)
    # BatchNorm sees half the batch in each process, so the curves agree up to that noise.
    diffs = [abs(x - y) for x, y in zip(a["losses"], b["losses"])]
    assert len(diffs) == 8 and max(diffs) < 0.05, (a["losses"], b["losses"])
    drift = max(float((a["state"][k] - b["state"][k]).abs().max()) for k in a["state"] if a["state"][k].is_floating_point())
    assert 0 < drift < 0.05
