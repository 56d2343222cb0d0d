"""Model specs on the command line: ``torchvision:NAME``, ``timm:NAME``, ``file.onnx``, ``pkg.mod:factory``."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from autotailor.errors import ModelLoadError

SPEC_FORMS = "torchvision:NAME, timm:NAME, path/to/model.onnx, or package.module:factory"


def load_model(spec: str) -> torch.nn.Module | Path:
    """Resolve ``spec`` to a module (random weights for zoo names) or an ONNX path."""
    if spec.endswith(".onnx"):
        path = Path(spec)
        if not path.is_file():
            raise ModelLoadError(f"ONNX file not found: {spec}")
        return path
    kind, sep, name = spec.partition(":")
    if not sep or not name:
        raise ModelLoadError(f"model spec {spec!r} is not understood; use {SPEC_FORMS}")
    if kind == "torchvision":
        import torchvision

        classifiers = sorted(torchvision.models.list_models(module=torchvision.models))
        if name not in classifiers:
            # Detection and segmentation builders would also download backbone weights (offline: a traceback).
            other = name in torchvision.models.list_models()
            raise ModelLoadError(f"torchvision has no classification model {name!r}"
                                 + (" (it is a detection, segmentation or video model; AutoTailor compiles image "
                                    "classifiers)" if other else "") + f"; e.g. {', '.join(classifiers[:12])}, ...")
        return torchvision.models.get_model(name, weights=None)
    if kind == "timm":
        try:
            import timm
        except ImportError as exc:
            raise ModelLoadError("the timm: spec needs the timm package: pip install timm") from exc
        try:
            return timm.create_model(name, pretrained=False)
        except RuntimeError as exc:
            raise ModelLoadError(f"timm has no model {name!r}: {exc}") from exc
    try:
        module = importlib.import_module(kind)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import {kind!r} from model spec {spec!r}: {exc}; use {SPEC_FORMS}") from exc
    factory = getattr(module, name, None)
    if factory is None:
        raise ModelLoadError(f"module {kind!r} has no attribute {name!r} (model spec {spec!r})")
    model = factory() if callable(factory) and not isinstance(factory, torch.nn.Module) else factory
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{spec!r} gave a {type(model).__name__}, not a torch.nn.Module")
    return model
