"""CIFAR-10 versions of torchvision models, adapted the way a user would (``module:factory`` specs).

``autotailor compile cifar_models:resnet18 --input-size 32`` with ``benchmarks/`` on PYTHONPATH.
"""

import torch.nn as nn
import torchvision


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
