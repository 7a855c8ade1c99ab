"""The small collectives of a data-parallel run: one agreement per optimizer step, and helpers.

Once per step, after every forward and every backward that communicates nothing and before the one backward
that does (DDP's bucketed all-reduce, FSDP's reduce-scatter), the ranks agree in one small all-reduce on
[loss sum, out-of-memory?, stop signal?, data wait]: an out-of-memory error or a SIGTERM on one rank is then
acted on by all at the same step, and no rank is left waiting in a collective another never enters
(`training.strategy`). `OverlappedAllReduce` is that backward's gradient all-reduce for `ddp`.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from trainforge.engine.env import DistEnv



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
def broadcast_state(model: nn.Module, env: DistEnv) -> None:
    """Start every replica from rank 0's weights and buffers. Tensors of a subclass (a QLoRA base's NF4 or int8
    weights) are not sent: collectives take plain tensors, and every rank quantized the same base (checked by its
    SHA-256) the same deterministic way."""
    if not env.is_distributed:
        return
    for t in [*model.parameters(), *model.buffers()]:
        if type(t.data) is torch.Tensor:
            dist.broadcast(t.data, src=0)


def max_over_ranks(env: DistEnv, device: torch.device, value: float) -> float:
    if not env.is_distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def min_over_ranks(env: DistEnv, device: torch.device, value: float) -> float:
    return -max_over_ranks(env, device, -value)


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


BUCKET_BYTES = 25 * 2**20  # DDP's default bucket size
FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket: small, so communication starts early in backward


class OverlappedAllReduce:
    """Average the gradients over the ranks in buckets of ~25 MiB, each all-reduced asynchronously from inside
    the backward pass as soon as all of its gradients exist — DDP's scheme, so communication overlaps the rest
    of backward — but only within `syncing()`, the one backward per optimizer step that the ranks agreed to run.

        buckets = OverlappedAllReduce(model, env)      # hooks on every trainable parameter
        with buckets.syncing():                        # the last micro-batch's backward
            loss.backward()                            # bucket k is launched once buckets 0..k are complete
        # on leaving: buckets not yet launched go too, all are awaited, the averages written to .grad

    Why not torch's DistributedDataParallel: its forward can hold a collective (the one-time bucket rebuild
    after the first step's backward broadcasts rank 0's layout), and its reducer stays armed when a synced
    forward is not followed by backward; both defeat the agreement that lets every rank retry a step smaller
    when one ran out of memory, because a rank that failed would be elsewhere when the others communicate.
    Here nothing communicates outside `syncing()`.

    Buckets follow the reverse order of `model.parameters()` (roughly the order backward produces gradients),
    the first one small (1 MiB, as DDP's) so that communication starts early, and are launched strictly in
    index order, so every rank issues the same collectives in the same order.
    A parameter that got no gradient in the step counts as zeros (and has none afterwards if every rank's was 0).
    With torch.compile, a compiled graph's gradients appear when its whole backward is done: the buckets of
    that graph are launched then.
    """

    def __init__(self, model: nn.Module, env: DistEnv, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.env = env
        self.buckets: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed([p for p in model.parameters() if p.requires_grad]):
            last = self.buckets[-1] if self.buckets else None
            cap = min(bucket_bytes, FIRST_BUCKET_BYTES) if len(self.buckets) == 1 else bucket_bytes
            if last is None or size + _nbytes(p) > cap or (p.dtype, p.device) != (last[0].dtype, last[0].device):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += _nbytes(p)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.hooks = [p.register_post_accumulate_grad_hook(self._ready) for bucket in self.buckets for p in bucket]
        self.active = False
        self.missing: list[int] = []
        self.next = 0
        self.inflight: list[tuple[int, torch.Tensor, object]] = []
        self.launch_times_s: list[float] = []  # perf_counter of each bucket's launch in the last synced backward
        self.flats: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self.ready: set[int] = set()

    @contextlib.contextmanager
    def syncing(self) -> Iterator[None]:
        """Around the step's one communicating backward. Each parameter's gradient becomes a view into its
        bucket's flat buffer first (holding what earlier micro-batches accumulated, or zeros), so backward
        accumulates straight into the buffer that is all-reduced: no copy in or out, unlike DDP's default."""
        self.next, self.inflight, self.launch_times_s, self.ready = 0, [], [], set()
        self.missing = [len(bucket) for bucket in self.buckets]
        with torch.no_grad():
            for index, bucket in enumerate(self.buckets):
                _, views = self._buffer(index)
                for p, view in zip(bucket, views):
                    if p.grad is None:
                        view.zero_()
                    elif p.grad.data_ptr() != view.data_ptr():
                        view.copy_(p.grad)
                    p.grad = view
        self.active = True
        try:
            yield
        finally:
            self.active = False
        self._finish()

    def _ready(self, param: torch.Tensor) -> None:
        if not self.active:  # a micro-batch that only accumulates
            return
        self.ready.add(id(param))
        self.missing[self.bucket_of[id(param)]] -= 1
        while self.next < len(self.buckets) and self.missing[self.next] == 0:
            self._launch(self.next)
            self.next += 1

    @torch.no_grad()
    def _launch(self, index: int) -> None:
        flat, _ = self._buffer(index)
        flat.div_(self.env.world_size)  # averaged before summing, as DDP does: half precision stays in range
        self.launch_times_s.append(time.perf_counter())
        self.inflight.append((index, flat, dist.all_reduce(flat, async_op=True)))

    def _buffer(self, index: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The bucket's flat buffer (allocated once: a fresh one per step would cost page faults) and its
        per-parameter views."""
        if index not in self.flats:
            bucket = self.buckets[index]
            flat = torch.empty(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            views, offset = [], 0
            for p in bucket:
                views.append(flat[offset: offset + p.numel()].view_as(p))
                offset += p.numel()
            self.flats[index] = (flat, views)
        return self.flats[index]

    @torch.no_grad()
    def _finish(self) -> None:
        while self.next < len(self.buckets):  # buckets whose parameters did not all get a gradient
            self._launch(self.next)
            self.next += 1
        for index, _flat, work in self.inflight:
            work.wait()
            for p in self.buckets[index]:  # no gradient on any rank in this step: none, as without DDP
                if id(p) not in self.ready and not p.grad.any():
                    p.grad = None
        self.inflight = []


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
