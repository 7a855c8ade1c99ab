"""The task registry (issue 41): for each task, what trainforge needs to train, evaluate, plan, export and serve a
model for it. The core asks the task and never names one.

    from trainforge.tasks import TASKS, task_of
    task = task_of(info)                        # info.task -> its Task (UserError naming `task` when unknown)
    batch = to_device(next(loader), device)     # trainforge.tasks.batch: any structure the task's collate makes
    output = task.forward(model, batch)         # the model called as the task calls it
    loss = task.training_loss(output, batch, label_smoothing=0.1)
    ev = task.evaluation(info); ev.add_batch(output, batch); ev.mean_loss, ev.result(detailed=True)
    task.default_metric, task.direction("accuracy")     # "accuracy", "max"
    TASKS.names()                               # ["classification", "detection", "lm", "segmentation"] and any a run's own module registers

docs/architecture.md, "Adding a task", lists what a new task provides. Standard library and numpy at import (predict
reads tasks where torch is absent); a task imports torch inside the functions that need it.
"""
from trainforge.tasks.base import TASKS, Evaluation, Task, register_task, task_of  # noqa: F401
from trainforge.tasks import classification, detection, detection3d, lm, segmentation  # noqa: F401,E402 - registers the shipped tasks
