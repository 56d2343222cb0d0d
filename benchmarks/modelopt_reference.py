"""Reference figures from NVIDIA ModelOpt AutoNAS on every torchvision classification model.

Reproduce (from the repository root, /work/main)::

    python3 -m venv /work/modelopt-venv
    /work/modelopt-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 nvidia-modelopt \
        requests huggingface_hub
    /work/modelopt-venv/bin/python benchmarks/modelopt_reference.py

(``requests`` and ``huggingface_hub`` are imported unconditionally by
``modelopt.torch`` 0.47.0 but are not declared as dependencies of the wheel.)
Do not install ModelOpt into the project's own ``.venv``: it pulls its own torch.

Optional arguments: ``--models a,b,c`` to run a subset, ``--resume`` to keep the
models already present in the JSON output and run only the missing ones.

For each model of ``torchvision.models.list_models(module=torchvision.models)``:

* build it with random weights (``torchvision.models.get_model(name, weights=None)``);
* convert it with ``modelopt.torch.nas.convert(model, mode=[("autonas", cfg)])`` where
  ``cfg = modelopt.torch.nas.autonas.AutoNASConfig().model_dump()`` (the default AutoNAS
  search-space rules: channel / feature ratios (0.5, 0.67, 1.0) with divisor 32 for
  Conv*/Linear/*Norm layers, ``kernel_size=()`` i.e. kernel size not searched,
  ``nn.Sequential`` depth with ``min_depth=0``). ModelOpt's torch NAS has no resolution
  hyperparameter; kernel size exists as an hparam type but the default config gives it a
  single choice. Any configurable ``kernel_size`` hparam would be excluded from the counts;
  ``excluded_configurable`` in the JSON records how many there were (always 0 here);
* count hyperparameters with ``modelopt.torch.opt.utils.named_hparams(model, configurable=True)``
  (unique hparams that have more than one choice, i.e. the keys of
  ``mtn.get_subnet_config(model, configurable=True)``);
* compute the search-space size as the product over those hparams of ``len(hp.choices)``.
  This is exactly what ``modelopt.torch.opt.utils.search_space_size(model)`` returns; both
  are computed and checked equal. It is an upper bound on the number of *distinct*
  subnets: when a depth hparam drops a block, that block's channel choices no longer
  matter, and ModelOpt does not deduplicate these;
* check that the max and the min subnet run a forward pass at 224x224 (299 for
  inception_v3), batch 1, eval mode (timed separately from the conversion).

Each model runs in its own subprocess (a crash or hang loses only that model); results are
saved after every model. Conversion taking more than 120 s is recorded as timed out
(SIGALRM in the worker; a hard subprocess timeout backs it up).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
OUT_JSON = RESULTS_DIR / "modelopt_reference.json"
OUT_MD = RESULTS_DIR / "modelopt_reference.md"
COMMAND = "/work/modelopt-venv/bin/python benchmarks/modelopt_reference.py"

CONVERT_TIMEOUT_S = 120
FORWARD_TIMEOUT_S = 180
HARD_TIMEOUT_S = 1200  # whole worker: import + build + convert + forward checks
EXCLUDED_HPARAM_KINDS = ("kernel_size", "resolution", "image_size")
RESULT_TAG = "@@RESULT@@ "


class _Alarm(Exception):
    pass


def _on_alarm(signum, frame):  # noqa: ARG001
    raise _Alarm()


def _input_size(name: str) -> int:
    return 299 if name == "inception_v3" else 224


# --------------------------------------------------------------------------- worker


def run_worker(name: str) -> dict:
    import torch
    import torchvision

    import modelopt.torch.nas as mtn
    from modelopt.torch.nas.autonas import AutoNASConfig
    from modelopt.torch.opt.utils import named_hparams, search_space_size

    signal.signal(signal.SIGALRM, _on_alarm)
    res: dict = {"status": "error", "input_size": _input_size(name)}

    t0 = time.perf_counter()
    try:
        model = torchvision.models.get_model(name, weights=None)
    except Exception as e:  # noqa: BLE001
        res["construct_s"] = time.perf_counter() - t0
        res["error"] = f"construct: {type(e).__name__}: {e}"
        return res
    res["construct_s"] = time.perf_counter() - t0
    res["params_M"] = sum(p.numel() for p in model.parameters()) / 1e6

    cfg = AutoNASConfig().model_dump()
    signal.alarm(CONVERT_TIMEOUT_S)
    t0 = time.perf_counter()
    try:
        model = mtn.convert(model, mode=[("autonas", cfg)])
        signal.alarm(0)
        res["convert_s"] = time.perf_counter() - t0
    except _Alarm:
        res["convert_s"] = time.perf_counter() - t0
        res["status"] = "timeout"
        res["error"] = f"convert exceeded {CONVERT_TIMEOUT_S} s"
        return res
    except Exception as e:  # noqa: BLE001
        signal.alarm(0)
        res["convert_s"] = time.perf_counter() - t0
        res["error"] = f"convert: {type(e).__name__}: {str(e)[:500]}"
        return res

    # --- hyperparameters
    uniq = list(named_hparams(model, unique=True))
    conf = list(named_hparams(model, configurable=True))

    def kind(n: str) -> str:
        return n.rsplit(".", 1)[-1]

    kept = [(n, hp) for n, hp in conf if kind(n) not in EXCLUDED_HPARAM_KINDS]
    size_own = math.prod(len(hp.choices) for _, hp in kept)
    size_mo = search_space_size(model)
    depth_prod = math.prod(len(hp.choices) for n, hp in kept if kind(n) == "depth")
    res.update(
        status="ok",
        n_hparams=len(kept),
        n_choices_total=sum(len(hp.choices) for _, hp in kept),
        hparam_kinds_configurable=dict(Counter(kind(n) for n, _ in kept)),
        hparam_kinds_all_unique=dict(Counter(kind(n) for n, _ in uniq)),
        excluded_configurable=len(conf) - len(kept),
        space_size_modelopt=str(size_mo),
        space_size_product=str(size_own),
        space_size_match=size_mo == size_own,
        log10_space=math.log10(size_own),
        log10_space_depth_only=math.log10(depth_prod),
        log10_space_width_only=math.log10(size_own // depth_prod),
        hparams=[[n, list(hp.choices)] for n, hp in kept],
    )

    # --- forward sanity check on max and min subnets (not part of convert time)
    s = _input_size(name)
    x = torch.randn(1, 3, s, s)
    model.eval()
    fwd = {}
    for label, fn in (("max", max), ("min", min)):
        signal.alarm(FORWARD_TIMEOUT_S)
        t0 = time.perf_counter()
        try:
            mtn.sample(model, fn)
            with torch.no_grad():
                y = model(x)
            signal.alarm(0)
            fwd[label] = {"ok": True, "s": time.perf_counter() - t0, "out_shape": list(y.shape)}
        except _Alarm:
            fwd[label] = {"ok": False, "s": time.perf_counter() - t0,
                          "error": f"forward exceeded {FORWARD_TIMEOUT_S} s"}
        except Exception as e:  # noqa: BLE001
            signal.alarm(0)
            fwd[label] = {"ok": False, "s": time.perf_counter() - t0,
                          "error": f"{type(e).__name__}: {str(e)[:300]}"}
    res["forward"] = fwd
    return res


# --------------------------------------------------------------------------- driver


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except Exception:  # noqa: BLE001
        nproc = len(os.sched_getaffinity(0))
    return {
        "nproc": nproc,
        "cpu_model": cpu,
        "mem_total_gib": mem_gib,
        "gpu": "none",
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict:
    import torch
    import torchvision

    import modelopt

    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "modelopt": modelopt.__version__,
        "torch_num_threads": torch.get_num_threads(),
    }


def _fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def _note(r: dict) -> str:
    st = r.get("status")
    if st == "ok":
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["hparam_kinds_configurable"].items()))
        fwd = r.get("forward", {})
        bad = [k for k, v in fwd.items() if not v.get("ok")]
        f = "fwd max/min ok" if not bad else "fwd FAILED " + "; ".join(
            f"{k}: {fwd[k].get('error', '')[:80]}" for k in bad)
        return f"build {r['construct_s']:.1f} s; {kinds or 'no hparams'}; {f}"
    if st == "timeout":
        return f"TIMED OUT: {r.get('error', '')}"
    return "FAILED: " + r.get("error", "").replace("|", "/").replace("\n", " ")[:160]


def write_outputs(data: dict) -> None:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps(data, indent=1) + "\n")
    m, v = data["machine"], data["versions"]
    lines = [
        "# ModelOpt AutoNAS reference: torchvision classification models",
        "",
        f"Command: `{data['command']}` (run from the repository root; see the script's docstring"
        " for the venv setup).",
        "",
        f"Machine: {m['nproc']} CPU cores (nproc), {m['cpu_model']}, "
        f"{m['mem_total_gib']} GiB RAM, no GPU; {m['platform']}, Python {m['python']}.",
        f"Versions: torch {v['torch']}, torchvision {v['torchvision']}, "
        f"nvidia-modelopt {v['modelopt']} (torch threads: {v['torch_num_threads']}).",
        "",
        "API: `modelopt.torch.nas.convert(model, mode=[(\"autonas\", AutoNASConfig().model_dump())])`"
        " (default AutoNAS rules). Random weights (`weights=None`).",
        "",
        "- *convert time s*: wall time of `mtn.convert` only (model construction time is in the"
        " note as *build*). Conversion > 120 s counts as timed out.",
        "- *#hparams*: unique configurable hparams (more than one choice), i.e."
        " `len(mtn.get_subnet_config(model, configurable=True))`; kinds listed in the note.",
        "- *log10 space*: log10 of the product over those hparams of the number of choices,"
        " identical to `modelopt.torch.opt.utils.search_space_size(model)` (checked per model)."
        " Upper bound on distinct subnets (channel choices of blocks removed by a depth choice"
        " are not deduplicated).",
        "- Kernel size: present as an hparam type, not searched by the default config"
        " (`kernel_size=()`), and excluded anyway. Resolution: ModelOpt's torch NAS has no"
        " resolution hparam.",
        "- Forward check: max and min subnet each run one eval forward pass at 224x224"
        " (inception_v3: 299x299), batch 1.",
        "",
        "| model | convert time s | #hparams | log10 space | note |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, r in data["models"].items():
        lines.append(
            f"| {name} | {_fmt(r.get('convert_s'))} | {r.get('n_hparams', '-')} | "
            f"{_fmt(r.get('log10_space'))} | {_note(r)} |"
        )
    ok = [r for r in data["models"].values() if r.get("status") == "ok"]
    lines += [
        "",
        f"{len(ok)} of {len(data['models'])} models converted"
        + (f"; total convert time {sum(r['convert_s'] for r in ok):.1f} s." if ok else "."),
        "",
    ]
    OUT_MD.write_text("\n".join(lines))


def run_one(name: str) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", name],
            capture_output=True, text=True, timeout=HARD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"worker exceeded hard limit {HARD_TIMEOUT_S} s",
                "wall_s": time.perf_counter() - t0, "input_size": _input_size(name)}
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            r = json.loads(line[len(RESULT_TAG):])
            r["wall_s"] = time.perf_counter() - t0
            return r
    tail = (p.stderr or "").strip().splitlines()[-5:]
    return {"status": "error", "error": f"worker exit code {p.returncode}: " + " / ".join(tail),
            "wall_s": time.perf_counter() - t0, "input_size": _input_size(name)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--models", help="comma-separated subset of model names")
    ap.add_argument("--resume", action="store_true", help="skip models already in the JSON")
    args = ap.parse_args()

    if args.worker:
        r = run_worker(args.worker)
        print(RESULT_TAG + json.dumps(r), flush=True)
        return

    import torchvision

    names = torchvision.models.list_models(module=torchvision.models)
    if args.models:
        wanted = args.models.split(",")
        unknown = set(wanted) - set(names)
        if unknown:
            sys.exit(f"unknown models: {sorted(unknown)}")
        names = [n for n in names if n in wanted]

    data = {"machine": machine_info(), "versions": versions(), "command": COMMAND, "models": {}}
    if args.resume and OUT_JSON.exists():
        data["models"] = json.loads(OUT_JSON.read_text()).get("models", {})

    print(f"{len(names)} models; machine {data['machine']}; versions {data['versions']}", flush=True)
    for i, name in enumerate(names, 1):
        if name in data["models"]:
            print(f"[{i}/{len(names)}] {name}: kept from previous run", flush=True)
            continue
        print(f"[{i}/{len(names)}] {name} ...", end=" ", flush=True)
        r = run_one(name)
        data["models"][name] = r
        # keep the table in list_models order
        order = {n: k for k, n in enumerate(names)}
        data["models"] = dict(sorted(data["models"].items(),
                                     key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
        write_outputs(data)
        print(f"{r['status']} convert={_fmt(r.get('convert_s'))}s "
              f"hparams={r.get('n_hparams', '-')} log10={_fmt(r.get('log10_space'))} "
              f"{'' if r['status'] == 'ok' else r.get('error', '')[:200]}", flush=True)
    print(f"wrote {OUT_JSON} and {OUT_MD}", flush=True)


if __name__ == "__main__":
    main()
