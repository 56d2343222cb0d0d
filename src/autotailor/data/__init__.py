"""Image classification data: an ImageFolder directory or zip archive, or the embedded digits set."""

from autotailor.data.datasets import ArrayDataset, load_data, load_digits, load_imagefolder, load_imagefolder_zip
from autotailor.data.loader import BatchLoader

__all__ = [
    "ArrayDataset",
    "BatchLoader",
    "load_data",
    "load_digits",
    "load_imagefolder",
    "load_imagefolder_zip",
]
