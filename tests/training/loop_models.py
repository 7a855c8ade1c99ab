"""Models that misbehave on purpose, named by `model.target` in the training-loop tests."""
from __future__ import annotations

import math
import os
import signal

import torch
from torch import nn


class _Flat(nn.Module):
    def __init__(self, info, hidden: int = 32, dropout: float = 0.0) -> None:
        super().__init__()
        features = math.prod(info.input_shape)
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, info.num_classes)
        )
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x)


class OOMAbove(_Flat):
    """Raises the CUDA out-of-memory error for batches larger than `limit` (as a real GPU would)."""

    def __init__(self, info, limit: int) -> None:
        super().__init__(info)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for batch {x.shape[0]}")
        return super().forward(x)


class NaNOnCalls(_Flat):
    """Returns NaN logits on the given training forward calls (1-based)."""

    def __init__(self, info, bad_calls: list[int]) -> None:
        super().__init__(info)
        self.bad = set(bad_calls)
        self.train_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            self.train_calls += 1
            if self.train_calls in self.bad:
                return out * float("nan")
        return out


class SignalOnCall(_Flat):
    """Sends this process a signal during the given training forward call, as a preempting scheduler
    (SIGTERM) or a user at the keyboard (SIGINT) would."""

    def __init__(self, info, call: int, dropout: float, sig: str) -> None:
        super().__init__(info, dropout=dropout)
        self.signal_call = call
        self.sig = getattr(signal, sig)
        self.train_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.train_calls += 1
            if self.train_calls == self.signal_call:
                os.kill(os.getpid(), self.sig)
        return super().forward(x)


def signal_on_call(info, call: int = -1, dropout: float = 0.2, sig: str = "SIGTERM"):
    return SignalOnCall(info, call, dropout, sig)


def oom_above(info, limit: int = 16):
    return OOMAbove(info, limit)


def nan_on_calls(info, bad_calls: list[int] = ()):
    return NaNOnCalls(info, list(bad_calls))


def flat(info, hidden: int = 32):
    return _Flat(info, hidden)


def oom_on_rank(info, rank: int = 1, limit: int = 8):
    """Runs out of memory above `limit` samples on one rank only, as an unevenly loaded GPU would."""
    this_rank = int(os.environ.get("RANK", "0"))
    return OOMAbove(info, limit if this_rank == rank else 10**9)


class _FailBackward(torch.autograd.Function):
    """Identity forward; the CUDA out-of-memory error in backward (where a GPU runs out as often as in forward)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate in backward for batch {grad.shape[0]}")


class OOMInBackwardAbove(_Flat):
    """Runs out of memory in backward for batches larger than `limit`."""

    def __init__(self, info, limit: int) -> None:
        super().__init__(info)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return _FailBackward.apply(out) if self.training and x.shape[0] > self.limit else out


def oom_in_backward_on_rank(info, rank: int = 1, limit: int = 8):
    """Out of memory in backward above `limit` samples, on one rank only: inside DDP's communicating backward."""
    this_rank = int(os.environ.get("RANK", "0"))
    return OOMInBackwardAbove(info, limit if this_rank == rank else 10**9)


class _SignalInBackward(torch.autograd.Function):
    """Identity; sends this process a signal from inside backward, i.e. after the step's agreement."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sig: int) -> torch.Tensor:
        ctx.sig = sig
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        os.kill(os.getpid(), ctx.sig)
        return grad, None


class SignalInBackwardOnCall(_Flat):
    def __init__(self, info, call: int, sig: int) -> None:
        super().__init__(info)
        self.signal_call, self.sig, self.train_calls = call, sig, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            self.train_calls += 1
            if self.train_calls == self.signal_call:
                return _SignalInBackward.apply(out, self.sig)
        return out


def sigterm_in_backward_on_rank(info, rank: int = 0, call: int = 3):
    """SIGTERM on one rank during the backward of training call `call`: after the ranks agreed on that step,
    as a preemption notice that lands between the agreement and the step's checkpoint decision."""
    this_rank = int(os.environ.get("RANK", "0"))
    return SignalInBackwardOnCall(info, call if this_rank == rank else -1, signal.SIGTERM)
