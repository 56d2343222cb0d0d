"""Train the benchmarks' base models on CIFAR-10 and keep their weights as artifacts.

Reproduce (from the repository root, after `make install`; hours on 2 cores, resumable)::

    .venv/bin/python benchmarks/train_base.py --model resnet18 --epochs 10 --threads 1
    .venv/bin/python benchmarks/train_base.py --model mobilenet_v2 --epochs 10 --threads 1
    .venv/bin/python benchmarks/train_base.py --model vit_c32 --epochs 30 --threads 1
    .venv/bin/python benchmarks/train_base.py --model mobilenet_v2 --epochs 60 --name mobilenet_v2_e60 --threads 1
    .venv/bin/python benchmarks/train_base.py --model resnet18 --epochs 60 --name resnet18_e60 --threads 1

A base model is what a user brings to AutoTailor: a plain trained classifier
(``benchmarks/cifar_models.py``), trained here with plain PyTorch, not through AutoTailor, so
its weights are independent of how AutoTailor represents a SuperNet. The convolutional
networks' recipe is the one ``tune_cifar10.py`` used for ``autotailor train``: SGD with
Nesterov momentum 0.9, lr 0.05, weight decay 5e-4, label smoothing 0.1, 200 warm-up steps then
a cosine schedule, batch 64, random crops and flips. The vision transformer (``vit_c32``)
trains from scratch, which SGD does poorly: AdamW, lr 5e-4, weight decay 0.05 (not on biases,
norms, the class token and position embedding), 500 warm-up steps, otherwise the same
(``RECIPES``).

Resumable at two levels. Every ``--checkpoint-every`` steps the full state (fp32 weights,
momentum, step) is written to ``--work``. ``--snapshot`` copies the latest one into
``benchmarks/artifacts/NAME_cifar10.ckpt*.pt`` (fp16, split under 25 MB a file) so that a
later session, whose work directory is gone, resumes from it (fp16 rounding of the weights and
momentum is the only difference from an uninterrupted run). When training ends, the weights
go to ``benchmarks/artifacts/NAME_cifar10.fp16.pt`` with their test accuracy, the partial
checkpoint artifacts are deleted, and a line is added to ``benchmarks/artifacts/README.md``.
``cifar_models.trained(NAME)`` loads the result. ``--name`` keeps a longer run's weights apart
from the ones the benchmarks were made on (``NAME_cifar10.json`` records the model).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from autotailor.tune import CpuTime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cifar_models  # noqa: E402
from common import atomic_torch_save, default_cifar10, fp16_state, fp32_state, split_fp16  # noqa: E402

ARTIFACTS = HERE / "artifacts"
BATCH = 64
LR, MOMENTUM, WEIGHT_DECAY, WARMUP, SMOOTHING = 0.05, 0.9, 5e-4, 200, 0.1


@dataclass(frozen=True)
class Recipe:
    optimizer: str  # "sgd" (Nesterov) or "adamw"
    lr: float
    weight_decay: float
    warmup: int


RECIPES = {"sgd": Recipe("sgd", LR, WEIGHT_DECAY, WARMUP), "adamw": Recipe("adamw", 5e-4, 0.05, 500)}
MODEL_RECIPES = {"vit_c32": "adamw"}  # the rest: "sgd"

log = logging.getLogger("train_base")


def lr_factor(step: int, steps: int, warmup: int = WARMUP) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup))))


def snapshot(name: str, ckpt: dict) -> list[Path]:
    """The checkpoint as fp16 artifact parts: model and optimizer tensors under prefixed keys.
    Adam's second moments are kept as their square roots: fp16 flushes values below 6e-8 to
    zero, and a zero second moment would make the resumed run's first steps huge."""
    flat = {f"model.{k}": v for k, v in ckpt["model"].items()}
    flat.update({f"momentum.{k}": v for k, v in ckpt["momentum"].items()})
    flat.update({f"adam.{k}": v.sqrt() if k.startswith("exp_avg_sq.") else v for k, v in ckpt.get("adam", {}).items()})
    paths = []
    for i, part in enumerate(split_fp16(flat)):
        path = ARTIFACTS / f"{name}_cifar10.ckpt{i}.pt"
        atomic_torch_save({"step": ckpt["step"], "steps": ckpt["steps"], "tensors": part,
                           **CpuTime.of(ckpt).as_state()}, path)
        paths.append(path)
    for stale in ARTIFACTS.glob(f"{name}_cifar10.ckpt*.pt"):
        if stale not in paths:
            stale.unlink()
    return paths


def from_snapshot(name: str) -> dict | None:
    parts = sorted(ARTIFACTS.glob(f"{name}_cifar10.ckpt*.pt"))
    if not parts:
        return None
    loaded = [torch.load(p, map_location="cpu") for p in parts]
    if len({(d["step"], d["steps"]) for d in loaded}) != 1:
        raise SystemExit(f"the checkpoint parts {[p.name for p in parts]} come from different steps; delete them")
    tensors = {k: v for d in loaded for k, v in d["tensors"].items()}
    unpack = lambda prefix: fp32_state({k[len(prefix):]: v for k, v in tensors.items()  # noqa: E731
                                        if k.startswith(prefix)})
    adam = {k: v.square() if k.startswith("exp_avg_sq.") else v for k, v in unpack("adam.").items()}
    return {"step": loaded[0]["step"], "steps": loaded[0]["steps"], "model": unpack("model."),
            "momentum": unpack("momentum."), **({"adam": adam} if adam else {}),
            **CpuTime.of(loaded[0]).as_state()}


def evaluate(model: torch.nn.Module, val) -> float:
    from autotailor.data import BatchLoader

    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in BatchLoader(val, 500, train=False):
            correct += int((model(x).argmax(1) == y).sum())
    return correct / len(val)


def _optimizer(model: torch.nn.Module, recipe: Recipe, lr: float) -> torch.optim.Optimizer:
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM, weight_decay=recipe.weight_decay,
                               nesterov=True)
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or n in ("cls_token", "pos_embed")]
    decay = [p for p in model.parameters() if all(p is not q for q in no_decay)]
    return torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr,
                             weight_decay=recipe.weight_decay)


def train(model: torch.nn.Module, loader, steps: int, ckpt_path: Path, checkpoint_every: int, label: str,
          fallback: dict | None = None, lr: float | None = None, warmup: int | None = None,
          recipe: Recipe = RECIPES["sgd"]) -> CpuTime:
    """Train ``model`` in place for ``steps`` batches of ``loader`` with ``recipe`` (``lr`` and
    ``warmup`` the recipe's unless given), resuming from ``ckpt_path`` (else from ``fallback``,
    a checkpoint dict) and writing it every ``checkpoint_every`` steps (fp32 weights, the
    optimizer's moments, step, the CPU time so far). Returns the CPU time over all runs."""
    from autotailor.tune import training_layout

    lr = recipe.lr if lr is None else lr
    warmup = recipe.warmup if warmup is None else warmup
    opt = _optimizer(model, recipe, lr)
    params = dict(model.named_parameters())
    start = 0
    spent = CpuTime()
    state = torch.load(ckpt_path, map_location="cpu") if ckpt_path.is_file() else fallback
    if state is not None:
        if state["steps"] != steps:
            raise SystemExit(f"the checkpoint {ckpt_path} is of a {state['steps']}-step run, not {steps}; "
                             "pass the same length")
        model.load_state_dict(state["model"])
        start = state["step"]
        spent = CpuTime.of(state)
        for k, buf in state["momentum"].items():
            opt.state[params[k]]["momentum_buffer"] = buf.clone()
        for key, buf in state.get("adam", {}).items():
            slot, name = key.split(".", 1)
            opt.state[params[name]].update({slot: buf.clone(), "step": torch.tensor(float(start))})
        log.info("resumed %s at step %d of %d", label, start, steps)

    def save(step: int) -> None:
        momentum = {k: opt.state[p]["momentum_buffer"] for k, p in params.items() if "momentum_buffer" in opt.state[p]}
        adam = {f"{slot}.{k}": opt.state[p][slot] for k, p in params.items() for slot in ("exp_avg", "exp_avg_sq")
                if slot in opt.state[p]}
        atomic_torch_save({"step": step, "steps": steps, "model": model.state_dict(), "momentum": momentum,
                           **({"adam": adam} if adam else {}), **spent.as_state()}, ckpt_path)

    layout = training_layout(model)
    model.to(memory_format=layout).train()
    t0, losses = time.perf_counter(), []
    for step in range(start, steps):
        cpu = time.process_time()
        for g in opt.param_groups:
            g["lr"] = lr * lr_factor(step, steps, warmup)
        epoch, i = divmod(step, len(loader))
        x, y = loader.batch(epoch, i)
        torch.manual_seed(step)  # dropout: a function of the step, as the batches are
        loss = F.cross_entropy(model(x.contiguous(memory_format=layout)), y, label_smoothing=SMOOTHING)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        spent = spent.plus(time.process_time() - cpu)
        if (step + 1) % checkpoint_every == 0 or step + 1 == steps:
            save(step + 1)
            rate = len(losses) * BATCH / (time.perf_counter() - t0)
            log.info("%s step %d/%d loss %.3f (%.0f img/s)", label, step + 1, steps,
                     sum(losses[-50:]) / len(losses[-50:]), rate)
    model.to(memory_format=torch.contiguous_format).eval()
    return spent


def commit_of_head() -> str:
    """The last commit of this script (what made the weights; later commits elsewhere do not matter)."""
    return subprocess.run(["git", "log", "-1", "--format=%h", "--", Path(__file__).name], capture_output=True,
                          text=True, cwd=HERE).stdout.strip() or "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(cifar_models.MODELS))
    p.add_argument("--epochs", type=float, default=10)
    p.add_argument("--name", help="the artifacts' name (default: the model's); give a new one to train another "
                                  "recipe or length without replacing the weights the benchmarks use")
    p.add_argument("--data", default=default_cifar10(), help="directory with train.zip and test.zip")
    p.add_argument("--work", default=str(HERE / "work" / "train_base"))
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--snapshot", action="store_true",
                   help="only copy the latest checkpoint into benchmarks/artifacts (fp16) and stop")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    name = args.name or args.model
    ckpt_path = work / f"{name}.ckpt"
    if args.snapshot:
        if not ckpt_path.is_file():
            raise SystemExit(f"no checkpoint at {ckpt_path} to snapshot")
        for path in snapshot(name, torch.load(ckpt_path, map_location="cpu")):
            print(path)
        return

    from autotailor.data import BatchLoader, load_data

    train_set, val = load_data(f"cifar10:{args.data}", seed=0)
    loader = BatchLoader(train_set, BATCH, train=True, seed=0)
    steps = round(args.epochs * len(loader))
    torch.manual_seed(0)
    model = cifar_models.MODELS[args.model]()
    recipe = RECIPES[MODEL_RECIPES.get(args.model, "sgd")]
    spent = train(model, loader, steps, ckpt_path, args.checkpoint_every, name, from_snapshot(name), recipe=recipe)

    accuracy = evaluate(model, val)
    out = ARTIFACTS / f"{name}_cifar10.fp16.pt"
    ARTIFACTS.mkdir(exist_ok=True)
    atomic_torch_save(fp16_state(model.state_dict()), out)
    (ARTIFACTS / f"{name}_cifar10.json").write_text(json.dumps(
        {"model": args.model, "epochs": args.epochs, "steps": steps, "batch": BATCH,
         "test_accuracy": accuracy, "commit": commit_of_head(), "cpu_seconds": round(spent.seconds, 1),
         "cpu_steps": spent.steps}, indent=1) + "\n")
    for part in ARTIFACTS.glob(f"{name}_cifar10.ckpt*.pt"):
        part.unlink()
    flag = f" --name {name}" if args.name else ""
    line = (f"- `{out.name}`: `python benchmarks/train_base.py --model {args.model} --epochs {args.epochs:g}{flag}` "
            f"at commit {commit_of_head()}; {100 * accuracy:.2f} % on the 10,000 CIFAR-10 test images; "
            f"{spent.describe(steps)}.\n")
    readme = ARTIFACTS / "README.md"
    kept = [l for l in readme.read_text().splitlines(keepends=True) if f"`{out.name}`" not in l] \
        if readme.is_file() else []
    readme.write_text("".join(kept) + line)
    print(f"{name}: {100 * accuracy:.2f} % test accuracy; weights in {out}")


if __name__ == "__main__":
    main()
