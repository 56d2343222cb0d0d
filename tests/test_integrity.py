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
    import signal

    assert main(["compile", "torchvision:resnet18", "--input-size", "32", "--out", str(tmp_path / "w"), "--json"]) == 0
    # As from a terminal: a job started in the background (nohup, `&`) inherits SIGINT ignored.
    proc = subprocess.Popen([sys.executable, "-m", "autotailor.cli", "tune", str(tmp_path / "w"), "--data", "digits",
                             "--steps", "100000", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Ctrl-C once tuning runs (its log has a line), not while the interpreter is still starting.
        deadline = time.perf_counter() + 240
        while not (tmp_path / "w" / "tune.log.jsonl").exists() and proc.poll() is None and time.perf_counter() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().endswith("autotailor: interrupted; run the same command to resume")
    assert "Traceback" not in err
    assert torch.load(tmp_path / "w" / "supernet.pt", weights_only=False)["format"].startswith("autotailor-supernet")


def test_ordinary_mistakes_are_refused_with_one_message(work, tmp_path, capsys) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text("[tune]\nlrr = 0.1\n")  # refused at compile, not baked into the work directory
    assert main(["compile", "torchvision:resnet18", "--input-size", "32", "--config", str(typo),
                 "--out", str(tmp_path / "t")]) == 2
    assert "unknown tune setting 'lrr'; allowed: steps" in capsys.readouterr().err
    assert not (tmp_path / "t" / "supernet.pt").exists()
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a work directory (no compile.json)" in capsys.readouterr().err
    assert main(["compile", "torchvision:fasterrcnn_resnet50_fpn", "--out", str(tmp_path / "d")]) == 2
    assert "'fasterrcnn_resnet50_fpn' (it is a detection, segmentation or video model" in capsys.readouterr().err
    assert main(["search", str(work), "--latency-ms", "-1"]) == 2
    assert "search.latency_ms = [-1.0] is not allowed; budgets are positive numbers" in capsys.readouterr().err


def test_silent_changes_are_said(tmp_path, caplog) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[var.global_vars]\nresolution = [64]\nwidth_ratio = [0.5]\n[var.stage_vars]\n"
                      "reduce_depth = [-10, 0]\n[var.block_vars]\nInvertedResidualBlock.kernel_size = [3, 9]\n")
    assert main(["compile", "torchvision:mobilenet_v2", "--input-size", "64", "--config", str(config),
                 "--out", str(tmp_path / "w")]) == 0
    said = caplog.text
    assert "var.global_vars.width_ratio = [0.5] has no 1.0; the original width is always a choice" in said
    assert "var.stage_vars.reduce_depth = [-10, 0] goes deeper than stages can drop; limited to stage" in said
    assert ("var.block_vars.InvertedResidualBlock.kernel_size: sizes above a convolution's own kernel (3) are "
            "left out") in said


# -- fuzz: generated bad input through the command line -------------------------------------------------
_VALID = {"var.global_vars": {"resolution": "[24, 32]", "width_ratio": "[0.75, 1.0]"},
          "var.stage_vars": {"reduce_depth": "[-1, 0]", "width_ratio": "[0.5, 1.0]"},
          "var.block_vars": {"BasicBlock.expand_ratio": "[0.5, 1.0]"},
          "tune": {"steps": "10", "lr": "0.01"}, "search": {"budgets": "3"}, "export": {"formats": "['onnx']"}}
_POISON = [  # (table, key, value): each is wrong
    ("var.global_vars", "resolution", "[0]"), ("var.global_vars", "resolution", "'224'"),
    ("var.global_vars", "resolution", "[]"), ("var.global_vars", "width_ratio", "[1.5]"),
    ("var.global_vars", "width_ratio", "[0]"), ("var.global_vars", "width_ratio", "[true]"),
    ("var.global_vars", "widths", "[0.5]"), ("var.stage_vars", "reduce_depth", "[1]"),
    ("var.stage_vars", "reduce_depth", "[-1.5]"), ("var.stage_vars", "reduce_depth", "-1"),
    ("var.block_vars", "BasicBlock.expand_ratio", "[-0.5]"), ("var.block_vars", "NoSuchBlock.expand_ratio", "[0.5]"),
    ("var.block_vars", "BasicBlock.kernel_size", "[4]"), ("var.block_vars", "BasicBlock.depth", "[1]"),
    ("var.block_vars", "AttentionBlock.heads_ratio", "[2.0]"), ("var.global_vars", "embed_ratio", "['x']"),
    ("tune", "lr", "-1.0"), ("tune", "lr", "'fast'"), ("tune", "steps", "0"), ("tune", "optimizer", "'adam'"),
    ("tune", "lrr", "0.1"), ("tune", "momentum", "1.5"), ("train", "steps", "-3"), ("search", "budgets", "-2"),
    ("search", "latency_ms", "[-1.0]"), ("search", "latency_ms", "[0]"), ("search", "axis", "'speed'"),
    ("search", "population", "1"), ("export", "formats", "['tflite']"), ("export", "formats", "[]"),
    ("export", "format", "['onnx']"), ("sensitivity", "batch_size", "'big'"), ("bogus", "x", "1"),
    ("arch", "blocks", "['NoSuchBlock']"), ("arch", "blocks", "'BasicBlock'"),
]
_SYNTAX = ["[var.global_vars\nresolution = [32]", "resolution = [32", "[tune]\nlr = ", "= 3", "[[tune]]\nsteps = 1"]


def _bad_config(rng) -> str:
    if rng.random() < 0.08:
        return rng.choice(_SYNTAX)
    tables: dict[str, dict[str, str]] = {}
    for table in rng.sample(sorted(_VALID), rng.randint(0, 3)):
        key = rng.choice(sorted(_VALID[table]))
        tables.setdefault(table, {})[key] = _VALID[table][key]
    table, key, value = rng.choice(_POISON)
    tables.setdefault(table, {})[key] = value
    return "\n".join(f"[{t}]\n" + "\n".join(f"{k} = {v}" for k, v in kv.items()) for t, kv in tables.items()) + "\n"


def _bad_arch(rng) -> str:
    good = {"resolution": 32, "stage1.reduce_depth": -1}
    poison = rng.choice([("resolution", 31), ("resolution", "32"), ("nosuch.var", 1), ("stage1.reduce_depth", -5),
                         ("stage1.reduce_depth", None), ("resolution", [32]), ("resolution", True)])
    kind = rng.random()
    if kind < 0.15:
        return rng.choice(["{", "", "[1, 2]", "null", "\"max\"", "{\"resolution\": }", "3"])
    arch = dict(rng.sample(sorted(good.items()), rng.randint(0, 2)))
    arch[poison[0]] = poison[1]
    return json.dumps(arch)


def _corrupt(rng, w) -> tuple[list[str], str]:
    """A state file of the work directory spoiled, and the command that reads it."""
    name, command = rng.choice([("supernet.pt", ["evaluate", str(w), "--data", "digits"]),
                                ("config.json", ["tune", str(w), "--data", "digits", "--steps", "1", "--quiet"]),
                                ("sensitivity.json", ["search", str(w), "--latency-ms", "5"]),
                                ("search.json", ["export", str(w)]),
                                ("latency.sqlite", ["predict", str(w)]),
                                ("run.json", ["report", str(w)]),
                                ("search.json", ["report", str(w)])])
    content = rng.choice([b"", b"\x00\xff garbage" * rng.randint(1, 50), b"{\"schema\": \"other/1\"}", b"[]",
                          b"{\"truncated\": ", b"null"])
    (w / name).write_bytes(content)
    return command, name


def test_fuzz_bad_configs_arch_files_and_state_files_end_in_one_message(work, tmp_path, capsys) -> None:
    import random

    rng = random.Random(23)
    cases = 0
    for i in range(120):  # configs: compile refuses each with one message
        config = tmp_path / f"c{i}.toml"
        config.write_text(_bad_config(rng))
        rc = main(["compile", "torchvision:resnet18", "--input-size", "32", "--config", str(config),
                   "--out", str(tmp_path / f"o{i}")])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("autotailor: error: ") and "Traceback" not in err, (config.read_text(), err)
        cases += 1
    for i in range(60):  # arch files
        arch = tmp_path / f"a{i}.json"
        arch.write_text(_bad_arch(rng))
        rc = main(["evaluate", str(work), "--data", "digits", "--arch", str(arch)])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("autotailor: error: ") and "Traceback" not in err, (arch.read_text(), err)
        cases += 1
    for i in range(30):  # spoiled state files
        w = tmp_path / f"w{i}"
        shutil.copytree(work, w, ignore=shutil.ignore_patterns("*.ckpt"))
        command, name = _corrupt(rng, w)
        rc = main(command)
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and name in err, (command, name, err)
        cases += 1
        shutil.rmtree(w)
    assert cases >= 200


def test_data_the_model_cannot_score_and_unreadable_images_are_refused(tmp_path, capsys) -> None:
    import numpy as np
    import torchvision
    from PIL import Image

    import autotailor as at

    sn = at.compile(torchvision.models.resnet18(num_classes=5), torch.zeros(1, 3, 32, 32),
                    config="[var.global_vars]\nresolution = [32]")
    (tmp_path / "five").mkdir()
    sn.save(tmp_path / "five" / "supernet.pt")
    assert main(["evaluate", str(tmp_path / "five"), "--data", "digits"]) == 2  # was: 10.3 % without a word
    assert "digits has 10 classes but the model has 5 outputs" in capsys.readouterr().err
    folder = tmp_path / "images"
    for c in ("cat", "dog"):
        (folder / c).mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / c / "0.png")
    (folder / "dog" / "1.jpg").write_bytes(b"not a jpeg")
    assert main(["evaluate", str(tmp_path / "five"), "--data", f"imagefolder:{folder}"]) == 2
    assert f"{folder}: dog/1.jpg is not a readable image (UnidentifiedImageError" in capsys.readouterr().err


def test_export_takes_a_budget_label_the_search_wrote(tmp_path) -> None:
    from autotailor.pipeline.results import Chosen, SearchRecord

    label = "latency_ms=0.3,macs=1e+07"
    record = SearchRecord("ort-cpu", None, None, "latency_ms", {}, 1.0, 10, 0, 4, 0,
                          [Chosen(label, {"latency_ms": 0.3, "macs": 1e7}, {"resolution": 32}, 0.9, {}, 0.1)])
    assert record.pick(label)[0].budget == label
    with pytest.raises(Exception, match=r"budget 'latency_ms=0.3,macs=2' is not understood; write one metric=value"):
        record.pick("latency_ms=0.3,macs=2")
