"""`vit`: a small Vision Transformer (patch embedding, cls token, learned positions, pre-norm blocks).

    model: {name: vit, args: {patch_size: 4, dim: 128, depth: 4, heads: 4, mlp_ratio: 4, dropout: 0.0}}

The default patch size keeps the token count small: 2 for images up to 16 px, 4 up to 64 px,
16 above. Both image sides must be multiples of the patch size.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec
from trainforge.models.transformer import Block, token_grid_positions
from trainforge.models.zoo import IMAGE_CLASSIFICATION, input_spec, register_model


def default_patch_size(side: int) -> int:
    if side <= 16:
        return 2
    if side <= 64:
        return 4
    return 16


class ViT(nn.Module):
    def __init__(
        self,
        in_channels: int,
        image_hw: tuple[int, int],
        patch_size: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        dropout: float,
        num_classes: int,
    ) -> None:
        super().__init__()
        num_patches = (image_hw[0] // patch_size) * (image_hw[1] // patch_size)
        # a stride-p conv is the usual way to cut and project patches in one op
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_emb = token_grid_positions(1 + num_patches, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, dim)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        h = self.drop(torch.cat([cls, tokens], dim=1) + self.pos_emb)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h[:, 0]))


@register_model("vit", fits=IMAGE_CLASSIFICATION)
def build_vit(
    info: DataInfo,
    patch_size: Optional[int] = None,
    dim: int = 128,
    depth: int = 4,
    heads: int = 4,
    mlp_ratio: float = 4,
    dropout: float = 0.0,
) -> tuple[nn.Module, InputSpec]:
    c, h, w = info.input_shape
    patch_size = check.positive_int("patch_size", default_patch_size(max(h, w)) if patch_size is None else patch_size)
    if h % patch_size or w % patch_size:
        fits = [p for p in range(1, min(h, w) + 1) if math.gcd(h, w) % p == 0]
        raise UserError(
            f"model.args.patch_size: {patch_size} does not divide the {h}x{w} images; "
            f"choose one of {', '.join(map(str, fits[-6:]))} or resize the images"
        )
    dim = check.positive_int("dim", dim)
    heads = check.positive_int("heads", heads)
    check.heads_divide("heads", heads, "dim", dim)
    model = ViT(
        c,
        (h, w),
        patch_size,
        dim,
        check.positive_int("depth", depth),
        heads,
        check.positive_number("mlp_ratio", mlp_ratio),
        check.probability("dropout", dropout),
        info.num_classes,
    )
    return model, input_spec(info)
