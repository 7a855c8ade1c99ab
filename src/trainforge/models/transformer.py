"""The pre-norm transformer block shared by vit, hybrid, text_transformer and gpt.

Layer names follow nanoGPT (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj) so GPT
checkpoints map one to one. Attention is `F.scaled_dot_product_attention`, which picks the fused
kernel for the device.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from trainforge.errors import UserError


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, bias: bool = True, causal: bool = False) -> None:
        super().__init__()
        assert dim % heads == 0, "factories check that heads divide the width"
        self.heads = heads
        self.dropout = dropout
        self.causal = causal
        self.c_attn = nn.Linear(dim, 3 * dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, T, C); attn_mask: bool, True where a query may attend to a key, broadcast to (B, H, T, T)."""
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float, bias: bool = True) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, hidden, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        bias: bool = True,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, bias=bias)
        self.attn = SelfAttention(dim, heads, dropout, bias=bias, causal=causal)
        self.ln_2 = nn.LayerNorm(dim, bias=bias)
        self.mlp = FeedForward(dim, int(dim * mlp_ratio), dropout, bias=bias)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attn_mask)
        return x + self.mlp(self.ln_2(x))


def token_grid_positions(num_tokens: int, dim: int) -> nn.Parameter:
    """A learned position embedding (1, num_tokens, dim), initialised like ViT's (normal, std 0.02)."""
    pos = nn.Parameter(torch.empty(1, num_tokens, dim))
    nn.init.normal_(pos, std=0.02)
    return pos


def check_sequence_length(length: int, limit: int, arg: str) -> None:
    """Token inputs longer than the positions the model has: a user error naming `model.args.<arg>`."""
    if length > limit:
        raise UserError(
            f"model.args.{arg}: got sequences of {length} tokens but {arg} is {limit}; "
            f"raise model.args.{arg} or shorten the sequences"
        )
