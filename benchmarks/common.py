"""What the benchmarks share: the machine description and a resumable JSON state file."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import subprocess
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Callable, Iterator

import torch

from autotailor.tune import CpuTime


def head_commit() -> str:
    """The repository's current commit, short (what a result was measured at)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent).stdout.strip()


def save_figure(fig, path: Path) -> Path:
    """``fig`` laid out and written to ``path`` (PNG, 110 dpi), then closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def machine(*packages: str) -> dict:
    """CPU, cores, threads, Python and the versions of ``packages``."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "cpu": cpu,
            "python": platform.python_version(), "platform": platform.platform(),
            **{p: version(p) for p in packages}}


class State:
    """Finished work of a benchmark, kept in a JSON file so that a restarted run skips it.

    ``put`` re-reads the file and writes it under an exclusive lock, so several drivers may
    run at the same time as long as each puts its own keys; ``section`` hands out a live
    nested dict that ``save`` writes (one driver only)."""

    def __init__(self, path: Path):
        self.path = path
        self.reload()

    def reload(self) -> None:
        """What other drivers have put meanwhile."""
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def get(self, *keys):
        d = self.data
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return None
            d = d[k]
        return d

    def section(self, *keys: str) -> dict:
        d = self.data
        for k in keys:
            d = d.setdefault(k, {})
        return d

    def put(self, value, *keys) -> None:
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.path.is_file():
                self.data = json.loads(self.path.read_text())
            self.section(*keys[:-1])[keys[-1]] = value
            self.save()

    def save(self) -> None:
        from autotailor.files import write_text

        write_text(self.path, json.dumps(self.data, indent=1))


@contextmanager
def claimed(path: Path) -> Iterator[bool]:
    """For the block, an exclusive claim on the lock file ``path`` if no other process holds one:
    True when this process has it, False otherwise, so that two drivers split the work items
    instead of both doing the same one."""
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True


def resumed_state(work: str | Path, name: str, seed: Callable[[dict], dict] = lambda results: results["raw"]) -> State:
    """The state in ``work``/state.json. On a new machine (no state there) it starts from the
    committed ``results/name.json`` (``seed`` of it: by default its ``raw`` state), so that runs on
    different machines or under different loads add up."""
    path, committed = Path(work) / "state.json", Path(__file__).resolve().parent / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() and committed.is_file():
        path.write_text(json.dumps(seed(json.loads(committed.read_text()))))
    return State(path)


def write_results(folder: str | Path, name: str, data: dict, text: str) -> None:
    """``folder/name.json`` and ``folder/name.md``, then the Markdown on stdout."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=1))
    (folder / f"{name}.md").write_text(text)
    print(text)


def fp16_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with its floating tensors in half precision: how artifacts keep weights."""
    return {k: v.half() if v.is_floating_point() else v for k, v in state.items()}


def fp32_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with its floating tensors in float32: an artifact's weights, ready to load."""
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


PART_BYTES = 23 * 2**20  # an artifact file's tensors: with pickling overhead under the repository's 25 MB (25,000,000 bytes) a file


def split_fp16(state: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """``state`` in fp16 (floating tensors), split into parts of at most ``PART_BYTES``."""
    parts: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, v in fp16_state(state).items():
        nbytes = v.numel() * v.element_size()
        if size and size + nbytes > PART_BYTES:
            parts.append({})
            size = 0
        parts[-1][k] = v.clone()
        size += nbytes
    return parts


def save_parts(ckpt: object, stem: Path) -> list[Path]:
    """A training checkpoint (dicts and lists of tensors and plain values) as artifact files
    ``STEM.partN.pt`` of at most ``PART_BYTES``, its floating tensors in fp16 (the skeleton, with
    each tensor's dtype, in the first): for a later session, whose work directory is gone, to
    resume. Parts of an earlier, larger snapshot are removed."""
    tensors: dict[str, torch.Tensor] = {}

    def strip(x: object, at: str) -> object:
        if torch.is_tensor(x):
            tensors[at] = x
            return {"__tensor__": at, "dtype": str(x.dtype).removeprefix("torch.")}
        if isinstance(x, dict):
            return {k: strip(v, f"{at}/{k}") for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(strip(v, f"{at}/{i}") for i, v in enumerate(x))
        return x

    skeleton = strip(ckpt, "")
    paths = []
    for i, part in enumerate(split_fp16(tensors)):
        path = stem.with_name(f"{stem.name}.part{i}.pt")
        atomic_torch_save({"skeleton": skeleton if i == 0 else None, "tensors": part}, path)
        paths.append(path)
    for stale in parts(stem):
        if stale not in paths:
            stale.unlink()
    return paths


def parts(stem: Path) -> list[Path]:
    """The files of the checkpoint ``save_parts`` wrote at ``stem``, in order (none if it wrote none)."""
    return sorted(stem.parent.glob(f"{stem.name}.part*.pt"), key=lambda p: int(p.name.rsplit(".part", 1)[1][:-3]))


def load_parts(stem: Path) -> object | None:
    """The checkpoint ``save_parts`` wrote at ``stem`` (its tensors in their own dtypes again), or None."""
    paths = parts(stem)
    if not paths:
        return None
    loaded = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
    tensors = {k: v for part in loaded for k, v in part["tensors"].items()}

    def restore(x: object) -> object:
        if isinstance(x, dict) and "__tensor__" in x:
            return tensors[x["__tensor__"]].to(getattr(torch, x["dtype"]))
        if isinstance(x, dict):
            return {k: restore(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(restore(v) for v in x)
        return x

    return restore(loaded[0]["skeleton"])


def atomic_torch_save(obj: object, path: Path) -> None:
    """``torch.save(obj, path)``, atomically (see ``autotailor.files.atomic_write``)."""
    from autotailor.files import atomic_write

    with atomic_write(path) as tmp:
        torch.save(obj, tmp)


def _cost_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name.removesuffix(".fp16.pt") + ".cost.json")


def record_cost(artifact: Path, spent: CpuTime, steps: int) -> None:
    """Beside ``artifact``: the CPU time its training of ``steps`` took (``spent``), so that a
    later session's cost table counts what made it."""
    _cost_path(artifact).write_text(json.dumps({**spent.as_state(), "steps": steps, "commit": head_commit()}) + "\n")


def recorded_cost(artifacts: list[Path]) -> str | None:
    """The CPU-minutes ``record_cost`` wrote beside all of ``artifacts``, summed, as a cost
    table's cell; None when one has no record."""
    paths = [_cost_path(a) for a in artifacts]
    if not paths or not all(p.is_file() for p in paths):
        return None
    records = [json.loads(p.read_text()) for p in paths]
    return sum((CpuTime.of(r) for r in records), CpuTime()).describe(sum(r["steps"] for r in records))


def default_cifar10() -> str:
    """Where CIFAR-10 is: ``$AUTOTAILOR_CIFAR10``, else ``../shared/data/cifar10`` beside the repository."""
    return os.environ.get("AUTOTAILOR_CIFAR10", str(Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "cifar10"))
