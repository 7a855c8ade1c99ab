"""The training objective of each task, as one pure function."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def task_loss(
    logits: torch.Tensor, y: torch.Tensor, task: str, *, label_smoothing: float = 0.0, reduction: str = "mean"
) -> torch.Tensor:
    """Cross-entropy: over classes for classification, over every next-token position for LMs."""
    if task == "lm":
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    return F.cross_entropy(logits, y, label_smoothing=label_smoothing, reduction=reduction)
