"""`text_transformer`: token embedding + learned positions + pre-norm transformer encoder + mean
pooling over the non-pad tokens + linear head, for text classification.

    model: {name: text_transformer, args: {dim: 128, depth: 2, heads: 4, dropout: 0.1, max_len: 256}}

Pad tokens (id 0) are masked out of attention and of the pooling, so padding never changes a
prediction. `max_len` defaults to the data's sequence length.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec
from trainforge.models.transformer import Block, check_sequence_length, token_grid_positions
from trainforge.models.zoo import TOKEN_CLASSIFICATION, input_spec, register_model

PAD_ID = 0


class TextTransformer(nn.Module):
    def __init__(
        self, vocab_size: int, max_len: int, dim: int, depth: int, heads: int, dropout: float, num_classes: int
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.tok_emb = nn.Embedding(vocab_size, dim)
        self.pos_emb = token_grid_positions(max_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, 4.0, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        check_sequence_length(t, self.max_len, "max_len")
        keep = x != PAD_ID
        # an all-pad sequence would leave softmax nothing to attend to (NaN); let it see everything
        keep = keep | ~keep.any(dim=1, keepdim=True)
        h = self.drop(self.tok_emb(x) + self.pos_emb[:, :t])
        mask = keep[:, None, None, :]  # (B, 1, 1, T): every query sees only real keys
        for block in self.blocks:
            h = block(h, mask)
        h = self.norm(h)
        weights = keep.unsqueeze(-1).to(h.dtype)
        pooled = (h * weights).sum(dim=1) / weights.sum(dim=1)
        return self.head(pooled)


@register_model("text_transformer", fits=TOKEN_CLASSIFICATION)
def build_text_transformer(
    info: DataInfo,
    dim: int = 128,
    depth: int = 2,
    heads: int = 4,
    dropout: float = 0.1,
    max_len: Optional[int] = None,
) -> tuple[nn.Module, InputSpec]:
    seq_len = info.seq_len or info.input_shape[0]
    max_len = check.positive_int("max_len", seq_len if max_len is None else max_len)
    if max_len < seq_len:
        raise UserError(f"model.args.max_len: {max_len} is shorter than the data's {seq_len}-token sequences; raise it")
    dim = check.positive_int("dim", dim)
    heads = check.positive_int("heads", heads)
    check.heads_divide("heads", heads, "dim", dim)
    assert info.vocab_size, "token data always reports its vocab_size"
    model = TextTransformer(
        info.vocab_size,
        max_len,
        dim,
        check.positive_int("depth", depth),
        heads,
        check.probability("dropout", dropout),
        info.num_classes,
    )
    return model, input_spec(info)
