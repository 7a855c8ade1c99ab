"""A tiny token classifier named by `model.target` in the text-augmentation runs; it can signal itself mid-run."""
from __future__ import annotations

import os
import signal

import torch
from torch import nn


class SignalingBag(nn.Module):
    """Mean of the non-pad token embeddings -> linear head; sends SIGTERM during training forward call `call`."""

    def __init__(self, vocab_size: int, num_classes: int, call: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 16)
        self.head = nn.Linear(16, num_classes)
        self.signal_call, self.train_calls = call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.train_calls += 1
            if self.train_calls == self.signal_call:
                os.kill(os.getpid(), signal.SIGTERM)
        keep = (x != 0).unsqueeze(-1).float()
        return self.head((self.emb(x) * keep).sum(1) / keep.sum(1).clamp_min(1))


def signaling_bag(info, call: int = -1):
    return SignalingBag(info.vocab_size, info.num_classes, call)
