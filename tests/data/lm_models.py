"""A tiny next-token model for language-modelling runs in tests (`model.target: lm_models:kill_on_call`)."""
from __future__ import annotations

import os
import signal

import torch
from torch import nn


class KillOnCall(nn.Module):
    """Embedding -> Linear over the vocabulary; SIGKILLs its own process during the given training forward call,
    as the OOM killer or a lost node would: no handler runs, nothing is saved."""

    def __init__(self, vocab_size: int, call: int) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab_size, 32), nn.Linear(32, vocab_size)
        self.kill_call, self.train_calls = call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.train_calls += 1
            if self.train_calls == self.kill_call:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.head(torch.tanh(self.embed(x)))


def kill_on_call(info, call: int = -1):
    return KillOnCall(info.vocab_size, call)
