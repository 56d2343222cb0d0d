"""Vision transformers compiled: modifications, space size, variable kinds, equivalence, ONNX.

Reproduce (from the repository root, after `make install`; about 10 min on 2 cores)::

    .venv/bin/python benchmarks/transformers.py
    .venv/bin/python benchmarks/transformers.py --models timm:deit_tiny_patch16_224

For each model (random weights made well-conditioned by ``autotailor.testing``), at 224x224,
batch 1, with the default space (no config):

* compile time (one compile, from the user's module);
* modifications, log10 of the exact number of distinct SubNets, and the variables per kind
  (``heads``, ``qk``: q/k features per head, ``v``: value features per head, ``embedding``,
  ``width``: the MLP's hidden width and other widths, ``depth``, ``resolution``);
* the largest SubNet against the model: max |SuperNet(max) - model| / max |model|;
* one random SubNet: the extracted module against the SuperNet (max abs difference), then
  exported with ``autotailor.deploy.export_onnx`` and run in ONNX Runtime, and with
  ``export_ncnn`` (pnnx) and run in NCNN at fp32 (relative differences, or the error that says
  why the model does not convert);
* what the compiler said about resolutions it dropped (why the model does not run at them).

Rows named ``MODEL@onnx`` compile the model's ONNX export (``torch.onnx.export``, opset 17)
instead of its module, as a user who brings an ``.onnx`` file does (compile time includes the
import). Rows named ``MODEL+SPACE`` compile a model again in a denser space of ``SPACES``: ``dense``, four
choices instead of three for the heads, q/k and value widths of every attention; ``fine``, eighths
of the model's size for every variable of LeViT's attention and MLP blocks and for the embedding
(the paper's Table 3 counts its LeViT space at 324 modifications and 10^45 SubNets).

The Markdown ends with the latency predictor's figures for DeiT-tiny and LeViT-128S, read from
``results/latency_predictor.json``; they are measured by::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/latency_predictor.py \
        --models timm:deit_tiny_patch16_224,timm:levit_128s --backends ort-cpu,ncnn --variants fused

Rows are kept in ``--work``/state.json. On a new machine it starts from the committed rows, so a
run that measures none only redraws the latency section (under the header of the run that
measured the rows).

Results: ``benchmarks/results/transformers.{json,md}``, written after every model.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import autotailor as at  # noqa: E402
from autotailor.deploy import export_onnx  # noqa: E402
from autotailor.frontends import load_model  # noqa: E402
from autotailor.testing import rel_err, well_conditioned  # noqa: E402
from common import State, head_commit, machine, resumed_state, write_results  # noqa: E402

MODELS = ("torchvision:vit_b_16", "torchvision:vit_b_32", "torchvision:swin_t", "torchvision:swin_v2_t",
          "torchvision:maxvit_t", "timm:vit_tiny_patch16_224", "timm:deit_tiny_patch16_224",
          "timm:swin_tiny_patch4_window7_224", "timm:levit_128s", "timm:levit_384", "timm:efficientvit_b0",
          "timm:mobilevitv2_050")
KINDS = ("heads", "qk", "v", "embedding", "width", "depth", "resolution")


def _space(ratios: str, templates: tuple[str, ...], keys: tuple[str, ...], embed: bool = False) -> str:
    # a stream that stays within one stage has a variable of that stage (var.stage_vars)
    lines = (["[var.global_vars]", f"embed_ratio = {ratios}", "[var.stage_vars]", f"embed_ratio = {ratios}"]
             if embed else []) + ["[var.block_vars]"]
    return "\n".join(lines + [f"{t}.{k} = {ratios}" for t in templates for k in keys]) + "\n"


# LeViT's MLPs are residual Linear + BatchNorm blocks (ResidualBlock); its subsampling attention
# between stages is a BranchBlock.
SPACES = {"dense": _space("[0.25, 0.5, 0.75, 1.0]", ("AttentionBlock",), ("heads_ratio", "qk_ratio", "v_ratio")),
          "fine": _space("[0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]", ("AttentionBlock", "BranchBlock"),
                         ("heads_ratio", "qk_ratio", "v_ratio"), embed=True)
          + "ResidualBlock.expand_ratio = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0]\n"}
ONNX = "@onnx"  # a row compiled from the model's ONNX export (opset 17) instead of its module
ROWS = MODELS + ("torchvision:vit_b_16+dense", "timm:levit_384+dense", "timm:levit_384+fine") + tuple(
    m + ONNX for m in ("torchvision:vit_b_16", "torchvision:swin_t", "torchvision:swin_v2_t", "torchvision:maxvit_t",
                       "timm:deit_tiny_patch16_224", "timm:swin_tiny_patch4_window7_224", "timm:levit_128s",
                       "timm:efficientvit_b0"))


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def measure(row_name: str) -> dict:
    name, onnx_import, _ = row_name.partition(ONNX)
    spec, _, space = name.partition("+")
    torch.manual_seed(0)
    model = well_conditioned(load_model(spec)).eval()
    x = torch.randn(1, 3, 224, 224)
    said = _Said()
    with tempfile.TemporaryDirectory() as tmp:
        source = model
        if onnx_import:  # the model as a user brings an ONNX file of it
            source = Path(tmp) / "model.onnx"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, (x,), str(source), dynamo=False, opset_version=17)
        logging.getLogger("autotailor").addHandler(said)
        try:
            started = time.perf_counter()
            sn = at.compile(source, x, config=SPACES[space] if space else None)
            seconds = time.perf_counter() - started
        finally:
            logging.getLogger("autotailor").removeHandler(said)
    sn.eval()
    space = sn.space
    kinds = Counter(v.kind for v in space.variables)
    row = {"model": row_name, "seconds": seconds, "modifications": space.num_modifications,
           "log10_size": space.log10_size, "kinds": {k: kinds.get(k, 0) for k in KINDS},
           "said": [s for s in said.lines if "dropped" in s]}
    with torch.no_grad():
        row["max_arch_rel_err"] = rel_err(sn(x), model(x))
        arch = space.sample(0)
        sn.set_arch(arch)
        shape = sn.input_shape(arch)
        xs = torch.randn(shape)
        ref = sn(xs)
        net = sn.extract(arch).eval()
        row["extract_max_abs_diff"] = float((net(xs) - ref).abs().max())
    try:
        import onnxruntime as ort

        with tempfile.TemporaryDirectory() as tmp:
            path = export_onnx(net, Path(tmp) / "subnet.onnx", tuple(shape))
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            (y,) = session.run(None, {"input": xs.numpy()})
        row["onnx_rel_err"] = rel_err(torch.from_numpy(np.asarray(y)), ref)
    except Exception as exc:  # a model the exporter cannot take is a result, not a crash
        row["onnx_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    try:
        from autotailor.deploy import export_ncnn, ncnn_net, run_ncnn

        with tempfile.TemporaryDirectory() as tmp:
            param, _ = export_ncnn(net, Path(tmp) / "subnet", tuple(shape))
            y = run_ncnn(ncnn_net(param, 1, "fp32", False), xs.numpy())
        row["ncnn_rel_err"] = rel_err(torch.from_numpy(np.asarray(y)), ref)
    except Exception as exc:  # pnnx's limits are a result: the error names them
        row["ncnn_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return row


HEADER = "_measured_by"  # state key: machine, commit and command of the run that last measured a row


def report(state: State) -> None:
    """The rows under the header (machine, commit, command) of the run that last measured one."""
    header = state.get(HEADER)
    m, commit, command = header["machine"], header["commit"], header["command"]
    lines = ["# Vision transformers compiled (default space, 224 px)", "",
             f"Machine: {m['cpu']}, {m['cores']} cores; torch {m['torch']}, torchvision {m['torchvision']}, "
             f"timm {m['timm']}, onnxruntime {m['onnxruntime']}; commit {commit}. Command: `{command}`.", "",
             "| model | modifications | log10 SubNets | heads | q/k | v | embedding | width | depth | resolution | "
             "compile (s) | max arch rel. err | extracted vs SuperNet | ONNX Runtime rel. err | NCNN fp32 rel. err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for spec in ROWS:
        r = state.get(spec)
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {spec} | fails: {r['error']} |" + " |" * 13)
            continue
        k = {x: r["kinds"].get(x, 0) for x in KINDS}
        onnx = f"{r['onnx_rel_err']:.1e}" if "onnx_rel_err" in r else f"fails: {r['onnx_error']}"
        ncnn = f"{r['ncnn_rel_err']:.1e}" if "ncnn_rel_err" in r else f"fails: {r.get('ncnn_error', 'not run')}"
        lines.append(f"| {spec} | {r['modifications']} | {r['log10_size']:.1f} | "
                     + " | ".join(str(k[x]) for x in KINDS)
                     + f" | {r['seconds']:.2f} | {r['max_arch_rel_err']:.1e} | {r['extract_max_abs_diff']:.1e} | "
                       f"{onnx} | {ncnn} |")
    elsewhere = [f"{spec} ({state.get(spec, 'measured')})" for spec in ROWS if state.get(spec) is not None
                 and state.get(spec, "measured") not in (None, _provenance(header))]
    if elsewhere:
        lines += ["", "Rows measured by earlier runs (compile times are of their machine): " + "; ".join(elsewhere) + "."]
    lines += [""] + [f"`{ONNX}`: compiled from the model's ONNX export (opset 17)."] + [f"`+{name}`: compiled with `{'; '.join(config.strip().splitlines())}`." for name, config in
                     SPACES.items()]
    lines += _latency_lines()
    said = [(spec, s) for spec in MODELS for s in (state.get(spec, "said") or [])]
    if said:
        lines += ["", "What the compiler said about resolutions:", ""]
        lines += [f"- {spec}: {s[:300]}" for spec, s in said]
    write_results(HERE / "results", "transformers", {"machine": m, "commit": commit, "command": command,
                                                      "rows": {k: v for k, v in state.data.items() if k != HEADER}},
                  "\n".join(lines) + "\n")


LATENCY_MODELS = ("timm:deit_tiny_patch16_224", "timm:levit_128s")


def _latency_lines() -> list[str]:
    """The latency predictor's figures for the transformers, from ``latency_predictor.json``
    (``benchmarks/latency_predictor.py --models timm:deit_tiny_patch16_224,timm:levit_128s``)."""
    path = HERE / "results" / "latency_predictor.json"
    results = json.loads(path.read_text())["results"] if path.exists() else {}
    rows = [(m, b, r) for m in LATENCY_MODELS for b, r in results.get(m, {}).items() if "accuracy" in r]
    failed = [(m, b, r["error"]) for m in LATENCY_MODELS for b, r in results.get(m, {}).items()
              if "accuracy" not in r and "error" in r]
    if not rows and not failed:
        return []
    lines = ["", "## Latency predictor (from `latency_predictor.json`: paired design, 1 thread, 224 px)", "",
             "| model | backend | measured | unique kernels | SubNets | within 10% | within 5% | bias | Kendall tau | "
             "LUT sum alone: within 10%, bias | noise floor: two measurements within 5%, median difference |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, backend, r in rows:
        a, raw, noise = r["accuracy"]["fused"], r["accuracy_raw"].get("fused-sum", {}), r["noise"]["measurements"]
        at_ = r["measured_at"]
        lines.append(f"| {model} | {backend} | {at_['time']}, {at_['commit']}, {at_['machine']['cpu']} | "
                     f"{r['enumeration']['fused']['kernels']} | "
                     f"{a['n']} | {a['within_10']:.1%} | {a['within_5']:.1%} | {a['mean_error']:+.1%} | "
                     f"{a['kendall_tau']:.3f} | {raw.get('within_10', float('nan')):.1%}, "
                     f"{raw.get('mean_error', float('nan')):+.1%} | {noise['within_5']:.1%}, "
                     f"{noise['median_abs_difference']:.1%} |")
    lines += [""] + [f"{m} on {b} does not run: {e.rpartition(' failed: ')[2]}" for m, b, e in failed] if failed else []
    return lines


def _provenance(header: dict) -> str:
    return f"{header['machine']['cpu']}, commit {header['commit']}"


def _stamp(state: State) -> None:
    """Give every row without one the provenance of the run that last measured (the header's)."""
    header = state.get(HEADER)
    for spec, row in list(state.data.items()):
        if header is not None and spec != HEADER and "measured" not in row:
            state.put({**row, "measured": _provenance(header)}, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(ROWS), help=f"models, or MODEL+SPACE for a denser space ({', '.join(SPACES)})")
    p.add_argument("--work", default=str(HERE / "work" / "transformers"))
    p.add_argument("--again", action="store_true", help="measure models already in the state again")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # on a new machine: the committed rows, under the header of the run that measured them
    state = resumed_state(args.work, "transformers", lambda last: {
        **last["rows"], HEADER: {k: last[k] for k in ("machine", "commit", "command")}})
    command = "python benchmarks/transformers.py" + (f" --models {args.models}" if args.models != ",".join(ROWS)
                                                     else "")
    for spec in args.models.split(","):
        if state.get(spec) is not None and not args.again:
            continue
        try:
            row = measure(spec)
        except Exception as exc:
            row = {"model": spec, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        header = {"machine": machine("torch", "torchvision", "timm", "onnxruntime"), "commit": head_commit(),
                  "command": command}
        _stamp(state)  # rows of earlier runs keep the machine and commit they were measured with
        state.put({**row, "measured": _provenance(header)}, spec)
        state.put(header, HEADER)
        print(spec, row.get("modifications", row.get("error")), flush=True)
        report(state)
    if state.get(HEADER) is not None:
        report(state)


if __name__ == "__main__":
    main()
