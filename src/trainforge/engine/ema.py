"""Exponential moving average of the weights (`train.ema_decay`), evaluated and saved instead of the raw weights.

The shadow has the layout of the model's own state: whole tensors, or under FSDP each rank's shards (DTensors),
so it costs 1/N of the weights per rank there too and is stored the way the strategy stores the model. A model
with adapters on a frozen base (LoRA, QLoRA) averages its adapters only: the base never changes, and a quantized
base could not be averaged at all.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainforge.engine.checkpoint import kept_weights


class EMA:
    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        kept = kept_weights(model, model.state_dict())
        self.shadow = {k: v.detach().clone() for k, v in kept.items() if v.dtype.is_floating_point}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        current = model.state_dict()
        for names in _by_kind(self.shadow):
            torch._foreach_lerp_([self.shadow[n] for n in names], [current[n].detach() for n in names], 1 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[None]:
        """Run a block with the EMA weights in the model, then put the trained weights back."""
        live = model.state_dict()  # tensors sharing the parameters' and buffers' storage: copied into in place
        backup = {k: live[k].detach().clone() for k in self.shadow}
        _copy_into(live, self.shadow)
        try:
            yield
        finally:
            _copy_into(live, backup)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        _copy_into(self.shadow, state)


def _by_kind(tensors: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names of sharded (DTensor) and of plain tensors apart: one foreach call cannot mix the two."""
    sharded = [k for k, v in tensors.items() if isinstance(v, DTensor)]
    plain = [k for k, v in tensors.items() if not isinstance(v, DTensor)]
    return [names for names in (sharded, plain) if names]


@torch.no_grad()
def _copy_into(target: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    for k, v in source.items():
        target[k].copy_(v)
