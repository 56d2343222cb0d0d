"""A bundle: the SubNets a device may switch among, as files plus ``manifest.json``.

::

    bundle/
      manifest.json          {"schema": "autotailor-bundle/1", "meta": {...}, "subnets": [...]}
      4ms/subnet.onnx
      8ms/subnet.onnx

Each entry of ``subnets`` (see :class:`SubNetEntry` and docs/runtime.md) names its file relative
to the bundle directory; a path that leaves the directory (``../``, absolute, a symlink out) is
refused. ``Bundle.load`` checks every field and names the file, the entry and the field of the
first problem; ``Bundle.write`` copies files from outside into the directory and writes the
manifest atomically (a reader sees the old manifest or the new one, never half of one).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from autotailor.files import atomic_write
from autotailor.errors import BundleError, ServingError
from autotailor.runtime.loaders import formats, loader_for

log = logging.getLogger(__name__)

SCHEMA = "autotailor-bundle/1"
MANIFEST = "manifest.json"
MB = 1024 * 1024


@dataclass(frozen=True)
class SubNetEntry:
    """One SubNet of a bundle: its files and what was measured and predicted of it.

    Latency is the ``measured`` figure where there is one (on ``device``, at idle), else the
    ``predicted`` one; accuracy likewise. ``memory_mb`` is what the runtime counts against its
    memory budget: the files' size plus ``activation_mb`` when the manifest gives it.
    """

    name: str
    file: str  # relative to the bundle directory, with "/" separators
    format: str  # a registered loader: "onnx"
    input_shape: tuple[int, ...]
    device: str  # the device the SubNet was chosen and measured for, e.g. "ort-cpu:threads=1"
    target: str | None = None  # the latency LUT target the search used (None: chosen by measurement)
    measured_latency_ms: float | None = None
    latency_noise_ms: float | None = None  # spread of that measurement (median absolute deviation)
    predicted_latency_ms: float | None = None
    measured_accuracy: float | None = None
    predicted_accuracy: float | None = None
    activation_mb: float | None = None
    file_mb: float = 0.0  # measured from the files by Bundle.load/write
    extra_files: tuple[str, ...] = ()  # files the loader reads beside ``file`` (NCNN's .bin)
    options: Mapping[str, Any] = field(default_factory=dict)  # loader options
    arch: Mapping[str, Any] | None = None  # the SubNet's architecture, for people and tools

    @property
    def latency_ms(self) -> float:
        return self.measured_latency_ms if self.measured_latency_ms is not None else self.predicted_latency_ms  # type: ignore[return-value]

    @property
    def accuracy(self) -> float:
        return self.measured_accuracy if self.measured_accuracy is not None else self.predicted_accuracy  # type: ignore[return-value]

    @property
    def memory_mb(self) -> float:
        return self.file_mb + (self.activation_mb or 0.0)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_shape"] = list(self.input_shape)
        d["extra_files"] = list(self.extra_files)
        d["options"] = dict(self.options)
        d["arch"] = dict(self.arch) if self.arch is not None else None
        return d


_FIELDS = {f.name: f for f in dataclasses.fields(SubNetEntry)}
_REQUIRED = ("name", "file", "format", "input_shape", "device")


class _Checker:
    """Names the manifest, the entry and the field of every problem."""

    def __init__(self, manifest: Path):
        self.manifest = manifest

    def fail(self, where: str, problem: str) -> BundleError:
        return BundleError(f"{self.manifest}: {where} {problem}")

    def number(self, where: str, value: Any, positive: bool = False, optional: bool = True) -> float | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0 or (positive and value == 0):
            kind = "a positive number" if positive else "a number >= 0"
            raise self.fail(where, f"must be {kind}{' or null' if optional else ''} (found {value!r})")
        return float(value)

    def string(self, where: str, value: Any, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"must be a non-empty string{' or null' if optional else ''} (found {value!r})")
        return value

    def inside(self, where: str, root: Path, rel: Any) -> str:
        rel = self.string(where, rel)
        p = PurePosixPath(rel)
        if p.is_absolute() or "\\" in rel or ".." in p.parts or (p.parts and ":" in p.parts[0]):
            raise self.fail(where, f"must be a path inside the bundle directory, without '..' (found {rel!r})")
        full = root / p
        try:
            inside = full.resolve().is_relative_to(root.resolve())
        except OSError:
            inside = False
        if not inside:
            raise self.fail(where, f"leaves the bundle directory through a link (found {rel!r} -> {full.resolve()})")
        if not full.is_file():
            raise self.fail(where, f"names {full}, which does not exist or is not a file")
        return rel


def _entry(check: _Checker, root: Path, i: int, raw: Any, seen: set[str]) -> SubNetEntry:
    if not isinstance(raw, dict):
        raise check.fail(f"subnets[{i}]", f"must be an object (found {type(raw).__name__})")
    label = f"subnets[{i}]" + (f" ({raw['name']!r})" if isinstance(raw.get("name"), str) else "")
    unknown = sorted(set(raw) - set(_FIELDS))
    if unknown:
        raise check.fail(f"{label}.{unknown[0]}", f"is not a field of {SCHEMA} (fields: {', '.join(_FIELDS)})")
    for key in _REQUIRED:
        if key not in raw:
            raise check.fail(f"{label}.{key}", "is missing")
    name = check.string(f"{label}.name", raw["name"])
    if name in seen:
        raise check.fail(f"{label}.name", f"{name!r} is used by two SubNets; names must be unique")
    seen.add(name)
    fmt = raw["format"]
    if fmt not in formats():
        raise check.fail(f"{label}.format", f"{fmt!r} has no loader; registered: {list(formats())}")
    shape = raw["input_shape"]
    if not isinstance(shape, list) or not shape or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise check.fail(f"{label}.input_shape", f"must be a list of positive integers (found {shape!r})")
    num = {k: check.number(f"{label}.{k}", raw.get(k), positive=k.endswith("latency_ms"))
           for k in ("measured_latency_ms", "latency_noise_ms", "predicted_latency_ms",
                     "measured_accuracy", "predicted_accuracy", "activation_mb")}
    if num["measured_latency_ms"] is None and num["predicted_latency_ms"] is None:
        raise check.fail(f"{label}.measured_latency_ms", "and predicted_latency_ms are both missing; "
                         "the runtime needs one to compare observed latencies with")
    if num["measured_accuracy"] is None and num["predicted_accuracy"] is None:
        raise check.fail(f"{label}.measured_accuracy", "and predicted_accuracy are both missing; "
                         "the policies rank SubNets by accuracy")
    extra = raw.get("extra_files", [])
    if not isinstance(extra, list):
        raise check.fail(f"{label}.extra_files", f"must be a list of paths (found {extra!r})")
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise check.fail(f"{label}.options", f"must be an object (found {options!r})")
    problem = loader_for(fmt).check(options)
    if problem:
        raise check.fail(f"{label}.options", problem)
    arch = raw.get("arch")
    if arch is not None and not isinstance(arch, dict):
        raise check.fail(f"{label}.arch", f"must be an object or null (found {arch!r})")
    file = check.inside(f"{label}.file", root, raw["file"])
    extra = tuple(check.inside(f"{label}.extra_files[{j}]", root, e) for j, e in enumerate(extra))
    size = sum((root / f).stat().st_size for f in (file, *extra)) / MB
    return SubNetEntry(
        name=name, file=file, format=fmt, input_shape=tuple(shape), device=check.string(f"{label}.device", raw["device"]),
        target=check.string(f"{label}.target", raw.get("target"), optional=True), file_mb=size,
        extra_files=extra, options=dict(options), arch=arch, **num)  # type: ignore[arg-type]


def _rank(e: SubNetEntry) -> tuple[float, float]:
    # ascending accuracy; of two equally accurate SubNets the faster ranks higher (comes later)
    return (e.accuracy, -e.latency_ms)


@dataclass(frozen=True)
class Bundle:
    """A validated bundle: ``subnets`` sorted by accuracy, least accurate first."""

    root: Path
    subnets: tuple[SubNetEntry, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, root: str | Path) -> "Bundle":
        root = Path(root)
        manifest = root / MANIFEST
        try:
            data = json.loads(manifest.read_text())
        except FileNotFoundError:
            raise BundleError(f"{manifest} does not exist; a bundle is a directory with {MANIFEST} "
                              "(written by Bundle.write)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BundleError(f"{manifest} is not readable JSON ({exc}); write it again with Bundle.write") from exc
        return cls._parse(root, data)

    @classmethod
    def _parse(cls, root: Path, data: Any) -> "Bundle":
        manifest = root / MANIFEST
        check = _Checker(manifest)
        if not isinstance(data, dict):
            raise check.fail("the top level", f"must be an object (found {type(data).__name__})")
        if data.get("schema") != SCHEMA:
            raise check.fail("schema", f"must be {SCHEMA!r} (found {data.get('schema')!r})")
        unknown = sorted(set(data) - {"schema", "meta", "subnets"})
        if unknown:
            raise check.fail(unknown[0], "is not a top-level field (fields: schema, meta, subnets)")
        meta = data.get("meta", {})
        if not isinstance(meta, dict):
            raise check.fail("meta", f"must be an object (found {meta!r})")
        raw = data.get("subnets")
        if not isinstance(raw, list) or not raw:
            raise check.fail("subnets", f"must be a non-empty list (found {raw!r})")
        seen: set[str] = set()
        entries = [_entry(check, root, i, e, seen) for i, e in enumerate(raw)]
        bundle = cls(root, tuple(sorted(entries, key=_rank)), meta)
        for a in bundle.subnets:  # a Pareto front has none; a dominated SubNet is never chosen by latency
            better = [b for b in bundle.subnets if b is not a and b.accuracy >= a.accuracy
                      and b.latency_ms <= a.latency_ms and (b.accuracy, -b.latency_ms) != (a.accuracy, -a.latency_ms)]
            if better:
                log.warning("%s: SubNet %r is dominated by %r (as fast and as accurate or more)",
                            manifest, a.name, better[0].name)
        return bundle

    @classmethod
    def write(cls, root: str | Path, entries: Sequence[SubNetEntry], meta: Mapping[str, Any] | None = None) -> "Bundle":
        """Write ``entries`` as the bundle at ``root`` and return it.

        An entry's ``file`` (and ``extra_files``) relative to ``root`` must already be there; an
        absolute path outside ``root`` is copied into ``root/NAME/``. ``file_mb`` is measured.
        The manifest is checked as ``load`` checks it before it replaces the old one, so a
        refused write leaves the bundle as it was (files copied in stay)."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        rows = []
        for e in entries:
            folder = "".join(c if c.isalnum() or c in "._-" else "_" for c in e.name)
            placed = [_place(root, folder, f) for f in (e.file, *e.extra_files)]
            row = dataclasses.replace(e, file=placed[0], extra_files=tuple(placed[1:])).to_dict()
            row["file_mb"] = round(sum((root / f).stat().st_size for f in placed if (root / f).is_file()) / MB, 6)
            rows.append(row)
        doc = {"schema": SCHEMA, "meta": dict(meta or {}), "subnets": rows}
        bundle = cls._parse(root, json.loads(json.dumps(doc)))  # as it will be read back
        with atomic_write(root / MANIFEST) as tmp:
            tmp.write_text(json.dumps(doc, indent=1) + "\n")
        return bundle

    def __iter__(self) -> Iterator[SubNetEntry]:
        return iter(self.subnets)

    def __len__(self) -> int:
        return len(self.subnets)

    def __getitem__(self, name: str) -> SubNetEntry:
        for e in self.subnets:
            if e.name == name:
                return e
        raise ServingError(f"bundle {self.root} has no SubNet {name!r}; it has {[e.name for e in self.subnets]}")

    def path(self, entry: SubNetEntry) -> Path:
        return self.root / entry.file


def _place(root: Path, folder: str, file: str) -> str:
    """The path of ``file`` relative to ``root``, copying it in first when it lies outside."""
    src = Path(file)
    if not src.is_absolute():
        return PurePosixPath(*Path(file).parts).as_posix()  # checked (inside, exists) by load
    try:
        return src.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        pass
    if not src.is_file():
        raise BundleError(f"cannot copy {src} into bundle {root}: it does not exist or is not a file")
    dest = root / folder / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(dest) as tmp:
        shutil.copyfile(src, tmp)
    return dest.relative_to(root).as_posix()
