"""CIFAR-10 versions of torchvision models, adapted the way a user would (``module:factory`` specs).

``autotailor compile cifar_models:resnet18 --input-size 32`` with ``benchmarks/`` on PYTHONPATH.
"""

import json
from pathlib import Path

import torch
import torch.nn as nn
import torchvision

from common import fp32_state


def resnet18() -> nn.Module:
    """ResNet-18 with a 3x3 stride-1 stem for 32x32 inputs. The max-pool is kept: the first
    stage then runs at 16x16, a quarter of the compute of the pool-less variant, which keeps
    training on a 2-core CPU to minutes per epoch."""
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
    return model


def mobilenet_v2() -> nn.Module:
    """MobileNetV2 with a stride-1 stem: the common CIFAR adaptation. Unchanged, 32x32 inputs
    end at 1x1 and SGD at lr 0.05 diverges in the first few hundred steps on this data."""
    model = torchvision.models.mobilenet_v2(num_classes=10)
    model.features[0][0].stride = (1, 1)
    return model


def vit_c32() -> nn.Module:
    """A vision transformer for 32x32 inputs, the stand-in for DeiT-tiny in the transformer
    benchmark: timm's ``VisionTransformer`` (DeiT's own class: pre-norm blocks, class token,
    learned position embedding, fused qkv, GELU MLP of ratio 4) at DeiT-tiny's width of 192,
    with patches of 4 pixels (64 tokens and a class token, as 224 px and patch 16 give 196),
    6 layers instead of 12 and 6 heads of 32 channels instead of 3 of 64 (more heads to drop)
    so that training from scratch on one CPU thread takes hours, not days."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=6, num_heads=6,
                             mlp_ratio=4.0)


MODELS = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2, "vit_c32": vit_c32}
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def architecture(name: str) -> str:
    """The ``MODELS`` key of ``name``: a model's name, or the ``--name`` of a ``train_base.py``
    run (its architecture read from ``benchmarks/artifacts/NAME_cifar10.json``)."""
    if name in MODELS:
        return name
    meta = ARTIFACTS / f"{name}_cifar10.json"
    if not meta.is_file():
        raise FileNotFoundError(f"{name} is neither a model ({', '.join(MODELS)}) nor a train_base.py run "
                                f"({meta} is missing)")
    return json.loads(meta.read_text())["model"]


def trained(name: str) -> nn.Module:
    """The CIFAR-10 weights ``benchmarks/train_base.py`` made under ``name`` (a model's name, or
    the ``--name`` of a run: ``benchmarks/artifacts/NAME_cifar10.fp16.pt``), in float32."""
    path = ARTIFACTS / f"{name}_cifar10.fp16.pt"
    if not path.is_file():
        how = f"--model {name}" if name in MODELS else f"--model MODEL --name {name}"
        raise FileNotFoundError(f"{path} is missing; make it with: python benchmarks/train_base.py {how}")
    model = MODELS[architecture(name)]()
    model.load_state_dict(fp32_state(torch.load(path, map_location="cpu")))
    return model.eval()


def __getattr__(attr: str):
    """``cifar_models:NAME_trained`` for ``autotailor compile``: ``trained(NAME)`` as a factory,
    for a model's name (``resnet18_trained``) or a run's (``resnet18_e60_trained``)."""
    if attr.endswith("_trained") and not attr.startswith("_"):
        return lambda: trained(attr.removesuffix("_trained"))
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
