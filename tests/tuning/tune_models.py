"""Models for the tune tests, named by `model.target`: one that takes its worker down, one that raises."""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch
from torch import nn


def _claim(path: Path) -> bool:
    """True for exactly one caller across processes (atomic create)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


class CrashOnce(nn.Module):
    """The first trial to train kills its whole worker process (os._exit); the second raises; the rest train."""

    def __init__(self, info, width: int, marker_dir: str) -> None:
        super().__init__()
        self.marker_dir = Path(marker_dir)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), width), nn.ReLU(),
                                 nn.Linear(width, info.num_classes))
        self.checked = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not self.checked:
            self.checked = True
            if _claim(self.marker_dir / "exit"):
                os._exit(3)
            if _claim(self.marker_dir / "raise"):
                raise RuntimeError("boom: this trial's model fails on purpose")
        return self.net(x)


def crash_once(info, width: int = 16, marker_dir: str = ".") -> nn.Module:
    return CrashOnce(info, width, marker_dir)
