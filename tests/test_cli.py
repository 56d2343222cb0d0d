"""The autotailor command: compile writes a work directory, or nothing on failure."""

from __future__ import annotations

import json

import torch

import autotailor as at
from autotailor.cli import main


def test_compile_writes_the_work_directory(tmp_path, capsys) -> None:
    out = tmp_path / "work"
    assert main(["compile", "torchvision:resnet18", "--out", str(out), "--input-size", "64", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_modifications"] > 0 and summary["log10_space_size"] > 5
    assert {"BasicBlock"} <= {b["template"] for b in summary["blocks"]}
    assert sorted(p.name for p in out.iterdir()) == ["compile.json", "config.json", "space.json", "supernet.pt"]
    sn = at.load(out / "supernet.pt")
    assert str(sn.space.size) == summary["space_size"]
    assert len(json.loads((out / "space.json").read_text())) == len(sn.space)
    assert sn(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


def test_compile_failure_leaves_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "work"
    bad = tmp_path / "bad.toml"
    bad.write_text("[var.stage_vars]\nreduce_depth = 'all'\n")
    assert main(["compile", "torchvision:resnet18", "--config", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "autotailor: error:" in err and "reduce_depth" in err
    assert not out.exists() or not any(out.iterdir())


def test_compile_prints_a_readable_summary(tmp_path, capsys) -> None:
    assert main(["compile", "torchvision:mobilenet_v2", "--out", str(tmp_path / "w"), "--input-size", "64"]) == 0
    text = capsys.readouterr().out
    assert "InvertedResidualBlock" in text
    assert "space size:" in text and "compile time:" in text and "modifications:" in text


def test_train_tune_evaluate_resume(tmp_path, capsys) -> None:
    work = str(tmp_path / "w")
    assert main(["compile", "torchvision:mobilenet_v3_small", "--out", work, "--input-size", "32", "--json"]) == 0
    common = ["--data", "digits", "--batch-size", "32", "--quiet", "--checkpoint-every", "2"]
    assert main(["train", work, "--steps", "4", *common]) == 0
    settings = tmp_path / "tune.toml"
    settings.write_text("[tune]\nsteps = 3\nsubnets = 3\n")
    trained = at.load(work).state_dict()
    assert main(["tune", work, "--config", str(settings), *common]) == 0
    kept = at.load(tmp_path / "w" / "original.pt").state_dict()  # what the tuning started from: the user's model
    assert kept.keys() == trained.keys() and all(torch.equal(kept[k], trained[k]) for k in kept)
    assert any(not torch.equal(v, at.load(work).state_dict()[k]) for k, v in kept.items())
    records = [json.loads(line) for line in (tmp_path / "w" / "tune.log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["images"] == 3 * 32 and r["seconds"] > 0 and r["loss"] > 0 for r in records)
    assert len((tmp_path / "w" / "train.log.jsonl").read_text().splitlines()) == 4
    capsys.readouterr()
    assert main(["tune", work, "--config", str(settings), *common]) == 0  # finished: resumes at the end
    assert "resuming tune at step 3" in capsys.readouterr().out
    assert all(torch.equal(v, at.load(tmp_path / "w" / "original.pt").state_dict()[k]) for k, v in kept.items())
    assert main(["tune", work, "--config", str(settings), "--subnets", "2", *common]) == 2  # other settings
    assert "was written with other settings" in capsys.readouterr().err
    assert main(["evaluate", work, "--data", "digits", "--arch", "min", "--json", "--calibration-batches", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 <= result["accuracy"] <= 1.0 and result["validation_images"] == 359
    assert main(["tune", str(tmp_path / "missing"), "--data", "digits"]) == 2
    assert "holds no supernet.pt" in capsys.readouterr().err
    assert main(["train", work, "--steps", "4", *common]) == 0  # the weights trained again: no original kept
    assert not (tmp_path / "w" / "original.pt").exists()


def test_help_is_plain_text_for_every_command(capsys) -> None:
    import pytest

    from autotailor.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    for argv in [[], *([c] for c in commands)]:
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        out = capsys.readouterr().out
        assert "usage: autotailor" in out and "``" not in out, argv
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    # the backends the registry holds, with their settings
    assert "ort-cpu (threads, optimization, precision, flush_mb), torch (threads), ncnn (threads, precision, winograd, flush_mb)" in " ".join(
        capsys.readouterr().out.split())
