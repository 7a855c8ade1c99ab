"""Data parallelism with one agreement per optimizer step.

Every rank runs forward and backward on its own micro-batches with no communication at all; then the
ranks agree, in one small all-reduce, on [loss sum, out-of-memory?, stop signal?, data wait]; only when
nobody ran out of memory are the gradients all-reduced (bucketed, averaged) — once per optimizer step,
however many micro-batches were accumulated. This is what DDP with `no_sync` does for accumulation,
minus DDP's overlap of the all-reduce with backward: the price of the guarantee that an out-of-memory
error on one rank never leaves another waiting inside a collective (all ranks then shrink the micro-batch
together and retry the step).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainforge.distributed.env import DistEnv

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket size


@dataclass(frozen=True)
class Agreement:
    loss: float  # mean over ranks of each rank's mean loss
    oom: bool  # some rank ran out of memory
    stop: bool  # some rank got SIGTERM/SIGINT
    data_wait_s: float  # mean over ranks


def agree(env: DistEnv, device: torch.device, loss_sum: float, oom: bool, stop: bool, data_wait_s: float) -> Agreement:
    if not env.is_distributed:
        return Agreement(loss_sum, oom, stop, data_wait_s)
    t = torch.tensor([0.0 if oom else loss_sum, float(oom), float(stop), data_wait_s], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    n = env.world_size
    return Agreement(float(t[0]) / n, bool(t[1] > 0), bool(t[2] > 0), float(t[3]) / n)


@torch.no_grad()
def all_reduce_gradients(model: nn.Module, env: DistEnv) -> None:
    """Average the gradients over ranks, in flat buckets of ~25 MiB per dtype and device."""
    if not env.is_distributed:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        if bucket and (size + g.numel() * g.element_size() > BUCKET_BYTES or g.dtype != bucket[0].dtype):
            _reduce_bucket(bucket, env.world_size)
            bucket, size = [], 0
        bucket.append(g)
        size += g.numel() * g.element_size()
    if bucket:
        _reduce_bucket(bucket, env.world_size)


def _reduce_bucket(bucket: list[torch.Tensor], world_size: int) -> None:
    flat = torch.cat([g.reshape(-1) for g in bucket])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for g in bucket:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


@torch.no_grad()
def broadcast_state(model: nn.Module, env: DistEnv) -> None:
    """Start every replica from rank 0's weights and buffers."""
    if not env.is_distributed:
        return
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0)


def max_over_ranks(env: DistEnv, device: torch.device, value: float) -> float:
    if not env.is_distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def barrier(env: DistEnv) -> None:
    if env.is_distributed:
        dist.barrier()


def broadcast_object(env: DistEnv, obj):
    """Rank 0's value of a small picklable object, on every rank."""
    if not env.is_distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(env: DistEnv, obj) -> list:
    """Every rank's value (on rank 0; other ranks get an empty list)."""
    if not env.is_distributed:
        return [obj]
    out = [None] * env.world_size if env.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out or []
