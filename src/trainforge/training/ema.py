"""Exponential moving average of the weights (`train.ema_decay`), evaluated and saved instead of the raw weights."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


class EMA:
    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items() if v.dtype.is_floating_point}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        current = model.state_dict()
        names = list(self.shadow)
        torch._foreach_lerp_([self.shadow[n] for n in names], [current[n].detach() for n in names], 1 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self, model: nn.Module) -> Iterator[None]:
        """Run a block with the EMA weights in the model, then put the trained weights back."""
        backup = {k: v.detach().clone() for k, v in model.state_dict().items() if k in self.shadow}
        model.load_state_dict(self.shadow, strict=False)
        try:
            yield
        finally:
            model.load_state_dict(backup, strict=False)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.shadow.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for k, v in state.items():
            self.shadow[k].copy_(v)
