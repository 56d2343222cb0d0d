"""Datasets held in memory as uint8 arrays, decoded once and cached.

A data spec names where the data comes from:

- ``cifar10:PATH``: a folder with ``train.zip`` and ``test.zip`` in ImageFolder layout
  (``train/<class>/<file>.jpg``), as the CIFAR-10 copy this project's benchmarks use;
- ``imagefolder:PATH``: a folder with ``train/`` and ``val/`` (or ``test/``) ImageFolder trees,
  or a single tree that is split by a seed;
- ``digits``: scikit-learn's handwritten digits (1,797 8x8 images, 10 classes), shipped inside
  scikit-learn and so available offline, upsampled to 32x32 RGB.

Decoding JPEGs is the slow part, so decoded arrays are cached as ``.npz`` files (in
``$AUTOTAILOR_CACHE`` or ``~/.cache/autotailor``) keyed by the source's path, size and
modification time; a second load reads the cache.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autotailor.errors import DataError
from autotailor.files import atomic_write

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
SPEC_FORMS = "cifar10:PATH, imagefolder:PATH or digits"




@dataclass
class ArrayDataset:
    """Images as ``uint8`` ``[N, H, W, 3]`` with integer labels ``[N]`` and class names."""

    images: np.ndarray
    labels: np.ndarray
    classes: list[str]

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index: np.ndarray) -> "ArrayDataset":
        return ArrayDataset(self.images[index], self.labels[index], self.classes)

    def sample(self, n: int, seed: int) -> "ArrayDataset":
        """``n`` samples drawn at random under ``seed``, kept in dataset order (all if ``n >= len``).

        Random, not the first ``n``: validation splits are often stored class by class.
        Samples of different sizes under one seed are nested (the smaller is part of the larger).
        """
        if n >= len(self):
            return self
        order = np.random.default_rng(seed).permutation(len(self))
        return self.subset(np.sort(order[:n]))

    def split(self, fraction: float, seed: int) -> tuple["ArrayDataset", "ArrayDataset"]:
        """Two disjoint parts, the second holding ``fraction`` of the samples, fixed by ``seed``."""
        order = np.random.default_rng(seed).permutation(len(self))
        cut = len(self) - max(1, round(fraction * len(self)))
        return self.subset(np.sort(order[:cut])), self.subset(np.sort(order[cut:]))


def _cache_dir() -> Path:
    return Path(os.environ.get("AUTOTAILOR_CACHE", Path.home() / ".cache" / "autotailor"))


def _cache_key(path: Path, size: int | None) -> str:
    st = path.stat()
    raw = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{size}"
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def _cached(path: Path, size: int | None, build) -> ArrayDataset:
    cache = _cache_dir() / f"{path.stem}-{_cache_key(path, size)}.npz"
    if cache.is_file():
        with np.load(cache, allow_pickle=False) as f:
            return ArrayDataset(f["images"], f["labels"], [str(c) for c in f["classes"]])
    data = build()
    with atomic_write(cache) as tmp, open(tmp, "wb") as out:
        np.savez(out, images=data.images, labels=data.labels, classes=np.array(data.classes))
    log.info("decoded %d images from %s (cached in %s)", len(data), path, cache)
    return data


def _decode(raw: bytes, size: int | None) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as img:
        img = img.convert("RGB")
        if size is not None and img.size != (size, size):
            img = img.resize((size, size), Image.BILINEAR)
        return np.asarray(img, dtype=np.uint8)


def _assemble(items: list[tuple[str, bytes, str]], size: int | None, where: str) -> ArrayDataset:
    """``items`` as (class, encoded image, file name)."""
    if not items:
        raise DataError(f"{where} holds no images ({', '.join(IMAGE_SUFFIXES)}) in <class>/<file> folders")
    classes = sorted({c for c, _, _ in items})
    index = {c: i for i, c in enumerate(classes)}
    images = []
    for _, raw, name in items:
        try:
            images.append(_decode(raw, size))
        except Exception as exc:  # PIL raises several types for a file that is not an image
            raise DataError(f"{where}: {name} is not a readable image ({type(exc).__name__}: {exc}); remove or "
                            "replace it") from exc
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise DataError(f"{where} has images of different sizes {sorted(shapes)[:3]}; pass a size to resize them")
    return ArrayDataset(np.stack(images), np.array([index[c] for c, _, _ in items], dtype=np.int64), classes)


def load_imagefolder_zip(path: str | Path, split: str | None = None, size: int | None = None) -> ArrayDataset:
    """Images of a zip archive in ImageFolder layout, optionally under a top folder ``split``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data archive not found: {path}")

    def build() -> ArrayDataset:
        items = []
        try:
            with zipfile.ZipFile(path) as zf:
                for name in sorted(zf.namelist()):
                    parts = name.split("/")
                    if split is not None:
                        if parts[0] != split:
                            continue
                        parts = parts[1:]
                    if len(parts) == 2 and parts[1].lower().endswith(IMAGE_SUFFIXES):
                        items.append((parts[0], zf.read(name), name))
        except zipfile.BadZipFile as exc:
            raise DataError(f"{path} is not a zip archive: {exc}") from exc
        return _assemble(items, size, str(path))

    return _cached(path, size, build)


def load_imagefolder(path: str | Path, size: int | None = None) -> ArrayDataset:
    """Images of a folder in ImageFolder layout (``<class>/<file>``)."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"image folder not found: {path}")
    files = sorted(p for p in path.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES)
    items = [(p.parent.name, p.read_bytes(), str(p.relative_to(path))) for p in files]
    return _assemble(items, size, str(path))


def load_digits(size: int = 32) -> ArrayDataset:
    """scikit-learn's 8x8 handwritten digits, upsampled to ``size`` x ``size`` RGB."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits as sk_digits

    digits = sk_digits()
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0)[:, None]
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    images = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).repeat(1, 1, 1, 3).numpy()
    return ArrayDataset(np.ascontiguousarray(images), digits.target.astype(np.int64), [str(i) for i in range(10)])


def load_data(spec: str, seed: int = 0, val_fraction: float = 0.1) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, validation) data for a data spec (see the module docstring)."""
    kind, _, where = spec.partition(":")
    if kind == "digits" and not where:
        return load_digits().split(0.2, seed)
    if kind == "cifar10" and where:
        root = Path(where)
        return (load_imagefolder_zip(root / "train.zip", "train"), load_imagefolder_zip(root / "test.zip", "test"))
    if kind == "imagefolder" and where:
        root = Path(where)
        val_dir = next((root / d for d in ("val", "test") if (root / d).is_dir()), None)
        if (root / "train").is_dir() and val_dir is not None:
            return load_imagefolder(root / "train"), load_imagefolder(val_dir)
        return load_imagefolder(root).split(val_fraction, seed)
    raise DataError(f"data spec {spec!r} is not understood; use {SPEC_FORMS}")
