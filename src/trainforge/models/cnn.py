"""`cnn`: a small, fast VGG-style CNN for images from 8x8 (digits) up to 224x224; the default model.

    model: {name: cnn, args: {channels: [32, 64, 128], dropout: 0.1, norm: batch}}

One conv-norm-ReLU stage per entry of `channels`, each but the last followed by 2x2 max pooling
while the map is still at least 2x2, then global average pooling, so any input size gives a
1x1 map and the head never depends on the image size.

`norm`: `batch` (BatchNorm, the default: fastest to train at usual batch sizes) or `group` (GroupNorm,
no batch statistics: each sample is normalized on its own, so gradient accumulation and data parallelism
give exactly the gradient of one large batch, and tiny micro-batches lose nothing).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.models import args as check
from trainforge.models.base import InputSpec
from trainforge.models.zoo import IMAGE_CLASSIFICATION, input_spec, register_model


NORMS = ("batch", "group")
MAX_GROUPS = 8  # GroupNorm: the most groups that divide the channels, at most this many


def norm_layer(kind: str, channels: int) -> nn.Module:
    if kind == "group":
        return nn.GroupNorm(max(g for g in range(1, MAX_GROUPS + 1) if channels % g == 0), channels)
    return nn.BatchNorm2d(channels)


def conv_bn_relu(c_in: int, c_out: int, stride: int = 1, norm: str = "batch") -> list[nn.Module]:
    # no conv bias: the norm's shift makes it redundant
    conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
    return [conv, norm_layer(norm, c_out), nn.ReLU(inplace=True)]


class SmallCNN(nn.Module):
    def __init__(
        self, in_channels: int, image_hw: tuple[int, int], channels: Sequence[int], num_classes: int, dropout: float,
        norm: str = "batch",
    ) -> None:
        super().__init__()
        h, w = image_hw
        layers: list[nn.Module] = []
        width = in_channels
        for i, c in enumerate(channels):
            layers += conv_bn_relu(width, c, norm=norm)
            width = c
            if i < len(channels) - 1 and min(h, w) >= 2:
                layers.append(nn.MaxPool2d(2))
                h, w = h // 2, w // 2
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)))


@register_model("cnn", fits=IMAGE_CLASSIFICATION)
def build_cnn(
    info: DataInfo, channels: Sequence[int] = (32, 64, 128), dropout: float = 0.1, norm: str = "batch"
) -> tuple[nn.Module, InputSpec]:
    channels = check.int_list("channels", channels)
    dropout = check.probability("dropout", dropout)
    norm = check.choice("norm", norm, NORMS)
    c, h, w = info.input_shape
    return SmallCNN(c, (h, w), channels, info.num_classes, dropout, norm), input_spec(info)
