"""DDP's gradient all-reduce starts while backward is still running, and averages what it should.

In one process with a one-rank gloo group: the averaging, bucketing and ordering are those of any world size
(the all-reduce of one rank is the identity), so the timing of the launches against the backward pass can be
checked without a second process. Two real processes: benchmarks/ddp_overlap.py (its smoke test is below).
"""
from __future__ import annotations

import importlib
import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainforge.engine.data_parallel import OverlappedAllReduce
from trainforge.engine.env import DistEnv

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "ddp_overlap.py"


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistEnv(rank=0, local_rank=0, world_size=1, backend="gloo")
    finally:
        dist.destroy_process_group()


def deep_mlp(width: int = 256, depth: int = 6) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())], nn.Linear(width, 4))


def test_the_first_bucket_is_launched_before_backward_reaches_the_first_layer(one_rank_group):
    model = deep_mlp()
    buckets = OverlappedAllReduce(model, one_rank_group, bucket_bytes=300_000)  # ~1 layer per bucket
    assert len(buckets.buckets) >= 5
    first_layer_grad_at = []  # the first layer's weight gradient is among the last that backward produces
    model[0].weight.register_post_accumulate_grad_hook(lambda p: first_layer_grad_at.append(time.perf_counter()))
    x = torch.randn(32, 256, requires_grad=True)
    with buckets.syncing():
        model(x).square().mean().backward()
        backward_end = time.perf_counter()
    assert len(buckets.launch_times_s) == len(buckets.buckets)
    assert buckets.launch_times_s[0] < first_layer_grad_at[0] < backward_end
    assert buckets.launch_times_s == sorted(buckets.launch_times_s)
    launched_during_backward = sum(t < first_layer_grad_at[0] for t in buckets.launch_times_s)
    assert launched_during_backward >= len(buckets.buckets) - 1  # all but the first layer's own bucket


def test_accumulating_micro_batches_communicate_nothing_and_the_synced_one_gives_the_sum(one_rank_group):
    model, reference = deep_mlp(), deep_mlp()
    buckets = OverlappedAllReduce(model, one_rank_group)
    x = torch.randn(8, 256)
    model(x[:4]).sum().backward()  # an accumulating micro-batch: no launch
    assert buckets.launch_times_s == []
    with buckets.syncing():
        model(x[4:]).sum().backward()
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_parameter_without_gradient_does_not_stall_the_others(one_rank_group):
    class Partly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.used(x)

    model = Partly()
    buckets = OverlappedAllReduce(model, one_rank_group, bucket_bytes=1)  # one parameter per bucket
    with buckets.syncing():
        model(torch.randn(2, 8)).sum().backward()
    assert len(buckets.launch_times_s) == 4  # the unused ones' buckets go out when backward is over
    assert model.unused.weight.grad is None and model.used.weight.grad is not None


@pytest.mark.serial
@pytest.mark.slow
def test_the_overlap_benchmark_measures_two_processes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))  # the spawned processes import the worker by module name
    module = importlib.import_module(BENCH.stem)
    doc = module.measure(steps=4, warmup=1, repeats=1, width=512, depth=4, batch=8, threads=1)
    assert doc["ratio"] > 0 and doc["world_size"] == 2
    overlapped = doc["overlapped"]
    # every measured step launched its first bucket before its backward had finished
    assert overlapped["first_launch_before_backward_end"] == overlapped["steps"] == 4
    assert doc["post_backward"]["first_launch_before_backward_end"] == 0
    json.dumps(doc)
