"""`hybrid`: a convolutional stem that strides the image down to at most an 8x8 token grid, then a
transformer encoder over those tokens and a mean-pooled head (in the spirit of ViT-hybrid / CvT).

    model: {name: hybrid, args: {stem_channels: [32, 64], dim: 128, depth: 2, heads: 4, dropout: 0.0}}

Each stem stage is conv-BN-ReLU with stride 2 while the map is larger than the grid; when the stem
runs out of stages first, average pooling brings the map down to the grid.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.models import args as check
from trainforge.models.base import InputSpec
from trainforge.models.cnn import conv_bn_relu
from trainforge.models.transformer import Block, token_grid_positions
from trainforge.models.zoo import IMAGE_CLASSIFICATION, input_spec, register_model

MAX_GRID = 8  # tokens per side: 64 tokens keep attention cheap at any image size


class HybridConvTransformer(nn.Module):
    def __init__(
        self,
        in_channels: int,
        image_hw: tuple[int, int],
        stem_channels: Sequence[int],
        dim: int,
        depth: int,
        heads: int,
        dropout: float,
        num_classes: int,
    ) -> None:
        super().__init__()
        h, w = image_hw
        layers: list[nn.Module] = []
        width = in_channels
        for c in stem_channels:
            stride = 2 if max(h, w) > MAX_GRID else 1
            layers += conv_bn_relu(width, c, stride)
            h, w = -(-h // stride), -(-w // stride)  # ceil: 3x3 conv with padding 1
            width = c
        grid = (min(h, MAX_GRID), min(w, MAX_GRID))
        if grid != (h, w):
            layers.append(nn.AdaptiveAvgPool2d(grid))
        layers.append(nn.Conv2d(width, dim, 1))  # project each grid cell to a token
        self.stem = nn.Sequential(*layers)
        self.pos_emb = token_grid_positions(grid[0] * grid[1], dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, 4.0, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.stem(x).flatten(2).transpose(1, 2) + self.pos_emb)  # (B, N, dim)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).mean(dim=1))


@register_model("hybrid", fits=IMAGE_CLASSIFICATION)
def build_hybrid(
    info: DataInfo,
    stem_channels: Sequence[int] = (32, 64),
    dim: int = 128,
    depth: int = 2,
    heads: int = 4,
    dropout: float = 0.0,
) -> tuple[nn.Module, InputSpec]:
    c, h, w = info.input_shape
    dim = check.positive_int("dim", dim)
    heads = check.positive_int("heads", heads)
    check.heads_divide("heads", heads, "dim", dim)
    model = HybridConvTransformer(
        c,
        (h, w),
        check.int_list("stem_channels", stem_channels),
        dim,
        check.positive_int("depth", depth),
        heads,
        check.probability("dropout", dropout),
        info.num_classes,
    )
    return model, input_spec(info)
