"""`gpt`: a nanoGPT-style decoder-only language model, with nanoGPT's argument names.

    model: {name: gpt, args: {n_layer: 12, n_head: 12, n_embd: 768}}   # GPT-2 small, 124M params

Logits are (B, T, vocab_size) for every position. Causal attention goes through
`F.scaled_dot_product_attention(is_causal=True)`. Initialisation follows nanoGPT/GPT-2: normal(0.02)
everywhere, residual projections scaled by 1/sqrt(2 * n_layer). `vocab_size` may exceed the data's
vocabulary (e.g. 50304 for faster matmuls); the extra logits are simply never targets.
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
from trainforge.models.transformer import Block, check_sequence_length
from trainforge.models.zoo import LANGUAGE_MODELLING, input_spec, register_model


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        dropout: float = 0.0,
        bias: bool = True,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                drop=nn.Dropout(dropout),
                h=nn.ModuleList(Block(n_embd, n_head, 4.0, dropout, bias=bias, causal=True) for _ in range(n_layer)),
                ln_f=nn.LayerNorm(n_embd, bias=bias),
            )
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:  # the input embedding doubles as the output projection (GPT-2, Press & Wolf 2017)
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(_init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: keep the residual stream's variance flat with depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, each shared tensor once; non_embedding leaves out token and position embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        check_sequence_length(t, self.block_size, "block_size")
        pos = torch.arange(t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


@register_model("gpt", fits=LANGUAGE_MODELLING)
def build_gpt(
    info: DataInfo,
    n_layer: int = 4,
    n_head: int = 4,
    n_embd: int = 128,
    vocab_size: Optional[int] = None,
    block_size: Optional[int] = None,
    dropout: float = 0.0,
    bias: bool = True,
    tie_weights: bool = True,
) -> tuple[nn.Module, InputSpec]:
    data_vocab = info.vocab_size or info.num_classes
    seq_len = info.seq_len or info.input_shape[0]
    vocab_size = check.positive_int("vocab_size", data_vocab if vocab_size is None else vocab_size)
    if vocab_size < data_vocab:
        raise UserError(
            f"model.args.vocab_size: {vocab_size} is below the data's vocabulary of {data_vocab}; "
            "raise it or leave it unset"
        )
    block_size = check.positive_int("block_size", seq_len if block_size is None else block_size)
    if block_size < seq_len:
        raise UserError(
            f"model.args.block_size: {block_size} is shorter than the data's {seq_len}-token sequences; "
            "raise it or leave it unset"
        )
    n_embd = check.positive_int("n_embd", n_embd)
    n_head = check.positive_int("n_head", n_head)
    check.heads_divide("n_head", n_head, "n_embd", n_embd)
    model = GPT(
        vocab_size,
        block_size,
        check.positive_int("n_layer", n_layer),
        n_head,
        n_embd,
        check.probability("dropout", dropout),
        check.flag("bias", bias),
        check.flag("tie_weights", tie_weights),
    )
    return model, input_spec(info)
