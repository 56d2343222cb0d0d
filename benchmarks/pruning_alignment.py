"""Why NestDNN* prunes with Torch-Pruning's ``round_to``: its pruned models' latency on ONNX
Runtime (1 thread) with each layer's kept channels unrounded and rounded down to multiples of 8
and of 16, against the unpruned model's, for the CIFAR-10 ResNet-18 and MobileNetV2 of
``baselines.py``.

    .venv/bin/python benchmarks/pruning_alignment.py [--models mobilenet_v2,resnet18] [--rounds 12]

Every model is exported to ONNX and timed by ``paired_timing.py`` (a process without torch) in
30-call windows alternated with the unpruned model's, so that each reading is a ratio to the
unpruned model in the same seconds: the median over the rounds, and their median absolute
deviation. Minutes on 2 cores; needs the trained weights in ``benchmarks/artifacts/``. Results:
``benchmarks/results/pruning_alignment.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import baselines  # noqa: E402
import cifar_models  # noqa: E402
from common import head_commit, machine, write_results  # noqa: E402

ROUNDINGS = (None, 8, 16)


def _export(net: torch.nn.Module, path: Path) -> Path:
    torch.onnx.export(net.eval(), torch.randn(1, 3, 32, 32), str(path), dynamo=False)
    return path


def measure(model: str, rounds: int, tmp: Path) -> list[dict]:
    """Each ratio and rounding's MACs and latency relative to the unpruned ``model``."""
    import torch_pruning as tp

    rows, files = [], {}
    for ratio in baselines.RATIOS:
        for round_to in ROUNDINGS:
            net = baselines.pruned(model, ratio, round_to)
            macs, _ = tp.utils.count_ops_and_params(net, torch.randn(1, 3, 32, 32))
            name = f"{ratio:g}/{round_to}"
            files[name] = str(_export(net, tmp / f"{model}_{ratio:g}_{round_to}.onnx"))
            rows.append({"ratio": ratio, "round_to": round_to, "macs": int(macs), "name": name})
    full = str(_export(cifar_models.trained(model), tmp / f"{model}.onnx"))
    spec, out = tmp / f"{model}_spec.json", tmp / f"{model}_timed.json"
    spec.write_text(json.dumps({"threads": 1, "rounds": rounds, "calls": 30, "warmup": 3, "reference": full,
                                "largest": full, "models": files}))
    subprocess.run([sys.executable, str(HERE / "paired_timing.py"), str(spec), str(out)], check=True)
    timed = json.loads(out.read_text())
    return [{**r, "latency_ratio": timed[r["name"]]["ratio"], "ratio_mad": timed[r["name"]]["ratio_mad"],
             "unpruned_ms": timed[r["name"]]["largest_ms"]} for r in rows]


def _channels(round_to: int | None) -> str:
    return "unrounded" if round_to is None else f"multiples of {round_to}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(baselines.MODELS))
    p.add_argument("--rounds", type=int, default=12, help="30-call windows of each model, each beside the unpruned one")
    args = p.parse_args()
    command = "python benchmarks/pruning_alignment.py " + " ".join(sys.argv[1:])
    m = machine("torch", "onnxruntime", "torch_pruning")
    results = {}
    lines = ["# NestDNN*'s pruned models on ONNX Runtime, channels unrounded and rounded", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; onnxruntime {m['onnxruntime']}, torch-pruning "
             f"{m['torch_pruning']}; commit {head_commit()}. Command: `{command}`. Latency as a ratio to the unpruned "
             f"model's, timed alternately in {args.rounds} rounds of 30-call windows (ONNX Runtime, 1 thread): the "
             "median, and in brackets the rounds' median absolute deviation from it.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            rows = results[model] = measure(model, args.rounds, Path(tmp))
            lines += [f"## {model}", "", f"Unpruned: {rows[0]['unpruned_ms']:.3f} ms.", "",
                      "| ratio | channels | MACs | latency / unpruned |", "|---|---|---|---|"]
            lines += [f"| {r['ratio']:g} | {_channels(r['round_to'])} | {r['macs'] / 1e6:.1f} M | "
                      f"{r['latency_ratio']:.2f} (±{100 * r['ratio_mad']:.0f} %) |" for r in rows]
            lines.append("")
    write_results(HERE / "results", "pruning_alignment",
                  {"machine": m, "commit": head_commit(), "command": command, "models": results}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
