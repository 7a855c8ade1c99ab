"""Who am I in a distributed run: rank, local rank, world size, from the standard environment variables.

torchrun (and `trainforge train --nproc-per-node N`, which runs torchrun) sets RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; `srun` without torchrun sets SLURM_PROCID, SLURM_LOCALID and
SLURM_NTASKS (MASTER_ADDR/MASTER_PORT then come from the batch script). The same code runs under all
three and as a plain single process. NCCL on GPUs, gloo on the CPU, one GPU per process by LOCAL_RANK.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from trainforge.errors import UserError
from trainforge.hardware.device import resolve_device
from trainforge.processes import die_with_parent

TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str = ""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def detect() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's or Slurm's variables; (0, 0, 1) otherwise."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"])
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1 and "MASTER_ADDR" in env:
        return int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0)), int(env["SLURM_NTASKS"])
    return 0, 0, 1


def started_by_torchrun() -> bool:
    """A worker of a torchrun agent (also when the agent runs it as a group of one process)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def launched_worker() -> bool:
    """One process of a launched group (torchrun or srun): the launcher, not this process, owns the run dir."""
    return started_by_torchrun() or detect()[2] > 1


def die_with_launcher() -> None:
    """A torchrun worker is killed (SIGKILL) when its agent dies.

    torchrun starts each worker in a session of its own, so killing a launcher, even its whole process
    group, leaves its workers running: the node has not really left, the other nodes never re-rendezvous
    and wait at the end for an agent that is gone. A dead agent must mean a dead node. SIGKILL rather than
    SIGTERM: a graceful stop would make every rank checkpoint and exit 0, ending the whole job instead of
    letting the remaining nodes restart without this one. (No check of the parent pid afterwards: an agent
    that is a container's pid 1 is a live parent.) Linux only; elsewhere a no-op."""
    die_with_parent(signal.SIGKILL)


@contextlib.contextmanager
def distributed(device_spec: str) -> Iterator[tuple[DistEnv, torch.device]]:
    """Join the process group for the duration of a run (when there is more than one process)."""
    if started_by_torchrun():
        die_with_launcher()
    rank, local_rank, world_size = detect()
    if world_size == 1:
        yield DistEnv(), resolve_device(device_spec)
        return
    device = resolve_device(device_spec, local_rank=local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_group = not dist.is_initialized()
    if owns_group:
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world_size))
        dist.init_process_group(backend, store=_attempt_store(rank, world_size), rank=rank, world_size=world_size,
                                timeout=TIMEOUT)
    try:
        yield DistEnv(rank, local_rank, world_size, backend), device
    finally:
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _attempt_store(rank: int, world_size: int) -> dist.Store:
    """The env:// store, under a prefix of its own for each torchrun restart of the group.

    A restarted group may meet the same store as the failed one (torchrun shares its rendezvous
    store); without a fresh prefix a new rank can read a dead rank's address and the group hangs
    while connecting."""
    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=TIMEOUT))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"trainforge/attempt_{attempt}", store)


def resolve_strategy(strategy: str, env: DistEnv) -> tuple[str, Optional[str]]:
    """(strategy, why) for `distributed.strategy` at this world size; why is None when taken as it is.
    `auto`: data-parallel replicas (ddp) with more than one process, else none."""
    if strategy == "auto":
        if env.is_distributed:
            return "ddp", f"auto: ddp over {env.world_size} processes"
        return "none", "auto: none (one process)"
    if strategy == "none" and env.is_distributed:
        raise UserError(f"distributed.strategy: none cannot run on {env.world_size} processes; use ddp or auto")
    if strategy in ("ddp", "fsdp") and not env.is_distributed:
        return "none", f"distributed.strategy {strategy} -> none: one process has nothing to replicate or shard"
    return strategy, None
