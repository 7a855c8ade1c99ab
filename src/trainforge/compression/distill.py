"""Knowledge distillation: the pruned student learns from the unpruned teacher's softened outputs.

    loss_fn = distillation_loss(teacher, task_of(info), temperature=4.0, alpha=0.5)
    trainforge.train(cfg, hooks=FitHooks(build_model=..., loss=loss_fn))

What the loss is belongs to the task (`Task.distill_loss`: alpha * KL(softmax(t/T) || softmax(s/T)) * T^2 +
(1 - alpha) * the task's own loss, the KL over the class dimension of each of the task's rows: a sample's logits, a
token's, a pixel's); a task that defines none refuses --distill in one line (`Task.distill_refusal`). Here: the
frozen teacher run on each micro-batch, the way the task runs a model.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from trainforge.tasks import Task


def distillation_loss(teacher: nn.Module, task: Task, *, temperature: float = 4.0,
                      alpha: float = 0.5) -> Callable[[Any, Any], torch.Tensor]:
    """A FitHooks.loss(output, batch): runs the frozen teacher on the micro-batch (on the student's device)."""
    teacher = teacher.eval().requires_grad_(False)

    def loss(output: Any, batch: Any) -> torch.Tensor:
        device = output.device
        if next(teacher.parameters()).device != device:
            teacher.to(device)
        with torch.no_grad():
            target = task.forward(teacher, batch)
        return task.distill_loss(output, target, batch, temperature=temperature, alpha=alpha)

    return loss
