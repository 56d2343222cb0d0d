"""A work directory that never lies: stale results measured again, a diverged tuning stopped
before it touches the weights, a used directory refused, one writer at a time, unreadable state
named with what to do, and ordinary mistakes refused with one message (issue 23's probes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from autotailor.cli import main
from autotailor.pipeline.workdir import locked, weights_digest


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """ResNet-18 at 32 px with a small space, trained a little on digits."""
    root = tmp_path_factory.mktemp("integrity")
    config = root / "small.toml"
    config.write_text("[var.global_vars]\nresolution = [32]\nwidth_ratio = [1.0]\n"
                      "[var.stage_vars]\nreduce_depth = [-1, 0]\nwidth_ratio = [1.0]\n"
                      "[var.block_vars]\nBasicBlock.expand_ratio = [0.5, 1.0]\n")
    work = root / "w"
    assert main(["compile", "torchvision:resnet18", "--input-size", "32", "--config", str(config),
                 "--out", str(work), "--json"]) == 0
    assert main(["train", str(work), "--data", "digits", "--steps", "4", "--quiet"]) == 0
    return work


def _copy(work, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(work, copy)
    return copy


def test_a_diverged_tuning_stops_before_it_touches_the_weights(work, tmp_path, capsys) -> None:
    w = _copy(work, tmp_path)
    before = weights_digest(w)
    capsys.readouterr()
    assert main(["tune", str(w), "--data", "digits", "--steps", "3", "--lr", "1000000", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the loss diverged at step" in err and "(lr 1e+06)" in err
    assert "the files on disk are the last good ones (no checkpoint)" in err
    assert weights_digest(w) == before and not (w / "tune.ckpt").exists()
    # settings that cannot train are refused before anything runs
    for flags, message in ((["--lr", "-1"], "argument --lr: -1 is out of range: expected above 0"),
                           (["--lr", "nan"], "argument --lr: nan is out of range"),
                           (["--batch-size", "0"], "argument --batch-size: 0 is out of range: expected at least 1"),
                           (["--steps", "x"], "argument --steps: 'x' is not an integer")):
        with pytest.raises(SystemExit) as exit_:
            main(["tune", str(w), "--data", "digits", *flags])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_used_work_directory_is_refused_unless_forced(work, tmp_path, capsys) -> None:
    w = _copy(work, tmp_path)
    (w / "search.json").write_text("{}")
    (w / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["compile", "torchvision:resnet34", "--input-size", "32", "--out", str(w)]) == 2
    err = capsys.readouterr().err
    assert f"{w} already holds a SuperNet and what was made from it (supernet.pt," in err
    assert "pass --force to replace it" in err and (w / "train.ckpt").exists()
    assert main(["compile", "torchvision:resnet34", "--input-size", "32", "--out", str(w), "--force", "--json"]) == 0
    assert json.loads((w / "compile.json").read_text())["source"] == "torchvision:resnet34"
    assert not (w / "train.ckpt").exists() and not (w / "search.json").exists()
    assert (w / "notes.txt").read_text() == "mine"  # only what the steps made is deleted


def test_one_writer_per_work_directory(work, tmp_path, capsys) -> None:
    w = _copy(work, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from autotailor.pipeline.workdir import locked\n"
                               f"with locked({str(w)!r}, 'autotailor tune W'):\n"
                               "    print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main(["tune", str(w), "--data", "digits", "--steps", "1", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"{w} is in use by process {holder.pid} (autotailor tune W); wait for it to finish" in err
    finally:
        holder.kill()
        holder.wait()
    with locked(w, "this test"):  # the lock went with the process
        assert (w / ".autotailor.lock").read_text() == f"process {os.getpid()} (this test)"
    assert main(["compile", "torchvision:resnet18", "--out", "/proc/autotailor-x", "--input-size", "32"]) == 2
    assert "cannot write to the work directory /proc/autotailor-x" in capsys.readouterr().err


def test_stale_and_unreadable_sensitivity_tables_are_measured_again(work, tmp_path, capsys) -> None:
    w = _copy(work, tmp_path)
    flags = ["--data", "digits", "--validation-images", "64", "--calibration-batches", "1"]
    assert main(["sensitivity", str(w), *flags]) == 0
    first = json.loads((w / "sensitivity.json").read_text())
    assert first["info"]["weights"] == weights_digest(w)
    # the weights change (tuned): the table measured on the old ones is set aside, not reused
    assert main(["tune", str(w), "--data", "digits", "--steps", "2", "--quiet"]) == 0
    assert main(["sensitivity", str(w), *flags]) == 0
    second = json.loads((w / "sensitivity.json").read_text())
    assert second["info"]["weights"] == weights_digest(w) != first["info"]["weights"]
    assert json.loads((w / "sensitivity.json.stale").read_text()) == first
    # unreadable: named with what to do by the commands that read it, rebuilt by the one that writes it
    (w / "sensitivity.json").write_text("{not json")
    capsys.readouterr()
    assert main(["search", str(w), "--device", "none", "--axis", "macs", "--budgets", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{w}/sensitivity.json is not a sensitivity table" in err and "autotailor sensitivity" in err
    assert main(["sensitivity", str(w), *flags]) == 0
    assert (w / "sensitivity.json.bad").read_text() == "{not json"
    assert json.loads((w / "sensitivity.json").read_text())["base_accuracy"] is not None


def test_unreadable_state_files_are_named_with_what_to_do(work, tmp_path, capsys) -> None:
    w = _copy(work, tmp_path)
    (w / "latency.sqlite").write_bytes(b"garbage, not a database" * 100)
    capsys.readouterr()
    assert main(["profile", str(w), "--device", "ort-cpu:threads=1"]) == 2
    err = capsys.readouterr().err
    assert f"{w}/latency.sqlite is not a latency table" in err and "move it aside" in err
    arch = tmp_path / "arch.json"
    arch.write_text('{"resolution": 32,')
    assert main(["evaluate", str(w), "--data", "digits", "--arch", str(arch)]) == 2
    assert f"--arch {arch}: not valid JSON" in capsys.readouterr().err
    arch.write_text("[1, 2]")
    assert main(["evaluate", str(w), "--data", "digits", "--arch", str(arch)]) == 2
    assert "an arch is a JSON object of variable: choice, not list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compile", "torchvision:resnet18", "--out", str(tmp_path / "x"), "--input-size", "-5"])
    assert "argument --input-size: -5 is out of range: expected at least 8 and at most 4096" in capsys.readouterr().err


def test_ctrl_c_says_how_to_resume(tmp_path) -> None:
    script = ("import signal, threading, os\n"
              "from autotailor.cli import main\n"
              "threading.Timer(8, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
              f"raise SystemExit(main(['tune', {str(tmp_path / 'w')!r}, '--data', 'digits', '--steps', '100000', "
              "'--quiet']))\n")
    assert main(["compile", "torchvision:resnet18", "--input-size", "32", "--out", str(tmp_path / "w"), "--json"]) == 0
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.strip().endswith("autotailor: interrupted; run the same command to resume")
    assert "Traceback" not in done.stderr and time.perf_counter() - started < 300
    assert torch.load(tmp_path / "w" / "supernet.pt", weights_only=False)["format"].startswith("autotailor-supernet")
