"""MobileNetV2 (Sandler et al., 2018) in plain PyTorch, with torchvision's parameter names.

The tutorials fine-tune torchvision's ImageNet MobileNetV2 weights, but torchvision itself
cannot be a dependency: PyPI only has its CUDA build, which fails to import beside a CPU
torch (and drags in a CUDA torch when unpinned). The module names below follow torchvision's
layout exactly, so its weights file loads with ``strict=True``.
"""

from __future__ import annotations

import torch
from torch import nn

#: (expansion t, output channels c, repeats n, first stride s), from the paper's Table 2.
BLOCKS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def conv_bn_relu6(
    inputs: int, outputs: int, kernel: int = 3, stride: int = 1, groups: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(inputs, outputs, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(outputs),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    """Expand (1×1), filter (3×3 depthwise), project (1×1, linear); a skip when shapes allow."""

    def __init__(self, inputs: int, outputs: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = inputs * expansion
        self.use_skip = stride == 1 and inputs == outputs
        expand = [conv_bn_relu6(inputs, hidden, kernel=1)] if expansion != 1 else []
        self.conv = nn.Sequential(
            *expand,
            conv_bn_relu6(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, outputs, 1, bias=False),
            nn.BatchNorm2d(outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_skip else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn_relu6(3, 32, stride=2)]
        channels = 32
        for expansion, outputs, repeats, stride in BLOCKS:
            for index in range(repeats):
                layers.append(InvertedResidual(channels, outputs, stride if index == 0 else 1, expansion))
                channels = outputs
        layers.append(conv_bn_relu6(channels, 1280, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(pooled, 1))
