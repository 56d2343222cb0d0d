"""Compile every torchvision classification model: time, modifications, space size, equivalence.

Reproduce (from the repository root, after `make install`)::

    .venv/bin/python benchmarks/compile_zoo.py            # all models, ~15 min on 2 cores
    .venv/bin/python benchmarks/compile_zoo.py --models resnet50,mobilenet_v2
    .venv/bin/python benchmarks/compile_zoo.py --report-only   # table and summary again from the JSON

For each model (random weights made well-conditioned by ``autotailor.testing``), at 224x224
(inception_v3: 299x299), batch 1:

* compile time: median of ``--repeats`` compiles (each starts from the user's module,
  so it includes copying the model, tracing, every pass and the resolution check);
* number of modifications and log10 of the exact number of distinct SubNets of the
  default space (no config);
* equivalence: max |SuperNet(max arch) - model| / max |model| on one random input;
* one random SubNet: the extracted module against the SuperNet at that arch;
* ONNX round trip (models up to 150 M parameters): export the model with
  ``autotailor.deploy.export_onnx``, compile the ``.onnx`` file, and report whether the space
  is the same (variable names and choices) and, if so, the relative difference between the
  two SuperNets' outputs for one random arch.

If ``benchmarks/results/modelopt_reference.json`` exists (``modelopt_reference.py``), the
table puts NVIDIA ModelOpt AutoNAS's conversion time and space size beside ours. Results
are written to ``benchmarks/results/compile_zoo.{json,md}`` after every model; ``--resume``
keeps the models already there.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch
import torchvision

import autotailor as at
from common import head_commit, machine
from autotailor.deploy import export_onnx
from autotailor.testing import rel_err, well_conditioned

RESULTS = Path(__file__).parent / "results"
TARGET_SECONDS = 5.0
ONNX_MAX_PARAMS = 150e6


def versions() -> dict:
    commit = head_commit()
    return {"autotailor": at.__version__, "commit": commit,
            **{p: version(p) for p in ("torch", "torchvision", "onnx", "onnx2torch", "onnxruntime")}}


def onnx_round_trip(model: torch.nn.Module, x: torch.Tensor, sn: at.SuperNet) -> dict:
    """Compile the model's ONNX export and compare it with the SuperNet compiled from PyTorch."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = export_onnx(model, Path(tmp) / "model.onnx", tuple(x.shape))
            onnx_sn = at.compile(path, x).eval()
        except at.AutoTailorError as exc:
            return {"onnx": f"{type(exc).__name__}: {str(exc)[:160]}"}
    same = [(v.name, v.choices) for v in onnx_sn.space.variables] == [(v.name, v.choices) for v in sn.space.variables]
    row: dict = {"onnx_same_space": same, "onnx_log10_size": onnx_sn.space.log10_size}
    if same:
        arch = sn.space.sample(random.Random(2))
        sn.set_arch(arch)
        onnx_sn.set_arch(arch)
        xi = torch.randn(sn.input_shape(arch), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            row["onnx_rel_err"] = rel_err(sn(xi), onnx_sn(xi))
    return row


def measure(name: str, repeats: int, forward: bool) -> dict:
    size = 299 if name == "inception_v3" else 224
    model = well_conditioned(torchvision.models.get_model(name, weights=None))
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(repeats):
        gc.collect()
        t = time.perf_counter()
        sn = at.compile(model, x)
        times.append(time.perf_counter() - t)
    sn.eval()
    row = {
        "input": size,
        "compile_s": statistics.median(times),
        "compile_runs_s": times,
        "modifications": sn.space.num_modifications,
        "variables": len(sn.space),
        "log10_size": sn.space.log10_size,
        "blocks": len(sn.compile_info["blocks"]),
        "droppable_blocks": sum(b["droppable"] for b in sn.compile_info["blocks"]),
        "templates": sorted({b["template"] for b in sn.compile_info["blocks"]}),
        "kinds": sorted({v.kind for v in sn.space.variables}),
    }
    if forward:
        with torch.no_grad():
            row["max_arch_rel_err"] = rel_err(model(x), sn(x))
            arch = sn.space.sample(random.Random(0))
            sn.set_arch(arch)
            xi = torch.randn(sn.input_shape(arch), generator=torch.Generator().manual_seed(1))
            row["subnet_rel_err"] = rel_err(sn(xi), sn.extract(arch).eval()(xi))
        if sum(p.numel() for p in model.parameters()) <= ONNX_MAX_PARAMS:
            row.update(onnx_round_trip(model, x, sn))
        else:
            row["onnx"] = f"not checked: more than {ONNX_MAX_PARAMS / 1e6:.0f} M parameters"
    return row


def write(results: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compile_zoo.json").write_text(json.dumps(results, indent=1))
    ref = {}
    ref_path = RESULTS / "modelopt_reference.json"
    if ref_path.exists():
        ref = json.loads(ref_path.read_text()).get("models", {})
    lines = [
        "# Compile every torchvision classification model",
        "",
        f"Command: `{results['command']}`",
        "",
        f"Machine: {results['machine']['cores']} threads, {results['machine']['cpu']}; "
        f"versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "",
        "Default space (no config): resolution, depth, width and kernel variables where the model allows.",
        "*ModelOpt*: NVIDIA ModelOpt AutoNAS default search space (widths and depth only; its size is an "
        "upper bound that counts dropped blocks' choices), from `modelopt_reference.json`.",
        "",
        "*ONNX*: the model exported to ONNX and compiled again: `same` when the space is identical, "
        "with the relative output difference of the two SuperNets at a random arch.",
        "",
        "| model | compile s (median) | modifications | log10 size | ModelOpt s | ModelOpt log10 size | "
        "max-arch rel. error | SubNet rel. error | ONNX | kinds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, row in results["models"].items():
        if "error" in row:
            lines.append(f"| {name} | FAILED: {row['error'][:80]} | | | | | | | | |")
            continue
        mo = ref.get(name, {})
        mo_t = f"{mo['convert_s']:.2f}" if mo.get("convert_s") is not None else "-"
        mo_s = f"{mo['log10_space']:.1f}" if mo.get("log10_space") is not None else (
            "failed" if mo.get("status") not in (None, "ok") else "-")
        lines.append(
            f"| {name} | {row['compile_s']:.2f} | {row['modifications']} | {row['log10_size']:.1f} | {mo_t} | "
            f"{mo_s} | {row.get('max_arch_rel_err', float('nan')):.1e} | {row.get('subnet_rel_err', float('nan')):.1e} | "
            f"{_onnx_cell(row)} | {', '.join(row['kinds'])} |"
        )
    s = results.get("summary", {})
    if s:
        lines += ["", "## Summary", ""] + [f"- {k}: {v}" for k, v in s.items()]
    (RESULTS / "compile_zoo.md").write_text("\n".join(lines) + "\n")


def _onnx_cell(row: dict) -> str:
    if "onnx" in row:
        return row["onnx"][:60]
    if "onnx_same_space" not in row:
        return "-"
    if row["onnx_same_space"]:
        return f"same ({row['onnx_rel_err']:.0e})"
    return f"differs (10^{row['onnx_log10_size']:.1f})"


def _onnx_checked(row: dict) -> bool:
    return "onnx_same_space" in row or ("onnx" in row and not row["onnx"].startswith("not checked"))


def summarise(results: dict) -> dict:
    rows = {k: v for k, v in results["models"].items() if "error" not in v}
    ref_path = RESULTS / "modelopt_reference.json"
    ref = json.loads(ref_path.read_text()).get("models", {}) if ref_path.exists() else {}
    compared = [(k, v["log10_size"], ref[k]["log10_space"]) for k, v in rows.items()
                if ref.get(k, {}).get("log10_space") is not None]
    errs = [v["max_arch_rel_err"] for v in rows.values() if "max_arch_rel_err" in v]
    return {
        "models": len(results["models"]),
        "compiled": len(rows),
        "median compile s": round(statistics.median(v["compile_s"] for v in rows.values()), 2) if rows else None,
        f"compiled within {TARGET_SECONDS:.0f} s": sum(v["compile_s"] <= TARGET_SECONDS for v in rows.values()),
        "slowest": "{1} ({0:.2f} s)".format(*max((v["compile_s"], k) for k, v in rows.items())) if rows else None,
        "worst max-arch rel. error": max(errs) if errs else None,
        "max-arch rel. error <= 1e-4": sum(e <= 1e-4 for e in errs),
        "space >= ModelOpt's": f"{sum(a >= b for _, a, b in compared)} of {len(compared)}",
        "space < ModelOpt's": [k for k, a, b in compared if a < b],
        "ONNX round trip, same space": f"{sum(v.get('onnx_same_space') is True for v in rows.values())} of "
                                       f"{sum(_onnx_checked(v) for v in rows.values())} checked",
        "ONNX round trip, worst output difference": max(
            (v["onnx_rel_err"] for v in rows.values() if "onnx_rel_err" in v), default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset (default: every classification model)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-forward", action="store_true", help="skip the equivalence checks")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="rewrite the summary and table from the JSON")
    args = parser.parse_args()
    if args.report_only:
        results = json.loads((RESULTS / "compile_zoo.json").read_text())
        results["summary"] = summarise(results)
        write(results)
        print(json.dumps(results["summary"], indent=1))
        return
    names = args.models.split(",") if args.models else torchvision.models.list_models(module=torchvision.models)
    out = RESULTS / "compile_zoo.json"
    results = {"command": "python " + " ".join(sys.argv), "machine": machine(), "versions": versions(), "models": {}}
    if args.resume and out.exists():
        results["models"] = json.loads(out.read_text())["models"]
    for name in names:
        if name in results["models"]:
            continue
        try:
            row = measure(name, args.repeats, not args.no_forward)
        except Exception as exc:  # a benchmark records failures and goes on
            row = {"error": f"{type(exc).__name__}: {exc}"}
        results["models"][name] = row
        gc.collect()
        print(name, json.dumps({k: v for k, v in row.items() if k not in ("compile_runs_s", "templates")}), flush=True)
        write(results)
    results["summary"] = summarise(results)
    write(results)
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
