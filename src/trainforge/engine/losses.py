"""The training objective of a task, as one pure function: the task's own (trainforge.tasks)."""
from __future__ import annotations

import torch

from trainforge.tasks import TASKS


def task_loss(
    logits: torch.Tensor, y: torch.Tensor, task: str, *, label_smoothing: float = 0.0, reduction: str = "mean"
) -> torch.Tensor:
    """The loss of `task` (cross-entropy over classes for classification, over every next-token position for LMs)."""
    return TASKS.get(task).loss(logits, y, label_smoothing=label_smoothing, reduction=reduction)
