"""A model for tracking tests (`model.target: tracking_models:slow_then_killed`): SIGKILLed once in a given training
call, as the OOM killer or a lost node would, after waiting until the run's MLflow follower has uploaded the rows
up to a given step (<run>/mlflow.json says so)."""
from __future__ import annotations

import json
import math
import os
import signal
import time

import torch
from torch import nn


def uploaded_step(state_file: str) -> int:
    try:
        return json.loads(open(state_file).read())["metrics_step"]
    except (OSError, ValueError, KeyError):
        return -1


class KilledAfterUpload(nn.Module):
    def __init__(self, info, kill_call: int, marker: str, state_file: str, uploaded: int) -> None:
        super().__init__()
        self.head = nn.Linear(math.prod(info.input_shape), info.num_classes)
        self.kill_call, self.marker, self.calls = kill_call, marker, 0
        self.state_file, self.uploaded = state_file, uploaded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.kill_call and not os.path.exists(self.marker):
                deadline = time.monotonic() + 120
                while uploaded_step(self.state_file) < self.uploaded and time.monotonic() < deadline:
                    time.sleep(0.05)
                open(self.marker, "w").close()  # once: the resumed run trains on
                os.kill(os.getpid(), signal.SIGKILL)
        return self.head(x.flatten(1))


def killed_after_upload(info, kill_call: int = -1, marker: str = "", state_file: str = "", uploaded: int = 0):
    return KilledAfterUpload(info, kill_call, marker, state_file, uploaded)
