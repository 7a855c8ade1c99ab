"""Knowledge distillation: the pruned student learns from the unpruned teacher's softened outputs.

    loss_fn = distillation_loss(teacher, task="classification", temperature=4.0, alpha=0.5)
    trainforge.train(cfg, hooks=FitHooks(build_model=..., loss=loss_fn))

loss = alpha * KL(softmax(t/T) || softmax(s/T)) * T^2 + (1 - alpha) * cross-entropy(s, y)   (Hinton et al.
2015; the T^2 keeps the soft term's gradients on the scale of the hard term's as T changes).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trainforge.engine.losses import task_loss


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor, *, task: str,
            temperature: float, alpha: float) -> torch.Tensor:
    """The distillation objective for logits of shape (..., classes); pure, no state."""
    t = float(temperature)
    s_flat, t_flat = student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1])
    soft = F.kl_div(F.log_softmax(s_flat / t, dim=-1), F.log_softmax(t_flat / t, dim=-1),
                    reduction="batchmean", log_target=True) * (t * t)
    hard = task_loss(student, y, task)
    return alpha * soft + (1.0 - alpha) * hard


def distillation_loss(teacher: nn.Module, *, task: str, temperature: float = 4.0,
                      alpha: float = 0.5) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """A FitHooks.loss: runs the frozen teacher on each micro-batch (on the student's device)."""
    teacher = teacher.eval().requires_grad_(False)

    def loss(logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if next(teacher.parameters()).device != x.device:
            teacher.to(x.device)
        with torch.no_grad():
            target = teacher(x).float()
        return kd_loss(logits, target, y, task=task, temperature=temperature, alpha=alpha)

    return loss
