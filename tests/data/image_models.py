"""A tiny image model for sharded-data runs in tests (`model.target: image_models:record_samples`): it writes which
samples each training micro-batch held, read back from the pixels (the test images encode their number)."""
from __future__ import annotations

import json
import math
import os
import signal

import torch
from torch import nn


def sample_ids(x: torch.Tensor) -> list[int]:
    """The number a test image encodes in its top-left pixel: red + 256 * green (data.normalize: none)."""
    pixel = (x[:, :2, 0, 0] * 255).round().long()
    return (pixel[:, 0] + 256 * pixel[:, 1]).tolist()


class RecordSamples(nn.Module):
    """Flatten -> Linear. Each training forward appends {"pid", "ids"} to $RECORD_DIR/rank<RANK>.jsonl; on rank
    `kill_rank` it then SIGKILLs its process in training call `kill_call` (no handler runs, nothing is saved),
    once: a restarted process finds $RECORD_DIR/killed and runs on."""

    def __init__(self, info, kill_rank: int, kill_call: int) -> None:
        super().__init__()
        self.head = nn.Linear(math.prod(info.input_shape), info.num_classes)
        self.rank = int(os.environ.get("RANK", "0"))
        self.kill_call = kill_call if self.rank == kill_rank else -1
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            with open(os.path.join(os.environ["RECORD_DIR"], f"rank{self.rank}.jsonl"), "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "ids": sample_ids(x)}) + "\n")
            marker = os.path.join(os.environ["RECORD_DIR"], "killed")
            if self.calls == self.kill_call and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return self.head(x.flatten(1))


def record_samples(info, kill_rank: int = -1, kill_call: int = -1):
    return RecordSamples(info, kill_rank, kill_call)
