"""Data: the embedded digits, ImageFolder zips (decoded once, cached), specs and batches."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from autotailor.data import BatchLoader, load_data, load_digits, load_imagefolder_zip
from autotailor.data.datasets import DataError

SHARED_CIFAR = Path(os.environ.get("AUTOTAILOR_CIFAR10", Path(__file__).resolve().parents[2] / "shared/data/cifar10"))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTAILOR_CACHE", str(tmp_path / "cache"))


def _zip(path: Path, split: str, classes: dict[str, int], size: int = 12) -> None:
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as zf:
        for c, count in classes.items():
            for i in range(count):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
                zf.writestr(f"{split}/{c}/{i:04d}.png", buf.getvalue())


def test_digits_are_real_and_split_by_seed() -> None:
    data = load_digits()
    assert data.images.shape == (1797, 32, 32, 3) and data.images.dtype == np.uint8
    assert sorted(set(data.labels.tolist())) == list(range(10)) and data.images.max() == 255
    train, val = load_data("digits", seed=0)
    assert len(train) + len(val) == 1797 and len(val) == 359
    again, _ = load_data("digits", seed=0)
    other, _ = load_data("digits", seed=1)
    assert np.array_equal(train.labels, again.labels) and not np.array_equal(train.images, other.images)


def test_imagefolder_zip_is_decoded_once_and_cached(tmp_path) -> None:
    archive = tmp_path / "train.zip"
    _zip(archive, "train", {"cat": 3, "ant": 2})
    data = load_imagefolder_zip(archive, "train")
    assert data.classes == ["ant", "cat"] and data.labels.tolist() == [0, 0, 1, 1, 1]
    assert data.images.shape == (5, 12, 12, 3)
    cached = list((tmp_path / "cache").glob("train-*.npz"))
    assert len(cached) == 1
    again = load_imagefolder_zip(archive, "train")
    assert np.array_equal(again.images, data.images)
    _zip(archive, "train", {"cat": 1, "dog": 1})  # rewritten: the cache must not answer for it
    assert load_imagefolder_zip(archive, "train").classes == ["cat", "dog"]


def test_data_errors_say_what_is_wrong(tmp_path) -> None:
    with pytest.raises(DataError, match="data spec 'mnist' is not understood; use cifar10:PATH"):
        load_data("mnist")
    with pytest.raises(DataError, match="data archive not found"):
        load_data(f"cifar10:{tmp_path}")
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("readme.txt", "nothing")
    with pytest.raises(DataError, match="holds no images"):
        load_imagefolder_zip(empty)


def test_batches_are_seeded_augmented_and_resized() -> None:
    data = load_digits()
    train = BatchLoader(data, 64, train=True, resolution=24, seed=3)
    x, y = next(iter(train))
    assert x.shape == (64, 3, 24, 24) and x.dtype == torch.float32 and y.shape == (64,)
    x2, y2 = next(iter(BatchLoader(data, 64, train=True, resolution=24, seed=3)))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = next(iter(train))  # the next epoch is shuffled and augmented differently
    assert not torch.equal(x, x3)
    evaluation = BatchLoader(data, 500, train=False)
    labels = torch.cat([y for _, y in evaluation])
    assert len(evaluation) == 4 and torch.equal(labels, torch.from_numpy(data.labels))
    xe, _ = next(iter(evaluation))
    assert xe.shape[-1] == 32 and abs(float(xe.mean())) < 2.5


@pytest.mark.skipif(not (SHARED_CIFAR / "test.zip").is_file(), reason="CIFAR-10 not found (set AUTOTAILOR_CIFAR10)")
def test_real_cifar10_test_split() -> None:
    data = load_imagefolder_zip(SHARED_CIFAR / "test.zip", "test")
    assert data.images.shape == (10000, 32, 32, 3)
    assert data.classes[:3] == ["airplane", "automobile", "bird"]
    assert np.bincount(data.labels).tolist() == [1000] * 10


def test_validation_subset_is_a_random_sample_not_the_first_classes(tmp_path) -> None:
    from autotailor.pipeline.workdir import EvalSettings, eval_data

    # Stored class by class, as CIFAR-10's test split is: the first 40 images are one class.
    for split in ("train", "test"):
        _zip(tmp_path / f"{split}.zip", split, {c: 40 for c in ("ant", "bee", "cat", "dog")}, size=8)
    spec = f"cifar10:{tmp_path}"
    small = eval_data(spec, 8, EvalSettings(validation_images=40, calibration_batches=1, batch_size=16, seed=0))
    labels = torch.cat([y for _, y in small.val])
    assert small.images == 40 and sorted(set(labels.tolist())) == [0, 1, 2, 3]
    assert small.describe()["validation_sample_seed"] == 0
    again = eval_data(spec, 8, EvalSettings(validation_images=40, calibration_batches=1, batch_size=16, seed=0))
    assert torch.equal(labels, torch.cat([y for _, y in again.val]))
    whole = eval_data(spec, 8, EvalSettings(validation_images=1000, calibration_batches=1, batch_size=16, seed=0))
    assert whole.images == 160 and "validation_sample_seed" not in whole.describe()
