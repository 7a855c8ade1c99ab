"""How many kernels one forward + backward launches: the floor of a tiny model's step time."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.planning.fake_model import build_fake_model
from trainforge.engine.precision import autocast
from trainforge.tasks import task_of

# Ops that only create views or read metadata launch no kernel.
_FREE = {"detach", "view", "_unsafe_view", "alias", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
         "select", "slice", "as_strided", "reshape", "split", "split_with_sizes", "unbind", "chunk", "empty",
         "empty_strided", "empty_like", "lift_fresh", "sym_size", "sym_stride"}


class _KernelCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if not (func.is_view or name in _FREE):
            self.count += 1
        return func(*args, **(kwargs or {}))


def kernels_per_micro_batch(model_cfg: ModelConfig, info: DataInfo, micro_batch_size: int, precision: str) -> int:
    """aten ops that launch work in one forward + backward (the optimizer's few fused kernels are left out)."""
    with FakeTensorMode():
        model, spec = build_fake_model(model_cfg, info)
        task = task_of(info)
        batch = task.example_batch(info, spec.example(micro_batch_size), micro_batch_size)
        counter = _KernelCounter()
        with counter:
            with autocast(torch.device("cpu"), precision):
                output = task.forward(model, batch)
            task.training_loss(output, batch).backward()
    return counter.count
