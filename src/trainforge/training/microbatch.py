"""Batch geometry: global = micro x accumulation x world size, and the OOM fallback that keeps it.

`train.micro_batch_size` is an upper bound: the run uses the largest micro-batch <= it that divides each
rank's share of the global batch, so the default recipe runs unchanged on 1, 2, 4 or 8 processes.

    geometry = batch_geometry(64, 64, world_size=3)   # UserError: 64 samples do not split over 3 ranks
    geometry = batch_geometry(64, 24, world_size=2)   # Geometry(micro=16, accumulation=2, note="...")
    micro, accumulation = shrink_micro_batch(15, 1)   # after an OOM: (5, 3), same samples per step
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trainforge.errors import JobFailed, UserError
from trainforge.files import write_text_atomic


@dataclass(frozen=True)
class Geometry:
    micro_batch_size: int
    accumulation: int
    note: Optional[str] = None  # set when the micro-batch differs from the one asked for: say it once


def per_rank_batch(global_batch_size: int, world_size: int) -> int:
    """Each rank's share of the global batch; UserError (before anything starts) when there is no equal share."""
    if global_batch_size < world_size:
        raise UserError(
            f"train.global_batch_size ({global_batch_size}) is smaller than the world size ({world_size} processes): "
            f"every process needs at least one sample per step; set train.global_batch_size to {world_size} or more"
        )
    if global_batch_size % world_size:
        lower = global_batch_size - global_batch_size % world_size
        raise UserError(
            f"train.global_batch_size ({global_batch_size}) does not split evenly over {world_size} processes; "
            f"set it to a multiple of {world_size}, e.g. {lower} or {lower + world_size}"
        )
    return global_batch_size // world_size


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of `n` that is <= `limit` (1 when limit < 1)."""
    return max((d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0), default=1)


def batch_geometry(global_batch_size: int, micro_batch_size: int, world_size: int = 1) -> Geometry:
    """The micro-batch and accumulation that run `global_batch_size` samples per optimizer step on `world_size`
    processes, with a micro-batch of at most `micro_batch_size`."""
    per_rank = per_rank_batch(global_batch_size, world_size)
    micro = largest_divisor_at_most(per_rank, micro_batch_size)
    note = None
    if micro != micro_batch_size:
        note = (f"train.micro_batch_size {micro_batch_size} -> {micro}: the largest that divides each process's "
                f"{per_rank} samples per step ({global_batch_size} over {world_size} process"
                f"{'es' if world_size > 1 else ''}), accumulation {per_rank // micro}")
    return Geometry(micro, per_rank // micro, note)


def accumulation_steps(global_batch_size: int, micro_batch_size: int, world_size: int = 1) -> int:
    """Micro-batches per optimizer step on each rank; `micro_batch_size` must divide the rank's share exactly."""
    per_rank = per_rank_batch(global_batch_size, world_size)
    if per_rank % micro_batch_size:
        raise UserError(
            f"train.global_batch_size ({global_batch_size}) must be a multiple of train.micro_batch_size "
            f"x world size ({micro_batch_size} x {world_size}); change one of them"
        )
    return per_rank // micro_batch_size


def shrink_micro_batch(micro_batch_size: int, accumulation: int) -> tuple[int, int]:
    """After an out-of-memory error: the largest divisor of this rank's share (micro x accumulation) that is at
    most half the micro-batch, so the samples per step stay the same (15 -> 5, 16 -> 8, 7 -> 1).

    Raises JobFailed (exit 1) when the micro-batch is already 1.
    """
    if micro_batch_size <= 1:
        raise JobFailed(
            "out of memory at micro-batch 1, which cannot shrink further; "
            "use a smaller model, train.precision=bf16, activation checkpointing, or a larger device"
        )
    per_rank = micro_batch_size * accumulation
    micro = largest_divisor_at_most(per_rank, micro_batch_size // 2)
    return micro, per_rank // micro


def fitting_micro_batch(micro_batch_size: int, global_batch_size: int, world_size: int) -> int:
    """The largest micro-batch <= `micro_batch_size` that divides this world size's share of the global batch."""
    return batch_geometry(global_batch_size, micro_batch_size, world_size).micro_batch_size


OOM_RESTART_FILE = "oom_restart.json"


def request_oom_restart(run_dir: Path, micro_batch_size: int, step: int) -> None:
    """Under FSDP an out-of-memory error can strike while other ranks wait in a collective, so the ranks
    cannot agree in place: record the smaller micro-batch and fail; torchrun restarts the whole group
    (`--max-restarts`), which resumes from the last checkpoint with that micro-batch."""
    write_text_atomic(run_dir / OOM_RESTART_FILE, json.dumps({"micro_batch_size": micro_batch_size, "step": step}))
    raise JobFailed(
        f"out of memory at step {step} under FSDP: the worker group must restart with micro-batch "
        f"{micro_batch_size} (torchrun does so with --max-restarts >= 1)"
    )


def read_oom_restart(run_dir: Path) -> Optional[int]:
    """The micro-batch an FSDP group must restart with. The request is consumed by the next checkpoint, which
    records that micro-batch itself (`checkpoint` deletes the file), so later resumes are not held to it."""
    path = run_dir / OOM_RESTART_FILE
    try:
        micro = int(json.loads(path.read_text())["micro_batch_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return micro
