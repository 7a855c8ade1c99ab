"""A batch of any structure: a tensor, or dicts, lists and tuples of them (what a task's collate makes). The loop,
evaluation and the planner move and inspect batches through these, never by unpacking a pair."""
from __future__ import annotations

from typing import Any, Iterator

import torch


def to_device(batch: Any, device: torch.device, *, channels_last: bool = False) -> Any:
    """`batch` on `device` (non-blocking from pinned memory); with `channels_last`, every 4-D floating tensor (an
    image batch) in channels_last memory format. Anything that is not a tensor is left as it is."""
    if isinstance(batch, torch.Tensor):
        if channels_last and batch.dim() == 4 and batch.is_floating_point():
            return batch.to(device, non_blocking=True, memory_format=torch.channels_last)
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device, channels_last=channels_last) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(to_device(v, device, channels_last=channels_last) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, channels_last=channels_last) for v in batch)
    return batch


def leaves(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in `batch`, depth first."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from leaves(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from leaves(v)


def batch_device(batch: Any) -> torch.device:
    """The device of the batch's first tensor (CPU for a batch without tensors)."""
    return next((t.device for t in leaves(batch)), torch.device("cpu"))
